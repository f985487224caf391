"""Load and call the foveated kernels of ``cuda/fovea_kernels.cu`` (GPU or CPU build).

One CUDA C source, two builds (see ``cuda/fovea_kernels.cuh``):

* ``"cuda"``: compiled by nvcc through pycuda's ``SourceModule`` and launched one thread per
  output element. Needs an NVIDIA GPU, its driver, ``nvcc`` and ``pycuda`` (the optional
  ``gpu`` extra).
* ``"cpu"``: the same source compiled by ``g++`` as a shared library (the ``__global__``
  kernels are compiled out, ``extern "C"`` loops over the same ``__host__ __device__``
  functions remain) and called through ``ctypes``. Built on first use into ``cuda/build/``
  (or ``$XDG_CACHE_HOME/fovea_core``), keyed by a hash of the sources, flags and compiler,
  written to a temporary name and renamed atomically, so concurrent first uses are safe.

Public functions take a ``backend`` in ``{"cuda", "cpu"}``; ``None`` picks ``"cuda"`` when it
is available and the data already lives on a CUDA device, else ``"cpu"``. An unavailable
backend raises ``RuntimeError`` naming what is missing.

The pyramid is passed to the kernels *packed* (:class:`PackedPyramid`): all levels in one
flat float32 buffer, level ``m`` a ``[B, H_m, W_m, C]`` (channels-last) block at element
``offsets[m]``. :func:`build_packed_pyramid` builds it directly with ``cv2.pyrDown`` (the
fast CPU path; equal to :func:`fovea_core.pyramid.build_pyramid` up to float rounding).
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fovea_core.paths import project_root
from fovea_core.pyramid import Pyramid, as_image_batch, default_num_levels
from fovea_core.tokens import TokenSet

__all__ = ["PackedPyramid", "available_backends", "backend_status", "build_cpu_library",
           "build_packed_pyramid", "pack_pyramid", "gather_patches", "remap", "v1_layout",
           "v1_candidates_kernel", "cuda_source", "compile_cuda", "source_excerpt",
           "kernel_resources"]

CUDA_DIR = project_root() / "cuda"
SOURCES = ("fovea_kernels.cu", "fovea_kernels.cuh")
# -ffp-contract=off: no fused multiply-add, so the CPU build rounds exactly like torch.
CXX_FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-std=c++17", "-shared", "-fPIC",
             "-x", "c++")
OPENMP_FLAG = "-fopenmp"
KERNEL_NAMES = ("gather_patches", "remap_lut", "v1_candidates")


# ============================================================================ packed pyramid
@dataclass(frozen=True, eq=False)
class PackedPyramid:
    """All pyramid levels in one flat float32 buffer (the kernels' input format).

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
        """Level ``m`` as a ``[B, C, H_m, W_m]`` view-derived tensor."""
        h, w = int(self.sizes[m, 0]), int(self.sizes[m, 1])
        off = int(self.offsets[m])
        blk = self.data[off:off + self.batch * h * w * self.channels]
        return blk.view(self.batch, h, w, self.channels).permute(0, 3, 1, 2)

    def unpack(self) -> Pyramid:
        """The equivalent :class:`Pyramid` (contiguous NCHW copies)."""
        return Pyramid(tuple(self.level(m).contiguous() for m in range(self.num_levels)))

    def to(self, device: str | torch.device) -> "PackedPyramid":
        return PackedPyramid(self.data.to(device), self.offsets, self.sizes, self.batch,
                             self.channels)


def _layout(batch: int, channels: int, h: int, w: int, num_levels: int
            ) -> tuple[torch.Tensor, torch.Tensor, int]:
    sizes, offsets, off = [], [], 0
    for _ in range(num_levels):
        sizes.append((h, w))
        offsets.append(off)
        off += batch * h * w * channels
        h, w = (h + 1) // 2, (w + 1) // 2
    return (torch.tensor(offsets, dtype=torch.int64), torch.tensor(sizes, dtype=torch.int32),
            off)


def pack_pyramid(pyramid: Pyramid | PackedPyramid) -> PackedPyramid:
    """Pack a :class:`Pyramid` (levels ``[B, C, H_m, W_m]``) into one channels-last buffer."""
    if isinstance(pyramid, PackedPyramid):
        return pyramid
    b, c = pyramid.batch_size, pyramid.channels
    parts = [lvl.float().permute(0, 2, 3, 1).reshape(-1) for lvl in pyramid.levels]
    offsets = torch.tensor([0] + [p.numel() for p in parts[:-1]], dtype=torch.int64).cumsum(0)
    sizes = torch.tensor([tuple(lvl.shape[-2:]) for lvl in pyramid.levels], dtype=torch.int32)
    return PackedPyramid(torch.cat(parts), offsets, sizes, b, c)


def build_packed_pyramid(image: np.ndarray | torch.Tensor, num_levels: int | None = None, *,
                         patch: int = 16) -> PackedPyramid:
    """Build the packed pyramid with ``cv2.pyrDown``, writing straight into the buffer.

    Args:
        image: float32 numpy ``[H, W, C]`` / ``[B, H, W, C]`` in [0, 1] (used without a copy),
            or anything :func:`~fovea_core.pyramid.as_image_batch` accepts (converted).
        num_levels: default :func:`~fovea_core.pyramid.default_num_levels`.

    Returns a :class:`PackedPyramid` equal to ``pack_pyramid(build_pyramid(image))`` up to
    float rounding (``cv2.pyrDown`` is the definition of the torch pyramid).
    """
    import cv2

    if isinstance(image, np.ndarray) and image.dtype == np.float32 and image.ndim in (3, 4):
        arr = image[None] if image.ndim == 3 else image
    else:
        arr = as_image_batch(image).permute(0, 2, 3, 1).contiguous().numpy()
    b, h, w, c = arr.shape
    if c > 4:
        raise ValueError(f"build_packed_pyramid supports 1-4 channels (cv2), got {c}; "
                         "use pack_pyramid(build_pyramid(image))")
    if num_levels is None:
        num_levels = default_num_levels(h, w, patch)
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
                out = cv2.pyrDown(prev, dst=view)
                if out is not view and not np.shares_memory(out, view):
                    view[...] = out
            prev = view
    return PackedPyramid(torch.from_numpy(buf), offsets, sizes, b, c)


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


def build_cpu_library(force: bool = False) -> Path:
    """Compile ``cuda/fovea_kernels.cu`` with g++ into a cached shared library; return it."""
    cxx = _compiler()
    h = hashlib.sha256()
    for name in SOURCES:
        h.update((CUDA_DIR / name).read_bytes())
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    h.update(" ".join(CXX_FLAGS).encode() + version.encode() + platform.machine().encode())
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


@functools.lru_cache(maxsize=1)
def _cpu_lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build_cpu_library()))
    lib.gather_patches_cpu.argtypes = [_P, _P, _P, _I, _I, _I, _I, _I, _I, _I, _P, _P, _P]
    lib.gather_patches_cpu.restype = None
    lib.remap_lut_cpu.argtypes = [_P, _I, _I, _I, _I, _P, _I, _I, _I, _P]
    lib.remap_lut_cpu.restype = None
    lib.v1_candidates_cpu.argtypes = [_I] * 7 + [_D, _D, _I, _I] + [_P] * 9
    lib.v1_candidates_cpu.restype = None
    lib.select_candidates_cpu.argtypes = [_I, _I, _I, _I, _I, _P, _P, _P, _P]
    lib.select_candidates_cpu.restype = _I
    return lib


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


