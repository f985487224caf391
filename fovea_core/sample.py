"""Torch reference samplers: foveated patch gather, foveated rendering, LUT remap.

These are the readable, vectorised references that the CUDA / g++ kernels in ``cuda/`` are
tested against (``tests/test_kernels.py``). They run on any torch device.

Coordinate conventions (shared with :mod:`fovea_core.tokens` and ``cuda/fovea_kernels.cuh``):

* Normalised token centres ``(x, y)`` in ``[0, 1]``; base pixel ``i`` spans ``[i, i+1)``,
  so the *continuous* base coordinate of a centre is ``X = x * W``.
* Mip level ``m`` (``cv2.pyrDown`` applied ``m`` times, see :mod:`fovea_core.pyramid`) has
  pixel ``j`` spanning base ``[j 2^m, (j+1) 2^m)``; a continuous base coordinate ``X`` is at
  *index* coordinate ``X / 2^m - 0.5`` of level ``m`` (pixel ``j``'s centre at index ``j``,
  the OpenCV convention).
* A token of (possibly fractional) level ``lod`` samples a ``p x p`` grid whose spacing is
  ``2**lod`` base pixels, i.e. one level-``lod`` pixel, centred on the token centre:
  sample ``k`` (``0 <= k < p``) lies at ``X_k = X + (k - (p - 1) / 2) * 2**lod``.
  For an integer level ``l`` this is bilinear sampling of level ``l``; for a grid-aligned
  token it reads exactly the level-``l`` pixels of its cell (no interpolation).
  A fractional ``lod`` (trilinear mode) samples the same base positions in levels
  ``floor(lod)`` and ``floor(lod) + 1`` and blends them linearly (OpenGL-style mip mapping).
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F

from fovea_core.pyramid import Pyramid
from fovea_core.tokens import LEVEL_QUANTUM, TokenSet

__all__ = ["check_sample_args", "remap", "sample", "sample_positions", "render"]


# --------------------------------------------------------------------------- remap (LUT)
def remap(image: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """Bilinear look-up-table sampling, the torch twin of ``cv2.remap`` (BORDER_CONSTANT 0).

    Args:
        image: ``[B, C, H, W]`` float tensor.
        lut: ``[B or 1, Ho, Wo, 2]`` float; ``lut[..., 0]`` is x (column), ``lut[..., 1]`` y
            (row), in OpenCV pixel coordinates (pixel ``i``'s centre at coordinate ``i``).

    Returns:
        ``[B, C, Ho, Wo]``: ``out[b, c, i, j] = sum_taps w * image[b, c, yi, xi]`` over the
        four neighbours of ``lut[b, i, j]`` with bilinear weights; a tap outside the image
        contributes zero (``cv2.BORDER_CONSTANT`` with value 0), so the output fades to 0 over
        the half pixel beyond the border. Unlike ``cv2.remap`` (5-bit fixed-point weights),
        the weights are exact float32.
    """
    if image.ndim != 4:
        raise ValueError(f"image must be [B, C, H, W], got {tuple(image.shape)}")
    if lut.ndim != 4 or lut.shape[-1] != 2 or lut.shape[0] not in (1, image.shape[0]):
        raise ValueError(f"lut must be [B or 1, Ho, Wo, 2] with B = {image.shape[0]}, "
                         f"got {tuple(lut.shape)}")
    b, c, h, w = image.shape
    lut = lut.to(device=image.device, dtype=torch.float32).expand(b, -1, -1, -1)
    ho, wo = lut.shape[1:3]
    x, y = lut[..., 0].reshape(b, -1), lut[..., 1].reshape(b, -1)
    x0, y0 = torch.floor(x), torch.floor(y)
    fx, fy = x - x0, y - y0
    x0, y0 = x0.long(), y0.long()
    flat = image.reshape(b, c, h * w)
    out = image.new_zeros(b, c, ho * wo)
    for dy, wy in ((0, 1 - fy), (1, fy)):
        for dx, wx in ((0, 1 - fx), (1, fx)):
            xi, yi = x0 + dx, y0 + dy
            ok = (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
            idx = (yi.clamp(0, h - 1) * w + xi.clamp(0, w - 1))[:, None, :].expand(b, c, -1)
            out += torch.gather(flat, 2, idx) * (wx * wy * ok)[:, None, :].to(image.dtype)
    return out.reshape(b, c, ho, wo)


# --------------------------------------------------------------------------- patch gather
def sample_positions(tokens: TokenSet, patch: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Continuous base-pixel sample positions of every token, ``([B,N,p], [B,N,p])`` (X, Y).

    ``X_k = x W + (k - (p - 1)/2) 2**level`` (``level`` may be fractional).
    """
    p = tokens.patch if patch is None else int(patch)
    h, w = tokens.image_size
    step = torch.exp2(tokens.levels)[..., None]                             # [B, N, 1]
    k = torch.arange(p, device=tokens.device, dtype=torch.float32) - (p - 1) / 2
    xs = tokens.centers[..., 0:1] * w + k * step
    ys = tokens.centers[..., 1:2] * h + k * step
    return xs, ys


def _bilinear_clamped(level: torch.Tensor, bidx: torch.Tensor, u: torch.Tensor,
                      v: torch.Tensor) -> torch.Tensor:
    """Clamp-to-edge bilinear read of ``level [B,C,H,W]`` at index coords ``u, v [M, p]``.

    Returns ``[M, C, p, p]`` (rows from ``v``, columns from ``u``; separable grid).
    """
    _, _, h, w = level.shape
    u = u.clamp(0, w - 1)
    v = v.clamp(0, h - 1)
    x0, y0 = torch.floor(u), torch.floor(v)
    fx, fy = (u - x0)[:, None, :], (v - y0)[:, :, None]                    # [M,1,p], [M,p,1]
    x0, y0 = x0.long(), y0.long()
    x1, y1 = (x0 + 1).clamp(max=w - 1), (y0 + 1).clamp(max=h - 1)
    bb = bidx[:, None, None]

    def tap(yy: torch.Tensor, xx: torch.Tensor) -> torch.Tensor:            # -> [M, p, p, C]
        return level[bb, :, yy[:, :, None], xx[:, None, :]]

    top = tap(y0, x0) * (1 - fx)[..., None] + tap(y0, x1) * fx[..., None]
    bot = tap(y1, x0) * (1 - fx)[..., None] + tap(y1, x1) * fx[..., None]
    out = top * (1 - fy)[..., None] + bot * fy[..., None]
    return out.permute(0, 3, 1, 2)


def check_sample_args(pyramid: Pyramid, tokens: TokenSet, patch: int | None) -> int:
    """Validate :func:`sample`'s arguments (shared with the kernels); return ``p``."""
    if not isinstance(pyramid, Pyramid):
        raise TypeError(f"pyramid must be a fovea_core Pyramid, got {type(pyramid).__name__}")
    if not isinstance(tokens, TokenSet):
        raise TypeError(f"tokens must be a fovea_core TokenSet, got {type(tokens).__name__}")
    p = tokens.patch if patch is None else patch
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"patch must be an int >= 1, got {p!r}")
    b = tokens.batch_size
    if pyramid.batch_size != b:
        raise ValueError(f"pyramid batch {pyramid.batch_size} != tokens batch {b}")
    if tuple(pyramid.image_size) != tuple(tokens.image_size):
        raise ValueError(f"pyramid image_size {pyramid.image_size} != tokens.image_size "
                         f"{tokens.image_size}")
    top = pyramid.num_levels - 1
    lmax = float(tokens.levels.max())
    if lmax > top:
        raise ValueError(f"tokens.levels must lie in [0, {top}] (the pyramid has "
                         f"{pyramid.num_levels} levels), got a level {lmax:g}")
    return p


