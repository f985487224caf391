"""The cascade as an allocator of the registry: ``allocate("cascade", pyramid, scores, N,
query=...)``.

Registered names (all take the keyword parameters of :func:`cascade`):

========================  ===================================================================
``cascade``               the learned localiser (default gist of 64 tokens)
``cascade_gist_query``    the query scorer on the gist image
``cascade_prior``         the learned localiser without the question (query-agnostic)
``cascade_text``          the learned localiser with the text detector as side compute
                          (:mod:`fovea_core.cascade.side`: where text is and how tall)
``cascade_paper``         the learned localiser on the sheet of paper it finds in the gist
                          (:func:`~fovea_core.cascade.learned.paper_region`: a photograph's
                          receipt on a table is localised as if it filled the frame)
``cascade_safe``          the learned localiser, switching to ``resize``'s tokens where its
                          map is unsure or the page's text is legible to a resize
                          (:data:`SAFE_RESIZE_BELOW`, :data:`SAFE_RESIZE_LEGIBLE`)
========================  ===================================================================

Each is registered with ``runner=``:func:`cascade_parts` and its options (the localiser, ...)
in its registry entry (``INFO[name]["params"]``, a call may override them);
:func:`~fovea_core.allocators.registry.allocate_parts` returns every intermediate. The
allocator ignores ``scores`` (run it with the zero scorer, ``"none"``, so that the sweep
charges no scorer tokens) and reads the page only through the gist's tokens.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from fovea_core.allocators.base import DEFAULT_BUDGET, _is_int, check_budget
from fovea_core.allocators.grid import resize, resize_grid, resize_scales
from fovea_core.allocators.registry import check_fixation, register
from fovea_core.cascade.core import (INK_MIN, LEGIBLE_PX, LEVEL_TOLERANCE, STAGE_FOVEA, Gist,
                                     combine, covered_share, fitting_level, foveate_regions,
                                     gist, gist_to_grid, is_number, look_ink, one_image,
                                     page_key, place_fovea)
from fovea_core.cascade.localisers import get_localiser
from fovea_core.cascade.side import SideCost, detect_text
from fovea_core.pyramid import Pyramid
from fovea_core.tokens import TokenSet

__all__ = ["DEFAULT_GIST", "gist_budget_for", "budget_range", "check_cascade_budget",
           "SURROUND", "cascade", "text_size_map", "text_heights", "choose_level",
           "FOVEAE", "REGION_STEP", "CascadeParts", "cascade_parts",
           "CONFIDENCE_TOP", "map_confidence", "page_legibility", "SAFE_RESIZE_BELOW",
           "SAFE_RESIZE_LEGIBLE", "check_fixation", "PageBudget",
           "check_cascade_options", "check_gist", "localiser_map", "run_cascade"]

#: default gist budget (tokens) at N = 273; other budgets keep its share (:func:`gist_budget_for`)
DEFAULT_GIST = 64


def gist_budget_for(budget: int) -> int:
    """The default gist budget for a total of ``budget`` tokens: ``DEFAULT_GIST`` at N =
    :data:`~fovea_core.allocators.base.DEFAULT_BUDGET` (273), the same share (about 23 %) of
    any other N, at least 4 and leaving at least 1 token."""
    return max(4, min(int(round(budget * DEFAULT_GIST / DEFAULT_BUDGET)), budget - 1))


def budget_range(image_size: tuple[int, int], *, patch: int = 16, num_levels: int | None = None,
                 gist_budget: int | None = None) -> tuple[int, int]:
    """``(low, high)``: the budgets the cascade runs at on a page of ``image_size``.

    ``high`` is the page's level-0 patch count ``Gh * Gw``; ``low`` is the smallest ``N``
    whose gist (``gist_budget``, default :func:`gist_budget_for` ``(N)``) fits the page
    (at most ``Gh * Gw`` tokens, at a level the pyramid of ``num_levels`` levels has;
    default :func:`~fovea_core.pyramid.default_num_levels`) and leaves at least one token
    for the fovea (``N > rows * cols`` of the gist's grid). Every budget in between runs
    (the gist only grows finer with N). ``low > high`` when no budget does (a page of one
    patch, or one too small for the gist asked for). Shape arithmetic on the host, one
    vectorised pass over the candidate budgets.
    """
    from fovea_core.pyramid import default_num_levels

    h, w = (int(v) for v in image_size)
    gh, gw = math.ceil(h / patch), math.ceil(w / patch)
    cells = gh * gw
    levels = default_num_levels(h, w, patch) if num_levels is None else int(num_levels)
    n = torch.arange(1, cells + 1, dtype=torch.int64)                    # candidate budgets
    if gist_budget is None:                                              # gist_budget_for(n)
        g = torch.round(n.double() * DEFAULT_GIST / DEFAULT_BUDGET).long()
        g = torch.clamp(torch.minimum(g, n - 1), min=4)
    else:
        g = torch.full_like(n, int(gist_budget))
    s, rows, cols = resize_scales((h, w), patch)          # rows * cols non-decreasing in s
    area = rows * cols
    best = (torch.searchsorted(area, g.clamp(1, cells), right=True) - 1).clamp(min=0)
    used, level = area[best], torch.log2(1.0 / s[best])                  # resize_grid(g)
    ok = ((g >= 1) & (g < n) & (g <= cells) & (level <= levels - 1 + 1e-9)
          & (n - used >= 1))
    low = int(n[ok][0]) if bool(ok.any()) else cells + 1
    return low, cells


class PageBudget(int):
    """A budget :func:`check_cascade_budget` has held to one page's range: an ``int`` whose
    ``key`` (page size, patch, pyramid levels, gist budget) says for which. Checked again
    for the same page it is returned as it is, so that one call checks its budget once
    however many functions pass it on (:func:`fovea_core.foveate` checks it, the cascade it
    runs does not again)."""

    key: tuple


def check_cascade_budget(budget: object, image_size: tuple[int, int], *, patch: int = 16,
                         num_levels: int | None = None, gist_budget: object = None,
                         name: str = "cascade") -> PageBudget:
    """The cascade's budget through the one budget check
    (:func:`~fovea_core.allocators.base.check_budget`) with its true range
    (:func:`budget_range`); returns it as a :class:`PageBudget` (an int), which this check
    passes as it is for the same page. A ``gist_budget`` that is not an int >= 1 is left to
    :func:`cascade`'s own check (the range is then the default gist's).

    Raises:
        ValueError: ``"<name>: budget must be in [low, high] for a HxW page (...)"``,
            or ``"<name>: no budget fits ..."`` when the page cannot hold a gist and a fovea.
    """
    from fovea_core.pyramid import default_num_levels

    h, w = (int(v) for v in image_size)
    given = int(gist_budget) if _is_int(gist_budget) and int(gist_budget) >= 1 else None
    levels = default_num_levels(h, w, patch) if num_levels is None else int(num_levels)
    key = (h, w, int(patch), levels, given)
    if isinstance(budget, PageBudget) and budget.key == key:
        return budget
    low, high = budget_range((h, w), patch=patch, num_levels=levels, gist_budget=given)
    gist_of = "its gist" if given is None else f"its gist of gist_budget={given}"
    where = (f" for a {h}x{w} page ({math.ceil(h / patch)}x{math.ceil(w / patch)} patches of "
             f"{patch} px; the cascade needs {gist_of} plus at least one fovea token)")
    out = PageBudget(check_budget(
        budget, high, low=low, name=name, where=where,
        empty="the page cannot hold them; use a larger page or a smaller patch"
              + ("" if given is None else ", or a smaller gist_budget")))
    out.key = key
    return out

#: share of the fovea's tokens read one octave coarser around the core (the "surround"); on
#: the synthetic validation pages 0 and 0.5 tie (0.990 vs 0.988 kept, 32 pages), where the
#: localiser is nearly always right; 0.5 hedges a localiser that is less sure (real pages)
SURROUND = 0.5
#: the fovea's forms: ``"core"`` (one level per page, :func:`choose_level`, plus the
#: surround one octave coarser), ``"regions"`` (a level per region, from the text height
#: under each cell: :func:`~fovea_core.cascade.core.foveate_regions`) or ``"saccade"`` (the
#: coarse look first, then the core on the cells where it showed ink)
FOVEAE = ("core", "regions", "saccade")
#: with ``fovea="saccade"``, a cell the first look showed blank keeps this share of its map
#: mass for the core (as :data:`SIDE_FLOOR` does for the detector's mask)
BLANK_FLOOR = 0.02
#: spacing (octaves) of the candidate levels of ``fovea="regions"``, a ladder through the
#: page's one-level choice (:func:`_regions`)
REGION_STEP = 0.5
#: side channels the cascade accepts (:mod:`fovea_core.cascade.side`); ``None``: none
SIDES = ("text",)
#: with ``side="text"``, the localiser map is tempered to this power and multiplied by
#: ``SIDE_FLOOR + text mask``. Chosen on the held-out fifth of the training pages (forms and
#: receipts the localiser was not fitted on): the mask alone moves the fovea onto text; the
#: tempering spreads it over more of the text the localiser ranks high (a hedge where it
#: is unsure, as on forms)
SIDE_TEMPER = 0.5
SIDE_FLOOR = 0.02


_SIZE_CACHE: OrderedDict = OrderedDict()


def text_size_map(g: Gist) -> torch.Tensor:
    """``[B, Gh, Gw]`` log2 of the text height in base pixels, estimated from the gist by the
    learned network's size head (question-independent; in gist pixels, times the gist's
    pixel, so it follows the page's resolution). Cached per gist (the questions about one
    page share it)."""
    from fovea_core.cascade.learned import encode_gist

    key = (g.key, g.rows, g.cols, g.level, g.image_size)
    if g.key and key in _SIZE_CACHE:
        return _SIZE_CACHE[key]
    _, size = encode_gist(g)                                             # [B, h2, w2]
    grid = gist_to_grid(size, g, mode="mean", scale=2) + math.log2(g.pixel)
    if g.key:
        _SIZE_CACHE[key] = grid
        while len(_SIZE_CACHE) > 64:
            _SIZE_CACHE.popitem(last=False)
    return grid


def text_heights(g: Gist, size_map: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, Gh, Gw]`` log2 text height (base pixels) per level-0 cell: ``size_map`` (a side
    channel's measurement) where it is not NaN, the gist's estimate
    (:func:`text_size_map`) elsewhere."""
    size = text_size_map(g)
    if size_map is None:
        return size
    return torch.where(torch.isnan(size_map), size, size_map.to(size.dtype))


