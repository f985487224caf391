"""``fovea_core`` works installed, outside this checkout.

The wheel is built from the repository (``pip wheel .``) and installed into a scratch
environment that sees the locked dependencies (the project venv's ``site-packages``, added
by a ``.pth`` line, which does not activate that venv's editable install) but not the
repository. The installed package folder is made read-only, ``HOME`` and ``FOVEA_CACHE``
point into the scratch folder, and from another folder:

* ``foveate()`` runs every registered method on a page, with a question: the tokens equal
  the checkout's, token for token;
* ``python -m fovea_core foveate`` writes its three files for the page;
* nothing is written inside the installed package, the caches land in ``$FOVEA_CACHE``, and
  the book's package is not importable there.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "What is the total?"
BUDGET = 64

#: run inside the scratch environment: every method on the page -> JSON on stdout
PROBE = textwrap.dedent("""
    import json, sys, warnings
    import fovea_core
    from fovea_core.foveation import method_names
    warnings.simplefilter("ignore")
    page, budget, question = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    out = {"file": fovea_core.__file__, "path": sys.path}
    try:
        import fovea_book  # noqa: F401
        out["book"] = True
    except ImportError:
        out["book"] = False
    for m in method_names():
        f = fovea_core.foveate(page, question, budget=None if m == "full" else budget, method=m)
        t = f.tokens
        out[m] = [t.centers[0].tolist(), t.levels[0].tolist(), f.cost.label]
    print(json.dumps(out))
""")


def _tokens(page: Path) -> dict:
    """The same probe in this process (the checkout's ``fovea_core``)."""
    import warnings

    import fovea_core
    from fovea_core.foveation import method_names

    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in method_names():
            f = fovea_core.foveate(str(page), QUESTION, budget=None if m == "full" else BUDGET,
                                   method=m)
            t = f.tokens
            out[m] = [t.centers[0].tolist(), t.levels[0].tolist(), f.cost.label]
    return out


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """``{"python", "package", "work", "env"}``: the scratch environment with the wheel."""
    tmp = tmp_path_factory.mktemp("wheel")
    wheels = tmp / "wheels"
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                          "--no-build-isolation", "-w", str(wheels), str(ROOT)],
                         cwd=tmp, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    (wheel,) = wheels.glob("fovea_core-*.whl")
    env = tmp / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True,
                   timeout=120)
    python = env / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    # the locked dependencies: this venv's site-packages, after the scratch one
    (site / "_locked_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                          "--no-compile", "--target", str(site), str(wheel)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    package = site / "fovea_core"
    for p in [package, *package.rglob("*")]:            # a read-only install
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    work = tmp / "elsewhere"
    work.mkdir()
    page = work / "page.png"
    from fovea_book.eval.documents import make_document

    doc = make_document(3, width=768, height=1024)                  # shown at half size
    Image.fromarray(doc.image).resize((384, 512), Image.LANCZOS).save(page)
    env_vars = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FOVEA_CACHE")}
    env_vars.update(HOME=str(tmp / "home"), FOVEA_CACHE=str(tmp / "cache"),
                    PYTHONDONTWRITEBYTECODE="1")
    yield dict(python=python, package=package, work=work, env=env_vars, page=page,
               cache=tmp / "cache", before=_files(package))
    for p in [package, *package.rglob("*")]:            # let pytest clean up
        p.chmod(p.stat().st_mode | stat.S_IWUSR)


def test_the_wheel_carries_the_weights_and_the_kernel_sources(installed):
    files = installed["before"]
    for name in ("weights/gist_localiser.pt", "weights/gist_localiser.json",
                 "weights/fixation_readout.json", "kernels/src/fovea_kernels.cu",
                 "kernels/src/fovea_kernels.cuh"):
        assert name in files, name
    assert not (installed["package"] / "kernels" / "src" / "fovea_kernels.cu").is_symlink()


def test_every_method_gives_the_checkouts_tokens_from_another_folder(installed):
    res = subprocess.run([str(installed["python"]), "-c", PROBE, str(installed["page"]),
                          str(BUDGET), QUESTION], cwd=installed["work"], env=installed["env"],
                         capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert Path(got.pop("file")).is_relative_to(installed["package"])
    assert not any(Path(p).resolve() == ROOT for p in got.pop("path") if p)
    assert got.pop("book") is False                     # the book's package is not there
    want = _tokens(installed["page"])
    assert set(got) == set(want) and "cascade" in want and "resize" in want
    for m in want:
        np.testing.assert_array_equal(np.asarray(got[m][0]), np.asarray(want[m][0]), err_msg=m)
        np.testing.assert_array_equal(np.asarray(got[m][1]), np.asarray(want[m][1]), err_msg=m)
        assert got[m][2] == want[m][2], m
    assert _files(installed["package"]) == installed["before"]   # nothing written beside it
    assert any(installed["cache"].rglob("*.sqlite"))             # the query OCR cache is there


def test_the_command_runs_installed(installed):
    out = installed["work"] / "out"
    res = subprocess.run([str(installed["python"]), "-m", "fovea_core", "foveate",
                          str(installed["page"]), "--question", QUESTION, "--budget", "96",
                          "--out", str(out), "--workers", "1"], cwd=installed["work"],
                         env=installed["env"], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "1 done" in res.stdout
    assert {p.name for p in out.iterdir()} == {"page.foveated.png", "page.tokens.png",
                                                 "page.foveation.json"}
    from fovea_core.foveation import DEFAULT_METHOD

    assert json.loads((out / "page.foveation.json").read_text())["method"] == DEFAULT_METHOD
    assert _files(installed["package"]) == installed["before"]
