"""The public kernels: backend choice (:mod:`fovea_core.kernels`) and the operations
(gather, pyramid, DivPrune, V1 candidates and selection). This layer
decides nothing: what to sample comes in as a :class:`~fovea_core.tokens.TokenSet`,
what the V1 allocator plans comes in as its plan (:func:`v1_layout`).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence

import torch

from fovea_core.kernels.build import _compiler
from fovea_core.kernels.cpu import CPU_PARALLEL_TOKENS, _cpu_lib, _ptr
from fovea_core.kernels.cuda import _cuda_missing, _grid, _launch_cuda, _pycuda_missing, _u64
from fovea_core.kernels.layout import MAX_LEVELS, _levels_of, _table_of, level_table
from fovea_core.kernels.pyramids import _layout
from fovea_core.pyramid import Pyramid, default_num_levels, register_pyr_down
from fovea_core.tokens import TokenSet

__all__ = ["backend_status", "available_backends", "gather_patches", "device_pyramid",
           "pyr_down_into", "divprune_greedy", "v1_candidates_kernel",
           "select_candidates_kernel", "v1_layout"]


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


def gather_patches(pyramid: "Pyramid | Sequence[torch.Tensor]", tokens: TokenSet,
                   patch: int | None = None, backend: str | None = None, *,
                   binding: str | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Kernel version of the Gaussian-pyramid (``"mip"``) read of
    ``fovea_book.reference_samplers.sample_mip``: ``[B, N, C, p, p]`` float32.

    Same convention (bilinear, clamp-to-edge, spacing one level-``l`` pixel; fractional
    ``tokens.levels`` trilinear) and, with the sample spacing ``2**level`` taken from
    ``torch.exp2``, the same bits as the torch reference
    (``fovea_book.reference_samplers.sample_reference``). The pyramid is read in place (any
    strides; see :func:`level_table`). On ``"cuda"`` everything stays on the device and the
    kernel is queued on the current torch stream: no host round trip (a token level beyond
    the pyramid is read at its top level instead of raising, which would need one).

    Args:
        pyramid: a :class:`Pyramid` or a sequence of levels.
        tokens: ``[B, N]`` tokens of the same ``image_size``.
        out: optional ``[B, N, C, p, p]`` float32 result buffer on the right device.
    """
    levels = _levels_of(pyramid)
    p = tokens.patch if patch is None else patch
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"patch must be an int >= 1, got {p!r}")
    b, n = tokens.levels.shape
    c = levels[0].shape[1]
    _check_match(levels[0].shape[0], tuple(levels[0].shape[-2:]), tokens)
    dev = levels[0].device
    be = _choose(backend, dev.type == "cuda")
    nl = len(levels)
    h, w = tokens.image_size
    if be == "cpu":
        _check_levels(tokens, nl)
        if p > 256:
            raise ValueError(f"patch must be <= 256 for the CPU kernel, got {p}")
        levels = [lv.cpu() for lv in levels]
        table = level_table(levels)
        cen, lods, steps = _token_arrays(tokens, torch.device("cpu"), nl)
        res = out if out is not None else torch.empty(b, n, c, p, p, dtype=torch.float32)
        _check_out(res, (b, n, c, p, p), torch.device("cpu"))
        _cpu_lib().gather_patches_cpu(ctypes.byref(table), b, n, h, w, p, _ptr(cen), _ptr(lods),
                                      _ptr(steps), _ptr(res), CPU_PARALLEL_TOKENS)
        return res
    levels, table = _table_of(pyramid)
    cen, lods, steps = _token_arrays(tokens, dev, nl)
    res = out if out is not None else torch.empty(b, n, c, p, p, dtype=torch.float32, device=dev)
    _check_out(res, (b, n, c, p, p), dev)
    if b * n:
        _launch_cuda("gather_patches", dev, min(b * n, 2**31 - 1), 32 * math.ceil(min(p * p, 1024) / 32),
                     [table, ctypes.c_int(b), ctypes.c_int(n), ctypes.c_int(h), ctypes.c_int(w),
                      ctypes.c_int(p), _u64(cen), _u64(lods), _u64(steps), _u64(res)], binding)
    return res


