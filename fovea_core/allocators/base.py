"""Shared machinery of every allocator: input checks, fixation, ranking and selection.

Every allocator reduces to the same two steps, both vectorised over the batch and the
candidate cells (no Python loop over patches):

1. build a *candidate list* of grid cells (level-0 cells, or cells of several mip levels
   flattened into one list, :class:`Candidates`), each with a *tier* (an integer: higher
   tiers are taken first, e.g. "best cell of its log-polar bin" = 1, "anything else" = 0)
   and a *priority* (a float, usually the importance score);
2. :func:`select` takes, per image, the ``budget`` candidates that come first in the
   lexicographic order (tier desc, priority desc, candidate index asc). Priorities are
   compared on a grid well above float noise (:func:`rank_grid`: values within
   ``max|priority| / 2**17`` of each other tie), so a choice never flips on the last bit
   of a float sum on another CPU. Ties therefore break deterministically towards the
   lower candidate index (row-major, finer level first), and the result has exactly
   ``budget`` distinct cells.

Scores live on the level-0 patch grid ``[B, Gh, Gw]`` with ``Gh = ceil(H / patch)``.
Coarser levels get their scores by pooling ``2**l x 2**l`` blocks (:func:`pool_scores`,
``"max"`` or ``"mean"``, each allocator says which).

**On the scores' device, without host syncs.** Everything here runs where the scores are
(CPU or CUDA) and returns tensors there: constants are made on that device (``device=``,
never a host tensor copied over), sizes come from shapes and arguments, never from data
(``topk``/``sort``/``scatter``/``cumsum`` with static sizes instead of ``nonzero``, boolean
masks, ``unique``, ``bincount`` or ``.item()``), and value checks go through
:func:`fovea_core.tokens.require` (exact ``ValueError`` on the CPU, ``torch._assert_async``
on a device). Where the host reads tensors for free (:func:`fovea_core.tokens.on_host`, the
CPU) two rules keep a cheaper data-sized shortcut with the same result
(:func:`top_per_stratum`, ``adaptive_stratified``). Two rules keep a data-dependent fallback
for inputs beyond their static bounds, documented where they are: :func:`lex_key` without
``tier_max`` (or with a tier that may not fit in the key) and :func:`image_rand` (seeded by a
CRC32 of the scores' bytes, read on the host). ``tests/test_allocators_device.py`` runs every
allocator that reads no pixels under a guard that fails on any host sync.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass
from collections.abc import Sequence

import numpy as np
import torch

from fovea_core.pyramid import Pyramid
from fovea_core.tokens import TokenSet, on_host, require
from fovea_core.importance.base import fixation_from_scores  # the one default-fixation rule

__all__ = ["DEFAULT_BUDGET", "Candidates", "check_budget", "check_seed", "check_inputs", "resolve_fixation",
           "fixation_from_scores", "pool_scores", "order", "order_lex", "rank_of",
           "select", "lex_key", "group_best", "group_rank", "largest_remainder",
           "cells_to_tokens", "candidate_grid", "image_rand", "rank_grid", "rank_weights",
           "RANK_BITS", "pixel_grid", "PIXEL_BITS", "nonneg", "cell_centers",
           "device_values", "stratum_ids", "top_per_stratum", "box3_mean"]


#: N, the tokens per page when a caller gives none: the seed documents' budget (their split
#: over pyramid levels, 64 + 128 + 64 + 17, is :data:`~fovea_core.allocators.pyramid.SEED_LEVEL_BUDGET`)
DEFAULT_BUDGET = 273


# ----------------------------------------------------------------------------- inputs
def _is_int(x: object) -> bool:
    """A Python or numpy integer, not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def check_budget(budget: object, high: int | None, *, low: int = 1, name: str | None = None,
                 where: str = "", arg: str = "budget", empty: str = "") -> int:
    """The one budget check: every allocator (through :func:`check_inputs`), the cascade,
    :func:`fovea_core.foveate` and its command call it, so a bad budget reads the same
    wherever it is caught. Returns ``budget`` as a Python int.

    ``budget`` must be an int (numpy integers accepted; ``bool`` and floats such as ``4.0``
    are not) in ``[low, high]``. ``high=None``: the upper end is not known yet (the command,
    before it reads a page), only ``low`` is checked. ``low > high``: no budget fits (e.g. a
    page too small for the cascade); ``empty`` says why.

    Raises:
        ValueError: ``"[<name>: ]<arg> must be in [<low>, <high>]<where>, got <budget>"``
            (``<high>`` is ``Gh*Gw`` when not known; a value that is not an int adds its type
            and that an int is needed), or ``"[<name>: ]no <arg> fits<where>: <empty>, got
            <budget>"`` when the range is empty.
    """
    prefix = f"{name}: " if name else ""
    if high is not None and low > high:
        raise ValueError(f"{prefix}no {arg} fits{where}: {empty or 'the range is empty'}, "
                         f"got {budget!r}")
    top = "Gh*Gw" if high is None else str(high)
    whole = _is_int(budget)
    if not whole or not (low <= int(budget) and (high is None or int(budget) <= high)):
        kind = "" if whole else (f" ({type(budget).__name__}; an int is needed, numpy integers "
                                 "accepted)")
        raise ValueError(f"{prefix}{arg} must be in [{low}, {top}]{where}, got {budget!r}{kind}")
    return int(budget)