def choose_level(g: Gist, loc: torch.Tensor, *, legible_px: float = LEGIBLE_PX,
                 min_level: float = 0.0, max_level: float | None = None,
                 size_map: torch.Tensor | None = None) -> torch.Tensor:
    """``[B]`` fovea level: the text height expected where the localiser looks (the size
    map averaged under ``loc``, in log2 base pixels) read at ``legible_px``:
    ``level = log2(text_px / legible_px)``, clipped to ``[min_level, max_level]`` (default
    two octaves below the gist, so that the surround, one octave coarser, stays finer than
    the gist). ``size_map``: ``[B, Gh, Gw]`` log2 text heights to use instead of the gist's
    (a side channel's measurement; NaN cells fall back to the gist's estimate)."""
    w = loc / loc.flatten(1).sum(1).clamp(min=1e-12)[:, None, None]
    log_px = (w * text_heights(g, size_map)).flatten(1).sum(1)
    top = max(g.level - 2.0 if max_level is None else max_level, min_level)
    return (log_px - math.log2(legible_px)).clamp(min_level, top)


def check_cascade_options(*, query, gist_budget, budget: int, level, legible_px, surround,
                          context, context_weight, name: str = "cascade") -> int | None:
    """Validate the cascade's keyword arguments for a ``budget`` already checked
    (:func:`check_cascade_budget`); return ``gist_budget`` as a Python int (numpy integers
    accepted) or ``None``. Raises ``ValueError`` naming the argument and its range
    (``TypeError`` for a ``query`` that is not a string), after ``name:``."""
    if gist_budget is not None:
        if not _is_int(gist_budget) or not 1 <= int(gist_budget) < budget:
            raise ValueError(f"{name}: gist_budget must be None or an int in [1, {budget - 1}] "
                             f"(leaving the fovea at least one of budget = {budget}), got "
                             f"{gist_budget!r}")
        gist_budget = int(gist_budget)
    if query is not None and not isinstance(query, str):
        raise TypeError(f"{name}: query must be a str or None, got {type(query).__name__}")
    if not (isinstance(level, str) and level == "auto") and not (
            is_number(level) and math.isfinite(float(level))):
        raise ValueError(f"{name}: level must be 'auto' or a finite number (a pyramid level), "
                         f"got {level!r}")
    if not is_number(legible_px) or not (math.isfinite(float(legible_px))
                                          and float(legible_px) > 0):
        raise ValueError(f"{name}: legible_px must be a finite number > 0 (text height in "
                         f"pixels), got {legible_px!r}")
    if not is_number(surround) or not 0.0 <= float(surround) < 1.0:
        raise ValueError(f"{name}: surround must be in [0, 1), got {surround!r}")
    if (not isinstance(context, (tuple, list)) or len(context) != 2
            or not all(_is_int(c) and c >= 0 for c in context)):
        raise ValueError(f"{name}: context must be (rows, cols), two ints >= 0 (a half-window "
                         f"of neighbours), got {context!r}")
    if not is_number(context_weight) or not 0.0 <= float(context_weight) <= 1.0:
        raise ValueError(f"{name}: context_weight must be a number in [0, 1] (the share of a "
                         f"neighbour's mass a cell may borrow), got {context_weight!r}")
    return gist_budget


