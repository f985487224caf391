"""Load and call the foveated kernels of ``cuda/fovea_kernels.cu`` (GPU or CPU build).

One CUDA C source, two builds (see ``cuda/fovea_kernels.cuh`` and ``cuda/README.md``):

* ``"cuda"``: compiled by ``nvcc`` to a cubin for the device (``-fmad=false``, cached like the
  CPU library) and launched **on the current torch CUDA stream**, with torch tensors in and
  out: no host copies, no synchronisation. Two bindings launch the same cubin:
  ``"driver"`` (default; the CUDA driver API through ``ctypes``: any torch stream, no extra
  package) and ``"pycuda"`` (the optional ``gpu`` extra, imported only when asked for;
  pycuda cannot wrap a foreign stream handle, so it launches only while torch's current
  stream is the legacy default stream and raises otherwise).
* ``"cpu"``: the same source compiled by ``g++`` as a shared library (the ``__global__``
  kernels are compiled out, ``extern "C"`` loops over the same ``__host__ __device__``
  functions remain) and called through ``ctypes``. Built on first use into ``cuda/build/``
  (or ``$XDG_CACHE_HOME/fovea_core``), keyed by a hash of the sources, flags and compiler,
  written to a temporary name and renamed atomically, so concurrent first uses are safe.

Public functions take a ``backend`` in ``{"cuda", "cpu"}``; ``None`` picks ``"cuda"`` when
the data already lives on a CUDA device and the backend is available, else ``"cpu"``. An
unavailable backend raises ``RuntimeError`` naming what is missing.

**Pyramids reach the kernels as a level table** (``LevelTable`` in the header): a pointer and
element strides per level, passed by value. Any :class:`~fovea_core.pyramid.Pyramid` works
without repacking: the packed NCHW pyramids of :func:`fovea_core.pyramid.build_pyramid`,
the channels-last pyramids of :func:`build_pyramid_cv2` (level 0 is the caller's own image,
levels 1.. are written by ``cv2.pyrDown`` straight into one buffer) or the device pyramids
of :func:`device_pyramid` (the ``pyr_down`` kernel, packed on the GPU).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fovea_core.paths import project_root
from fovea_core.pyramid import Pyramid, as_image_batch, default_num_levels
from fovea_core.tokens import TokenSet

__all__ = ["PackedPyramid", "available_backends", "backend_status", "build_cpu_library",
           "build_packed_pyramid", "build_pyramid_cv2", "device_pyramid", "levels_needed",
           "pyr_down_into",
           "pack_pyramid", "gather_patches", "sample_image", "remap", "v1_layout",
           "v1_candidates_kernel", "cuda_source", "compile_cuda", "source_excerpt",
           "kernel_resources", "level_table", "NVCC_FLAGS", "CXX_FLAGS", "MAX_LEVELS"]

CUDA_DIR = project_root() / "cuda"
SOURCES = ("fovea_kernels.cu", "fovea_kernels.cuh")
# -ffp-contract=off / -fmad=false: no fused multiply-add in either build, so both round every
# operation separately, exactly as torch's elementwise ops do (bit-for-bit parity).
CXX_FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-std=c++17", "-shared", "-fPIC",
             "-x", "c++")
NVCC_FLAGS = ("-O3", "-fmad=false")
OPENMP_FLAG = "-fopenmp"
KERNEL_NAMES = ("gather_patches", "pyr_down", "remap_lut", "v1_candidates")
MAX_LEVELS = 16
#: the CPU gather runs its tokens on several threads only from this many tokens on (a
#: thread team costs more than one image's 273 tokens take)
CPU_PARALLEL_TOKENS = 2048


# ============================================================================ level table
class LevelTable(ctypes.Structure):
    """Mirror of ``struct LevelTable`` (``cuda/fovea_kernels.cuh``); passed by value."""

    _fields_ = [("ptr", ctypes.c_longlong * MAX_LEVELS), ("sb", ctypes.c_longlong * MAX_LEVELS),
                ("h", ctypes.c_int * MAX_LEVELS), ("w", ctypes.c_int * MAX_LEVELS),
                ("sc", ctypes.c_int * MAX_LEVELS), ("sy", ctypes.c_int * MAX_LEVELS),
                ("sx", ctypes.c_int * MAX_LEVELS), ("num_levels", ctypes.c_int),
                ("channels", ctypes.c_int)]


def _table_of(pyramid: "Pyramid | PackedPyramid | Sequence[torch.Tensor]"
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


def _levels_of(pyramid: "Pyramid | PackedPyramid | Sequence[torch.Tensor]") -> list[torch.Tensor]:
    if isinstance(pyramid, PackedPyramid):
        return [pyramid.level(m) for m in range(pyramid.num_levels)]
    if isinstance(pyramid, Pyramid):
        return list(pyramid.levels)
    return list(pyramid)


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


# ============================================================================ packed pyramid
@dataclass(frozen=True, eq=False)
class PackedPyramid:
    """All pyramid levels in one flat float32 buffer, channels last.

    Attributes:
        data: 1-D float32 tensor; level ``m`` is ``[B, H_m, W_m, C]`` at ``offsets[m]``.
        offsets: ``[L]`` int64 element offsets.  sizes: ``[L, 2]`` int32 ``(H_m, W_m)``.
        batch, channels: ``B`` and ``C``.
    """

    data: torch.Tensor
    offsets: torch.Tensor
    sizes: torch.Tensor
    batch: int
    channels: int

    @property
    def num_levels(self) -> int:
        return int(self.offsets.numel())

    @property
    def image_size(self) -> tuple[int, int]:
        return int(self.sizes[0, 0]), int(self.sizes[0, 1])

    @property
    def device(self) -> torch.device:
        return self.data.device

    def level(self, m: int) -> torch.Tensor:
        """Level ``m`` as a ``[B, C, H_m, W_m]`` view (channels-last strides)."""
        h, w = int(self.sizes[m, 0]), int(self.sizes[m, 1])
        off = int(self.offsets[m])
        blk = self.data[off:off + self.batch * h * w * self.channels]
        return blk.view(self.batch, h, w, self.channels).permute(0, 3, 1, 2)

    def as_pyramid(self) -> Pyramid:
        """The same levels as a :class:`Pyramid` of views (no copy)."""
        return Pyramid(tuple(self.level(m) for m in range(self.num_levels)))

    def unpack(self) -> Pyramid:
        """The equivalent :class:`Pyramid` (contiguous NCHW copies)."""
        return Pyramid(tuple(self.level(m).contiguous() for m in range(self.num_levels)))

    def to(self, device: str | torch.device) -> "PackedPyramid":
        return PackedPyramid(self.data.to(device), self.offsets, self.sizes, self.batch,
                             self.channels)


def _layout(batch: int, channels: int, h: int, w: int, num_levels: int, first: int = 0
            ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Sizes of levels ``first..num_levels-1`` and their offsets in one flat buffer."""
    sizes, offsets, off = [], [], 0
    for m in range(num_levels):
        if m >= first:
            sizes.append((h, w))
            offsets.append(off)
            off += batch * h * w * channels
        h, w = (h + 1) // 2, (w + 1) // 2
    return (torch.tensor(offsets, dtype=torch.int64), torch.tensor(sizes, dtype=torch.int32),
            off)