def check_seed(seed: object, name: str | None = None) -> int:
    """``seed`` as a Python int: any integer (numpy integers accepted, negative ones too).

    Raises:
        ValueError: naming ``seed`` for anything else (``1.5`` would otherwise run as ``1``
            and be recorded as ``1.5``; ``True``, ``"3"`` and ``None`` are refused too).
    """
    if not _is_int(seed):
        prefix = f"{name}: " if name else ""
        raise ValueError(f"{prefix}seed must be an int (any integer, numpy integers "
                         f"accepted), got {seed!r} ({type(seed).__name__})")
    return int(seed)


def check_inputs(pyramid: Pyramid, scores: torch.Tensor | np.ndarray, budget: int | None, *,
                 patch: int = 16, max_budget: int | None = None, name: str = "allocator"
                 ) -> tuple[torch.Tensor, int]:
    """Validate the common arguments; return ``(scores [B, Gh, Gw] float32, budget)``.

    Raises ``ValueError`` naming the argument: ``scores`` must be ``[B, Gh, Gw]`` (or
    ``[Gh, Gw]`` for a batch of one) with ``(Gh, Gw) = pyramid.grid_shape(patch, 0)`` and no
    NaN / inf; ``budget`` must be an int in ``[1, max_budget]`` (default ``Gh * Gw``;
    :func:`check_budget`, the one budget check).

    The scores stay on their device (an array becomes a CPU tensor). The NaN / inf check is
    :func:`~fovea_core.tokens.require`: exact on the CPU, ``torch._assert_async`` (no host
    sync) on a device, where a bad map fails at the next synchronisation.
    """
    if not isinstance(pyramid, Pyramid):
        raise TypeError(f"{name}: pyramid must be a fovea_core Pyramid, got {type(pyramid).__name__}")
    if scores is None:
        raise ValueError(f"{name}: scores must be a [B, Gh, Gw] importance map; None is only "
                         "accepted by allocators that do not read scores (uses_scores=False)")
    try:
        s = torch.as_tensor(scores).detach().to(dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{name}: scores must be a [B, Gh, Gw] numeric tensor or array, got "
                         f"{type(scores).__name__}") from exc
    if s.ndim == 2:
        s = s[None]
    gh, gw = pyramid.grid_shape(patch, 0)
    expect = (pyramid.batch_size, gh, gw)
    if tuple(s.shape) != expect:
        raise ValueError(f"{name}: scores must have shape [B, Gh, Gw] = {list(expect)} "
                         f"(image {pyramid.image_size}, patch {patch}), got {list(s.shape)}")

    def detail() -> str:
        if torch.isnan(s).any():
            return (f"{name}: scores contain NaN ({int(torch.isnan(s).sum())} cells); "
                    "importance maps must be finite")
        return f"{name}: scores contain +-inf; importance maps must be finite"
    require(torch.isfinite(s), f"{name}: scores contain NaN or inf; importance maps must be "
            "finite", detail=detail)
    cap = gh * gw if max_budget is None else max_budget
    budget = check_budget(budget, cap, name=name, where=f" for a {gh}x{gw} patch grid")
    return s.contiguous(), budget


def nonneg(scores: torch.Tensor) -> torch.Tensor:
    """Scores ``[B, ...]`` shifted per image so that the minimum is 0 (weights for
    proportional quotas), on the ranking grid of the unshifted map (:func:`rank_grid` over
    each image's values, scaled back): ``(q - min q) * max|s| / 2**RANK_BITS``, exact
    float operations on the grid indices ``q``. The shift cancels: on a flat map ``s - min s``
    would be pure float noise at full relative scale; here it is exactly 0, and any two cells
    whose scores tie on the grid keep equal weights on every CPU. Returns float32 of the
    scores' shape."""
    flat = scores.flatten(1).float()
    q = rank_grid(flat).float()                         # |q| <= 2**RANK_BITS + 2: exact
    scale = torch.where(torch.isfinite(flat), flat.abs(), torch.zeros_like(flat)).amax(
        1, keepdim=True)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale)) / float(2**RANK_BITS)
    return ((q - q.amin(1, keepdim=True)) * scale).view(scores.shape)


def box3_mean(x: torch.Tensor) -> torch.Tensor:
    """3x3 box mean of ``[B, H, W]`` over the cells inside the grid (= ``avg_pool2d(x, 3, 1,
    1, count_include_pad=False)``), as nine shifted adds."""
    def box(t: torch.Tensor) -> torch.Tensor:
        p = torch.nn.functional.pad(t, (1, 1, 1, 1))
        r = p[:, :, :-2] + p[:, :, 1:-1] + p[:, :, 2:]
        return r[:, :-2] + r[:, 1:-1] + r[:, 2:]
    return box(x) / box(torch.ones_like(x[:1]))


