"""The book's build tool: ``python -m fovea_book.build COMMAND`` (``--help`` lists them).

* ``run`` / ``build`` / ``all``: execute the notebooks with papermill, incrementally
  (:mod:`~fovea_book.build.runner`, :mod:`~fovea_book.build.cache`), and build the HTML;
* ``tidy``: apply the notebook conventions (:mod:`~fovea_book.build.tidy`);
* ``batch``: a notebook over a grid of parameters, glued scalars collected
  (:mod:`~fovea_book.build.batch`);
* ``check-html``: every page in headless Chromium (:mod:`~fovea_book.build.browser`);
* ``lab``: JupyterLab on the project's kernel, printing its URL.

No notebook imports this package, so changing it does not invalidate executed notebooks.
"""

from fovea_book.build.runner import (NotebookFailed, NotebookRun, build_html, execute_notebook,
                                    run_all, toc_files, toc_notebooks)
from fovea_book.build.tidy import KERNEL_NAME, KERNELSPEC, check_notebook, tidy_notebook

__all__ = ["KERNELSPEC", "KERNEL_NAME", "NotebookFailed", "NotebookRun", "build_html",
           "check_notebook", "execute_notebook", "run_all", "tidy_notebook", "toc_files",
           "toc_notebooks"]
