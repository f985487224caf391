"""Shared plumbing for the importance scorers: input checks, pooling to the patch grid,
normalisation and the fixation read-out.

Every scorer maps an image batch ``[B, C, H, W]`` to a score map on the *base patch grid*
``[B, Gh, Gw]`` with ``Gh = ceil(H / patch)``, ``Gw = ceil(W / patch)`` (the level-0 cells
of :meth:`fovea_core.Pyramid.grid_shape`): float32, finite, non-negative, and divided by its
per-image maximum (so the peak is 1; an all-zero map stays all-zero).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from fovea_core.pyramid import Pyramid, as_image_batch
from fovea_core.tokens import require

ImageLike = np.ndarray | torch.Tensor | Pyramid

# ITU-R BT.601 luma weights (the ones cv2.cvtColor(..., COLOR_RGB2GRAY) uses).
LUMA = (0.299, 0.587, 0.114)


def check_patch(patch: int) -> int:
    """Validate the patch size (an integer >= 1)."""
    if isinstance(patch, bool) or not isinstance(patch, (int, np.integer)) or patch < 1:
        raise ValueError(f"patch must be an integer >= 1, got {patch!r}")
    return int(patch)


def prepare(image: ImageLike, patch: int = 16) -> tuple[torch.Tensor, tuple[int, int]]:
    """Validate an input and return ``(x [B, C, H, W] float32 in [0, 1], (Gh, Gw))``.

    Accepts a :class:`~fovea_core.Pyramid` (its level 0 is used) or anything
    :func:`~fovea_core.as_image_batch` accepts. Raises ``ValueError`` for NaN/inf values,
    an empty batch, channel counts other than 1 or 3, or images smaller than one patch.
    """
    patch = check_patch(patch)
    x = image.base.float() if isinstance(image, Pyramid) else as_image_batch(image)
    b, c, h, w = x.shape
    if b < 1:
        raise ValueError("image batch is empty (B = 0)")
    if c not in (1, 3):
        raise ValueError(f"image must have 1 or 3 channels, got C = {c} (shape {tuple(x.shape)})")
    if h < patch or w < patch or h < 3 or w < 3:
        raise ValueError(f"image {h}x{w} is smaller than one {patch}px patch (needs H, W >= "
                         f"max(patch, 3))")
    if not torch.isfinite(x).all():
        raise ValueError("image contains NaN or inf values")
    return x, (math.ceil(h / patch), math.ceil(w / patch))


def to_gray(x: torch.Tensor) -> torch.Tensor:
    """Luma ``[B, 1, H, W]`` of an RGB or grey batch ``[B, C, H, W]`` (BT.601 weights)."""
    if x.shape[1] == 1:
        return x
    return (x * x.new_tensor(LUMA).view(1, 3, 1, 1)).sum(dim=1, keepdim=True)


def pool_to_grid(m: torch.Tensor, patch: int) -> torch.Tensor:
    """Average a per-pixel map ``[B, H, W]`` over each ``patch x patch`` cell -> ``[B, Gh, Gw]``.

    Cells that stick out of the image (when ``H`` or ``W`` is not a multiple of ``patch``)
    are averaged over their in-image pixels only.
    """
    b, h, w = m.shape
    gh, gw = math.ceil(h / patch), math.ceil(w / patch)
    ph, pw = gh * patch - h, gw * patch - w
    padded = F.pad(m[:, None], (0, pw, 0, ph))
    total = F.avg_pool2d(padded, patch, divisor_override=1)[:, 0]
    count = F.avg_pool2d(F.pad(m.new_ones(1, 1, h, w), (0, pw, 0, ph)), patch,
                         divisor_override=1)[0, 0]
    return total / count


def normalise(s: torch.Tensor) -> torch.Tensor:
    """Clamp at 0 and divide each map ``[B, Gh, Gw]`` by its maximum (all-zero maps stay 0)."""
    s = torch.nan_to_num(s.float(), nan=0.0, posinf=0.0, neginf=0.0).clamp_min(0)
    peak = s.amax(dim=(-2, -1), keepdim=True)
    return torch.where(peak > 0, s / peak.clamp_min(torch.finfo(torch.float32).tiny),
                       torch.zeros_like(s))


def cell_centres(h: int, w: int, patch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Centres of the in-image part of every grid cell in pixels: ``ys [Gh]``, ``xs [Gw]``."""
    def centres(n: int) -> torch.Tensor:
        g = math.ceil(n / patch)
        lo = torch.arange(g, dtype=torch.float32) * patch
        return (lo + torch.clamp(lo + patch, max=n)) / 2
    return centres(h), centres(w)