def pack_pyramid(pyramid: Pyramid | PackedPyramid) -> PackedPyramid:
    """Pack a :class:`Pyramid` (levels ``[B, C, H_m, W_m]``) into one channels-last buffer.

    A copy of every level; the kernels do not need it (they read any Pyramid in place)."""
    if isinstance(pyramid, PackedPyramid):
        return pyramid
    b, c = pyramid.batch_size, pyramid.channels
    parts = [lvl.float().permute(0, 2, 3, 1).reshape(-1) for lvl in pyramid.levels]
    offsets = torch.tensor([0] + [p.numel() for p in parts[:-1]], dtype=torch.int64).cumsum(0)
    sizes = torch.tensor([tuple(lvl.shape[-2:]) for lvl in pyramid.levels], dtype=torch.int32)
    return PackedPyramid(torch.cat(parts), offsets, sizes, b, c)


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


def build_packed_pyramid(image: np.ndarray | torch.Tensor, num_levels: int | None = None, *,
                         patch: int = 16) -> PackedPyramid:
    """All levels (level 0 copied) in one channels-last buffer, levels 1.. by ``cv2.pyrDown``.

    Args:
        image: float32 numpy ``[H, W, C]`` / ``[B, H, W, C]`` in [0, 1], or anything
            :func:`~fovea_core.pyramid.as_image_batch` accepts (converted).
        num_levels: default :func:`~fovea_core.pyramid.default_num_levels`.

    Equal to ``pack_pyramid(build_pyramid(image))`` up to float rounding. The fast path,
    :func:`build_pyramid_cv2`, skips the copy of level 0.
    """
    arr = _hwc_float_batch(image)
    b, h, w, c = arr.shape
    if c > 4:
        raise ValueError(f"build_packed_pyramid supports 1-4 channels (cv2), got {c}; "
                         "use pack_pyramid(build_pyramid(image))")
    num_levels = default_num_levels(h, w, patch) if num_levels is None else num_levels
    offsets, sizes, total = _layout(b, c, h, w, num_levels)
    buf = np.empty(total, dtype=np.float32)
    for i in range(b):                                    # loop over images and levels only
        prev = None
        for m in range(num_levels):
            hm, wm = int(sizes[m, 0]), int(sizes[m, 1])
            off = int(offsets[m]) + i * hm * wm * c
            view = buf[off:off + hm * wm * c].reshape((hm, wm, c) if c > 1 else (hm, wm))
            if m == 0:
                view[...] = arr[i] if c > 1 else arr[i, ..., 0]
            else:
                _pyr_down_into(prev, view)
            prev = view
    return PackedPyramid(torch.from_numpy(buf), offsets, sizes, b, c)


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


