"""The cost of a method in visual tokens, and its label (the book's evaluation protocol).

A method's cost is the tokens it allocates (N) plus the equivalent tokens (16 x 16 pixels
each) of whatever its scorer and its allocator looked at outside N. Three labels:

* ``"budgeted"`` -- reads nothing outside its N tokens;
* ``"side compute"`` -- a look outside N that says only *where* things are and how big,
  never what the text says: a method registered with ``side_compute=True``, or a score-map
  method whose scorer (or an allocator whose own look) reads pixels outside N, at most N
  tokens' worth, without recognising text;
* ``"unbudgeted"`` -- reads or recognises text outside N (a query-aware scorer's OCR), or
  reads more than N's worth (or an undeclared amount) outside N.

:func:`method_cost` is the one rule: :func:`fovea_core.foveation.foveate` and the book's
evaluator both take their costs and labels from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pandas as pd

from fovea_core.importance.registry import TOKEN_PIXELS
from fovea_core.methods import INFO, allocator_reads
from fovea_core.pyramid import Pyramid

__all__ = ["COST_LABELS", "TOKEN_PIXELS", "MethodCost", "alloc_read_tokens", "cost_label",
           "method_cost", "scorer_tokens", "side_compute", "uses_scores"]


# ----------------------------------------------------------------------------- costs
def uses_scores(fn: Callable | str) -> bool:
    """Whether allocator ``fn`` reads the score map (a callable is assumed to): a method
    whose allocator ignores the map (``resize``) is not charged for its scorer."""
    return True if callable(fn) else bool(_entry(fn).get("uses_scores", True))


def _entry(name: str) -> dict:
    """The registry entry of allocator ``name`` (``ValueError`` naming the choices)."""
    if name not in INFO:
        raise ValueError(f"unknown allocator {name!r}; choose one of {sorted(INFO)}")
    return INFO[name]


#: the cost labels of the book's evaluation protocol, from cheapest to dearest
#: (:func:`cost_label`): budgeted, side compute, unbudgeted
COST_LABELS = ("budgeted", "side compute", "unbudgeted")


def cost_label(side_compute, unbudgeted) -> str | np.ndarray:
    """The label of :func:`method_cost`'s two flags, the dearest that holds:
    ``"unbudgeted"`` where ``unbudgeted``, else ``"side compute"`` where ``side_compute``,
    else ``"budgeted"``. On flags gathered over several pages (``any`` per method) a method
    takes the dearest label any page gave it.

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
    out = np.where(unb, COST_LABELS[2], np.where(side, COST_LABELS[1], COST_LABELS[0]))
    return str(out) if out.ndim == 0 else out


class MethodCost(NamedTuple):
    """What one method read on one page, in tokens, and its label (:func:`method_cost`)."""

    scorer_tokens: float        # the scorer's reads outside N (0: the method ignores the map)
    alloc_read_tokens: float    # the allocator's own reads outside N (NaN: undeclared)
    total_tokens: float         # budget + both
    reads_text: bool            # the outside look recognises text (a query-aware scorer's OCR)
    side_compute: bool          # flag of the label "side compute"
    unbudgeted: bool            # flag of the label "unbudgeted"
    label: str                  # cost_label(side_compute, unbudgeted)


def method_cost(allocator: Callable | str, scorer: str | Callable, pyramid: Pyramid,
                budget: int) -> MethodCost:
    """The one cost rule of the evaluation protocol ("Same currency") for ``allocator`` fed
    ``scorer``'s map on ``pyramid``'s page at ``budget`` = N tokens. Read outside N: the
    scorer's pixels if the allocator ranks the map (:func:`uses_scores`) plus the
    allocator's own (:func:`alloc_read_tokens`). ``"unbudgeted"`` if the scorer recognises
    text (an OCR: the query-aware scorers of :data:`~fovea_core.importance.PAGE_PARTS`), or
    if a method not registered as side compute read more than N (or an undeclared amount);
    else ``"side compute"`` if it is registered so (:func:`side_compute`) or read anything
    outside N (a look that says where, not what: never budgeted); else ``"budgeted"``."""
    from fovea_core.importance import PAGE_PARTS

    used = uses_scores(allocator)
    s_tok = scorer_tokens(scorer, tuple(pyramid.image_size)) if used else 0.0
    a_tok = alloc_read_tokens(allocator, pyramid)
    extra = s_tok + a_tok
    text = used and isinstance(scorer, str) and scorer in PAGE_PARTS
    declared = side_compute(allocator)
    unbudgeted = bool(text or (not declared and not extra <= budget))     # NaN: undeclared
    side = bool(not unbudgeted and (declared or extra > 0))
    return MethodCost(float(s_tok), float(a_tok), float(budget + extra), bool(text), side,
                      unbudgeted, str(cost_label(side, unbudgeted)))


def side_compute(fn: Callable | str) -> bool:
    """Whether what allocator ``fn`` reads outside N is *side compute*
    (the book's evaluation protocol: a look that says where text or ink is, never what it says;
    registered with ``side_compute=True``). Such reads are costed beside N (the row's
    ``alloc_read_tokens`` and the method's side-cost columns), never called unbudgeted.
    A callable says so with a ``side_compute`` attribute (default ``False``)."""
    if callable(fn):
        return bool(getattr(fn, "side_compute", False))
    return bool(_entry(fn).get("side_compute", False))


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
