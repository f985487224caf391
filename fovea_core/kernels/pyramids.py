"""Pyramids laid out for the kernels, built on the host (CPU).

* :func:`build_pyramid_cv2`: the CPU fast path, level 0 **is** the caller's image and levels
  ``1..`` are written by ``cv2.pyrDown`` straight into one buffer (a thread-local workspace
  when the pyramid does not escape the call, :func:`_workspace`).
* :func:`levels_needed`: how many levels a token set reads.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import torch

from fovea_core.pyramid import Pyramid, as_image_batch, default_num_levels
from fovea_core.tokens import TokenSet

__all__ = ["build_pyramid_cv2", "levels_needed"]


def _layout_lists(batch: int, channels: int, h: int, w: int, num_levels: int, first: int = 0
                  ) -> tuple[list[int], list[tuple[int, int]], int]:
    """:func:`_layout` as plain Python (no tensors made: for a hot path that needs only the
    total)."""
    sizes, offsets, off = [], [], 0
    for m in range(num_levels):
        if m >= first:
            sizes.append((h, w))
            offsets.append(off)
            off += batch * h * w * channels
        h, w = (h + 1) // 2, (w + 1) // 2
    return offsets, sizes, off


def _layout(batch: int, channels: int, h: int, w: int, num_levels: int, first: int = 0
            ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Sizes of levels ``first..num_levels-1`` and their offsets in one flat buffer."""
    offsets, sizes, off = _layout_lists(batch, channels, h, w, num_levels, first)
    return (torch.tensor(offsets, dtype=torch.int64), torch.tensor(sizes, dtype=torch.int32),
            off)


def _hwc_float_batch(image: np.ndarray | torch.Tensor) -> np.ndarray:
    """``[B, H, W, C]`` float32 numpy in [0, 1]: a float32 HWC numpy input is used as it is."""
    if isinstance(image, np.ndarray) and image.dtype == np.float32 and image.ndim in (3, 4):
        return image[None] if image.ndim == 3 else image
    return as_image_batch(image).permute(0, 2, 3, 1).contiguous().numpy()


def _pyr_down_into(prev: np.ndarray, view: np.ndarray) -> None:
    import cv2

    out = cv2.pyrDown(prev, dst=view)
    if out is not view and not np.shares_memory(out, view):
        view[...] = out


_WORKSPACE = threading.local()


def _workspace(nbytes: int) -> np.ndarray:
    """A reusable float32 buffer of this thread (grown, never shrunk): pages already mapped,
    so a pyramid that does not escape the call (:func:`sample_image`) costs no page faults."""
    buf = getattr(_WORKSPACE, "buf", None)
    if buf is None or buf.nbytes < nbytes:
        buf = np.empty(max(nbytes // 4, 1), dtype=np.float32)
        _WORKSPACE.buf = buf
    return buf


def build_pyramid_cv2(image: np.ndarray | torch.Tensor, num_levels: int | None = None, *,
                      patch: int = 16, _buffer: np.ndarray | None = None) -> Pyramid:
    """The CPU fast path: a :class:`Pyramid` whose level 0 **is** the caller's image.

    Level 0 is a view of ``image`` (a float32 numpy ``[H, W, C]`` / ``[B, H, W, C]`` is used
    without a copy); levels ``1..num_levels-1`` are written by ``cv2.pyrDown`` straight into
    one channels-last buffer (packed in place, never repacked). Every level is a
    ``[B, C, H_m, W_m]`` view with channels-last strides, which the kernels and
    :func:`fovea_core.sample.sample` read as they are. Build only the levels the tokens read:
    ``num_levels = levels_needed(tokens)``.
    """
    arr = _hwc_float_batch(image)
    b, h, w, c = arr.shape
    if c > 4:
        raise ValueError(f"build_pyramid_cv2 supports 1-4 channels (cv2), got {c}")
    num_levels = default_num_levels(h, w, patch) if num_levels is None else int(num_levels)
    if num_levels < 1:
        raise ValueError(f"num_levels must be >= 1, got {num_levels}")
    offsets, sizes, total = _layout(b, c, h, w, num_levels, first=1)
    buf = np.empty(total, dtype=np.float32) if _buffer is None else _buffer[:total]
    for i in range(b):                                    # loop over images and levels only
        prev = arr[i] if c > 1 else arr[i, ..., 0]
        for m in range(1, num_levels):
            hm, wm = int(sizes[m - 1, 0]), int(sizes[m - 1, 1])
            off = int(offsets[m - 1]) + i * hm * wm * c
            view = buf[off:off + hm * wm * c].reshape((hm, wm, c) if c > 1 else (hm, wm))
            _pyr_down_into(prev, view)
            prev = view
    base = torch.from_numpy(arr).permute(0, 3, 1, 2)
    flat = torch.from_numpy(buf)
    levels = [base]
    for m in range(1, num_levels):
        hm, wm = int(sizes[m - 1, 0]), int(sizes[m - 1, 1])
        off = int(offsets[m - 1])
        levels.append(flat[off:off + b * hm * wm * c].view(b, hm, wm, c).permute(0, 3, 1, 2))
    return Pyramid(tuple(levels))


def levels_needed(tokens: TokenSet, num_levels: int | None = None) -> int:
    """How many pyramid levels the tokens read: ``ceil(max level) + 1`` (a fractional level
    also reads the next one). Reads one scalar from the tokens' device."""
    need = int(math.ceil(float(tokens.levels.max()))) + 1
    return need if num_levels is None else min(need, num_levels)
