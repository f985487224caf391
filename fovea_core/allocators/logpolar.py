"""v6 log-polar allocators: ``logpolar``, ``hybrid`` and the learnable ``pseudo_logpolar``.

Log-polar bins mimic the retino-cortical map ``w = log(z - z_f)`` [Schwartz 1977]: equal
steps in log-eccentricity and polar angle around the fixation ``z_f``, so bins grow in
proportion to eccentricity, like receptive fields. Bins are a *partition of the level-0
patch grid* (each patch belongs to the bin under its centre); every allocator here picks
real patches.

Bin geometry (:func:`logpolar_bins`), in base pixels relative to the fixation, with
``r = |p - f|``, ``theta = atan2(dy, dx)``:

* fovea: ``r < r0`` (``r0 = fovea * patch``) -> bin 0;
* ``rho = floor(n_rho * log(r / r0) / log(r_max / r0))`` clipped to ``[0, n_rho - 1]`` with
  ``r_max`` the distance from the fixation to the farthest image corner;
* ``t = floor(theta / (2 pi / n_theta) + 1/2) mod n_theta`` (bins centred on the axes);
* bin id ``1 + rho * n_theta + t``; ``1 + n_rho * n_theta`` bins in all.
"""

from __future__ import annotations

import functools
import math

import torch

from fovea_core.allocators.base import (candidate_grid, cell_centers, cells_to_tokens,
                                        check_inputs, device_values, group_best, rank_of,
                                        resolve_fixation, select)
from fovea_core.allocators.registry import register
from fovea_core.pyramid import Pyramid
from fovea_core.tokens import TokenSet


def _check_bins(n_rho: int, n_theta: int, fovea: float) -> None:
    if not (isinstance(n_rho, int) and n_rho >= 1):
        raise ValueError(f"n_rho must be an int >= 1, got {n_rho!r}")
    if not (isinstance(n_theta, int) and n_theta >= 1):
        raise ValueError(f"n_theta must be an int >= 1, got {n_theta!r}")
    if not fovea > 0:
        raise ValueError(f"fovea (radius in patches) must be > 0, got {fovea!r}")


