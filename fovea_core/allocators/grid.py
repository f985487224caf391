"""Single-level grid allocators: baselines, v1 top-K and the stratified family.

All select level-0 patch cells (``patch x patch`` base pixels) except the two whole-page
baselines: ``resize`` (the page resized at any scale to fit the budget, what a VLM's image
processor does) and ``uniform`` (its power-of-two variant on the pyramid's levels).
"""

from __future__ import annotations

import math

import torch

from fovea_core.allocators.base import (candidate_grid, cells_to_tokens, check_inputs,
                                        group_best, image_rand, largest_remainder,
                                        lex_key, nonneg,
                                        resolve_fixation, select, stratum_ids, top_per_stratum)
from fovea_core.allocators.registry import register
from fovea_core.pyramid import Pyramid
from fovea_core.tokens import TokenSet


def _level0(pyramid: Pyramid, patch: int):
    return candidate_grid(pyramid, [0], patch)


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
    h, w = (int(v) for v in image_size)
    if h < 1 or w < 1:
        raise ValueError(f"image_size must be positive (H, W), got {image_size!r}")
    if isinstance(patch, bool) or not isinstance(patch, int) or patch < 1:
        raise ValueError(f"patch must be an int >= 1, got {patch!r}")
    gh, gw = -(-h // patch), -(-w // patch)
    if isinstance(budget, bool) or not 1 <= int(budget) <= gh * gw or int(budget) != budget:
        raise ValueError(f"budget must be an int in [1, {gh * gw}] for a {gh}x{gw} patch grid, "
                         f"got {budget!r}")
    if int(budget) == gh * gw:
        return gh, gw, 0.0
    s = torch.cat([torch.arange(1, gh + 1, dtype=torch.float64) * patch / h,
                   torch.arange(1, gw + 1, dtype=torch.float64) * patch / w]).clamp(max=1.0)
    # rows/cols at each candidate scale (a hair of slack so k * patch / H * H / patch == k)
    rows = torch.ceil(h * s / patch - 1e-9).clamp(min=1)
    cols = torch.ceil(w * s / patch - 1e-9).clamp(min=1)
    fits = rows * cols <= int(budget)
    best = torch.where(fits, s, torch.zeros_like(s)).argmax()
    sc = float(s[best])
    return int(rows[best]), int(cols[best]), math.log2(1.0 / sc)


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
    h, w = pyramid.image_size
    r, c, level = resize_grid((h, w), n, patch)
    side = patch * 2.0**level
    if level > pyramid.num_levels - 1 + 1e-9:
        th, tw = pyramid.grid_shape(patch, pyramid.num_levels - 1)
        raise ValueError(f"resize: budget {n} needs level {level:.2f} but the pyramid has "
                         f"{pyramid.num_levels} levels; use budget >= {th * tw} or a deeper "
                         "pyramid")
    cells = torch.arange(r * c)
    rows, cols = cells // c, cells % c
    ox, oy = (w - c * side) / 2, (h - r * side) / 2          # centring offset (<= 0)
    cx = (ox + (cols.double() + 0.5) * side) / w
    cy = (oy + (rows.double() + 0.5) * side) / h
    extra = n - r * c
    if extra and level <= 0.0:
        raise ValueError(f"resize: a {r}x{c} grid at level 0 leaves {extra} tokens")
    dist = (cx - 0.5) ** 2 * w * w + (cy - 0.5) ** 2 * h * h
    # leftovers cycle over the cells nearest the centre; pass k reads one octave finer than k-1
    k = torch.arange(extra)
    near = torch.sort(dist, stable=True).indices[k % (r * c)]
    finer = (level - 1.0 - (k // (r * c)).double()).clamp(min=0.0)
    level = min(level, pyramid.num_levels - 1.0)
    levels = torch.cat([torch.full((r * c,), level, dtype=torch.float64), finer]).float()
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
    reads it at ~272 px, and on tall receipts the gap is larger. Grid ``r x c`` with ``r = floor(sqrt(N H / W))`` and ``c = floor(N / r)``, so ``r*c <= N``
    and the grid tiles the whole image. Each grid token is centred on its cell and read at
    mip level ``ceil(log2(cell side / patch))`` (the finest level whose footprint covers the
    cell; clipped to the pyramid), i.e. the image seen at about ``sqrt(N) * patch`` pixels
    per side. A plain VLM would stop there; to keep exactly N tokens the ``N - r*c < r``
    leftovers (1 at N = 273 on a square page, 0 at 64/100/144/400) re-read the cells nearest
    the image centre one level finer (one level coarser when the grid is already at level
    0). Scores: the level-0 score under each centre. Content and ``fixation`` are ignored
    (the fixation recorded is the resolved one).
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
    cells = torch.arange(r * c)
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
    levels = torch.cat([torch.full((r * c,), level), torch.full((extra,), other)])
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
    """
    s, n = check_inputs(pyramid, scores, budget, patch=patch, name="random")
    cand = _level0(pyramid, patch)
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
    cand = _level0(pyramid, patch)
    idx = torch.arange(n).expand(s.shape[0], n)
    return cells_to_tokens(cand, idx, s.flatten(1), pyramid.image_size,
                           resolve_fixation(fixation, s), patch)


# ----------------------------------------------------------------------------- v1
@register("topk", family="grid", version="v1")
def topk(pyramid: Pyramid, scores, budget: int, *, fixation=None, query=None, seed: int = 0,
         patch: int = 16) -> TokenSet:
    """v1: the ``budget`` level-0 patches with the highest importance (ties: row-major first)."""
    s, n = check_inputs(pyramid, scores, budget, patch=patch, name="topk")
    idx = select(s.flatten(1), n)
    return cells_to_tokens(_level0(pyramid, patch), idx, s.flatten(1), pyramid.image_size,
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
    gid, ng = stratum_ids(tuple(s.shape[1:]), strata)
    flat = s.flatten(1)
    tier = group_best(flat, gid, ng).long()
    idx = select(flat, n, tier)
    return cells_to_tokens(_level0(pyramid, patch), idx, flat, pyramid.image_size,
                           resolve_fixation(fixation, s), patch)


def stratified_quotas(scores: torch.Tensor, budget: int, strata: int | tuple[int, int]
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Importance-proportional quotas per stratum with >= 1 each.

    Weight of stratum ``g``: ``w_g = sum_{i in g} (s_i - min s)`` (per image); quota
    ``q_g = 1 + LR_g(N - G, w)`` (largest remainder, :func:`largest_remainder`), clipped to
    the stratum's cell count. Returns ``(group ids [M], quotas [B, G], counts [G])``.
    """
    b = scores.shape[0]
    gid, ng = stratum_ids(tuple(scores.shape[1:]), strata)
    w = torch.zeros(b, ng).index_add_(1, gid, nonneg(scores).flatten(1))
    counts = torch.bincount(gid, minlength=ng)
    q = largest_remainder(w, budget, minimum=1, capacity=counts.expand(b, ng))
    return gid, q, counts


def stratified_tier(scores: torch.Tensor, budget: int, strata,
                    key: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, M]`` long: 1 for the cells the stratified quotas pick (best ``q_g`` of each
    stratum by score), else 0. ``key``: ``lex_key(scores.flatten(1))`` if already computed."""
    _, q, _ = stratified_quotas(scores, budget, strata)
    return top_per_stratum(scores.flatten(1), tuple(scores.shape[1:]), strata, q, key).long()


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
    idx = select(flat, n, stratified_tier(s, n, strata, key), base_key=key)
    return cells_to_tokens(_level0(pyramid, patch), idx, flat, pyramid.image_size,
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
    gh, gw = scores.shape[1:]
    fits = [c for c in choices if c * c <= budget and c <= min(gh, gw)]
    if not fits:
        raise ValueError(f"adaptive_stratified: no strata choice in {choices} fits budget "
                         f"{budget} and grid {gh}x{gw}")
    pr = participation_ratio(scores)
    pick = torch.bucketize(pr, torch.tensor(thresholds, dtype=pr.dtype), right=True)
    table = torch.tensor([max([f for f in fits if f <= c], default=min(fits)) for c in choices])
    return table[pick]


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
    tier = torch.zeros(s.shape[0], s[0].numel(), dtype=torch.long)
    for c in torch.unique(pick).tolist():                      # <= 3 granularities
        rows = pick == c
        tier[rows] = stratified_tier(s[rows], n, int(c))
    flat = s.flatten(1)
    idx = select(flat, n, tier)
    return cells_to_tokens(_level0(pyramid, patch), idx, flat, pyramid.image_size,
                           resolve_fixation(fixation, s), patch)
