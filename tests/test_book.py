"""The papermill runner behind `make book` / `make test` fails loudly on a raising cell."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fovea_core.book import toc_files, toc_notebooks

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"


def make_project(tmp_path: Path, notebook: str) -> Path:
    """A minimal book: the real _config.yml, an intro page and one fixture notebook."""
    (tmp_path / "book").mkdir()
    (tmp_path / "notebooks").mkdir()
    shutil.copy(ROOT / "_config.yml", tmp_path)
    (tmp_path / "book" / "intro.md").write_text("# Fixture book\n\nA page.\n")
    (tmp_path / "book" / "references.bib").write_text((ROOT / "book" / "references.bib").read_text())
    shutil.copy(FIXTURES / notebook, tmp_path / "notebooks" / notebook)
    (tmp_path / "_toc.yml").write_text(
        f"format: jb-book\nroot: book/intro\nchapters:\n  - file: notebooks/{Path(notebook).stem}\n")
    return tmp_path


def run_book(root: Path, command: str = "all") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fovea_core.book", command, "--profile", "smoke",
                           "--root", str(root)], capture_output=True, text=True, timeout=600)


def test_raising_cell_fails_the_run_and_names_notebook_and_cell(tmp_path):
    result = run_book(make_project(tmp_path, "raises.ipynb"))
    assert result.returncode == 1, result.stdout + result.stderr
    report = result.stderr
    # the raising cell is cell 3 (0-based) of the source notebook, whatever papermill injects
    assert re.search(r"notebooks/raises\.ipynb: cell 3 \('raise ValueError.*\) raised "
                     r"ValueError: deliberate failure", report), report
    assert not (tmp_path / "_build" / "html" / "index.html").exists()


def test_working_notebook_is_executed_with_the_profile_and_built(tmp_path):
    root = make_project(tmp_path, "ok.ipynb")
    result = run_book(root)
    assert result.returncode == 0, result.stdout + result.stderr
    executed = json.loads((root / "_build" / "src" / "notebooks" / "ok.ipynb").read_text())
    stdout = "".join("".join(o.get("text", "")) for c in executed["cells"]
                     for o in c.get("outputs", []))
    assert "PROFILE=smoke" in stdout
    html = (root / "_build" / "html" / "notebooks" / "ok.html").read_text()
    assert "PROFILE=smoke" in html          # the page shows papermill's outputs
    timings = json.loads((root / "_build" / "src" / "timings.json").read_text())
    assert [r["ok"] for r in timings["runs"]] == [True]


@pytest.mark.parametrize("target", ["book", "test"])
def test_both_make_targets_use_the_failing_runner(target):
    """`make book` and `make test` both go through `fovea_core.book all` (tested above)."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(rf"^{target}:.*?\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "-m fovea_core.book all" in recipe


def test_ci_runs_exactly_make_test():
    lines = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert "set -euo pipefail" in lines
    assert lines[-1] == "make test"


def test_toc_lists_root_first_and_notebooks_in_order():
    files = toc_files(ROOT)
    assert files[0] == "book/intro"
    nbs = [p.stem for p in toc_notebooks(ROOT)]
    assert nbs == sorted(nbs), "notebooks should appear in the TOC in numeric order"
