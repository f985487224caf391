"""The GPU binding: launch the nvcc cubin of ``cuda/fovea_kernels.cu`` on the current torch
stream.

Two bindings launch the same cubin (see ``cuda/README.md``):

* ``"driver"`` (default): the CUDA driver API (``libcuda``) through ``ctypes``
  (:class:`_Driver`): ``cuLaunchKernel`` on any torch stream, no extra package;
* ``"pycuda"`` (the optional ``gpu`` extra, imported only when asked for): pycuda cannot
  wrap a foreign stream handle, so it launches only while torch's current stream is the
  legacy default stream and raises otherwise.

Launches are asynchronous; arguments are ctypes scalars, ``LevelTable`` structures (by
value) or device pointers (:func:`_u64`).
"""

from __future__ import annotations

import ctypes
import functools
import math

import numpy as np
import torch

from fovea_core.kernels.build import _cubin, _nvcc


@functools.lru_cache(maxsize=1)
def _cuda_missing() -> str | None:
    """Why the CUDA backend cannot run here (None if it can); decided once per process."""
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU (this torch build or machine has none)"
    if _nvcc() is None:
        return "nvcc (CUDA toolkit) was not found on PATH"
    try:
        _driver()
    except (OSError, RuntimeError) as exc:
        return f"the CUDA driver library cannot be used ({exc})"
    return None


def _pycuda_missing() -> str | None:
    try:
        import pycuda.driver  # noqa: F401
    except ImportError:
        return "pycuda is not installed (pip install '.[gpu]' on a machine with CUDA)"
    return None


class _Driver:
    """The few CUDA driver-API calls the launcher needs, through ctypes (libcuda)."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self._check(self.lib.cuInit(0), "cuInit")
        self.modules: dict[int, ctypes.c_void_p] = {}
        self.functions: dict[tuple[int, str], ctypes.c_void_p] = {}

    def _check(self, res: int, what: str) -> None:
        if res != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(res, ctypes.byref(name))
            raise RuntimeError(f"{what} failed: CUDA error {res} "
                               f"({(name.value or b'?').decode()})")

    def function(self, device: int, name: str) -> ctypes.c_void_p:
        key = (device, name)
        if key not in self.functions:
            ctx = ctypes.c_void_p()
            self._check(self.lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
            if not ctx.value:                     # this thread has no context yet: torch's
                dev = ctypes.c_int()              # primary context of the device
                self._check(self.lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
                self._check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev),
                            "cuDevicePrimaryCtxRetain")
                self._check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
            if device not in self.modules:
                major, minor = torch.cuda.get_device_capability(device)
                image = _cubin(f"sm_{major}{minor}")
                mod = ctypes.c_void_p()
                self._check(self.lib.cuModuleLoadData(ctypes.byref(mod), image),
                            "cuModuleLoadData")
                self.modules[device] = mod
            fn = ctypes.c_void_p()
            self._check(self.lib.cuModuleGetFunction(ctypes.byref(fn), self.modules[device],
                                                     name.encode()), f"cuModuleGetFunction({name})")
            self.functions[key] = fn
        return self.functions[key]

    def launch(self, device: int, name: str, grid: int, block: int, args: list,
               stream: int) -> None:
        fn = self.function(device, name)
        params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        self._check(self.lib.cuLaunchKernel(fn, ctypes.c_uint(grid), 1, 1, ctypes.c_uint(block),
                                            1, 1, 0, ctypes.c_void_p(stream), params, None),
                    f"cuLaunchKernel({name})")


@functools.lru_cache(maxsize=1)
def _driver() -> _Driver:
    return _Driver()


@functools.lru_cache(maxsize=None)
def _pycuda_function(device: int, name: str):
    missing = _pycuda_missing()
    if missing:
        raise RuntimeError(f"the 'pycuda' binding is unavailable: {missing}")
    import pycuda.driver as drv

    drv.init()
    ctx = drv.Device(device).retain_primary_context()    # torch's context
    ctx.push()
    try:
        major, minor = torch.cuda.get_device_capability(device)
        mod = drv.module_from_buffer(_cubin(f"sm_{major}{minor}"))
        _pycuda_function.modules = getattr(_pycuda_function, "modules", []) + [mod]
        return mod.get_function(name)
    finally:
        drv.Context.pop()


def _as_pycuda(arg):
    if isinstance(arg, ctypes.Structure):                # by value, as raw bytes
        return np.frombuffer(bytes(arg), dtype=np.dtype((np.void, ctypes.sizeof(arg))))[0]
    if isinstance(arg, ctypes.c_int):
        return np.int32(arg.value)
    if isinstance(arg, ctypes.c_float):
        return np.float32(arg.value)
    if isinstance(arg, ctypes.c_double):
        return np.float64(arg.value)
    if isinstance(arg, ctypes.c_uint64):
        return np.uintp(arg.value)
    if isinstance(arg, ctypes.c_longlong):
        return np.int64(arg.value)
    raise TypeError(f"unsupported kernel argument {type(arg).__name__}")


def _launch_cuda(name: str, device: torch.device, grid: int, block: int, args: list,
                 binding: str | None) -> None:
    """Launch kernel ``name`` on the current torch stream of ``device`` (asynchronous)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(idx).cuda_stream
    binding = binding or "driver"
    with torch.cuda.device(idx):
        if binding == "driver":
            _driver().launch(idx, name, grid, block, args, stream)
        elif binding == "pycuda":
            if stream != 0:
                raise RuntimeError("the 'pycuda' binding launches on the legacy default stream "
                                   "only (pycuda cannot wrap torch's current stream); use "
                                   "binding='driver' inside torch.cuda.stream(...)")
            import pycuda.driver as drv

            fn = _pycuda_function(idx, name)
            ctx = drv.Device(idx).retain_primary_context()    # torch's primary context
            ctx.push()
            try:
                fn(*[_as_pycuda(a) for a in args], block=(block, 1, 1), grid=(grid, 1))
            finally:
                drv.Context.pop()
        else:
            raise ValueError(f"binding must be 'driver', 'pycuda' or None, got {binding!r}")


def _u64(t: torch.Tensor) -> ctypes.c_uint64:
    return ctypes.c_uint64(t.data_ptr())


def _grid(total: int, block: int = 256) -> int:
    return max(1, min(math.ceil(total / block), 2**31 - 1))
