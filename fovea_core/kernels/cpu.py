"""The CPU binding: the g++ build of ``cuda/fovea_kernels.cu`` loaded with ``ctypes``.

The ``__global__`` kernels are compiled out of this build; the ``extern "C"`` loops over the
same ``__host__ __device__`` functions remain (``*_cpu``). :func:`_cpu_lib` builds the
library on first use (:func:`~fovea_core.kernels.build.build_cpu_library`), loads it once
per process and declares every entry point's argument types.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from fovea_core.kernels.build import build_cpu_library
from fovea_core.kernels.layout import LevelTable

#: the CPU gather runs its tokens on several threads only from this many tokens on (a
#: thread team costs more than one image's 273 tokens take)
CPU_PARALLEL_TOKENS = 2048


_P = ctypes.c_void_p
_I = ctypes.c_int
_D = ctypes.c_double
_LT = ctypes.POINTER(LevelTable)


@functools.lru_cache(maxsize=1)
def _cpu_lib() -> ctypes.CDLL:
    """The loaded CPU library (built on first use), its entry points typed."""
    lib = ctypes.CDLL(str(build_cpu_library()))
    if lib.fovea_level_table_bytes() != ctypes.sizeof(LevelTable):
        raise RuntimeError("LevelTable layout of the CPU library differs from "
                           "fovea_core/kernels/layout.py")
    lib.gather_patches_cpu.argtypes = [_LT, _I, _I, _I, _I, _I, _P, _P, _P, _P, _I]
    lib.gather_patches_cpu.restype = None
    lib.gather_tokens_cpu.argtypes = [_LT] + [_I] * 9 + [_P] * 4 + [_I]
    lib.gather_tokens_cpu.restype = None
    lib.pyr_down_cpu.argtypes = [_LT, _I, _LT, _I, _I]
    lib.pyr_down_cpu.restype = None
    lib.remap_lut_cpu.argtypes = [_P, ctypes.c_longlong, _I, _I, _I, _I, _I, _I, _I, _P, _I,
                                  _I, _I, _P]
    lib.remap_lut_cpu.restype = None
    lib.v1_candidates_cpu.argtypes = [_I] * 7 + [_D, _D, _I, _I] + [_P] * 9
    lib.v1_candidates_cpu.restype = None
    lib.divprune_cpu.argtypes = [_I, _I, _I, _I, _P, _P, _P, _P]
    lib.divprune_cpu.restype = None
    lib.render_cpu.argtypes = [_I] * 8 + [ctypes.c_float, ctypes.c_float] + [_P] * 6
    lib.render_cpu.restype = None
    lib.select_candidates_cpu.argtypes = [_I, _I, _I, _I, _I, _P, _P, _P, _P]
    lib.select_candidates_cpu.restype = _I
    lib.sample_image_onepass_cpu.argtypes = [_P, _I, _I, _I, _I, _I, _P, _I, _I, _P, _P, _P, _P,
                                             _I]
    lib.sample_image_onepass_cpu.restype = _I
    return lib


def _ptr(t: torch.Tensor) -> int:
    """The address of a tensor's first element (what a ``void *`` argument takes)."""
    return t.data_ptr()
