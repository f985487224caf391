"""The claims ledger of the results chapter: every seed prediction beside its measurement.

A :class:`Claim` is one row: what the seed documents (or the issue's targets) said, the
number measured in this build (with its CI when there is one), where it was measured, and
a verdict selected by :func:`judge` from the numbers, never typed in. A measurement that
this build did not produce (a benchmark JSON not yet written, a dataset folder missing)
gives the verdict :data:`NOT_MEASURED` and the measured text says so.

Verdict rules of :func:`judge` (``p`` the prediction, ``[lo, hi]`` the CI of the
measurement, ``lo = hi = est`` when there is none):

* ``"approx"`` (``p`` within a relative tolerance ``tol``): "confirmed" when the CI
  overlaps ``p (1 +- tol)`` and the estimate lies inside it, "not confirmed (measured
  higher)" / "(measured lower)" when the whole CI lies above / below it, else "undecided";
* ``"above"`` / ``"below"`` (a threshold): "confirmed" when the whole CI is above (below)
  ``p``, "not confirmed" when it is entirely on the other side, else "undecided";
* ``"within"`` (equivalence of a difference, margin ``tol`` in the measure's units):
  "confirmed" when the CI lies inside ``[-tol, tol]``, "not confirmed (measured higher)"
  / "(measured lower)" when it lies entirely above / below, else "undecided".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from fovea_core.eval.stats import too_few

__all__ = ["Claim", "judge", "ledger_frame", "NOT_MEASURED", "STAND_IN", "MODES"]

NOT_MEASURED = "not measured in this build"
#: a claim about a system this build cannot run (e.g. a 2-7 B model on a GPU) measured on a
#: stand-in (a small random-weight model on a CPU): shown as context, never judged
STAND_IN = "not measured (CPU stand-in)"
MODES = ("approx", "above", "below", "within")
HIGHER, LOWER = "not confirmed (measured higher)", "not confirmed (measured lower)"


@dataclass(frozen=True)
class Claim:
    """One row of the ledger (all fields are display text; ``where`` names a chapter)."""

    claim: str
    source: str
    predicted: str
    measured: str
    unit: str
    where: str
    verdict: str


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(float(x))


def judge(predicted: float, est: float | None, lo: float | None = None,
          hi: float | None = None, *, mode: str = "approx", tol: float = 0.1,
          n_docs: int | None = None) -> str:
    """Verdict of a measurement ``est`` (CI ``[lo, hi]``, optional) against ``predicted``.

    ``mode`` in :data:`MODES` (rules in the module docstring); ``tol`` >= 0 is relative
    for ``"approx"`` and absolute (the equivalence margin) for ``"within"``, unused
    otherwise. ``est`` ``None`` or NaN -> :data:`NOT_MEASURED`. ``n_docs``: for a
    measurement over documents, the number behind it; below
    :data:`~fovea_core.eval.stats.MIN_DOCS` the verdict is "too few documents (n = K)"
    (:func:`~fovea_core.eval.stats.too_few`), whatever the numbers say.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not (_finite(tol) and tol >= 0):
        raise ValueError(f"tol must be a finite number >= 0, got {tol!r}")
    if not _finite(predicted):
        raise ValueError(f"predicted must be a finite number, got {predicted!r}")
    if not _finite(est):
        return NOT_MEASURED
    if n_docs is not None and too_few(n_docs):
        return too_few(n_docs)
    lo = float(est) if not _finite(lo) else float(lo)
    hi = float(est) if not _finite(hi) else float(hi)
    if lo > hi:
        raise ValueError(f"lo must be <= hi, got [{lo}, {hi}]")
    p = float(predicted)
    if mode == "approx":
        a, b = p - tol * abs(p), p + tol * abs(p)
        if hi < a or lo > b:
            return LOWER if hi < a else HIGHER
        return "confirmed" if a <= est <= b else "undecided"
    if mode == "above":
        return "confirmed" if lo > p else "not confirmed" if hi <= p else "undecided"
    if mode == "below":
        return "confirmed" if hi < p else "not confirmed" if lo >= p else "undecided"
    # "within": the difference est must lie in [-tol, tol]
    if lo >= -tol and hi <= tol:
        return "confirmed"
    return LOWER if hi < -tol else HIGHER if lo > tol else "undecided"


def ledger_frame(claims: list[Claim]):
    """The claims as a ``pandas.DataFrame``, one row per claim, columns the fields."""
    import pandas as pd

    if not claims:
        raise ValueError("claims must be a non-empty list of Claim")
    return pd.DataFrame([asdict(c) for c in claims])
