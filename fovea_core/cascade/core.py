"""The budgeted cascade: gist -> localise -> foveate, all inside N tokens.

A VLM that must find the answer with the same N tokens it reads with cannot first OCR the
page at half resolution (the query scorer of :mod:`fovea_core.importance.query` does, outside
the budget). The cascade spends the budget in stages, each a function that can be called
alone:

(a) :func:`gist` -- the whole page at ``G`` tokens on the ``resize`` baseline's grid;
    :attr:`Gist.image` is what those tokens show, never the full-resolution page.
(b) *localise* -- a :data:`Localiser` maps the gist (and the question) to a score map on the
    level-0 patch grid ``[B, Gh, Gw]`` (:mod:`fovea_core.cascade.localisers`).
(c) :func:`place_fovea` -- the remaining tokens on the cells with the most score mass, at
    the level that makes text legible; :func:`foveate_regions` chooses a level per region.
(d) *a second look* (``fovea="saccade"``): :func:`look_ink` says which cells the coarse
    first look showed hold ink, and the fine core reads only those.

:func:`~fovea_core.cascade.allocator.cascade` chains them into exactly ``N`` tokens, and
``TokenSet.stage`` says where every token came from (:data:`STAGE_GIST`,
:data:`STAGE_FOVEA`, a second fixation's :data:`STAGE_SECOND`). The second look decides
*where* to read finely from ink or blank paper, never from what the text says: the cascade
does not read, so it cannot tell which of the lines it found answers the question (chapter
14.7).

The idea is the seeds' "saccade" Homunculus (look coarsely, decide, look again) and the
classic coarse-to-fine search of active vision [Ballard 1991, Animate vision]; the
glimpse-then-decide loop of recurrent attention models [Mnih et al. 2014, "Recurrent models
of visual attention"] is its learned form.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fovea_core.allocators.base import resolve_fixation, select
from fovea_core.allocators.grid import resize_grid
from fovea_core.cascade.raster import coverage_raster
from fovea_core.pyramid import Pyramid
from fovea_core.sample import sample, sample_positions
from fovea_core.tokens import LEVEL_QUANTUM, TokenSet

__all__ = ["STAGE_GIST", "STAGE_FOVEA", "STAGE_SECOND", "Gist", "gist", "page_key",
           "one_image", "overlap_matrix", "gist_to_grid", "grid_mass", "fovea_grid",
           "place_fovea", "region_levels", "foveate_regions", "look_ink", "INK_MIN", "combine",
           "select_tokens", "Localiser", "LEVEL_TOLERANCE", "SEEN_WEIGHT", "covered_share",
           "discount_seen", "held_cells", "LEGIBLE_PX", "fitting_level", "is_number"]

#: ``TokenSet.stage`` labels: the gist's tokens, the fovea's (core and surround), and a
#: second fixation's (the read-then-look cascade's, the processor's two fixations)
STAGE_GIST, STAGE_FOVEA, STAGE_SECOND = 0, 1, 2
#: two levels less than this many octaves apart read the same detail: a surround needs to be
#: at least this much coarser than its core to be a stage of its own, and an earlier token
#: at most this much coarser than a later fixation's level counts as having read its cells
#: (:func:`discount_seen`); a quarter octave, a prior, not fitted
LEVEL_TOLERANCE = 0.25
#: the share of its mass a cell keeps in a later fixation's map when an earlier fixation
#: already read it at least as finely (:func:`discount_seen`): none, what was read is not read
#: again (cells with no mass left are ranked by the caller's own rule, e.g. the read-then-look
#: cascade's nearness to the mass); a prior, not fitted
SEEN_WEIGHT = 0.0


def one_image(pyramid: Pyramid, b: int) -> Pyramid:
    """Image ``b`` of ``pyramid`` as a pyramid of one (the pyramid itself when it holds one,
    so that what is cached on it, such as the area sampler's table, is reused)."""
    if pyramid.batch_size == 1:
        return pyramid
    return Pyramid(tuple(lv[b:b + 1] for lv in pyramid.levels))


def page_key(pyramid: Pyramid) -> list[str]:
    """One SHA-1 per image of the batch, of its pyramid's coarsest level (a few hundred
    pixels): identifies a page cheaply. Only the oracle localiser uses it (to look up
    the answer boxes it is given); no localiser reads pixels through it."""
    top = pyramid.levels[-1].detach().to("cpu", torch.float32).contiguous()
    return [hashlib.sha1(x.numpy().tobytes() + str(tuple(pyramid.image_size)).encode())
            .hexdigest() for x in top]


@dataclass(frozen=True, eq=False)
class Gist:
    """Stage (a): the page at a few tokens, and the small image those tokens show.

    Attributes:
        tokens: ``[B, rows * cols]`` TokenSet (stage 0), row-major over the grid.
        image: ``[B, C, rows * patch, cols * patch]`` float, the sampled patches assembled
            in place; gist pixel ``(i, j)`` shows base pixel ``(origin + (j + .5, i + .5) *
            2**level)``. Pixels beyond the page edge replicate it (the sampler clamps).
        rows, cols: the grid (``rows * cols <= G``).
        level: continuous level of every gist token (cell side ``patch * 2**level`` px).
        origin: ``(x, y)`` base-pixel position of the grid's top-left corner (``<= 0``: the
            grid is centred on the page, the rounding margin split between both sides).
        key: :func:`page_key` per image (for the oracle only).
    """

    tokens: TokenSet
    image: torch.Tensor
    rows: int
    cols: int
    level: float
    origin: tuple[float, float]
    key: tuple[str, ...] = ()

    @property
    def image_size(self) -> tuple[int, int]:
        """``(H, W)`` of the page in base pixels."""
        return self.tokens.image_size

    @property
    def patch(self) -> int:
        return self.tokens.patch

    @property
    def pixel(self) -> float:
        """Base pixels per gist pixel, ``2**level``."""
        return 2.0 ** self.level

    @property
    def budget(self) -> int:
        """Tokens the gist uses, ``rows * cols``."""
        return self.rows * self.cols

    def pixel_centres(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Base-pixel centres of the gist pixels: ``ys [rows*p]``, ``xs [cols*p]``."""
        hp, wp = self.image.shape[-2:]
        ys = self.origin[1] + (torch.arange(hp, dtype=torch.float64) + 0.5) * self.pixel
        xs = self.origin[0] + (torch.arange(wp, dtype=torch.float64) + 0.5) * self.pixel
        return ys, xs

    def inside(self) -> torch.Tensor:
        """``[rows*p, cols*p]`` bool: gist pixels whose centre lies on the page."""
        h, w = self.image_size
        ys, xs = self.pixel_centres()
        return ((ys >= 0) & (ys < h))[:, None] & ((xs >= 0) & (xs < w))[None, :]


def gist(pyramid: Pyramid, budget: int, *, patch: int = 16) -> Gist:
    """Stage (a): the whole page at the largest scale whose grid fits ``budget`` tokens.

    The grid is :func:`~fovea_core.allocators.grid.resize_grid` ``(image_size, budget,
    patch)``, centred on the page exactly as the ``resize`` allocator centres it, and only
    its ``rows * cols`` cells are tokens (``resize`` would spend the leftovers on finer
    copies of the centre; here they go to the fovea). The patches are read with
    :func:`~fovea_core.sample.sample` at the grid's continuous level (the page
    area-resampled at that scale, as a processor resizes it) and assembled into
    :attr:`Gist.image`; this is everything later stages may know about the page's pixels.

    Raises ``ValueError`` when the budget is outside ``[1, Gh * Gw]`` or the pyramid is too
    shallow for the gist's level.
    """
    if not isinstance(pyramid, Pyramid):
        raise TypeError(f"gist: pyramid must be a fovea_core Pyramid, got {type(pyramid).__name__}")
    h, w = pyramid.image_size
    r, c, level = resize_grid((h, w), budget, patch)
    if level > pyramid.num_levels - 1 + 1e-9:
        raise ValueError(f"gist: budget {budget} needs level {level:.2f} but the pyramid has "
                         f"{pyramid.num_levels} levels; use a larger gist budget")
    level = min(level, pyramid.num_levels - 1.0)
    side = patch * 2.0 ** level
    ox, oy = (w - c * side) / 2, (h - r * side) / 2
    cells = torch.arange(r * c)
    cx = (ox + ((cells % c).double() + 0.5) * side) / w
    cy = (oy + ((cells // c).double() + 0.5) * side) / h
    b = pyramid.batch_size
    centers = torch.stack([cx, cy], -1).float().clamp(0, 1).expand(b, r * c, 2)
    tokens = TokenSet(centers, torch.full((b, r * c), float(level)), torch.zeros(b, r * c),
                      torch.full((b, 1, 2), 0.5), (h, w), patch,
                      torch.full((b, r * c), STAGE_GIST, dtype=torch.int64))
    patches = sample(pyramid, tokens)                                    # [B, G, C, p, p]
    ch = patches.shape[2]
    image = (patches.reshape(b, r, c, ch, patch, patch).permute(0, 3, 1, 4, 2, 5)
             .reshape(b, ch, r * patch, c * patch))
    return Gist(tokens, image.contiguous(), r, c, float(level), (ox, oy),
                tuple(page_key(pyramid)))


# ----------------------------------------------------------------------------- resampling
@functools.lru_cache(maxsize=256)
def overlap_matrix(n_out: int, out_side: float, out_origin: float, n_in: int, in_side: float,
                   in_origin: float, length: float) -> torch.Tensor:
    """``[n_out, n_in]`` float64: length of the overlap of output interval ``i`` with input
    interval ``j`` on the page ``[0, length)``, divided by the in-page length of input ``j``.

    Interval ``i`` of a grid is ``[origin + i side, origin + (i + 1) side)``. Row ``i`` of
    the matrix therefore moves the *mass* of the input cells into output cell ``i`` (columns
    sum to 1 where the input cell lies on the page), so ``A_y @ M @ A_x.T`` resamples a mass
    map ``M`` between any two grids exactly (separable, no loop over cells). Cached (a page's
    questions share their grids); the returned tensor must not be modified.
    """
    def edges(n: int, side: float, origin: float) -> tuple[torch.Tensor, torch.Tensor]:
        e = origin + torch.arange(n + 1, dtype=torch.float64) * side
        e = e.clamp(0.0, float(length))
        return e[:-1], e[1:]

    o0, o1 = edges(n_out, out_side, out_origin)
    i0, i1 = edges(n_in, in_side, in_origin)
    ov = (torch.minimum(o1[:, None], i1[None]) - torch.maximum(o0[:, None], i0[None])).clamp(min=0)
    inlen = (i1 - i0)
    return torch.where(inlen[None] > 0, ov / inlen.clamp(min=1e-12)[None], torch.zeros_like(ov))


def gist_to_grid(values: torch.Tensor, g: Gist, *, patch: int | None = None,
                 mode: str = "mass", scale: int = 1) -> torch.Tensor:
    """A map on the gist's pixels ``[B, rows*p/scale, cols*p/scale]`` -> the level-0 patch
    grid ``[B, Gh, Gw]`` (cells of ``patch`` base pixels, default the gist's patch).

    ``scale``: the map's pixel is ``scale x scale`` gist pixels (``ceil`` at the edge), e.g.
    2 for a network that predicts at half the gist's resolution.
    ``mode="mass"``: each base cell receives the share of every map pixel's value that
    its area covers (a probability map stays a probability map; the part of a pixel off
    the page carries none). ``mode="mean"``: the area-weighted mean of the map over each
    cell (for intensive maps such as scores). Exact separable area resampling
    (:func:`overlap_matrix`).
    """
    p = g.patch if patch is None else int(patch)
    h, w = g.image_size
    gh, gw = math.ceil(h / p), math.ceil(w / p)
    hp, wp = values.shape[-2:]
    px = g.pixel * scale
    ay = overlap_matrix(gh, p, 0.0, hp, px, g.origin[1], h)
    ax = overlap_matrix(gw, p, 0.0, wp, px, g.origin[0], w)
    out = torch.einsum("yi,bij,xj->byx", ay, values.double(), ax)
    if mode == "mean":
        ones = torch.einsum("yi,ij,xj->yx", ay, torch.ones(hp, wp, dtype=torch.float64), ax)
        out = out / ones.clamp(min=1e-12)
    elif mode != "mass":
        raise ValueError(f"mode must be 'mass' or 'mean', got {mode!r}")
    return out.float()


def grid_mass(scores: torch.Tensor, image_size: tuple[int, int], side: float, *,
              patch: int = 16) -> torch.Tensor:
    """Mass of a level-0 map ``[B, Gh, Gw]`` on the grid of cells of ``side`` base pixels
    anchored at the page's top-left: ``[B, ceil(H / side), ceil(W / side)]``."""
    h, w = image_size
    gh, gw = scores.shape[-2:]
    nr, nc = math.ceil(h / side - 1e-9), math.ceil(w / side - 1e-9)
    ay = overlap_matrix(nr, side, 0.0, gh, patch, 0.0, h)
    ax = overlap_matrix(nc, side, 0.0, gw, patch, 0.0, w)
    return torch.einsum("yi,bij,xj->byx", ay, scores.double(), ax).float()


# ----------------------------------------------------------------------------- fovea
def fovea_grid(image_size: tuple[int, int], level: float, patch: int = 16
               ) -> tuple[int, int, float]:
    """``(rows, cols, side)`` of the fovea's grid at continuous ``level``: cells of
    ``side = patch * 2**level`` base pixels from the page's top-left corner."""
    if not math.isfinite(level) or level < 0:
        raise ValueError(f"fovea level must be finite and >= 0, got {level!r}")
    h, w = image_size
    side = patch * 2.0 ** level
    return math.ceil(h / side - 1e-9), math.ceil(w / side - 1e-9), side


# ----------------------------------------------------------------------------- the level
#: text height (base pixels at the level read) the fovea's core aims for. Chosen on held-out
#: synthetic validation pages (papers and receipts, never an evaluated page) among 6, 8 and
#: 11 px: the reader still reads ~5-6 px text, but the size estimate errs by ~0.3 octave and
#: a finer core loses little when the localiser is sure (see the training record)
LEGIBLE_PX = 11.0

def fitting_level(level: float, image_size: tuple[int, int], tokens: int, patch: int) -> float:
    """``level``, or the coarsest level below it whose grid has at least ``tokens`` cells
    (a small page read coarsely has fewer cells than the fovea has tokens)."""
    def cells(lv: float) -> int:
        side = patch * 2.0 ** lv
        return math.ceil(image_size[0] / side - 1e-9) * math.ceil(image_size[1] / side - 1e-9)

    if cells(0.0) < tokens:
        raise ValueError(f"cascade: a {image_size[0]}x{image_size[1]} page has only {cells(0.0)} "
                         f"level-0 cells for {tokens} fovea tokens; use a smaller budget")
    if cells(level) >= tokens:
        return level
    lo, hi = 0.0, level                                     # cells(lo) >= tokens > cells(hi)
    for _ in range(30):                                     # bisection on the level
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cells(mid) >= tokens else (lo, mid)
    return lo


def is_number(x) -> bool:
    """``x`` is a real number (Python or numpy, int or float) and not a bool: the check the
    cascades' argument validation shares."""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(
        x, (bool, np.bool_))


def _context(mass: torch.Tensor, context: tuple[int, int], weight: float) -> torch.Tensor:
    """``max(m, weight * maxpool(m))`` over a ``(2 cy + 1) x (2 cx + 1)`` window: cells next
    to probable cells rank before far-away cells of the same (low) mass."""
    cy, cx = context
    if weight <= 0 or (cy == 0 and cx == 0):
        return mass
    pooled = F.max_pool2d(mass[:, None], (2 * cy + 1, 2 * cx + 1), stride=1,
                          padding=(cy, cx))[:, 0]
    return torch.maximum(mass, weight * pooled)


def place_fovea(scores: torch.Tensor, budget: int, *, image_size: tuple[int, int], level: float,
            patch: int = 16, context: tuple[int, int] = (1, 2), context_weight: float = 0.5,
            exclude: torch.Tensor | None = None, stage: int = STAGE_FOVEA,
            fixation=None) -> TokenSet:
    """Stage (c): ``budget`` tokens at continuous ``level`` where ``scores`` has its mass.

    Args:
        scores: ``[B, Gh, Gw]`` non-negative localiser map on the level-0 patch grid (a
            probability or any mass; only its order after pooling matters).
        budget: tokens to place (``<=`` cells of the level grid).
        image_size: ``(H, W)``.
        level: continuous level of every fovea token
            (:func:`~fovea_core.cascade.allocator.choose_level`).
        context: ``(rows, cols)`` half-window of neighbours whose mass lends priority
            (text runs along rows, so the window is wider than tall).
        context_weight: share of a neighbour's mass a cell may borrow (0: none).
        exclude: optional ``[B, rows, cols]`` bool on the level grid, cells not to pick.
        stage: the label written into ``TokenSet.stage``.

    The priority of a cell is its mass (:func:`grid_mass`) raised to ``context_weight``
    times the largest mass in its window; the ``budget`` best cells are taken (ties: row-
    major first, :func:`~fovea_core.allocators.base.select`). Returns a TokenSet whose
    scores are the cells' masses and whose fixation is the peak of ``scores``.
    """
    if scores.ndim != 3:
        raise ValueError(f"scores must be [B, Gh, Gw], got {tuple(scores.shape)}")
    nr, nc, side = fovea_grid(image_size, level, patch)
    if isinstance(budget, bool) or not 1 <= int(budget) <= nr * nc:
        raise ValueError(f"place_fovea: budget must be in [1, {nr * nc}] (the level-{level:.2f} "
                         f"grid has {nr}x{nc} cells), got {budget!r}")
    s = torch.nan_to_num(scores.float(), nan=0.0).clamp(min=0)
    mass = grid_mass(s, image_size, side, patch=patch)                       # [B, nr, nc]
    prio = _context(mass, context, context_weight).flatten(1)
    if exclude is not None:
        # -inf, not a finite sentinel: the ranking grid (rank_grid) is scaled by the
        # largest finite priority, the map's own mass
        prio = torch.where(exclude.flatten(1), torch.full_like(prio, -torch.inf), prio)
    idx = torch.sort(select(prio, int(budget)), dim=1).values                 # [B, M]
    rows, cols = idx // nc, idx % nc
    h, w = image_size
    cx = ((cols.double() + 0.5) * side / w).clamp(0, 1)
    cy = ((rows.double() + 0.5) * side / h).clamp(0, 1)
    b = s.shape[0]
    fix = resolve_fixation(fixation, s)
    return TokenSet(torch.stack([cx, cy], -1).float(), torch.full(idx.shape, float(level)),
                    mass.flatten(1).gather(1, idx), fix[:, None], (h, w), patch,
                    torch.full(idx.shape, stage, dtype=torch.int64).expand(b, -1))


def region_levels(need: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """``[B, Gh, Gw]`` int64: for each level-0 cell, the index into the ascending candidate
    ``levels`` ``[L]`` of the coarsest level at or below the level the cell ``need`` s
    (``[B, Gh, Gw]``, the level at which its text is legible; NaN: the finest), the finest
    where it needs finer than every candidate. Coarser is cheaper (a token at level ``l``
    covers ``4**l`` level-0 cells), finer than needed wastes tokens, coarser is illegible."""
    n = torch.nan_to_num(need.float(), nan=float("-inf")).contiguous()
    k = torch.searchsorted(levels.float().contiguous(), n, right=True) - 1
    return k.clamp(min=0)


def foveate_regions(scores: torch.Tensor, budget: int, *, image_size: tuple[int, int],
                    need: torch.Tensor, levels, patch: int = 16,
                    context: tuple[int, int] = (1, 2), context_weight: float = 0.5,
                    stage: int = STAGE_FOVEA, fixation=None) -> TokenSet:
    """Stage (c) with a level chosen per region: ``budget`` tokens, each level-0 cell read at
    the coarsest of ``levels`` that still makes its text legible.

    Args:
        scores: ``[B, Gh, Gw]`` non-negative localiser map on the level-0 patch grid.
        budget: tokens to place.
        image_size: ``(H, W)``.
        need: ``[B, Gh, Gw]`` the level each cell needs (``log2(text_px / legible_px)``
            from a text-size map; NaN: the finest of ``levels``).
        levels: ascending candidate levels ``[L]`` (e.g. half-octave steps from the finest
            the page allows up to half an octave below the gist).

    Each cell's mass goes to its level (:func:`region_levels`); on each level's grid a
    cell's priority is the mass of the cells assigned to that level under it per level-0
    cell of its area (a density: the map's order, as in :func:`place_fovea`), raised by its
    neighbours; the ``budget`` best cells over all levels are taken at once (ties: finer
    level first, then row-major). A region whose text is large is read coarsely and
    cheaply (a token at level ``l`` covers ``4**l`` level-0 cells), one whose text is small
    finely, and several modes of ``scores`` get their tokens, each at its own level.
    (Ranking by mass per token instead, the knapsack's value per cost, favours coarse cells
    fourfold per octave and read worse on the training pages: 0.50 vs 0.52 mean ANLS on
    forms.) Returns a TokenSet whose ``levels`` differ per token and whose fixation is the
    peak of ``scores``.
    """
    if scores.ndim != 3 or need.shape != scores.shape:
        raise ValueError(f"scores and need must both be [B, Gh, Gw], got "
                         f"{tuple(scores.shape)} and {tuple(need.shape)}")
    lv = torch.as_tensor(levels, dtype=torch.float64).flatten()
    if lv.numel() == 0 or not bool(torch.isfinite(lv).all()) or float(lv[0]) < 0 \
            or bool((lv.diff() <= 0).any()):
        raise ValueError(f"foveate_regions: levels must be finite, >= 0 and strictly "
                         f"ascending, got {lv.tolist()}")
    s = torch.nan_to_num(scores.float(), nan=0.0).clamp(min=0)
    k = region_levels(need, lv)                                              # [B, Gh, Gw]
    grids = [fovea_grid(image_size, float(x), patch) for x in lv]           # (nr, nc, side)
    if isinstance(budget, bool) or not 1 <= int(budget) <= grids[0][0] * grids[0][1]:
        raise ValueError(f"foveate_regions: budget must be in [1, {grids[0][0] * grids[0][1]}]"
                         f" (the cells of the finest level's grid), got {budget!r}")
    mass = [grid_mass(s * (k == i), image_size, side, patch=patch).flatten(1)
            for i, (_, _, side) in enumerate(grids)]                         # L x [B, n_i]
    # priority: mass per level-0 cell of area (a density), so the tokens follow the map as
    # the one-level fovea's do, each cell paying what its level costs
    prio = [_context(m.view(-1, nr, nc) / (sd / patch) ** 2, context, context_weight).flatten(1)
            for m, (nr, nc, sd) in zip(mass, grids)]
    idx = torch.sort(select(torch.cat(prio, 1), int(budget)), dim=1).values    # [B, M]
    ends = torch.tensor([0] + [nr * nc for nr, nc, _ in grids]).cumsum(0)    # [L + 1]
    which = torch.bucketize(idx, ends[1:], right=True)                       # [B, M] level index
    local = idx - ends[which]
    ncs = torch.tensor([nc for _, nc, _ in grids])[which]
    sides = torch.tensor([sd for _, _, sd in grids], dtype=torch.float64)[which]
    rows, cols = local // ncs, local % ncs
    h, w = image_size
    cx = ((cols.double() + 0.5) * sides / w).clamp(0, 1)
    cy = ((rows.double() + 0.5) * sides / h).clamp(0, 1)
    fix = resolve_fixation(fixation, s)
    return TokenSet(torch.stack([cx, cy], -1).float(), lv[which].float(),
                    torch.cat(mass, 1).gather(1, idx), fix[:, None], (h, w), patch,
                    torch.full(idx.shape, stage, dtype=torch.int64).expand(s.shape[0], -1))


#: a sample of a look shows ink where its luminance differs from its token's median (the
#: paper under sparse text) by at least this much (page values in [0, 1])
INK_MIN = 0.15


def look_ink(pyramid: Pyramid, look: TokenSet, *, patch: int = 16
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """What a look's tokens showed, on the level-0 patch grid: ``(ink, seen)``, both
    ``[B, Gh, Gw]``.

    Every token of ``look`` is read as the model reads it (:func:`~fovea_core.sample.sample`,
    the area resample); a sample's *ink* is the absolute difference of its luminance (the
    mean over channels) from its token's median luminance, which is the paper's under text
    that covers less than half of a patch, whatever the polarity. A level-0 cell's ``ink``
    is the largest over the samples whose positions fall in it, ``seen`` whether any does
    (a look at level ``l <= 4`` places a sample every ``2**l <= 16`` base pixels, so every
    cell under its footprint is seen; ``ink`` is 0 where nothing was seen). No text is
    recognised: the test only separates marks from blank paper.
    """
    if look.batch_size != pyramid.batch_size or tuple(look.image_size) != tuple(
            pyramid.image_size):
        raise ValueError("look_ink: the look's tokens must belong to this pyramid (same batch "
                         "size and image size)")
    h, w = pyramid.image_size
    gh, gw = pyramid.grid_shape(patch, 0)
    b, m = look.levels.shape
    lum = sample(pyramid, look).mean(2)                                      # [B, M, p, p]
    med = lum.flatten(2).median(2).values[..., None, None]
    ink = (lum - med).abs()
    xs, ys = sample_positions(look)                                          # [B, M, p]
    col = (xs.clamp(0, w - 1) // patch).long().clamp(max=gw - 1)[:, :, None, :]
    row = (ys.clamp(0, h - 1) // patch).long().clamp(max=gh - 1)[:, :, :, None]
    cell = (row * gw + col).expand(b, m, ys.shape[-1], xs.shape[-1]).reshape(b, -1)
    out = torch.zeros(b, gh * gw, dtype=ink.dtype, device=ink.device)
    out.scatter_reduce_(1, cell, ink.reshape(b, -1).to(out.dtype), "amax")
    seen = torch.zeros(b, gh * gw, dtype=torch.bool, device=ink.device)
    seen.scatter_(1, cell, True)
    return out.view(b, gh, gw), seen.view(b, gh, gw)


def combine(parts: list[TokenSet], fixation: torch.Tensor | None = None) -> TokenSet:
    """Concatenate the stages' TokenSets along N (each must carry ``stage``)."""
    first = parts[0]
    for p in parts:
        if p.stage is None:
            raise ValueError("combine: every part needs its stage labels")
        if (p.image_size, p.patch, p.batch_size) != (first.image_size, first.patch,
                                                     first.batch_size):
            raise ValueError("combine: parts must share image_size, patch and batch size")
    fix = first.fixations if fixation is None else fixation
    return TokenSet(torch.cat([p.centers for p in parts], 1),
                    torch.cat([p.levels for p in parts], 1),
                    torch.cat([p.scores for p in parts], 1), fix, first.image_size,
                    first.patch, torch.cat([p.stage for p in parts], 1))


def select_tokens(tokens: TokenSet, keep: torch.Tensor) -> TokenSet:
    """The tokens of a one-image ``tokens`` ``[1, N]`` where ``keep`` ``[N]`` (bool) is
    True, stages kept ``[1, K]``."""
    return TokenSet(tokens.centers[:, keep], tokens.levels[:, keep], tokens.scores[:, keep],
                    tokens.fixations, tokens.image_size, tokens.patch,
                    None if tokens.stage is None else tokens.stage[:, keep])


# ----------------------------------------------------------------------------- what was read
def covered_share(tokens: TokenSet, grid: tuple[int, int], patch: int = 16, step: int = 4
                  ) -> torch.Tensor:
    """``[B, Gh, Gw]``: share of each level-0 cell under some token footprint (a ``step``-px
    raster, :func:`~fovea_core.cascade.raster.coverage_raster`, averaged per cell)."""
    cov = coverage_raster(tokens, stages=None, step=step).float()          # [B, rh, rw]
    k = patch // step
    gh, gw = grid
    cov = torch.nn.functional.pad(cov, (0, gw * k - cov.shape[-1], 0, gh * k - cov.shape[-2]))
    return cov.view(cov.shape[0], gh, k, gw, k).mean((2, 4))


def discount_seen(scores: torch.Tensor, seen: TokenSet, level: float, *, patch: int = 16,
                  weight: float = SEEN_WEIGHT) -> torch.Tensor:
    """The one rule for what an earlier fixation read: ``scores`` ``[1, Gh, Gw]`` (a later
    fixation's map, on the level-0 grid) times ``1 - (1 - weight) * covered``, ``covered``
    the share of each cell under the ``seen`` tokens (one image, ``[1, K]``) whose level is
    at most ``level + LEVEL_TOLERANCE`` (:data:`LEVEL_TOLERANCE`): the cells an earlier
    fixation read at least as finely as the later one reads at ``level`` keep ``weight`` of
    their mass (default :data:`SEEN_WEIGHT`, none; 1: the map as it is). Used by the
    read-then-look cascade (:mod:`fovea_core.cascade.reading`) and the processor's two
    fixations (:class:`~fovea_core.vlm.processor.SecondFixationMap`). Returns a new map of
    ``scores``' dtype; ``scores`` itself when nothing is discounted."""
    fine = seen.levels[0] <= level + LEVEL_TOLERANCE
    if float(weight) >= 1.0 or not bool(fine.any()):
        return scores
    cov = covered_share(select_tokens(seen, fine), tuple(scores.shape[-2:]), patch).to(scores)
    return scores * (1.0 - cov if float(weight) == 0.0 else 1.0 - (1.0 - float(weight)) * cov)


def held_cells(first: TokenSet, level: float, image_size: tuple[int, int], patch: int = 16
               ) -> torch.Tensor:
    """``[nr, nc]`` bool on the level-``level`` grid (:func:`fovea_grid`): the cells where a
    token of ``first`` (one image) already sits at that level, i.e. the same token
    (:func:`~fovea_core.tokens.token_keys`); a later fixation placed with
    ``exclude=`` these (:func:`place_fovea`) never repeats one."""
    nr, nc, side = fovea_grid(image_size, level, patch)
    out = torch.zeros(nr, nc, dtype=torch.bool)
    same = (torch.round(first.levels[0].double() * LEVEL_QUANTUM)
            == round(level * LEVEL_QUANTUM))
    if bool(same.any()):
        xy = first.centers_px()[0][same].double()
        col = (xy[:, 0] / side).floor().long().clamp(0, nc - 1)
        row = (xy[:, 1] / side).floor().long().clamp(0, nr - 1)
        out[row, col] = True
    return out


#: a localiser maps the gist (and the question, or ``None``) to a non-negative score map on
#: the level-0 patch grid ``[B, Gh, Gw]``
Localiser = Callable[[Gist, "str | None"], torch.Tensor]
