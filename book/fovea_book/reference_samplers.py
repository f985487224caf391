"""The torch definitions the kernels are checked against, the LUT remap (chapters 03, 05)
and the block painter.

* :func:`sample_reference`: the exact definition of the Gaussian-pyramid (``"mip"``) read,
  every arithmetic step in the order of the gather kernel
  (:func:`fovea_book.kernels.gather_patches` returns the same bits), and :func:`sample_mip`,
  the same read by one ``grid_sample`` call;
* :func:`remap` / :func:`remap_reference`: bilinear look-up-table sampling with
  ``cv2.remap``'s semantics (zero border), the operations of the ``remap_lut`` kernel
  (:func:`fovea_book.kernels.remap`) in its order; :func:`remap_fast` is one
  ``grid_sample`` call. The log-polar transform (:mod:`fovea_book.logpolar`) builds on them.

Coordinates as in :mod:`fovea_core.sample`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fovea_core.pyramid import Pyramid, ReducedPyramid, _pow2
from fovea_core.sample import check_sample_args
from fovea_core.tokens import LEVEL_QUANTUM, TokenSet

__all__ = ["pyramid_atlas", "remap", "remap_fast", "remap_reference", "render_blocks",
           "sample_mip", "sample_reference"]


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
    """The exact definition of the Gaussian-pyramid (``"mip"``) read: every token's
    ``p x p`` patch, ``[B, N, C, p, p]``.

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
    (:func:`fovea_book.kernels.gather_patches`): every arithmetic step is one torch operation
    with its own rounding, in the kernels' order. :func:`sample_mip` computes the same values
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


def sample_mip(pyramid: Pyramid, tokens: TokenSet, patch: int | None = None) -> torch.Tensor:
    """The Gaussian-pyramid (``"mip"``) read, :func:`sample_reference`'s values by one
    ``grid_sample`` call: ``[B, N, C, p, p]`` (arguments as :func:`fovea_core.sample.sample`).

    A pyramid from :func:`~fovea_core.pyramid.build_pyramid` is one mip atlas
    (:func:`pyramid_atlas`): every token's samples are placed in its
    level's rectangle of the atlas (clamped to it, which is the clamp-to-edge border; guard
    bands hold the edge pixels) and **one** ``F.grid_sample`` call reads all of them (a
    second one for the upper level of fractional tokens). Other pyramids take one
    ``grid_sample`` call per level. The values equal the kernels' up to float rounding of the
    sample coordinates (the normalised grid's round trip; measured in
    ``tests/test_sample.py``). Blurrier than :func:`fovea_core.sample.sample`'s area read at
    the same scale (a fractional level blends two low-passed levels); kept because it is
    what the CUDA/g++ kernels compute. A reduced pyramid raises ``ValueError``.
    """
    p = check_sample_args(pyramid, tokens, patch)
    if isinstance(pyramid, ReducedPyramid):
        raise ValueError("sample_mip reads the pyramid's levels from level 0; this pyramid "
                         f"is stored from level {pyramid.base_level} (a reduced decode): use "
                         "fovea_core.sample.sample")
    b, n = tokens.levels.shape
    nl = pyramid.num_levels
    dev = pyramid.base.device
    c = pyramid.channels
    lod = tokens.levels.to(dev)
    cen = tokens.centers.to(dev)
    h, w = tokens.image_size
    step = torch.exp2(lod)[..., None]                                      # [B, N, 1]
    k = torch.arange(p, device=dev, dtype=torch.float32) - (p - 1) / 2
    xs = cen[..., 0:1] * w + k * step                                      # [B, N, p] base px
    ys = cen[..., 1:2] * h + k * step
    lo = torch.floor(lod).clamp(max=nl - 1)
    frac = lod - lo
    lo = lo.long()
    fractional = bool((frac > 0).any())
    at = pyramid_atlas(pyramid)
    if at is None:
        return _sample_by_level(pyramid, xs, ys, lo, frac, fractional, p)
    atlas, origins = at
    ha, wa = atlas.shape[-2:]
    tab = _atlas_table(pyramid, origins, dev)                              # [L, 5]

    def read(m: torch.Tensor) -> torch.Tensor:                             # -> [B, C, N, p, p]
        t = tab[m]                                                         # [B, N, 5]
        inv, oy, ox, hh, ww = (t[..., i:i + 1] for i in range(5))
        u = torch.minimum((xs * inv - 0.5).clamp(min=0), ww - 1) + ox     # atlas index coords
        v = torch.minimum((ys * inv - 0.5).clamp(min=0), hh - 1) + oy
        gx = (u + 0.5) * (2.0 / wa) - 1                                   # align_corners=False
        gy = (v + 0.5) * (2.0 / ha) - 1
        grid = torch.stack([gx[:, :, None, :].expand(b, n, p, p),
                            gy[:, :, :, None].expand(b, n, p, p)], -1).reshape(b, n * p, p, 2)
        out = F.grid_sample(atlas, grid, mode="bilinear", padding_mode="border",
                            align_corners=False)                          # [B, C, N*p, p]
        return out.view(b, c, n, p, p)

    out = read(lo)
    if fractional:
        hi = read((lo + 1).clamp(max=nl - 1))
        out = torch.lerp(out, hi, frac[:, None, :, None, None])
    return out.permute(0, 2, 1, 3, 4)


