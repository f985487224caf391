"""``python -m fovea_book.build clean-stale`` / ``make clean-stale``: the sweep's row caches of
other code versions go, the current one and everything else stay (issue 21 item 4: nothing
evicted old rows)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from fovea_book.build.cli import main
from fovea_book.eval.evaluator import cell_cache_path, stale_caches

ROOT = Path(__file__).resolve().parents[1]


def _tree(tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    cache = tmp_path / "cache"
    (cache / "sub").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    current = cell_cache_path(cache)
    files = {
        "stale": cache / "rows-0123456789ab.sqlite",
        "stale_wal": cache / "rows-0123456789ab.sqlite-wal",
        "unversioned": cache / "rows.sqlite",
        "old_cells": cache / "cells-abc.sqlite",
        "current": current,
        "current_wal": current.with_name(current.name + "-wal"),
        "other": cache / "other.sqlite",
        "nested": cache / "sub" / "rows-0123456789ab.sqlite",
        "outside": tmp_path / "outside" / "rows-0123456789ab.sqlite",
    }
    for i, f in enumerate(files.values()):
        f.write_bytes(b"x" * (10 + i))
    return cache, files


def test_clean_stale_removes_other_fingerprints_only(tmp_path, capsys):
    cache, files = _tree(tmp_path)
    stale = ["stale", "stale_wal", "unversioned", "old_cells"]
    assert sorted(stale_caches(cache)) == sorted(files[k] for k in stale)
    assert main(["clean-stale", "--cache-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    for k, f in files.items():
        assert f.exists() == (k not in stale), k
    freed = sum(10 + i for i, k in enumerate(files) if k in stale)
    for k in stale:
        assert f"removed {files[k]} ({10 + list(files).index(k)} bytes)" in out
    assert re.search(rf"removed 4 files, {freed:,} bytes .* kept {files['current'].name}", out)
    # a second run finds nothing
    assert main(["clean-stale", "--cache-dir", str(cache)]) == 0
    assert "removed 0 files, 0 bytes" in capsys.readouterr().out


def test_dry_run_deletes_nothing_and_a_missing_folder_is_an_error(tmp_path, capsys):
    cache, files = _tree(tmp_path)
    assert main(["clean-stale", "--cache-dir", str(cache), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert all(f.exists() for f in files.values())
    assert "would remove 4 files" in out and f"would remove {files['stale']}" in out
    with pytest.raises(SystemExit) as err:
        main(["clean-stale", "--cache-dir", str(tmp_path / "missing")])
    assert err.value.code == 2
    assert "--cache-dir" in capsys.readouterr().err


def test_make_clean_stale_is_listed_and_calls_the_command():
    make = (ROOT / "Makefile").read_text()
    help_text = make[make.index("help:"):make.index("\n\n", make.index("help:"))]
    assert "make clean-stale" in help_text
    assert re.search(r"^clean-stale:.*\n\t\$\(PY\) -m fovea_book\.build clean-stale", make, re.M)
    assert "make clean-stale" in (ROOT / "README.md").read_text()
    run = subprocess.run([sys.executable, "-m", "fovea_book.build", "clean-stale", "--help"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0 and "--dry-run" in run.stdout