def check_gist(pyramid: Pyramid, g: Gist, gist_budget: int, patch: int) -> None:
    """``ValueError`` unless ``g`` (a caller's ``gist_obj``) is this page's gist at
    ``gist_budget``: its size and grid, and its page key where it has one."""
    if g.image_size != tuple(pyramid.image_size) or g.budget != int(np.prod(
            resize_grid(pyramid.image_size, gist_budget, patch)[:2])):
        raise ValueError("cascade: gist_obj is not this page's gist at gist_budget")
    if g.key and tuple(g.key) != tuple(page_key(pyramid)):
        raise ValueError("cascade: gist_obj is the gist of another page (its page key differs "
                         "from this pyramid's)")


class CascadeParts(NamedTuple):
    """Every intermediate of one cascade call.

    Attributes:
        tokens: the TokenSet (gist stage 0, fovea stage 1).
        gist: the page's :class:`~fovea_core.cascade.core.Gist`.
        scores: ``[B, Gh, Gw]`` the localiser map the fovea followed (after the side
            channel's text prior, if any).
        levels: ``[B]`` the fovea core's level per image.
        side: the side computation's :class:`~fovea_core.cascade.side.SideCost` per page
            (``None``: a budgeted cascade, nothing read outside N).
    """

    tokens: TokenSet
    gist: Gist
    scores: torch.Tensor
    levels: torch.Tensor
    side: SideCost | None = None


