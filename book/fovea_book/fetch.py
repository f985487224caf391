"""Download the book's datasets from their public sources, checked file by file.

Usage::

    python -m fovea_book.fetch                      # every dataset, into $FOVEA_DATA
    python -m fovea_book.fetch sroie-dev osie-dev   # some of them
    python -m fovea_book.fetch --list               # what there is
    python -m fovea_book.fetch --dest DIR           # somewhere else
    python -m fovea_book.fetch --base-url file:///mirror   # a local mirror of the repositories

Each dataset is a small subset of a public dataset as vendored in a public GitHub
repository. Every file is downloaded from that repository pinned by commit
(``https://raw.githubusercontent.com/OWNER/REPO/COMMIT/PATH``), its SHA-256 is checked
against the committed manifest ``datasets.json`` (next to this file), and the dataset is
written as ``<dest>/<name>/`` with the layout the book's loaders read. The destination is
``--dest``, else ``$FOVEA_DATA``, else ``data/external`` in the repository
(:func:`fovea_book.paths.data_dir`).

A dataset is written atomically: its files go into a hidden temporary folder beside the
destination (``<dest>/.<name>.fetch-XXXXXXXX``), every hash is checked, and only then is
the folder renamed to ``<dest>/<name>``. A wrong checksum, a failed or interrupted
download (any exception, Ctrl-C included) removes the temporary folder and leaves
nothing half-written. A dataset folder that already holds every file with the right hash
is left alone ("up to date"); one that exists but differs is reported and only replaced
with ``--force``, which replaces the manifest's files and keeps every other file of the
folder (a user's notes, extra images) where it was, and says how many it kept.

The datasets, their sources and the rule that picked each subset:

``sroie-dev`` (40 receipts) and ``sroie-train`` (216 receipts)
    ICDAR 2019 SROIE scanned receipts from ``zzzDavid/ICDAR-2019-SROIE`` at commit
    ``27be4271b251c256f695acbade9a801bffe85994`` (repository MIT licence; the
    competition's own terms may also apply). Receipt ids run 000-625. *sroie-dev*: every
    id that is a multiple of 16 (000, 016, ..., 624). *sroie-train*: the ids that are 3
    modulo 6 (003, 009, ..., 621), plus every id from 480 to 625 that is neither a
    multiple of 16 nor 3 modulo 6; none is in sroie-dev. Files are byte copies:
    ``data/img/NNN.jpg`` -> ``img/NNN.jpg``, ``data/box/NNN.csv`` -> ``box/NNN.csv``
    (CRLF line ends, as upstream), ``data/key/NNN.json`` -> ``key/NNN.json``.

``funsd-dev`` (37 forms) and ``funsd-train`` (110 forms)
    FUNSD (Jaume, Ekenel & Thiran, ICDAR-OST 2019; non-commercial research and education
    only), training split, as vendored in ``hemantsummit/PaddleLayoutLM`` at commit
    ``3e02a20e74d5915902d0397f2c9cd76d3624d21f``. Of the 147 training forms that have an
    image, sorted by name, *funsd-dev* is every fourth one starting with the first
    (positions 0, 4, 8, ...) and *funsd-train* the other 110. Byte copies:
    ``train_data/FUNSD/training_data/images/NAME.png`` -> ``images/NAME.png`` and
    ``.../annotations/NAME.json`` -> ``annotations/NAME.json``. These upstream paths follow
    FUNSD's own layout under the folder the dataset notes name; they could not be checked
    against the repository at that commit (see "What was checked" below).

``osie-dev`` (70 images) and ``osie-train`` (70 images)
    OSIE eye-tracking data (Xu, Jiang, Wang, Kankanhalli & Zhao, Journal of Vision
    14(1):28, 2014; MIT licence) from ``NUS-VIP/predicting-human-gaze-beyond-pixels`` at
    commit ``4a467890fcb40a2fec04cdded552760942bac7a4``. *osie-dev*: stimuli 1010, 1020,
    ..., 1700 (every tenth image); *osie-train*: stimuli 1005, 1015, ..., 1695. Both hold
    the whole ``eye/fixations.mat`` (all 700 records). Byte copies: ``data/stimuli/N.jpg``
    -> ``stimuli/N.jpg``, ``data/eye/fixations.mat`` -> ``eye/fixations.mat``.

``wildreceipt-dev`` (59 receipts)
    WildReceipt's test split (Sun, Kuang, Yue, Lin & Zhang, arXiv:2103.14470, 2021; released
    with OpenMMLab's MMOCR) as vendored in ``jenashauryasikt/SD_internship`` at commit
    ``5ba211ec23f54e6694e776a50da071e633e64577`` (repository MIT licence). The subset is
    every receipt whose line number in ``wildreceipt/test.txt`` (counting from 0) is a
    multiple of 8: lines 0, 8, ..., 464, named ``000``, ``008``, ... ``464``.
    ``class_list.txt`` is a byte copy of ``wildreceipt/class_list.txt``. The rest is
    derived from line ``N`` of ``test.txt`` (one JSON record per line,
    ``{"file_name", "height", "width", "annotations": [{"box", "text", "label"}]}``), by
    :func:`derive_wildreceipt`:

    * ``ann/NNN.json``: the record with ``file_name`` replaced by ``"img/NNN.jpg"``,
      written with ``json.dumps`` defaults (ASCII, ``", "`` and ``": "``), no newline;
    * ``box/NNN.csv``: one row per annotation, in order,
      ``x1,y1,x2,y2,x3,y3,x4,y4,TEXT`` (integral coordinates without ``.0``), each row
      ending in ``\\n``, UTF-8;
    * ``key/NNN.json``: ``company``, ``date`` and ``total`` = the text of the first box
      labelled Store_name_value (1), Date_value (7) and Total_value (23), keys in the order
      those boxes appear, a field left out when the receipt has no such box; ``json.dumps``
      defaults, no newline;
    * ``img/NNN.jpg``: the image the record's ``file_name`` names
      (``image_files/Image_N/M/HASH.jpeg``), copied byte for byte. It is not in that
      repository, and no pinned public GitHub copy is known: give the folder or URL under
      which ``file_name`` resolves (the ``wildreceipt/`` folder of MMOCR's
      ``wildreceipt.tar``, for instance) with ``--wildreceipt-images`` or
      ``$FOVEA_WILDRECEIPT_IMAGES``. Without it, wildreceipt-dev cannot be fetched.

    The manifest pins every derived file and image. It does not pin ``test.txt`` itself
    (no copy of it was at hand when the manifest was written); a changed ``test.txt``
    still fails the fetch through the derived files' hashes.

What was checked, and how (against a searchable index of public GitHub files):

* SROIE: ``data/box/NNN.csv`` and ``data/key/NNN.json`` in the repository have the same
  content and the same byte counts (with CRLF) as the reference copies (checked for a few
  receipts, at another commit of the repository than ``27be427``); other projects fetch
  ``data/box/`` and ``data/key/`` from ``27be427`` itself. ``data/img/NNN.jpg`` is the
  path other projects fetch images from (on the default branch), and ``img/000.jpg``'s
  SHA-256 matches one recorded independently for this repository's receipt 000.
* OSIE: the repository lists ``data/stimuli/1001.jpg`` ... and ``data/eye/fixations.mat``
  and its README describes both (at another commit than ``4a46789``).
* FUNSD: not checked. The index holds neither the images nor the annotations of that
  repository under FUNSD's names, only JPEG images from another commit; the paths above
  are FUNSD's own layout under ``train_data/FUNSD/training_data``.
* WildReceipt: line 0 of ``test.txt`` turned into ``ann/000.json`` reproduces the
  reference copy byte for byte; ``box/`` and ``key/`` derived from the 59 reference
  ``ann/`` files reproduce all 59 reference files byte for byte; ``class_list.txt``
  matches. Where the images come from is not known (see above).

If a download 404s or a hash differs, the message names the file, the URL and both
hashes; the manifest (``datasets.json``) records, per dataset, what was and was not
checked (``upstream_paths``).

Environment: ``FOVEA_DATA`` (destination), ``FOVEA_FETCH_BASE_URL`` (replaces
``https://raw.githubusercontent.com``, e.g. ``file:///path/to/mirror``; the mirror holds
``OWNER/REPO/COMMIT/PATH``), ``FOVEA_WILDRECEIPT_IMAGES`` (see wildreceipt-dev).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from tqdm import tqdm

from fovea_book.paths import data_dir
from fovea_core.paths import file_digest

__all__ = [
    "BASE_URL_ENV", "DEFAULT_BASE_URL", "IMAGES_ENV", "MANIFEST_PATH", "ChecksumError",
    "Dataset", "FetchError", "FileEntry", "check_folder", "derive_wildreceipt", "fetch",
    "fetch_dataset", "load_manifest", "main", "raw_url",
]

DEFAULT_BASE_URL = "https://raw.githubusercontent.com"
BASE_URL_ENV = "FOVEA_FETCH_BASE_URL"
IMAGES_ENV = "FOVEA_WILDRECEIPT_IMAGES"
MANIFEST_PATH = Path(__file__).with_name("datasets.json")

TIMEOUT_S = 60.0
RETRIES = 2                 # extra tries for a transient HTTP(S) failure (not for file://)
CHUNK = 1 << 16
USER_AGENT = "fovea-book-fetch/1"
WILDRECEIPT_KEY_LABELS = {1: "company", 7: "date", 23: "total"}


class FetchError(RuntimeError):
    """A dataset could not be fetched; the message says which file and why."""


class ChecksumError(FetchError):
    """A file's SHA-256 is not the manifest's."""

    def __init__(self, dataset: str, dest: str, expected: str, actual: str, origin: str):
        self.dataset, self.dest = dataset, dest
        self.expected, self.actual, self.origin = expected, actual, origin
        super().__init__(f"{dataset}/{dest}: SHA-256 mismatch (from {origin}): "
                         f"expected {expected}, got {actual}")


@dataclass(frozen=True)
class FileEntry:
    """One file of a dataset.

    Attributes:
        dest: path inside the dataset folder (POSIX, relative), e.g. ``"img/000.jpg"``.
        sha256: its expected SHA-256 (hex).
        size: its expected size in bytes (``None``: not recorded).
        path: the upstream path in the source repository, for a byte copy.
        derive: for a derived file, what to derive (``"ann"``, ``"box"``, ``"key"`` or
            ``"img"``, see :func:`derive_wildreceipt`); ``path`` is then ``None``.
        line: the source line a derived file comes from (0-based).
    """

    dest: str
    sha256: str
    size: int | None = None
    path: str | None = None
    derive: str | None = None
    line: int | None = None


@dataclass(frozen=True)
class Dataset:
    """One dataset of the manifest: where it comes from and the files it holds.

    Attributes:
        name: folder name, e.g. ``"sroie-dev"``.
        repo: source repository ``OWNER/REPO`` on GitHub.
        commit: the pinned commit (40 hex digits).
        licence: licence note.
        description: one line about the dataset.
        split: the rule that picked this subset.
        files: the files, in the order they are fetched.
        derive_path: upstream path of the file the derived files come from, if any.
        derive_sha256: its SHA-256, or ``None`` when it is not pinned.
        images_base_url: default base URL of the derived images (``None``: none known).
        notes: the manifest's notes, e.g. ``upstream_paths`` (what was checked upstream).
    """

    name: str
    repo: str
    commit: str
    licence: str
    description: str
    split: str
    files: tuple[FileEntry, ...]
    derive_path: str | None = None
    derive_sha256: str | None = None
    images_base_url: str | None = None
    notes: Mapping[str, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """Total size in bytes of the files whose size is recorded."""
        return sum(f.size or 0 for f in self.files)

    @property
    def needs_images(self) -> bool:
        """Whether some file is an image derived from a source line."""
        return any(f.derive == "img" for f in self.files)


# ---------------------------------------------------------------------------------- manifest

def _safe_relpath(value: Any, what: str) -> str:
    """``value`` as a relative POSIX path without ``..``; raise :class:`ValueError`."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what}: expected a non-empty path, got {value!r}")
    p = PurePosixPath(value)
    if p.is_absolute() or ".." in p.parts or "\\" in value:
        raise ValueError(f"{what}: {value!r} is not a safe relative path")
    return value