def pyramid_atlas(pyramid: Pyramid) -> tuple[torch.Tensor, list[tuple[int, int]]] | None:
    """``(atlas [B, C, Ha, Wa], origins [(y, x)] per level)`` when every level of
    ``pyramid`` is a rectangle of one 2-D image whose stored extent allows reading it as
    ``Ha x Wa`` with both sides powers of two (:func:`~fovea_core.pyramid.build_pyramid`'s
    mip atlas; see :func:`~fovea_core.pyramid.atlas_layout`), else ``None`` (a reduced
    pyramid too)."""
    if isinstance(pyramid, ReducedPyramid):
        return None
    lv0 = pyramid.levels[0]
    b, c = lv0.shape[:2]
    sb, sc, sy, sx = lv0.stride()
    st = lv0.untyped_storage()
    if min(sb, sc, sy, sx) < 0 or any(lv.untyped_storage().data_ptr() != st.data_ptr()
                                      or lv.stride() != (sb, sc, sy, sx)
                                      for lv in pyramid.levels):
        return None
    if not ((sx == 1 and c > 1 and sc >= sy) or (sc == 1 and sx == c)):
        return None                                   # neither NCHW nor channels last
    base = lv0.storage_offset()
    origins = []
    for lv in pyramid.levels:
        y, rem = divmod(lv.storage_offset() - base, sy)
        x, r2 = divmod(rem, sx) if sx else (0, rem)
        if r2 or y < 0 or x < 0:
            return None
        origins.append((y, x))
    ha = _pow2(max(y + lv.shape[-2] for (y, _), lv in zip(origins, pyramid.levels)))
    wa = _pow2(max(x + lv.shape[-1] for (_, x), lv in zip(origins, pyramid.levels)) + 1)
    if wa * sx > sy and sx != 0 and c > 1 and sx == 1:
        return None                                   # NCHW rows cannot overlap channels
    last = base + (b - 1) * sb + (c - 1) * sc + (ha - 1) * sy + (wa - 1) * sx
    if last >= st.nbytes() // lv0.element_size():
        return None
    return lv0.as_strided((b, c, ha, wa), (sb, sc, sy, sx), base), origins


def _atlas_table(pyramid: Pyramid, origins: list[tuple[int, int]], device: torch.device
                 ) -> torch.Tensor:
    """Per level ``[L, 5]`` float32: ``2**-l``, atlas origin ``y, x``, height, width (cached)."""
    cache = pyramid.__dict__.setdefault("_atlas_table", {})
    if device not in cache:
        rows = [(2.0**-m, y, x, *lv.shape[-2:])
                for m, ((y, x), lv) in enumerate(zip(origins, pyramid.levels))]
        cache[device] = torch.tensor(rows, dtype=torch.float32).to(device)
    return cache[device]


def _sample_by_level(pyramid: Pyramid, xs: torch.Tensor, ys: torch.Tensor, lo: torch.Tensor,
                     frac: torch.Tensor, fractional: bool, p: int) -> torch.Tensor:
    """:func:`sample_mip` for pyramids that are not one atlas: one ``grid_sample`` call per
    level (its own border clamps), each token weighted by ``1 - frac`` at ``lo`` and
    ``frac`` at ``lo + 1``. Returns ``[B, N, C, p, p]``."""
    b, n = lo.shape
    c, nl = pyramid.channels, pyramid.num_levels
    out = None
    for m, lv in enumerate(pyramid.levels):
        wgt = torch.where(lo == m, 1 - frac, torch.zeros_like(frac))
        if fractional and m > 0:
            wgt = wgt + torch.where((lo == m - 1) & (frac > 0), frac, torch.zeros_like(frac))
        if not bool((wgt != 0).any()):
            continue
        hh, ww = lv.shape[-2:]
        u = xs * 2.0**-m - 0.5
        v = ys * 2.0**-m - 0.5
        gx = (u + 0.5) * (2.0 / ww) - 1
        gy = (v + 0.5) * (2.0 / hh) - 1
        grid = torch.stack([gx[:, :, None, :].expand(b, n, p, p),
                            gy[:, :, :, None].expand(b, n, p, p)], -1).reshape(b, n * p, p, 2)
        vals = F.grid_sample(lv, grid, mode="bilinear", padding_mode="border",
                             align_corners=False).view(b, c, n, p, p)
        vals = vals * wgt[:, None, :, None, None]
        out = vals if out is None else out + vals
    return out.permute(0, 2, 1, 3, 4)