def cascade_parts(pyramid: Pyramid, budget: int, *, query: str | None = None,
                  gist_budget: int | None = None, localiser: str | Callable = "learned",
                  level: float | str = "auto", legible_px: float = LEGIBLE_PX,
                  surround: float = SURROUND, context: tuple[int, int] = (1, 2),
                  context_weight: float = 0.5, patch: int = 16,
                  gist_obj: Gist | None = None, side: str | None = None,
                  fovea: str = "core", resize_within: float | None = None,
                  resize_below: float | None = None, resize_legible: float | None = None,
                  size: Callable[[Gist, "str | None"], torch.Tensor] | None = None
                  ) -> CascadeParts:
    """Run the stages and return every intermediate (see :func:`cascade`). ``gist_obj``:
    the page's gist at ``gist_budget`` if already computed (several questions about one
    page share it). On a page where ``resize_within`` sends the budget to ``resize``, the
    parts are the gist, ``resize``'s tokens, a flat map and ``resize``'s level; an image
    ``resize_below`` or ``resize_legible`` sends to ``resize`` keeps its localiser's map
    (the one it was judged by) beside ``resize``'s tokens and level.
    ``size(gist, query) -> [B, Gh, Gw]``: log2 text heights (base pixels) per level-0 cell
    to read the level from instead of the gist's estimate (NaN cells keep it), e.g. the
    oracle's
    (:meth:`~fovea_book.eval.localisation.OracleLocaliser.text_size`) to measure what the
    estimate costs; it overrides a side channel's measurement where both are given."""
    below = 0.0 if resize_below is None else _check_below(resize_below)
    legible = None if resize_legible is None else _check_legible(resize_legible)
    within = None if resize_within is None else _check_within(resize_within)
    if side is not None and side not in SIDES:
        raise ValueError(f"cascade: side must be None or one of {SIDES}, got {side!r}")
    if fovea not in FOVEAE:
        raise ValueError(f"cascade: fovea must be one of {FOVEAE}, got {fovea!r}")
    if fovea == "regions" and level != "auto":
        raise ValueError(f"cascade: fovea='regions' chooses a level per region; it takes "
                         f"level='auto', got level={level!r}")
    budget = check_cascade_budget(budget, pyramid.image_size, patch=patch,
                                  num_levels=pyramid.num_levels, gist_budget=gist_budget)
    gist_budget = check_cascade_options(query=query, gist_budget=gist_budget, budget=budget,
                                        level=level, legible_px=legible_px, surround=surround,
                                        context=context, context_weight=context_weight)
    gist_budget = gist_budget_for(budget) if gist_budget is None else gist_budget
    if gist_obj is not None:
        check_gist(pyramid, gist_obj, gist_budget, patch)
    g = gist_obj if gist_obj is not None else gist(pyramid, gist_budget, patch=patch)
    if budget - g.budget < 1:
        raise ValueError(f"cascade: the gist uses {g.budget} of {budget} tokens and leaves "
                         "none for the fovea; use a smaller gist_budget")
    parts = run_cascade(pyramid, g, int(budget), query=query, localiser=localiser, level=level,
                        legible_px=legible_px, surround=surround, context=context,
                        context_weight=context_weight, patch=patch, side=side, fovea=fovea,
                        resize_within=within, size=size)
    if resize_below is None and resize_legible is None:
        return parts
    return _resize_unsure(parts, pyramid, parts.tokens.budget, patch, below,
                          legible=legible, legible_px=legible_px)


def localiser_map(pyramid: Pyramid, g: Gist, query: str | None, localiser: str | Callable, *,
                  patch: int = 16) -> torch.Tensor:
    """``[B, Gh, Gw]`` float: the ``localiser``'s map on the gist ``g``, as every cascade reads
    it. Its shape must be the page's level-0 grid and its mass finite (``ValueError`` naming
    the localiser); below 0 counts as 0, and a map with nothing above 0 (e.g. the query
    scorer on a blank page: nothing stands out) says "anywhere": it is read as the
    ``uniform`` localiser's flat map, as the learned localisers' maps of such a page already
    are, so every cascade accepts it."""
    gh, gw = pyramid.grid_shape(patch, 0)
    loc = get_localiser(localiser)(g, query).float()
    if tuple(loc.shape) != (pyramid.batch_size, gh, gw):
        raise ValueError(f"cascade: the localiser returned {tuple(loc.shape)}, expected "
                         f"{(pyramid.batch_size, gh, gw)}")
    dead = ~torch.isfinite(loc).flatten(1).all(1)
    if bool(dead.any()):
        raise ValueError(f"cascade: the localiser {localiser!r} gave image(s) "
                         f"{dead.nonzero().flatten().tolist()} a map with no usable mass (NaN / "
                         "inf); a localiser must return finite mass >= 0")
    loc = loc.clamp(min=0)
    flat = loc.flatten(1).sum(1) <= 0
    return torch.where(flat[:, None, None], torch.ones_like(loc), loc)