def _sha256_hex(value: Any, what: str) -> str:
    if not (isinstance(value, str) and len(value) == 64
            and all(c in "0123456789abcdef" for c in value)):
        raise ValueError(f"{what}: {value!r} is not a lowercase hex SHA-256")
    return value


def load_manifest(path: str | Path | None = None) -> dict[str, Dataset]:
    """Read the manifest (default: ``datasets.json`` beside this module).

    Raises :class:`ValueError` naming the entry when the manifest is malformed (an unsafe
    destination path, a hash that is not 64 hex digits, a file that is neither copied nor
    derived).
    """
    path = Path(path) if path is not None else MANIFEST_PATH
    raw = json.loads(path.read_text(encoding="utf-8"))
    if raw.get("format") != 1:
        raise ValueError(f"{path}: unknown manifest format {raw.get('format')!r}")
    out: dict[str, Dataset] = {}
    for name, d in raw["datasets"].items():
        files = []
        for i, f in enumerate(d["files"]):
            what = f"{path.name}: {name} file {i}"
            dest = _safe_relpath(f.get("dest"), what)
            up = f.get("path")
            derive = f.get("derive")
            if (up is None) == (derive is None):
                raise ValueError(f"{what} ({dest}): give exactly one of 'path' and 'derive'")
            if derive is not None and (derive not in ("ann", "box", "key", "img")
                                       or not isinstance(f.get("line"), int)):
                raise ValueError(f"{what} ({dest}): bad derive {derive!r} / line {f.get('line')!r}")
            files.append(FileEntry(
                dest=dest, sha256=_sha256_hex(f.get("sha256"), f"{what} ({dest})"),
                size=f.get("size"), path=None if up is None else _safe_relpath(up, what),
                derive=derive, line=f.get("line")))
        src = d["source"]
        der = d.get("derive") or {}
        if der and der.get("rule") != "wildreceipt":
            raise ValueError(f"{path.name}: {name}: unknown derive rule {der.get('rule')!r}")
        if any(f.derive for f in files) and not der:
            raise ValueError(f"{path.name}: {name}: derived files but no 'derive' source")
        out[name] = Dataset(
            name=name, repo=src["repo"], commit=src["commit"], licence=src.get("licence", ""),
            description=d.get("description", ""), split=d.get("split", ""), files=tuple(files),
            derive_path=_safe_relpath(der["path"], f"{name} derive") if der else None,
            derive_sha256=(None if der.get("sha256") is None
                           else _sha256_hex(der["sha256"], f"{name} derive")),
            images_base_url=(d.get("images") or {}).get("base_url"),
            notes={k: d[k] for k in ("upstream_paths",) if k in d})
    return out


