"""Token-reduction methods from the field, re-implemented on the same inputs.

Both published methods prune the *visual tokens of a ViT* using the encoder's own
features. Here no encoder runs before allocation, so each patch gets a cheap feature
vector of pooled pixels (:func:`patch_features`); what is compared is the selection rule.

* ``divprune`` -- DivPrune [Alvar et al., CVPR 2025]: choose the subset that maximises the
  minimum pairwise (cosine) distance, solved greedily (farthest-point insertion).
* ``visionzip`` -- VisionZip [Yang et al., CVPR 2025]: keep the *dominant* tokens (highest
  attention; here importance) and merge the rest into a few *contextual* tokens (targets
  evenly spaced among the remaining tokens, others merged into their most similar target).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fovea_core.allocators.base import (candidate_grid, cells_to_tokens, check_inputs,
                                        device_values, order, pixel_grid, rank_grid,
                                        rank_of, resolve_fixation)
from fovea_core.allocators.registry import register
from fovea_core.importance.base import LUMA
from fovea_core.pyramid import Pyramid
from fovea_core.tokens import TokenSet


def _gray(device: torch.device) -> torch.Tensor:
    """The luma weights ``[3]`` on ``device`` (made there)."""
    return device_values(LUMA, dtype=torch.float32, device=device)


def patch_gradients(pyramid: Pyramid, patch: int = 16) -> tuple[torch.Tensor, int]:
    """Gray image gradients at pyramid level 1 (level 0 if it is the only one).

    Returns ``(g [B, 3, H_l, W_l] = (magnitude, gx, gy) padded to whole patches, cell side
    in level pixels)``. Central differences, replicate border.
    """
    lv = 1 if pyramid.num_levels > 1 else 0
    img = pyramid.levels[lv]
    gray = (torch.einsum("bchw,c->bhw", img, _gray(img.device)) if img.shape[1] == 3
            else img.mean(1))[:, None]
    cell = patch // 2**lv
    gh, gw = pyramid.grid_shape(patch, 0)
    gray = F.pad(gray, (0, gw * cell - gray.shape[-1], 0, gh * cell - gray.shape[-2]), mode="replicate")
    p = F.pad(gray, (1, 1, 1, 1), mode="replicate")
    gx = (p[..., 1:-1, 2:] - p[..., 1:-1, :-2]) / 2
    gy = (p[..., 2:, 1:-1] - p[..., :-2, 1:-1]) / 2
    return torch.cat([torch.sqrt(gx**2 + gy**2), gx, gy], 1), cell


def feature_level(pyramid: Pyramid, patch: int = 16, level: int = 2) -> int:
    """The pyramid level :func:`patch_features` reads: ``min(level, L - 1)``, lowered until a
    patch is a whole number of its pixels."""
    lv = min(level, pyramid.num_levels - 1)
    while lv > 0 and patch % 2**lv:
        lv -= 1
    return lv


def _reads(pyramid: Pyramid) -> int:
    """Pixels the default feature extraction reads (the level of :func:`feature_level`)."""
    return int(np.prod(pyramid.levels[feature_level(pyramid)].shape[-2:]))


def patch_features(pyramid: Pyramid, patch: int = 16, level: int = 2) -> torch.Tensor:
    """Per-patch features ``[B, Gh*Gw, C + c*c]`` from pooled pixels: the patch's mean colour
    and its gray thumbnail at pyramid level ``l = min(level, L-1)`` (``c = patch / 2**l``
    pixels a side, 4 x 4 for the default level 2) with the thumbnail's mean removed, so it
    encodes local structure (edges, strokes, orientation) and contrast. The vectors are
    centred over the image's patches (cosine similarity then compares deviations from the
    average patch). The level's pixels are read on the content grid
    (:func:`~fovea_core.allocators.base.pixel_grid`): equal on every CPU, and exactly equal
    for equal patches (a blank background)."""
    lv = feature_level(pyramid, patch, level)
    img = pixel_grid(pyramid.levels[lv])
    cell = patch // 2**lv
    gh, gw = pyramid.grid_shape(patch, 0)
    pad = (0, gw * cell - img.shape[-1], 0, gh * cell - img.shape[-2])
    # one contiguous copy of the (small) level: pooling and padding on a strided view of the
    # pyramid's atlas take slow generic paths
    img = F.pad(img, pad, mode="replicate") if any(pad) else img.contiguous()
    b, ch = img.shape[:2]
    mean = F.avg_pool2d(img, cell).flatten(2).transpose(1, 2)                   # [B, M, C]
    gray = torch.einsum("bchw,c->bhw", img, _gray(img.device)) if ch == 3 else img.mean(1)
    thumb = gray.view(b, gh, cell, gw, cell).permute(0, 1, 3, 2, 4).reshape(b, gh * gw, cell * cell)
    thumb = thumb - thumb.mean(-1, keepdim=True)
    f = torch.cat([mean, thumb], -1)
    return f - f.mean(1, keepdim=True)


def _unit(f: torch.Tensor) -> torch.Tensor:
    """Unit rows of ``f [B, M, D]`` after snapping every image's features to the ranking
    grid (:func:`~fovea_core.allocators.base.rank_grid` over all its ``M * D`` values):
    patches whose features differ only in float noise (a blank page's white patches, summed
    in another order on another CPU) get bit-identical unit vectors, so the greedy and the
    merge compare exact ties, broken by the lower index, not noise. Cosine similarity does
    not depend on the grid's scale."""
    g = rank_grid(f.flatten(1)).view_as(f).to(torch.float32)
    return g / g.norm(dim=-1, keepdim=True).clamp(min=1e-8)


