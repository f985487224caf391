"""pyproject.toml and environment.yml must list the same dependencies."""

import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
MIRRORED_EXTRAS = ("book", "test", "ocr")  # `gpu` (pycuda) needs CUDA: documented, not mirrored


def _norm(req: str) -> str:
    return req.replace(" ", "").lower()


def pyproject_requirements(root: Path = ROOT) -> set[str]:
    meta = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    reqs = list(meta["dependencies"])
    for extra in MIRRORED_EXTRAS:
        reqs += meta["optional-dependencies"][extra]
    return {_norm(r) for r in reqs}


def conda_pip_requirements(root: Path = ROOT) -> set[str]:
    env = yaml.safe_load((root / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return {_norm(r) for r in pip if not r.startswith("-e")}


def test_environment_mirrors_pyproject():
    py, conda = pyproject_requirements(), conda_pip_requirements()
    assert py - conda == set(), f"in pyproject.toml but not environment.yml: {sorted(py - conda)}"
    assert conda - py == set(), f"in environment.yml but not pyproject.toml: {sorted(conda - py)}"


def test_torch_pinned_and_jupyter_book_1x():
    reqs = pyproject_requirements()
    assert "torch==2.13.0" in reqs
    assert "jupyter-book>=1.0.4.post1,<2" in reqs


def test_pycuda_only_in_gpu_extra():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["optional-dependencies"]["gpu"] == ["pycuda>=2024.1"]
    assert not any("pycuda" in r for r in pyproject_requirements())


def test_drift_is_detected(tmp_path):
    """The check above can fail: a dependency missing from the mirror is reported."""
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d for d in env["dependencies"] if isinstance(d, dict))["pip"]
    pip.remove("seaborn>=0.13")
    (tmp_path / "environment.yml").write_text(yaml.safe_dump(env))
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    assert pyproject_requirements(tmp_path) - conda_pip_requirements(tmp_path) == {"seaborn>=0.13"}