def raw_url(dataset: Dataset, upstream: str, base_url: str | None = None) -> str:
    """URL of ``upstream`` in ``dataset``'s repository at its pinned commit.

    ``base_url`` replaces ``https://raw.githubusercontent.com`` (default: ``$FOVEA_FETCH_BASE_URL``,
    else GitHub), e.g. ``file:///tmp/mirror`` for a mirror laid out as
    ``OWNER/REPO/COMMIT/PATH``.
    """
    base = (base_url or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL).rstrip("/")
    return f"{base}/{dataset.repo}/{dataset.commit}/{urllib.parse.quote(upstream)}"


# ------------------------------------------------------------------------------- derivation

def _wildreceipt_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def derive_wildreceipt(kind: str, line: str, number: int) -> bytes:
    """The bytes of WildReceipt file ``kind`` for receipt ``number`` from its ``test.txt`` line.

    Args:
        kind: ``"ann"`` (the record with ``file_name`` = ``img/NNN.jpg``), ``"box"``
            (``x1,...,y4,TEXT`` rows) or ``"key"`` (``company``/``date``/``total``).
        line: the line of ``test.txt`` (one JSON record, without its newline).
        number: the receipt's line number (it names the files: ``NNN`` = ``f"{number:03d}"``).

    The rules are those of the module docstring; they reproduce the reference copies byte
    for byte.
    """
    record = json.loads(line)
    if kind == "ann":
        record["file_name"] = f"img/{number:03d}.jpg"
        return json.dumps(record).encode("ascii")
    if kind == "box":
        rows = [",".join(_wildreceipt_number(v) for v in a["box"]) + "," + a["text"] + "\n"
                for a in record["annotations"]]
        return "".join(rows).encode("utf-8")
    if kind == "key":
        key: dict[str, str] = {}
        for a in record["annotations"]:
            name = WILDRECEIPT_KEY_LABELS.get(a["label"])
            if name is not None and name not in key:
                key[name] = a["text"]
        return json.dumps(key).encode("ascii")
    raise ValueError(f"unknown WildReceipt file kind {kind!r}")


