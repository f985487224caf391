"""Torch samplers: read the tokens' patches (:func:`sample`) and paint a page from them
(:func:`render`). Vectorised; they run on any torch device. The bit-exact definitions the
CUDA / g++ kernels are checked against live with the book (``fovea_book.reference_samplers``).

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

:func:`sample` reads sample ``k`` as the mean of the base image over the square of side
``2**lod`` centred on ``X_k`` (:func:`sample_area`): the page resampled at scale ``2**-lod``
the way a VLM processor resamples it, at any fractional level. The Gaussian-pyramid
("mip") read the CUDA/g++ kernels compute (bilinear in level ``l``, trilinear between two
levels at a fractional one) is the book's (``fovea_book.reference_samplers.sample_mip``):
blurrier than an area resample at the same scale.

:func:`render` reconstructs a page from its tokens as readers and the OCR see it: bicubic
across patch edges, no seams; ``resize``'s tokens reconstruct to an area-down, bicubic-up
resize of the page. (The block painter, nearest neighbour for figures of the token
structure, is the book's: ``fovea_book.reference_samplers.render_blocks``.)
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F

from fovea_core.pyramid import Pyramid, ReducedPyramid, integer_page
from fovea_core.tokens import TokenSet

__all__ = ["check_render_args", "check_sample_args", "render", "sample", "sample_area",
           "sample_positions"]


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


def check_sample_args(pyramid: Pyramid, tokens: TokenSet, patch: int | None) -> int:
    """Validate :func:`sample`'s arguments (shared with the book's samplers); return ``p``."""
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
    """Read every token's ``p x p`` patch: ``[B, N, C, p, p]``, the page resampled at scale
    ``2**-level`` as a VLM processor resamples it (:func:`sample_area`).

    Args:
        pyramid: :class:`~fovea_core.pyramid.Pyramid` with levels ``[B, C, H_l, W_l]``.
        tokens: :class:`~fovea_core.tokens.TokenSet` with the same ``B`` and ``image_size``,
            levels in ``[0, pyramid.num_levels - 1]``.
        patch: samples per side; default ``tokens.patch``.
    """
    return sample_area(pyramid, tokens, patch)


# --------------------------------------------------------------------------- area read
#: 8-bit pages are summed as integers in float32 while no partial sum can reach 2**24 (exact)
_EXACT_F32 = 2.0**24


def _segment_sums(x: torch.Tensor, dim: int, corners: torch.Tensor, offset: int, n: int
                  ) -> torch.Tensor:
    """Sums of the replicate-padded axis ``dim`` of ``x`` between consecutive padded
    corners: entry ``t`` along ``dim`` sums padded lines ``[corners[t], corners[t + 1])``
    (padded line ``r`` is base line ``clamp(r - 1, 0, n - 1)``; base line ``i`` is ``x``'s
    line ``i - offset``). ``corners``: sorted distinct padded corners (long, at least two,
    in ``[0, n + 2]``); ``x`` holds every base line they span. Returns ``x``'s shape with
    ``len(corners) - 1`` along ``dim``, summed in ``x``'s dtype."""
    shape = list(x.shape)
    shape[dim] = corners.numel() - 1
    out = x.new_zeros(shape)
    pr = torch.arange(int(corners[0]), int(corners[-1]), device=x.device)  # padded lines
    seg = torch.searchsorted(corners, pr, right=True) - 1                 # their segment
    inner = (pr >= 1) & (pr <= n)                     # base line pr - 1, each once, in order
    count = int(inner.sum())
    if count:
        start = max(int(corners[0]), 1) - 1 - offset
        out.index_add_(dim, seg[inner], x.narrow(dim, start, count))
    edge = ~inner                                     # padded lines 0 and n + 1: repeats
    if bool(edge.any()):
        out.index_add_(dim, seg[edge], x.index_select(dim, (pr[edge] - 1).clamp(0, n - 1)
                                                      - offset))
    return out