@register("divprune", family="peers", version="peer", content=True, reads=_reads)
def divprune(pyramid: Pyramid, scores, budget: int, *, features: torch.Tensor | None = None,
             fixation=None, query=None, seed: int = 0, patch: int = 16) -> TokenSet:
    """DivPrune: greedy max-min diversity over patch features (cosine distance).

    The greedy max-min solver needs a first token; we seed it with the highest-importance
    patch (our choice; DivPrune itself uses only feature distances), then it adds the
    patch whose minimum distance to the selected set is largest (ties: lower index), until
    ``budget``. The greedy insertion is inherently sequential: a loop of ``budget - 1``
    steps: on the CPU in C++ (:func:`fovea_core.kernels.divprune_greedy`; per image the
    features stay in cache for all steps), elsewhere batched ``[B, M, D]`` products in torch.
    ``features`` ``[B, M, D]`` overrides :func:`patch_features`.
    """
    s, n = check_inputs(pyramid, scores, budget, patch=patch, name="divprune")
    fix = resolve_fixation(fixation, s)
    f = _unit(patch_features(pyramid, patch) if features is None
              else torch.as_tensor(features).float()).to(s.device, non_blocking=True)
    flat = s.flatten(1)
    b, m = flat.shape
    if f.shape[:2] != (b, m):
        raise ValueError(f"divprune: features must be [B, Gh*Gw, D] = [{b}, {m}, D], got {list(f.shape)}")
    cur = order(flat)[:, 0]
    chosen = None
    if f.device.type == "cpu":
        try:                                    # the same rule in C++, features in cache
            from fovea_core import kernels
            chosen = kernels.divprune_greedy(f, cur, n)
        except RuntimeError:                    # no C++ compiler: the torch loop below
            chosen = None
    if chosen is None:
        chosen = _divprune_torch(f, cur, n)
    return cells_to_tokens(candidate_grid(pyramid, [0], patch, s.device), chosen, flat,
                           pyramid.image_size, fix, patch)