# ---------------------------------------------------------------------------------- download

def _open(url: str, timeout: float = TIMEOUT_S) -> IO[bytes]:
    """Open ``url`` for reading (the one network call; tests replace it)."""
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    return urllib.request.urlopen(request, timeout=timeout)


def _download(url: str, target: Path, retries: int = RETRIES) -> tuple[str, int]:
    """Stream ``url`` into ``target``; return its SHA-256 and size.

    A transient HTTP(S) failure (5xx, connection error, timeout) is retried ``retries``
    times with a growing pause; anything else raises :class:`FetchError` naming the URL.
    """
    retry = urllib.parse.urlsplit(url).scheme in ("http", "https")
    target.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(retries + 1):
        try:
            digest, size = hashlib.sha256(), 0
            with _open(url) as response, open(target, "wb") as out:
                while chunk := response.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
            return digest.hexdigest(), size
        except urllib.error.HTTPError as exc:
            transient = exc.code >= 500
            reason = f"HTTP {exc.code} {exc.reason}"
        except (urllib.error.URLError, OSError) as exc:
            transient = isinstance(exc, (urllib.error.URLError, ConnectionError, TimeoutError))
            reason = str(getattr(exc, "reason", None) or exc)
        if not (retry and transient) or attempt == retries:
            raise FetchError(f"cannot download {url}: {reason}")
        time.sleep(2 ** attempt)
    raise AssertionError("unreachable")  # pragma: no cover


