"""v2 ``pyramid`` and v2.5 ``foveated_pyramid``: tokens at several mip levels.

A level-``l`` token is a cell of the level-``l`` patch grid (``patch * 2**l`` base pixels,
read from pyramid level ``l``). Its score is pooled from the level-0 map over its block
(:func:`~fovea_core.allocators.base.pool_scores`): ``max`` when tokens compete only
within a level, ``mean`` when they compete across levels (so a coarse cell does not
inherit the single best patch inside it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from fovea_core.allocators.base import (candidate_grid, cell_centers, cells_to_tokens,
                                        check_inputs, device_values, group_rank,
                                        largest_remainder, resolve_fixation, select)
from fovea_core.allocators.registry import register
from fovea_core.pyramid import Pyramid
from fovea_core.tokens import TokenSet

SEED_LEVEL_BUDGET = (64, 128, 64, 17)  # the seeds' per-level split of N = 273, levels 0..3


def _levels(pyramid: Pyramid, max_level: int | None) -> list[int]:
    top = pyramid.num_levels - 1 if max_level is None else min(max_level, pyramid.num_levels - 1)
    if top < 0:
        raise ValueError(f"max_level must be >= 0, got {max_level}")
    return list(range(top + 1))


@register("pyramid", family="pyramid", version="v2", coverage="level_quota")
def pyramid_alloc(pyramid: Pyramid, scores, budget: int, *,
                  level_budget: Sequence[float] = SEED_LEVEL_BUDGET, mode: str = "per_level",
                  fixation=None, query=None, seed: int = 0, patch: int = 16) -> TokenSet:
    """v2: score patches at every mip level and take a fixed share per level.

    ``mode="per_level"``: level ``l`` gets ``q_l`` tokens, ``q`` proportional to
    ``level_budget`` (default the seeds' ``[64, 128, 64, 17]`` for levels 0-3, scaled to
    ``budget`` by largest remainder and clipped to each level's cell count), its best cells
    by max-pooled score; any shortfall is filled by the best remaining cells of all levels.
    ``mode="global"``: one top-K over the cells of levels ``0..len(level_budget)-1`` by
    mean-pooled score. Tokens of different levels may overlap (multi-scale, as in v2).
    """
    if mode not in ("per_level", "global"):
        raise ValueError(f"pyramid: mode must be 'per_level' or 'global', got {mode!r}")
    # host parameters, checked on the host (a tensor is read back once)
    wts = np.asarray(level_budget.tolist() if isinstance(level_budget, torch.Tensor)
                     else level_budget, dtype=np.float64)
    if wts.ndim != 1 or len(wts) < 1 or (wts < 0).any() or wts.sum() <= 0:
        raise ValueError(f"pyramid: level_budget must be non-negative weights, got {level_budget}")
    levels = _levels(pyramid, len(wts) - 1)
    wts = wts[: len(levels)]
    shapes = [pyramid.grid_shape(patch, lv) for lv in levels]
    s, n = check_inputs(pyramid, scores, budget, patch=patch,
                        max_budget=sum(h * w for h, w in shapes), name="pyramid")
    cand = candidate_grid(pyramid, levels, patch, s.device)
    fix = resolve_fixation(fixation, s)
    if mode == "global":
        prio = cand.gather_scores(s, "mean")
        return cells_to_tokens(cand, select(prio, n), prio, pyramid.image_size, fix, patch)
    prio = cand.gather_scores(s, "max")
    caps = device_values([h * w for h, w in cand.shapes], dtype=torch.long, device=s.device)
    wts = device_values(wts.tolist(), dtype=torch.float64, device=s.device)
    q = largest_remainder(wts[None].expand(s.shape[0], -1), n, capacity=caps[None])
    tier = (group_rank(prio, cand.levels, len(levels)) < q[:, cand.levels]).long()
    return cells_to_tokens(cand, select(prio, n, tier, tier_max=1), prio, pyramid.image_size,
                           fix, patch)


register("pyramid_global", family="pyramid", version="v2", coverage=None,
         mode="global")(pyramid_alloc)


@register("foveated_pyramid", family="pyramid", version="v2.5", coverage=None)
def foveated_pyramid(pyramid: Pyramid, scores, budget: int, *, max_level: int = 4,
                     iters: int = 40, fixation=None, query=None, seed: int = 0,
                     patch: int = 16) -> TokenSet:
    """v2.5: fine tokens near the fixation, coarse in the periphery.

    A level-``l`` cell is *in the tiling* when the level its eccentricity asks for is ``l``:
    ``clamp(floor(log2(1 + e / e0)), 0, max_level)`` with ``e`` in base patches from the
    fixation, i.e. level 0 inside ``e < e0`` and level ``l`` in the annulus
    ``e0 (2^l - 1) <= e < e0 (2^(l+1) - 1)``: token size grows linearly with eccentricity, the
    cortical-magnification rule ``M^-1 ~ (e + e2)`` [Daniel & Whitteridge 1961; Horton & Hoyt
    1991]. The foveal scale ``e0`` is found per image by bisection on ``log e0`` (``iters``
    steps, vectorised over the batch) as the smallest value whose tiling has at least
    ``budget`` cells; the tiling's ``budget`` best cells by max-pooled score are kept (so a few
    low-score cells of the tiling may be dropped). The rule is a *near*-tiling, not a
    guarantee: where the level changes, a coarse cell whose centre lies in its annulus can
    overlap a finer neighbour or leave a sliver uncovered (a few percent of the cells;
    ``lod_dag`` is the method that guarantees no overlaps). If the tiling has fewer cells than
    ``budget`` (impossible for ``budget <= Gh*Gw``), it is filled by score.
    """
    s, n = check_inputs(pyramid, scores, budget, patch=patch, name="foveated_pyramid")
    fix = resolve_fixation(fixation, s)
    levels = _levels(pyramid, max_level)
    dev = s.device
    cand = candidate_grid(pyramid, levels, patch, dev)
    h, w = pyramid.image_size
    centers = torch.cat([cell_centers(cand.shapes[i], lv, (h, w), patch, device=dev)
                         for i, lv in enumerate(levels)])
    d = ((centers.double()[None] - fix.double()[:, None])
         * device_values([w, h], dtype=torch.float64, device=dev) / patch)
    ecc = d.norm(dim=-1)                                              # [B, M] in base patches
    # the level asked for is l  <=>  e / (2^(l+1) - 1) < e0 <= e / (2^l - 1)  (open ends
    # at the finest and coarsest level): an interval of e0 per cell, so each bisection step
    # is two comparisons instead of a log2
    lv = cand.levels.double()[None]
    upper = torch.where(lv > 0, ecc / (2**lv - 1), torch.full_like(ecc, math.inf))
    lower = torch.where(lv < levels[-1], ecc / (2 ** (lv + 1) - 1), torch.full_like(ecc, -1.0))
    lo = torch.full((s.shape[0], 1), 1e-3, dtype=torch.float64, device=dev)
    hi = torch.full((s.shape[0], 1), 4.0 * max(h, w) / patch, dtype=torch.float64, device=dev)
    for _ in range(iters):                                            # bisection steps
        mid = torch.sqrt(lo * hi)
        ok = ((lower < mid) & (mid <= upper)).sum(1, keepdim=True) >= n
        hi = torch.where(ok, mid, hi)
        lo = torch.where(ok, lo, mid)
    tier = ((lower < hi) & (hi <= upper)).long()
    prio = cand.gather_scores(s, "max")
    idx = select(prio, n, tier, -ecc.float(), tier_max=1)
    return cells_to_tokens(cand, idx, prio, (h, w), fix, patch)
