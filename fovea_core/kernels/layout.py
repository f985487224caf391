"""How a pyramid reaches the kernels: the ``LevelTable`` (``cuda/fovea_kernels.cuh``).

A pointer and element strides per level, passed by value: any pyramid (packed NCHW atlas,
channels-last views) is read in place, without repacking.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch


__all__ = ["MAX_LEVELS", "LevelTable", "level_table"]

#: the most levels a LevelTable holds (``FOVEA_MAX_LEVELS`` in the header)
MAX_LEVELS = 16


class LevelTable(ctypes.Structure):
    """Mirror of ``struct LevelTable`` (``cuda/fovea_kernels.cuh``); passed by value."""

    _fields_ = [("ptr", ctypes.c_longlong * MAX_LEVELS), ("sb", ctypes.c_longlong * MAX_LEVELS),
                ("h", ctypes.c_int * MAX_LEVELS), ("w", ctypes.c_int * MAX_LEVELS),
                ("sc", ctypes.c_int * MAX_LEVELS), ("sy", ctypes.c_int * MAX_LEVELS),
                ("sx", ctypes.c_int * MAX_LEVELS), ("num_levels", ctypes.c_int),
                ("channels", ctypes.c_int)]


def level_table(levels: Sequence[torch.Tensor]) -> LevelTable:
    """The kernels' description of pyramid levels ``[B, C, H_m, W_m]`` (any strides).

    Raises ``ValueError`` for more than ``MAX_LEVELS`` levels, a dtype other than float32,
    mixed devices, batch or channel counts, or a level image too large for 32-bit indexing.
    """
    if not 1 <= len(levels) <= MAX_LEVELS:
        raise ValueError(f"pyramid: the kernels take 1 to {MAX_LEVELS} levels, got {len(levels)}")
    t = LevelTable()
    b, c = levels[0].shape[:2]
    dev = levels[0].device
    for m, lv in enumerate(levels):
        if lv.ndim != 4 or tuple(lv.shape[:2]) != (b, c):
            raise ValueError(f"pyramid: level {m} has shape {tuple(lv.shape)}, expected "
                             f"[{b}, {c}, H, W]")
        if lv.dtype != torch.float32:
            raise ValueError(f"pyramid: level {m} is {lv.dtype}, the kernels read float32")
        if lv.device != dev:
            raise ValueError(f"pyramid: level {m} is on {lv.device}, level 0 on {dev}")
        sb, sc, sy, sx = lv.stride()
        h, w = lv.shape[-2:]
        if max(abs(sc) * (c - 1), 0) + abs(sy) * (h - 1) + abs(sx) * (w - 1) >= 2**31:
            raise ValueError(f"pyramid: level {m} ({tuple(lv.shape)}) is too large for "
                             "32-bit indexing inside one image")
        t.ptr[m], t.sb[m] = lv.data_ptr(), sb
        t.h[m], t.w[m], t.sc[m], t.sy[m], t.sx[m] = h, w, sc, sy, sx
    t.num_levels, t.channels = len(levels), c
    return t