# ----------------------------------------------------------------------------- block painter
#: bits of the block painter's priority key below the level: the token index (lowest wins a tie)
_KEY_TOKEN_BITS = 20


def render_blocks(tokens: TokenSet, patches: torch.Tensor, size: tuple[int, int] | None = None,
                  *, background: Pyramid | torch.Tensor | None = None,
                  window: tuple[int, int, int, int] | None = None,
                  fast: bool = True) -> torch.Tensor:
    """The block painter (figures of the token structure): ``[B, C, H, W]``, arguments and
    background as :func:`fovea_core.sample.render`.

    Token ``n`` (centre ``(X, Y)``, level ``l``, footprint ``f = p 2**l``) paints sample
    ``(k_y, k_x)`` of its patch over the sub-square of side ``2**l`` at
    ``k = floor((coord - (X - f/2)) / 2**l)`` of the square
    ``[X - f/2, X + f/2) x [Y - f/2, Y + f/2)`` (nearest neighbour); a pixel shows the
    covering token of the **finest level** (among equal levels the lowest index). With
    ``fast`` (the default) CPU tensors are painted by the C++ painter of the kernels' g++
    build where it is built (the same pixels, ``tests/test_sample.py``); else by the
    vectorised torch painter, which defines the result.
    """
    from fovea_core import kernels
    from fovea_core.sample import check_render_args

    bg, (ho, wo), (y0, y1, x0, x1) = check_render_args(tokens, patches, size, background,
                                                        window)
    n = patches.shape[1]
    out = F.interpolate(bg, size=(ho, wo), mode="bilinear", align_corners=False)
    if n >= 2**_KEY_TOKEN_BITS:
        raise ValueError(f"render supports N < {2**_KEY_TOKEN_BITS} tokens, got {n}")
    if patches.device.type == "cpu" and fast and "cpu" in kernels.available_backends():
        out = out.to(torch.float32).contiguous()
        _render_into(out, tokens, patches)             # the same pixels, in C++
        return out.to(patches.dtype)[..., y0:y1, x0:x1]
    return _render_pairs(tokens, patches, out, tokens.image_size, (ho, wo))[..., y0:y1, x0:x1]


def _render_into(out: torch.Tensor, tokens: TokenSet, patches: torch.Tensor) -> None:
    """The C++ block painter (``render_cpu`` of the g++ build): paints ``patches
    [B, N, C, p, p]`` over ``out [B, C, Ho, Wo]`` (contiguous float32, holding the
    background), in place. Raises ``RuntimeError`` when no CPU build exists."""
    import ctypes

    from fovea_core.kernels.cpu import _cpu_lib, _ptr
    from fovea_core.kernels.ops import _choose

    _choose("cpu", False)
    b, n, c, p, _ = patches.shape
    ho, wo = out.shape[-2:]
    h, w = tokens.image_size
    cen = tokens.centers.detach().cpu().float().contiguous()
    lv = tokens.levels.detach().cpu().float().contiguous()
    steps = torch.exp2(lv)
    pat = patches.detach().cpu().float().contiguous()
    zbuf = torch.empty(ho * wo, dtype=torch.int64)
    _cpu_lib().render_cpu(b, n, c, p, h, w, ho, wo, ctypes.c_float(wo / w), ctypes.c_float(ho / h),
                          _ptr(cen), _ptr(lv), _ptr(steps), _ptr(pat), _ptr(out), _ptr(zbuf))


def _render_pairs(tokens: TokenSet, patches: torch.Tensor, out: torch.Tensor,
                  image_size: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """The vectorised torch block painter (any device): every (token, covered
    pixel) pair enumerated, a ``scatter_reduce(amin)`` of the priority keys per pixel, the
    winners' samples gathered. ``out [B, C, Ho, Wo]`` holds the background."""
    b, n, c, p, _ = patches.shape
    h, w = image_size
    ho, wo = size
    dev = patches.device
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
