"""Where the method's own files are: its package data and its cache folder.

* :func:`resource` -- a file shipped inside the package (the committed localiser weights and
  fixation readout in ``fovea_core/weights/``, the kernel source in
  ``fovea_core/kernels/``), found with :mod:`importlib.resources`, so an installed wheel
  reads the same files as the checkout;
* :func:`cache_dir` -- where caches go: ``$FOVEA_CACHE``, else the platform's user cache
  folder (``$XDG_CACHE_HOME/fovea_core``, default ``~/.cache/fovea_core``; on macOS
  ``~/Library/Caches/fovea_core``; on Windows ``%LOCALAPPDATA%\\fovea_core\\Cache``), never
  the package or the checkout; ``FOVEA_NO_DISK_CACHE=1`` (or ``true``, ``yes``, ``on``) turns
  the disk caches off, ``0`` / ``false`` / ``no`` / ``off`` / empty keeps them
  (:func:`disk_cache_enabled`; anything else is refused).
"""

from __future__ import annotations

import hashlib
import os
import sys
from importlib import resources
from pathlib import Path


def resource(*parts: str) -> Path:
    """Path of a file shipped in the package, e.g. ``resource("weights", "x.pt")``.

    Raises:
        FileNotFoundError: the file is not in this installation (the message names it).
    """
    path = Path(str(resources.files("fovea_core").joinpath(*parts)))
    if not path.exists():
        raise FileNotFoundError(f"{'/'.join(parts)} is not in this fovea_core installation "
                                f"(looked at {path}); reinstall the package")
    return path


def cache_dir(*parts: str) -> Path:
    """The user cache folder of ``fovea_core`` (created on first use), or a sub-folder.

    ``$FOVEA_CACHE`` when set, else the platform's user cache directory (see the module
    docstring). Nothing is written beside the package.
    """
    env = os.environ.get("FOVEA_CACHE")
    if env:
        base = Path(env).expanduser()
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches" / "fovea_core"
    elif os.name == "nt":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home())) / "fovea_core" / "Cache"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fovea_core"
    return base.joinpath(*parts)


#: values of ``FOVEA_NO_DISK_CACHE`` (any case, spaces around ignored) that turn the disk
#: caches off, and those that keep them (unset is the same as ``""``)
NO_DISK_CACHE_YES = ("1", "true", "yes", "on")
NO_DISK_CACHE_NO = ("", "0", "false", "no", "off")


def disk_cache_enabled() -> bool:
    """False when ``FOVEA_NO_DISK_CACHE`` says yes (``1``, ``true``, ``yes``, ``on``), True
    when it is unset or says no (``0``, ``false``, ``no``, ``off``, empty); any case.

    Raises:
        ValueError: any other value (``FOVEA_NO_DISK_CACHE=maybe``), naming the variable
            and the values it takes: a typo must not silently keep or drop the caches.
    """
    raw = os.environ.get("FOVEA_NO_DISK_CACHE", "")
    value = raw.strip().lower()
    if value in NO_DISK_CACHE_YES:
        return False
    if value in NO_DISK_CACHE_NO:
        return True
    raise ValueError(f"FOVEA_NO_DISK_CACHE must be one of {', '.join(NO_DISK_CACHE_YES)} (turn "
                     f"the disk caches off) or {', '.join(repr(v) for v in NO_DISK_CACHE_NO)} "
                     f"(keep them), got {raw!r}")


def file_digest(path: str | Path, algorithm: str = "sha256") -> str:
    """Hex digest of a file's bytes (read in blocks; ``algorithm``: any ``hashlib`` name)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, algorithm).hexdigest()
