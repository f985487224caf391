"""Every chapter stays a size a reader takes in one sitting: at most 45 cells and 20,000
characters of markdown prose (the bar; the aim is about 30 cells and 12,000 characters).

A chapter that grows past the bar is split into chapters with one question each, or its
tried-and-dropped variants move to an appendix chapter, before it is merged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

#: The bars (hard limits) on one chapter.
MAX_CELLS = 45
MAX_PROSE_CHARS = 20_000


def chapter_size(nb: dict) -> tuple[int, int]:
    """``(cells, characters of markdown prose)`` of a notebook: every cell counts, and the
    prose is the markdown cells' source as typed (glue and cite roles included)."""
    cells = nb["cells"]
    prose = sum(len("".join(c["source"])) for c in cells if c["cell_type"] == "markdown")
    return len(cells), prose


def oversize(nb: dict) -> list[str]:
    """What is over the bars, in words (empty when the chapter is within them)."""
    cells, prose = chapter_size(nb)
    out = []
    if cells > MAX_CELLS:
        out.append(f"{cells} cells (at most {MAX_CELLS})")
    if prose > MAX_PROSE_CHARS:
        out.append(f"{prose:,} characters of prose (at most {MAX_PROSE_CHARS:,})")
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_is_within_the_size_bars(path):
    problems = oversize(json.loads(path.read_text()))
    assert not problems, (f"{path.name}: " + "; ".join(problems) + ": split it into chapters "
                          "with one question each, or move tried variants to an appendix")


def test_the_bars_catch_an_oversize_chapter():
    prose = {"cell_type": "markdown", "metadata": {}, "source": ["x" * 1000]}
    small = {"cells": [prose] * 20}
    assert oversize(small) == []
    too_many = {"cells": [{"cell_type": "code", "metadata": {}, "source": []}] * 46}
    assert oversize(too_many) == ["46 cells (at most 45)"]
    too_long = {"cells": [prose] * 21}
    assert oversize(too_long) == ["21,000 characters of prose (at most 20,000)"]
