"""Label-free image scorers: spectral residual saliency, edge density and a centre-bias prior.

All return ``[B, Gh, Gw]`` float32 maps on the base patch grid, non-negative, peak 1
(see :mod:`fovea_core.importance.base`).
"""

from __future__ import annotations

import math

import torch
import torch.fft
import torch.nn.functional as F

from fovea_core.importance.base import (ImageLike, cell_centres, normalise, pool_to_grid,
                                        prepare, to_gray)

# Clarke & Tatler (2014), "Deriving an appropriate baseline for describing fixation
# behaviour", Vision Research 102: their recommended central-bias baseline is an anisotropic
# Gaussian centred on the image with horizontal variance sigma^2 = 0.22 and vertical variance
# nu * sigma^2, nu = 0.45, in coordinates where x spans [-1, 1] over the image width and y
# uses the same scale (sigma_x = 0.47 half-widths, about 0.23 of the width). It refines the
# central fixation bias of Tatler 2007 and the "distance to centre" feature of Judd et al.
# 2009.
CENTER_SIGMA = math.sqrt(0.22)
CENTER_NU = 0.45
EDGE_EPS = 1e-5


def _gaussian_kernel1d(sigma: float) -> torch.Tensor:
    radius = max(1, int(math.ceil(3 * sigma)))
    t = torch.arange(-radius, radius + 1, dtype=torch.float32)
    k = torch.exp(-0.5 * (t / sigma) ** 2)
    return k / k.sum()


def gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of ``[B, 1, H, W]`` with reflect borders (radius ``3 sigma``)."""
    if sigma <= 0:
        return x
    k = _gaussian_kernel1d(sigma).to(x)
    r = (k.numel() - 1) // 2
    mode = "reflect" if min(x.shape[-2:]) > r else "replicate"
    y = F.conv2d(F.pad(x, (r, r, 0, 0), mode=mode), k.view(1, 1, 1, -1))
    return F.conv2d(F.pad(y, (0, 0, r, r), mode=mode), k.view(1, 1, -1, 1))


def spectral_residual(image: ImageLike, *, patch: int = 16, size: int = 64,
                      sigma: float = 2.5) -> torch.Tensor:
    """Spectral-residual saliency [Hou & Zhang 2007, CVPR, eqs. 5-9] pooled to the patch grid.

    The luma image is resized (area average) so its longer side is ``size`` pixels (the
    paper works at 64 px), then, with ``A(f)`` the amplitude and ``P(f)`` the phase of its
    2-D FFT::

        L(f) = log A(f),   R(f) = L(f) - h_3 * L(f)          (h_3: 3x3 mean filter)
        S(x) = g * |IFFT[exp(R(f) + i P(f))]|^2              (g: Gaussian, sigma px)

    As in the authors' reference MATLAB code, the 3x3 mean filter pads by edge replication
    and ``g`` is a Gaussian of ``sigma = 2.5`` working pixels (their
    ``fspecial('gaussian', [10, 10], 2.5)``). ``S`` is resized bilinearly back to ``H x W``
    and averaged per cell.

    Args:
        image: image batch (see :func:`~fovea_core.importance.base.prepare`).
        patch: cell side in pixels.
        size: working resolution (longer side, pixels), >= 8.
        sigma: Gaussian smoothing in working pixels, >= 0.

    Returns:
        ``[B, Gh, Gw]`` float32, peak 1; all zero for a constant image (no residual: a
        uniform map, as :func:`edge_density` gives, not a round-off spike).
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 8:
        raise ValueError(f"size must be an int >= 8, got {size!r}")
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be finite and >= 0, got {sigma}")
    x, _ = prepare(image, patch)
    h, w = x.shape[-2:]
    scale = size / max(h, w)
    hs, ws = max(3, round(h * scale)), max(3, round(w * scale))
    gray = to_gray(x)                                                         # [B, 1, H, W]
    # a constant image has no residual, only float round-off around the DC term (a spike at
    # the first cell): its map is all zero, as edge_density's (uniform: nothing stands out)
    flat = gray.amax(dim=(-3, -2, -1)) == gray.amin(dim=(-3, -2, -1))         # [B]
    g = F.interpolate(gray, size=(hs, ws), mode="area")[:, 0]                # [B, hs, ws]
    spec = torch.fft.fft2(g.double())
    log_amp = torch.log(spec.abs() + 1e-12)
    avg = F.avg_pool2d(F.pad(log_amp[:, None], (1, 1, 1, 1), mode="replicate"), 3, stride=1)[:, 0]
    residual = log_amp - avg
    sal = torch.fft.ifft2(torch.exp(residual) * torch.exp(1j * torch.angle(spec))).abs() ** 2
    sal = gaussian_blur(sal.float()[:, None], sigma)
    full = F.interpolate(sal, size=(h, w), mode="bilinear", align_corners=False)[:, 0]
    full = torch.where(flat[:, None, None], torch.zeros_like(full), full)
    return normalise(pool_to_grid(full, patch))


def edge_density(image: ImageLike, *, patch: int = 16) -> torch.Tensor:
    """Mean Sobel gradient magnitude of the luma image per patch cell, ``[B, Gh, Gw]``.

    ``|grad I| = sqrt(G_x^2 + G_y^2)`` with the 3x3 Sobel kernels (reflect borders), averaged
    over each cell: dense edges (text, texture) score high, flat regions score 0 (magnitudes
    below ``EDGE_EPS = 1e-5``, i.e. float round-off on a constant image, are set to 0). Peak 1.
    """
    x, _ = prepare(image, patch)
    g = F.pad(to_gray(x), (1, 1, 1, 1), mode="reflect")
    kx = g.new_tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]]) / 8
    k = torch.stack([kx, kx.T])[:, None]                                      # [2, 1, 3, 3]
    grad = F.conv2d(g, k)                                                     # [B, 2, H, W]
    mag = grad.pow(2).sum(1).sqrt()
    mag = torch.where(mag > EDGE_EPS, mag, torch.zeros_like(mag))     # drop float round-off
    return normalise(pool_to_grid(mag, patch))


def center_bias(image: ImageLike, *, patch: int = 16, sigma: float = CENTER_SIGMA,
                nu: float = CENTER_NU) -> torch.Tensor:
    """Central-fixation-bias prior [Clarke & Tatler 2014; Tatler 2007; Judd et al. 2009].

    With ``u = (x - W/2) / (W/2)`` and ``v = (y - H/2) / (W/2)`` at each cell centre
    (x, y in pixels; both axes scaled by the half-width, so ``u`` spans ``[-1, 1]``)::

        p(u, v) = exp(-u^2 / (2 sigma^2) - v^2 / (2 nu sigma^2))

    Defaults ``sigma^2 = 0.22``, ``nu = 0.45`` (Clarke & Tatler 2014's baseline). The image
    content is ignored; only its size matters. Peak 1 at the centre, symmetric about it
    when ``H`` and ``W`` are multiples of ``patch``.
    """
    if not (math.isfinite(sigma) and sigma > 0 and math.isfinite(nu) and nu > 0):
        raise ValueError(f"sigma and nu must be finite and > 0, got sigma={sigma}, nu={nu}")
    x, _ = prepare(image, patch)
    b, _, h, w = x.shape
    ys, xs = cell_centres(h, w, patch)
    u = (xs - w / 2) / (w / 2)
    v = (ys - h / 2) / (w / 2)
    p = torch.exp(-(u[None, :] ** 2) / (2 * sigma**2) - (v[:, None] ** 2) / (2 * nu * sigma**2))
    return normalise(p.expand(b, -1, -1).clone())