def run_cascade(pyramid: Pyramid, g: Gist, budget: int, *, query: str | None,
                localiser: str | Callable, level: float | str = "auto",
                legible_px: float = LEGIBLE_PX, surround: float = SURROUND,
                context: tuple[int, int] = (1, 2), context_weight: float = 0.5,
                patch: int = 16, side: str | None = None, fovea: str = "core",
                resize_within: float | None = None,
                size: Callable[[Gist, "str | None"], torch.Tensor] | None = None
                ) -> CascadeParts:
    """The cascade's stages after its gist ``g``, on arguments :func:`cascade_parts` (or
    a caller that ran its checks, such as the read-then-look cascade's first fixation)
    already checked: localise, choose the level, place the fovea; ``budget - g.budget >=
    1`` tokens for the fovea. Returns :class:`CascadeParts`."""
    rest = budget - g.budget
    gh, gw = pyramid.grid_shape(patch, 0)
    if resize_within is not None and gh * gw <= resize_within * budget:
        return _as_resize(pyramid, g, budget, patch)
    loc = localiser_map(pyramid, g, query, localiser, patch=patch)
    cost, size_map = None, None
    if side == "text":                  # where text is and how tall (never what it says)
        layout = detect_text(pyramid, patch=patch, key=g.key or None)
        loc = loc.pow(SIDE_TEMPER) * (SIDE_FLOOR + layout.mask)
        cost, size_map = layout.cost, layout.log_px
    if size is not None:                # given heights (e.g. the oracle's), NaN: the estimate
        given = torch.as_tensor(size(g, query), dtype=torch.float64)
        if tuple(given.shape) != (pyramid.batch_size, gh, gw):
            raise ValueError(f"cascade: size returned {tuple(given.shape)}, expected "
                             f"{(pyramid.batch_size, gh, gw)}")
        size_map = given if size_map is None else torch.where(
            torch.isnan(given), size_map.to(given.dtype), given)
    if fovea == "regions":
        return _regions(pyramid, g, loc, rest, size_map, cost, legible_px=legible_px,
                        context=context, context_weight=context_weight, patch=patch)
    if level == "auto":
        levels = choose_level(g, loc, legible_px=legible_px, size_map=size_map)
    else:
        lv = float(level)
        if not 0 <= lv <= g.level - 0.5:    # else the fovea would re-read the gist's cells
            raise ValueError(f"cascade: level must be 'auto' or in [0, {g.level - 0.5:.2f}] "
                             f"(half an octave finer than the gist), got {level!r}")
        levels = torch.full((pyramid.batch_size,), lv)
    parts = []
    for b in range(pyramid.batch_size):                     # images may read different levels
        lv = float(levels[b])
        lv2 = min(lv + 1.0, g.level - 0.5)                  # the surround's level
        n_sur = int(round(surround * rest)) if lv2 >= lv + LEVEL_TOLERANCE else 0
        lv_core = fitting_level(lv, pyramid.image_size, rest - n_sur, patch)
        if n_sur:
            lv2 = fitting_level(lv2, pyramid.image_size, n_sur, patch)
            if lv2 < lv_core + LEVEL_TOLERANCE:    # a small page pushed both onto one grid
                n_sur, lv_core = 0, fitting_level(lv, pyramid.image_size, rest, patch)
        n_core = rest - n_sur
        lv = levels[b] = lv_core
        kw = dict(image_size=pyramid.image_size, patch=patch, context=context,
                  context_weight=context_weight, stage=STAGE_FOVEA)
        if fovea == "saccade" and n_sur:
            # the coarse look first, where the map points; the core then reads finely only
            # the cells it showed ink in, and those it did not show
            first = place_fovea(loc[b:b + 1], n_sur, level=lv2, **kw)
            ink, seen = look_ink(one_image(pyramid, b), first, patch=patch)
            blank = seen & (ink < INK_MIN)
            core = place_fovea(torch.where(blank, BLANK_FLOOR, 1.0) * loc[b:b + 1], n_core,
                           level=lv, **kw)
            parts.append(combine([g.tokens[b], first, core], fixation=core.fixations))
            continue
        core = place_fovea(loc[b:b + 1], n_core, level=lv, **kw)
        stages = [g.tokens[b], core]
        if n_sur:
            # the surround: one octave coarser, where the mass the core left uncovered lies
            left = loc[b:b + 1] * (1 - covered_share(core, (gh, gw), patch))
            stages.append(place_fovea(left, n_sur, level=lv2, **kw))
        parts.append(combine(stages, fixation=core.fixations))
    tokens = TokenSet.cat(parts) if len(parts) > 1 else parts[0]
    return CascadeParts(tokens, g, loc, levels, cost)