def sample(pyramid: Pyramid, tokens: TokenSet, patch: int | None = None) -> torch.Tensor:
    """Read every token's ``p x p`` patch from the pyramid: ``[B, N, C, p, p]``.

    Token ``n`` of image ``b`` at level ``l`` and centre ``(x, y)`` samples a ``p x p`` grid
    with spacing ``2**l`` base pixels (one level-``l`` pixel; ``p * 2**l`` base pixels in
    all) centred on ``(x W, y H)``, with **clamp-to-edge** (replicate) borders: a sample
    outside the image takes the value of the nearest edge pixel. See the module docstring
    for the exact coordinate formula.

    * Integer ``l``: bilinear in mip level ``l``. Grid-aligned tokens
      (``TokenSet.from_grid``) read pixels exactly (no interpolation).
    * Fractional ``l`` (any scale): **trilinear**, the OpenGL mip-mapping rule
      [Williams 1983]: the same base positions read bilinearly in levels ``floor(l)`` and
      ``floor(l) + 1`` and blended with weights ``1 - frac`` and ``frac``. The pyramid's
      levels are low-pass filtered before decimation, so the blend of two filtered levels
      approximates an area resample at scale ``2**-l`` (anti-aliased); the test
      ``test_fractional_level_matches_area_resample`` checks it against ``cv2.resize``
      with ``INTER_AREA`` and shows that reading level ``floor(l)`` alone aliases.

    Args:
        pyramid: :class:`~fovea_core.pyramid.Pyramid` with levels ``[B, C, H_l, W_l]``.
        tokens: :class:`~fovea_core.tokens.TokenSet` with the same ``B`` and ``image_size``,
            levels in ``[0, pyramid.num_levels - 1]``.
        patch: samples per side; default ``tokens.patch``.

    Vectorised: one batched gather per pyramid level used, never a loop over tokens.
    """
    p = check_sample_args(pyramid, tokens, patch)
    b, n = tokens.levels.shape
    nl = pyramid.num_levels
    dev = pyramid.base.device
    tok = tokens.to(dev)
    xs, ys = sample_positions(tok, p)                                       # [B, N, p]
    lod = tok.levels
    lo = torch.floor(lod).long().clamp(max=nl - 1)
    frac = lod - lo.float()
    out = pyramid.base.new_zeros(b * n, pyramid.channels, p, p)
    xs, ys, lo, frac = xs.reshape(b * n, p), ys.reshape(b * n, p), lo.reshape(-1), frac.reshape(-1)
    bidx = torch.arange(b, device=dev).repeat_interleave(n)
    for m in range(nl):
        # tokens reading level m: as the lower level (weight 1-frac) or the upper (weight frac)
        for sel, wgt in ((lo == m, 1 - frac), ((lo == m - 1) & (frac > 0), frac)):
            idx = sel.nonzero().squeeze(1)
            if idx.numel() == 0:
                continue
            s = 2.0 ** m
            vals = _bilinear_clamped(pyramid.levels[m], bidx[idx], xs[idx] / s - 0.5,
                                     ys[idx] / s - 0.5)
            out.index_add_(0, idx, vals * wgt[idx, None, None, None])
    return out.reshape(b, n, pyramid.channels, p, p)


