"""Where the book's files are: the repository, its ``data/`` tables and the datasets.

The book reads its datasets from ``$FOVEA_DATA`` (default ``data/external`` in the
repository, which ``make`` links to a ``../shared/datasets`` folder beside the checkout when
there is one); ``python -m fovea_book.fetch`` downloads them from their public sources.
"""

from __future__ import annotations

import os
from pathlib import Path


class DatasetNotFound(FileNotFoundError):
    """An external dataset is not where ``FOVEA_DATA`` says; the message says how to fix it."""


def project_root() -> Path:
    """The repository root (the folder that holds ``book/`` and ``notebooks/``)."""
    return Path(__file__).resolve().parents[2]


def data_dir() -> Path:
    """Root of the external datasets: ``$FOVEA_DATA``, else ``<project>/data/external``."""
    env = os.environ.get("FOVEA_DATA")
    return Path(env).expanduser() if env else project_root() / "data" / "external"


def dataset_path(name: str, root: str | Path | None = None) -> Path:
    """Folder of dataset ``name`` (e.g. ``"sroie-dev"``); raise :class:`DatasetNotFound`.

    Args:
        name: sub-folder of the data root.
        root: the data root; default :func:`data_dir`.
    """
    base = Path(root).expanduser() if root else data_dir()
    path = base / name
    if not path.is_dir():
        raise DatasetNotFound(
            f"dataset {name!r} not found at {path}. Set FOVEA_DATA (or the notebook's "
            f"data_dir parameter) to the folder that holds {name}/, or download it with "
            f"`python -m fovea_book.fetch {name}`.")
    return path
