"""Gaussian (mip) pyramid: the multi-scale image every token is read from.

Level 0 is the image at full resolution; level ``l`` is level ``l-1`` blurred with the
5-tap binomial kernel ``[1, 4, 6, 4, 1] / 16`` (separable) and subsampled by two, with
mirror (reflect-101) borders: exactly OpenCV's ``cv2.pyrDown`` [Burt & Adelson 1983].
A token at level ``l`` therefore covers ``patch * 2**l`` base pixels with ``patch``
samples, one per level-``l`` pixel.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

_BINOMIAL5 = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0]) / 16.0


#: Values a float image may exceed [0, 1] by (round-off of a resampling step), no more.
IMAGE_RANGE_TOL = 1e-3


def _bad_image(msg: str, image) -> ValueError:
    shape = tuple(image.shape) if hasattr(image, "shape") else "?"
    dtype = getattr(image, "dtype", type(image).__name__)
    return ValueError(f"image ({dtype}, shape {shape}): {msg}")


def as_image_batch(image: np.ndarray | torch.Tensor, *, device: str | torch.device | None = None
                   ) -> torch.Tensor:
    """Convert an image or a batch to a float32 tensor ``[B, C, H, W]`` in ``[0, 1]``.

    Accepted (anything else raises an error that names ``image`` and says what to do):

    * a numpy **image** ``[H, W]``, ``[H, W, C]`` or ``[B, H, W, C]`` with ``C`` = 1 or 3
      (channels last, as scikit-image, OpenCV and PIL give them);
    * a torch tensor ``[C, H, W]`` or ``[B, C, H, W]`` (channels first), any ``C >= 1``
      (multi-channel data is fine for the pyramid and the samplers; the importance
      scorers need 1 or 3 channels);
    * dtype ``uint8`` (0..255, divided by 255) or floating point in ``[0, 1]`` (a
      resampling overshoot of up to ``IMAGE_RANGE_TOL`` is tolerated and kept).

    Raises:
        TypeError: ``image`` is not a numpy array or a torch tensor.
        ValueError: (message starts with ``image``) for an RGBA / 2-channel numpy image, a
            layout that looks transposed (``[C, H, W]`` numpy, ``[H, W, C]`` torch), an
            empty batch or zero-sized side, an unsupported dtype (``uint16``, integers other
            than ``uint8``, bool, complex), float values outside ``[0, 1]`` (e.g. 0..255
            floats) and NaN/inf.
    """
    if isinstance(image, np.ndarray):
        arr = image
        if arr.ndim not in (2, 3, 4):
            raise _bad_image("a numpy image must be [H,W], [H,W,C] or [B,H,W,C]", image)
        if arr.ndim == 2:
            arr = arr[None, :, :, None]
        elif arr.ndim == 3:
            arr = arr[None]
        c = arr.shape[-1]
        if c not in (1, 3):
            if arr.shape[1] in (1, 3):
                raise _bad_image("looks channels-first ([C, H, W]); numpy images are channels-"
                                 "last [H, W, C]: pass arr.transpose(1, 2, 0) (or a torch "
                                 "tensor [C, H, W])", image)
            hint = (" (RGBA?): drop or composite the alpha channel first, e.g. "
                    "skimage.color.rgba2rgb(img)" if c == 4 else "")
            raise _bad_image(f"a numpy image needs 1 or 3 channels (last axis), got {c}{hint}",
                             image)
        kind = arr.dtype.kind
        if not (arr.dtype == np.uint8 or kind == "f"):
            raise _bad_image("dtype must be uint8 (0..255) or float in [0, 1]; convert first, "
                             "e.g. img.astype(np.float32) / 65535 for uint16", image)
        arr = np.ascontiguousarray(arr)
        if not arr.flags.writeable:        # np.asarray(PIL image) is read-only: torch warns
            arr = arr.copy()
        t = torch.from_numpy(arr).permute(0, 3, 1, 2)
    elif isinstance(image, torch.Tensor):
        t = image[None] if image.ndim == 3 else image
        if t.ndim != 4:
            raise _bad_image("a tensor image must be [C,H,W] or [B,C,H,W]", image)
        if t.shape[1] > 4 and t.shape[-1] in (1, 3, 4):
            raise _bad_image("looks channels-last ([H, W, C]); torch images are channels-"
                             "first [C, H, W]: pass x.permute(2, 0, 1) (or a numpy array "
                             "[H, W, C])", image)
        if not (t.dtype == torch.uint8 or t.dtype.is_floating_point):
            raise _bad_image("dtype must be torch.uint8 (0..255) or floating point in [0, 1]",
                             image)
    else:
        raise TypeError(f"image must be a numpy array or torch tensor, got {type(image).__name__}")
    b, c, h, w = t.shape
    if b == 0 or c == 0 or h == 0 or w == 0:
        raise _bad_image("empty: batch, channels, height and width must all be >= 1", image)
    if t.dtype in (torch.uint8,):
        t = t.float() / 255.0
    else:
        t = t.float()
        lo, hi = torch.aminmax(t)                       # one pass; NaN propagates into lo/hi
        if not (lo >= -IMAGE_RANGE_TOL and hi <= 1 + IMAGE_RANGE_TOL):
            if not bool(torch.isfinite(t).all()):
                raise _bad_image("contains NaN or inf values", image)
            hint = " (0..255 values? divide by 255)" if hi > 1.5 else ""
            raise _bad_image(f"float values must lie in [0, 1], got [{float(lo):g}, "
                             f"{float(hi):g}]{hint}", image)
    return t.to(device) if device is not None else t


def max_num_levels(height: int, width: int) -> int:
    """Most levels a ``height x width`` image can have: each ``pyr_down`` step needs a level
    of at least 3 x 3 pixels (level ``l`` is ``ceil(H / 2**l) x ceil(W / 2**l)``)."""
    n, h, w = 1, int(height), int(width)
    while h >= 3 and w >= 3:
        h, w, n = -(-h // 2), -(-w // 2), n + 1
    return n


def check_num_levels(num_levels, height: int, width: int) -> int:
    """Validate ``num_levels`` for an image of this size: an int in ``[1, max_num_levels]``.

    Raises:
        ValueError: naming ``num_levels``, the image size and the largest valid value.
    """
    top = max_num_levels(height, width)
    if isinstance(num_levels, bool) or not isinstance(num_levels, (int, np.integer)):
        raise ValueError(f"num_levels must be an int in [1, {top}], got {num_levels!r}")
    if not 1 <= num_levels <= top:
        raise ValueError(f"num_levels must be in [1, {top}] for a {height}x{width} image (each "
                         f"level halves the size and pyr_down needs >= 3 px), got {num_levels}")
    return int(num_levels)


def _blur_down(x: torch.Tensor, dim: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Binomial-5 blur along ``dim`` (-1 or -2), kept only at even samples, reflect-101 edges.
    Written into ``out`` when given (e.g. a view of a packed pyramid buffer)."""
    n_out = -(-x.shape[dim] // 2)
    pad = (2, 2, 0, 0) if dim == -1 else (0, 0, 2, 2)
    xp = F.pad(x, pad, mode="reflect")
    taps = [xp.narrow(dim, k, 2 * n_out - 1) for k in range(5)]
    step = (slice(None),) * (xp.ndim + dim) + (slice(None, None, 2),)
    w = _BINOMIAL5.tolist()
    out = torch.mul(taps[0][step], w[0], out=out) if out is not None else taps[0][step] * w[0]
    for k in range(1, 5):
        out = out.add_(taps[k][step], alpha=w[k])
    return out


def pyr_down(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """One pyramid step ``[B, C, H, W] -> [B, C, ceil(H/2), ceil(W/2)]`` (= ``cv2.pyrDown``).

    Separable binomial blur evaluated only at the kept samples (five strided
    multiply-adds per axis: memory-bound, no convolution), reflect-101 borders.
    Needs ``H, W >= 3``. ``out``: where to write the result (e.g. the next level's view
    of a packed buffer); default a new contiguous tensor.
    """
    if x.ndim != 4:
        raise ValueError(f"pyr_down expects [B, C, H, W], got {tuple(x.shape)}")
    if x.shape[-1] < 3 or x.shape[-2] < 3:
        raise ValueError(f"pyr_down needs H, W >= 3, got {tuple(x.shape[-2:])}")
    if out is None:
        return _blur_down(_blur_down(x, -1), -2).contiguous()
    return _blur_down(_blur_down(x, -1), -2, out=out)


def default_num_levels(height: int, width: int, patch: int = 16) -> int:
    """Levels ``0..L`` such that the coarsest level still holds one whole patch."""
    if min(height, width) < patch:
        raise ValueError(f"image {height}x{width} is smaller than one {patch}px patch")
    return int(math.floor(math.log2(min(height, width) / patch))) + 1


@dataclass(frozen=True, eq=False)
class Pyramid:
    """A batched mip pyramid.

    Attributes:
        levels: level ``l`` is a float tensor ``[B, C, ceil(H / 2**l), ceil(W / 2**l)]``.
    """

    levels: tuple[torch.Tensor, ...]

    def __post_init__(self) -> None:
        if not self.levels:
            raise ValueError("a Pyramid needs at least one level")
        b, c = self.levels[0].shape[:2]
        for i, lvl in enumerate(self.levels):
            if lvl.ndim != 4 or lvl.shape[:2] != (b, c):
                raise ValueError(f"level {i} has shape {tuple(lvl.shape)}, expected [{b}, {c}, H, W]")

    @property
    def base(self) -> torch.Tensor:
        """Level 0, ``[B, C, H, W]``."""
        return self.levels[0]

    @property
    def num_levels(self) -> int:
        return len(self.levels)

    @property
    def batch_size(self) -> int:
        return self.levels[0].shape[0]

    @property
    def channels(self) -> int:
        return self.levels[0].shape[1]

    @property
    def image_size(self) -> tuple[int, int]:
        """``(H, W)`` of level 0 in pixels."""
        return tuple(self.levels[0].shape[-2:])  # type: ignore[return-value]

    def grid_shape(self, patch: int = 16, level: int = 0) -> tuple[int, int]:
        """Patch-grid shape ``(Gh, Gw)`` at ``level``: ``ceil(H / (patch * 2**level))``."""
        h, w = self.image_size
        side = patch * 2**level
        return math.ceil(h / side), math.ceil(w / side)

    def to(self, device: str | torch.device) -> "Pyramid":
        """The pyramid on ``device``; a packed pyramid (levels sharing one buffer) is moved
        as one buffer and stays packed."""
        dev = torch.device(device)
        if all(lv.device == dev for lv in self.levels):
            return self
        store = self.levels[0].untyped_storage()
        if all(lv.untyped_storage().data_ptr() == store.data_ptr() for lv in self.levels):
            flat = torch.empty(0, dtype=self.levels[0].dtype, device=self.levels[0].device)
            flat = flat.set_(store).to(dev)
            return Pyramid(tuple(flat.as_strided(lv.shape, lv.stride(), lv.storage_offset())
                                 for lv in self.levels))
        return Pyramid(tuple(lvl.to(device) for lvl in self.levels))


@dataclass(frozen=True, eq=False)
class ReducedPyramid(Pyramid):
    """A pyramid whose finest stored level is page level ``base_level`` (a page decoded at
    scale ``2**-base_level``, e.g. a JPEG's reduced decode): ``levels[0]`` is level
    ``base_level`` of a page of :attr:`image_size` pixels, ``levels[m]`` level
    ``base_level + m``.

    It serves the methods that choose their tokens from the page's geometry alone and whose
    tokens all sit at levels ``>= base_level`` (:func:`fovea_core.foveation.foveate` builds
    it for them): :attr:`image_size`, :attr:`num_levels` and :meth:`grid_shape` are the
    page's, and :func:`~fovea_core.sample.sample_area` reads the stored level in page
    coordinates. Anything that reads level 0 (:attr:`base`) raises instead of reading the
    wrong scale.

    Attributes:
        levels: the stored levels, ``[B, C, ceil(H / 2**(base_level + m)), ...]``.
        base_level: the page level of ``levels[0]`` (an int >= 0).
        page_size: the page's ``(H, W)`` at full resolution.
    """

    base_level: int = 0
    page_size: tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.base_level, bool) or not isinstance(self.base_level, int) \
                or self.base_level < 0:
            raise ValueError(f"base_level must be an int >= 0, got {self.base_level!r}")
        h, w = self.page_size
        k = 2**self.base_level
        if tuple(self.levels[0].shape[-2:]) != (-(-h // k), -(-w // k)):
            raise ValueError(f"levels[0] must be page level {self.base_level} of a {h}x{w} "
                             f"page, [{-(-h // k)}, {-(-w // k)}], got "
                             f"{list(self.levels[0].shape[-2:])}")

    @property
    def base(self) -> torch.Tensor:
        raise ValueError(f"this pyramid stores the page from level {self.base_level} on (a "
                         "reduced decode): level 0 is not stored; build_pyramid the full page "
                         "for a method that reads it")

    @property
    def num_levels(self) -> int:
        return self.base_level + len(self.levels)

    @property
    def image_size(self) -> tuple[int, int]:
        """``(H, W)`` of the page at full resolution (level 0, not stored)."""
        return tuple(self.page_size)  # type: ignore[return-value]

    def to(self, device: str | torch.device) -> "ReducedPyramid":
        return ReducedPyramid(tuple(lv.to(device) for lv in self.levels), self.base_level,
                              self.page_size)


def _pow2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


def atlas_layout(height: int, width: int, num_levels: int
                 ) -> tuple[tuple[int, int], list[tuple[int, int]], list[tuple[int, int]]]:
    """Where the levels of a packed pyramid sit in its **mip atlas** (one 2-D image).

    Level 0 (``H x W``) at the top left; levels ``1..`` stacked in a column to its right,
    each ``ceil(H / 2**l) x ceil(W / 2**l)``; a line of zeros right of and below every level
    (:func:`_zero_borders`). The atlas is *read* as an image of ``Ha x Wa`` pixels, both
    powers of two: then a pixel-centre coordinate ``u`` survives ``grid_sample``'s
    normalisation round trip ``(u + 0.5) * 2 / Wa - 1 -> u`` exactly (every intermediate
    value is representable), so samples on a level's pixel grid, and samples clamped to its
    edge, read their pixel bit for bit; other positions differ from the exact arithmetic by
    float rounding. Only the used part is stored (rows ``used_w = W + W_1 + 1`` pixels
    apart; the never-read remainder of the logical atlas overlaps the next row).

    Returns ``((Ha, Wa), origins [(y, x)] per level, sizes [(H_l, W_l)] per level)``.
    """
    sizes, origins = [], []
    h, w = height, width
    for _ in range(num_levels):
        sizes.append((h, w))
        h, w = -(-h // 2), -(-w // 2)
    origins.append((0, 0))
    y = 0
    for hl, _ in sizes[1:]:
        origins.append((y, width))
        y += hl
    return (_pow2(max(height, y + 1)), _pow2(_used_width(sizes))), origins, sizes


def _used_width(sizes: list[tuple[int, int]]) -> int:
    return sizes[0][1] + (sizes[1][1] if len(sizes) > 1 else 0) + 1


def _zero_borders(atlas: torch.Tensor, origins: list[tuple[int, int]],
                  sizes: list[tuple[int, int]]) -> None:
    """Zero the one-pixel lines right of and below every level that no other level covers
    (``atlas`` is the stored channels-last ``[B, rows, used_w, C]`` tensor). A bilinear read
    clamped to a level's last row / column touches them with weight 0 (or, off the pixel
    grid, with a weight of the order of float rounding): they must hold no NaN. Nothing
    else outside the levels is ever read."""
    rows = atlas.shape[1]
    h0, w0 = sizes[0]
    if h0 < rows:
        atlas[:, h0, :w0 + 1] = 0                              # below level 0
    if len(sizes) == 1:
        atlas[:, :h0, w0] = 0                                  # right of the only level
        return
    w1 = sizes[1][1]
    for (y, x), (h, w) in zip(origins[1:], sizes[1:]):
        atlas[:, y:y + h, x + w:x + w1 + 1] = 0                # right of each level
    y_end = origins[-1][0] + sizes[-1][0]
    if y_end < rows:
        atlas[:, y_end:min(h0 + 1, rows), w0:w0 + w1 + 1] = 0  # below the column


def _pyr_down_cv2(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """``cv2.pyrDown`` of every image of ``src`` straight into ``dst`` (CPU float32 views,
    1-4 channels, channels-last memory); ``False`` when cv2 cannot take them."""
    if src.device.type != "cpu" or not 1 <= src.shape[1] <= 4 or src.stride(1) != 1 \
            or dst.stride(1) != 1:
        return False
    import cv2

    s, d = src.permute(0, 2, 3, 1).numpy(), dst.permute(0, 2, 3, 1).numpy()
    for i in range(s.shape[0]):                              # a loop over images only
        si, di = (s[i], d[i]) if s.shape[-1] > 1 else (s[i, ..., 0], d[i, ..., 0])
        out = cv2.pyrDown(si, dst=di)
        if out is not di and not np.shares_memory(out, di):
            di[...] = out
    return True


def build_pyramid(image: np.ndarray | torch.Tensor, num_levels: int | None = None, *,
                  patch: int = 16) -> Pyramid:
    """Build the mip pyramid of an image batch, **packed in one mip atlas**.

    All levels live in one ``[B, C, Ha, Wa]`` float32 image (:func:`atlas_layout`, memory
    channels last), each written in place (no repacking): by ``cv2.pyrDown`` on the CPU
    (1-4 channels; SIMD), by the ``pyr_down`` CUDA kernel on a GPU when the kernels are
    available and imported (:mod:`fovea_core.kernels` registers it,
    :func:`register_pyr_down`), else by :func:`pyr_down`; all three compute the
    same filter (equal up to float rounding). ``levels[l]`` is the ``[B, C, H_l, W_l]`` view
    of its rectangle. The Gaussian-pyramid samplers read every level of every token through
    the one atlas: one ``grid_sample`` call in the book's ``sample_mip`` (its
    ``pyramid_atlas`` gives the whole image), one level table in the kernels.

    Args:
        image: anything :func:`as_image_batch` accepts; ``[B, C, H, W]`` after conversion.
        num_levels: number of levels including level 0; default
            :func:`default_num_levels` (coarsest level still >= one ``patch``).
        patch: the token patch size in pixels, a positive int (only used for the default
            level count).

    Returns:
        :class:`Pyramid` with ``num_levels`` levels, level ``l`` of size ``ceil(H/2**l)``,
        on the image's device.

    Raises:
        ValueError: ``patch`` is not a positive int (naming ``patch``).
    """
    if isinstance(patch, bool) or not isinstance(patch, (int, np.integer)) or patch < 1:
        raise ValueError(f"patch must be a positive int (pixels), got {patch!r}")
    # 8-bit pages stay 8-bit until they are written into the atlas (divided by 255 there,
    # as as_image_batch divides them): no full-size float copy of a large photograph
    u8 = isinstance(image, torch.Tensor) and image.dtype == torch.uint8 and image.ndim == 4 \
        and min(image.shape) > 0
    x = image if u8 else as_image_batch(image)
    b, c, h, w = x.shape
    if num_levels is None:
        num_levels = default_num_levels(h, w, patch)
    num_levels = check_num_levels(num_levels, h, w)
    (ha, wa), origins, sizes = atlas_layout(h, w, num_levels)
    # channels last: the C values of a pixel are adjacent, what a bilinear tap reads at once
    nhwc = torch.empty(b, ha, wa, c, dtype=torch.float32, device=x.device)
    _zero_borders(nhwc, origins, sizes)
    atlas = nhwc.permute(0, 3, 1, 2)
    levels = [atlas[..., y:y + hh, xx:xx + ww] for (y, xx), (hh, ww) in zip(origins, sizes)]
    if u8:              # the page's integers once as floats (integer_page), then / 255
        ints = x.permute(0, 2, 3, 1).to(torch.float32, memory_format=torch.contiguous_format)
        torch.div(ints, 255.0, out=nhwc[:, :h, :w])
    else:
        nhwc[:, :h, :w].copy_(x.permute(0, 2, 3, 1))      # rows of W*C floats: fast copies
    fast = _PYR_DOWN_STEPS.get(x.device.type) if min(h, w) >= 3 else None
    for m in range(1, num_levels):
        if fast is not None and fast(levels[m - 1], levels[m]):
            continue
        if not _pyr_down_cv2(levels[m - 1], levels[m]):
            pyr_down(levels[m - 1], out=levels[m])
    pyr = Pyramid(tuple(levels))
    if u8:                              # the 8-bit page, known without a look (integer_page)
        pyr.__dict__[_INTEGER_PAGE] = ints
    return pyr


_INTEGER_PAGE = "_integer_page"


def integer_page(pyramid: Pyramid) -> torch.Tensor | None:
    """The pyramid's finest stored level as 8-bit integers, ``[B, H, W, C]`` float32 holding
    the integers ``0..255`` (summed as they are: exact while a sum stays below ``2**24``), when
    it is an 8-bit page (every value ``k / 255`` for an integer ``k``, as
    :func:`as_image_batch` stores one: a file, a PIL image, a ``uint8`` array or tensor,
    or such values given as floats), else ``None``. Sums of these integers are exact in
    any order, so a reader of the page's pixels that sums them
    (:func:`fovea_core.sample.sample_area`) gives the same result on any machine. Known
    from the build for a ``uint8`` input, else found once by comparing the level with its
    values rounded to 8 bits; kept with the pyramid."""
    cache = pyramid.__dict__
    if _INTEGER_PAGE not in cache:
        base = pyramid.levels[0].permute(0, 2, 3, 1)
        z = base.mul(255.0).round_()
        cache[_INTEGER_PAGE] = z.contiguous() if torch.equal(z / 255.0, base) else None
    return cache[_INTEGER_PAGE]


#: device type -> a faster :func:`pyr_down` step for :func:`build_pyramid`:
#: ``step(src [B, C, H, W], dst [B, C, ceil(H/2), ceil(W/2)]) -> bool`` writes the next level
#: into ``dst`` in place and returns ``True``, or returns ``False`` (not taken: the torch step
#: runs). This module never imports the kernel layer (layers point down, ``tests/test_layers.py``);
#: :mod:`fovea_core.kernels` registers its ``pyr_down`` CUDA kernel here when imported.
_PYR_DOWN_STEPS: dict[str, Callable[[torch.Tensor, torch.Tensor], bool]] = {}


def register_pyr_down(device_type: str,
                      step: Callable[[torch.Tensor, torch.Tensor], bool] | None) -> None:
    """Make ``step`` :func:`build_pyramid`'s downsampling step for tensors on
    ``device_type`` (``"cuda"``, ...; ``None`` removes it). The step must compute
    :func:`pyr_down` (the same filter, equal up to float rounding); see ``_PYR_DOWN_STEPS``.
    Raises ``ValueError`` for a device type torch does not know or a step that is not
    callable."""
    try:
        torch.device(device_type)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device_type must be a torch device type such as 'cuda', got "
                         f"{device_type!r}") from exc
    if step is None:
        _PYR_DOWN_STEPS.pop(device_type, None)
    elif not callable(step):
        raise ValueError(f"step must be callable (src, dst) -> bool or None, got {step!r}")
    else:
        _PYR_DOWN_STEPS[device_type] = step