def resolve_fixation(fixation, scores: torch.Tensor, *, dtype: torch.dtype = torch.float32
                     ) -> torch.Tensor:
    """The one fixation rule of every allocator: ``[B, 2]`` ``(x, y)`` in ``[0, 1]``.

    ``None`` -> :func:`fixation_from_scores` of the (checked) ``scores [B, Gh, Gw]`` (the
    smoothed peak, ties to the grid centre); ``(x, y)`` or ``[2]`` -> the same for every
    image; ``[B, 2]`` (or ``[B, 1, 2]``) -> per image. Values must be finite and in
    ``[0, 1]``. ``dtype`` is the returned precision (an explicit fixation is converted
    directly, so float64 keeps every bit of a float64 input). The result is on the scores'
    device: a fixation given as host data is checked on the host and copied over without
    blocking; one already on the device is checked there (:func:`~fovea_core.tokens.require`).

    Raises:
        ValueError: naming ``fixation``, for a wrong shape, NaN/inf or values outside [0, 1].
    """
    b = scores.shape[0]
    if fixation is None:
        return fixation_from_scores(scores).to(dtype)
    try:
        f = torch.as_tensor(fixation, dtype=dtype).detach()
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"fixation must be (x, y), [2] or [B, 2] numbers in [0, 1], got "
                         f"{fixation!r}") from exc
    if f.ndim == 3 and f.shape[1] == 1:
        f = f[:, 0]
    if f.shape == (2,):
        f = f.expand(b, 2)
    if f.shape != (b, 2):
        raise ValueError(f"fixation must be (x, y), [2] or [B, 2] with B = {b}, got {tuple(f.shape)}")
    require(torch.isfinite(f) & (f >= 0) & (f <= 1), "fixation must be finite (x, y) in [0, 1]",
            detail=lambda: f"fixation must be finite (x, y) in [0, 1], got {f.tolist()[:2]}")
    return f.to(scores.device, non_blocking=True).contiguous()


#: resolution of the score map's hash that seeds :func:`image_rand` (16 levels per cell)
SEED_BITS = 4


def image_rand(scores: torch.Tensor, seed: int, n: int | None = None) -> torch.Tensor:
    """Uniform random numbers ``[B, n]`` (default ``n = Gh*Gw``), one stream per image.

    Image ``b`` draws from a generator seeded with ``seed`` mixed with a CRC32 of its score
    map on a coarse grid (:func:`rank_grid` with :data:`SEED_BITS` bits), so the draw is
    deterministic for a seed, independent of the batch it sits in (batch == per-image loop)
    and different for different images. The grid is coarse on purpose: a CRC changes
    completely when one value moves, and one of ``M`` cells crosses a grid boundary under
    float noise ``e`` (relative to the map's largest value) with probability about
    ``M * e * 2**(SEED_BITS + 1)`` (``1e-3`` for a thousand cells at a few ulps), while 16
    levels per cell still tell pages apart. (The loop is over images, not patches.)

    Synchronises on a device: the CRC32 reads the score bytes on the host and the numbers
    come from torch's CPU generator (the same on every device); they are copied back to the
    scores' device. ``seed``: an int (:func:`check_seed`; ``ValueError`` naming ``seed``
    otherwise)."""
    seed = check_seed(seed)
    n = scores[0].numel() if n is None else n
    rows = []
    for s in rank_grid(scores.detach().flatten(1), bits=SEED_BITS).cpu():
        crc = zlib.crc32(np.ascontiguousarray(s.numpy()).tobytes())
        g = torch.Generator().manual_seed((int(seed) * 1_000_003 + crc) % (2**63))
        rows.append(torch.rand(n, generator=g))
    return torch.stack(rows).to(scores.device)


