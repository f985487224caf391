"""fovea_book: the machinery of the book *The foveated Homunculus*, on top of ``fovea_core``.

``fovea_core`` is the method (what a researcher installs to foveate a page for a VLM); this
package is what the book needs around it, and ``fovea_core`` never imports it:

* :mod:`fovea_book.eval` -- the evaluation harness: dataset loaders, synthetic pages, the
  OCR readers, metrics and statistics, the sweeps, and the functions that write the
  chapters' sentences and the results ledger;
* :mod:`fovea_book.biology` -- retina, cortex and psychophysics of the first chapters;
* :mod:`fovea_book.bench` -- the benchmarks (JSON records with hardware and versions);
* :mod:`fovea_book.train` -- retraining the cascade's learned localiser (and its target);
* :mod:`fovea_book.logpolar`, :mod:`fovea_book.kernel_source`, :mod:`fovea_book.qwen_models`
  -- what chapters 03, 05 and 15 show or check beside the method: the log-polar transform
  of an image, the kernels' source and what nvcc makes of it, random-weight Qwen-VL models;
* :mod:`fovea_book.fetch` -- downloading the datasets from their public sources;
* :mod:`fovea_book.build` -- the build tool (``python -m fovea_book.build all``).
"""

import os

from fovea_book.paths import DatasetNotFound, data_dir, dataset_path, project_root
from fovea_book.profiles import PROFILES, choose

# The book keeps fovea_core's caches (the coarse-view OCR, the kernel builds) with its own, in
# the checkout's data/cache (``make clean-cache`` removes them), unless FOVEA_CACHE says
# otherwise; fovea_core alone uses the user cache folder.
os.environ.setdefault("FOVEA_CACHE", str(project_root() / "data" / "cache"))

__all__ = ["PROFILES", "DatasetNotFound", "choose", "data_dir", "dataset_path",
           "project_root"]