#: the share of a map's cells whose mass :func:`map_confidence` sums
CONFIDENCE_TOP = 0.05


def map_confidence(scores: torch.Tensor, top: float = CONFIDENCE_TOP) -> torch.Tensor:
    """``[B]``: the share of each map's mass (``scores`` ``[B, Gh, Gw]``, >= 0) on its
    ``top`` share of cells (at least one cell): near 1 for a map sure of a few cells, near
    ``top`` for a flat one (a map with no mass counts as flat)."""
    if scores.ndim != 3:
        raise ValueError(f"scores must be [B, Gh, Gw], got {tuple(scores.shape)}")
    if not 0.0 < top <= 1.0:
        raise ValueError(f"top must be in (0, 1], got {top!r}")
    flat = scores.flatten(1).float().clamp(min=0)
    k = max(1, int(round(top * flat.shape[1])))
    total = flat.sum(1)
    share = flat.topk(k, dim=1).values.sum(1) / total.clamp(min=1e-12)
    return torch.where(total > 0, share, torch.full_like(share, k / flat.shape[1]))


def _check_below(resize_below) -> float:
    """``resize_below`` as a float in ``[0, 1]`` (0: never spend like ``resize``)."""
    if not is_number(resize_below) or not 0.0 <= float(resize_below) <= 1.0:
        raise ValueError(f"cascade: resize_below must be None or a number in [0, 1] (a map "
                         f"confidence, map_confidence), got {resize_below!r}")
    return float(resize_below)


def page_legibility(g: Gist, budget: int, *, legible_px: float = LEGIBLE_PX,
                    patch: int = 16) -> torch.Tensor:
    """``[B]`` how legible the page's typical text would be if ``budget`` tokens were spent
    as :func:`~fovea_core.allocators.grid.resize` spends them, in octaves: the median over
    the page's level-0 cells of the gist's text-height estimate (:func:`text_heights`, log2
    base pixels), minus ``log2(legible_px)``, minus ``resize``'s level at ``budget``. At 0
    the median text is ``legible_px`` high in ``resize``'s view; at -1, half of that.
    Read from the gist alone (inside N: budgeted). The estimate is the learned size head's,
    fitted on scans: on pages unlike them it is a signal to fit a rule on, not a
    measurement (:mod:`fovea_book.eval.tried.safe_rule`)."""
    level = resize_grid(g.image_size, budget, patch)[2]
    median = text_heights(g).flatten(1).median(1).values                   # [B]
    return median - math.log2(legible_px) - float(level)


def _resize_unsure(parts: CascadeParts, pyramid: Pyramid, budget: int, patch: int,
                   below: float, *, legible: float | None = None,
                   legible_px: float = LEGIBLE_PX) -> CascadeParts:
    """``parts`` with every image whose map's :func:`map_confidence` is below ``below``, or
    (``legible`` given) whose :func:`page_legibility` is at least ``-legible``, given
    ``resize``'s tokens and level instead (its map stays: the one it was judged by)."""
    unsure = map_confidence(parts.scores) < below                          # [B]
    if legible is not None:
        unsure |= page_legibility(parts.gist, budget, legible_px=legible_px,
                                  patch=patch) >= -legible
    if not bool(unsure.any()):
        return parts
    res = _as_resize(pyramid, parts.gist, budget, patch)
    t = res.tokens
    stage0 = TokenSet(t.centers, t.levels, t.scores, t.fixations, t.image_size, t.patch,
                      torch.zeros(t.centers.shape[:2], dtype=torch.long))    # all stage 0
    per = [stage0[b] if bool(unsure[b]) else parts.tokens[b]
           for b in range(pyramid.batch_size)]                             # a few images
    tokens = TokenSet.cat(per) if len(per) > 1 else per[0]
    levels = torch.where(unsure, res.levels, parts.levels.float())
    return parts._replace(tokens=tokens, levels=levels)


def _check_legible(resize_legible) -> float:
    """``resize_legible`` as a float: a finite number (octaves below ``legible_px``)."""
    if not is_number(resize_legible) or not math.isfinite(float(resize_legible)):
        raise ValueError(f"cascade: resize_legible must be None or a finite number (octaves "
                         f"below legible_px, page_legibility), got {resize_legible!r}")
    return float(resize_legible)


def _check_within(resize_within) -> float:
    """``resize_within`` as a float: a finite number >= 0 (0: never spend like ``resize``)."""
    if not is_number(resize_within) or not (math.isfinite(float(resize_within))
                                             and float(resize_within) >= 0):
        raise ValueError(f"cascade: resize_within must be None or a finite number >= 0 (a "
                         f"multiple of the budget), got {resize_within!r}")
    return float(resize_within)


