"""Wrappers: several fixations (``multi_fixation``) and per-image budgets (``adaptive_budget``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fovea_core.allocators.base import DEFAULT_BUDGET
from fovea_core.allocators.base import (box3_mean, candidate_grid, cell_centers, cells_to_tokens,
                                        check_inputs, device_values, fixation_from_scores,
                                        group_best, group_rank, largest_remainder, order,
                                        select)
from fovea_core.allocators.logpolar import _check_bins, logpolar_bins
from fovea_core.allocators.registry import ALLOCATORS, register
from fovea_core.pyramid import Pyramid
from fovea_core.tokens import TokenSet, require


def fixations_with_ior(scores: torch.Tensor, k: int, ior_radius: float = 0.2) -> torch.Tensor:
    """``k`` fixations ``[B, k, 2]`` with inhibition of return [Itti, Koch & Niebur 1998].

    The first is :func:`fixation_from_scores`; each next one is the best cell of the
    3x3-smoothed map after suppressing every cell within ``ior_radius`` (fraction of the
    longer grid side) of the fixations so far. A loop over the ``k`` fixations.
    """
    if not (isinstance(k, int) and k >= 1):
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if not 0 <= ior_radius <= 2:
        raise ValueError(f"ior_radius must be in [0, 2], got {ior_radius!r}")
    b, gh, gw = scores.shape
    sm = box3_mean(scores).flatten(1)
    c = cell_centers((gh, gw), 0, (gh, gw), 1, device=scores.device)    # [M, 2] normalised
    aspect = device_values([gw, gh], dtype=torch.float32, device=scores.device) / max(gh, gw)
    fix = [fixation_from_scores(scores)]
    suppressed = torch.zeros_like(sm, dtype=torch.bool)
    for _ in range(k - 1):                                              # over fixations
        d = ((c[None] - fix[-1][:, None]) * aspect).norm(dim=-1)
        suppressed |= d <= ior_radius
        nxt = order(torch.where(suppressed, -torch.inf, sm))[:, 0]
        fix.append(c[nxt])
    return torch.stack(fix, 1)


@register("multi_fixation", family="wrappers", version="v6", coverage="logpolar_bin")
def multi_fixation(pyramid: Pyramid, scores, budget: int, *, k: int = 2, mode: str = "split",
                   ior_radius: float = 0.2, n_rho: int = 6, n_theta: int = 12,
                   fovea: float = 1.5, fixation=None, query=None, seed: int = 0,
                   patch: int = 16) -> TokenSet:
    """Log-polar allocation around ``k`` fixations (:func:`fixations_with_ior`, or
    ``fixation`` ``[B, k, 2]``).

    Every patch belongs to its nearest fixation and to that fixation's log-polar bin
    (:func:`~fovea_core.allocators.logpolar.logpolar_bins`). ``mode="split"``: the budget is
    split equally across fixations (largest remainder) -> ``budget`` tokens;
    ``mode="per_fixation"``: each fixation gets the full budget -> ``k * budget`` tokens.
    Within a fixation's territory: bin winners first, then score; shortfalls (a small
    territory) are filled by the best remaining patches anywhere.
    """
    if mode not in ("split", "per_fixation"):
        raise ValueError(f"multi_fixation: mode must be 'split' or 'per_fixation', got {mode!r}")
    gh, gw = pyramid.grid_shape(patch, 0)
    kk = k if isinstance(k, int) else 0
    cap = gh * gw if mode == "split" else gh * gw // max(kk, 1)
    s, n = check_inputs(pyramid, scores, budget, patch=patch, max_budget=cap, name="multi_fixation")
    _check_bins(n_rho, n_theta, fovea)
    if fixation is None:
        fix = fixations_with_ior(s, k, ior_radius)
    else:
        fix = torch.as_tensor(fixation, dtype=torch.float32)
        msg = (f"multi_fixation: fixation must be [B, k, 2] = [{s.shape[0]}, {k}, 2] "
               f"in [0, 1], got {tuple(fix.shape)}")
        if fix.shape != (s.shape[0], k, 2):
            raise ValueError(msg)
        require(torch.isfinite(fix) & (fix >= 0) & (fix <= 1), msg)
        fix = fix.to(s.device, non_blocking=True)
    total = n if mode == "split" else k * n
    cand = candidate_grid(pyramid, [0], patch, s.device)
    centers = cell_centers(cand.shapes[0], 0, pyramid.image_size, patch, torch.float64, s.device)
    per = [logpolar_bins(centers, fix[:, j], pyramid.image_size, n_rho=n_rho, n_theta=n_theta,
                         fovea=fovea, patch=patch) for j in range(k)]  # loop over fixations
    bins = torch.stack([p[0] for p in per], 1)                         # [B, k, M]
    ecc = torch.stack([p[1] for p in per], 1)
    nb = per[0][2]
    owner = ecc.argmin(1)                                              # [B, M]
    mybin = owner * nb + bins.gather(1, owner[:, None])[:, 0]
    flat = s.flatten(1)
    winner = group_best(flat, mybin, k * nb).long()
    cnt = torch.zeros(s.shape[0], k, dtype=torch.long, device=s.device).scatter_add_(
        1, owner, torch.ones_like(owner))
    q = largest_remainder(torch.ones(s.shape[0], k, device=s.device), total, capacity=cnt)
    take = group_rank(flat, owner, k, tier=winner, tier_max=1) < q.gather(1, owner)
    idx = select(flat, total, take.long() * 2 + winner, tier_max=3)
    return cells_to_tokens(cand, idx, flat, pyramid.image_size, fix, patch)


def image_complexity(pyramid: Pyramid, patch: int = 16, threshold: float = 0.02) -> torch.Tensor:
    """``[B]`` in ``[0, 1]``: the fraction of patches whose mean gradient magnitude (gray,
    pyramid level 1) exceeds ``threshold`` -- an edge-density measure of visual clutter."""
    from fovea_core.allocators.peers import patch_gradients
    g, cell = patch_gradients(pyramid, patch)
    return (F.avg_pool2d(g[:, :1], cell) > threshold).float().flatten(1).mean(1)


#: the seeds' budget buckets for a nominal 273 tokens, and the complexity thresholds between them
BUCKETS: tuple[int, ...] = (180, 273, 365, 456)
THRESHOLDS: tuple[float, ...] = (0.25, 0.5, 0.75)


def _bucket_rule(complexity, n: int, buckets, thresholds) -> tuple[torch.Tensor, torch.Tensor]:
    """``(which [B] int64, sizes [len(buckets)] int64)``: each image's bucket index and each
    bucket's budget before the clip to the grid (see :func:`bucket_budgets`)."""
    if len(thresholds) != len(buckets) - 1:
        raise ValueError(f"adaptive_budget: need len(buckets) - 1 = {len(buckets) - 1} "
                         f"thresholds, got {len(thresholds)}")
    c = torch.as_tensor(complexity).float().reshape(-1)
    which = torch.bucketize(c, torch.tensor(thresholds, dtype=torch.float32), right=True)
    sizes = torch.round(torch.tensor(buckets, dtype=torch.float64) * n / 273).long().clamp(min=1)
    return which, sizes


