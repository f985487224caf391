"""The kernels' source as the book shows it and as nvcc compiles it (chapter 05, the tests).

:func:`source_excerpt` cuts one definition out of ``cuda/`` for a chapter to print;
:func:`compile_cuda` builds the kernels to ptx or a cubin for an architecture, and
:func:`kernel_resources` reads the registers, stack and spills ptxas reports per kernel.
Same sources and flags as the library's own builds (:mod:`fovea_core.kernels.build`: the g++
library and the cubin the CUDA backend launches).
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from fovea_core.kernels.build import CUDA_DIR, NVCC_FLAGS, SOURCES, _cache_dir, _nvcc

__all__ = ["KERNEL_NAMES", "compile_cuda", "kernel_resources", "source_excerpt"]

#: the ``__global__`` kernels of ``cuda/fovea_kernels.cu`` (``extern "C"``: unmangled names)
KERNEL_NAMES = ("gather_patches", "gather_tokens", "pyr_down", "remap_lut", "v1_candidates")


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
