"""Load and call the foveated kernels of ``cuda/fovea_kernels.cu`` (GPU or CPU build).

One CUDA C source, two builds (``cuda/README.md``): ``"cuda"``, an nvcc cubin launched on
the current torch stream with torch tensors in and out (no host copies, no synchronisation;
bindings ``"driver"``, the default, and the optional ``"pycuda"``), and ``"cpu"``, the same
source compiled by g++ as a shared library called through ``ctypes``. The method runs two of
the kernels (:mod:`~fovea_core.kernels.ops`); the others, which compute the book's
Gaussian-pyramid read and its V1 layout, are called from ``fovea_book.kernels`` through
this binding. Public functions
take ``backend`` in ``{"cuda", "cpu"}``; ``None`` picks ``"cuda"`` when the data already
lives on a CUDA device, else ``"cpu"``; an unavailable backend raises ``RuntimeError``
naming what is missing.

The package, by concern (each module imports only the ones above it in this list, and
nothing of ``fovea_core`` above :mod:`fovea_core.tokens` and :mod:`fovea_core.pyramid`):

* :mod:`~fovea_core.kernels.build`: the compiler driver (g++ / nvcc, cached builds);
* :mod:`~fovea_core.kernels.layout`: the ``LevelTable`` a pyramid reaches a kernel as (a
  pointer and strides per level: any :class:`~fovea_core.pyramid.Pyramid` is read in
  place, without repacking);
* :mod:`~fovea_core.kernels.cpu`: the ``ctypes`` binding of the g++ library;
* :mod:`~fovea_core.kernels.cuda`: the CUDA driver API / pycuda launcher;
* :mod:`~fovea_core.kernels.ops`: the method's operations and the backend choice. Importing
  it registers the ``pyr_down`` kernel as :func:`fovea_core.pyramid.build_pyramid`'s CUDA
  step (:func:`fovea_core.pyramid.register_pyr_down`).
"""

from fovea_core.kernels.build import CUDA_DIR, CXX_FLAGS, NVCC_FLAGS, SOURCES, build_cpu_library
from fovea_core.kernels.layout import MAX_LEVELS, LevelTable, level_table
from fovea_core.kernels.ops import (available_backends, backend_status, divprune_greedy,
                                    pyr_down_into)

__all__ = ["available_backends", "backend_status", "build_cpu_library", "pyr_down_into",
           "divprune_greedy", "level_table", "LevelTable", "NVCC_FLAGS", "CXX_FLAGS", "MAX_LEVELS",
           "CUDA_DIR", "SOURCES"]
