"""A small on-disk key -> text store in SQLite, shared by every layer that caches results.

:class:`SqliteCache` holds the OCR reader's texts (:mod:`fovea_book.eval.reader`), the
coarse-view OCR of the query scorers (:mod:`fovea_core.importance.query`), and the
evaluator's score maps and finished rows (:mod:`fovea_book.eval.evaluator`): one file per
use, one table ``ocr (key TEXT PRIMARY KEY, text TEXT)`` (named for its first use; the
name stays so that existing files stay valid). Values are text; callers serialise (JSON,
base64) and choose their keys.

It lives at the bottom layer (``tests/test_layers.py``) because it depends on nothing of
``fovea_core``: the scorers (layer 2) and the evaluation (layer 4) both use it.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

__all__ = ["SETUP_TRIES", "CacheWarning", "SqliteCache"]

#: attempts at a cache file's first set-up while another process holds its lock (~60 s in all)
SETUP_TRIES = 75


class CacheWarning(UserWarning):
    """A cache file that cannot be used: the work goes on without it."""


class SqliteCache:
    """A tiny thread-safe key -> text store in SQLite, safe to open from several processes
    at once (WAL; a new file's set-up is retried while another process holds its lock).

    Args:
        path: the SQLite file (created with its folder on the first read or write);
            ``None``: a cache that stores nothing (every :meth:`get` misses, :meth:`put`
            does nothing). A path that cannot be created or written (a read-only folder, a
            file where the folder should be) makes the cache store nothing from then on,
            with one :class:`CacheWarning` naming the path: a cache never stops the work.
            A file that is not a valid SQLite database (random bytes, a truncated or
            corrupt file) is moved aside to ``<name>.corrupt-<time>`` with one
            :class:`CacheWarning` naming both paths, and a fresh file takes its place: the
            work recomputes what it held.

    Attributes:
        hits, misses: :meth:`get` calls that found / did not find their key (this object's).

    The connection opens lazily; a pickled cache carries only its path (connections do not
    pickle: a worker process reopens the file).
    """

    def __init__(self, path: Path | str | None):
        self.path = None if path is None else Path(path)
        self._lock, self._conn = threading.Lock(), None
        self.hits = self.misses = 0
        self._set_aside_once = False

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=60, check_same_thread=False)
            # switching a new file to WAL takes an exclusive lock and fails at once (no busy
            # wait) while another process creates the same file, e.g. two sweep workers
            # opening a reader's cache for the first time: retry until that one is done
            for attempt in range(SETUP_TRIES):
                try:
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.execute("CREATE TABLE IF NOT EXISTS ocr (key TEXT PRIMARY KEY, text TEXT)")
                    break
                except sqlite3.OperationalError as err:
                    if "locked" not in str(err) or attempt == SETUP_TRIES - 1:
                        conn.close()
                        raise
                    time.sleep(0.02 * (attempt + 1))
                except sqlite3.DatabaseError:             # not a database: set aside above
                    conn.close()
                    raise
            self._conn = conn
        return self._conn

    def _set_aside(self, err: Exception) -> bool:
        """The file is not a database (``sqlite3.DatabaseError`` other than an operational
        one): close it, move it (and its WAL files) aside, warn once; ``True`` when a fresh
        file can be tried, ``False`` when this cache already did so once (then it gives
        up)."""
        import warnings

        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._set_aside_once:
            self._give_up(err)
            return False
        self._set_aside_once = True
        aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        for suffix in ("", "-wal", "-shm"):
            src = self.path.with_name(self.path.name + suffix)
            try:
                src.rename(aside.with_name(aside.name + suffix))
            except FileNotFoundError:          # another process moved it first, or none
                pass
            except OSError as move_err:
                self._give_up(move_err)
                return False
        warnings.warn(f"cache {self.path} is not a valid SQLite database ({type(err).__name__}: "
                      f"{err}); moved it to {aside.name} and started a fresh one (what it held "
                      "is recomputed)", CacheWarning, stacklevel=4)
        return True

    def _run(self, work):
        """``work(connection)``, with the file set aside once if it is not a database, and
        ``None`` after giving up (the error said once)."""
        for _ in range(2):
            try:
                return work(self._db())
            except (OSError, sqlite3.OperationalError) as err:
                self._give_up(err)
                return None
            except sqlite3.DatabaseError as err:         # not a database / malformed
                if not self._set_aside(err):
                    return None
        return None                                      # pragma: no cover

    def _give_up(self, err: Exception) -> None:
        """Store nothing from now on, and say so once (the path and the error)."""
        import warnings

        warnings.warn(f"cache {self.path} cannot be used ({type(err).__name__}: {err}); going "
                      "on without it (set FOVEA_CACHE to a writable folder, or "
                      "FOVEA_NO_DISK_CACHE=1)", CacheWarning, stacklevel=3)
        if self._conn is not None:
            self._conn.close()
        self.path, self._conn = None, None

    def get(self, key: str) -> str | None:
        """The text stored under ``key``, or ``None`` (always ``None`` without a path)."""
        if self.path is None:
            return None
        with self._lock:
            row = self._run(lambda db: db.execute("SELECT text FROM ocr WHERE key = ?",
                                                  (key,)).fetchone())
        self.hits += row is not None
        self.misses += row is None
        return None if row is None else row[0]

    def put(self, key: str, text: str) -> None:
        """Store ``text`` under ``key`` (replacing what was there; nothing without a path)."""
        if self.path is None:
            return
        with self._lock:
            self._run(lambda db: (db.execute("INSERT OR REPLACE INTO ocr VALUES (?, ?)",
                                             (key, text)), db.commit()))

    def drop(self, key: str) -> None:
        """Remove the entry under ``key`` (a value its reader could not parse), if any."""
        if self.path is None:
            return
        with self._lock:
            self._run(lambda db: (db.execute("DELETE FROM ocr WHERE key = ?", (key,)),
                                  db.commit()))

    def __len__(self) -> int:
        """The number of entries stored (0 without a path, or before the file exists: a
        count never creates it). Entries written by other processes count too, so the
        difference of two counts is what every process stored in between."""
        if self.path is None or not self.path.exists():
            return 0
        with self._lock:
            n = self._run(lambda db: int(db.execute("SELECT COUNT(*) FROM ocr").fetchone()[0]))
        return 0 if n is None else n

    def __getstate__(self):  # connections do not pickle (dask workers reopen the file)
        return {"path": self.path}

    def __setstate__(self, state):
        self.__init__(state["path"])