def _as_resize(pyramid: Pyramid, g: Gist, budget: int, patch: int) -> CascadeParts:
    """The budget spent as :func:`~fovea_core.allocators.grid.resize` spends it, as
    :class:`CascadeParts`: the page's gist (already computed; its tokens are not used), the
    resize's ``budget`` tokens (all stage 0), a flat map (the resize favours no cell) and
    the resize's level for every image."""
    gh, gw = pyramid.grid_shape(patch, 0)
    flat = torch.full((pyramid.batch_size, gh, gw), 1.0 / (gh * gw))
    tokens = resize(pyramid, flat, budget, patch=patch)
    level = resize_grid(pyramid.image_size, budget, patch)[2]
    return CascadeParts(tokens, g, flat, torch.full((pyramid.batch_size,), float(level)))


def _regions(pyramid: Pyramid, g: Gist, loc: torch.Tensor, rest: int,
             size_map: torch.Tensor | None, cost: SideCost | None, *, legible_px: float,
             context: tuple[int, int], context_weight: float, patch: int) -> CascadeParts:
    """The fovea with a level per region (:func:`~fovea_core.cascade.core.foveate_regions`).

    Candidate levels: a ladder every :data:`REGION_STEP` octaves through the page's one-level
    choice (:func:`choose_level`), from the finest level the page allows up to half an octave
    below the gist. Each cell needs ``log2(text_px / legible_px)`` and is read at the rung
    nearest to it (``need + REGION_STEP / 2`` rounded down): ``legible_px`` already leaves
    a margin (the reader reads 5-6 px text). On the localiser's held-out fifth of the forms a
    ladder from level 0 with every cell rounded down read 0.46 mean ANLS, this one 0.50
    (both ranking tokens by mass per token; by mass per area, as now, 0.52)."""
    need = text_heights(g, size_map) - math.log2(legible_px)               # [B, Gh, Gw]
    lo = fitting_level(0.0, pyramid.image_size, rest, patch)
    top = max(g.level - 0.5, lo)
    anchor = choose_level(g, loc, legible_px=legible_px, size_map=size_map)  # [B]
    parts, firsts = [], []
    for b in range(pyramid.batch_size):                 # each page its own candidate levels
        a = float(anchor[b])
        k = torch.arange(math.ceil((lo - a) / REGION_STEP - 1e-9),
                         math.floor((top - a) / REGION_STEP + 1e-9) + 1, dtype=torch.float64)
        levels = a + REGION_STEP * k
        fov = foveate_regions(loc[b:b + 1], rest, image_size=pyramid.image_size,
                              need=need[b:b + 1] + REGION_STEP / 2, levels=levels,
                              patch=patch, context=context, context_weight=context_weight)
        parts.append(combine([g.tokens[b], fov], fixation=fov.fixations))
        firsts.append(fov.levels.min())
    tokens = TokenSet.cat(parts) if len(parts) > 1 else parts[0]
    return CascadeParts(tokens, g, loc, torch.stack(firsts), cost)