# ----------------------------------------------------------------------------- pooling
def pool_scores(scores: torch.Tensor, level: int, mode: str = "max") -> torch.Tensor:
    """Scores of the level-``level`` grid ``[B, ceil(Gh/2**l), ceil(Gw/2**l)]``.

    Each level-``l`` cell covers a ``2**l x 2**l`` block of level-0 cells (cut at the image
    border); ``mode="max"`` takes the block maximum, ``"mean"`` the mean over the cells that
    exist.
    """
    if level == 0:
        return scores
    if mode not in ("max", "mean", "sum"):
        raise ValueError(f"mode must be 'max', 'mean' or 'sum', got {mode!r}")
    k = 2**level
    b, gh, gw = scores.shape
    ph, pw = -gh % k, -gw % k
    if mode == "max":
        x = torch.nn.functional.pad(scores, (0, pw, 0, ph), value=float("-inf"))
        return x.view(b, (gh + ph) // k, k, (gw + pw) // k, k).amax(dim=(2, 4))
    x = torch.nn.functional.pad(scores, (0, pw, 0, ph), value=0.0)
    tot = x.view(b, (gh + ph) // k, k, (gw + pw) // k, k).sum(dim=(2, 4))
    if mode == "sum":
        return tot
    ones = torch.nn.functional.pad(torch.ones(1, gh, gw, device=scores.device), (0, pw, 0, ph))
    cnt = ones.view(1, (gh + ph) // k, k, (gw + pw) // k, k).sum(dim=(2, 4))
    return tot / cnt


# ----------------------------------------------------------------------------- candidates
@dataclass(frozen=True)
class Candidates:
    """Grid cells of one or more levels, flattened: ``rows/cols/levels`` are ``[M]`` long.

    ``offsets[i]`` is where level ``levels_used[i]`` starts; within a level the cells are
    row-major. ``shapes[i]`` is that level's grid shape.
    """

    rows: torch.Tensor
    cols: torch.Tensor
    levels: torch.Tensor
    levels_used: tuple[int, ...]
    shapes: tuple[tuple[int, int], ...]
    offsets: tuple[int, ...]

    @property
    def size(self) -> int:
        return self.rows.numel()

    def slice(self, i: int) -> slice:
        """The candidate range of ``levels_used[i]``."""
        return slice(self.offsets[i], self.offsets[i] + self.shapes[i][0] * self.shapes[i][1])

    def gather_scores(self, scores: torch.Tensor, mode: str = "max") -> torch.Tensor:
        """Pooled scores of every candidate ``[B, M]`` (see :func:`pool_scores`)."""
        return torch.cat([pool_scores(scores, lv, mode).flatten(1) for lv in self.levels_used], 1)


def candidate_grid(pyramid: Pyramid, levels: Sequence[int], patch: int = 16,
                   device: torch.device | str | None = None) -> Candidates:
    """All cells of the given pyramid levels (each level's grid at ``patch * 2**l`` pixels),
    made on ``device`` (default: the CPU)."""
    rows, cols, lvs, shapes, offsets = [], [], [], [], []
    off = 0
    for lv in levels:
        gh, gw = pyramid.grid_shape(patch, lv)
        r, c = torch.meshgrid(torch.arange(gh, device=device), torch.arange(gw, device=device),
                              indexing="ij")
        rows.append(r.flatten())
        cols.append(c.flatten())
        lvs.append(torch.full((gh * gw,), lv, dtype=torch.int64, device=device))
        shapes.append((gh, gw))
        offsets.append(off)
        off += gh * gw
    return Candidates(torch.cat(rows), torch.cat(cols), torch.cat(lvs), tuple(levels),
                      tuple(shapes), tuple(offsets))


def cell_centers(shape: tuple[int, int], level: int, image_size: tuple[int, int],
                 patch: int = 16, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """Normalised centres ``[Gh_l * Gw_l, 2]`` (x, y) of a level's cells, clipped to [0, 1]
    exactly as :meth:`TokenSet.from_grid` places them (on ``device``, default the CPU)."""
    gh, gw = shape
    h, w = image_size
    side = patch * 2.0**level
    r, c = torch.meshgrid(torch.arange(gh, dtype=dtype, device=device),
                          torch.arange(gw, dtype=dtype, device=device), indexing="ij")
    return torch.stack([((c + 0.5) * side / w).clamp(0, 1), ((r + 0.5) * side / h).clamp(0, 1)],
                       -1).reshape(-1, 2)


def device_values(values: Sequence[float], *, dtype: torch.dtype,
                  device: torch.device | str | None = None) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype)`` made on ``device`` by fills there, one per value
    (a few values: constants such as ``(W, H)``). A host tensor copied to a GPU would be a
    blocking copy, i.e. a host sync."""
    out = torch.empty(len(values), dtype=dtype, device=device)
    for i, v in enumerate(values):                       # over the few values
        out.narrow(0, i, 1).fill_(v)
    return out


@functools.lru_cache(maxsize=64)
def stratum_ids(shape: tuple[int, int], strata: int | tuple[int, int],
                device: torch.device | str | None = None) -> tuple[torch.Tensor, int]:
    """Stratum index ``[Gh*Gw]`` of each cell for an ``sy x sx`` partition of the grid into
    (near-)equal rectangles; returns ``(ids, sy*sx)`` (ids on ``device``, default the CPU;
    cached). Every stratum is non-empty when ``sy <= Gh`` and ``sx <= Gw``."""
    gh, gw = shape
    sy, sx = (strata, strata) if isinstance(strata, int) else strata
    if not (1 <= sy <= gh and 1 <= sx <= gw):
        raise ValueError(f"strata must be in [1, {gh}] x [1, {gw}] for a {gh}x{gw} grid, "
                         f"got {sy}x{sx}")
    ry = torch.arange(gh, device=device) * sy // gh
    rx = torch.arange(gw, device=device) * sx // gw
    return (ry[:, None] * sx + rx[None, :]).flatten(), sy * sx


# ----------------------------------------------------------------------------- ranking
SECONDARY_BITS = 14  # resolution of the optional secondary key (quantised to 1/16384)
#: resolution of every ranking: values are ranked on a grid of ``scale / 2**RANK_BITS``,
#: ``scale`` the largest ``|value|`` of the map (see :func:`rank_grid`)
RANK_BITS = 16


def rank_grid(x: torch.Tensor, dim: int = -1, *, bits: int = RANK_BITS) -> torch.Tensor:
    """The values every selection ranks on: ``x`` snapped to a grid well above float noise,
    as int64 grid indices of ``x``'s shape (the one rule that keeps a choice from flipping
    on the last bit of a float sum).

    A score map is computed with float sums (pooling, band energies, a network's
    convolutions) whose rounding depends on the CPU (SIMD width, BLAS kernels): two cells
    whose exact scores tie, or differ by a few units in the last place (ulps), can come out
    in either order on another machine. Ranking on ``round(x / scale * 2**bits)``, with
    ``scale = max |x|`` over ``dim`` (finite values; 1 when all are 0), makes values within
    about ``scale * 2**-(bits + 1)`` equal (``bits = 16``: a step of 128 to 256 float32
    ulps of the largest value, well above the noise of a few rounded sums), and equal
    values are ranked by the callers' stable tie-break, the lower candidate index first
    (:func:`lex_key`). Exact ties (flat regions, integer maps, blank page areas) therefore
    stay ties on every machine.
    A value can still move to the next grid index when it lies within float noise of a
    half-step boundary (probability about noise / step); simple ratios to the scale
    (``k / m`` with small ``m``) are never on a boundary, since the grid is a power of two.

    ``+inf`` ranks above every finite value and ``NaN`` above ``+inf`` (the order of their
    IEEE bits), ``-inf`` below every finite value.

    Args:
        x: real tensor ``[..., M, ...]`` (any float dtype; integers are used as floats).
        dim: the axis whose values are compared (the scale is taken along it).
        bits: grid resolution, ``1 <= bits <= 29``.

    Returns:
        int64 ``[..., M, ...]`` in ``[-2**bits - 1, 2**bits + 2]``; its order is the order
        the selection uses (ties where the values are within the grid step).
    """
    if not 1 <= int(bits) <= 29:
        raise ValueError(f"bits must be in [1, 29], got {bits!r}")
    v = x if x.is_floating_point() else x.float()
    finite = torch.isfinite(v)
    mag = torch.where(finite, v.abs(), torch.zeros_like(v))
    scale = mag.amax(dim, keepdim=True) if v.numel() else torch.ones_like(mag)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(torch.where(finite, v, torch.zeros_like(v)) / scale * float(2**bits))
    top = float(2**bits)
    q = torch.where(v == float("inf"), top + 1, torch.where(v == float("-inf"), -top - 1, q))
    return torch.where(torch.isnan(v), top + 2, q).long()


#: pixels that a content allocator compares are read on a grid of ``2**-PIXEL_BITS``
PIXEL_BITS = 10


def pixel_grid(pixels: torch.Tensor | np.ndarray, bits: int = PIXEL_BITS):
    """``pixels`` (any shape, values in about ``[0, 1]``) rounded to a grid of
    ``2**-bits``: the pixels a content allocator compares (superpixels, patch features).

    A page's 8-bit values ``k / 255`` and their means over ``2**l x 2**l`` blocks (the
    pyramid's levels, ``l <= bits / 2``) lie at least ``2**-bits / 510`` from a rounding
    boundary of this grid (``k * 2**bits / 255`` is never within ``1 / 510`` of a
    half-integer; about 16 float32 ulps at 1.0, above the noise of a rounded mean), so
    pixels that differ only in float noise (another CPU's sums) read alike, and equal
    pixels (a blank background) stay equal. Returns the same type (tensor or array) and dtype.
    """
    step = float(2**bits)
    if isinstance(pixels, np.ndarray):
        return (np.round(pixels * step) / step).astype(pixels.dtype, copy=False)
    return torch.round(pixels * step) / step


def rank_weights(weights: torch.Tensor) -> torch.Tensor:
    """``weights [B, G]`` (>= 0) for :func:`largest_remainder` on the ranking grid: the
    :func:`rank_grid` indices along ``G`` as float64, proportional to the weights to within
    ``max(weights) / 2**17``. Weights that tie exactly (equal strata of a flat or integer
    map) stay tied on every CPU, so the remainders that decide the last units of the quotas
    never compare float noise. Negative weights become 0, as in :func:`largest_remainder`.
    """
    return rank_grid(weights.clamp(min=0)).double()


def float_key(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Order-preserving map of ``x`` to int64 in ``[0, 2**32)``: :func:`rank_grid` along
    ``dim``, shifted to be non-negative (ties where the grid makes values equal)."""
    return rank_grid(x, dim) + (2**RANK_BITS + 1)


def _secondary_key(sec: torch.Tensor) -> torch.Tensor:
    if not sec.dtype.is_floating_point:
        return sec.long().clamp(0, 2**SECONDARY_BITS - 1)
    lo = sec.amin(-1, keepdim=True)
    span = (sec.amax(-1, keepdim=True) - lo).clamp(min=1e-30)
    return ((sec - lo) / span * (2**SECONDARY_BITS - 1)).round().long()


def _tier_fits(tb: int, tier_max: int | None) -> bool:
    """Whether tiers in ``[0, tier_max]`` fit in ``tb`` key bits (a static decision)."""
    return tier_max is not None and tb >= 1 and 0 <= tier_max < 2**tb


def lex_key(priority: torch.Tensor, tier: torch.Tensor | None = None,
            secondary: torch.Tensor | None = None, *, tier_max: int | None = None
            ) -> torch.Tensor | None:
    """One int64 key per candidate ``[B, M]`` whose descending order is the lexicographic
    order (tier desc, priority desc, secondary desc, index asc); keys are unique.

    ``priority`` enters on the rounding-robust grid of :func:`rank_grid` (per image, along
    the candidates: values within the grid step tie and go to the lower index); ``secondary``
    (optional) is quantised to ``SECONDARY_BITS`` bits over its per-image range (integers
    are used as they are); ``tier`` is a small non-negative int. Returns ``None`` when the
    bits do not fit in 63 (then callers use the multi-sort path, :func:`order_lex`).

    ``tier_max``: the caller's static bound ``0 <= tier <= tier_max``. When it fits the key's
    tier bits the decision is made from shapes alone (no host sync); without it, or when it
    does not fit (grids of more than ~2**15 cells with a secondary key), the actual
    ``tier.min()`` / ``tier.max()`` decide (a host sync on a device). Both give the same key
    whenever the tiers fit.
    """
    b, m = priority.shape[0], priority.shape[-1]
    ib = max(1, int(m - 1).bit_length())
    sb = SECONDARY_BITS if secondary is not None else 0
    tb = 63 - 32 - ib - sb
    idx = m - 1 - torch.arange(m, device=priority.device)
    key = (float_key(priority.expand(b, m)) << (sb + ib)) | idx
    if secondary is not None:
        key = key | (_secondary_key(secondary.expand(b, m)) << ib)
    if tier is not None:
        t = tier.expand(b, m).long()
        if not _tier_fits(tb, tier_max) and (
                tb < 1 or int(t.max()) >= 2**tb or int(t.min()) < 0):
            return None
        key = key | (t << (32 + sb + ib))
    elif tb < 0:
        return None
    return key


def _order_sorts(keys: Sequence[torch.Tensor]) -> torch.Tensor:
    """Stable multi-sort fallback of :func:`lex_key` (float keys on :func:`rank_grid`)."""
    b, m = keys[0].shape[0], keys[-1].shape[-1]
    perm = torch.arange(m, device=keys[-1].device).expand(b, m)
    for key in reversed(list(keys)):
        key = key.expand(b, m)
        key = rank_grid(key) if key.is_floating_point() else key
        k = key.gather(1, perm)
        perm = perm.gather(1, torch.sort(k, dim=1, descending=True, stable=True).indices)
    return perm


def order_lex(keys: Sequence[torch.Tensor], *, tier_max: int | None = None) -> torch.Tensor:
    """Permutation ``[B, M]`` sorting by ``[tier, priority]`` or ``[tier, priority,
    secondary]`` (all descending, then index ascending); see :func:`lex_key` (and its
    ``tier_max``)."""
    key = lex_key(keys[1], keys[0], keys[2] if len(keys) > 2 else None, tier_max=tier_max)
    if key is None:
        return _order_sorts(list(keys[:2]) + [_secondary_key(k) for k in keys[2:]])
    return torch.sort(key, dim=1, descending=True).indices


def order(priority: torch.Tensor, tier: torch.Tensor | None = None, *,
          tier_max: int | None = None) -> torch.Tensor:
    """Permutation ``[B, M]`` sorting candidates by (tier desc, priority desc, index asc).

    Deterministic: ties break towards the lower index (keys are made unique by
    :func:`lex_key`; a stable multi-sort fallback gives the same order). ``tier_max``: see
    :func:`lex_key`.
    """
    key = lex_key(priority, tier, tier_max=tier_max)
    if key is None:
        return _order_sorts([priority] if tier is None else [tier, priority])
    return torch.sort(key, dim=1, descending=True).indices


def select(priority: torch.Tensor, budget: int, tier: torch.Tensor | None = None,
           secondary: torch.Tensor | None = None, base_key: torch.Tensor | None = None,
           *, tier_max: int | None = None) -> torch.Tensor:
    """Indices ``[B, budget]`` of the first ``budget`` candidates in the order of
    :func:`lex_key` (one ``topk`` on unique int64 keys; the returned order is unspecified).
    ``base_key`` = ``lex_key(priority)`` already computed by the caller (reused when there is
    no ``secondary``). ``tier_max``: the static bound of ``tier`` (:func:`lex_key`); with it
    the selection reads no data on the host."""
    if budget > priority.shape[-1]:
        raise ValueError(f"budget {budget} exceeds the {priority.shape[-1]} candidates")
    if base_key is not None and secondary is None and (
            tier is None or (tier_max is not None and 0 <= tier_max <= 1)
            or int(tier.max()) <= 1) and int(priority.shape[-1] - 1).bit_length() <= 30:
        ib = max(1, int(priority.shape[-1] - 1).bit_length())
        key = base_key if tier is None else base_key | (tier.long() << (32 + ib))
    else:
        key = lex_key(priority, tier, secondary, tier_max=tier_max)
    if key is None:
        keys = [tier if tier is not None else torch.zeros_like(priority, dtype=torch.long), priority]
        return _order_sorts(keys + ([_secondary_key(secondary.expand_as(priority))]
                                    if secondary is not None else []))[:, :budget]
    return torch.topk(key, budget, dim=1, sorted=False).indices


def rank_of(priority: torch.Tensor, tier: torch.Tensor | None = None, *,
            tier_max: int | None = None) -> torch.Tensor:
    """Position ``[B, M]`` of each candidate in :func:`order` (0 = first)."""
    perm = order(priority, tier, tier_max=tier_max)
    rank = torch.empty_like(perm)
    rank.scatter_(1, perm, torch.arange(perm.shape[1], device=perm.device).expand_as(perm))
    return rank


def group_best(priority: torch.Tensor, group: torch.Tensor, num_groups: int,
               tier: torch.Tensor | None = None, *, tier_max: int | None = None
               ) -> torch.Tensor:
    """``[B, M]`` bool: the candidate is the first of its group in :func:`order` (one
    ``scatter_reduce(amax)`` of the unique keys, no sort)."""
    key = lex_key(priority, tier, tier_max=tier_max)
    if key is None:
        return group_rank(priority, group, num_groups, tier, tier_max=tier_max) == 0
    b, m = key.shape
    g = group.expand(b, m).long()
    best = torch.full((b, num_groups), -1, dtype=torch.long, device=key.device).scatter_reduce(
        1, g, key, "amax")
    return best.gather(1, g) == key


@functools.lru_cache(maxsize=64)
def _group_layout(shape: tuple[int, int], strata: int,
                  device: torch.device | str | None = None) -> torch.Tensor | None:
    """Cell order ``[M]`` that makes every stratum contiguous (row-major inside), or
    ``None`` when the strata are not all the same size (decided from the shape alone)."""
    gh, gw = shape
    gid, ng = stratum_ids(shape, strata, device)
    sy, sx = (strata, strata) if isinstance(strata, int) else strata
    rows = [sum(1 for i in range(gh) if i * sy // gh == k) for k in range(sy)]
    cols = [sum(1 for j in range(gw) if j * sx // gw == k) for k in range(sx)]
    if len(set(rows)) > 1 or len(set(cols)) > 1:
        return None
    return torch.sort(gid, stable=True).indices


def top_per_stratum(priority: torch.Tensor, shape: tuple[int, int], strata: int,
                    quota: torch.Tensor, key: torch.Tensor | None = None,
                    max_quota: int | None = None) -> torch.Tensor:
    """``[B, M]`` bool: the best ``quota[b, g]`` cells of every stratum ``g`` (order of
    :func:`order`); the same set as ``group_rank(...) < quota[:, gid]``.

    With equal-size strata the cells are laid out ``[B, G, S]`` and the ``k`` best keys of
    each stratum (one ``topk``, or one sort when ``k = S``) give its threshold key for every
    quota up to ``k``; otherwise :func:`group_rank` is used. On a device ``k`` comes from the
    shapes, never from the quotas' values: ``min(S, max_quota)``, where ``max_quota`` is the
    caller's static bound on every quota (default: none, ``k = S``); on the host
    (:func:`~fovea_core.tokens.on_host`) it is the largest quota, a smaller ``topk`` with the
    same thresholds.
    """
    gid, ng = stratum_ids(shape, strata, priority.device)
    perm = _group_layout(shape, strata, priority.device)
    key = lex_key(priority) if key is None else key
    if perm is None or key is None:
        return group_rank(priority, gid, ng) < quota[:, gid]
    b, m = key.shape
    k = m // ng if max_quota is None else max(1, min(m // ng, max_quota))
    if on_host(quota):                # free to read on the host: k = the largest quota
        k = max(int(quota.clamp(0, k).max()), 1)
    q = quota.clamp(0, k)
    cells = key[:, perm].view(b, ng, m // ng)
    top = (torch.sort(cells, dim=-1, descending=True).values if k == m // ng
           else torch.topk(cells, k, dim=-1).values)                              # [B, G, k]
    thr = top.gather(-1, (q - 1).clamp(min=0)[..., None])[..., 0]                # [B, G]
    return (key >= thr[:, gid]) & (q[:, gid] > 0)


def group_rank(priority: torch.Tensor, group: torch.Tensor, num_groups: int,
               tier: torch.Tensor | None = None, *, tier_max: int | None = None
               ) -> torch.Tensor:
    """Rank ``[B, M]`` of each candidate within its group (0 = best), by (tier desc,
    priority desc, index asc). ``group`` is ``[M]`` or ``[B, M]`` in ``[0, num_groups)``.

    One sort of the int64 key (group asc, :func:`lex_key` desc) when it fits in 63 bits
    (decided from the key's static width: ``32 + log2 M`` bits, plus the tier's with
    ``tier_max``), else a sort of ``group * M + rank``; both give the same ranks.
    """
    b, m = priority.shape
    g = group.expand(b, m).long()
    key = lex_key(priority, tier, tier_max=tier_max)
    gbits = max(1, int(num_groups - 1).bit_length())
    ib = max(1, int(m - 1).bit_length())
    if key is None:
        kbits = 64                                  # no key: the rank path below
    elif tier is not None and tier_max is None:
        kbits = int(key.max()).bit_length()         # no static bound: read it (host sync)
    else:
        kbits = 32 + ib + (0 if tier is None else max(int(tier_max), 0).bit_length())
    if key is not None and kbits + gbits <= 63:
        srt = torch.sort((g << kbits) - key, dim=1).indices
    else:
        grank = rank_of(priority, tier, tier_max=tier_max)
        srt = torch.sort(g * m + grank, dim=1).indices       # cells sorted by (group, rank)
    counts = torch.zeros(b, num_groups, dtype=torch.long, device=g.device).scatter_add_(
        1, g, torch.ones_like(g))
    start = torch.cumsum(counts, 1) - counts                 # first position of each group
    pos = torch.empty_like(srt)
    pos.scatter_(1, srt, torch.arange(m, device=srt.device).expand(b, m))  # position in srt
    return pos - start.gather(1, g)


def _sum_like_numpy(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last axis in numpy's pairwise order (``np.add.reduce`` on a contiguous
    axis: blocks of 8 accumulators up to 128 items, halves beyond), so a float64 sum is
    bit-identical to numpy's. Vectorised over the leading axes; the loop is over blocks."""
    n = x.shape[-1]
    if n < 8:
        res = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
        for i in range(n):
            res = res + x[..., i]
        return res
    if n <= 128:
        r = x[..., :8]
        i = 8
        while i < n - n % 8:
            r = r + x[..., i:i + 8]
            i += 8
        res = ((r[..., 0] + r[..., 1]) + (r[..., 2] + r[..., 3])) + \
              ((r[..., 4] + r[..., 5]) + (r[..., 6] + r[..., 7]))
        for j in range(i, n):
            res = res + x[..., j]
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _sum_like_numpy(x[..., :n2]) + _sum_like_numpy(x[..., n2:])


def largest_remainder(weights: torch.Tensor, total: int | torch.Tensor, minimum: int = 0,
                      capacity: torch.Tensor | None = None) -> torch.Tensor:
    """Integer quotas ``[B, G]`` proportional to ``weights`` (>= 0) that sum to ``total``.

    Each group first gets ``minimum``; the remaining ``total - minimum*G`` is split by
    Hamilton's largest-remainder method (ties to the lower group index). Equal weights when
    a row of weights sums to zero. With ``capacity``, quotas are clipped to it (the sum can
    then fall short; callers fill the rest).

    The torch twin of :func:`fovea_book.biology.cortex.hamilton` (the rule shared with
    the biology code), on ``weights``' device and without host syncs: the same float64
    steps in the same order (the weight sum in numpy's pairwise order), so the quotas are
    identical (``tests/test_allocators_device.py`` compares the two). Returns int64.

    Raises:
        ValueError: naming ``weights`` (empty, NaN/inf), ``total`` (negative or not an
            integer) or ``minimum`` (negative); on a device the value checks are queued
            (:func:`~fovea_core.tokens.require`).
    """
    w = torch.as_tensor(weights).detach().double()
    if w.ndim == 0 or w.shape[-1] == 0:
        raise ValueError(f"weights must have a non-empty last axis [..., G], got shape "
                         f"{tuple(w.shape)}")
    require(torch.isfinite(w), "weights must be finite (no NaN/inf)")
    if isinstance(total, torch.Tensor):
        t = total.detach().to(w.device, torch.float64)
        require(torch.isfinite(t) & (t >= 0) & (t == torch.floor(t)),
                "total must be a non-negative integer (per row)",
                detail=lambda: f"total must be a non-negative integer (per row), got {total!r}")
    else:                                     # host data: checked on the host, as numpy does
        tn = np.asarray(total, dtype=np.float64)
        if not np.all(np.isfinite(tn)) or np.any(tn < 0) or np.any(tn != np.floor(tn)):
            raise ValueError(f"total must be a non-negative integer (per row), got {total!r}")
        t = (torch.full((), float(tn), dtype=torch.float64, device=w.device) if tn.ndim == 0
             else torch.from_numpy(tn).to(w.device, non_blocking=True))
    if int(minimum) != minimum or minimum < 0:
        raise ValueError(f"minimum must be a non-negative integer, got {minimum!r}")
    g = w.shape[-1]
    rest = (t.expand(w.shape[:-1]) - minimum * g).clamp(min=0.0)
    w = w.clamp(min=0.0)
    wsum = _sum_like_numpy(w)[..., None]
    share = torch.where(wsum > 0, w / torch.where(wsum > 0, wsum, 1.0), 1.0 / g)
    quota = share * rest[..., None]
    base = torch.floor(quota)
    left = torch.round(rest - base.sum(-1)).long()                     # 0 <= left < G
    order_ = torch.sort(-(quota - base), dim=-1, stable=True).indices  # largest remainder first
    rank = torch.empty_like(order_).scatter_(
        -1, order_, torch.arange(g, device=w.device).expand_as(order_))
    q = base.long() + (rank < left[..., None]) + int(minimum)
    return q if capacity is None else torch.minimum(q, capacity.to(w.device, torch.long))


# ----------------------------------------------------------------------------- output
def cells_to_tokens(cand: Candidates, idx: torch.Tensor, priority: torch.Tensor,
                    image_size: tuple[int, int], fixation: torch.Tensor, patch: int = 16
                    ) -> TokenSet:
    """TokenSet of candidates ``idx [B, N]``, sorted per image by candidate index (canonical
    order: level-major, row-major), scores taken from ``priority [B, M]``."""
    idx = torch.sort(idx, dim=1).values
    sc = priority.gather(1, idx)
    sc = torch.nan_to_num(sc, nan=0.0, posinf=0.0, neginf=0.0)
    fix = fixation if fixation.ndim == 3 else fixation[:, None, :]
    return TokenSet.from_grid(cand.rows[idx], cand.cols[idx], cand.levels[idx],
                              image_size=image_size, patch=patch, scores=sc, fixations=fix)
