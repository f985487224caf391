"""Notebook conventions: clean sources, a `parameters` cell, the project kernel, a consistent TOC."""

import json
import re
import shutil
from pathlib import Path

import pytest

from fovea_book.build import KERNEL_NAME, toc_files
from fovea_book.build.tidy import KERNELSPEC, check_notebook, tidy_file

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
    """JupyterLab opens the notebook on the `fovea` kernel (see test_lab.py), no dialog."""
    assert json.loads(path.read_text())["metadata"]["kernelspec"] == KERNELSPEC


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


# --- the page conventions (issue 14): title first, parameters collapsed, long plots collapsed

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_tidy(path):
    """Title first, parameters cell tagged hide-cell, long plots hide-input, project kernel.

    Fix with `python -m fovea_book.build tidy` (idempotent; it only moves the title and adds
    tags), or tag a plotting cell `keep-input` when its code carries the argument.
    """
    problems = check_notebook(json.loads(path.read_text()))
    assert not problems, f"{path.name}: " + "; ".join(problems) + " (run: python -m fovea_book.build tidy)"


def test_the_convention_check_fails_on_an_untidy_notebook():
    problems = check_notebook(json.loads((FIXTURES / "untidy.ipynb").read_text()))
    text = "\n".join(problems)
    assert "first cell is not the markdown title" in text
    assert "not tagged 'hide-cell'" in text
    assert "cell 3 is a long plotting cell" in text
    assert "kernelspec" in text
    assert len(problems) == 4, problems


def test_tidy_fixes_the_fixture_minimally_and_is_idempotent(tmp_path):
    path = tmp_path / "untidy.ipynb"
    shutil.copy(FIXTURES / "untidy.ipynb", path)
    before = json.loads(path.read_text())
    changes = tidy_file(path)
    assert len(changes) == 4, changes
    after = json.loads(path.read_text())
    assert check_notebook(after) == []
    # the title moved to the top, nothing else moved, no source was touched
    order = [c["id"] for c in after["cells"]]
    assert order == ["cell-01", "cell-00", "cell-02", "cell-03", "cell-04"]
    src = {c["id"]: c["source"] for c in before["cells"]}
    assert all(c["source"] == src[c["id"]] for c in after["cells"])
    assert after["cells"][1]["metadata"]["tags"] == ["parameters", "hide-cell"]
    assert after["cells"][3]["metadata"]["tags"] == ["hide-input"]
    assert "tags" not in after["cells"][2]["metadata"]     # a short code cell stays as it was
    assert after["metadata"]["kernelspec"]["name"] == KERNEL_NAME
    # idempotent: a second run changes nothing and does not rewrite the file
    mtime = path.stat().st_mtime_ns
    assert tidy_file(path) == []
    assert path.stat().st_mtime_ns == mtime


def test_tidy_rewrites_only_the_lines_it_changes(tmp_path):
    """Jupyter's own formatting is kept, so a tidy commit's diff is the moved cell and tags."""
    path = tmp_path / "untidy.ipynb"
    shutil.copy(FIXTURES / "untidy.ipynb", path)
    before = path.read_text()
    tidy_file(path)
    after = path.read_text()
    nb = json.loads(after)
    assert after == json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    # cells tidy leaves alone appear byte for byte as they were
    for cell in json.loads(before)["cells"]:
        if cell["id"] in ("cell-01", "cell-02", "cell-04"):
            block = "\n".join("  " + ln for ln in json.dumps(cell, indent=1, sort_keys=True,
                                                           ensure_ascii=False).splitlines())
            assert block in before and block in after, cell["id"]


def test_a_keep_input_tag_exempts_a_plotting_cell():
    nb = json.loads((FIXTURES / "untidy.ipynb").read_text())
    nb["cells"][3]["metadata"]["tags"] = ["keep-input"]
    assert not any("long plotting cell" in p for p in check_notebook(nb))


def test_no_notebook_imports_the_build_tool():
    """The incremental cache leaves book/fovea_book/build/ out of the sources fingerprint."""
    for path in NOTEBOOKS:
        code = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                         if c["cell_type"] == "code")
        assert not re.search(r"fovea_core\.book\b|from fovea_core import .*\bbook\b", code), path.name


def test_tidy_gives_cells_without_an_id_a_stable_unique_one(tmp_path):
    """nbformat 4.5 needs cell ids (papermill warns, future versions refuse)."""
    nb = json.loads((FIXTURES / "untidy.ipynb").read_text())
    for c in nb["cells"][2:]:
        del c["id"]
    nb["cells"].append(json.loads(json.dumps(nb["cells"][-1])))     # same text twice
    assert any("have no id" in p for p in check_notebook(nb))
    path = tmp_path / "noid.ipynb"
    path.write_text(json.dumps(nb, indent=1))
    tidy_file(path)
    ids = [c["id"] for c in json.loads(path.read_text())["cells"]]
    assert all(ids) and len(set(ids)) == len(ids)
    assert ids[:2] == ["cell-01", "cell-00"]   # existing ids kept (the title moved first)
    path.write_text(json.dumps(nb, indent=1))
    tidy_file(path)
    assert [c["id"] for c in json.loads(path.read_text())["cells"]] == ids   # deterministic
