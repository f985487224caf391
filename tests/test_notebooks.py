"""Notebook conventions: clean sources, a `parameters` cell, the project kernel, a consistent TOC."""

import json
import re
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


_GLUE_REF = re.compile(r"\{glue(?::\w+)?\}`([^`:]+)(?::[^`]*)?`|```\{glue:\w+\}\s+(\S+)")
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_glue_reference_is_glued(path):
    """Prose may only show numbers the notebook computes (a missing key fails the -W build).

    Keys may be glued in a loop (``for k, v in dict(a1=...).items(): glue(k, v)``), so a key
    counts as computed when it appears as a word in the notebook's code and the code glues.
    """
    nb = json.loads(path.read_text())
    text = {kind: "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == kind)
            for kind in ("markdown", "code")}
    referenced = {a or b for a, b in _GLUE_REF.findall(text["markdown"])}
    if referenced:
        assert "glue(" in text["code"], f"{path.name}: prose uses glue but the code never glues"
    words = set(re.findall(r"\w+", text["code"]))
    # keys built at run time: glue(f"first_{rf}", ...) or glue("t_" + key, ...)
    prefixes = tuple(re.findall(r"""glue\(\s*f?["'](\w+?)(?:\{|["']\s*\+)""", text["code"]))
    missing = sorted(k for k in referenced if k not in words and not k.startswith(prefixes or ("\0",)))
    assert not missing, f"{path.name}: glued in prose but never computed: {missing}"