def bucket_budgets(complexity, budget: int | None = 273, cells=None, *,
                   buckets=BUCKETS, thresholds=THRESHOLDS) -> torch.Tensor:
    """``[B]`` int64: the budget :func:`adaptive_budget` gives each image (its one rule).

    Bucket ``i`` is chosen where ``complexity`` ``[B]`` passes ``thresholds[i-1]``
    (compared in float32); the buckets are scaled by ``budget / 273`` (``None``: 273),
    rounded half to even, and clipped to ``[1, cells]``, where ``cells`` (an int or ``[B]``;
    ``None``: no upper clip) is each image's number of base-grid patches ``Gh * Gw``.
    """
    which, sizes = _bucket_rule(complexity, 273 if budget is None else budget, buckets,
                                thresholds)
    per_image = sizes[which]
    if cells is None:
        return per_image
    return torch.minimum(per_image, torch.as_tensor(cells, dtype=torch.int64).expand_as(per_image))


@dataclass(frozen=True)
class BucketResult:
    """One budget bucket of :func:`adaptive_budget`: the batch ``indices`` whose images got
    ``budget`` tokens, and their ``tokens`` (a TokenSet over those images, in that order)."""

    budget: int
    indices: torch.Tensor
    tokens: TokenSet


@register("adaptive_budget", family="wrappers", version="wrapper", kind="buckets")
def adaptive_budget(pyramid: Pyramid, scores, budget: int = DEFAULT_BUDGET, *,
                    buckets=BUCKETS, thresholds=THRESHOLDS,
                    base: str = "topk", complexity: torch.Tensor | None = None, fixation=None,
                    query=None, seed: int = 0, patch: int = 16, **base_kw) -> list[BucketResult]:
    """Per-image budget from image complexity, in discrete buckets.

    ``budget=None`` means the nominal 273. Bucket ``i`` is chosen where ``complexity`` (default
    :func:`image_complexity`) passes ``thresholds[i-1]``; the buckets (default 180/273/365/456,
    the seeds' values for a nominal 273) are scaled by ``budget / 273`` and clipped to
    ``[1, Gh*Gw]``. Because a TokenSet has one N for the whole batch, the result is a list of
    :class:`BucketResult`, one per non-empty bucket (ascending budget): images are grouped by
    bucket and each group is allocated by ``ALLOCATORS[base]`` with that budget.
    """
    if base not in ALLOCATORS or base in ("adaptive_budget", "full"):
        raise ValueError(f"adaptive_budget: base must be a fixed-budget allocator name, got {base!r}")
    s, n = check_inputs(pyramid, scores, 273 if budget is None else budget, patch=patch,
                        name="adaptive_budget")
    gh, gw = s.shape[1:]
    c = image_complexity(pyramid, patch) if complexity is None else torch.as_tensor(complexity)
    which, sizes = _bucket_rule(c, n, buckets, thresholds)
    out = []
    fixt = None if fixation is None else torch.as_tensor(fixation, dtype=torch.float32)
    for i, nb in enumerate(sizes.clamp(max=gh * gw).tolist()):            # over buckets
        idx = torch.nonzero(which == i)[:, 0]
        if idx.numel() == 0:
            continue
        sub = Pyramid(tuple(lv[idx] for lv in pyramid.levels))
        f = fixt if fixt is None or fixt.ndim == 1 else fixt[idx]
        ts = ALLOCATORS[base](sub, s[idx], nb, fixation=f, query=query, seed=seed, patch=patch,
                              **base_kw)
        out.append(BucketResult(nb, idx, ts))
    return out
