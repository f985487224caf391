"""Single-level grid allocators: baselines, v1 top-K and the stratified family.

All select level-0 patch cells (``patch x patch`` base pixels) except the two whole-page
baselines: ``resize`` (the page resized at any scale to fit the budget, what a VLM's image
processor does) and ``uniform`` (its power-of-two variant on the pyramid's levels).
"""

from __future__ import annotations

import functools
import math
import numbers

import numpy as np
import torch

from fovea_core.allocators.base import (candidate_grid, cells_to_tokens, check_inputs,
                                        check_seed, device_values, group_best, image_rand,
                                        largest_remainder, rank_weights,
                                        lex_key, nonneg,
                                        resolve_fixation, select, stratum_ids, top_per_stratum)
from fovea_core.allocators.registry import register
from fovea_core.pyramid import Pyramid
from fovea_core.tokens import LEVEL_QUANTUM, TokenSet, on_host


def _level0(pyramid: Pyramid, patch: int, device: torch.device | None = None):
    return candidate_grid(pyramid, [0], patch, device)


# ----------------------------------------------------------------------------- baselines
def resize_grid(image_size: tuple[int, int], budget: int, patch: int = 16
                ) -> tuple[int, int, float]:
    """``(rows, cols, level)`` of the page resized to the largest scale whose grid fits.

    The page ``H x W`` resized by ``s <= 1`` (aspect kept) is cut into ``patch``-px cells:
    ``rows = ceil(H s / patch)``, ``cols = ceil(W s / patch)``. The scale is the largest
    with ``rows * cols <= budget``; the step function ``rows * cols`` only rises where
    ``H s / patch`` or ``W s / patch`` crosses an integer, so the candidates are
    ``s = k patch / H`` and ``s = k patch / W`` (all ``k`` at once, vectorised). The cell
    side in base pixels is ``patch / s = patch * 2**level``, ``level = log2(1 / s) >= 0``.

    This is the rule of VLM image processors, e.g. Qwen2-VL's ``smart_resize``
    [Wang et al. 2024, Qwen2-VL, arXiv:2409.12191; ``transformers``
    ``models/qwen2_vl/image_processing_qwen2_vl.py``], which scales the page so that its
    grid of 28-px merged cells fits ``max_pixels``; unlike ``smart_resize`` the aspect is kept
    exactly (the last row/column is padded, not stretched).

    Raises ``ValueError`` when ``budget`` is not in ``[1, Gh * Gw]`` (the full level-0 grid).
    """
    s, rows, cols = _resize_table(*_image_size(image_size), _patch(patch))  # host shape math
    gh, gw = int(rows[-1]), int(cols[-1])                      # s = 1: the level-0 grid
    if isinstance(budget, bool) or not 1 <= int(budget) <= gh * gw or int(budget) != budget:
        raise ValueError(f"budget must be an int in [1, {gh * gw}] for a {gh}x{gw} patch grid, "
                         f"got {budget!r}")
    if int(budget) == gh * gw:
        return gh, gw, 0.0
    # rows * cols is non-decreasing in s: the largest fitting scale is the last that fits
    best = int(np.flatnonzero(rows * cols <= int(budget))[-1])
    return int(rows[best]), int(cols[best]), math.log2(1.0 / float(s[best]))


