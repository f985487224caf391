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

import torch
import torch.nn.functional as F

from fovea_core.pyramid import Pyramid
from fovea_core.tokens import TokenSet

__all__ = ["remap", "sample", "sample_positions", "render"]


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
def sample_positions(tokens: TokenSet, patch: int | None = None,
                     lod: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Continuous base-pixel sample positions of every token, ``([B,N,p], [B,N,p])`` (X, Y).

    ``X_k = x W + (k - (p - 1)/2) 2**lod``; ``lod`` defaults to ``tokens.levels``.
    """
    p = tokens.patch if patch is None else int(patch)
    lod = tokens.levels.float() if lod is None else lod.float()
    h, w = tokens.image_size
    step = torch.pow(2.0, lod)[..., None]                                   # [B, N, 1]
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


def sample(pyramid: Pyramid, tokens: TokenSet, patch: int | None = None, *,
           lod: torch.Tensor | None = None) -> torch.Tensor:
    """Read every token's ``p x p`` patch from the pyramid: ``[B, N, C, p, p]``.

    Token ``n`` of image ``b`` at level ``l`` and centre ``(x, y)`` samples a ``p x p`` grid
    with spacing one level-``l`` pixel (``p * 2**l`` base pixels in all) centred on
    ``(x W, y H)``, bilinear, with **clamp-to-edge** (replicate) borders: a sample outside
    level ``l`` takes the value of the nearest edge pixel. See the module docstring for the
    exact coordinate formula. Grid-aligned tokens (``TokenSet.from_grid``) read pixels exactly.

    Args:
        pyramid: :class:`~fovea_core.pyramid.Pyramid` with levels ``[B, C, H_l, W_l]``.
        tokens: :class:`~fovea_core.tokens.TokenSet` with the same ``B`` and ``image_size``.
        patch: samples per side; default ``tokens.patch``.
        lod: optional fractional level ``[B, N]`` (trilinear between ``floor`` and
            ``floor + 1``); default ``tokens.levels`` (pure bilinear).

    Vectorised: one batched gather per pyramid level used, never a loop over tokens.
    """
    p = tokens.patch if patch is None else int(patch)
    if p < 1:
        raise ValueError(f"patch must be >= 1, got {p}")
    b, n = tokens.levels.shape
    if pyramid.batch_size != b:
        raise ValueError(f"pyramid batch {pyramid.batch_size} != tokens batch {b}")
    if tuple(pyramid.image_size) != tuple(tokens.image_size):
        raise ValueError(f"pyramid image_size {pyramid.image_size} != tokens.image_size "
                         f"{tokens.image_size}")
    nl = pyramid.num_levels
    lod_t = tokens.levels.float() if lod is None else lod.to(torch.float32)
    if lod_t.shape != (b, n):
        raise ValueError(f"lod must be [B, N] = [{b}, {n}], got {tuple(lod_t.shape)}")
    if lod_t.min() < 0 or lod_t.max() > nl - 1:
        raise ValueError(f"token levels must lie in [0, {nl - 1}] (pyramid has {nl} levels), "
                         f"got [{float(lod_t.min())}, {float(lod_t.max())}]")
    dev = pyramid.base.device
    xs, ys = sample_positions(tokens.to(dev), p, lod_t.to(dev))              # [B, N, p]
    lo = torch.floor(lod_t).long().clamp(max=nl - 1).to(dev)
    frac = (lod_t.to(dev) - lo.float())
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
def render(tokens: TokenSet, patches: torch.Tensor, size: tuple[int, int] | None = None, *,
           background: Pyramid | torch.Tensor | None = None) -> torch.Tensor:
    """Foveated reconstruction: paint every token's patch over its footprint, ``[B, C, H, W]``.

    Each token's ``p x p`` patch is painted over its square footprint (``p * 2**level`` base
    pixels; each sample becomes a ``2**level`` block, nearest-neighbour), **coarse levels
    first, finer levels on top**; pixels no token covers show the background.

    Implementation (vectorised): per level ``l`` the patches are scattered into a canvas at
    level-``l`` resolution at the token's cell, whose top-left is ``round(X / 2^l - p/2)``
    (so off-grid centres move by at most half a level-``l`` pixel), then the canvas and its
    coverage mask are upsampled (nearest) to ``size`` and composited.

    Args:
        tokens: the :class:`TokenSet` (``B`` images, ``N`` tokens).
        patches: ``[B, N, C, p, p]`` from :func:`sample` (or a kernel).
        size: output ``(H, W)``; default ``tokens.image_size``.
        background: fills the gaps. A :class:`Pyramid`: its **coarsest level**, bilinearly
            upsampled (what the issue asks for); a tensor ``[B, C, h, w]``: resized bilinearly;
            ``None``: each image's mean token colour.
    """
    if patches.ndim != 5 or patches.shape[:2] != tokens.levels.shape:
        raise ValueError(f"patches must be [B, N, C, p, p] with [B, N] = "
                         f"{tuple(tokens.levels.shape)}, got {tuple(patches.shape)}")
    b, n, c, p, p2 = patches.shape
    if p != p2:
        raise ValueError(f"patches must be square, got {p}x{p2}")
    h, w = tokens.image_size
    ho, wo = (h, w) if size is None else (int(size[0]), int(size[1]))
    dev = patches.device
    if isinstance(background, Pyramid):
        background = background.levels[-1]
    if background is None:
        out = patches.mean(dim=(1, 3, 4))[:, :, None, None].expand(b, c, ho, wo).clone()
    else:
        if background.ndim != 4 or background.shape[:2] != (b, c):
            raise ValueError(f"background must be [B, C, h, w] = [{b}, {c}, ...], "
                             f"got {tuple(background.shape)}")
        out = F.interpolate(background.to(dev, patches.dtype), size=(ho, wo), mode="bilinear",
                            align_corners=False)
    levels = tokens.levels.to(dev)
    centers = tokens.centers.to(dev)
    k = torch.arange(p, device=dev)
    for lvl in torch.unique(levels).flip(0).tolist():                      # coarse -> fine
        s = 2 ** int(lvl)
        hl, wl = -(-h // s), -(-w // s)
        bi, ni = (levels == lvl).nonzero(as_tuple=True)
        x0 = torch.round(centers[bi, ni, 0] * w / s - p / 2).long()
        y0 = torch.round(centers[bi, ni, 1] * h / s - p / 2).long()
        xx = (x0[:, None] + k)[:, None, :].expand(-1, p, -1)                 # [M, p, p]
        yy = (y0[:, None] + k)[:, :, None].expand(-1, -1, p)
        ok = (xx >= 0) & (xx < wl) & (yy >= 0) & (yy < hl)
        cell = (bi[:, None, None] * hl + yy) * wl + xx                       # flat (b, y, x)
        canvas = patches.new_zeros(b * hl * wl, c)
        mask = patches.new_zeros(b * hl * wl)
        vals = patches[bi, ni].permute(0, 2, 3, 1)                           # [M, p, p, C]
        canvas[cell[ok]] = vals[ok]
        mask[cell[ok]] = 1.0
        canvas = canvas.reshape(b, hl, wl, c).permute(0, 3, 1, 2)
        mask = mask.reshape(b, 1, hl, wl)
        # nearest upsampling in the base frame: output pixel centre -> level-l pixel
        ys_ = ((torch.arange(ho, device=dev) + 0.5) * (h / ho) / s).floor().long().clamp(0, hl - 1)
        xs_ = ((torch.arange(wo, device=dev) + 0.5) * (w / wo) / s).floor().long().clamp(0, wl - 1)
        up = canvas[:, :, ys_][:, :, :, xs_]
        m = mask[:, :, ys_][:, :, :, xs_]
        out = torch.where(m > 0, up, out)
    return out