# --------------------------------------------------------------------------- render
#: bits of the render priority key below the level: the token index (lowest wins a tie)
_KEY_TOKEN_BITS = 20


def _check_size(size: tuple[int, int] | None, default: tuple[int, int]) -> tuple[int, int]:
    """``size`` as two positive ints (``default`` when ``None``); ValueError naming ``size``."""
    if size is None:
        return default
    try:
        ho, wo = (operator.index(v) for v in size)
    except (TypeError, ValueError):
        raise ValueError(f"size must be (H, W) with two positive ints, got {size!r}") from None
    if ho < 1 or wo < 1:
        raise ValueError(f"size must be (H, W) with H, W >= 1, got {size!r}")
    return ho, wo


def render(tokens: TokenSet, patches: torch.Tensor, size: tuple[int, int] | None = None, *,
           background: Pyramid | torch.Tensor | None = None) -> torch.Tensor:
    """Foveated reconstruction: paint every token's patch over its footprint, ``[B, C, H, W]``.

    Token ``n`` (centre ``(X, Y)`` in base pixels, level ``l``, footprint ``f = p 2**l``)
    covers the base-pixel square ``[X - f/2, X + f/2) x [Y - f/2, Y + f/2)``; sample
    ``(k_y, k_x)`` of its patch fills the sub-square of side ``2**l`` at
    ``k = floor((coord - (X - f/2)) / 2**l)`` (nearest-neighbour upsampling; any level,
    integer or not, and off-grid centres are placed exactly). An output pixel shows the
    covering token of the **finest level** (among equal levels the lowest index), so coarse
    context lies under fine detail. Pixels no token covers show the background.

    Implementation (vectorised, no loop over tokens or levels): every (token, covered output
    pixel) pair is enumerated once (``repeat_interleave`` over the footprints), a priority
    key (level, then index) is reduced per pixel with ``scatter_reduce(amin)``, and the
    winner's sample is gathered. Work and memory ``O(sum of footprint areas)`` in output
    pixels (a few times ``H W`` for the allocators of this package).

    Args:
        tokens: the :class:`TokenSet` (``B`` images, ``N`` tokens).
        patches: ``[B, N, C, p, p]`` from :func:`sample` (or a kernel), ``p = tokens.patch``.
        size: output ``(H, W)`` (positive ints); default ``tokens.image_size``. Footprints
            are scaled to it.
        background: fills the gaps. A :class:`Pyramid` of the same images (its levels must
            include every token's level): its **coarsest level**, bilinearly upsampled; a
            tensor ``[B, C, h, w]``: resized bilinearly; ``None``: each image's mean token
            colour.
    """
    if not isinstance(patches, torch.Tensor) or patches.ndim != 5 \
            or tuple(patches.shape[:2]) != tuple(tokens.levels.shape):
        shape = tuple(patches.shape) if isinstance(patches, torch.Tensor) else type(patches)
        raise ValueError(f"patches must be [B, N, C, p, p] with [B, N] = "
                         f"{tuple(tokens.levels.shape)}, got {shape}")
    b, n, c, p, p2 = patches.shape
    if p != p2 or p != tokens.patch:
        raise ValueError(f"patches must be p x p with p = tokens.patch = {tokens.patch}, "
                         f"got {p}x{p2}")
    h, w = tokens.image_size
    ho, wo = _check_size(size, (h, w))
    dev = patches.device
    if isinstance(background, Pyramid):
        if background.batch_size != b or tuple(background.image_size) != (h, w):
            raise ValueError(f"background pyramid must hold the same {b} image(s) of size "
                             f"{(h, w)}, got batch {background.batch_size}, size "
                             f"{background.image_size}")
        lmax = float(tokens.levels.max())
        if lmax > background.num_levels - 1:
            raise ValueError(f"tokens.levels must lie in [0, {background.num_levels - 1}] "
                             f"(the background pyramid's levels), got a level {lmax:g}")
        background = background.levels[-1]
    if background is None:
        out = patches.mean(dim=(1, 3, 4))[:, :, None, None].expand(b, c, ho, wo).clone()
    else:
        if not isinstance(background, torch.Tensor) or background.ndim != 4 \
                or tuple(background.shape[:2]) != (b, c):
            shape = tuple(background.shape) if isinstance(background, torch.Tensor) else \
                type(background)
            raise ValueError(f"background must be a Pyramid or [B, C, h, w] = [{b}, {c}, ...], "
                             f"got {shape}")
        out = F.interpolate(background.to(dev, patches.dtype), size=(ho, wo), mode="bilinear",
                            align_corners=False)
    if n >= 2**_KEY_TOKEN_BITS:
        raise ValueError(f"render supports N < {2**_KEY_TOKEN_BITS} tokens, got {n}")
    tok = tokens.to(dev)
    sy, sx = ho / h, wo / w                                       # output px per base px
    step = torch.exp2(tok.levels).flatten()                       # [B*N] base px per sample
    half = p * step / 2
    cx, cy = tok.centers[..., 0].flatten() * w, tok.centers[..., 1].flatten() * h
    x0, y0 = cx - half, cy - half                                 # footprint corner (base px)
    # covered output pixels: centre (j + .5) / sx in [x0, x0 + f)  <=>  j in [j0, j1)
    j0 = torch.ceil(x0 * sx - 0.5).clamp(0, wo).long()
    j1 = torch.ceil((cx + half) * sx - 0.5).clamp(0, wo).long()
    i0 = torch.ceil(y0 * sy - 0.5).clamp(0, ho).long()
    i1 = torch.ceil((cy + half) * sy - 0.5).clamp(0, ho).long()
    nx = j1 - j0
    cnt = nx * (i1 - i0)                                          # [B*N] covered pixels
    # per token: first covered pixel (flat), row length, priority key (finest level, then
    # lowest index); every (token, pixel) pair is then one element of a flat enumeration
    img = torch.arange(b, device=dev).repeat_interleave(n)
    start = (img * ho + i0) * wo + j0
    lq = torch.round(tok.levels.flatten() * LEVEL_QUANTUM).long()
    tkey = lq * 2**_KEY_TOKEN_BITS + torch.arange(n, device=dev).repeat(b)
    owner = torch.repeat_interleave(torch.arange(b * n, device=dev), cnt)       # [E]
    sel = lambda t: t.index_select(0, owner)                                   # noqa: E731
    off = torch.arange(owner.numel(), device=dev) - sel(torch.cumsum(cnt, 0) - cnt)
    rowlen = sel(nx.clamp(min=1))
    r = torch.div(off, rowlen, rounding_mode="floor")
    pix = sel(start) + r * wo + (off - r * rowlen)
    best = torch.full((b * ho * wo,), torch.iinfo(torch.int64).max, dtype=torch.int64,
                      device=dev)
    best.scatter_reduce_(0, pix, sel(tkey), reduce="amin", include_self=True)
    hit = (best != torch.iinfo(torch.int64).max).nonzero().squeeze(1)          # covered pixels
    win = best.index_select(0, hit) % 2**_KEY_TOKEN_BITS                       # token index
    pb = torch.div(hit, ho * wo, rounding_mode="floor")
    rem = hit - pb * (ho * wo)
    prow = torch.div(rem, wo, rounding_mode="floor")
    pcol = rem - prow * wo
    flat = pb * n + win
    stp = step.index_select(0, flat)
    kx = torch.floor(((pcol.float() + 0.5) / sx - x0.index_select(0, flat)) / stp)
    ky = torch.floor(((prow.float() + 0.5) / sy - y0.index_select(0, flat)) / stp)
    src = (flat * p + ky.long().clamp(0, p - 1)) * p + kx.long().clamp(0, p - 1)
    vals = patches.permute(0, 1, 3, 4, 2).reshape(-1, c).index_select(0, src)  # [P, C]
    out = out.permute(0, 2, 3, 1).reshape(-1, c).clone()
    out.index_copy_(0, hit, vals.to(out.dtype))
    return out.reshape(b, ho, wo, c).permute(0, 3, 1, 2).contiguous()