# ============================================================================ CPU build
def _cache_dir() -> Path:
    d = CUDA_DIR / "build"
    try:
        d.mkdir(parents=True, exist_ok=True)
        if os.access(d, os.W_OK):
            return d
    except OSError:
        pass
    d = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fovea_core"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _compiler() -> str:
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    if cxx is None:
        raise RuntimeError("the CPU kernel backend needs a C++ compiler: g++ was not found on "
                           "PATH (install g++ / build-essential, or set CXX)")
    return cxx


def cuda_source() -> str:
    """The kernel source text (for the book and for pycuda)."""
    return (CUDA_DIR / "fovea_kernels.cu").read_text()


def source_excerpt(name: str, with_comment: bool = True) -> str:
    """The definition of function/kernel ``name`` in ``cuda/`` (for the book), with the
    comment block just above it. Raises ``KeyError`` if there is no such definition."""
    for fname in SOURCES[::-1]:
        lines = (CUDA_DIR / fname).read_text().splitlines()
        for i, line in enumerate(lines):
            if not line.startswith((" ", "/", "#")) and f" {name}(" in line:
                start = i
                while with_comment and start > 0 and lines[start - 1].startswith("//"):
                    start -= 1
                end = i
                while end < len(lines) and lines[end] != "}":
                    end += 1
                return "\n".join(lines[start:end + 1])
    raise KeyError(f"no definition of {name!r} in {', '.join(SOURCES)}")


def _source_hash(*extra: str) -> hashlib._Hash:
    h = hashlib.sha256()
    for name in SOURCES:
        h.update((CUDA_DIR / name).read_bytes())
    for e in extra:
        h.update(e.encode())
    return h


def build_cpu_library(force: bool = False) -> Path:
    """Compile ``cuda/fovea_kernels.cu`` with g++ into a cached shared library; return it."""
    cxx = _compiler()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    h = _source_hash(" ".join(CXX_FLAGS), version, platform.machine())
    try:  # -march=native: key by CPU model too
        h.update(next(l for l in Path("/proc/cpuinfo").read_text().splitlines()
                      if l.startswith("model name")).encode())
    except (OSError, StopIteration):
        pass
    target = _cache_dir() / f"libfovea_cpu_{h.hexdigest()[:16]}.so"
    if target.exists() and not force:
        return target
    fd, tmp = tempfile.mkstemp(suffix=".so", prefix=".tmp_fovea_", dir=target.parent)
    os.close(fd)
    src = str(CUDA_DIR / "fovea_kernels.cu")
    base = [cxx, *CXX_FLAGS, "-I", str(CUDA_DIR), src, "-o", tmp]
    res = subprocess.run(base[:1] + [OPENMP_FLAG] + base[1:], capture_output=True, text=True)
    if res.returncode != 0:                                 # no OpenMP: serial build
        res = subprocess.run(base, capture_output=True, text=True)
    if res.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"g++ failed to build the CPU kernels:\n{res.stderr[-2000:]}")
    os.replace(tmp, target)                                 # atomic: concurrent builds are safe
    for old in target.parent.glob("libfovea_cpu_*.so"):     # builds of older sources
        if old != target:
            try:
                old.unlink()
            except OSError:
                pass
    return target