def _corner_table(pyramid: Pyramid, rows: torch.Tensor, cols: torch.Tensor
                  ) -> tuple[torch.Tensor, float]:
    """The summed-area table of the pyramid's finest stored level ``[B, C, H, W]`` (padded
    by one replicated pixel on every side) at the padded corners ``rows`` x ``cols`` only
    (sorted, distinct, long, at least two each), relative to the corner ``(rows[0],
    cols[0])``: ``([B, R, K, C] float64, scale)``, the sums of ``scale`` x the pixels. Box
    sums, second differences of the table, do not depend on the origin. Only the pixels
    inside the corners' box are summed, once: into the blocks between consecutive corners,
    then the small table of blocks is cumulated. An 8-bit page
    (:func:`~fovea_core.pyramid.integer_page`, scale 255) is summed as integers, exactly
    (float32 while a block's sum stays below ``2**24``, float64 beyond and for the table of
    blocks): its box sums do not depend on the machine or the order of the sums. Another
    page is summed in float64."""
    h, w = pyramid.levels[0].shape[-2:]
    r0 = int((rows[0] - 1).clamp(0, h - 1))
    r1 = int((rows[-1] - 2).clamp(0, h - 1)) + 1
    c0 = int((cols[0] - 1).clamp(0, w - 1))
    c1 = int((cols[-1] - 2).clamp(0, w - 1)) + 1
    z = integer_page(pyramid)
    if z is None:
        box = pyramid.levels[0][..., r0:r1, c0:c1].permute(0, 2, 3, 1)   # [B, h', w', C]
        scale, part = 1.0, _segment_sums(box.double(), 1, rows, r0, h)
        blocks = _segment_sums(part, 2, cols, c0, w)                       # [B, R-1, K-1, C]
    else:
        # a block's partial sums stay below its total, at most (its lines) x 255: exact in
        # float32 while that is below 2**24 (always, but for corners far apart)
        lr, lc = int((rows[1:] - rows[:-1]).max()), int((cols[1:] - cols[:-1]).max())
        rows32, blocks32 = lr * 255.0 < _EXACT_F32, lr * lc * 255.0 < _EXACT_F32
        box = z[:, r0:r1, c0:c1]
        scale, part = 255.0, _segment_sums(box if rows32 else box.double(), 1, rows, r0, h)
        blocks = _segment_sums(part if blocks32 else part.double(), 2, cols, c0, w).double()
    return F.pad(blocks.cumsum(1).cumsum(2), (0, 0, 1, 0, 1, 0)), scale


#: sub-pixel resolution of :func:`sample_area`'s box edges (1/1024 base pixel)
_SNAP = 1024.0


