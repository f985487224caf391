"""Token density maps: where a :class:`~fovea_core.tokens.TokenSet` puts its samples.

Every token spreads one unit of mass over its footprint (side ``s = patch * 2**level`` base
pixels, centred on the token). Summing over tokens gives the number of tokens per pixel:
high where the allocator placed many small (fine) tokens, low where a few coarse tokens
cover a large area. This is the allocator's *sampling density*, the quantity a retina
varies with eccentricity (Curcio et al. 1990), and the map compared with human fixation
densities in the biological-fidelity chapter.

Kernels (both separable, integrated exactly over each output pixel, so the result does not
alias for footprints smaller than a pixel):

* ``"gaussian"`` (default): an isotropic Gaussian with ``sigma = sigma_scale * s``. With
  the default ``sigma_scale = 0.5`` a regular grid of equal tokens gives a nearly flat map:
  the ripple at the grid frequency has amplitude ``2 exp(-2 pi^2 sigma_scale^2)`` = 1.4 % of
  the mean per axis (peak to peak at most 4x that in 2-D); at ``sigma_scale = 0.25`` it is
  59 %, so smaller values show the individual tokens.
* ``"box"``: uniform over the footprint square (the token's exact support).

Mass that falls outside the image is dropped (tokens at the border count less), which is
why ``normalize=True`` (each map sums to 1, a distribution over pixels) is the default for
comparisons with fixation densities.
"""

from __future__ import annotations

import math

import torch

from fovea_core.tokens import TokenSet

KERNELS = ("gaussian", "box")


def _axis_weights(center: torch.Tensor, side: torch.Tensor, length: int, kernel: str,
                  sigma_scale: float) -> torch.Tensor:
    """Mass of each token's 1-D profile in each pixel ``[i, i+1)``: ``[B, N, length]``.

    ``center`` and ``side`` are ``[B, N]`` in output pixels; each profile integrates to 1
    over the real line.
    """
    edges = torch.arange(length + 1, dtype=center.dtype, device=center.device)
    c, s = center[..., None], side[..., None]
    if kernel == "box":
        lo, hi = edges[:-1], edges[1:]
        overlap = (torch.minimum(hi, c + s / 2) - torch.maximum(lo, c - s / 2)).clamp_min(0)
        return overlap / s
    z = (edges - c) / (sigma_scale * s * math.sqrt(2.0))
    cdf = 0.5 * (1 + torch.erf(z))
    return cdf[..., 1:] - cdf[..., :-1]


def token_density(tokens: TokenSet, size: tuple[int, int] | None = None, *,
                  sigma_scale: float = 0.5, kernel: str = "gaussian",
                  weights: torch.Tensor | None = None, normalize: bool = True) -> torch.Tensor:
    """Density of a token set on a pixel grid, ``[B, H, W]`` float32.

    ``D_b(y, x) = sum_n w_bn * k_y(y; c_bn, s_bn) * k_x(x; c_bn, s_bn)`` where ``k`` is the
    1-D kernel integrated over the pixel and ``s_bn`` the footprint side. Computed as one
    batched matrix product ``[B, H, N] @ [B, N, W]`` (no loop over tokens): memory
    ``O(B N (H + W))``, work ``O(B N H W)``.

    Args:
        tokens: the token set (``B`` images, ``N`` tokens each).
        size: output ``(H, W)``; default ``tokens.image_size``. Coordinates and footprints
            are scaled to it (e.g. ``(Gh, Gw)`` gives a map on the patch grid).
        sigma_scale: Gaussian sigma as a fraction of the footprint side, ``> 0``
            (ignored for ``kernel="box"``).
        kernel: ``"gaussian"`` or ``"box"``.
        weights: optional ``[B, N]`` non-negative mass per token (e.g. ``tokens.scores``);
            default 1 (the map then counts tokens per output pixel).
        normalize: divide each map by its sum (a distribution over pixels).

    Returns:
        ``[B, H, W]``: tokens per output pixel, or a distribution if ``normalize``.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "gaussian" and not sigma_scale > 0:
        raise ValueError(f"sigma_scale must be > 0, got {sigma_scale}")
    h0, w0 = tokens.image_size
    h, w = (h0, w0) if size is None else (int(size[0]), int(size[1]))
    if h < 1 or w < 1:
        raise ValueError(f"size must be (H, W) with H, W >= 1, got {size}")
    b, n = tokens.batch_size, tokens.budget
    if weights is None:
        wts = torch.ones(b, n, device=tokens.device)
    else:
        wts = torch.as_tensor(weights, dtype=torch.float32, device=tokens.device)
        if wts.shape != (b, n):
            raise ValueError(f"weights must be [B, N] = [{b}, {n}], got {tuple(wts.shape)}")
        if not torch.isfinite(wts).all() or (wts < 0).any():
            raise ValueError("weights must be finite and >= 0")
    # float64 for the CDF differences (tiny per-pixel masses of wide Gaussians stay exact),
    # float32 for the product (CPU float64 bmm is ~100x slower and gains nothing here).
    centers = tokens.centers.double()
    side = tokens.footprint().double()
    ky = _axis_weights(centers[..., 1] * h, side * (h / h0), h, kernel, sigma_scale).float()
    kx = _axis_weights(centers[..., 0] * w, side * (w / w0), w, kernel, sigma_scale).float()
    dens = torch.bmm(ky.transpose(1, 2), kx * wts[..., None])  # [B, H, W]
    if normalize:
        tot = dens.sum(dim=(1, 2), keepdim=True)
        dens = torch.where(tot > 0, dens / tot.clamp_min(1e-30), torch.full_like(dens, 1 / (h * w)))
    return dens
