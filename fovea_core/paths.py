"""Where the project's own data and the external evaluation datasets live."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


class DatasetNotFound(FileNotFoundError):
    """An external dataset is not where ``FOVEA_DATA`` says; the message says how to fix it."""


def project_root() -> Path:
    """The repository root (the folder holding ``pyproject.toml``)."""
    return Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """Root of the external datasets: ``$FOVEA_DATA``, else ``<project>/data/external``.

    ``make`` links ``data/external`` to ``../shared/datasets`` when that folder exists.
    """
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
            f"data_dir parameter) to the folder that holds {name}/, e.g. ../shared/datasets.")
    return path


def file_digest(path: str | Path, algorithm: str = "sha256") -> str:
    """Hex digest of a file's bytes (read in blocks; ``algorithm``: any ``hashlib`` name)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, algorithm).hexdigest()