def logpolar_bins(centers: torch.Tensor, fixation: torch.Tensor, image_size: tuple[int, int],
                  *, n_rho: int = 8, n_theta: int = 16, fovea: float = 1.5, patch: int = 16
                  ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Log-polar bin of each cell centre (module docstring). Computed in float64.

    Args:
        centers: ``[M, 2]`` normalised (x, y) cell centres.
        fixation: ``[B, 2]`` normalised (x, y).

    Returns:
        ``(bin [B, M] long, eccentricity [B, M] float64 in pixels, number of bins)``.
    """
    h, w = image_size
    dev = centers.device
    scale = device_values([w, h], dtype=torch.float64, device=dev)
    p = centers.double() * scale                                   # [M, 2] px
    f = fixation.double() * scale                                  # [B, 2] px
    d = p[None] - f[:, None]                                       # [B, M, 2]
    r = torch.sqrt(d[..., 0] ** 2 + d[..., 1] ** 2)
    corners = torch.stack([device_values([0, w, 0, w], dtype=torch.float64, device=dev),
                           device_values([0, 0, h, h], dtype=torch.float64, device=dev)], -1)
    dc = corners[None] - f[:, None]                                # [B, 4, 2]
    rmax = torch.sqrt(dc[..., 0] ** 2 + dc[..., 1] ** 2).amax(1, keepdim=True)   # [B, 1]
    r0 = fovea * patch
    logspan = torch.log(torch.clamp(rmax / r0, min=1.0 + 1e-9))
    rho = torch.floor(n_rho * torch.log(torch.clamp(r, min=r0) / r0) / logspan)
    rho = rho.clamp(0, n_rho - 1).long()
    theta = torch.atan2(d[..., 1], d[..., 0])
    t = torch.remainder(torch.floor(theta / (2 * math.pi / n_theta) + 0.5), n_theta).long()
    bins = torch.where(r < r0, torch.zeros_like(rho), 1 + rho * n_theta + t)
    return bins, r, 1 + n_rho * n_theta


def _setup(pyramid, scores, budget, fixation, patch, name, n_rho, n_theta, fovea):
    s, n = check_inputs(pyramid, scores, budget, patch=patch, name=name)
    _check_bins(n_rho, n_theta, fovea)
    fix = resolve_fixation(fixation, s)
    cand = candidate_grid(pyramid, [0], patch, s.device)
    centers = cell_centers(cand.shapes[0], 0, pyramid.image_size, patch, torch.float64, s.device)
    bins, ecc, nb = logpolar_bins(centers, fix, pyramid.image_size, n_rho=n_rho,
                                  n_theta=n_theta, fovea=fovea, patch=patch)
    return s, n, fix, cand, bins, ecc, nb


@register("logpolar", family="logpolar", version="v6", coverage="logpolar_bin")
def logpolar(pyramid: Pyramid, scores, budget: int, *, n_rho: int = 8, n_theta: int = 16,
             fovea: float = 1.5, fixation=None, query=None, seed: int = 0, patch: int = 16
             ) -> TokenSet:
    """v6: ``n_rho x n_theta`` log-polar bins (+ a foveal bin) around the fixation; the best
    patch of every non-empty bin, then fill to ``budget`` with the best remaining patches.

    Order of selection: (bin winner first, score desc, eccentricity asc, index asc). When
    there are more non-empty bins than ``budget``, the ``budget`` best winners by score are
    kept. Coverage guarantee: if ``budget >= #non-empty bins``, every bin holds a token.
    """
    s, n, fix, cand, bins, ecc, nb = _setup(pyramid, scores, budget, fixation, patch,
                                            "logpolar", n_rho, n_theta, fovea)
    flat = s.flatten(1)
    winner = group_best(flat, bins, nb).long()
    idx = select(flat, n, winner, -ecc.float(), tier_max=1)
    return cells_to_tokens(cand, idx, flat, pyramid.image_size, fix, patch)


@register("hybrid", family="logpolar", version="v6", coverage=None)
def hybrid(pyramid: Pyramid, scores, budget: int, *, ratio: float = 0.7, n_rho: int = 8,
           n_theta: int = 16, fovea: float = 1.5, fixation=None, query=None, seed: int = 0,
           patch: int = 16) -> TokenSet:
    """v6 hybrid: ``round(ratio * N)`` tokens by top-K, then the best patch of every log-polar
    bin the top-K left uncovered (best bins first by score), then fill by score.

    ``ratio`` in ``[0, 1]`` (0.7 = the seeds' 70 % top-K + 30 % log-polar coverage).

    Note (a property of the rule, found while testing): the best patch of a bin that the
    top-K touches is itself in the top-K, so when every uncovered bin fits into the
    ``N - round(ratio N)`` remainder, ``hybrid`` selects exactly the same patches as
    :func:`logpolar` (all bin winners + the best remaining scores). The two differ only
    when the uncovered bins outnumber the remainder (many bins, small budget, low ratio).
    """
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"hybrid: ratio must be in [0, 1], got {ratio!r}")
    s, n, fix, cand, bins, ecc, nb = _setup(pyramid, scores, budget, fixation, patch,
                                            "hybrid", n_rho, n_theta, fovea)
    flat = s.flatten(1)
    k1 = int(round(ratio * n))
    top = rank_of(flat) < k1                                          # [B, M]
    covered = torch.zeros(flat.shape[0], nb, dtype=torch.long, device=flat.device).scatter_reduce(
        1, bins, top.long(), reduce="amax")
    winner = group_best(flat, bins, nb)
    uncovered_winner = winner & (covered.gather(1, bins) == 0)
    tier = top.long() * 2 + uncovered_winner.long()
    idx = select(flat, n, tier, -ecc.float(), tier_max=3)
    return cells_to_tokens(cand, idx, flat, pyramid.image_size, fix, patch)


# ----------------------------------------------------------------------------- learnable
def logpolar_init_centres(n_rho: int = 8, n_theta: int = 16, fovea: float = 0.03,
                          r_max: float = 1.0) -> torch.Tensor:
    """Initial bin centres ``[1 + n_rho * n_theta, 2]``: offsets from the fixation in units of
    the image side, on a log-polar lattice (one foveal centre at the origin)."""
    edges = torch.exp(torch.linspace(math.log(fovea), math.log(r_max), n_rho + 1))
    radii = torch.sqrt(edges[:-1] * edges[1:])
    ang = torch.arange(n_theta) * (2 * math.pi / n_theta)
    r, a = torch.meshgrid(radii, ang, indexing="ij")
    pts = torch.stack([r * torch.cos(a), r * torch.sin(a)], -1).reshape(-1, 2)
    return torch.cat([torch.zeros(1, 2), pts])


@functools.lru_cache(maxsize=8)
def _init_centres_on(device: torch.device) -> torch.Tensor:
    """:func:`logpolar_init_centres` computed on the CPU (so every device gets the same bits)
    and copied to ``device`` once (cached; treat as read-only)."""
    return logpolar_init_centres().to(device, non_blocking=True)


def fixation_offsets(centers: torch.Tensor, fixation: torch.Tensor, image_size) -> torch.Tensor:
    """Offsets ``[B, M, 2]`` of normalised ``centers [M, 2]`` from ``fixation [B, 2]``, in
    units of the image's longer side (the space of the learnable bin centres)."""
    h, w = image_size
    scale = device_values([w, h], dtype=centers.dtype, device=centers.device) / max(h, w)
    return (centers[None] - fixation[:, None].to(centers)) * scale          # [B, M, 2]


def _nearest_centre(shape: tuple[int, int], off: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Index ``[B, M]`` of the nearest centre ``c [K, 2]`` to every cell offset ``off
    [B, Gh*Gw, 2]`` (row-major grid ``shape``; ties to the lower index).

    The grid is separable: ``|x - c_k|^2 = (x_col - cx_k)^2 + (y_row - cy_k)^2``, so the
    two terms are ``[B, Gw, K]`` and ``[B, Gh, K]`` tables and one broadcast add plus one
    ``argmin`` over ``[B, Gh, Gw, K]`` replace a ``[B, M, 2] x [2, K]`` product."""
    gh, gw = shape
    b = off.shape[0]
    grid = off.view(b, gh, gw, 2)
    dx = (grid[:, 0, :, 0, None] - c[:, 0]) ** 2                        # [B, Gw, K]
    dy = (grid[:, :, 0, 1, None] - c[:, 1]) ** 2                        # [B, Gh, K]
    # one image at a time: its [Gh, Gw, K] table stays in cache (the batch's would not)
    buf = off.new_empty(gh, gw, c.shape[0])
    out = torch.empty(b, gh, gw, dtype=torch.long, device=off.device)
    for i in range(b):                                                   # over images only
        torch.add(dy[i, :, None, :], dx[i, None, :, :], out=buf)
        torch.argmin(buf, -1, out=out[i])
    return out.view(b, gh * gw)


@register("pseudo_logpolar", family="logpolar", version="v6", coverage="learned_bin",
          learned=True)
def pseudo_logpolar(pyramid: Pyramid, scores, budget: int, *, centres: torch.Tensor | None = None,
                    fixation=None, query=None, seed: int = 0, patch: int = 16) -> TokenSet:
    """Learnable log-polar: bins are the Voronoi cells of learned centres (offsets from the
    fixation, in image-side units; hard argmin assignment at inference). The best patch of
    every non-empty bin, then fill by score, as in :func:`logpolar`.

    ``centres`` ``[K, 2]`` are fitted by ``fovea_book.logpolar_training``; ``None`` uses the
    untrained log-polar initialisation :func:`logpolar_init_centres` (8 x 16 + fovea).
    """
    s, n = check_inputs(pyramid, scores, budget, patch=patch, name="pseudo_logpolar")
    fix = resolve_fixation(fixation, s)
    c = _init_centres_on(s.device) if centres is None else torch.as_tensor(
        centres, dtype=torch.float32)
    if c.ndim != 2 or c.shape[1] != 2 or c.shape[0] < 1:
        raise ValueError(f"pseudo_logpolar: centres must be [K, 2], got {tuple(c.shape)}")
    c = c.to(s.device, non_blocking=True)
    cand = candidate_grid(pyramid, [0], patch, s.device)
    centers = cell_centers(cand.shapes[0], 0, pyramid.image_size, patch, device=s.device)
    off = fixation_offsets(centers, fix, pyramid.image_size)
    bins = _nearest_centre(cand.shapes[0], off, c)
    ecc = off.norm(dim=-1)
    flat = s.flatten(1)
    winner = group_best(flat, bins, c.shape[0]).long()
    idx = select(flat, n, winner, -ecc, tier_max=1)
    return cells_to_tokens(cand, idx, flat, pyramid.image_size, fix, patch)
