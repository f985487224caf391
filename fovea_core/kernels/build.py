"""The compiler driver: build ``cuda/fovea_kernels.cu`` with g++ (CPU shared library) or nvcc
(the cubin the CUDA backend launches), cached in the user cache folder
(:func:`fovea_core.paths.cache_dir`, ``kernels/``) by a hash of the sources, flags, compiler
and CPU model, written to a temporary name and renamed atomically (concurrent first uses are
safe). No torch, no ctypes: only files and processes.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from fovea_core.paths import cache_dir, resource

__all__ = ["CUDA_DIR", "SOURCES", "CXX_FLAGS", "NVCC_FLAGS", "OPENMP_FLAG", "build_cpu_library"]

#: The kernel sources as shipped in the package (``fovea_core/kernels/src/``: in the checkout,
#: links to the repository's ``cuda/`` folder; in a wheel, copies of those files).
CUDA_DIR = resource("kernels", "src")
SOURCES = ("fovea_kernels.cu", "fovea_kernels.cuh")
# -ffp-contract=off / -fmad=false: no fused multiply-add in either build, so both round every
# operation separately, exactly as torch's elementwise ops do (bit-for-bit parity).
CXX_FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-std=c++17", "-shared", "-fPIC",
             "-x", "c++")
NVCC_FLAGS = ("-O3", "-fmad=false")
OPENMP_FLAG = "-fopenmp"


def _cache_dir() -> Path:
    d = cache_dir("kernels")
    d.mkdir(parents=True, exist_ok=True)
    return d


def _compiler() -> str:
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    if cxx is None:
        raise RuntimeError("the CPU kernel backend needs a C++ compiler: g++ was not found on "
                           "PATH (install g++ / build-essential, or set CXX)")
    return cxx


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


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    return "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None


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
