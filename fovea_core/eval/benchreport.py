"""Reading benchmark records for the chapters (chapter 05): the record file, its round
ratios with their CIs, and whether a target was met, as the words the text uses.

A record is the JSON written by ``python -m fovea_core.bench ...`` (committed under
``data/benchmarks/``); a ratio entry is ``{"median_of_round_ratios": r, "ci95": [lo, hi]}``
and a target entry ``{"met": bool, ...}`` (:mod:`fovea_core.bench.common`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from fovea_core.paths import project_root

#: the folder of the committed benchmark records, relative to the project root
RECORDS = Path("data") / "benchmarks"


def read_record(path: str | Path | None, default: str) -> dict | None:
    """The benchmark record at ``path``, or at ``data/benchmarks/<default>`` when ``path`` is
    empty; ``None`` when the file does not exist (a chapter then says "not measured")."""
    if not default:
        raise ValueError("default must name a record file, e.g. 'sampling.json'")
    p = Path(path) if path else project_root() / RECORDS / default
    return json.loads(p.read_text()) if p.exists() else None


def ratio_value(ratios: Mapping | None, key: str) -> float:
    """The median of round ratios of ``ratios[key]``; NaN when the record lacks it."""
    return ratios[key]["median_of_round_ratios"] if ratios and key in ratios else float("nan")


def ratio_ci_text(ratios: Mapping | None, key: str) -> str:
    """``"[lo, hi]"`` (2 decimals) of ``ratios[key]``'s 95 % CI; ``"n/a"`` when absent."""
    return ("[{:.2f}, {:.2f}]".format(*ratios[key]["ci95"]) if ratios and key in ratios
            else "n/a")


def target_word(targets: Mapping | None, key: str) -> str:
    """``"meets"`` when ``targets[key]["met"]`` is true, else ``"misses"`` (an absent
    target is not met)."""
    return "meets" if (targets or {}).get(key, {}).get("met", False) else "misses"