def _check_match(batch: int, size: tuple[int, int], tokens: TokenSet) -> None:
    """Raise ``ValueError`` unless a pyramid of ``batch`` images of ``size`` fits ``tokens``."""
    if batch != tokens.levels.shape[0] or tuple(size) != tuple(tokens.image_size):
        raise ValueError(f"pyramid (B={batch}, size={tuple(size)}) does not match tokens "
                         f"(B={tokens.levels.shape[0]}, size={tokens.image_size})")


def _check_levels(tokens: TokenSet, num_levels: int) -> None:
    """Raise ``ValueError`` when a token's level lies beyond a pyramid of ``num_levels`` (one
    host read: the CPU paths only)."""
    lmax = float(tokens.levels.max())
    if lmax > num_levels - 1:
        raise ValueError(f"tokens.levels must lie in [0, {num_levels - 1}] (the pyramid has "
                         f"{num_levels} levels), got a level {lmax:g}")


def _token_arrays(tokens: TokenSet, device: torch.device, num_levels: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the gather kernels read of ``tokens``, float32 and contiguous on ``device``: the
    centres ``[B, N, 2]``, the levels clipped to the pyramid's top ``[B, N]`` (a level beyond
    it is read at the top, not raised: that would need a read from the device) and the sample
    spacings ``2**level`` ``[B, N]`` from ``torch.exp2``, as the reference computes them."""
    cen = tokens.centers.detach().to(device, torch.float32).contiguous()
    lv = tokens.levels.detach().to(device, torch.float32).contiguous()
    return cen, lv.clamp(max=num_levels - 1), torch.exp2(lv)


def _check_out(out: torch.Tensor, shape: tuple, device: torch.device) -> None:
    """Raise ``ValueError`` unless ``out`` is a contiguous float32 ``shape`` on ``device``."""
    if tuple(out.shape) != shape or out.dtype != torch.float32 or not out.is_contiguous() \
            or out.device.type != device.type:
        raise ValueError(f"out must be a contiguous float32 tensor {list(shape)} on {device}, "
                         f"got {out.dtype} {list(out.shape)} on {out.device}")


def device_pyramid(image: torch.Tensor, num_levels: int | None = None, *, patch: int = 16,
                   backend: str | None = None, binding: str | None = None) -> Pyramid:
    """A pyramid built by the ``pyr_down`` kernel, packed: level 0 is ``image`` itself (no
    copy), levels ``1..`` are views of one buffer on the image's device (channels last when
    ``image`` is, e.g. ``x.contiguous(memory_format=torch.channels_last)``), each written
    by one kernel launch (on the current torch stream for ``"cuda"``). Equal to
    :func:`fovea_core.pyramid.build_pyramid` up to float rounding (``cv2.pyrDown``).

    Args:
        image: float32 tensor ``[B, C, H, W]`` (any strides) on the CPU or a CUDA device.
    """
    if not isinstance(image, torch.Tensor) or image.ndim != 4 or image.dtype != torch.float32:
        raise ValueError("image must be a float32 tensor [B, C, H, W]; convert it with "
                         "fovea_core.pyramid.as_image_batch")
    b, c, h, w = image.shape
    num_levels = default_num_levels(h, w, patch) if num_levels is None else int(num_levels)
    if not 1 <= num_levels <= MAX_LEVELS:
        raise ValueError(f"num_levels must be in [1, {MAX_LEVELS}], got {num_levels}")
    dev = image.device
    be = _choose(backend, dev.type == "cuda")
    offsets, sizes, total = _layout(b, c, h, w, num_levels, first=1)
    buf = torch.empty(total, dtype=torch.float32, device=dev if be == "cuda" else "cpu")
    levels = [image if be == "cuda" else image.cpu()]
    nhwc = image.stride(1) == 1 and c > 1                 # channels last in: channels last out
    for m in range(1, num_levels):
        hm, wm = int(sizes[m - 1, 0]), int(sizes[m - 1, 1])
        off = int(offsets[m - 1])
        blk = buf[off:off + b * c * hm * wm]
        levels.append(blk.view(b, hm, wm, c).permute(0, 3, 1, 2) if nhwc
                      else blk.view(b, c, hm, wm))
    table = level_table(levels)
    for m in range(1, num_levels):
        hm, wm = levels[m].shape[-2:]
        if levels[m - 1].shape[-1] < 3 or levels[m - 1].shape[-2] < 3:
            raise ValueError(f"level {m - 1} is {tuple(levels[m - 1].shape[-2:])}: pyr_down "
                             "needs H, W >= 3 (ask for fewer levels)")
        if b * hm * wm >= 2**31:
            raise ValueError("device_pyramid: a level holds >= 2**31 pixels")
        if be == "cpu":
            _cpu_lib().pyr_down_cpu(ctypes.byref(table), m - 1, ctypes.byref(table), m, b)
        else:
            _launch_cuda("pyr_down", dev, _grid(b * hm * wm), 256,
                         [table, ctypes.c_int(m - 1), table, ctypes.c_int(m), ctypes.c_int(b)],
                         binding)
    return Pyramid(tuple(levels))


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


def v1_candidates_kernel(plan, backend: str | None = None, *, binding: str | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the ``v1_candidates`` kernel for a plan of the V1 allocator
    (:class:`~fovea_core.allocators.cortical.V1Plan`, read by attribute: ``image_size``,
    ``patch``, ``num_levels``, ``ppd``, ``e0``, ``fix_px [B, 2]``, ``fovea``, ``rays``,
    ``rings``, ``stride``, ``ring_step [B]``, ``fs_max``, ``r_max``, ``a_max``, ``k_slots``):
    ``cxy [B, K, 2]`` float32, ``level [B, K]`` int64, ``valid [B, K]`` bool (on the CPU;
    the plan itself is computed on the CPU)."""
    b, k = plan.fix_px.shape[0], plan.k_slots
    h, w = plan.image_size
    scal = (h, w, plan.patch, plan.num_levels, plan.fs_max, plan.r_max, plan.a_max)
    fix = plan.fix_px.double().contiguous()
    fovea = plan.fovea.int().contiguous()
    rays, rings = plan.rays.int().contiguous(), plan.rings.int().contiguous()
    stride = plan.stride.int().contiguous()
    rstep = plan.ring_step.double().contiguous()
    be = _choose(backend, False)
    if be == "cpu":
        cxy = torch.empty(b, k, 2, dtype=torch.float32)
        lvl = torch.empty(b, k, dtype=torch.int32)
        val = torch.empty(b, k, dtype=torch.int32)
        _cpu_lib().v1_candidates_cpu(*scal, plan.ppd, plan.e0, b, k, _ptr(fix), _ptr(fovea),
                                     _ptr(rays), _ptr(rings), _ptr(stride), _ptr(rstep),
                                     _ptr(cxy), _ptr(lvl), _ptr(val))
    else:
        dev = torch.device("cuda", torch.cuda.current_device())
        fix, fovea, rays, rings = (t.to(dev) for t in (fix, fovea, rays, rings))
        stride, rstep = stride.to(dev), rstep.to(dev)
        cxy = torch.empty(b, k, 2, dtype=torch.float32, device=dev)
        lvl = torch.empty(b, k, dtype=torch.int32, device=dev)
        val = torch.empty(b, k, dtype=torch.int32, device=dev)
        _launch_cuda("v1_candidates", dev, _grid(b * k), 256,
                     [*(ctypes.c_int(s) for s in scal), ctypes.c_double(plan.ppd),
                      ctypes.c_double(plan.e0), ctypes.c_int(b), ctypes.c_int(k), _u64(fix),
                      _u64(fovea), _u64(rays), _u64(rings), _u64(stride), _u64(rstep), _u64(cxy),
                      _u64(lvl), _u64(val)], binding)
        cxy, lvl, val = cxy.cpu(), lvl.cpu(), val.cpu()
    return cxy, lvl.long(), val.bool()


