"""Fitting the bin centres of the learnable log-polar allocator (chapters 06 and 13).

:func:`~fovea_core.allocators.logpolar.pseudo_logpolar` places its bins at given centres
(offsets from the fixation, in image-side units; default: the untrained log-polar lattice
:func:`~fovea_core.allocators.logpolar.logpolar_init_centres`). :func:`train_pseudo_logpolar`
fits them to score maps by minimising :func:`pseudo_logpolar_loss`.
"""

from __future__ import annotations

import torch

from fovea_core.allocators.base import cell_centers
from fovea_core.allocators.logpolar import fixation_offsets, logpolar_init_centres

__all__ = ["pseudo_logpolar_loss", "train_pseudo_logpolar"]


def pseudo_logpolar_loss(bin_centres: torch.Tensor, offsets: torch.Tensor, scores: torch.Tensor,
                         *, tau: float = 0.002, coverage_weight: float = 0.5) -> torch.Tensor:
    """Soft-assignment coverage loss of the learnable bins (scalar).

    Cell ``i`` (offset ``x_i`` from the fixation) is softly assigned to bin ``k`` with
    ``a_ik = softmax_k(-|x_i - c_k|^2 / tau)``; its soft squared distance to the bins is
    ``D_i = sum_k a_ik |x_i - c_k|^2``. The loss is the weighted mean of ``D_i`` with
    weights ``s_i / sum s + coverage_weight / M`` (importance-weighted k-means plus a uniform
    coverage term that keeps bins in the periphery). ``scores`` ``[B, M]`` >= 0.
    """
    d2 = ((offsets**2).sum(-1)[..., None] - 2 * offsets @ bin_centres.T
          + (bin_centres**2).sum(-1)).clamp(min=0)                             # [B, M, K]
    a = torch.softmax(-d2 / tau, dim=-1)
    soft = (a * d2).sum(-1)                                                  # [B, M]
    wts = scores / scores.sum(1, keepdim=True).clamp(min=1e-12) + coverage_weight / scores.shape[1]
    return (wts * soft).sum(1).mean()


def train_pseudo_logpolar(scores: torch.Tensor, fixations: torch.Tensor,
                          image_size: tuple[int, int], *, patch: int = 16, steps: int = 200,
                          lr: float = 0.01, init: torch.Tensor | None = None,
                          tau: float = 0.002, coverage_weight: float = 0.5
                          ) -> tuple[torch.Tensor, list[float]]:
    """Fit the bin centres ``[K, 2]`` with Adam on score maps ``[B, Gh, Gw]`` (e.g. the
    synthetic documents' importance) and their fixations ``[B, 2]``.

    Returns ``(centres, loss history)``. Runs in seconds on a CPU for a few dozen 64x64 maps.
    """
    s = torch.as_tensor(scores, dtype=torch.float32)
    s = (s - s.flatten(1).amin(1)[:, None, None]).flatten(1)
    gh, gw = scores.shape[1:]
    centers = cell_centers((gh, gw), 0, image_size, patch)
    off = fixation_offsets(centers, torch.as_tensor(fixations, dtype=torch.float32), image_size)
    c = (logpolar_init_centres() if init is None else init).clone().requires_grad_(True)
    m1, m2 = torch.zeros_like(c), torch.zeros_like(c)
    hist = []
    for t in range(1, steps + 1):          # Adam [Kingma & Ba 2015], written out (no optim import)
        loss = pseudo_logpolar_loss(c, off, s, tau=tau, coverage_weight=coverage_weight)
        (g,) = torch.autograd.grad(loss, c)
        m1.mul_(0.9).add_(0.1 * g)
        m2.mul_(0.999).add_(0.001 * g * g)
        with torch.no_grad():
            c -= lr * (m1 / (1 - 0.9**t)) / ((m2 / (1 - 0.999**t)).sqrt() + 1e-8)
        hist.append(float(loss.detach()))
    return c.detach(), hist


