"""The cost of a method in visual tokens, and its label (the book's evaluation protocol).

A method's cost is the tokens it allocates (N) plus the equivalent tokens (16 x 16 pixels
each) of whatever its scorer and its allocator looked at outside N. Three labels:

* ``"budgeted"`` -- reads nothing outside its N tokens;
* ``"side compute"`` -- a cheap model outside N says only *where* things are and how big,
  never what the text says (registered with ``side_compute=True``);
* ``"unbudgeted"`` -- reads or recognises text outside N, or reads more than N's worth.

:func:`fovea_core.foveate.foveate` and the book's evaluator both take their costs from here.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from fovea_core.methods import INFO, allocator_reads
from fovea_core.pyramid import Pyramid

__all__ = ["COST_LABELS", "TOKEN_PIXELS", "alloc_read_tokens", "cost_label", "scorer_tokens",
           "side_compute", "uses_scores"]

#: equivalent token side for costs (16 x 16 pixels), as in :mod:`fovea_core.importance`
TOKEN_PIXELS = 256


# ----------------------------------------------------------------------------- costs
def uses_scores(fn: Callable | str) -> bool:
    """Whether allocator ``fn`` reads the score map (a callable is assumed to): a method
    whose allocator ignores the map (``resize``) is not charged for its scorer."""
    if callable(fn):
        return True
    if fn not in INFO:
        raise ValueError(f"unknown allocator {fn!r}; choose one of {sorted(INFO)}")
    return bool(INFO[fn].get("uses_scores", True))


#: the cost labels of the book's evaluation protocol (:func:`cost_label`): budgeted, side compute, unbudgeted
COST_LABELS = ("budgeted", "side compute", "unbudgeted")


def cost_label(side_compute, unbudgeted) -> str | np.ndarray:
    """The one cost-label rule of the book's evaluation protocol: ``"side compute"`` where what the
    method read outside N is side compute (it is then never called unbudgeted, as the
    evaluator's rows say: ``unbudgeted`` is False on a side-compute row), else
    ``"unbudgeted"`` where it read more than N's worth outside N, else ``"budgeted"``.

    ``side_compute`` and ``unbudgeted`` are bools or equal-shaped array-likes / Series
    (``[M]``, one per method or row); a missing value (None, NaN, ``pd.NA``) counts as
    False. Returns a ``str`` for scalars, else a ``str`` array of the same shape.
    """
    def flag(v) -> np.ndarray:
        a = np.asarray(v, dtype=object)
        return np.where(pd.isna(a), False, a).astype(bool)

    side, unb = flag(side_compute), flag(unbudgeted)
    if side.shape != unb.shape:
        raise ValueError(f"cost_label: side_compute has shape {side.shape} and unbudgeted "
                         f"{unb.shape}; they must match (one flag of each per method)")
    out = np.where(side, COST_LABELS[1], np.where(unb, COST_LABELS[2], COST_LABELS[0]))
    return str(out) if out.ndim == 0 else out


def side_compute(fn: Callable | str) -> bool:
    """Whether what allocator ``fn`` reads outside N is *side compute*
    (the book's evaluation protocol: a look that says where text or ink is, never what it says;
    registered with ``side_compute=True``). Such reads are costed beside N (the row's
    ``alloc_read_tokens`` and the method's side-cost columns), never called unbudgeted.
    A callable says so with a ``side_compute`` attribute (default ``False``)."""
    if callable(fn):
        return bool(getattr(fn, "side_compute", False))
    if fn not in INFO:
        raise ValueError(f"unknown allocator {fn!r}; choose one of {sorted(INFO)}")
    return bool(INFO[fn].get("side_compute", False))


def _tokens(pixels: float) -> float:
    return float(math.ceil(pixels / TOKEN_PIXELS)) if math.isfinite(pixels) else float("nan")


def scorer_tokens(scorer: str | Callable, image_size: tuple[int, int]) -> float:
    """Tokens' worth of pixels the scorer reads on this page (NaN: not declared)."""
    from fovea_core.importance import READS, scorer_cost

    if isinstance(scorer, str) or hasattr(scorer, "reads"):
        if isinstance(scorer, str) and scorer not in READS:
            raise ValueError(f"unknown scorer {scorer!r}; choose one of {sorted(READS)}")
        return float(scorer_cost(scorer, image_size).tokens)
    return float("nan")


def alloc_read_tokens(fn: Callable | str, pyramid: Pyramid) -> float:
    """Tokens' worth of pixels the allocator reads besides the scores (NaN: not declared)."""
    if isinstance(fn, str):
        return _tokens(allocator_reads(fn, pyramid))
    reads = getattr(fn, "reads", None)
    return _tokens(reads(pyramid)) if reads is not None else float("nan")
