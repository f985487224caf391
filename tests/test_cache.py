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


# ----------------------------------------------------------------------------- damaged files
def _sqlite_file(path: Path, n: int = 300) -> Path:
    """A real cache file of ``n`` entries (one transaction), checkpointed into ``path``."""
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE ocr (key TEXT PRIMARY KEY, text TEXT)")
    conn.executemany("INSERT INTO ocr VALUES (?, ?)", [(f"k{i}", "x" * 200) for i in range(n)])
    conn.commit()
    conn.close()
    return path


@pytest.mark.parametrize("damage", ["random bytes", "truncated"])
def test_a_file_that_is_not_a_database_is_set_aside_once_and_replaced(tmp_path, damage):
    """Random bytes or a truncated file where the cache file should be: the first use
    warns once (naming the file and where it went), moves it aside, and the cache works on
    a fresh file; nothing is lost (the damaged file is kept beside it)."""
    path = tmp_path / "c.sqlite"
    if damage == "random bytes":
        path.write_bytes(bytes(range(256)) * 20)
    else:
        data = _sqlite_file(path).read_bytes()
        path.write_bytes(data[:len(data) // 3])
    store = SqliteCache(path)
    with pytest.warns(cache_module.CacheWarning, match=r"not a valid SQLite database .*moved "
                                                       r"it to c\.sqlite\.corrupt-") as said:
        assert store.get("k1") is None
        store.put("k1", "fresh")
        assert store.get("k1") == "fresh" and len(store) == 1
    assert len(said) == 1
    aside = [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    assert len(aside) == 1 and aside[0].stat().st_size > 0
    assert SqliteCache(path).get("k1") == "fresh"          # the fresh file is a database


def test_drop_removes_one_entry(tmp_path):
    store = SqliteCache(tmp_path / "d.sqlite")
    store.put("a", "1")
    store.put("b", "2")
    store.drop("a")
    store.drop("missing")
    assert (store.get("a"), store.get("b")) == (None, "2")
    SqliteCache(None).drop("a")                             # a path-less cache: nothing


def test_a_garbage_ocr_value_is_dropped_and_recomputed_with_one_warning(tmp_path, monkeypatch):
    """A cached OCR read that does not parse (not JSON, or JSON of the wrong shape) is
    dropped, the page is read again and the good read stored; one warning per process."""
    import numpy as np

    from fovea_core.importance import query as Q
    from fovea_core.importance.text import TextRead

    store = SqliteCache(tmp_path / "ocr.sqlite")
    monkeypatch.setattr(Q, "_disk_cache", lambda: store)
    monkeypatch.setattr(Q, "_BAD_ENTRY_SAID", False)
    calls = []

    def fake_read(img, min_conf=0.5):
        calls.append(1)
        return TextRead(np.array([[1, 2, 3, 4]], np.float32), ("TOTAL",),
                        np.array([0.9], np.float32))
    monkeypatch.setattr(Q, "read_text", fake_read)
    img = np.zeros((8, 8, 3), np.uint8)
    keys = [("a", img.shape, 0.5), ("b", img.shape, 0.5)]
    import hashlib
    for key, junk in zip(keys, ["not json {", '{"boxes": [[1, 2, 3, 4]], "texts": 5}']):
        store.put(hashlib.sha1(repr(key).encode()).hexdigest(), junk)
    with pytest.warns(cache_module.CacheWarning, match="cannot be parsed") as said:
        reads = [Q._read_text_cached(img, k) for k in keys]
    assert len(said) == 1 and len(calls) == 2
    assert all(r.texts == ("TOTAL",) for r in reads)
    again = [Q._read_text_cached(img, k) for k in keys]     # now from the repaired cache
    assert len(calls) == 2 and all(r.texts == ("TOTAL",) for r in again)


@pytest.mark.parametrize("value, enabled", [
    (None, True), ("", True), ("0", True), ("false", True), ("No", True), (" off ", True),
    ("1", False), ("true", False), ("YES", False), ("on", False)])
def test_no_disk_cache_flag_is_read_strictly(monkeypatch, value, enabled):
    """``FOVEA_NO_DISK_CACHE=false`` keeps the caches (it turned them off before)."""
    from fovea_core.paths import disk_cache_enabled

    if value is None:
        monkeypatch.delenv("FOVEA_NO_DISK_CACHE", raising=False)
    else:
        monkeypatch.setenv("FOVEA_NO_DISK_CACHE", value)
    assert disk_cache_enabled() is enabled


def test_an_unknown_no_disk_cache_value_is_refused_naming_the_variable(monkeypatch):
    from fovea_core.paths import disk_cache_enabled

    monkeypatch.setenv("FOVEA_NO_DISK_CACHE", "maybe")
    with pytest.raises(ValueError, match=r"FOVEA_NO_DISK_CACHE must be one of 1, true, yes, on "
                                         r".* or '', '0', 'false', 'no', 'off' .*got 'maybe'"):
        disk_cache_enabled()


def test_two_users_of_one_damaged_file_set_it_aside_once(tmp_path):
    """Two users of one damaged file (two worker processes): the first sets it aside and
    starts a fresh file; the second then reads the fresh file, moves nothing more, and
    sees what the first wrote."""
    path = tmp_path / "c.sqlite"
    path.write_bytes(bytes(range(256)) * 20)
    first, second = SqliteCache(path), SqliteCache(path)
    with pytest.warns(cache_module.CacheWarning, match="moved it to"):
        first.put("k", "v")
    assert second.get("k") == "v"
    assert len([p for p in tmp_path.iterdir() if ".corrupt-" in p.name]) == 1