def check_folder(dataset: Dataset, folder: str | Path) -> list[str]:
    """Problems of an existing dataset folder: one line per missing or differing file.

    An empty list means every file of the manifest is there with the right SHA-256
    (extra files are ignored).
    """
    folder = Path(folder)
    problems: list[str] = []
    for f in dataset.files:
        p = folder / f.dest
        if not p.is_file():
            problems.append(f"{f.dest}: missing")
            continue
        if f.size is not None and p.stat().st_size != f.size:
            problems.append(f"{f.dest}: {p.stat().st_size} bytes, expected {f.size}")
            continue
        actual = file_digest(p)
        if actual != f.sha256:
            problems.append(f"{f.dest}: SHA-256 {actual}, expected {f.sha256}")
    return problems


def _fresh_dir(parent: Path, prefix: str) -> Path:
    """Create and return a new, empty folder ``parent/prefix<random>`` (umask permissions)."""
    while True:
        path = parent / f"{prefix}{secrets.token_hex(4)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:  # pragma: no cover - 32 random bits
            continue


def _fill(dataset: Dataset, work: Path, base_url: str | None, images_base_url: str | None,
          bar: tqdm) -> None:
    """Download (and derive) every file of ``dataset`` into ``work``, checking each hash."""
    lines: list[str] | None = None
    if dataset.derive_path is not None:
        source = work / ".sources" / dataset.derive_path
        url = raw_url(dataset, dataset.derive_path, base_url)
        actual, _ = _download(url, source)
        if dataset.derive_sha256 is not None and actual != dataset.derive_sha256:
            raise ChecksumError(dataset.name, dataset.derive_path, dataset.derive_sha256,
                                actual, url)
        lines = source.read_text(encoding="utf-8").split("\n")
        bar.update(1)

    for f in dataset.files:
        target = work / f.dest
        if f.path is not None:
            url = raw_url(dataset, f.path, base_url)
            actual, _ = _download(url, target)
            origin = url
        else:
            assert lines is not None and f.line is not None and f.derive is not None
            if not 0 <= f.line < len(lines) or not lines[f.line].strip():
                raise FetchError(f"{dataset.name}/{f.dest}: {dataset.derive_path} has no "
                                 f"line {f.line}")
            line = lines[f.line]
            origin = f"{dataset.derive_path} line {f.line}"
            if f.derive == "img":
                assert images_base_url, "fetch_dataset checks that an image source is given"
                name = json.loads(line)["file_name"]
                url = f"{images_base_url.rstrip('/')}/{urllib.parse.quote(name)}"
                origin = f"{url} ({origin})"
                actual, _ = _download(url, target)
            else:
                data = derive_wildreceipt(f.derive, line, f.line)
                actual = hashlib.sha256(data).hexdigest()
                if actual == f.sha256:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(data)
        if actual != f.sha256:
            raise ChecksumError(dataset.name, f.dest, f.sha256, actual, origin)
        bar.update(1)
    if lines is not None:
        shutil.rmtree(work / ".sources")


