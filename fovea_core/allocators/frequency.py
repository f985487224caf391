"""v5 ``frequency``: budget per scale band and per region from steerable-pyramid energy.

A steerable pyramid [Simoncelli & Freeman, ICIP 1995; pyrtools ``SteerablePyramidFreq``]
splits the image into bands by scale ``s`` and orientation ``o``. The band at scale ``s``
holds the detail a token must keep to represent that region faithfully: a region with
energy at scale ``s`` needs tokens at (about) that resolution, a region without it can be
read coarser. Text lines put their energy in the orientation band that responds to
*horizontal* structure (measured: band ``o = 2`` of pyrtools' 4-orientation pyramid for
horizontal stripes); the seeds ask for anisotropic treatment of that text-like energy.
Square tokens cannot be anisotropic themselves, so the treatment is a weight ``aniso`` on
that band in both the band budgets and the per-region priorities.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from fovea_core.allocators.base import (candidate_grid, cells_to_tokens, check_inputs,
                                        device_values, group_rank, largest_remainder, nonneg,
                                        pool_scores, rank_weights, resolve_fixation, select)
from fovea_core.allocators import content_cache
from fovea_core.allocators.registry import register
from fovea_core.importance.base import LUMA
from fovea_core.pyramid import Pyramid
from fovea_core.tokens import TokenSet

HORIZONTAL_BAND = 2  # pyrtools order=3: band 2 responds to horizontal stripes (text lines)


def band_level(pyramid: Pyramid, max_side: int = 512) -> int:
    """The pyramid level the bands are computed on: the finest whose longer side is
    <= ``max_side`` (the coarsest level if none is)."""
    a = 0
    while a + 1 < pyramid.num_levels and max(pyramid.levels[a].shape[-2:]) > max_side:
        a += 1
    return a


def _reads(pyramid: Pyramid) -> int:
    """Pixels the default ``frequency`` decomposes (its level of :func:`band_level`)."""
    return int(np.prod(pyramid.levels[band_level(pyramid)].shape[-2:]))


def band_energy(pyramid: Pyramid, *, patch: int = 16, max_side: int = 512, height: int = 4,
                aniso: float = 2.0) -> tuple[list[torch.Tensor], list[int]]:
    """Oriented band energy pooled onto token grids.

    The gray image at pyramid level ``a`` (the finest whose longer side is <= ``max_side``)
    is decomposed with ``height`` scales x 4 orientations. Band ``s`` (resolution of level
    ``a + s``) is mapped to token level ``t_s = max(a + s - 1, 0)`` (one level finer than its
    own resolution, so a token still resolves the band's frequencies), squared, weighted by
    ``aniso`` for the horizontal-structure band, summed over orientations and sum-pooled onto
    the level-``t_s`` patch grid. Returns ``(energies [B, Gh_t, Gw_t] per scale, levels t_s)``.
    """
    a = band_level(pyramid, max_side)
    img = pyramid.levels[a]
    gray = img.mean(1) if img.shape[1] != 3 else torch.einsum(
        "bchw,c->bhw", img, device_values(LUMA, dtype=torch.float32, device=img.device))
    h0, w0 = pyramid.image_size
    height = max(1, min(height, pyramid.num_levels - a, int(np.log2(min(gray.shape[-2:]))) - 2))
    wts = np.ones(4)
    wts[HORIZONTAL_BAND] = aniso
    per_scale = [[] for _ in range(height)]
    for g in gray.double().cpu().numpy():                                   # over images

        def compute(g: np.ndarray = g) -> list[torch.Tensor]:
            import pyrtools as pt       # here, not at import: it pulls in scipy.signal (~2 s)

            with warnings.catch_warnings():
                # odd-sized images (receipts) do not reconstruct exactly; we never
                # reconstruct, we only read band energies: pyrtools' warning does not apply
                warnings.filterwarnings("ignore", message="Reconstruction will not be perfect")
                pyr = pt.pyramids.SteerablePyramidFreq(g, height=height, order=3)
            return [torch.from_numpy(np.ascontiguousarray(
                sum(wts[o] * pyr.pyr_coeffs[(s, o)] ** 2 for o in range(4)))).float()
                for s in range(height)]
        # the content cost (steerable bands) is paid once per page, whatever the budget
        bands = content_cache.cached(content_cache.page_key(g, "steerable", height, aniso),
                                     compute)
        for s in range(height):
            per_scale[s].append(bands[s])
    energies, levels = [], []
    for s in range(height):
        e = torch.stack(per_scale[s])                                  # [B, h_s, w_s]
        t = max(a + s - 1, 0)
        gh, gw = pyramid.grid_shape(patch, t)
        side = patch * 2**t * e.shape[-1] / w0                          # band px per cell
        k = max(int(round(side)), 1)
        e = torch.nn.functional.pad(e, (0, max(gw * k - e.shape[-1], 0), 0,
                                        max(gh * k - e.shape[-2], 0)))
        e = e[:, : gh * k, : gw * k].reshape(e.shape[0], gh, k, gw, k).sum((2, 4))
        energies.append(e)
        levels.append(t)
    return energies, levels


@register("frequency", family="frequency", version="v5", coverage="band_quota", content=True,
          reads=_reads)
def frequency(pyramid: Pyramid, scores, budget: int, *, aniso: float = 2.0, height: int = 4,
              max_side: int = 512, fixation=None, query=None, seed: int = 0, patch: int = 16
              ) -> TokenSet:
    """v5: band ``s`` gets ``q_s`` tokens proportional to its total (weighted) energy (largest
    remainder, clipped to the level's cell count); within the band, cells of level ``t_s`` are
    ranked by ``energy x (1 + s/max s)`` (energy, boosted by importance ``s`` max-pooled to the
    cell); shortfalls are filled by the same priority across bands. The energies are float sums
    whose last bits depend on the CPU (FFT, BLAS, SIMD width): band weights and priorities are
    compared on the ranking grid (:func:`~fovea_core.allocators.base.rank_weights`,
    :func:`~fovea_core.allocators.base.rank_grid`), so near-equal energies (a blank page's
    noise-level bands) tie and go to the lower index. See :func:`band_energy` for the bands and
    the anisotropic weight ``aniso`` (>= 0).
    """
    if not aniso >= 0:
        raise ValueError(f"frequency: aniso must be >= 0, got {aniso!r}")
    s, n = check_inputs(pyramid, scores, budget, patch=patch, name="frequency")
    # host content (steerable bands): computed on the CPU (a sync on a device); tokens go back
    dev, s = s.device, s.cpu()
    fix = resolve_fixation(fixation, s)
    energies, levels = band_energy(pyramid, patch=patch, max_side=max_side, height=height,
                                   aniso=aniso)
    # merge bands that map to the same token level (a = 0 maps s = 0 and 1 to level 0)
    uniq = sorted(set(levels))
    cand = candidate_grid(pyramid, uniq, patch)
    e_lv = [sum(e for e, t in zip(energies, levels) if t == u) for u in uniq]
    energy = torch.cat([e.flatten(1) for e in e_lv], 1)                 # [B, M]
    imp = torch.cat([pool_scores(nonneg(s), u, "max").flatten(1) for u in uniq], 1)
    imp = imp / imp.amax(1, keepdim=True).clamp(min=1e-12)
    prio = energy * (1 + imp)
    prio = prio / prio.amax(1, keepdim=True).clamp(min=1e-30)
    band_w = torch.stack([e.flatten(1).sum(1) for e in e_lv], 1)       # [B, levels]
    caps = torch.tensor([h * w for h, w in cand.shapes])
    q = largest_remainder(rank_weights(band_w), n, capacity=caps[None])
    lv_idx = torch.repeat_interleave(torch.arange(len(uniq)), caps)
    tier = (group_rank(prio, lv_idx, len(uniq)) < q[:, lv_idx]).long()
    return cells_to_tokens(cand, select(prio, n, tier), prio, pyramid.image_size, fix,
                           patch).to(dev)
