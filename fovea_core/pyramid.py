"""Gaussian (mip) pyramid: the multi-scale image every token is read from.

Level 0 is the image at full resolution; level ``l`` is level ``l-1`` blurred with the
5-tap binomial kernel ``[1, 4, 6, 4, 1] / 16`` (separable) and subsampled by two, with
mirror (reflect-101) borders: exactly OpenCV's ``cv2.pyrDown`` [Burt & Adelson 1983].
A token at level ``l`` therefore covers ``patch * 2**l`` base pixels with ``patch``
samples, one per level-``l`` pixel.
"""

from __future__ import annotations

import math
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
        t = torch.from_numpy(np.ascontiguousarray(arr)).permute(0, 3, 1, 2)
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


def _blur_down(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Binomial-5 blur along ``dim`` (-1 or -2), kept only at even samples, reflect-101 edges."""
    n_out = -(-x.shape[dim] // 2)
    pad = (2, 2, 0, 0) if dim == -1 else (0, 0, 2, 2)
    xp = F.pad(x, pad, mode="reflect")
    taps = [xp.narrow(dim, k, 2 * n_out - 1) for k in range(5)]
    step = (slice(None),) * (xp.ndim + dim) + (slice(None, None, 2),)
    w = _BINOMIAL5.tolist()
    out = taps[0][step] * w[0]
    for k in range(1, 5):
        out = out.add_(taps[k][step], alpha=w[k])
    return out


def pyr_down(x: torch.Tensor) -> torch.Tensor:
    """One pyramid step ``[B, C, H, W] -> [B, C, ceil(H/2), ceil(W/2)]`` (= ``cv2.pyrDown``).

    Separable binomial blur evaluated only at the kept samples (five strided
    multiply-adds per axis: memory-bound, no convolution), reflect-101 borders.
    Needs ``H, W >= 3``.
    """
    if x.ndim != 4:
        raise ValueError(f"pyr_down expects [B, C, H, W], got {tuple(x.shape)}")
    if x.shape[-1] < 3 or x.shape[-2] < 3:
        raise ValueError(f"pyr_down needs H, W >= 3, got {tuple(x.shape[-2:])}")
    return _blur_down(_blur_down(x, -1), -2).contiguous()


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
        return Pyramid(tuple(lvl.to(device) for lvl in self.levels))


def build_pyramid(image: np.ndarray | torch.Tensor, num_levels: int | None = None, *,
                  patch: int = 16) -> Pyramid:
    """Build the mip pyramid of an image batch.

    Args:
        image: anything :func:`as_image_batch` accepts; ``[B, C, H, W]`` after conversion.
        num_levels: number of levels including level 0; default
            :func:`default_num_levels` (coarsest level still >= one ``patch``).
        patch: the token patch size in pixels (only used for the default level count).

    Returns:
        :class:`Pyramid` with ``num_levels`` levels, level ``l`` of size ``ceil(H/2**l)``.
    """
    x = as_image_batch(image)
    h, w = x.shape[-2:]
    if num_levels is None:
        num_levels = default_num_levels(h, w, patch)
    num_levels = check_num_levels(num_levels, h, w)
    levels = [x]
    for _ in range(num_levels - 1):
        levels.append(pyr_down(levels[-1]))
    return Pyramid(tuple(levels))