@register("resize", family="grid", version="baseline", coverage="all", uses_scores=False)
def resize(pyramid: Pyramid, scores, budget: int, *, fixation=None, query=None, seed: int = 0,
           patch: int = 16) -> TokenSet:
    """Baseline: the whole page resized at any scale to at most ``budget`` cells (a VLM's view).

    The grid of :func:`resize_grid` (``rows x cols <= budget`` cells of ``patch * 2**level``
    base pixels, ``level`` continuous) is centred on the page (the half-cell of padding that
    rounding leaves is split between the two sides; samples beyond the edge replicate it).
    A VLM would stop there; to keep exactly ``budget`` tokens the ``budget - rows * cols``
    leftovers (fewer than ``max(rows, cols)`` except on tiny grids) re-read the grid cells
    nearest the page centre one octave finer (``level - 1``, not below 0; when there are
    more leftovers than cells, e.g. a 1x1 grid with budget 3, a second pass reads them
    another octave finer), so the baseline is never weaker than the processor it stands
    for. Scores: the level-0 score under each centre.
    Content and ``fixation`` are ignored (the fixation recorded is the resolved one).
    """
    s, n = check_inputs(pyramid, scores, budget, patch=patch, name="resize")
    fix = resolve_fixation(fixation, s)
    b, gh, gw = s.shape
    dev = s.device
    h, w = pyramid.image_size
    r, c, level = resize_grid((h, w), n, patch)
    side = patch * 2.0**level
    if level > pyramid.num_levels - 1 + 1e-9:
        th, tw = pyramid.grid_shape(patch, pyramid.num_levels - 1)
        raise ValueError(f"resize: budget {n} needs level {level:.2f} but the pyramid has "
                         f"{pyramid.num_levels} levels; use budget >= {th * tw} or a deeper "
                         "pyramid")
    cells = torch.arange(r * c, device=dev)
    rows, cols = cells // c, cells % c
    ox, oy = (w - c * side) / 2, (h - r * side) / 2          # centring offset (<= 0)
    cx = (ox + (cols.double() + 0.5) * side) / w
    cy = (oy + (rows.double() + 0.5) * side) / h
    extra = n - r * c
    if extra and level <= 0.0:
        raise ValueError(f"resize: a {r}x{c} grid at level 0 leaves {extra} tokens")
    dist = (cx - 0.5) ** 2 * w * w + (cy - 0.5) ** 2 * h * h
    # leftovers cycle over the cells nearest the centre; pass k reads one octave finer than k-1
    k = torch.arange(extra, device=dev)
    near = torch.sort(dist, stable=True).indices[k % (r * c)]
    finer = (level - 1.0 - (k // (r * c)).double()).clamp(min=0.0)
    level = min(level, pyramid.num_levels - 1.0)
    levels = torch.cat([torch.full((r * c,), level, dtype=torch.float64, device=dev),
                        finer]).float()
    cx, cy = torch.cat([cx, cx[near]]).float(), torch.cat([cy, cy[near]]).float()
    br = (cy * h / patch).long().clamp(0, gh - 1)
    bc = (cx * w / patch).long().clamp(0, gw - 1)
    centers = torch.stack([cx, cy], -1).clamp(0, 1).expand(b, n, 2)
    return TokenSet(centers, levels.expand(b, n), s[:, br, bc], fix[:, None], (h, w), patch)


@register("uniform", family="grid", version="baseline", coverage="uniform", uses_scores=False)
def uniform(pyramid: Pyramid, scores, budget: int, *, fixation=None, query=None, seed: int = 0,
            patch: int = 16) -> TokenSet:
    """Pyramid variant of ``resize``: the page on an ``r x c`` grid read at power-of-two levels.

    Kept as a labelled variant, not as the baseline: it rounds the scale *up* to the next
    pyramid level, so at N = 273 a 1024 px page is read at 256 px (level 2) where ``resize``
    reads it at ~272 px, and on tall receipts the gap is larger. Grid ``r x c`` with
    ``r = floor(sqrt(N H / W))`` and ``c = floor(N / r)``, so ``r*c <= N`` and the grid tiles
    the whole image. Each grid token is centred on its cell and read at mip level
    ``ceil(log2(cell side / patch))`` (the finest level whose footprint covers the cell;
    clipped to the pyramid), i.e. the image seen at about ``sqrt(N) * patch`` pixels per side.
    A plain VLM would stop there; to keep exactly N tokens the ``N - r*c < r`` leftovers (1 at
    N = 273 on a square page, 0 at 64/100/144/400) re-read the cells nearest the image centre
    one level finer (one level coarser when the grid is already at level 0). Scores: the
    level-0 score under each centre. Content and ``fixation`` are ignored (the fixation
    recorded is the resolved one).
    """
    s, n = check_inputs(pyramid, scores, budget, patch=patch, name="uniform")
    fix = resolve_fixation(fixation, s)
    b, gh, gw = s.shape
    h, w = pyramid.image_size
    r = max(1, min(n, math.floor(math.sqrt(n * h / w))))
    c = n // r
    side = max(h / r, w / c)
    top = pyramid.num_levels - 1
    level = int(min(max(math.ceil(math.log2(max(side / patch, 1.0)) - 1e-9), 0), top))
    dev = s.device
    cells = torch.arange(r * c, device=dev)
    rows, cols = cells // c, cells % c
    cx, cy = (cols.float() + 0.5) / c, (rows.float() + 0.5) / r
    extra = n - r * c
    # leftovers: the cells nearest the image centre (ties: row-major), one level finer
    dist = (cx - 0.5) ** 2 * w * w + (cy - 0.5) ** 2 * h * h
    near = torch.sort(dist, stable=True).indices[:extra]
    other = level - 1 if level > 0 else min(level + 1, top)
    if extra and other == level:
        raise ValueError(f"uniform: a {r}x{c} grid at level {level} leaves {extra} tokens and the "
                         f"pyramid has no other level to read them at; pass a budget of {r * c}")
    levels = torch.cat([torch.full((r * c,), level, device=dev),
                        torch.full((extra,), other, device=dev)])
    cx, cy = torch.cat([cx, cx[near]]), torch.cat([cy, cy[near]])
    br = (cy * h / patch).long().clamp(0, gh - 1)
    bc = (cx * w / patch).long().clamp(0, gw - 1)
    sc = s[:, br, bc]
    centers = torch.stack([cx, cy], -1).expand(b, n, 2)
    return TokenSet(centers, levels.expand(b, n), sc, fix[:, None], (h, w), patch)


@register("random", family="grid", version="baseline")
def random(pyramid: Pyramid, scores, budget: int, *, fixation=None, query=None, seed: int = 0,
           patch: int = 16) -> TokenSet:
    """Baseline: ``budget`` level-0 patches drawn uniformly without replacement.

    Token-reduction papers report random selection as a surprisingly strong baseline, so
    it belongs in every comparison. The draw is a per-image permutation from
    :func:`~fovea_core.allocators.base.image_rand` (seeded by ``seed`` and the image's
    score map, so deterministic and batch-independent); scores are not used for selection.
    ``seed`` must be an int (:func:`~fovea_core.allocators.base.check_seed`: ``1.5`` or
    ``True`` raise ``ValueError`` rather than run as another seed).
    """
    s, n = check_inputs(pyramid, scores, budget, patch=patch, name="random")
    seed = check_seed(seed, name="random")
    cand = _level0(pyramid, patch, s.device)
    idx = select(image_rand(s, seed), n)
    return cells_to_tokens(cand, idx, s.flatten(1), pyramid.image_size,
                           resolve_fixation(fixation, s), patch)


@register("full", family="grid", version="baseline", coverage="all", uses_scores=False)
def full(pyramid: Pyramid, scores, budget: int | None = None, *, fixation=None, query=None,
         seed: int = 0, patch: int = 16) -> TokenSet:
    """Upper bound: every level-0 patch. ``budget`` must be ``None`` or exactly ``Gh * Gw``."""
    gh, gw = pyramid.grid_shape(patch, 0)
    if budget is not None and budget != gh * gw:
        raise ValueError(f"full: budget must be None or Gh*Gw = {gh * gw} (all base patches), "
                         f"got {budget}")
    s, n = check_inputs(pyramid, scores, gh * gw, patch=patch, name="full")
    cand = _level0(pyramid, patch, s.device)
    idx = torch.arange(n, device=s.device).expand(s.shape[0], n)
    return cells_to_tokens(cand, idx, s.flatten(1), pyramid.image_size,
                           resolve_fixation(fixation, s), patch)


# ----------------------------------------------------------------------------- v1
@register("topk", family="grid", version="v1")
def topk(pyramid: Pyramid, scores, budget: int, *, fixation=None, query=None, seed: int = 0,
         patch: int = 16) -> TokenSet:
    """v1: the ``budget`` level-0 patches with the highest importance (ties: row-major first).

    The choice is only as good as the map: on a flat map (every score equal, e.g. the
    ``"none"`` scorer's zeros) every patch ties and the tie-break alone picks the first
    ``budget`` patches in row-major order, i.e. the top rows of the page.
    :func:`fovea_core.foveate` warns when it is asked for that (``scorer="none"``).
    ``fixation`` and ``seed`` do not change the tokens (the fixation is only recorded).
    """
    s, n = check_inputs(pyramid, scores, budget, patch=patch, name="topk")
    idx = select(s.flatten(1), n)
    return cells_to_tokens(_level0(pyramid, patch, s.device), idx, s.flatten(1), pyramid.image_size,
                           resolve_fixation(fixation, s), patch)


def _check_strata(strata: int, n: int, shape: tuple[int, int], name: str) -> None:
    if not isinstance(strata, int) or strata < 1:
        raise ValueError(f"{name}: strata must be a positive int, got {strata!r}")
    if strata * strata > n:
        raise ValueError(f"{name}: strata**2 = {strata * strata} must be <= budget = {n} "
                         "(at least one token per stratum)")


@register("topk_coverage", family="grid", version="v1", coverage="stratum", strata=4)
def topk_coverage(pyramid: Pyramid, scores, budget: int, *, strata: int = 4, fixation=None,
                  query=None, seed: int = 0, patch: int = 16) -> TokenSet:
    """Top-K with a coverage floor: the best patch of each of ``strata x strata`` equal
    rectangles of the grid first, then the global top-K of the rest.

    Guarantees >= 1 token in every stratum (needs ``strata**2 <= budget``).
    """
    s, n = check_inputs(pyramid, scores, budget, patch=patch, name="topk_coverage")
    _check_strata(strata, n, s.shape[1:], "topk_coverage")
    gid, ng = stratum_ids(tuple(s.shape[1:]), strata, s.device)
    flat = s.flatten(1)
    tier = group_best(flat, gid, ng).long()
    idx = select(flat, n, tier, tier_max=1)
    return cells_to_tokens(_level0(pyramid, patch, s.device), idx, flat, pyramid.image_size,
                           resolve_fixation(fixation, s), patch)


def stratified_quotas(scores: torch.Tensor, budget: int, strata: int | tuple[int, int]
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Importance-proportional quotas per stratum with >= 1 each.

    Weight of stratum ``g``: ``w_g = sum_{i in g} (s_i - min s)`` (per image); quota
    ``q_g = 1 + LR_g(N - G, w)`` (largest remainder, :func:`largest_remainder`, on the weights'
    ranking grid, :func:`rank_weights`), clipped to the stratum's cell count. Returns
    ``(group ids [M], quotas [B, G], counts [G])``.
    """
    b, dev = scores.shape[0], scores.device
    gid, ng = stratum_ids(tuple(scores.shape[1:]), strata, dev)
    w = torch.zeros(b, ng, device=dev).index_add_(1, gid, nonneg(scores).flatten(1))
    counts = torch.zeros(ng, dtype=torch.long, device=dev).index_add_(0, gid, torch.ones_like(gid))
    q = largest_remainder(rank_weights(w), budget, minimum=1, capacity=counts.expand(b, ng))
    return gid, q, counts


def stratified_tier(scores: torch.Tensor, budget: int, strata,
                    key: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, M]`` long: 1 for the cells the stratified quotas pick (best ``q_g`` of each
    stratum by score), else 0. ``key``: ``lex_key(scores.flatten(1))`` if already computed."""
    _, q, _ = stratified_quotas(scores, budget, strata)
    # every quota is at most 1 + (budget - G): the static bound top_per_stratum needs
    return top_per_stratum(scores.flatten(1), tuple(scores.shape[1:]), strata, q, key,
                           max_quota=budget - q.shape[1] + 1).long()


@register("stratified", family="grid", version="v1", coverage="stratum", strata=4)
def stratified(pyramid: Pyramid, scores, budget: int, *, strata: int = 4, fixation=None,
               query=None, seed: int = 0, patch: int = 16) -> TokenSet:
    """Importance-proportional allocation per stratum with at least one token each.

    The grid is cut into ``strata x strata`` rectangles; stratum ``g`` receives
    ``q_g = 1 + LR_g(N - G, w)`` tokens (:func:`stratified_quotas`), its best ``q_g``
    patches by score. Quotas clipped by a stratum's size leave a shortfall that is filled
    by the global best remaining patches, so the total is exactly ``budget``.
    """
    s, n = check_inputs(pyramid, scores, budget, patch=patch, name="stratified")
    _check_strata(strata, n, s.shape[1:], "stratified")
    flat = s.flatten(1)
    key = lex_key(flat)
    idx = select(flat, n, stratified_tier(s, n, strata, key), base_key=key, tier_max=1)
    return cells_to_tokens(_level0(pyramid, patch, s.device), idx, flat, pyramid.image_size,
                           resolve_fixation(fixation, s), patch)


register("stratified_8x8", family="grid", version="v1", coverage="stratum", strata=8)(stratified)


def participation_ratio(scores: torch.Tensor) -> torch.Tensor:
    """``[B]`` in ``(0, 1]``: ``(sum w)^2 / (M sum w^2)`` with ``w = s - min s``; 1 for a flat
    map, ``1/M`` when all importance sits in one patch (the inverse Simpson index / M)."""
    w = nonneg(scores).flatten(1).double()
    m = w.shape[1]
    num, den = w.sum(1) ** 2, m * (w**2).sum(1)
    return torch.where(den > 0, num / den.clamp(min=1e-300), torch.ones_like(num)).float()


def adaptive_strata(scores: torch.Tensor, budget: int, choices=(2, 4, 8),
                    thresholds=(0.15, 0.4)) -> torch.Tensor:
    """The documented rule of ``adaptive_stratified``: ``[B]`` strata per side.

    Concentrated importance (participation ratio ``< thresholds[0]``) -> coarse strata
    ``choices[0]`` (let top-K focus); intermediate -> ``choices[1]``; spread-out importance
    (``>= thresholds[1]``) -> fine strata ``choices[2]`` (coverage matters). Choices that
    do not fit (``s*s > budget`` or ``s`` > grid side) fall back to the largest that fits.
    """
    pr = participation_ratio(scores)
    pick = torch.bucketize(pr, device_values(thresholds, dtype=pr.dtype, device=pr.device),
                           right=True)
    table = _strata_choices(scores, budget, choices)
    return device_values(table, dtype=torch.long, device=pr.device)[pick]


def _strata_fits(scores: torch.Tensor, budget: int, choices) -> list[int]:
    """The strata choices that fit the budget and the grid (``ValueError`` if none)."""
    gh, gw = scores.shape[1:]
    fits = [c for c in choices if c * c <= budget and c <= min(gh, gw)]
    if not fits:
        raise ValueError(f"adaptive_stratified: no strata choice in {choices} fits budget "
                         f"{budget} and grid {gh}x{gw}")
    return fits


def _strata_choices(scores: torch.Tensor, budget: int, choices) -> list[int]:
    """What :func:`adaptive_strata` returns for each of ``choices`` (its table, host ints)."""
    fits = _strata_fits(scores, budget, choices)
    return [max([f for f in fits if f <= c], default=min(fits)) for c in choices]


@register("adaptive_stratified", family="grid", version="v1", coverage="stratum")
def adaptive_stratified(pyramid: Pyramid, scores, budget: int, *, choices=(2, 4, 8),
                        thresholds=(0.15, 0.4), fixation=None, query=None, seed: int = 0,
                        patch: int = 16) -> TokenSet:
    """Stratified allocation whose grid granularity is chosen per image from the importance
    map by :func:`adaptive_strata` (participation ratio thresholds; documented there).

    ``query`` is not used by this rule (query-aware importance enters through ``scores``).
    Each candidate granularity is computed for the whole batch and the chosen one kept per
    image, so the batch result equals the per-image loop.
    """
    s, n = check_inputs(pyramid, scores, budget, patch=patch, name="adaptive_stratified")
    pick = adaptive_strata(s, n, choices, thresholds)
    tier = torch.zeros(s.shape[0], s[0].numel(), dtype=torch.long, device=s.device)
    flat = s.flatten(1)
    if on_host(pick):                 # free to read: each granularity on its own images
        for c in torch.unique(pick).tolist():                  # <= 3 granularities
            rows = pick == c
            tier[rows] = stratified_tier(s[rows], n, int(c))
    else:
        # on a device: every granularity the rule can pick, for the whole batch (an image's
        # tier depends on that image only), kept where it was picked; no host read of pick
        key = lex_key(flat)
        for c in sorted(set(_strata_choices(s, n, choices))):  # <= 3 granularities
            tier = torch.where((pick == c)[:, None], stratified_tier(s, n, c, key), tier)
    idx = select(flat, n, tier, tier_max=1)
    return cells_to_tokens(_level0(pyramid, patch, s.device), idx, flat, pyramid.image_size,
                           resolve_fixation(fixation, s), patch)


# ----------------------------------------------------------------------------- document peer
#: Default blank / duplicate tolerance of :func:`resize_nonblank`: one 8-bit grey level.
#: A cell whose samples span at most one step of an 8-bit image (``max - min <= 1/255``)
#: is uniform to the precision the page was stored with. Chosen on synthetic pages
#: (:func:`fovea_book.eval.documents.make_document`: exactly uniform white paper) and on
#: training pages only (``sroie-train``, ``funsd-train``: cells touching an annotated word
#: against the rest, at the ``resize`` scales of N = 273, 1024 and the full page): the
#: sampler's round-off on uniform paper at fractional levels (about 1e-3) stays below it,
#: and above it more and more cells touching words (faint thermal print on receipts) are
#: called blank while little more background is. ``0.0`` would call nothing blank at a
#: fractional level on those scans.
NONBLANK_THRESHOLD = 1.0 / 255.0


def resize_scales(image_size: tuple[int, int], patch: int = 16
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every scale at which the ``resize`` grid changes: ``(s [K], rows [K], cols [K])``.

    The candidates of :func:`resize_grid` (``s = k patch / H`` and ``s = k patch / W``,
    ``k >= 1``, clipped to ``s <= 1``) plus ``s = 1``, sorted ascending and de-duplicated
    (float64); ``rows = ceil(H s / patch)``, ``cols = ceil(W s / patch)`` with the same hair
    of slack as :func:`resize_grid`, so ``rows * cols`` is non-decreasing in ``s``. Between
    two consecutive candidates the grid does not change, so these are the only scales a
    search over "the page resized at any ``s <= 1``" needs.
    """
    s, rows, cols = _resize_table(*_image_size(image_size), _patch(patch))
    return torch.from_numpy(s.copy()), torch.from_numpy(rows.copy()), torch.from_numpy(cols.copy())


def _image_size(image_size: tuple[int, int]) -> tuple[int, int]:
    h, w = (int(v) for v in image_size)
    if h < 1 or w < 1:
        raise ValueError(f"image_size must be positive (H, W), got {image_size!r}")
    return h, w


def _patch(patch: int) -> int:
    if isinstance(patch, bool) or not isinstance(patch, int) or patch < 1:
        raise ValueError(f"patch must be an int >= 1, got {patch!r}")
    return patch


@functools.lru_cache(maxsize=64)
def _resize_table(h: int, w: int, patch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`resize_scales` on the host (numpy float64, the same steps): shape arithmetic
    only, so ``resize`` sizes its grid without touching a device. Cached; read-only."""
    gh, gw = -(-h // patch), -(-w // patch)
    s = np.minimum(np.concatenate([np.arange(1, gh + 1, dtype=np.float64) * patch / h,
                                   np.arange(1, gw + 1, dtype=np.float64) * patch / w,
                                   np.ones(1)]), 1.0)
    s = np.unique(s)                                                      # sorted ascending
    rows = np.maximum(np.ceil(h * s / patch - 1e-9), 1).astype(np.int64)
    cols = np.maximum(np.ceil(w * s / patch - 1e-9), 1).astype(np.int64)
    for a in (s, rows, cols):
        a.flags.writeable = False
    return s, rows, cols


def _grid_centres(image_size: tuple[int, int], r: int, c: int, level: float, patch: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Centres ``(cx [r c], cy [r c])`` (float64, normalised) of the ``r x c`` grid of
    ``patch * 2**level``-px cells centred on the page (``resize``'s layout, row-major), and
    each cell's squared distance to the page centre in pixels ``[r c]``."""
    h, w = image_size
    side = patch * 2.0**level
    cells = torch.arange(r * c)
    rows, cols = cells // c, cells % c
    ox, oy = (w - c * side) / 2, (h - r * side) / 2
    cx = (ox + (cols.double() + 0.5) * side) / w
    cy = (oy + (rows.double() + 0.5) * side) / h
    dist = (cx - 0.5) ** 2 * w * w + (cy - 0.5) ** 2 * h * h
    return cx, cy, dist


def nonblank_cells(pyramid: Pyramid, rows: int, cols: int, level: float, *, patch: int = 16,
                   threshold: float = NONBLANK_THRESHOLD) -> torch.Tensor:
    """``[B, rows * cols]`` bool: the cells of the centred ``rows x cols`` resize grid at
    ``level`` that ``resize_nonblank`` keeps (neither blank nor a duplicate), row-major.

    Each cell is read as a token (``resize``'s centre, clamped to ``[0, 1]``, and ``level``)
    by :func:`fovea_core.sample.sample`: its ``[C, p, p]`` samples ``x``.

    * **blank**: ``max(x) - min(x) <= threshold`` (over channels and samples; ``0.0`` =
      exactly uniform);
    * **duplicate**: not blank, and the quantised patch ``round(x / threshold)`` (``x``
      itself, bit for bit, when ``threshold == 0``) equals that of an earlier cell in
      row-major order: exact de-duplication of the quantised patch, as PixelPrune does with
      a hash of the patch [PixelPrune, arXiv:2604.00886]; here ``torch.unique`` over the
      quantised rows (exact, no hash collisions).

    Vectorised over cells and images (one ``sample`` call, one ``unique`` per image).
    """
    from fovea_core.sample import sample                     # the lead's sampler, public API

    b = pyramid.batch_size
    h, w = pyramid.image_size
    cx, cy, _ = _grid_centres((h, w), rows, cols, level, patch)
    m = rows * cols
    centers = torch.stack([cx, cy], -1).float().clamp(0, 1).expand(b, m, 2)
    levels = torch.full((b, m), min(level, pyramid.num_levels - 1.0), dtype=torch.float32)
    toks = TokenSet(centers, levels, torch.zeros(b, m), torch.full((b, 1, 2), 0.5), (h, w), patch)
    x = sample(pyramid, toks).flatten(2).cpu()                            # [B, M, C p p]
    blank = (x.amax(-1) - x.amin(-1)) <= threshold                        # [B, M]
    q = torch.round(x.double() / threshold).long() if threshold > 0 else x
    keep = ~blank
    idx = torch.arange(m)
    for i in range(b):                                                    # unique is per image
        _, inv = torch.unique(q[i], dim=0, return_inverse=True)
        # first (row-major) non-blank occurrence of each distinct patch
        first = torch.full((m,), m, dtype=torch.long).scatter_reduce(
            0, inv, torch.where(blank[i], m, idx), reduce="amin")
        keep[i] &= first[inv] == idx
    return keep


def _nonblank_reads(pyramid: Pyramid) -> int:
    """Pixels ``resize_nonblank`` looks at to decide, an upper bound: the whole page at full
    resolution (the finest candidate its search can read is ``s = 1``; every candidate
    reads pyramid levels made from the same pixels, which are not counted again)."""
    h, w = pyramid.image_size
    return int(h * w)


@register("resize_nonblank", family="grid", version="peer", coverage="all", content=True,
          reads=_nonblank_reads, uses_scores=False, side_compute=True)
def resize_nonblank(pyramid: Pyramid, scores, budget: int, *,
                    threshold: float = NONBLANK_THRESHOLD, fixation=None, query=None,
                    seed: int = 0, patch: int = 16) -> TokenSet:
    """Document peer: the finest resize whose non-blank, non-duplicate cells fit ``budget``.

    PixelPrune [arXiv:2604.00886] observes that only a fraction of a document's patches are
    pixel-unique and drops blank and repeated patches before the encoder. Here that rule picks
    the scale: among the scales at which the ``resize`` grid changes (:func:`resize_scales`,
    every ``s <= 1`` that matters, from ``resize``'s own scale up to the full page), take the
    largest ``s`` whose grid has at most ``budget`` *kept* cells (:func:`nonblank_cells`:
    neither blank, ``max - min <= threshold``, nor a duplicate of an earlier kept cell), and
    return those cells at level ``log2(1 / s)``. The kept count is treated as non-decreasing in
    ``s`` (finer grids hold more cells; a blank region stays blank) and found by a search over
    the sorted candidates that starts at ``resize``'s scale, extrapolates the kept fraction
    until a probe overflows, then alternates regula falsi (kept interpolated linearly in the
    cell count) and bisection inside the bracket (``O(log M)`` reads at worst, ``M = Gh Gw``;
    the finest scale is read only when the search gets there): the result satisfies
    ``kept(s) <= budget < kept(next finer candidate)``, or ``s = 1``. ``resize``'s own scale
    always fits (kept <= cells <= budget), so the result is never coarser than ``resize``; on a
    page with no blank or repeated cell it is ``resize``'s grid exactly.

    Leftovers, ``budget - kept``, are spent as ``resize`` spends its own: pass ``k`` re-reads
    the kept cells nearest the page centre at level ``max(level - 1 - k, 0)`` (while those
    levels stay distinct); only if more remain (a nearly blank page at level 0) they read
    the skipped cells of the chosen grid nearest the centre. So exactly ``budget`` distinct
    tokens come out; blank and duplicate cells are otherwise absent (a reconstruction paints
    them with its background).

    Args:
        threshold: blank / duplicate tolerance in image units (``[0, 1]`` pixel values),
            ``>= 0``; default :data:`NONBLANK_THRESHOLD` (one 8-bit grey level). ``0.0``:
            only exactly uniform cells are blank and only bit-identical patches duplicates.

    Scores: the level-0 score under each centre (not used to choose). Content decides; the
    scores and ``fixation`` do not (the fixation recorded is the resolved one).
    Raises ``ValueError`` for a budget outside ``[1, Gh Gw]`` or below what the pyramid's
    coarsest level allows (as ``resize``), and for a negative or non-finite ``threshold``.
    """
    s, n = check_inputs(pyramid, scores, budget, patch=patch, name="resize_nonblank")
    # host content (a per-image search): computed on the CPU (a sync on a device); tokens go back
    dev, s = s.device, s.cpu()
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) \
            or not math.isfinite(threshold) or threshold < 0:
        raise ValueError(f"resize_nonblank: threshold must be a finite number >= 0 (pixel "
                         f"range in [0, 1] image units), got {threshold!r}")
    threshold = float(threshold)
    fix = resolve_fixation(fixation, s)
    b, gh, gw = s.shape
    h, w = pyramid.image_size
    r0, c0, level0 = resize_grid((h, w), n, patch)
    if level0 > pyramid.num_levels - 1 + 1e-9:
        th, tw = pyramid.grid_shape(patch, pyramid.num_levels - 1)
        raise ValueError(f"resize_nonblank: budget {n} needs level {level0:.2f} but the "
                         f"pyramid has {pyramid.num_levels} levels; use budget >= {th * tw} "
                         "or a deeper pyramid")
    sc, rr, cc = resize_scales((h, w), patch)
    start = int(((rr * cc <= n) * torch.arange(1, len(sc) + 1)).argmax())   # resize's scale
    assert int(rr[start]) == r0 and int(cc[start]) == c0, "resize_scales disagrees with resize_grid"
    last = len(sc) - 1

    def level_of(k: int) -> float:
        return level0 if k == start else math.log2(1.0 / float(sc[k]))

    centers, levels = [], []
    for i in range(b):                      # the scale is chosen per image (O(log) reads each)
        one = Pyramid(tuple(lv[i:i + 1] for lv in pyramid.levels))
        cache: dict[int, torch.Tensor] = {}

        def kept(k: int) -> torch.Tensor:
            if k not in cache:
                cache[k] = nonblank_cells(one, int(rr[k]), int(cc[k]), level_of(k),
                                          patch=patch, threshold=threshold)[0]
            return cache[k]

        # search up from resize's scale (which fits: kept <= cells <= n). The kept count
        # is nearly linear in the cell count, so probes interpolate it: first extrapolate
        # (kept fraction at the last probe, 15 % beyond the target, until a probe overflows),
        # then regula falsi inside the bracket kept(lo) <= n < kept(hi), every other step
        # a bisection so that the bracket at least halves every two probes
        cells = (rr * cc).double()
        lo, hi, step = start, None, 0
        m_lo = int(kept(lo).sum())
        while True:
            if hi is None:
                want = 1.15 * n * float(cells[lo]) / max(m_lo, 0.5)
                probe = min(max(int((cells <= want).sum()) - 1, lo + 1), last)
            elif hi - lo <= 1:
                break
            elif step % 2:
                probe = (lo + hi) // 2
            else:
                want = float(cells[lo]) + (n - m_lo) * float(cells[hi] - cells[lo]) / max(m_hi - m_lo, 1)
                probe = min(max(int((cells <= want).sum()) - 1, lo + 1), hi - 1)
            if lo == last:
                break
            m = int(kept(probe).sum())
            step += 1
            if m <= n:
                lo, m_lo = probe, m
            else:
                hi, m_hi = probe, m
        k = lo
        r, c, level = int(rr[k]), int(cc[k]), level_of(k)
        keep = kept(k)
        cx, cy, dist = _grid_centres((h, w), r, c, level, patch)
        idx = torch.arange(r * c)
        kidx, sidx = idx[keep], idx[~keep]
        nk, extra = len(kidx), n - len(kidx)
        # pass p re-reads the kept cells nearest the centre at max(level - 1 - p, 0); the
        # passes are distinct tokens while level - p exceeds one level quantum
        passes = max(math.ceil(level - 1.0 / LEVEL_QUANTUM), 0)
        n_fine = min(extra, nk * passes)
        j = torch.arange(n_fine)
        near = kidx[torch.sort(dist[kidx], stable=True).indices][j % max(nk, 1)] \
            if n_fine else idx[:0]
        finer = (level - 1.0 - (j // max(nk, 1)).double()).clamp(min=0.0)
        n_skip = extra - n_fine
        if n_skip > len(sidx):
            raise ValueError(f"resize_nonblank: a {r}x{c} grid at level {level:.2f} with "
                             f"{nk} kept cells cannot give {n} distinct tokens")
        fill = sidx[torch.sort(dist[sidx], stable=True).indices[:n_skip]]
        lv = min(level, pyramid.num_levels - 1.0)
        pick = torch.cat([kidx, near, fill])
        levels.append(torch.cat([torch.full((nk,), lv, dtype=torch.float64), finer,
                                 torch.full((n_skip,), lv, dtype=torch.float64)]).float())
        centers.append(torch.stack([cx[pick], cy[pick]], -1).float().clamp(0, 1))
    cen = torch.stack(centers)                                            # [B, N, 2]
    br = (cen[..., 1] * h / patch).long().clamp(0, gh - 1)
    bc = (cen[..., 0] * w / patch).long().clamp(0, gw - 1)
    sco = s[torch.arange(b)[:, None], br, bc]
    return TokenSet(cen, torch.stack(levels), sco, fix[:, None], (h, w), patch).to(dev)
