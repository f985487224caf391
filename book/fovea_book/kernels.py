"""The kernels as the book runs them: the core's (:mod:`fovea_core.kernels`, re-exported)
and the operations only the book runs (chapter 05, the benchmarks), called through the
core's binding of the same g++ / CUDA builds:

* :func:`gather_patches` (the Gaussian-pyramid read of
  :func:`fovea_book.reference_samplers.sample_mip`, bit for bit its exact definition) on a
  pyramid from :func:`device_pyramid`, :func:`build_pyramid_cv2` or ``build_pyramid``;
  :func:`sample_image` (image -> patches on the CPU, building only the levels the tokens
  read, :func:`levels_needed`); :func:`gather_tokens` (the fused gather into a VLM patch
  embedding's layout, from :func:`nhwc4_pyramid`);
* :func:`remap` (the LUT sampler of the log-polar chapter);
* :func:`v1_layout` (the V1 allocator's plan on the ``v1_candidates`` kernel;
  :func:`v1_allocate` from fixations).

No ``foveate`` call, registered method, command or processor runs them.
"""

from __future__ import annotations

import ctypes
import math
import threading
from collections.abc import Sequence

import numpy as np
import torch

from fovea_core.allocators.cortical import plan_v1
from fovea_core.kernels import (CUDA_DIR, CXX_FLAGS, MAX_LEVELS, NVCC_FLAGS, SOURCES,
                                LevelTable, available_backends, backend_status,
                                build_cpu_library, divprune_greedy, level_table, pyr_down_into)
from fovea_core.kernels.cpu import CPU_PARALLEL_TOKENS, _cpu_lib, _ptr
from fovea_core.kernels.cuda import _grid, _launch_cuda, _u64
from fovea_core.kernels.ops import _choose
from fovea_core.pyramid import Pyramid, as_image_batch, default_num_levels
from fovea_core.tokens import TokenSet

__all__ = ["available_backends", "backend_status", "build_cpu_library", "build_pyramid_cv2",
           "device_pyramid", "levels_needed", "pyr_down_into", "gather_patches",
           "gather_tokens", "nhwc4_pyramid", "sample_image", "remap", "v1_allocate",
           "v1_layout", "v1_candidates_kernel", "select_candidates_kernel", "divprune_greedy",
           "level_table", "LevelTable", "NVCC_FLAGS", "CXX_FLAGS", "MAX_LEVELS", "CUDA_DIR",
           "SOURCES"]


#: threads per block of the ``gather_tokens`` kernel (``GATHER_TOKENS_BLOCK`` in the source;
#: its ``__launch_bounds__`` promise 2 blocks of this size an SM: the persistent grid's size)
GATHER_TOKENS_BLOCK = 256
GATHER_TOKENS_BLOCKS_PER_SM = 2