def _table_weights(coord: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Index and weight of the linear read of a summed-area axis with ``size + 3`` corners
    at padded coordinates ``coord``: the lower corner clamped to ``[0, size + 1]`` and the
    weight left unclamped, so that beyond the padded image the integral is extrapolated
    linearly, which is exactly the integral of the replicate-extended image."""
    i0 = torch.floor(coord).clamp(0, size + 1)
    return i0.long(), coord - i0


def sample_area(pyramid: Pyramid, tokens: TokenSet, patch: int | None = None) -> torch.Tensor:
    """Every token's patch as an **area resample** of the base image: ``[B, N, C, p, p]``.

    Sample ``k`` of a token at level ``l`` (module docstring: ``X_k = x W + (k - (p-1)/2)
    2**l``) is the mean of the base image over the square ``[X_k - 2**l / 2, X_k + 2**l / 2)
    x [Y_k - 2**l / 2, Y_k + 2**l / 2)``, pixels weighted by the fraction of them the square
    covers, the image extended by its edge pixels (clamp-to-edge). For a grid of tokens at
    one level this is ``cv2.resize(..., INTER_AREA)`` of the page to scale ``2**-l``, the
    antialiased resample of a VLM processor, at any fractional ``l`` (at level 0 on the
    pixel grid it reads pixels exactly; off the grid, a 1-px box is a bilinear read).

    Implementation: the ``p + 1`` box edges of each axis (neighbouring samples share an
    edge) are looked up in the summed-area table [F. Crow, "Summed-area tables for texture
    mapping", SIGGRAPH 1984] of the replicate-padded base image, bilinearly (the integral of
    a piecewise-constant image is bilinear between pixel corners, so the read is exact),
    and the box sums are the table's second differences: ``4 (p + 1)**2`` reads per token
    and channel, a fixed number of tensor operations for any mix of levels. The table is
    made only at the pixel corners the boxes touch and only over the pixels inside them
    (:func:`_corner_table`): a few coarse tokens over a whole page sum its pixels once into
    a small table, a fovea reads only its own region. An 8-bit page is summed exactly as
    integers (every box sum on the pixel grid is exact, the same on any machine); another
    page in float64. float32 result.

    Args:
        pyramid: the :class:`~fovea_core.pyramid.Pyramid` whose base (level 0) is read; its
            other levels are not used.
        tokens: :class:`~fovea_core.tokens.TokenSet` with the same ``B`` and ``image_size``.
        patch: samples per side; default ``tokens.patch``.
    """
    p = check_sample_args(pyramid, tokens, patch)
    base = pyramid.levels[0]                                  # the finest stored level
    dev = base.device
    k = pyramid.base_level if isinstance(pyramid, ReducedPyramid) else 0
    if k and float(tokens.levels.min()) < k:
        raise ValueError(f"tokens.levels must be >= {k} on a pyramid stored from level {k} "
                         f"(a reduced decode), got a level {float(tokens.levels.min()):g}")
    b, n = tokens.levels.shape
    hs, ws = base.shape[-2:]
    ex, ey, step = _box_edges(tokens.centers.to(dev), tokens.levels.to(dev), tokens.image_size,
                              p, k, (hs, ws))
    x0, fx = _table_weights(ex, ws)                                        # [B, N, p+1]
    y0, fy = _table_weights(ey, hs)
    rows = torch.unique(torch.cat([y0.reshape(-1), y0.reshape(-1) + 1]))   # sorted corners
    cols = torch.unique(torch.cat([x0.reshape(-1), x0.reshape(-1) + 1]))
    table, scale = _corner_table(pyramid, rows, cols)                         # [B, R, K, C]
    ry, rx = torch.searchsorted(rows, y0), torch.searchsorted(cols, x0)    # y0 + 1: ry + 1
    # tokens in chunks: the reads hold ~30 KB of float64 a token (16 px), so a page read
    # whole at level 0 (136k tokens on a 35-Mpixel scan) would need ~4 GB at once
    chunk = max(1, AREA_CHUNK // max(1, b))
    norm = step * step * scale                                             # [B, N, 1]
    out = [_area_reads(table, ry[:, s], fy[:, s], rx[:, s], fx[:, s], norm[:, s]).to(base.dtype)
           for s in (slice(i, i + chunk) for i in range(0, n, chunk))]
    out = out[0] if len(out) == 1 else torch.cat(out, 1)                   # [B, N, p, p, C]
    return out.permute(0, 1, 4, 2, 3).contiguous()


#: tokens (over the batch) per chunk of :func:`sample_area`'s table reads
AREA_CHUNK = 4096


def _box_edges(centers: torch.Tensor, levels: torch.Tensor, image_size: tuple[int, int],
               p: int, base_level: int, stored_size: tuple[int, int]
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The box edges of :func:`sample_area`'s samples in padded pixels of the stored level
    (page level ``base_level``, ``stored_size`` pixels, whose pixel ``i`` covers page pixels
    ``[i 2**base_level, (i + 1) 2**base_level)``): ``(ex, ey)`` ``[B, N, p + 1]`` float64,
    snapped to 1/1024 px, and the box side ``[B, N, 1]`` in stored pixels."""
    dev = centers.device
    hs, ws = stored_size
    lev = levels.to(torch.float64)
    cen = centers.to(torch.float64)
    h, w = image_size
    if base_level:                          # page coordinates -> the stored level's pixels
        lev = lev - base_level
        cen = cen * cen.new_tensor([w / 2.0**base_level, h / 2.0**base_level]) \
            / cen.new_tensor([ws, hs])
        h, w = hs, ws
    step = torch.exp2(lev)[..., None]                                      # [B, N, 1]
    e = torch.arange(p + 1, device=dev, dtype=torch.float64) - p / 2       # box edges
    # padded coordinates, snapped to 1/1024 px: float32 centres carry ~1e-5 px of rounding,
    # which would blend ~1e-6 of a neighbour into a grid-aligned read
    ex = torch.round((cen[..., 0:1] * w + e * step + 1.0) * _SNAP) / _SNAP  # [B, N, p+1]
    ey = torch.round((cen[..., 1:2] * h + e * step + 1.0) * _SNAP) / _SNAP
    return ex, ey, step


def _area_reads(table: torch.Tensor, ry: torch.Tensor, fy: torch.Tensor, rx: torch.Tensor,
                fx: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    """:func:`sample_area`'s box means from the corner table ``table`` ``[B, R, K, C]``
    (:func:`_corner_table`): box edge ``j`` of a token lies between table rows ``ry[..., j]``
    and ``ry[..., j] + 1`` at fraction ``fy[..., j]`` (``[B, n, p + 1]``; columns alike),
    each box sum is divided by ``norm`` ``[B, n, 1]`` (its area times the table's scale):
    ``[B, n, p, p, C]`` float64."""
    b, hs, ws, c = table.shape
    n, e = ry.shape[1:]
    dev = table.device
    rows = (torch.arange(b, device=dev).view(b, 1, 1) * hs + ry) * ws      # [B, n, p+1]
    flat = table.view(b * hs * ws, c)
    wy = torch.stack([1 - fy, fy])[..., :, None, None]                     # [2, B, n, p+1, 1, 1]
    wx = torch.stack([1 - fx, fx])[..., None, :, None]                     # [2, B, n, 1, p+1, 1]
    def read(idx: torch.Tensor) -> torch.Tensor:                          # [B, n, i, j, C]
        return flat.index_select(0, idx.reshape(-1)).view(*idx.shape, c)

    # each token's table relative to its own first corner (i0, j0): S - S[:, j0] - S[i0] +
    # S[i0, j0], exact for an 8-bit page (integers), so a token reads the same values
    # whatever else is read with it (the shared table's origin drops out)
    i0, j0 = rows[..., :1, None], rx[..., None, :1]                       # [B, n, 1, 1]
    at_j0 = [read(rows[..., :, None] + dy * ws + j0) for dy in (0, 1)]   # [B, n, e, 1, C]
    at_i0 = [read(i0 + rx[..., None, :] + dx) for dx in (0, 1)]          # [B, n, 1, e, C]
    origin = read(i0 + j0)                                                # [B, n, 1, 1, C]
    corner = None                                   # the integral at every box corner
    for dy in (0, 1):
        for dx in (0, 1):
            tap = read((rows[..., :, None] + dy * ws) + (rx[..., None, :] + dx))
            tap = (tap - at_j0[dy]) - (at_i0[dx] - origin)
            term = tap * (wy[dy] * wx[dx])
            corner = term if corner is None else corner.add_(term)
    box = corner[:, :, 1:, 1:] - corner[:, :, :-1, 1:] - corner[:, :, 1:, :-1] \
        + corner[:, :, :-1, :-1]                                           # [B, n, p, p, C]
    return box / norm[..., None, None]


# --------------------------------------------------------------------------- render
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


def _check_window(window, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """``window`` as ``(y0, y1, x0, x1)`` inside an output of ``size``; the whole output when
    ``None``. ValueError naming ``window`` otherwise."""
    ho, wo = size
    if window is None:
        return 0, ho, 0, wo
    try:
        y0, y1, x0, x1 = (operator.index(v) for v in window)
    except (TypeError, ValueError):
        raise ValueError(f"window must be (y0, y1, x0, x1) ints, got {window!r}") from None
    if not (0 <= y0 < y1 <= ho and 0 <= x0 < x1 <= wo):
        raise ValueError(f"window must lie in the {ho}x{wo} output with y0 < y1, x0 < x1, "
                         f"got {window!r}")
    return y0, y1, x0, x1


def _background_source(background, tokens: TokenSet, patches: torch.Tensor) -> torch.Tensor:
    """The background image ``[B, C, hb, wb]`` that :func:`render` upsamples bilinearly under
    the tokens (a Pyramid's coarsest level, a tensor as given, or each image's mean token
    colour as ``[B, C, 1, 1]``)."""
    b, _, c = patches.shape[:3]
    h, w = tokens.image_size
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
        return patches.mean(dim=(1, 3, 4))[:, :, None, None]
    if not isinstance(background, torch.Tensor) or background.ndim != 4 \
            or tuple(background.shape[:2]) != (b, c):
        shape = tuple(background.shape) if isinstance(background, torch.Tensor) else \
            type(background)
        raise ValueError(f"background must be a Pyramid or [B, C, h, w] = [{b}, {c}, ...], "
                         f"got {shape}")
    return background.to(patches.device, patches.dtype)


def render(tokens: TokenSet, patches: torch.Tensor, size: tuple[int, int] | None = None, *,
           background: Pyramid | torch.Tensor | None = None,
           window: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """Foveated reconstruction of the page from its tokens, ``[B, C, H, W]``.

    The tokens of each level are the samples of a grid at that level's pitch (sample ``k``
    of a token at level ``l`` sits at base position ``X_k``, module docstring). Each level's
    samples are placed on their grid (one canvas per level, tokens of nearly equal levels,
    within 1/4 octave, share the coarsest of their levels' grids; coincident samples are
    averaged) and reconstructed with **bicubic** interpolation across patch edges, so a grid
    of tokens shows no seams. Levels are composited **coarse to fine**; a level covers the
    pixels within one of its samples' pitch of its samples, with a soft (bilinear) edge, and
    the pixels around a level's samples that its bicubic reads but no token holds take the
    coarser composite there. For ``resize``'s tokens the result is an area-down, bicubic-up
    resize of the page. Bicubic interpolation may overshoot ``[0, 1]`` by a few per cent
    near sharp edges: clamp for display. Pixels no token reaches show the background. Work:
    ``O(H W)`` per level present plus ``O(N p**2)``.

    Args:
        tokens: the :class:`TokenSet` (``B`` images, ``N`` tokens).
        patches: ``[B, N, C, p, p]`` from :func:`sample` (or a kernel), ``p = tokens.patch``.
        size: output ``(H, W)`` (positive ints); default ``tokens.image_size``. Token positions
            are scaled to it.
        background: fills the gaps. A :class:`Pyramid` of the same images (its levels must
            include every token's level): its **coarsest level**, bilinearly upsampled; a
            tensor ``[B, C, h, w]``: resized bilinearly; ``None``: each image's mean token
            colour.
        window: ``(y0, y1, x0, x1)`` of the output to compute (default: all of it); the
            result is ``[B, C, y1 - y0, x1 - x0]``, equal to that crop of the whole render
            (only the window's pixels are computed).
    """
    bg, size, win = check_render_args(tokens, patches, size, background, window)
    return _render_smooth(tokens, patches, bg, size, win)


def check_render_args(tokens: TokenSet, patches: torch.Tensor, size, background, window
                      ) -> tuple[torch.Tensor, tuple[int, int], tuple[int, int, int, int]]:
    """Validate :func:`render`'s arguments (shared with the book's block painter); return
    ``(background [B, C, hb, wb], (Ho, Wo), (y0, y1, x0, x1))``."""
    if not isinstance(patches, torch.Tensor) or patches.ndim != 5 \
            or tuple(patches.shape[:2]) != tuple(tokens.levels.shape):
        shape = tuple(patches.shape) if isinstance(patches, torch.Tensor) else type(patches)
        raise ValueError(f"patches must be [B, N, C, p, p] with [B, N] = "
                         f"{tuple(tokens.levels.shape)}, got {shape}")
    p, p2 = patches.shape[-2:]
    if p != p2 or p != tokens.patch:
        raise ValueError(f"patches must be p x p with p = tokens.patch = {tokens.patch}, "
                         f"got {p}x{p2}")
    if not bool(torch.isfinite(patches).all()):
        raise ValueError("patches contain NaN or inf values (a sampler fed a NaN image?)")
    ho, wo = _check_size(size, tokens.image_size)
    win = _check_window(window, (ho, wo))
    return _background_source(background, tokens, patches), (ho, wo), win


# --------------------------------------------------------------------------- smooth painter
#: levels within 1/LEVEL_BINS octave share one canvas
LEVEL_BINS = 4
#: canvas pixels kept around a level's samples: bicubic reads 2 beyond a point that a
#: sample's bilinear coverage reaches, 1 more for rounding
_CANVAS_MARGIN = 3


def _read_points(img: torch.Tensor, u: torch.Tensor, v: torch.Tensor, mode: str,
                 padding: str) -> torch.Tensor:
    """``img [C, hh, ww]`` read at index coordinates ``(u, v) [K]`` (pixel ``i``'s centre at
    ``i``) by ``grid_sample`` (``mode``: bilinear / bicubic): ``[K, C]``."""
    hh, ww = img.shape[-2:]
    grid = torch.stack([(u + 0.5) * (2.0 / ww) - 1, (v + 0.5) * (2.0 / hh) - 1], -1)
    out = F.grid_sample(img[None], grid.view(1, 1, -1, 2).to(img.dtype), mode=mode,
                        padding_mode=padding, align_corners=False)
    return out[0, :, 0].T


class _Canvas:
    """One level's samples on their grid: values ``[C, hc, wc]`` (holes that the bicubic may
    read filled from the coarser composite), ``valid [1, hc, wc]`` float (1 where a sample
    lies), the grid pitch ``step`` in base pixels and the base position of canvas pixel
    ``(0, 0)``'s centre, ``(x, y) = ((origin + 0.5) * step)``."""

    def __init__(self, values: torch.Tensor, valid: torch.Tensor, step: float,
                 origin: tuple[float, float]) -> None:
        self.values, self.valid, self.step, self.origin = values, valid, step, origin

    def coords(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Canvas index coordinates of base positions ``x, y [K]``."""
        return x / self.step - 0.5 - self.origin[0], y / self.step - 0.5 - self.origin[1]


def _composite(canvases: list[_Canvas], bg: torch.Tensor, image_size: tuple[int, int],
               x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The smooth reconstruction at base positions ``x, y [K]``: ``[K, C]``, the background
    ``bg [C, hb, wb]`` (bilinear) under ``canvases`` (coarse to fine; bicubic, alpha = the
    bilinear read of ``valid``)."""
    h, w = image_size
    hb, wb = bg.shape[-2:]
    val = _read_points(bg, x * (wb / w) - 0.5, y * (hb / h) - 0.5, "bilinear", "border")
    for cv in canvases:
        u, v = cv.coords(x, y)
        hc, wc = cv.valid.shape[-2:]
        # the bilinear read of `valid` (zero padded) is zero beyond one canvas pixel of the
        # canvas: only the points inside that box are read (a fovea's canvas is small)
        box = ((u > -1) & (u < wc) & (v > -1) & (v < hc)).nonzero().squeeze(1)
        if box.numel() == 0:
            continue
        ub, vb = u.index_select(0, box), v.index_select(0, box)
        alpha = _read_points(cv.valid, ub, vb, "bilinear", "zeros")[:, 0]
        keep = (alpha > 0).nonzero().squeeze(1)
        if keep.numel() == 0:
            continue
        sel = box.index_select(0, keep)
        a = alpha.index_select(0, keep)[:, None].clamp(max=1)
        ours = _read_points(cv.values, ub.index_select(0, keep), vb.index_select(0, keep),
                            "bicubic", "border")
        val.index_copy_(0, sel, torch.lerp(val.index_select(0, sel), ours, a))
    return val


def _canvases(tokens: TokenSet, patches: torch.Tensor, bg: torch.Tensor, b: int
              ) -> list[_Canvas]:
    """Image ``b``'s tokens as per-level canvases, coarse to fine (see :func:`render`)."""
    h, w = tokens.image_size
    p = tokens.patch
    dev = patches.device
    lev = tokens.levels[b].to(dev, torch.float64)                          # [N]
    cx = tokens.centers[b, :, 0].to(dev, torch.float64) * w
    cy = tokens.centers[b, :, 1].to(dev, torch.float64) * h
    k = torch.arange(p, device=dev, dtype=torch.float64) - (p - 1) / 2
    bins = torch.round(lev * LEVEL_BINS)
    out: list[_Canvas] = []
    for key in torch.unique(bins).flip(0).tolist():                      # coarse to fine
        mem = (bins == key).nonzero().squeeze(1)
        step = float(torch.exp2(lev.index_select(0, mem).max()))
        own = torch.exp2(lev.index_select(0, mem))[:, None]
        u = (cx.index_select(0, mem)[:, None] + k * own) / step - 0.5      # [M, p] canvas coords
        v = (cy.index_select(0, mem)[:, None] + k * own) / step - 0.5

        def phase(t: torch.Tensor) -> float:                             # the grid's offset
            ang = 2 * torch.pi * t
            return float(torch.atan2(ang.sin().mean(), ang.cos().mean()) / (2 * torch.pi))

        ox, oy = phase(u), phase(v)
        iu, iv = torch.round(u - ox).long(), torch.round(v - oy).long()
        x0, y0 = int(iu.min()) - _CANVAS_MARGIN, int(iv.min()) - _CANVAS_MARGIN
        wc = int(iu.max()) - x0 + _CANVAS_MARGIN + 1
        hc = int(iv.max()) - y0 + _CANVAS_MARGIN + 1
        lin = ((iv - y0)[:, :, None] * wc + (iu - x0)[:, None, :]).reshape(-1)     # [M p p]
        vals = patches[b].index_select(0, mem).permute(1, 0, 2, 3).reshape(patches.shape[2], -1)
        c = vals.shape[0]
        acc = vals.new_zeros(c, hc * wc).index_add_(1, lin, vals)
        cnt = vals.new_zeros(hc * wc).index_add_(0, lin, torch.ones_like(lin, dtype=vals.dtype))
        valid = cnt > 0
        acc = acc / cnt.clamp(min=1)
        near = F.max_pool2d(valid.view(1, 1, hc, wc).to(vals.dtype), 2 * 2 + 1, 1, 2)
        holes = ((near.view(-1) > 0) & ~valid).nonzero().squeeze(1)
        origin = (x0 + ox, y0 + oy)
        if holes.numel():
            hx = ((holes % wc).double() + origin[0] + 0.5) * step
            hy = (torch.div(holes, wc, rounding_mode="floor").double() + origin[1] + 0.5) * step
            fill = _composite(out, bg[b], (h, w), hx.to(vals.dtype), hy.to(vals.dtype))
            acc.index_copy_(1, holes, fill.T.to(acc.dtype))
        out.append(_Canvas(acc.view(c, hc, wc), valid.view(1, hc, wc).to(vals.dtype), step,
                           origin))
    return out


def _memo_canvases(tokens: TokenSet, patches: torch.Tensor, bg: torch.Tensor
                   ) -> list[list[_Canvas]]:
    """Every image's canvases (:func:`_canvases`), kept on ``tokens`` for the next window of
    the same patches over the same background (a reader renders one crop per answer line,
    and a page's questions share the tokens of a query-agnostic method). Keyed by the
    identity and version counter of ``patches`` and ``bg``, so an in-place change of either
    rebuilds them."""
    key = (id(patches), patches._version, id(bg), bg._version)
    memo = tokens.__dict__.get("_smooth_canvases")
    if memo is not None and memo[0] == key and memo[1] is patches and memo[2] is bg:
        return memo[3]
    cvs = [_canvases(tokens, patches, bg, b) for b in range(patches.shape[0])]
    tokens.__dict__["_smooth_canvases"] = (key, patches, bg, cvs)
    return cvs


def _render_smooth(tokens: TokenSet, patches: torch.Tensor, bg: torch.Tensor,
                   size: tuple[int, int], window: tuple[int, int, int, int]) -> torch.Tensor:
    """The smooth painter of :func:`render` over ``window`` of an output of ``size``."""
    h, w = tokens.image_size
    ho, wo = size
    y0, y1, x0, x1 = window
    dev = patches.device
    ys = (torch.arange(y0, y1, device=dev, dtype=patches.dtype) + 0.5) * (h / ho)
    xs = (torch.arange(x0, x1, device=dev, dtype=patches.dtype) + 0.5) * (w / wo)
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    imgs = []
    for b, cvs in enumerate(_memo_canvases(tokens, patches, bg)):        # images of the batch
        val = _composite(cvs, bg[b], (h, w), gx.reshape(-1), gy.reshape(-1))
        imgs.append(val.T.reshape(-1, y1 - y0, x1 - x0))
    return torch.stack(imgs)
