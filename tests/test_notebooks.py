"""Notebook conventions: clean sources, a `parameters` cell, the project kernel, a consistent TOC."""

import json
from pathlib import Path

import pytest

from fovea_core.book import KERNEL_NAME, toc_files

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _code_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found in notebooks/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    for i, cell in enumerate(_code_cells(json.loads(path.read_text()))):
        assert not cell.get("outputs"), f"{path.name}: code cell {i} has outputs"
        assert cell.get("execution_count") is None, f"{path.name}: code cell {i} has a count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_first_code_cell_is_parameters(path):
    nb = json.loads(path.read_text())
    first = _code_cells(nb)[0]
    assert "parameters" in first["metadata"].get("tags", []), f"{path.name}: untagged"
    assert "profile" in "".join(first["source"]), f"{path.name}: no `profile` parameter"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_kernel_is_the_projects(path):
    assert json.loads(path.read_text())["metadata"]["kernelspec"]["name"] == KERNEL_NAME


def test_every_notebook_is_in_the_toc():
    listed = {str(Path(f).with_suffix("")) for f in toc_files(ROOT)}
    missing = [p.name for p in NOTEBOOKS if f"notebooks/{p.stem}" not in listed]
    assert not missing, f"notebooks not in _toc.yml: {missing}"


def test_every_toc_entry_exists():
    absent = [f for f in toc_files(ROOT)
              if not any((ROOT / f).with_suffix(s).exists() for s in (".ipynb", ".md"))]
    assert not absent, f"_toc.yml entries without a file: {absent}"