def _divprune_torch(f: torch.Tensor, cur: torch.Tensor, n: int) -> torch.Tensor:
    """The greedy max-min loop in torch (any device): ``f [B, M, D]`` unit features, ``cur
    [B]`` seeds -> ``[B, n]``; ``n - 1`` batched steps, each a ``[B, M, D]`` product."""
    b, m, dim = f.shape
    chosen = torch.empty(b, n, dtype=torch.long, device=f.device)
    chosen[:, 0] = cur
    mind = torch.full((b, m), float("inf"), device=f.device)
    ft = f.transpose(1, 2).contiguous()                                # [B, D, M]
    for t in range(1, n):                                              # greedy steps
        # gather / scatter rather than advanced indexing: no host sync on a GPU
        row = torch.gather(f, 1, cur[:, None, None].expand(b, 1, dim))  # [B, 1, D]
        d = 1 - torch.bmm(row, ft)[:, 0]                               # [B, M]
        mind = torch.minimum(mind, d).scatter_(1, cur[:, None], float("-inf"))
        cur = mind.argmax(1)
        chosen[:, t] = cur
    return chosen


@register("visionzip", family="peers", version="peer", content=True, reads=_reads)
def visionzip(pyramid: Pyramid, scores, budget: int, *, dominant_ratio: float = 54 / 64,
              features: torch.Tensor | None = None, fixation=None, query=None, seed: int = 0,
              patch: int = 16) -> TokenSet:
    """VisionZip: ``round(dominant_ratio * N)`` dominant tokens by importance, the rest
    contextual: targets at evenly spaced positions (row-major) among the remaining patches,
    every other remaining patch merged into its most similar target (cosine on
    :func:`patch_features`). A contextual token sits at its target patch; its score is the
    mean importance of the patches merged into it (the merged feature itself is a VLM-side
    operation, not part of a TokenSet). Default ratio 54/64 follows VisionZip's 54 dominant
    + 10 contextual tokens setting.
    """
    if not 0.0 <= dominant_ratio <= 1.0:
        raise ValueError(f"visionzip: dominant_ratio must be in [0, 1], got {dominant_ratio!r}")
    s, n = check_inputs(pyramid, scores, budget, patch=patch, name="visionzip")
    fix = resolve_fixation(fixation, s)
    flat = s.flatten(1)
    b, m = flat.shape
    kd = min(int(round(dominant_ratio * n)), n)
    kc = n - kd
    dev = s.device
    dom = rank_of(flat) < kd                                           # [B, M]
    # cells by (dominant, index) ascending: the rest first, then the kd dominant cells
    by_dom = torch.sort(dom.long() * m + torch.arange(m, device=dev), dim=1).indices
    dom_idx = by_dom[:, m - kd:]                                       # [B, kd] ascending
    if kc == 0:
        return cells_to_tokens(candidate_grid(pyramid, [0], patch, dev), dom_idx, flat,
                               pyramid.image_size, fix, patch)
    f = _unit(patch_features(pyramid, patch) if features is None
              else torch.as_tensor(features).float()).to(dev, non_blocking=True)
    rest = by_dom[:, : m - kd]                                         # ascending
    pos = torch.div(torch.arange(kc, device=dev) * (m - kd), kc, rounding_mode="floor")
    tgt = rest[:, pos]                                                 # [B, kc]
    ar = torch.arange(b, device=dev)[:, None]
    sim = torch.bmm(f[ar, rest], f[ar, tgt].transpose(1, 2))           # [B, R, kc]
    assign = sim.argmax(-1)
    # a target patch is merged into itself: its position in tgt (inverse index, no [B, R, kc]
    # comparison)
    which = torch.full((b, m), -1, dtype=torch.long, device=dev)
    which[ar, tgt] = torch.arange(kc, device=dev).expand(b, kc)
    w_rest = which.gather(1, rest)
    assign = torch.where(w_rest >= 0, w_rest, assign)
    tot = torch.zeros(b, kc, device=dev).scatter_add_(1, assign, flat[ar, rest])
    cnt = torch.zeros(b, kc, device=dev).scatter_add_(
        1, assign, torch.ones_like(assign, dtype=torch.float))
    prio = flat.clone()
    prio[ar, tgt] = tot / cnt
    idx = torch.cat([dom_idx, tgt], 1)
    return cells_to_tokens(candidate_grid(pyramid, [0], patch, dev), idx, prio,
                           pyramid.image_size, fix, patch)