def cascade(pyramid: Pyramid, scores=None, budget: int = DEFAULT_BUDGET, *,
            query: str | None = None, gist_budget: int | None = None,
            localiser: str | Callable = "learned", level: float | str = "auto",
            legible_px: float = LEGIBLE_PX, surround: float = SURROUND,
            context: tuple[int, int] = (1, 2), context_weight: float = 0.5, fixation=None,
            seed: int = 0,
            patch: int = 16, side: str | None = None, fovea: str = "core",
            resize_within: float | None = None, resize_below: float | None = None,
            resize_legible: float | None = None) -> TokenSet:
    """The budgeted cascade: gist, localise, foveate; exactly ``budget`` tokens.

    1. (a) :func:`~fovea_core.cascade.core.gist` at ``gist_budget`` tokens (default
       :func:`gist_budget_for`, 64 at N = 273; ``rows * cols`` of them are used, the rest
       goes to the fovea);
    2. (b) ``localiser(gist, query)`` (a name of
       :data:`~fovea_core.cascade.localisers.LOCALISERS` or a callable) -> ``[B, Gh, Gw]``;
    3. (c) :func:`~fovea_core.cascade.core.place_fovea` with the remaining ``budget - rows *
       cols`` tokens: a *core* of ``1 - surround`` of them at ``level`` (``"auto"``:
       :func:`choose_level`, the scale at which the text expected there is ``legible_px``
       high; or a number) on the cells with the most localiser mass, and a *surround* of
       the rest one octave coarser, on the mass the core left uncovered -- dense where the
       answer most likely is, coarser around it, as a retina (it hedges both a localiser
       that is slightly off and text larger than expected).

    ``side="text"`` adds side compute (:func:`~fovea_core.cascade.side.detect_text`, a text
    detector on a 512-px render, outside N): the localiser map is tempered
    (``** SIDE_TEMPER``) and multiplied by ``SIDE_FLOOR + text mask``, and ``level="auto"``
    reads the text height the detector measured under the map (the gist's estimate where it
    found no text). Its cost is :attr:`CascadeParts.side`.

    ``fovea="regions"`` replaces the core and its surround by a level per region
    (:func:`~fovea_core.cascade.core.foveate_regions` on a ladder of levels every
    :data:`REGION_STEP` octaves, from :func:`text_heights`), so several modes of the map are
    read, each at its level.

    ``fovea="saccade"`` reads the surround first, as a first look, and then the core: a cell
    the first look showed blank (:func:`~fovea_core.cascade.core.look_ink` below
    :data:`~fovea_core.cascade.core.INK_MIN`) keeps :data:`BLANK_FLOOR` of its mass, so the
    fine tokens go to the marks rather than to the paper between them. The token counts and
    levels are those of ``"core"`` (the core alone where no surround fits).

    ``resize_within`` (a number >= 0, default ``None``: never): on a page whose level-0 grid
    holds at most ``resize_within * budget`` cells the budget is spent as
    :func:`~fovea_core.allocators.grid.resize` spends it (a small page, which a resize
    already reads near its native resolution). :mod:`fovea_book.eval.tried.resize_rule` fits it
    on training pages; its fit chose 0 (the cascade read at least as well as ``resize`` at
    every page size there).

    ``resize_below`` (a number in ``[0, 1]``, default ``None``: never): an image whose
    localiser map is unsure (:func:`map_confidence` below ``resize_below``) is given
    ``resize``'s tokens instead (the map was computed from the gist, inside N: still
    budgeted). :mod:`fovea_book.eval.tried.confidence_rule` fits it.

    ``resize_legible`` (a number of octaves, default ``None``: never): an image whose
    :func:`page_legibility` is at least ``-resize_legible`` (its median text already legible
    to a resize) is given ``resize``'s tokens too. :mod:`fovea_book.eval.tried.safe_rule`
    fits it with ``resize_below``.

    ``scores`` and ``seed`` are ignored (the cascade looks at the page itself, through the
    gist); ``fixation`` is replaced by the peak of the localiser's map (a given one is still
    held to the shared rule, :func:`~fovea_core.allocators.base.resolve_fixation`: finite,
    in ``[0, 1]``). Returns a :class:`TokenSet` whose ``stage`` is 0 for the gist's tokens
    and 1 for the fovea's.

    The localiser's map is read by :func:`localiser_map` (a map with no mass as flat, a
    NaN / inf map refused).

    Raises:
        ValueError: naming the argument, for a ``budget`` outside the page's range
            (:func:`budget_range`; the message states it), a ``gist_budget`` that is not an
            int (numpy integers are accepted) or leaves no fovea token, a ``level`` that is
            neither ``"auto"`` nor a finite number, ``legible_px <= 0``, ``surround``
            outside ``[0, 1)``, ``context`` not two ints >= 0, ``context_weight`` outside
            ``[0, 1]`` (NaN included), or a ``fixation`` outside ``[0, 1]``.
        TypeError: ``query`` is neither a str nor None.
    """
    check_fixation(pyramid, fixation)
    return cascade_parts(pyramid, budget, query=query, gist_budget=gist_budget,
                         localiser=localiser, level=level, legible_px=legible_px,
                         surround=surround, context=context, context_weight=context_weight,
                         patch=patch, side=side, fovea=fovea,
                         resize_within=resize_within, resize_below=resize_below,
                         resize_legible=resize_legible).tokens


def text_render_reads(pyramid: Pyramid) -> int:
    """Pixels ``cascade_text``'s side channel reads besides its N tokens: the detector's
    render of each page (:func:`~fovea_core.cascade.side.render_size`)."""
    from fovea_core.cascade.side import render_size

    h, w = render_size(pyramid.image_size)
    return h * w


def reads_nothing_else(pyramid: Pyramid) -> int:
    """Pixels the cascade looks at outside its budget: none. Its localisers see only the
    gist, whose tokens are part of the N it returns (the sweep's ``alloc_read_tokens``)."""
    return 0


for _name, _loc, _learned in (("cascade", "learned", True),
                              ("cascade_gist_query", "gist_query", False),
                              ("cascade_prior", "learned_prior", True),
                              ("cascade_paper", "learned_paper", True)):
    register(_name, family="cascade", version="cascade", content=True, learned=_learned,
             reads=reads_nothing_else, uses_scores=False, runner=cascade_parts,
             localiser=_loc)(cascade)
#: the safe cascade's switches to ``resize`` (``cascade_safe``): the pair the fit on
#: photograph-like training pages chose, objective "never below resize on any variant"
#: (``python -m fovea_book.eval.tried.safe_rule``, record ``data/models/safe_rule.json``)
SAFE_RESIZE_BELOW = 0.95
SAFE_RESIZE_LEGIBLE = 1.0
register("cascade_safe", family="cascade", version="cascade", content=True, learned=True,
         reads=reads_nothing_else, uses_scores=False, runner=cascade_parts,
         localiser="learned", resize_below=SAFE_RESIZE_BELOW,
         resize_legible=SAFE_RESIZE_LEGIBLE)(cascade)
register("cascade_text", family="cascade", version="cascade", content=True, learned=True,
         reads=text_render_reads, uses_scores=False, side_compute=True, runner=cascade_parts,
         localiser="learned", side="text")(cascade)
