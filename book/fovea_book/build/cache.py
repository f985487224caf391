"""What a notebook's executed copy depends on, as one hash per notebook (incremental builds).

A notebook is re-executed only when its *cache key* changes. The key hashes everything
that can change what the notebook computes :

* the notebook's source file (bytes);
* the sources of ``fovea_core`` (with its weights), of the book's package
  ``book/fovea_book`` and the CUDA/C sources in ``cuda/`` that it compiles (except
  ``book/fovea_book/build/``, this build tool, which no notebook imports: a test checks);
* the profile and the parameters passed to papermill;
* a manifest of the data it may read: every file under the dataset folder
  (``$FOVEA_DATA``, default ``data/external``; symlinks followed) as *relative path, size,
  mtime*, and the project's own small ``data/`` tables by content (a fresh clone sets new
  mtimes; ``data/cache`` is excluded: it holds results, not inputs);
* the locked environment: the hash of ``requirements.lock``, the Python version and the
  installed version of every package the lock pins (a hand-upgraded package counts).

Records live in ``<store>/.cache.json`` beside the executed copies; each record also keeps
the SHA-256 of the executed copy, so a copy edited or damaged since is not trusted.
Anything the key does not list (the clock, the network, a cache under ``data/cache``)
is assumed not to change a notebook's results; ``make book FORCE=1`` re-runs everything.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from fovea_core.paths import file_digest

#: Bump when the runner changes what it writes into an executed copy.
CACHE_FORMAT = 2
LOCK_FILE = "requirements.lock"
#: Source folders whose files are hashed (relative to the project root), and their suffixes.
SOURCE_DIRS = {"fovea_core": (".py", ".json", ".csv", ".cu", ".h", ".pt"),
               "book/fovea_book": (".py", ".json", ".csv"),
               "cuda": (".cu", ".cuh", ".h", ".c", ".cpp")}
_SKIP_DIRS = {"__pycache__", ".ipynb_checkpoints", "build"}
#: The build tool itself: changing the runner does not change what a notebook computes.
TOOL_DIR = "book/fovea_book/build"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _digest(obj: object) -> str:
    return sha256_bytes(json.dumps(obj, sort_keys=True, default=str).encode())


def _walk(root: Path, *, follow: bool) -> list[Path]:
    """Files under ``root`` (sorted), skipping caches and hidden folders."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=follow):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        found += [Path(dirpath) / f for f in filenames if not f.startswith(".")]
    return sorted(found)


def sources_fingerprint(root: Path) -> str:
    """Hash of the library sources the notebooks import (content, not mtimes)."""
    items = []
    for folder, suffixes in SOURCE_DIRS.items():
        base = root / folder
        if base.is_dir():
            items += [(p.relative_to(root).as_posix(), file_digest(p))
                      for p in _walk(base, follow=False) if p.suffix in suffixes
                      and not p.relative_to(root).as_posix().startswith(TOOL_DIR + "/")]
    return _digest(items)


def dataset_dir(root: Path) -> Path:
    """The dataset folder the notebooks read: ``$FOVEA_DATA``, else ``root/data/external``."""
    env = os.environ.get("FOVEA_DATA")
    return Path(env).expanduser() if env else root / "data" / "external"


def data_manifest(root: Path) -> dict[str, object]:
    """Datasets as names, sizes and mtimes; the project's own ``data/`` files by content."""
    external = dataset_dir(root)
    datasets = []
    if external.is_dir():
        for p in _walk(external, follow=True):
            st = p.stat()
            datasets.append((p.relative_to(external).as_posix(), st.st_size, st.st_mtime_ns))
    project = []
    if (root / "data").is_dir():
        for p in _walk(root / "data", follow=False):
            rel = p.relative_to(root / "data").as_posix()
            if rel.split("/")[0] not in ("external", "cache"):
                project.append((rel, file_digest(p)))
    return {"datasets": str(external.resolve()) if external.exists() else None,
            "datasets_files": _digest(datasets), "project_data": _digest(project)}


def locked_packages(lock: Path) -> list[str]:
    """Normalised names of the packages pinned in a ``name==version`` lock file."""
    if not lock.exists():
        return []
    names = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", lock.read_text(), re.M)
    return sorted({re.sub(r"[-_.]+", "-", n).lower() for n in names})


def environment_fingerprint(root: Path) -> dict[str, object]:
    """The lock file's hash, the Python version and the installed versions of locked packages."""
    lock = root / LOCK_FILE
    installed = {}
    for name in locked_packages(lock):
        try:
            installed[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed[name] = None
    return {"lock": file_digest(lock) if lock.exists() else None,
            "python": platform.python_version(),
            "installed": _digest(installed)}


@dataclass
class Inputs:
    """Inputs shared by every notebook of one build (computed once per build)."""

    sources: str
    data: dict[str, object]
    environment: dict[str, object]

    @classmethod
    def of(cls, root: Path) -> "Inputs":
        return cls(sources_fingerprint(root), data_manifest(root), environment_fingerprint(root))


def notebook_key(source: Path, profile: str, parameters: dict, shared: Inputs) -> dict[str, object]:
    """Everything the executed copy of ``source`` depends on, and its hash under ``"key"``."""
    parts = {"format": CACHE_FORMAT, "notebook": file_digest(source), "profile": profile,
             "parameters": parameters, "fovea_core": shared.sources, "data": shared.data,
             "environment": shared.environment}
    return {"key": _digest(parts), **parts}


def changed_inputs(old: dict[str, object] | None, new: dict[str, object]) -> list[str]:
    """Names of the inputs that differ between two :func:`notebook_key` results."""
    if not old:
        return ["never run"]
    return [k for k in new if k != "key" and old.get(k) != new[k]] or (
        ["key"] if old.get("key") != new.get("key") else [])


@dataclass
class CacheRecords:
    """``<store>/.cache.json``: one record per executed notebook (its key, output hash, time)."""

    path: Path
    records: dict[str, dict] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> "CacheRecords":
        try:
            return cls(path, json.loads(path.read_text()))
        except (OSError, ValueError):
            return cls(path, {})

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.records, indent=1, sort_keys=True))
        tmp.replace(self.path)

    def fresh(self, name: str, inputs: dict[str, object], executed: Path) -> bool:
        """True when ``executed`` was produced from exactly ``inputs`` and is unchanged since."""
        rec = self.records.get(name)
        return bool(rec and rec.get("inputs", {}).get("key") == inputs["key"]
                    and executed.exists() and file_digest(executed) == rec.get("output"))

    def why_stale(self, name: str, inputs: dict[str, object], executed: Path) -> list[str]:
        rec = self.records.get(name)
        if rec and not executed.exists():
            return ["executed copy missing"]
        reasons = changed_inputs(rec.get("inputs") if rec else None, inputs)
        if not reasons and rec and file_digest(executed) != rec.get("output"):
            reasons = ["executed copy changed"]
        return reasons

    def record(self, name: str, inputs: dict[str, object], executed: Path, seconds: float) -> None:
        self.records[name] = {"inputs": inputs, "output": file_digest(executed),
                              "seconds": round(seconds, 2)}

    def forget(self, name: str) -> None:
        self.records.pop(name, None)
