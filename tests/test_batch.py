"""`python -m fovea_core.book batch`: a parameter grid with papermill, glued scalars collected."""

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fovea_core.book.batch import glue_scalar, grid, parse_value, run_name

FIXTURES = Path(__file__).parent / "fixtures"


def test_values_parse_as_literals_else_text():
    assert parse_value("64") == 64 and parse_value("0.5") == 0.5 and parse_value("True") is True
    assert parse_value("[64, 144]") == [64, 144]
    assert parse_value("dask") == "dask" and parse_value("a b") == "a b"


def test_grid_is_the_cartesian_product_in_order():
    points = grid([["a", "1", "2"], ["b", "x", "y", "z"]])
    assert len(points) == 6
    assert points[0] == {"a": 1, "b": "x"} and points[-1] == {"a": 2, "b": "z"}
    assert run_name({"budgets": [64], "backend": "inprocess"}) == "budgets=64,backend=inprocess"
    with pytest.raises(ValueError):
        grid([["a", "1"], ["a", "2"]])


def test_glue_outputs_are_read_as_scalars():
    def out(plain, prefix="application/papermill.record/", extra=None):
        return {"output_type": "display_data", "metadata": {"scrapbook": {
            "name": "k", "mime_prefix": prefix}}, "data": {prefix + "text/plain": plain,
                                                            **(extra or {})}}
    assert glue_scalar(out("0.25")) == ("k", 0.25)
    assert glue_scalar(out("np.float64(0.25)")) == ("k", 0.25)
    assert glue_scalar(out("np.True_")) == ("k", True)
    assert glue_scalar(out("'better'", prefix="")) == ("k", "better")
    assert glue_scalar(out("nan"))[1] != glue_scalar(out("nan"))[1]       # NaN survives
    assert glue_scalar(out("array([0, 1])")) is None
    assert glue_scalar(out("<Figure>", extra={"application/papermill.record/image/png": "x"})) is None
    assert glue_scalar({"output_type": "stream", "text": "hi"}) is None


def test_batch_runs_the_grid_collects_the_table_and_resumes(tmp_path):
    nb = tmp_path / "notebooks" / "batch.ipynb"
    nb.parent.mkdir()
    shutil.copy(FIXTURES / "batch.ipynb", nb)
    env = {**os.environ, "FOVEA_DATA": str(tmp_path / "datasets")}
    cmd = [sys.executable, "-m", "fovea_core.book", "batch", "--root", str(tmp_path), str(nb),
           "--profile", "smoke", "--jobs", "2", "-p", "a", "1", "2", "-p", "label", "q"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env,
                           cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    folder = tmp_path / "_build" / "runs" / "batch"
    assert sorted(p.name for p in folder.glob("*.ipynb")) == ["a=1,label=q.ipynb",
                                                             "a=2,label=q.ipynb"]
    rows = list(csv.DictReader((folder / "glued.csv").read_text().splitlines()))
    assert [r["run"] for r in rows] == ["a=1,label=q", "a=2,label=q"]
    assert [r["status"] for r in rows] == ["ran", "ran"]
    assert [r["product"] for r in rows] == ["10", "20"]                  # a * b, b = 10
    assert [float(r["ratio"]) for r in rows] == [0.1, 0.2]
    assert [r["flag"] for r in rows] == ["False", "True"]
    assert [r["verdict"] for r in rows] == ["smaller", "**larger**"]
    assert [r["shown"] for r in rows] == ["q-1", "q-2"]
    assert "table" not in rows[0]                                       # not a scalar
    assert "product" in first.stdout and "20" in first.stdout          # the table is printed
    executed = json.loads((folder / "a=2,label=q.ipynb").read_text())
    injected = [c for c in executed["cells"] if "injected-parameters" in c["metadata"]["tags"]]
    assert "a = 2" in "".join(injected[0]["source"])
    # resumable: a second call runs nothing that is done, only the new values; a value that
    # makes the notebook raise (np.float64('x')) fails that run alone, and the exit status
    mtime = (folder / "a=1,label=q.ipynb").stat().st_mtime_ns
    base = cmd[:cmd.index("-p")]
    second = subprocess.run(base + ["-p", "a", "1", "2", "3", "'x'", "-p", "label", "q"],
                            capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert second.returncode == 1, second.stdout + second.stderr
    rows = list(csv.DictReader((folder / "glued.csv").read_text().splitlines()))
    assert [r["status"] for r in rows] == ["cached", "cached", "ran", "failed"]
    assert [r["product"] for r in rows] == ["10", "20", "30", ""]
    assert (folder / "a=1,label=q.ipynb").stat().st_mtime_ns == mtime
    assert "a=x,label=q.ipynb: cell 2" in second.stdout and "ValueError" in second.stdout