_P = ctypes.c_void_p
_I = ctypes.c_int
_D = ctypes.c_double
_LT = ctypes.POINTER(LevelTable)


@functools.lru_cache(maxsize=1)
def _cpu_lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build_cpu_library()))
    if lib.fovea_level_table_bytes() != ctypes.sizeof(LevelTable):
        raise RuntimeError("LevelTable layout of the CPU library differs from kernels.py")
    lib.gather_patches_cpu.argtypes = [_LT, _I, _I, _I, _I, _I, _P, _P, _P, _P, _I]
    lib.gather_patches_cpu.restype = None
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
    return lib


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


# ============================================================================ GPU build
def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    return "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None


def compile_cuda(target: str = "ptx", arch: str = "sm_90", out_dir: Path | None = None) -> Path:
    """Compile the kernels with nvcc (``NVCC_FLAGS``) to ``ptx`` or ``cubin`` for ``arch``."""
    nvcc = _nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc (the CUDA toolkit compiler) was not found on PATH")
    if target not in ("ptx", "cubin"):
        raise ValueError(f"target must be 'ptx' or 'cubin', got {target!r}")
    out_dir = out_dir or _cache_dir()
    out = Path(out_dir) / f"fovea_kernels_{arch}.{target}"
    res = subprocess.run([nvcc, f"-{target}", f"-arch={arch}", *NVCC_FLAGS, "-I", str(CUDA_DIR),
                          str(CUDA_DIR / "fovea_kernels.cu"), "-o", str(out)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"nvcc failed for {arch} ({target}):\n{res.stderr[-2000:]}")
    return out


def kernel_resources(arch: str = "sm_90") -> dict[str, dict[str, int]]:
    """Registers, stack and spills per kernel as ptxas reports them (``--resource-usage``).

    Returns ``{kernel: {"registers": r, "stack_bytes": s, "spill_stores": st,
    "spill_loads": sl}}``; raises ``RuntimeError`` when nvcc is absent.
    """
    import re

    nvcc = _nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc (the CUDA toolkit compiler) was not found on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run([nvcc, "-cubin", f"-arch={arch}", *NVCC_FLAGS, "--resource-usage",
                              "-I", str(CUDA_DIR), str(CUDA_DIR / "fovea_kernels.cu"), "-o",
                              str(Path(tmp) / "k.cubin")], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"nvcc failed for {arch}:\n{res.stderr[-2000:]}")
    out: dict[str, dict[str, int]] = {}
    current = None
    for line in (res.stdout + res.stderr).splitlines():
        m = re.search(r"Function properties for (\w+)", line)
        if m:
            current = m.group(1) if m.group(1) in KERNEL_NAMES else None
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill "
                      r"loads", line)
        if m:
            out.setdefault(current, {}).update(stack_bytes=int(m.group(1)),
                                               spill_stores=int(m.group(2)),
                                               spill_loads=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            out.setdefault(current, {})["registers"] = int(m.group(1))
    missing = set(KERNEL_NAMES) - set(out)
    if missing:
        raise RuntimeError(f"ptxas reported no resources for {sorted(missing)}")
    return out


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


@functools.lru_cache(maxsize=None)
def _cubin(arch: str) -> bytes:
    """The cubin for ``arch`` (e.g. ``sm_90``), built once and cached on disk by source hash."""
    nvcc = _nvcc()
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    h = _source_hash(" ".join(NVCC_FLAGS), version, arch)
    target = _cache_dir() / f"fovea_kernels_{arch}_{h.hexdigest()[:16]}.cubin"
    if not target.exists():
        fd, tmp = tempfile.mkstemp(suffix=".cubin", prefix=".tmp_fovea_", dir=target.parent)
        os.close(fd)
        res = subprocess.run([nvcc, "-cubin", f"-arch={arch}", *NVCC_FLAGS, "-I", str(CUDA_DIR),
                              str(CUDA_DIR / "fovea_kernels.cu"), "-o", tmp],
                             capture_output=True, text=True)
        if res.returncode != 0:
            os.unlink(tmp)
            raise RuntimeError(f"nvcc failed for {arch}:\n{res.stderr[-2000:]}")
        os.replace(tmp, target)
    return target.read_bytes()


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


# ============================================================================ backends
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


# ============================================================================ public kernels
def gather_patches(pyramid: "Pyramid | PackedPyramid | Sequence[torch.Tensor]", tokens: TokenSet,
                   patch: int | None = None, backend: str | None = None, *,
                   binding: str | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Kernel version of :func:`fovea_core.sample.sample`: ``[B, N, C, p, p]`` float32.

    Same convention (bilinear, clamp-to-edge, spacing one level-``l`` pixel; fractional
    ``tokens.levels`` trilinear) and, with the sample spacing ``2**level`` taken from
    ``torch.exp2`` as the reference does, the same bits. The pyramid is read in place (any
    strides; see :func:`level_table`). On ``"cuda"`` everything stays on the device and the
    kernel is queued on the current torch stream: no host round trip (a token level beyond
    the pyramid is read at its top level instead of raising, which would need one).

    Args:
        pyramid: a :class:`Pyramid`, :class:`PackedPyramid` or a sequence of levels.
        tokens: ``[B, N]`` tokens of the same ``image_size``.
        out: optional ``[B, N, C, p, p]`` float32 result buffer on the right device.
    """
    levels = _levels_of(pyramid)
    p = tokens.patch if patch is None else patch
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"patch must be an int >= 1, got {p!r}")
    b, n = tokens.levels.shape
    c = levels[0].shape[1]
    if levels[0].shape[0] != b or tuple(levels[0].shape[-2:]) != tuple(tokens.image_size):
        raise ValueError(f"pyramid (B={levels[0].shape[0]}, size={tuple(levels[0].shape[-2:])}) "
                         f"does not match tokens (B={b}, size={tokens.image_size})")
    dev = levels[0].device
    be = _choose(backend, dev.type == "cuda")
    nl = len(levels)
    h, w = tokens.image_size
    if be == "cpu":
        lmax = float(tokens.levels.max())
        if lmax > nl - 1:
            raise ValueError(f"tokens.levels must lie in [0, {nl - 1}] (the pyramid has {nl} "
                             f"levels), got a level {lmax:g}")
        if p > 256:
            raise ValueError(f"patch must be <= 256 for the CPU kernel, got {p}")
        levels = [lv.cpu() for lv in levels]
        table = level_table(levels)
        cen = tokens.centers.detach().cpu().contiguous()
        lods = tokens.levels.detach().cpu().contiguous()
        steps = torch.exp2(lods)                         # the reference's own exp2
        res = out if out is not None else torch.empty(b, n, c, p, p, dtype=torch.float32)
        _check_out(res, (b, n, c, p, p), torch.device("cpu"))
        _cpu_lib().gather_patches_cpu(ctypes.byref(table), b, n, h, w, p, _ptr(cen), _ptr(lods),
                                      _ptr(steps), _ptr(res), CPU_PARALLEL_TOKENS)
        return res
    levels, table = _table_of(pyramid)
    cen = tokens.centers.detach().to(dev, torch.float32).contiguous()
    lv = tokens.levels.detach().to(dev, torch.float32).contiguous()
    lods = lv.clamp(max=nl - 1)
    steps = torch.exp2(lv)
    res = out if out is not None else torch.empty(b, n, c, p, p, dtype=torch.float32, device=dev)
    _check_out(res, (b, n, c, p, p), dev)
    if b * n:
        _launch_cuda("gather_patches", dev, min(b * n, 2**31 - 1), 32 * math.ceil(min(p * p, 1024) / 32),
                     [table, ctypes.c_int(b), ctypes.c_int(n), ctypes.c_int(h), ctypes.c_int(w),
                      ctypes.c_int(p), _u64(cen), _u64(lods), _u64(steps), _u64(res)], binding)
    return res


def _check_out(out: torch.Tensor, shape: tuple, device: torch.device) -> None:
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


def sample_image(image: np.ndarray | torch.Tensor, tokens: TokenSet, *,
                 backend: str | None = None, binding: str | None = None) -> torch.Tensor:
    """End to end: image -> the tokens' patches ``[B, N, C, p, p]``, building only the
    pyramid levels the tokens read.

    * CPU (a numpy image, or a CPU tensor): level 0 is the image itself, levels
      ``1..levels_needed(tokens)-1`` are written by ``cv2.pyrDown`` into one channels-last
      buffer (:func:`build_pyramid_cv2`), then one fused gather pass (g++ kernel).
    * CUDA (a CUDA float32 tensor ``[B, C, H, W]``): :func:`device_pyramid` then the gather
      kernel, both on the current stream, no host round trip (the level count comes from the
      image size, not from the tokens, which would need a read from the device).
    """
    if isinstance(image, torch.Tensor) and image.is_cuda:
        pyr = device_pyramid(image, patch=tokens.patch, backend=backend, binding=binding)
        return gather_patches(pyr, tokens, backend=backend, binding=binding)
    arr = _hwc_float_batch(image)
    b, h, w, c = arr.shape
    nl = levels_needed(tokens, min(h, w).bit_length())          # every level >= 1 px
    ws = _workspace(4 * _layout(b, c, h, w, nl, first=1)[2])   # the pyramid does not escape
    return gather_patches(build_pyramid_cv2(arr, nl, _buffer=ws), tokens,
                          backend=backend or "cpu")


def remap(image: torch.Tensor, lut: torch.Tensor, backend: str | None = None, *,
          binding: str | None = None) -> torch.Tensor:
    """Kernel version of :func:`fovea_core.sample.remap` (``cv2.remap``, zero border; the
    operations of :func:`fovea_core.sample.remap_reference` in its order, so its bits). The
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


def render_into(out: torch.Tensor, tokens: TokenSet, patches: torch.Tensor) -> None:
    """The CPU painter of :func:`fovea_core.sample.render` (same pixels, same priority):
    paints ``patches [B, N, C, p, p]`` over ``out [B, C, Ho, Wo]`` (contiguous float32,
    holding the background), in place. Raises ``RuntimeError`` when no CPU build exists."""
    _choose("cpu", False)
    b, n, c, p, _ = patches.shape
    ho, wo = out.shape[-2:]
    h, w = tokens.image_size
    cen = tokens.centers.detach().cpu().float().contiguous()
    lv = tokens.levels.detach().cpu().float().contiguous()
    steps = torch.exp2(lv)
    pat = patches.detach().cpu().float().contiguous()
    zbuf = torch.empty(ho * wo, dtype=torch.int64)
    _cpu_lib().render_cpu(b, n, c, p, h, w, ho, wo, ctypes.c_float(wo / w), ctypes.c_float(ho / h),
                          _ptr(cen), _ptr(lv), _ptr(steps), _ptr(pat), _ptr(out), _ptr(zbuf))


def v1_candidates_kernel(plan, backend: str | None = None, *, binding: str | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the ``v1_candidates`` kernel for a :class:`~fovea_core.allocators.cortical.V1Plan`:
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


def v1_layout(fixations: torch.Tensor, image_size: tuple[int, int], budget: int, *,
              num_levels: int, patch: int = 16, backend: str | None = None, **params
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The V1 allocation kernel: ``(centers [B, N, 2], levels [B, N])`` for fixations ``[B, 2]``.

    Same result as :func:`fovea_core.allocators.cortical.v1_cortical` (the torch reference);
    ``params`` are :func:`~fovea_core.allocators.cortical.plan_v1`'s keyword arguments.
    On ``"cpu"`` the selection of the first ``budget`` distinct candidates also runs in C++;
    on ``"cuda"`` the candidates come from the GPU and the selection runs in torch.
    """
    from fovea_core.allocators.cortical import plan_v1, select_candidates

    plan = plan_v1(fixations, image_size, budget, patch=patch, num_levels=num_levels, **params)
    be = _choose(backend, False)
    cxy, lvl, val = v1_candidates_kernel(plan, be)
    b, k = cxy.shape[:2]
    if be == "cpu":
        chosen = torch.empty(b, budget, dtype=torch.int64)
        lvl32, val32 = lvl.int().contiguous(), val.int().contiguous()
        rc = _cpu_lib().select_candidates_cpu(b, k, budget, image_size[0], image_size[1],
                                              _ptr(cxy), _ptr(lvl32), _ptr(val32), _ptr(chosen))
        if rc != 0:
            raise ValueError(f"image {-1 - rc} has fewer than {budget} distinct candidates")
    else:
        chosen = select_candidates(cxy, lvl, val, budget, image_size)
    centers = torch.gather(cxy, 1, chosen[..., None].expand(-1, -1, 2))
    return centers, torch.gather(lvl, 1, chosen).float()