def fetch_dataset(dataset: Dataset, dest: str | Path, *, base_url: str | None = None,
                  images_base_url: str | None = None, force: bool = False,
                  progress: bool = True) -> str:
    """Fetch one dataset into ``dest/<name>``, atomically; return what happened.

    Args:
        dataset: the dataset (from :func:`load_manifest`; a test may pass one with fewer files).
        dest: the data root; created if missing.
        base_url: replaces ``https://raw.githubusercontent.com`` (see :func:`raw_url`).
        images_base_url: base URL of WildReceipt's ``image_files/`` (default
            ``$FOVEA_WILDRECEIPT_IMAGES``, else the manifest's, else none).
        force: replace an existing folder that differs from the manifest: its manifest
            files are replaced, every other file in it is kept (moved into the new folder).
        progress: show a progress bar over the files.

    Returns:
        ``"up to date"`` (the folder was already complete), ``"fetched"`` or ``"replaced"``
        (followed by ``"; kept K files not in the manifest: a, b, ..."`` when the folder
        held files of its own).

    Raises:
        ChecksumError: a file's SHA-256 differs (the message names file, origin and hashes).
        FetchError: a download failed, the folder exists and differs (without ``force``),
            or no image source is known. In every case nothing is left behind in ``dest``.
    """
    dest = Path(dest).expanduser()
    final = dest / dataset.name
    if final.exists() or final.is_symlink():
        if not final.is_dir():
            raise FetchError(f"{final} exists and is not a folder")
        problems = check_folder(dataset, final)
        if not problems:
            return "up to date"
        if not force:
            shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more"
                                               if len(problems) > 5 else "")
            raise FetchError(f"{final} exists but differs from the manifest ({shown}); "
                             f"rerun with --force to replace it")
    images = images_base_url or os.environ.get(IMAGES_ENV) or dataset.images_base_url
    if dataset.needs_images and not images:
        raise FetchError(
            f"{dataset.name}: no source is known for WildReceipt's images. Give the folder or "
            f"URL that holds image_files/ (the wildreceipt/ folder of MMOCR's wildreceipt.tar, "
            f"e.g. file:///data/wildreceipt) with --wildreceipt-images or ${IMAGES_ENV}.")
    try:
        dest.mkdir(parents=True, exist_ok=True)
        work = _fresh_dir(dest, f".{dataset.name}.fetch-")
    except OSError as exc:
        raise FetchError(f"cannot write into {dest}: {exc}") from exc
    total = len(dataset.files) + (1 if dataset.derive_path else 0)
    try:
        with tqdm(total=total, desc=dataset.name, unit="file", disable=not progress,
                  file=sys.stderr, leave=False) as bar:
            _fill(dataset, work, base_url, images, bar)
        if final.exists() or final.is_symlink():
            old = dest / f".{dataset.name}.old-{secrets.token_hex(4)}"
            os.rename(final, old)
            try:
                os.rename(work, final)
            except BaseException:
                os.rename(old, final)
                raise
            kept, left = _keep_foreign(dataset, old, final)
            if left:                                # never delete what could not be moved
                return (f"replaced; {len(left)} file(s) not in the manifest could not be "
                        f"moved into the new folder and are kept in {old}: "
                        f"{_names(left)}")
            shutil.rmtree(old, ignore_errors=True)
            return "replaced" + (f"; kept {len(kept)} file(s) not in the manifest: "
                                 f"{_names(kept)}" if kept else "")
        os.rename(work, final)
        return "fetched"
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def _names(paths: list[str], shown: int = 5) -> str:
    return ", ".join(paths[:shown]) + (f", ... ({len(paths) - shown} more)"
                                       if len(paths) > shown else "")