def _binomial_smooth(s: torch.Tensor) -> torch.Tensor:
    """3x3 binomial blur ``[1, 2, 1] / 4`` (separable, replicate borders) of ``[B, Gh, Gw]``."""
    k = torch.full((3,), 0.25, dtype=s.dtype, device=s.device)   # made on the device: no copy
    k.narrow(0, 1, 1).fill_(0.5)
    y = F.pad(s[:, None], (1, 1, 1, 1), mode="replicate")
    y = F.conv2d(y, k.view(1, 1, 1, 3))
    y = F.conv2d(y, k.view(1, 1, 3, 1))
    return y[:, 0]


def fixation_from_scores(scores: torch.Tensor, *, smooth: bool = True,
                         image_size: tuple[int, int] | None = None,
                         patch: int = 16) -> torch.Tensor:
    """Coarse-to-fine fixation: the peak of a score map, ``[B, Gh, Gw] -> [B, 2]`` (x, y).

    The map is first blurred with a 3x3 binomial kernel ``[1, 2, 1]/4`` per axis (about a
    Gaussian of sigma = 0.7 cells) when ``smooth`` is true, so a single noisy cell cannot win
    over a coherent region. Tie-break (deterministic): among cells within a relative 1e-6 of
    the maximum, the one nearest the grid centre; among those, the first in row-major order.
    A flat map therefore fixates the centre.

    Args:
        scores: ``[B, Gh, Gw]`` finite scores (any real values).
        smooth: blur before the argmax.
        image_size: ``(H, W)``; if given, the fixation is the cell centre in pixels divided by
            ``(W, H)`` (exact for partial edge cells), else ``((col + 0.5)/Gw, (row + 0.5)/Gh)``.
        patch: cell side in pixels (only used with ``image_size``).

    Returns:
        ``[B, 2]`` float32 ``(x, y)`` in ``[0, 1]``, x right, y down.
    """
    if not isinstance(scores, torch.Tensor) or scores.ndim != 3:
        raise ValueError("scores must be a tensor [B, Gh, Gw], got "
                         f"{tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__}")
    if scores.numel() == 0:
        raise ValueError(f"scores must be non-empty, got shape {tuple(scores.shape)}")
    require(torch.isfinite(scores), "scores contain NaN or inf")    # no host sync on a GPU
    b, gh, gw = scores.shape
    s = _binomial_smooth(scores.float()) if smooth else scores.float()
    peak = s.amax(dim=(-2, -1), keepdim=True)
    tol = 1e-6 * peak.abs().clamp_min(1e-12)
    rows = torch.arange(gh, dtype=torch.float32, device=scores.device).view(gh, 1)
    cols = torch.arange(gw, dtype=torch.float32, device=scores.device).view(1, gw)
    dist = (rows - (gh - 1) / 2) ** 2 + (cols - (gw - 1) / 2) ** 2
    key = torch.where(s >= peak - tol, dist.expand_as(s), torch.full_like(s, float("inf")))
    flat = key.reshape(b, -1).argmin(dim=1)     # first minimum = row-major among equals
    r, c = flat // gw, flat % gw
    if image_size is None:
        return torch.stack([(c.float() + 0.5) / gw, (r.float() + 0.5) / gh], dim=-1)
    h, w = image_size
    ys, xs = cell_centres(h, w, check_patch(patch))
    if len(ys) != gh or len(xs) != gw:
        raise ValueError(f"image_size {image_size} with patch {patch} gives a {len(ys)}x{len(xs)} "
                         f"grid, but scores are {gh}x{gw}")
    return torch.stack([xs[c] / w, ys[r] / h], dim=-1)
