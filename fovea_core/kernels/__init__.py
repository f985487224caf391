"""Load and call the foveated kernels of ``cuda/fovea_kernels.cu`` (GPU or CPU build).

One CUDA C source, two builds (``cuda/README.md``): ``"cuda"``, an nvcc cubin launched on
the current torch stream with torch tensors in and out (no host copies, no synchronisation;
bindings ``"driver"``, the default, and the optional ``"pycuda"``), and ``"cpu"``, the same
source compiled by g++ as a shared library called through ``ctypes``. (The kernel paths
only the book runs, the LUT remap, the end-to-end CPU sampler and the fused gather into a
VLM's patch layout, are ``fovea_book.kernels``'.) Public functions
take ``backend`` in ``{"cuda", "cpu"}``; ``None`` picks ``"cuda"`` when the data already
lives on a CUDA device, else ``"cpu"``; an unavailable backend raises ``RuntimeError``
naming what is missing.

The package, by concern (each module imports only the ones above it in this list, and
nothing of ``fovea_core`` above :mod:`fovea_core.tokens` and :mod:`fovea_core.pyramid`):

* :mod:`~fovea_core.kernels.build`: the compiler driver (g++ / nvcc, cached builds);
* :mod:`~fovea_core.kernels.pyramids`: the packed layout of a pyramid's levels;
* :mod:`~fovea_core.kernels.layout`: the ``LevelTable`` a pyramid reaches a kernel as (a
  pointer and strides per level: any :class:`~fovea_core.pyramid.Pyramid` is read in
  place, without repacking);
* :mod:`~fovea_core.kernels.cpu`: the ``ctypes`` binding of the g++ library;
* :mod:`~fovea_core.kernels.cuda`: the CUDA driver API / pycuda launcher;
* :mod:`~fovea_core.kernels.ops`: the public operations and the backend choice. Importing
  it registers the ``pyr_down`` kernel as :func:`fovea_core.pyramid.build_pyramid`'s CUDA
  step (:func:`fovea_core.pyramid.register_pyr_down`).
"""

from fovea_core.kernels.build import CUDA_DIR, CXX_FLAGS, NVCC_FLAGS, SOURCES, build_cpu_library
from fovea_core.kernels.layout import MAX_LEVELS, LevelTable, level_table
from fovea_core.kernels.ops import (available_backends, backend_status, device_pyramid,
                                    divprune_greedy, gather_patches, pyr_down_into,
                                    select_candidates_kernel, v1_candidates_kernel, v1_layout)

__all__ = ["available_backends", "backend_status", "build_cpu_library", "device_pyramid",
           "pyr_down_into", "gather_patches", "v1_layout", "v1_candidates_kernel",
           "select_candidates_kernel", "divprune_greedy", "level_table", "LevelTable", "NVCC_FLAGS", "CXX_FLAGS", "MAX_LEVELS",
           "CUDA_DIR", "SOURCES"]