def _keep_foreign(dataset: Dataset, old: Path, new: Path) -> tuple[list[str], list[str]]:
    """Move every file (or link) of ``old`` that the manifest does not list into ``new`` at
    the same relative path (a rename: same file system). Returns ``(kept, left)``: the
    relative paths moved, and those that could not be (left in ``old``)."""
    ours = {f.dest for f in dataset.files}
    kept, left = [], []
    for p in sorted(old.rglob("*")):
        rel = p.relative_to(old).as_posix()
        if p.is_dir() and not p.is_symlink() or rel in ours:
            continue
        target = new / rel
        try:
            if target.exists() or target.is_symlink():
                raise FileExistsError(rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(p, target)
            kept.append(rel)
        except OSError:
            left.append(rel)
    return kept, left


def fetch(names: Iterable[str] | None = None, dest: str | Path | None = None, *,
          manifest: Mapping[str, Dataset] | None = None, base_url: str | None = None,
          images_base_url: str | None = None, force: bool = False, progress: bool = True,
          report: Callable[[str, str], None] | None = None) -> dict[str, str]:
    """Fetch several datasets (default: all); return ``{name: outcome}``.

    ``outcome`` is ``"up to date"``, ``"fetched"``, ``"replaced"`` or ``"failed: ..."``; a
    failed dataset does not stop the others. ``dest`` defaults to ``$FOVEA_DATA``, else
    ``data/external`` in the repository. ``manifest`` (default :func:`load_manifest`) is
    the hook tests use to fetch a few files. ``report(name, outcome)`` is called after each
    dataset.
    Raises :class:`KeyError` for an unknown name (before anything is downloaded).
    """
    manifest = load_manifest() if manifest is None else manifest
    names = list(manifest) if names is None else list(names)
    unknown = [n for n in names if n not in manifest]
    if unknown:
        raise KeyError(f"unknown dataset(s): {', '.join(unknown)}; "
                       f"valid names: {', '.join(manifest)}")
    root = Path(dest).expanduser() if dest is not None else data_dir()
    outcomes: dict[str, str] = {}
    for name in dict.fromkeys(names):
        try:
            outcome = fetch_dataset(manifest[name], root, base_url=base_url,
                                    images_base_url=images_base_url, force=force,
                                    progress=progress)
        except FetchError as exc:
            outcome = f"failed: {exc}"
        outcomes[name] = outcome
        if report is not None:
            report(name, outcome)
    return outcomes


# ---------------------------------------------------------------------------------------- CLI

def _list(manifest: Mapping[str, Dataset]) -> str:
    rows = []
    for d in manifest.values():
        extra = ("  (images: --wildreceipt-images)"
                 if d.needs_images and not d.images_base_url else "")
        rows.append(f"{d.name:<16} {len(d.files):>4} files {d.size / 1e6:7.1f} MB  "
                    f"{d.repo}@{d.commit[:7]}  {d.description}{extra}")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None, manifest: Mapping[str, Dataset] | None = None) -> int:
    """Command line; return the exit status (0 ok, 1 a dataset failed, 2 bad arguments)."""
    manifest = load_manifest() if manifest is None else manifest
    parser = argparse.ArgumentParser(
        prog="python -m fovea_book.fetch",
        description="Download the book's datasets from their public sources (pinned commits), "
                    "checking every file's SHA-256.",
        epilog=f"datasets: {', '.join(manifest)}")
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help="datasets to fetch (default: all)")
    parser.add_argument("--dest", metavar="DIR",
                        help="data root (default: $FOVEA_DATA, else data/external)")
    parser.add_argument("--list", action="store_true", help="list the datasets and exit")
    parser.add_argument("--base-url", metavar="URL",
                        help=f"replaces {DEFAULT_BASE_URL} (also ${BASE_URL_ENV}); "
                             "e.g. file:///path/to/mirror holding OWNER/REPO/COMMIT/PATH")
    parser.add_argument("--wildreceipt-images", metavar="URL",
                        help="folder or URL holding WildReceipt's image_files/ "
                             f"(also ${IMAGES_ENV})")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing dataset folder that differs from the manifest "
                             "(its files; other files in it are kept)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.dest is not None and not args.dest.strip():
        parser.error("--dest must be a folder's path, got an empty string (leave it out for "
                     "$FOVEA_DATA, else data/external)")
    unknown = [n for n in args.names if n not in manifest]
    if unknown:
        parser.error(f"unknown dataset(s): {', '.join(unknown)}; "
                     f"valid names: {', '.join(manifest)}")
    if args.list:
        print(_list(manifest))
        return 0
    root = Path(args.dest).expanduser() if args.dest else data_dir()

    def report(name: str, outcome: str) -> None:
        if outcome.startswith("failed"):
            print(f"{name}: {outcome}", file=sys.stderr)
        else:
            print(f"{name}: {outcome} ({root / name}, {len(manifest[name].files)} files)")

    try:
        outcomes = fetch(args.names or None, root, manifest=manifest,
                         base_url=args.base_url, images_base_url=args.wildreceipt_images,
                         force=args.force, progress=not args.quiet, report=report)
    except KeyboardInterrupt:
        print("interrupted; nothing half-written was left behind", file=sys.stderr)
        return 130
    return 1 if any(o.startswith("failed") for o in outcomes.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
