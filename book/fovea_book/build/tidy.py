"""The notebook conventions that make a chapter page start with its title, and a fixer.

Conventions (``/work/notes`` and ``book/running.md``):

1. The first cell is a markdown cell whose first line is the page title (``# ...``).
2. The first code cell is the ``parameters`` cell; it also carries ``hide-cell``, so the
   page shows it collapsed below the title (a toggle: a reader can still open it).
   Papermill's injected cell is hidden by the runner in the executed copy.
3. A long plotting cell (it makes a figure and has more than :data:`LONG_CELL` non-blank
   lines) carries ``hide-input``: the figure stays, its code is one click away. A plotting
   cell that carries the argument can opt out with the tag ``keep-input``.
4. The notebook's kernelspec is the project's kernel (:data:`KERNELSPEC`), so JupyterLab
   opens it without a kernel dialog.

:func:`check_notebook` lists violations (the test suite fails on any); :func:`tidy_notebook`
fixes what can be fixed mechanically. ``tidy`` is idempotent and minimal: it moves at
most one cell, adds tags and sets the kernelspec; it never rewrites a cell's source, and
a file it does not need to change is not written. Files are written the way Jupyter writes
them (one-space indent, sorted keys), so the diff shows only the changed lines.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

KERNEL_NAME = "fovea"
KERNELSPEC = {"display_name": "Python (fovea)", "language": "python", "name": KERNEL_NAME}
#: A plotting cell with more non-blank lines than this is collapsed (``hide-input``).
LONG_CELL = 8
HIDE_PARAMETERS = "hide-cell"
HIDE_PLOT = "hide-input"
KEEP_INPUT = "keep-input"
#: Tags that already hide (or deliberately show) a cell's code.
_HIDDEN = {"hide-input", "hide-cell", "remove-input", "remove-cell", KEEP_INPUT}
#: Calls that create a figure (matplotlib, seaborn's figure-level functions).
FIGURE_CALL = re.compile(
    r"\bplt\.(?:subplots|figure|subplot_mosaic)\s*\(|\.add_subplot\s*\(|"
    r"\bsns\.(?:relplot|catplot|displot|lmplot|jointplot|pairplot|clustermap|FacetGrid)\s*\(")


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _tags(cell: dict) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def is_title(cell: dict) -> bool:
    """A markdown cell whose first non-blank line is a level-1 heading."""
    if cell.get("cell_type") != "markdown":
        return False
    first = next((ln for ln in _source(cell).splitlines() if ln.strip()), "")
    return first.startswith("# ")


def is_long_plot(cell: dict) -> bool:
    """A code cell that makes a figure and has more than :data:`LONG_CELL` non-blank lines."""
    if cell.get("cell_type") != "code" or "parameters" in _tags(cell):
        return False
    src = _source(cell)
    return bool(FIGURE_CALL.search(src)) and sum(bool(ln.strip()) for ln in src.splitlines()) > LONG_CELL


def _parameters_index(cells: list[dict]) -> int | None:
    return next((i for i, c in enumerate(cells) if "parameters" in _tags(c)), None)


def check_notebook(nb: dict) -> list[str]:
    """Violations of the conventions above (empty when the notebook is tidy)."""
    cells = nb.get("cells", [])
    problems = []
    if not cells or not is_title(cells[0]):
        titled = next((i for i, c in enumerate(cells) if is_title(c)), None)
        problems.append("first cell is not the markdown title ('# ...')" +
                        (f"; the title is cell {titled}" if titled is not None else "; no title"))
    code = [i for i, c in enumerate(cells) if c.get("cell_type") == "code"]
    p = _parameters_index(cells)
    if p is None:
        problems.append("no code cell is tagged 'parameters'")
    else:
        if code and code[0] != p:
            problems.append(f"the parameters cell ({p}) is not the first code cell ({code[0]})")
        if HIDE_PARAMETERS not in _tags(cells[p]):
            problems.append(f"the parameters cell ({p}) is not tagged '{HIDE_PARAMETERS}'")
    for i, c in enumerate(cells):
        if is_long_plot(c) and not _HIDDEN & set(_tags(c)):
            problems.append(f"cell {i} is a long plotting cell without '{HIDE_PLOT}' "
                            f"(or '{KEEP_INPUT}' when its code carries the argument)")
    missing = [i for i, c in enumerate(cells) if not c.get("id")]
    if missing:
        problems.append(f"cells {missing} have no id (nbformat 4.5 requires one)")
    spec = nb.get("metadata", {}).get("kernelspec", {})
    if {k: spec.get(k) for k in KERNELSPEC} != KERNELSPEC:
        problems.append(f"kernelspec is {spec or None}, not {KERNELSPEC}")
    return problems


def _add_tag(cell: dict, tag: str) -> bool:
    tags = _tags(cell)
    if tag in tags:
        return False
    cell.setdefault("metadata", {})["tags"] = tags + [tag]
    return True


def tidy_notebook(nb: dict) -> list[str]:
    """Apply the conventions in place; return what was changed (empty: already tidy)."""
    cells = nb.setdefault("cells", [])
    changes = []
    if cells and not is_title(cells[0]):
        titled = next((i for i, c in enumerate(cells) if is_title(c)), None)
        if titled is not None:
            cells.insert(0, cells.pop(titled))
            changes.append(f"moved the title (cell {titled}) to the top")
    p = _parameters_index(cells)
    if p is not None and _add_tag(cells[p], HIDE_PARAMETERS):
        changes.append(f"tagged the parameters cell {HIDE_PARAMETERS}")
    for i, c in enumerate(cells):
        if is_long_plot(c) and not _HIDDEN & set(_tags(c)):
            _add_tag(c, HIDE_PLOT)
            changes.append(f"tagged plotting cell {i} {HIDE_PLOT}")
    taken = {c.get("id") for c in cells}
    for i, c in enumerate(cells):
        if not c.get("id"):                 # deterministic: the cell's position and text
            text = "".join(c.get("source", []))
            new = hashlib.sha1(f"{i}\0{text}".encode()).hexdigest()[:8]
            while new in taken:
                new = hashlib.sha1(new.encode()).hexdigest()[:8]
            c["id"] = new
            taken.add(new)
            changes.append(f"gave cell {i} an id")
    if cells and (nb.get("nbformat"), nb.get("nbformat_minor", 0)) < (4, 5):
        nb["nbformat"], nb["nbformat_minor"] = 4, 5
        changes.append("nbformat 4.5 (cell ids)")
    meta = nb.setdefault("metadata", {})
    spec = meta.get("kernelspec", {})
    if {k: spec.get(k) for k in KERNELSPEC} != KERNELSPEC:
        meta["kernelspec"] = {**spec, **KERNELSPEC}
        changes.append("set the kernelspec")
    if meta.get("language_info", {}).get("name") != "python":
        meta["language_info"] = {**meta.get("language_info", {}), "name": "python"}
        changes.append("set language_info")
    return changes


def dumps(nb: dict, like: str | None = None) -> str:
    """Serialise as Jupyter does (one-space indent, sorted keys, UTF-8 text).

    ``like`` is the file's previous text: when it escaped its non-ASCII characters
    (``\\u00e9``), the new text does too, so unchanged cells keep their bytes.
    """
    escaped = like is not None and like.isascii() and not json.dumps(
        json.loads(like), ensure_ascii=False).isascii()
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=escaped) + "\n"


def tidy_file(path: Path, *, write: bool = True) -> list[str]:
    """Tidy one ``.ipynb`` file; write it only when something changed."""
    raw = path.read_text(encoding="utf-8")
    nb = json.loads(raw)
    changes = tidy_notebook(nb)
    if changes and write:
        path.write_text(dumps(nb, like=raw), encoding="utf-8")
    return changes