def select_candidates_kernel(cxy: torch.Tensor, level: torch.Tensor, valid: torch.Tensor,
                             budget: int, image_size: tuple[int, int]) -> torch.Tensor:
    """The V1 allocator's selection in C++ (CPU): per image the first ``budget`` valid
    candidates of distinct cells, in candidate order; the same rule as
    :func:`fovea_core.allocators.cortical.select_candidates` (the torch version).

    Args:
        cxy: ``[B, K, 2]`` float32 candidate centres (normalised); level: ``[B, K]`` int;
        valid: ``[B, K]`` bool; image_size: ``(H, W)``.

    Returns:
        ``[B, budget]`` int64 candidate indices. Raises ``ValueError`` naming the image
        that has fewer than ``budget`` distinct candidates.
    """
    _choose("cpu", False)
    b, k = cxy.shape[:2]
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ValueError(f"budget must be an int >= 0, got {budget!r}")
    chosen = torch.empty(b, budget, dtype=torch.int64)
    c32 = cxy.detach().cpu().float().contiguous()
    lvl32, val32 = level.detach().cpu().int().contiguous(), valid.detach().cpu().int().contiguous()
    rc = _cpu_lib().select_candidates_cpu(b, k, budget, int(image_size[0]), int(image_size[1]),
                                          _ptr(c32), _ptr(lvl32), _ptr(val32), _ptr(chosen))
    if rc != 0:
        raise ValueError(f"image {-1 - rc} has fewer than {budget} distinct candidates")
    return chosen


