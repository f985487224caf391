"""The torch definitions the kernels are checked against, and the LUT remap (chapters 03, 05).

* :func:`sample_reference`: the exact definition of the ``"mip"`` read of
  :func:`fovea_core.sample.sample`, every arithmetic step in the order of the gather kernel
  (:func:`fovea_core.kernels.gather_patches` returns the same bits);
* :func:`remap` / :func:`remap_reference`: bilinear look-up-table sampling with
  ``cv2.remap``'s semantics (zero border), the operations of the ``remap_lut`` kernel
  (:func:`fovea_core.kernels.remap`) in its order; :func:`remap_fast` is one
  ``grid_sample`` call. The log-polar transform (:mod:`fovea_book.logpolar`) builds on them.

Coordinates as in :mod:`fovea_core.sample`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fovea_core.pyramid import Pyramid
from fovea_core.sample import check_sample_args
from fovea_core.tokens import TokenSet

__all__ = ["remap", "remap_fast", "remap_reference", "sample_reference"]


def _check_remap_args(image: torch.Tensor, lut: torch.Tensor) -> None:
    if not isinstance(image, torch.Tensor) or image.ndim != 4:
        shape = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
        raise ValueError(f"image must be [B, C, H, W], got {shape}")
    if not isinstance(lut, torch.Tensor) or lut.ndim != 4 or lut.shape[-1] != 2 \
            or lut.shape[0] not in (1, image.shape[0]):
        shape = tuple(lut.shape) if isinstance(lut, torch.Tensor) else type(lut).__name__
        raise ValueError(f"lut must be [B or 1, Ho, Wo, 2] with B = {image.shape[0]}, "
                         f"got {shape}")


def remap(image: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """Bilinear look-up-table sampling, the torch twin of ``cv2.remap`` (BORDER_CONSTANT 0):
    exact float32 weights, the arithmetic of :func:`remap_reference` (which it is; the
    kernels equal it bit for bit). :func:`remap_fast` is one ``grid_sample`` call, several
    times faster on a CPU, but its normalised coordinates round (up to ~1e-5 for a 1024-px
    image), more than the log-polar tests allow against ``cv2.warpPolar``.
    """
    return remap_reference(image, lut)


def remap_fast(image: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """:func:`remap` with one ``F.grid_sample`` call (float rounding of the coordinates).

    Arguments and result as :func:`remap_reference` (``image [B, C, H, W]``, any strides;
    channels-last memory is read fastest; ``lut [B or 1, Ho, Wo, 2]`` -> ``[B, C, Ho, Wo]``).

    Implementation: one ``F.grid_sample`` call (zero padding, ``align_corners=False``, the
    LUT mapped to normalised coordinates), the path torch users get on any device. Equal to
    :func:`remap_reference` (the kernels' exact arithmetic) up to float rounding of the
    normalised coordinates, except at integer LUT entries, which read their pixel exactly
    (a pixel copy, as ``cv2.remap`` and the reference do: an identity LUT returns the
    image bit for bit).
    """
    _check_remap_args(image, lut)
    b, c, h, w = image.shape
    img = image.float()
    lut = lut.to(device=image.device, dtype=torch.float32).expand(b, -1, -1, -1)
    grid = (lut + 0.5) * lut.new_tensor([2.0 / w, 2.0 / h]) - 1
    out = F.grid_sample(img, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    # integer entries: the pixel itself (grid_sample's rounded weights would blend in ~1e-7
    # of a neighbour), 0 outside; LUTs of real maps rarely hold any (then nothing to do)
    xi, yi = lut[..., 0].round(), lut[..., 1].round()
    whole = (xi == lut[..., 0]) & (yi == lut[..., 1])                      # [B, Ho, Wo]
    if not bool(whole.any()):
        return out
    bi, oi, oj = whole.nonzero(as_tuple=True)
    x, y = xi[bi, oi, oj].long(), yi[bi, oi, oj].long()
    inside = ((x >= 0) & (x < w) & (y >= 0) & (y < h)).to(out.dtype)
    px = img[bi, :, y.clamp(0, h - 1), x.clamp(0, w - 1)]                  # [K, C]
    out[bi, :, oi, oj] = px * inside[:, None]
    return out


def remap_reference(image: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """The exact definition of :func:`remap` (what the kernels equal bit for bit).

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
    _check_remap_args(image, lut)
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


_TABLE_ROWS = ("group", "offset", "sb", "sc", "sy", "sx", "h", "w")


def _level_table(pyramid: Pyramid, device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Where every level lives: ``table [8, L]`` int64 (rows :data:`_TABLE_ROWS`: storage
    group, element offset in it, strides b/c/y/x, height, width), the exact scales
    ``2**-l`` ``[L]`` float32, and one flat 1-D view per distinct storage (a packed pyramid
    has one). Cached on the pyramid per device."""
    cache = pyramid.__dict__.setdefault("_sample_table", {})
    if device in cache:
        return cache[device]
    stores: list[int] = []
    flats: list[torch.Tensor] = []
    cols = []
    for lv in pyramid.levels:
        st = lv.untyped_storage()
        if st.data_ptr() not in stores:
            stores.append(st.data_ptr())
            flats.append(torch.empty(0, dtype=lv.dtype, device=lv.device).set_(st))
        g = stores.index(st.data_ptr())
        cols.append((g, lv.storage_offset(), *lv.stride(), *lv.shape[-2:]))
    table = torch.tensor(cols, dtype=torch.int64).T.contiguous().to(device)
    inv = torch.tensor([2.0**-m for m in range(len(cols))], dtype=torch.float32).to(device)
    cache[device] = (table, inv, flats)
    return table, inv, flats


def _gather_level(flat: torch.Tensor, tab: torch.Tensor, inv: torch.Tensor, bidx: torch.Tensor,
                  xs: torch.Tensor, ys: torch.Tensor, m: torch.Tensor, channels: int
                  ) -> torch.Tensor:
    """Bilinear clamp-to-edge read of level ``m [M]`` (per token) of the pyramid whose levels
    ``tab [8, L]`` locates in ``flat`` (``inv [L]``: ``2**-l``), at base positions ``xs, ys [M, p]``: ``[M, C, p, p]``.

    Every step is one torch operation with its own rounding, in the order of the kernels'
    ``gather_sample`` (``cuda/fovea_kernels.cuh``), so the results agree bit for bit.
    """
    t = tab.index_select(1, m)                                            # [8, M] per token
    _, off, sb, sc, sy, sx, hh, ww = t
    inv_s = inv.index_select(0, m)[:, None]                               # exact 2^-m
    u = xs * inv_s - 0.5
    v = ys * inv_s - 0.5
    u = torch.minimum(u.clamp(min=0), (ww - 1).to(u.dtype)[:, None])      # clamp to edge
    v = torch.minimum(v.clamp(min=0), (hh - 1).to(v.dtype)[:, None])
    x0f, y0f = torch.floor(u), torch.floor(v)
    fx = (u - x0f)[:, None, None, :]                                      # [M, 1, 1, p]
    fy = (v - y0f)[:, None, :, None]                                      # [M, 1, p, 1]
    x0, y0 = x0f.long(), y0f.long()
    x1 = torch.minimum(x0 + 1, (ww - 1)[:, None])
    y1 = torch.minimum(y0 + 1, (hh - 1)[:, None])
    ch = torch.arange(channels, device=xs.device)
    base = (off + bidx * sb)[:, None] + ch[None] * sc[:, None]            # [M, C]
    r0 = base[:, :, None] + (y0 * sy[:, None])[:, None, :]                # [M, C, p]
    r1 = base[:, :, None] + (y1 * sy[:, None])[:, None, :]
    c0 = (x0 * sx[:, None])[:, None, None, :]                             # [M, 1, 1, p]
    c1 = (x1 * sx[:, None])[:, None, None, :]

    def tap(r: torch.Tensor, col: torch.Tensor) -> torch.Tensor:          # [M, C, p, p]
        return flat.take(r[..., None] + col)

    wx0, wy0 = 1 - fx, 1 - fy
    top = tap(r0, c0).mul_(wx0).add_(tap(r0, c1).mul_(fx))
    bot = tap(r1, c0).mul_(wx0).add_(tap(r1, c1).mul_(fx))
    return top.mul_(wy0).add_(bot.mul_(fy))


def sample_reference(pyramid: Pyramid, tokens: TokenSet, patch: int | None = None
                     ) -> torch.Tensor:
    """The exact definition of the ``"mip"`` read of :func:`fovea_core.sample.sample`: every
    token's ``p x p`` patch, ``[B, N, C, p, p]``.

    Token ``n`` of image ``b`` at level ``l`` and centre ``(x, y)`` samples a ``p x p`` grid
    with spacing ``2**l`` base pixels (one level-``l`` pixel; ``p * 2**l`` base pixels in
    all) centred on ``(x W, y H)``, with **clamp-to-edge** (replicate) borders: a sample
    outside the image takes the value of the nearest edge pixel (coordinate formula:
    :mod:`fovea_core.sample`).

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

    This is the function the kernels equal **bit for bit**
    (:func:`fovea_core.kernels.gather_patches`): every arithmetic step is one torch operation
    with its own rounding, in the kernels' order. ``sample`` computes the same values
    with one ``grid_sample`` call (faster; it differs by float rounding of the coordinates).

    Implementation (vectorised: a fixed number of tensor operations whatever the levels):
    every level is located in the pyramid's storage by a small table (offset and strides),
    and all tokens are read at once with four flat ``take`` gathers per pass (one pass, a
    second for the upper level of fractional tokens). A packed pyramid
    (:func:`~fovea_core.pyramid.build_pyramid`) is one storage; a pyramid whose levels live
    in several storages takes one pass per storage.
    """
    p = check_sample_args(pyramid, tokens, patch)
    b, n = tokens.levels.shape
    nl = pyramid.num_levels
    dev = pyramid.base.device
    c = pyramid.channels
    table, inv, flats = _level_table(pyramid, dev)
    lod = tokens.levels.to(dev).reshape(-1)                                # [M]
    cen = tokens.centers.to(dev).reshape(-1, 2)
    h, w = tokens.image_size
    step = torch.exp2(lod)[:, None]                                        # [M, 1]
    k = torch.arange(p, device=dev, dtype=torch.float32) - (p - 1) / 2
    xs = cen[:, 0:1] * w + k * step                                        # [M, p] base px
    ys = cen[:, 1:2] * h + k * step
    lo = torch.floor(lod).clamp(max=nl - 1)
    frac = lod - lo
    lo = lo.long()
    bidx = torch.arange(b, device=dev).repeat_interleave(n)
    out = None
    for q in (0, 1):
        m = lo if q == 0 else (lo + 1).clamp(max=nl - 1)
        wgt = 1 - frac if q == 0 else frac
        sel = None
        if q == 1:
            two = (frac > 0) & (lo + 1 < nl)
            if dev.type == "cpu":                 # read the upper level only where needed
                sel = two.nonzero().squeeze(1)
                if sel.numel() == 0:
                    break
            else:                                 # no host round trip: weight 0 elsewhere
                wgt = torch.where(two, frac, torch.zeros_like(frac))
        idx = slice(None) if sel is None else sel
        mm = m[idx]
        vals = None
        for g, flat in enumerate(flats):
            if len(flats) == 1:
                mg = mm
            else:                                 # a pass per storage, other levels masked
                in_g = table[0].index_select(0, mm) == g
                mg = torch.where(in_g, mm, (table[0] == g).nonzero()[0, 0])
            v = _gather_level(flat, table, inv, bidx[idx], xs[idx], ys[idx], mg, c)
            vals = v if vals is None else torch.where(in_g[:, None, None, None], v, vals)
        vals = vals.mul_(wgt[idx][:, None, None, None])
        if q == 0:
            out = vals
        else:
            out.index_add_(0, sel, vals) if sel is not None else out.add_(vals)
    return out.reshape(b, n, c, p, p)


