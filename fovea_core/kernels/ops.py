"""The kernels the method runs: the backend choice (:mod:`fovea_core.kernels`), the
``pyr_down`` step of :func:`fovea_core.pyramid.build_pyramid` on a GPU and DivPrune's greedy
selection on the CPU. This layer decides nothing.
"""

from __future__ import annotations

import ctypes

import torch

from fovea_core.kernels.build import _compiler
from fovea_core.kernels.cpu import _cpu_lib, _ptr
from fovea_core.kernels.cuda import _cuda_missing, _grid, _launch_cuda, _pycuda_missing
from fovea_core.kernels.layout import level_table
from fovea_core.pyramid import register_pyr_down

__all__ = ["backend_status", "available_backends", "pyr_down_into", "divprune_greedy"]


def backend_status() -> dict[str, str | None]:
    """``{"cuda": reason or None, "cpu": reason or None, "pycuda": reason or None}``
    (None = available; ``pycuda`` is the optional second binding of ``cuda``)."""
    status: dict[str, str | None] = {"cuda": _cuda_missing()}
    try:
        _compiler()
        status["cpu"] = None
    except RuntimeError as exc:
        status["cpu"] = str(exc)
    status["pycuda"] = status["cuda"] or _pycuda_missing()
    return status


def available_backends() -> list[str]:
    """Backends that can run here, best first (subset of ``["cuda", "cpu"]``)."""
    status = backend_status()
    return [k for k in ("cuda", "cpu") if status[k] is None]


def _choose(backend: str | None, on_cuda: bool) -> str:
    """The backend to run on (``backend``, or the default for data ``on_cuda``); raises
    ``ValueError`` for an unknown name, ``RuntimeError`` naming what an unavailable one lacks."""
    if backend is None:
        if on_cuda:
            if _cuda_missing() is None:
                return "cuda"
            raise RuntimeError(f"data on a CUDA device but the 'cuda' kernel backend is "
                               f"unavailable: {_cuda_missing()}")
        backend = "cpu"
    if backend not in ("cuda", "cpu"):
        raise ValueError(f"backend must be 'cuda', 'cpu' or None, got {backend!r}")
    if backend == "cuda":
        why = _cuda_missing()
    else:
        try:
            _cpu_lib()                                   # built (or loaded) once per process
            why = None
        except (RuntimeError, OSError) as exc:
            why = str(exc)
    if why is not None:
        raise RuntimeError(f"the {backend!r} kernel backend is unavailable: {why}")
    return backend


def pyr_down_into(src: torch.Tensor, dst: torch.Tensor, *, backend: str | None = None,
                  binding: str | None = None) -> None:
    """One ``pyr_down`` kernel step ``src [B, C, H, W] -> dst [B, C, ceil(H/2), ceil(W/2)]``
    (any strides, float32, same device; on the current torch stream for ``"cuda"``)."""
    b = src.shape[0]
    hm, wm = dst.shape[-2:]
    if tuple(dst.shape) != (b, src.shape[1], -(-src.shape[-2] // 2), -(-src.shape[-1] // 2)):
        raise ValueError(f"dst must be [B, C, ceil(H/2), ceil(W/2)] for src {tuple(src.shape)}, "
                         f"got {tuple(dst.shape)}")
    if b * hm * wm >= 2**31:
        raise ValueError("pyr_down_into: a level holds >= 2**31 pixels")
    table = level_table([src, dst])
    be = _choose(backend, src.device.type == "cuda")
    if be == "cpu":
        _cpu_lib().pyr_down_cpu(ctypes.byref(table), 0, ctypes.byref(table), 1, b)
    else:
        _launch_cuda("pyr_down", src.device, _grid(b * hm * wm), 256,
                     [table, ctypes.c_int(0), table, ctypes.c_int(1), ctypes.c_int(b)], binding)


def divprune_greedy(features: torch.Tensor, first: torch.Tensor, budget: int) -> torch.Tensor:
    """DivPrune's greedy max-min selection on the CPU: ``features [B, M, D]`` (unit rows),
    ``first [B]`` seed indices -> chosen indices ``[B, budget]`` (C++; the torch loop in
    :func:`fovea_core.allocators.peers.divprune` is the same rule on other devices)."""
    _choose("cpu", False)
    b, m, d = features.shape
    ft = features.detach().float().cpu().transpose(1, 2).contiguous()          # [B, D, M]
    fst = first.detach().long().cpu().contiguous()
    chosen = torch.empty(b, budget, dtype=torch.int64)
    scratch = torch.empty(b * 2 * m, dtype=torch.float32)
    _cpu_lib().divprune_cpu(b, m, d, budget, _ptr(ft), _ptr(fst), _ptr(chosen), _ptr(scratch))
    return chosen


def _pyr_down_cuda(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """:func:`fovea_core.pyramid.build_pyramid`'s CUDA step (registered below): one
    ``pyr_down`` kernel launch, or ``False`` when the CUDA backend is unavailable."""
    if _cuda_missing() is not None:
        return False
    pyr_down_into(src, dst, backend="cuda")
    return True


# the pyramid (layer 0) never imports the kernels; the kernels hand it their CUDA step
register_pyr_down("cuda", _pyr_down_cuda)