def v1_layout(plan, backend: str | None = None, *, binding: str | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The V1 allocation kernels for a plan of the V1 allocator: ``(centers [B, N, 2],
    levels [B, N])`` with ``N = plan.budget``.

    The candidates come from the ``v1_candidates`` kernel on ``backend``
    (:func:`v1_candidates_kernel`), the selection of the first ``N`` distinct ones from
    the C++ loop on the host, where the candidates are (:func:`select_candidates_kernel`;
    so this needs the CPU build on either backend). The plan is the allocator's decision:
    :func:`fovea_core.allocators.cortical.v1_layout` makes it from fixations and calls
    this; the result equals :func:`~fovea_core.allocators.cortical.v1_cortical` (the
    torch reference).
    """
    if isinstance(plan, torch.Tensor) or not hasattr(plan, "k_slots"):
        raise TypeError("v1_layout takes the V1 allocator's plan "
                        "(fovea_core.allocators.cortical.plan_v1), got "
                        f"{type(plan).__name__}; from fixations call "
                        "fovea_core.allocators.cortical.v1_layout(fixations, image_size, "
                        "budget, num_levels=..., backend=...)")
    be = _choose(backend, False)
    cxy, lvl, val = v1_candidates_kernel(plan, be, binding=binding)
    chosen = select_candidates_kernel(cxy, lvl, val, int(plan.budget), plan.image_size)
    centers = torch.gather(cxy, 1, chosen[..., None].expand(-1, -1, 2))
    return centers, torch.gather(lvl, 1, chosen).float()


def _pyr_down_cuda(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """:func:`fovea_core.pyramid.build_pyramid`'s CUDA step (registered below): one
    ``pyr_down`` kernel launch, or ``False`` when the CUDA backend is unavailable."""
    if _cuda_missing() is not None:
        return False
    pyr_down_into(src, dst, backend="cuda")
    return True


# the pyramid (layer 0) never imports the kernels; the kernels hand it their CUDA step
register_pyr_down("cuda", _pyr_down_cuda)