# ============================================================================ GPU build
def compile_cuda(target: str = "ptx", arch: str = "sm_90", out_dir: Path | None = None) -> Path:
    """Compile the kernels with nvcc to ``ptx`` or ``cubin`` for ``arch``; return the file."""
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc"
                                    if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    if nvcc is None:
        raise RuntimeError("nvcc (the CUDA toolkit compiler) was not found on PATH")
    if target not in ("ptx", "cubin"):
        raise ValueError(f"target must be 'ptx' or 'cubin', got {target!r}")
    out_dir = out_dir or _cache_dir()
    out = Path(out_dir) / f"fovea_kernels_{arch}.{target}"
    res = subprocess.run([nvcc, f"-{target}", f"-arch={arch}", "-O3", "-I", str(CUDA_DIR),
                          str(CUDA_DIR / "fovea_kernels.cu"), "-o", str(out)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"nvcc failed for {arch} ({target}):\n{res.stderr[-2000:]}")
    return out


def kernel_resources(arch: str = "sm_90") -> dict[str, dict[str, int]]:
    """Registers and stack per kernel as ptxas reports them (``nvcc --resource-usage``).

    Returns ``{kernel: {"registers": r, "stack_bytes": s, "spill_bytes": sp}}``.
    """
    import re

    with tempfile.TemporaryDirectory() as tmp:
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        if not Path(nvcc).exists():
            raise RuntimeError("nvcc (the CUDA toolkit compiler) was not found on PATH")
        res = subprocess.run([nvcc, "-cubin", f"-arch={arch}", "-O3", "--resource-usage",
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
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores", line)
        if m:
            out.setdefault(current, {}).update(stack_bytes=int(m.group(1)),
                                               spill_bytes=int(m.group(2)))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            out.setdefault(current, {})["registers"] = int(m.group(1))
    return out


def _cuda_missing() -> str | None:
    """Why the CUDA backend cannot run here (None if it can)."""
    try:
        import pycuda  # noqa: F401
    except ImportError:
        return "pycuda is not installed (pip install '.[gpu]' on a machine with CUDA)"
    if shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists():
        return "nvcc (CUDA toolkit) was not found on PATH"
    try:
        import pycuda.driver as drv
        drv.init()
        if drv.Device.count() == 0:
            return "no CUDA GPU is visible"
    except Exception as exc:  # noqa: BLE001  (driver errors have many types)
        return f"no usable CUDA GPU/driver ({type(exc).__name__}: {exc})"
    return None


@functools.lru_cache(maxsize=1)
def _cuda_module():
    missing = _cuda_missing()
    if missing:
        raise RuntimeError(f"the 'cuda' kernel backend is unavailable: {missing}")
    import pycuda.autoprimaryctx  # noqa: F401  (share the primary context with torch)
    from pycuda.compiler import SourceModule

    return SourceModule(cuda_source(), include_dirs=[str(CUDA_DIR)], no_extern_c=True,
                        options=["-O3"])


def _launch(name: str, total: int, *args) -> None:
    """Grid-stride launch of kernel ``name`` over ``total`` elements (256 threads/block)."""
    func = _cuda_module().get_function(name)
    blocks = max(1, min(math.ceil(total / 256), 65535))
    func(*args, block=(256, 1, 1), grid=(blocks, 1))


def _dev(t: torch.Tensor) -> torch.Tensor:
    if not torch.cuda.is_available():
        raise RuntimeError("the 'cuda' backend passes torch CUDA tensors to pycuda; this torch "
                           "build has no CUDA support")
    return t.contiguous().cuda()


def _dptr(t: torch.Tensor) -> np.uintp:
    return np.uintp(t.data_ptr())


# ============================================================================ backends
def backend_status() -> dict[str, str | None]:
    """``{"cuda": reason or None, "cpu": reason or None}`` (None = available)."""
    status: dict[str, str | None] = {"cuda": _cuda_missing()}
    try:
        _compiler()
        status["cpu"] = None
    except RuntimeError as exc:
        status["cpu"] = str(exc)
    return status


def available_backends() -> list[str]:
    """Backends that can run here, best first (subset of ``["cuda", "cpu"]``)."""
    return [k for k, why in backend_status().items() if why is None]


def _choose(backend: str | None, on_cuda: bool) -> str:
    if backend is None:
        avail = available_backends()
        if "cuda" in avail and on_cuda:
            return "cuda"
        if "cpu" in avail:
            return "cpu"
        if "cuda" in avail:
            return "cuda"
        raise RuntimeError("no kernel backend is available: " + "; ".join(
            f"{k}: {v}" for k, v in backend_status().items()))
    if backend not in ("cuda", "cpu"):
        raise ValueError(f"backend must be 'cuda', 'cpu' or None, got {backend!r}")
    why = backend_status()[backend]
    if why is not None:
        raise RuntimeError(f"the {backend!r} kernel backend is unavailable: {why}")
    return backend


# ============================================================================ public kernels
def gather_patches(pyramid: Pyramid | PackedPyramid, tokens: TokenSet, patch: int | None = None,
                   backend: str | None = None) -> torch.Tensor:
    """Kernel version of :func:`fovea_core.sample.sample`: ``[B, N, C, p, p]`` float32.

    Same convention (bilinear, clamp-to-edge, spacing one level-``l`` pixel); fractional
    ``tokens.levels`` are read trilinearly. Pass a :class:`PackedPyramid` (e.g.
    from :func:`build_packed_pyramid`) to skip packing. The result lives on the device of the
    backend (CPU tensor for ``"cpu"``, CUDA tensor for ``"cuda"``).
    """
    packed = pack_pyramid(pyramid)
    p = tokens.patch if patch is None else int(patch)
    b, n = tokens.levels.shape
    if p < 1:
        raise ValueError(f"patch must be >= 1, got {p}")
    if packed.batch != b or packed.image_size != tuple(tokens.image_size):
        raise ValueError(f"pyramid (B={packed.batch}, size={packed.image_size}) does not match "
                         f"tokens (B={b}, size={tokens.image_size})")
    lods = tokens.levels
    nl = packed.num_levels
    if float(lods.max()) > nl - 1:
        raise ValueError(f"tokens.levels must lie in [0, {nl - 1}] (the pyramid has {nl} "
                         f"levels), got a level {float(lods.max()):g}")
    h, w = packed.image_size
    c = packed.channels
    be = _choose(backend, packed.device.type == "cuda")
    if be == "cpu":
        if p > 256:
            raise ValueError(f"patch must be <= 256 for the CPU kernel, got {p}")
        data = packed.data.cpu().contiguous()
        cen = tokens.centers.cpu().contiguous()
        lods = lods.cpu().contiguous()
        out = torch.empty(b, n, c, p, p, dtype=torch.float32)
        _cpu_lib().gather_patches_cpu(_ptr(data), _ptr(packed.offsets), _ptr(packed.sizes), nl,
                                      b, n, h, w, c, p, _ptr(cen), _ptr(lods), _ptr(out))
        return out
    data, offs, sizes = _dev(packed.data), _dev(packed.offsets), _dev(packed.sizes)
    cen, lods = _dev(tokens.centers), _dev(lods)
    out = torch.empty(b, n, c, p, p, dtype=torch.float32, device=data.device)
    _launch("gather_patches", out.numel(), _dptr(data), _dptr(offs), _dptr(sizes),
            np.int32(nl), np.int32(b), np.int32(n), np.int32(h), np.int32(w), np.int32(c),
            np.int32(p), _dptr(cen), _dptr(lods), _dptr(out))
    return out


def remap(image: torch.Tensor, lut: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """Kernel version of :func:`fovea_core.sample.remap` (``cv2.remap``, zero border).

    ``image [B, C, H, W]``, ``lut [B or 1, Ho, Wo, 2]`` (x, y OpenCV pixel coordinates)
    -> ``[B, C, Ho, Wo]`` float32.
    """
    if image.ndim != 4:
        raise ValueError(f"image must be [B, C, H, W], got {tuple(image.shape)}")
    b, c, h, w = image.shape
    if lut.ndim != 4 or lut.shape[-1] != 2 or lut.shape[0] not in (1, b):
        raise ValueError(f"lut must be [B or 1, Ho, Wo, 2] with B = {b}, got {tuple(lut.shape)}")
    lb, ho, wo = lut.shape[:3]
    be = _choose(backend, image.device.type == "cuda")
    if be == "cpu":
        img = image.detach().float().cpu().contiguous()
        lt = lut.detach().float().cpu().contiguous()
        out = torch.empty(b, c, ho, wo, dtype=torch.float32)
        _cpu_lib().remap_lut_cpu(_ptr(img), b, c, h, w, _ptr(lt), lb, ho, wo, _ptr(out))
        return out
    img, lt = _dev(image.detach().float()), _dev(lut.detach().float())
    out = torch.empty(b, c, ho, wo, dtype=torch.float32, device=img.device)
    _launch("remap_lut", out.numel(), _dptr(img), np.int32(b), np.int32(c), np.int32(h),
            np.int32(w), _dptr(lt), np.int32(lb), np.int32(ho), np.int32(wo), _dptr(out))
    return out


def v1_candidates_kernel(plan, backend: str | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the ``v1_candidates`` kernel for a :class:`~fovea_core.allocators.cortical.V1Plan`:
    ``cxy [B, K, 2]`` float32, ``level [B, K]`` int64, ``valid [B, K]`` bool (on the CPU)."""
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
        fix, fovea, rays, rings = _dev(fix), _dev(fovea), _dev(rays), _dev(rings)
        stride, rstep = _dev(stride), _dev(rstep)
        cxy = torch.empty(b, k, 2, dtype=torch.float32, device=fix.device)
        lvl = torch.empty(b, k, dtype=torch.int32, device=fix.device)
        val = torch.empty(b, k, dtype=torch.int32, device=fix.device)
        _launch("v1_candidates", b * k, *(np.int32(s) for s in scal), np.float64(plan.ppd),
                np.float64(plan.e0), np.int32(b), np.int32(k), _dptr(fix), _dptr(fovea),
                _dptr(rays), _dptr(rings), _dptr(stride), _dptr(rstep), _dptr(cxy), _dptr(lvl),
                _dptr(val))
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
    cxy, lvl, val = v1_candidates_kernel(plan, backend)
    b, k = cxy.shape[:2]
    if backend == "cpu" or (backend is None and _choose(None, False) == "cpu"):
        chosen = torch.empty(b, budget, dtype=torch.int64)
        lvl32, val32 = lvl.int().contiguous(), val.int().contiguous()
        rc = _cpu_lib().select_candidates_cpu(b, k, budget, image_size[0], image_size[1],
                                              _ptr(cxy), _ptr(lvl32), _ptr(val32), _ptr(chosen))
        if rc != 0:
            raise ValueError(f"image {-1 - rc} has fewer than {budget} distinct candidates")
    else:
        chosen = select_candidates(cxy, lvl, val, budget, image_size)
    centers = torch.gather(cxy, 1, chosen[..., None].expand(-1, -1, 2))
    return centers, torch.gather(lvl, 1, chosen)
