"""The shared SQLite store (:mod:`fovea_core.cache`): files written before it moved out of
``eval.reader`` stay valid, a pickled cache reopens its file, a path-less cache stores
nothing, and the scorers' layer can use it (it imports nothing of ``fovea_core``)."""

from __future__ import annotations

import ast
import pickle
import sqlite3
from pathlib import Path

import pytest

from fovea_core import cache as cache_module
from fovea_core.cache import SqliteCache


def test_reads_a_file_in_the_old_layout(tmp_path):
    """A file as ``reader._Cache`` wrote it (table ``ocr``, key/text) is read as is."""
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE ocr (key TEXT PRIMARY KEY, text TEXT)")
    conn.execute("INSERT INTO ocr VALUES ('k1', 'TOTAL 12.50')")
    conn.commit()
    conn.close()
    store = SqliteCache(path)
    assert store.get("k1") == "TOTAL 12.50"
    assert store.get("k2") is None
    assert (store.hits, store.misses) == (1, 1)
    store.put("k2", "v2")
    store.put("k2", "v3")                                       # replaces
    rows = sqlite3.connect(path).execute("SELECT key, text FROM ocr ORDER BY key").fetchall()
    assert rows == [("k1", "TOTAL 12.50"), ("k2", "v3")]
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_pickles_by_path_and_reopens(tmp_path):
    store = SqliteCache(tmp_path / "sub" / "c.sqlite")
    store.put("a", "1")                                         # opens a connection
    again = pickle.loads(pickle.dumps(store))
    assert again.path == store.path and again._conn is None
    assert again.get("a") == "1" and (again.hits, again.misses) == (1, 0)


def test_len_counts_every_process_entries_and_never_creates_the_file(tmp_path):
    """``len`` is the number of keys stored, by this object or another on the same file (a
    replaced key counts once); a count of a file that does not exist is 0 and leaves no
    file behind; a path-less cache holds nothing."""
    path = tmp_path / "n.sqlite"
    store = SqliteCache(path)
    assert len(store) == 0 and not path.exists()
    store.put("a", "1")
    store.put("a", "2")
    SqliteCache(path).put("b", "3")                             # another writer
    assert len(store) == 2 and len(SqliteCache(path)) == 2
    assert len(SqliteCache(None)) == 0


def test_without_a_path_it_stores_nothing(tmp_path):
    store = SqliteCache(None)
    store.put("a", "1")
    assert store.get("a") is None
    assert list(tmp_path.iterdir()) == []


def test_it_imports_nothing_of_fovea_core():
    tree = ast.parse(Path(cache_module.__file__).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [n for n in names if n.startswith("fovea_core")]


def test_an_unusable_path_warns_once_and_stores_nothing(tmp_path):
    """A cache under a path that cannot be a folder (a read-only install's cache is the same
    case for a user without root) never stops the work: one warning, then no cache."""
    import warnings

    from fovea_core.cache import CacheWarning, SqliteCache

    (tmp_path / "file").write_text("not a folder")
    cache = SqliteCache(tmp_path / "file" / "sub" / "c.sqlite")
    with pytest.warns(CacheWarning, match="cannot be used"):
        cache.put("k", "v")
    with warnings.catch_warnings():
        warnings.simplefilter("error")                  # no second warning
        assert cache.get("k") is None
        cache.put("k", "v")
    assert cache.path is None