def nhwc4_pyramid(image: torch.Tensor, num_levels: int | None = None, *, patch: int = 16,
                  backend: str | None = None, binding: str | None = None) -> Pyramid:
    """The pyramid :func:`gather_tokens` reads: channels last, channels padded with zeros to a
    multiple of 4 (RGB -> RGB0), so that one tap of four channels is one 128-bit load.

    ``image [B, C, H, W]`` float32 (any strides) is copied once into the padded channels-last
    level 0, and :func:`device_pyramid` builds the levels above it (each channel on its own,
    so the first ``C`` channels of every level equal :func:`device_pyramid` of ``image``
    bit for bit and the padding stays 0). Returns levels ``[B, C4, H_m, W_m]`` with
    ``stride(1) == 1`` and ``C4 = 4 * ceil(C / 4)``.
    """
    if not isinstance(image, torch.Tensor) or image.ndim != 4 or image.dtype != torch.float32:
        raise ValueError("image must be a float32 tensor [B, C, H, W]; convert it with "
                         "fovea_core.pyramid.as_image_batch")
    b, c, h, w = image.shape
    c4 = 4 * -(-c // 4)
    base = torch.zeros(b, h, w, c4, dtype=torch.float32, device=image.device)
    base[..., :c] = image.permute(0, 2, 3, 1)
    return device_pyramid(base.permute(0, 3, 1, 2), num_levels, patch=patch, backend=backend,
                          binding=binding)


def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (cached by torch)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_properties(idx).multi_processor_count


def gather_tokens(pyramid: "Pyramid | Sequence[torch.Tensor]", tokens: TokenSet, *,
                  channels: int | None = None, temporal: int = 1, merge: int = 1,
                  dtype: torch.dtype = torch.float32, backend: str | None = None,
                  binding: str | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """The fused gather: the tokens' patches straight in a VLM patch embedding's layout.

    Returns ``[B, N, M*M, C, T, q, q]`` in ``dtype`` (float32 or bfloat16), ``M = merge``,
    ``q = p / M``: each token's ``p x p`` samples as ``M x M`` blocks (row-major), each block
    channel, then temporal copy, then row, then column. With ``merge=2, temporal=2``,
    ``.view(B * N * 4, C * 2 * q * q)`` are the ``pixel_values`` rows of a Qwen2-VL-style
    processor (``fovea_core.vlm.qwen.pixel_values``: a merged token is a 2 x 2 block of ViT
    patches, a still image is repeated over ``temporal_patch_size = 2``), before its
    normalisation. Values: those of :func:`gather_patches` bit for bit (its first ``C``
    channels, rearranged and repeated; rounded to nearest even for bfloat16, as
    ``.to(torch.bfloat16)`` rounds).

    How it reads and writes (``cuda/fovea_kernels.cuh``, ``gather_token_quad``): the pyramid
    is channels last with a multiple of 4 channels (:func:`nhwc4_pyramid`), so one tap of four
    channels is one 128-bit load; one thread computes four consecutive samples of a token and
    writes each output channel as one 128-bit store (64-bit in bfloat16); a block holds
    several tokens; the grid is persistent (sized to fill the GPU once). On ``"cuda"`` it is
    queued on the current torch stream with no host round trip; ``"cpu"`` runs the same
    per-quad code in the g++ build (the parity path).

    Args:
        pyramid: levels ``[B, C4, H_m, W_m]`` float32 with ``stride(1) == 1``, ``C4 % 4 == 0``
            and 16-byte aligned level images (what :func:`nhwc4_pyramid` returns).
        tokens: ``[B, N]`` tokens of the pyramid's image size.
        channels: how many leading channels to write (default: all ``C4``).
        temporal: copies of each patch along T (``>= 1``).
        merge: blocks per side (``>= 1``, dividing ``tokens.patch``).
        dtype: ``torch.float32`` or ``torch.bfloat16``.
        out: optional contiguous result buffer of the returned shape, dtype and device.

    Raises:
        ValueError: a pyramid not in that layout, ``channels`` outside ``[1, C4]``,
            ``temporal < 1``, a ``merge`` that does not divide the patch, another dtype, or
            a size mismatch with ``tokens``.
    """
    levels = _levels_of(pyramid)
    b, n = tokens.levels.shape
    c4 = levels[0].shape[1]
    _check_match(levels[0].shape[0], tuple(levels[0].shape[-2:]), tokens)
    for m, lv in enumerate(levels):
        if c4 % 4 or lv.stride(1) != 1 or lv.stride(3) != c4 or lv.data_ptr() % 16:
            raise ValueError(f"pyramid level {m}: gather_tokens reads channels-last levels "
                             f"with a multiple of 4 channels, 16-byte aligned (got shape "
                             f"{tuple(lv.shape)}, strides {lv.stride()}); build it with "
                             "nhwc4_pyramid")
    c = c4 if channels is None else channels
    if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= c4:
        raise ValueError(f"channels must be an int in [1, {c4}], got {channels!r}")
    if isinstance(temporal, bool) or not isinstance(temporal, int) or temporal < 1:
        raise ValueError(f"temporal must be an int >= 1, got {temporal!r}")
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dtype must be torch.float32 or torch.bfloat16, got {dtype}")
    p = tokens.patch
    if isinstance(merge, bool) or not isinstance(merge, int) or merge < 1 or p % merge:
        raise ValueError(f"merge must be an int >= 1 dividing the patch ({p}), got {merge!r}")
    q = p // merge
    dev = levels[0].device
    be = _choose(backend, dev.type == "cuda")
    nl = len(levels)
    h, w = tokens.image_size
    shape = (b, n, merge * merge, c, temporal, q, q)
    run_dev = dev if be == "cuda" else torch.device("cpu")
    res = out if out is not None else torch.empty(shape, dtype=dtype, device=run_dev)
    if tuple(res.shape) != shape or res.dtype != dtype or not res.is_contiguous() \
            or res.device.type != run_dev.type or res.data_ptr() % 16:
        raise ValueError(f"out must be a contiguous, 16-byte aligned {dtype} tensor "
                         f"{list(shape)} on {run_dev}, got {res.dtype} {list(res.shape)} on "
                         f"{res.device}")
    bf16 = int(dtype == torch.bfloat16)
    if be == "cpu":
        if b * n:
            _check_levels(tokens, nl)
        levels = [lv.cpu() for lv in levels]
        table = level_table(levels)
        cen, lods, steps = _token_arrays(tokens, torch.device("cpu"), nl)
        _cpu_lib().gather_tokens_cpu(ctypes.byref(table), b, n, h, w, p, merge, c, temporal,
                                     bf16, _ptr(cen), _ptr(lods), _ptr(steps), _ptr(res),
                                     CPU_PARALLEL_TOKENS)
        return res
    levels, table = _table_of(pyramid)
    cen, lods, steps = _token_arrays(tokens, dev, nl)
    if b * n:
        quads = merge * merge * -(-q * q // 4)                      # threads a token wants
        tpb = max(1, GATHER_TOKENS_BLOCK // min(quads, GATHER_TOKENS_BLOCK))
        grid = min(-(-b * n // tpb), GATHER_TOKENS_BLOCKS_PER_SM * _sm_count(dev))
        _launch_cuda("gather_tokens", dev, grid, GATHER_TOKENS_BLOCK,
                     [table, ctypes.c_int(b), ctypes.c_int(n), ctypes.c_int(h), ctypes.c_int(w),
                      ctypes.c_int(p), ctypes.c_int(merge), ctypes.c_int(c),
                      ctypes.c_int(temporal),
                      ctypes.c_int(bf16), _u64(cen), _u64(lods), _u64(steps), _u64(res)],
                     binding)
    return res


def sample_image(image: np.ndarray | torch.Tensor, tokens: TokenSet, *,
                 backend: str | None = None, binding: str | None = None,
                 onepass: bool = True) -> torch.Tensor:
    """End to end: image -> the tokens' patches ``[B, N, C, p, p]``, building only the
    pyramid levels the tokens read.

    * CPU (a numpy image, or a CPU tensor), ``onepass=True`` (the default, 1-4 channels):
      one C++ call (``sample_image_onepass_cpu``) streams over the image rows once, blurring
      each row once and building levels ``1..levels_needed(tokens)-1`` row by row (each
      deeper level from the rows of the one above while they are in cache), with
      ``cv2.pyrDown``'s float arithmetic (so its bits), then gathers every token with the
      gather kernel's arithmetic. Equal, bit for bit, to ``onepass=False``.
    * CPU, ``onepass=False``: level 0 is the image itself, levels ``1..`` are written by
      ``cv2.pyrDown`` into one channels-last buffer (:func:`build_pyramid_cv2`), then one
      fused gather pass (g++ kernel, :func:`gather_patches`).
    * CUDA (a CUDA float32 tensor ``[B, C, H, W]``): :func:`device_pyramid` then the gather
      kernel, both on the current stream, no host round trip (the level count comes from the
      image size, not from the tokens, which would need a read from the device).
    """
    if isinstance(image, torch.Tensor) and image.is_cuda:
        pyr = device_pyramid(image, patch=tokens.patch, backend=backend, binding=binding)
        return gather_patches(pyr, tokens, backend=backend, binding=binding)
    arr = _hwc_float_batch(image)
    b, h, w, c = arr.shape
    if onepass and backend in (None, "cpu") and 1 <= c <= 4 and tokens.levels.numel():
        return _sample_image_onepass(arr, tokens, min(h, w).bit_length())
    nl = levels_needed(tokens, min(h, w).bit_length())          # every level >= 1 px
    ws = _workspace(4 * _layout(b, c, h, w, nl, first=1)[2])   # the pyramid does not escape
    return gather_patches(build_pyramid_cv2(arr, nl, _buffer=ws), tokens,
                          backend=backend or "cpu")


def _cpu_f32(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a contiguous float32 CPU tensor (itself when it is one already)."""
    if t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous():
        return t
    return t.detach().cpu().to(torch.float32).contiguous()


def _sample_image_onepass(arr: np.ndarray, tokens: TokenSet, max_levels: int) -> torch.Tensor:
    """:func:`sample_image`'s CPU path: ``arr [B, H, W, C]`` float32 (1-4 channels) ->
    ``[B, N, C, p, p]`` by one ``sample_image_onepass_cpu`` call (two when a level is
    fractional), which builds ``levels_needed(tokens, max_levels)`` levels. The same checks
    (and messages) as :func:`gather_patches` on the CPU. Lean on purpose: each Python or
    torch step costs tens of microseconds when the caches are cold (as they are between
    images), so the level count and the integer steps ``2**level`` are found in C."""
    try:
        lib = _cpu_lib()
    except (RuntimeError, OSError):
        _choose("cpu", False)                            # raises naming what is missing
        raise
    b, h, w, c = arr.shape
    p = tokens.patch
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"patch must be an int >= 1, got {p!r}")
    if p > 256:
        raise ValueError(f"patch must be <= 256 for the CPU kernel, got {p}")
    n = tokens.levels.shape[1]
    _check_match(b, (h, w), tokens)
    if h * w * c >= 2**31:
        raise ValueError(f"image {(h, w, c)} is too large for 32-bit indexing inside one image")
    lods = _cpu_f32(tokens.levels)
    cen = _cpu_f32(tokens.centers)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    ws = _workspace(4 * _layout_lists(b, c, h, w, max_levels, first=1)[2])
    out = torch.empty(b, n, c, p, p, dtype=torch.float32)
    args = [arr.__array_interface__["data"][0], b, h, w, c, max_levels,
            ws.__array_interface__["data"][0], p, n, cen.data_ptr(), lods.data_ptr(), None,
            out.data_ptr(), CPU_PARALLEL_TOKENS]
    rc = lib.sample_image_onepass_cpu(*args)  # the level count and 2^level (integer levels)
    if rc == -3:                              # in C; fractional levels: torch.exp2's steps
        steps = torch.exp2(lods)              # (the reference's own exp2)
        args[11] = steps.data_ptr()
        rc = lib.sample_image_onepass_cpu(*args)
    if rc == -2:
        _check_levels(tokens, levels_needed(tokens, max_levels))
    if rc < 1:
        raise RuntimeError(f"sample_image_onepass_cpu failed ({rc}): C = {c}, "
                           f"levels <= {max_levels}")
    return out


def remap(image: torch.Tensor, lut: torch.Tensor, backend: str | None = None, *,
          binding: str | None = None) -> torch.Tensor:
    """Bilinear look-up-table sampling, ``cv2.remap`` with a zero border (the operations of
    the torch reference ``fovea_book.reference_samplers.remap_reference`` in its order, so
    its bits). The
    image is read in place (any strides, e.g. channels last).

    ``image [B, C, H, W]``, ``lut [B or 1, Ho, Wo, 2]`` (x, y OpenCV pixel coordinates)
    -> ``[B, C, Ho, Wo]`` float32, on the image's device for ``"cuda"``.
    """
    if image.ndim != 4:
        raise ValueError(f"image must be [B, C, H, W], got {tuple(image.shape)}")
    b, c, h, w = image.shape
    if lut.ndim != 4 or lut.shape[-1] != 2 or lut.shape[0] not in (1, b):
        raise ValueError(f"lut must be [B or 1, Ho, Wo, 2] with B = {b}, got {tuple(lut.shape)}")
    lb, ho, wo = lut.shape[:3]
    be = _choose(backend, image.device.type == "cuda")
    dev = image.device if be == "cuda" else torch.device("cpu")
    img = image.detach().to(dev, torch.float32)             # read in place (any strides)
    if img.stride(0) < 0 or min(img.stride()) < 0:
        img = img.contiguous()
    sb, sc, sy, sx = img.stride()
    if sc * (c - 1) + sy * (h - 1) + sx * (w - 1) >= 2**31 or b * ho * wo >= 2**31:
        raise ValueError("remap: image or output too large for 32-bit indexing")
    lt = lut.detach().to(dev, torch.float32).contiguous()
    out = torch.empty(b, c, ho, wo, dtype=torch.float32, device=dev)
    if be == "cpu":
        _cpu_lib().remap_lut_cpu(_ptr(img), sb, sc, sy, sx, b, c, h, w, _ptr(lt), lb, ho, wo,
                                 _ptr(out))
        return out
    _launch_cuda("remap_lut", dev, _grid(b * ho * wo), 256,
                 [_u64(img), ctypes.c_longlong(sb), ctypes.c_int(sc), ctypes.c_int(sy),
                  ctypes.c_int(sx), ctypes.c_int(b), ctypes.c_int(c), ctypes.c_int(h),
                  ctypes.c_int(w), _u64(lt), ctypes.c_int(lb), ctypes.c_int(ho), ctypes.c_int(wo),
                  _u64(out)], binding)
    return out


# ----------------------------------------------------------------------------- host pyramids
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


# ----------------------------------------------------------------------------- gather, pyramid
def _table_of(pyramid: "Pyramid | Sequence[torch.Tensor]"
              ) -> tuple[list[torch.Tensor], LevelTable]:
    """The levels and their :class:`LevelTable`, cached on a :class:`Pyramid` (immutable)."""
    if isinstance(pyramid, Pyramid):
        hit = pyramid.__dict__.get("_kernel_table")
        if hit is None:
            levels = list(pyramid.levels)
            hit = (levels, level_table(levels))
            pyramid.__dict__["_kernel_table"] = hit
        return hit
    levels = _levels_of(pyramid)
    return levels, level_table(levels)


def _levels_of(pyramid: "Pyramid | Sequence[torch.Tensor]") -> list[torch.Tensor]:
    """The levels ``[B, C, H_m, W_m]`` of any pyramid form (views, no copy)."""
    if isinstance(pyramid, Pyramid):
        return list(pyramid.levels)
    return list(pyramid)


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


# ----------------------------------------------------------------------------- V1 layout
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
    :func:`v1_allocate` makes it from fixations and calls
    this; the result equals :func:`~fovea_core.allocators.cortical.v1_cortical` (the
    torch reference).
    """
    if isinstance(plan, torch.Tensor) or not hasattr(plan, "k_slots"):
        raise TypeError("v1_layout takes the V1 allocator's plan "
                        "(fovea_core.allocators.cortical.plan_v1), got "
                        f"{type(plan).__name__}; from fixations call "
                        "fovea_book.kernels.v1_allocate(fixations, image_size, "
                        "budget, num_levels=..., backend=...)")
    be = _choose(backend, False)
    cxy, lvl, val = v1_candidates_kernel(plan, be, binding=binding)
    chosen = select_candidates_kernel(cxy, lvl, val, int(plan.budget), plan.image_size)
    centers = torch.gather(cxy, 1, chosen[..., None].expand(-1, -1, 2))
    return centers, torch.gather(lvl, 1, chosen).float()


def v1_allocate(fixations: torch.Tensor, image_size: tuple[int, int], budget: int, *,
              num_levels: int, patch: int = 16, backend: str | None = None,
              binding: str | None = None, **params) -> tuple[torch.Tensor, torch.Tensor]:
    """The V1 allocation on the kernels: ``(centers [B, N, 2], levels [B, N])`` for
    fixations ``[B, 2]`` (``(x, y)`` in ``[0, 1]``).

    The allocator plans (:func:`~fovea_core.allocators.cortical.plan_v1`; ``params`` are
    its keywords) and the kernels execute the plan (:func:`v1_layout`: the ``v1_candidates``
    kernel on ``backend``, ``"cpu"`` by default, then the C++ selection of the first
    ``budget`` distinct candidates). Same result as
    :func:`~fovea_core.allocators.cortical.v1_cortical` (the torch reference) with the
    same fixations; raises ``RuntimeError`` naming what is missing when the CPU build (or
    the requested backend) is unavailable.
    """
    plan = plan_v1(fixations, image_size, budget, patch=patch, num_levels=num_levels, **params)
    return v1_layout(plan, backend, binding=binding)
