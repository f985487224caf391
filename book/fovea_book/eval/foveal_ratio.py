"""A foveated pyramid whose share of full-resolution tokens is a parameter: the v2.5
ablation "foveal ratio" of chapter 09 (notebook ``09_v2_5_foveated_pyramid``).

Not registered in :data:`~fovea_core.allocators.ALLOCATORS` (the chapter calls it with
each ratio); it has the allocators' signature, so ``functools.partial(foveal_ratio_pyramid,
ratio=r)`` runs wherever an allocator does. Also importable from
:mod:`fovea_book.eval.experiments`, where it used to live.
"""

from __future__ import annotations

import math

import torch

from fovea_core.allocators.base import (candidate_grid, cell_centers, cells_to_tokens,
                                        check_inputs, device_values, group_rank,
                                        resolve_fixation, select)
from fovea_core.pyramid import Pyramid
from fovea_core.tokens import TokenSet

__all__ = ["foveal_ratio_pyramid"]


def foveal_ratio_pyramid(pyramid: Pyramid, scores, budget: int, *, ratio: float = 0.3,
                         max_level: int = 4, iters: int = 40, fixation=None, query=None,
                         seed: int = 0, patch: int = 16) -> TokenSet:
    """Foveated pyramid with a fixed foveal share: ``round(ratio * N)`` level-0 tokens.

    1. **Fovea**: the ``n0 = round(ratio * budget)`` level-0 cells whose centres are nearest
       the fixation (ties: row-major first), a disc of radius ``e_f`` base
       patches (the largest of their eccentricities).
    2. **Periphery**: cells of levels ``1..L`` (``L = min(max_level, levels - 1)``) whose
       centre lies outside the fovea (``e > e_f``) and whose level equals
       ``clamp(1 + floor(log2(1 + (e - e_f) / e1)), 1, L)`` -- token size grows linearly
       with eccentricity beyond the fovea, the cortical-magnification rule
       ``M^-1 ~ (e + e2)`` [Horton & Hoyt 1991] of ``foveated_pyramid``. ``e1`` is found
       by bisection on ``log e1`` (``iters`` steps, vectorised over the batch) as the
       smallest value whose periphery has at least ``budget - n0`` cells; its best cells
       by max-pooled score are kept.
    3. Any shortfall (a periphery too small) is filled by the best remaining cells.

    ``ratio`` in ``[0, 1]``; ``ratio = 1`` is a pure fovea of level-0 cells. Unlike
    ``foveated_pyramid``, whose level-0 share follows from the budget, the share here is
    fixed, which is the ablation the v2.5 chapter needs. Peripheral cells next to the
    fovea may overlap it by part of a footprint (as in ``foveated_pyramid``).

    Shapes: ``scores [B, Gh, Gw]`` -> :class:`TokenSet` with ``budget`` distinct tokens.
    """
    if not (isinstance(ratio, (int, float)) and 0.0 <= float(ratio) <= 1.0):
        raise ValueError(f"foveal_ratio_pyramid: ratio must be in [0, 1], got {ratio!r}")
    if max_level < 1:
        raise ValueError(f"foveal_ratio_pyramid: max_level must be >= 1, got {max_level}")
    s, n = check_inputs(pyramid, scores, budget, patch=patch, name="foveal_ratio_pyramid")
    fix = resolve_fixation(fixation, s)
    levels = list(range(min(max_level, pyramid.num_levels - 1) + 1))
    dev = s.device
    cand = candidate_grid(pyramid, levels, patch, dev)
    h, w = pyramid.image_size
    centers = torch.cat([cell_centers(cand.shapes[i], lv, (h, w), patch, device=dev)
                         for i, lv in enumerate(levels)])                    # [M, 2]
    wh = device_values([w, h], dtype=torch.float32, device=dev)
    ecc = ((centers[None] - fix[:, None]) * wh / patch).norm(dim=-1)          # [B, M]
    prio = cand.gather_scores(s, "max")                                      # [B, M]
    lv = cand.levels[None]                                                   # [1, M]
    n0 = min(int(round(float(ratio) * n)), cand.shapes[0][0] * cand.shapes[0][1])
    fovea = (lv == 0) & (group_rank(-ecc, cand.levels, len(levels), tier=None) < n0)
    e_f = torch.where(fovea, ecc, torch.zeros_like(ecc)).amax(1, keepdim=True)  # [B, 1]
    outside = (lv > 0) & (ecc > e_f)
    top = levels[-1]

    def periphery(log_e1: torch.Tensor) -> torch.Tensor:
        pref = 1 + torch.floor(torch.log2(1 + (ecc - e_f).clamp(min=0) / log_e1.exp()))
        return outside & (pref.clamp(1, max(top, 1)).long() == lv)

    lo = torch.full((s.shape[0], 1), math.log(1e-3), device=dev)
    hi = torch.full((s.shape[0], 1), math.log(4.0 * max(h, w) / patch), device=dev)
    need = n - n0
    for _ in range(iters):                                                   # bisection steps
        mid = (lo + hi) / 2
        ok = periphery(mid).sum(1, keepdim=True) >= need
        hi, lo = torch.where(ok, mid, hi), torch.where(ok, lo, mid)
    tier = 2 * fovea.long() + periphery(hi).long() * (need > 0)
    idx = select(prio, n, tier, -ecc, tier_max=3)
    return cells_to_tokens(cand, idx, prio, (h, w), fix, patch)
