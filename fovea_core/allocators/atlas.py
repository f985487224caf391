"""v3 ``atlas``: allocate per image region, tokens inside each region.

The seeds' hybrid atlas segments the image into regions (SAM in the seeds); here SLIC
superpixels [Achanta et al., TPAMI 2012] from scikit-image stand in for SAM (no model
download, deterministic). Each region gets an importance-proportional quota with at
least one token (the stratified rule with regions as strata), spent on its best patches.
"""

from __future__ import annotations

import numpy as np
import torch

from fovea_core.allocators.base import (candidate_grid, cells_to_tokens, check_inputs,
                                        group_rank, largest_remainder, nonneg, pixel_grid,
                                        rank_of, rank_weights, resolve_fixation, select)
from fovea_core.allocators import content_cache
from fovea_core.allocators.registry import register
from fovea_core.pyramid import Pyramid
from fovea_core.tokens import TokenSet


def segment_level(pyramid: Pyramid, max_side: int = 256) -> int:
    """The pyramid level SLIC runs on: the coarsest whose longer side is >= ``max_side``."""
    lvl = 0
    while lvl + 1 < pyramid.num_levels and max(pyramid.levels[lvl + 1].shape[-2:]) >= max_side:
        lvl += 1
    return lvl


def _reads(pyramid: Pyramid) -> int:
    """Pixels the default ``atlas`` segments (its level of :func:`segment_level`)."""
    return int(np.prod(pyramid.levels[segment_level(pyramid)].shape[-2:]))


def segment_regions(pyramid: Pyramid, n_segments: int = 24, patch: int = 16,
                    max_side: int = 256) -> torch.Tensor:
    """Region label of every level-0 patch ``[B, Gh, Gw]`` (labels ``0..R-1`` per image).

    SLIC-zero (adaptive compactness) on the coarsest pyramid level whose longer side is still
    >= ``max_side`` pixels (level 0 when the image is smaller), read at each patch's centre.
    The pixels are first rounded to the content grid
    (:func:`~fovea_core.allocators.base.pixel_grid`), so pixels that differ only in float noise
    (another CPU's rounding of the pyramid's means) segment alike. A loop over images (the
    segmenter is a library call per image); each page's labels are cached
    (:mod:`~fovea_core.allocators.content_cache`), so a budget sweep over the same pages
    segments them once.
    """
    img = pyramid.levels[segment_level(pyramid, max_side)]
    gh, gw = pyramid.grid_shape(patch, 0)
    h, w = pyramid.image_size
    lh, lw = img.shape[-2:]
    ys = ((torch.arange(gh) + 0.5) * patch * lh / h).long().clamp(0, lh - 1)
    xs = ((torch.arange(gw) + 0.5) * patch * lw / w).long().clamp(0, lw - 1)
    out = []
    for x in img:                                                      # over images
        arr = x.permute(1, 2, 0).cpu().numpy().astype(np.float64)
        arr = pixel_grid(arr)

        def compute(arr: np.ndarray = arr) -> torch.Tensor:
            from skimage.segmentation import slic    # here: it imports scipy (~0.5 s)

            multich = arr.shape[-1] > 1
            lab = slic(arr if multich else arr[..., 0], n_segments=n_segments, slic_zero=True,
                       start_label=0, channel_axis=-1 if multich else None)
            lab = torch.from_numpy(lab.astype(np.int64))[ys][:, xs]
            return torch.unique(lab, return_inverse=True)[1].view(gh, gw)  # compact ids
        # the content cost (SLIC) is paid once per page, whatever the budget
        out.append(content_cache.cached(
            content_cache.page_key(arr, "slic", n_segments, patch, (h, w)), compute))
    return torch.stack(out)


@register("atlas", family="atlas", version="v3", coverage="region", content=True, reads=_reads)
def atlas(pyramid: Pyramid, scores, budget: int, *, n_segments: int = 24,
          regions: torch.Tensor | None = None, fixation=None, query=None, seed: int = 0,
          patch: int = 16) -> TokenSet:
    """v3: segment (``regions`` ``[B, Gh, Gw]`` given, else :func:`segment_regions`), then
    give every region ``1 + LR(N - R, w)`` tokens with ``w_r = sum_{i in r} (s_i - min s)``
    (largest remainder), its best patches by score; fill any shortfall globally.

    Coverage: every region holds a token when ``budget >= R``; with more regions than
    budget, the ``budget`` regions of highest weight get one each.
    """
    s, n = check_inputs(pyramid, scores, budget, patch=patch, name="atlas")
    # host content (SLIC superpixels): computed on the CPU (a sync on a device); tokens go back
    dev, s = s.device, s.cpu()
    fix = resolve_fixation(fixation, s)
    lab = (segment_regions(pyramid, n_segments, patch) if regions is None
           else torch.as_tensor(regions)).cpu()
    if lab.shape != s.shape:
        raise ValueError(f"atlas: regions must be [B, Gh, Gw] = {list(s.shape)}, got {list(lab.shape)}")
    b = s.shape[0]
    g = lab.flatten(1).long()
    nr = int(g.max()) + 1
    flat = s.flatten(1)
    w = torch.zeros(b, nr).scatter_add_(1, g, nonneg(s).flatten(1))
    cnt = torch.zeros(b, nr, dtype=torch.long).scatter_add_(1, g, torch.ones_like(g))
    present = cnt > 0
    # one per present region (the heaviest regions first if there are more than n; weights
    # ranked and split on the ranking grid: rank_of, rank_weights)
    one = (rank_of(torch.where(present, w, -torch.inf)) < n) & present
    rest = (n - one.sum(1)).clamp(min=0)
    q = one.long() + largest_remainder(rank_weights(torch.where(present, w, 0.0)), rest,
                                       capacity=(cnt - one.long()).clamp(min=0))
    tier = (group_rank(flat, g, nr) < q.gather(1, g)).long()
    return cells_to_tokens(candidate_grid(pyramid, [0], patch), select(flat, n, tier), flat,
                           pyramid.image_size, fix, patch).to(dev)
