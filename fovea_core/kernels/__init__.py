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

The package, by concern (each module imports only the ones above it in this list, and
nothing of ``fovea_core`` above :mod:`fovea_core.tokens` and :mod:`fovea_core.pyramid`):

* :mod:`~fovea_core.kernels.build`: the compiler driver (g++ / nvcc, cached builds);
* :mod:`~fovea_core.kernels.pyramids`: host pyramids laid out for the kernels
  (:func:`build_pyramid_cv2`, :func:`levels_needed`);
* :mod:`~fovea_core.kernels.layout`: the ``LevelTable`` a pyramid reaches a kernel as;
* :mod:`~fovea_core.kernels.cpu`: the ``ctypes`` binding of the g++ library;
* :mod:`~fovea_core.kernels.cuda`: the CUDA driver API / pycuda launcher;
* :mod:`~fovea_core.kernels.ops`: the public operations and the backend choice. Importing
  it registers the ``pyr_down`` kernel as :func:`fovea_core.pyramid.build_pyramid`'s CUDA
  step (:func:`fovea_core.pyramid.register_pyr_down`).

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

from fovea_core.kernels.build import CUDA_DIR, CXX_FLAGS, NVCC_FLAGS, SOURCES, build_cpu_library
from fovea_core.kernels.layout import MAX_LEVELS, LevelTable, level_table
from fovea_core.kernels.ops import (available_backends, backend_status, device_pyramid,
                                    divprune_greedy, gather_patches, gather_tokens,
                                    nhwc4_pyramid, pyr_down_into, remap,
                                    render_into, sample_image, select_candidates_kernel,
                                    v1_candidates_kernel, v1_layout)
from fovea_core.kernels.pyramids import build_pyramid_cv2, levels_needed

__all__ = ["available_backends", "backend_status", "build_cpu_library",
           "build_pyramid_cv2", "device_pyramid", "levels_needed",
           "pyr_down_into", "gather_patches", "gather_tokens", "nhwc4_pyramid",
           "sample_image", "remap",
           "v1_layout", "v1_candidates_kernel", "select_candidates_kernel", "divprune_greedy",
           "render_into", "level_table", "LevelTable", "NVCC_FLAGS", "CXX_FLAGS", "MAX_LEVELS",
           "CUDA_DIR", "SOURCES"]
