"""`python -m fovea_book.build batch`: a parameter grid with papermill, glued scalars collected."""

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fovea_book.build import batch
from fovea_book.build.batch import (check_grid, glue_scalar, grid, notebook_parameters,
                                   parse_parameter, parse_value, run_name, run_path, slug)
from fovea_book.build.cli import main
from fovea_book.build.runner import UsageError

FIXTURES = Path(__file__).parent / "fixtures"
BATCH = FIXTURES / "batch.ipynb"


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


def _project(root: Path) -> Path:
    """``root`` made a project root for the batch: a ``fovea_core/`` folder with one source
    file (what the runs' cache key follows)."""
    (root / "fovea_core").mkdir(parents=True, exist_ok=True)
    (root / "fovea_core" / "__init__.py").write_text('"""a stand-in of the sources"""\n')
    return root


def test_batch_runs_the_grid_collects_the_table_and_resumes(tmp_path):
    _project(tmp_path)
    nb = tmp_path / "notebooks" / "batch.ipynb"
    nb.parent.mkdir()
    shutil.copy(FIXTURES / "batch.ipynb", nb)
    env = {**os.environ, "FOVEA_DATA": str(tmp_path / "datasets")}
    cmd = [sys.executable, "-m", "fovea_book.build", "batch", "--root", str(tmp_path), str(nb),
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


# --- checked before anything runs ----------------------------------------------------------

def _write_notebook(path: Path, *sources: tuple[str, list[str]]) -> Path:
    cells = [{"cell_type": "code", "metadata": {"tags": tags}, "source": src, "outputs": [],
              "execution_count": None} for src, tags in sources]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))
    return path


def test_the_parameters_cell_is_read_without_a_kernel(tmp_path):
    params = notebook_parameters(BATCH)
    assert list(params) == ["profile", "a", "b", "label"]
    assert params["a"].default == 1 and params["label"].text_default
    assert not params["a"].text_default
    nb = _write_notebook(tmp_path / "nb.ipynb",
                         ("x = 1\n", []),                                 # not tagged
                         ("n: int = 3\nsizes = None  # per profile\nk, m = 1, 2\n"
                          "root = Path('.') / 'x'\nif True:\n    hidden = 1\n", ["parameters"]))
    params = notebook_parameters(nb)
    assert list(params) == ["n", "sizes", "k", "m", "root"]
    assert params["n"].default == 3 and params["sizes"].literal and params["sizes"].default is None
    assert not params["root"].literal and params["root"].source == "Path('.') / 'x'"
    assert notebook_parameters(_write_notebook(tmp_path / "none.ipynb", ("x = 1", []))) == {}
    with pytest.raises(UsageError, match="does not parse"):
        notebook_parameters(_write_notebook(tmp_path / "bad.ipynb", ("x = (", ["parameters"])))


def test_unknown_names_are_refused_with_the_valid_ones():
    with pytest.raises(UsageError, match=r"no parameter 'zzz'.*defines: a, b, label$"):
        check_grid(BATCH, [["zzz", "5"]])
    with pytest.raises(UsageError, match=r"no parameter '\.\./\.\./x'"):
        check_grid(BATCH, [["../../x", "1"]])
    with pytest.raises(UsageError, match="--profile"):
        check_grid(BATCH, [["profile", "full"]])
    with pytest.raises(UsageError, match="twice"):
        check_grid(BATCH, [["a", "1"], ["a", "2"]])
    with pytest.raises(UsageError, match="at least one value"):
        check_grid(BATCH, [["a"]])
    assert check_grid(BATCH, [["a", "1", "2"], ["b", "0.5"]]) == [{"a": 1, "b": 0.5},
                                                                 {"a": 2, "b": 0.5}]
    assert check_grid(BATCH, []) == [{}]


def test_values_are_literals_or_text_only_where_the_default_is_text():
    params = notebook_parameters(BATCH)
    assert parse_parameter(params["a"], "[64, 144]") == [64, 144]
    assert parse_parameter(params["a"], "'x'") == "x"                 # quoted: a string
    assert parse_parameter(params["label"], "dask") == "dask"         # default "x": text
    assert parse_parameter(params["label"], "a b") == "a b"
    assert parse_parameter(params["label"], "7") == 7
    with pytest.raises(UsageError, match=r"-p a 'foo': not a Python literal \(it reads as a "
                                         r"variable name\); the default of a is 1"):
        parse_parameter(params["a"], "foo")
    with pytest.raises(UsageError, match=r"'\[1,'.*was never closed"):
        parse_parameter(params["a"], "[1,")
    with pytest.raises(UsageError, match=r"Call expression"):
        parse_parameter(params["b"], "open('x')")


def test_run_files_stay_in_the_output_folder(tmp_path):
    assert slug("../../x") == "x" and slug("..") == "empty" and slug("a/b") == "a_b"
    assert slug("/etc/passwd") == "etc_passwd" and slug(0.5) == "0.5"
    assert run_name({"../x": "../../y"}) == "x=y"                     # even unchecked names
    assert run_path(tmp_path, "a=1,b=x") == tmp_path / "a=1,b=x.ipynb"
    for bad in ("../x", "a/../../x", "a=1/b", "/tmp/x"):
        with pytest.raises(UsageError, match="outside"):
            run_path(tmp_path, bad)


@pytest.mark.parametrize("args, message", [
    (["-p", "zzz", "5"], "no parameter 'zzz'; its parameters cell defines: a, b, label"),
    (["-p", "../../x", "1"], "no parameter '../../x'"),
    (["-p", "a", "foo"], "-p a 'foo': not a Python literal"),
    (["-p", "a", "1", "-p", "label", "q", "-p", "zzz", "1"], "no parameter 'zzz'"),
])
def test_the_command_refuses_before_running_anything(tmp_path, monkeypatch, capsys, args,
                                                     message):
    """The typo once ran the defaults for minutes, exited 0 and labelled them zzz=5; a name
    with '..' wrote outside _build/runs. Now: exit 2, the reason, nothing run or written."""
    monkeypatch.setattr(batch, "ProcessPoolExecutor", lambda *a, **k: pytest.fail("ran"))
    nb = _project(tmp_path / "project") / "batch.ipynb"
    shutil.copy(BATCH, nb)
    code = main(["batch", "--root", str(nb.parent), str(nb), "--profile", "smoke", *args])
    assert code == 2
    assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["__init__.py", "batch.ipynb",
                                                           "fovea_core", "project"]
    assert main(["batch", "--root", str(nb.parent), str(nb.parent / "typo.ipynb")]) == 2
    assert "no such notebook" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--timeout", "-5"], "argument --timeout: must be a whole number of seconds >= 1 (per cell), "
                          "got -5"),
    (["--timeout", "0"], "argument --timeout: must be a whole number of seconds >= 1 (per cell), "
                         "got 0"),
    (["--timeout", "1.5"], "argument --timeout: must be a whole number of seconds >= 1, got '1.5'"),
], ids=["negative", "zero", "fraction"])
def test_a_timeout_below_one_second_is_refused(tmp_path, monkeypatch, capsys, args, message):
    """``--timeout -5`` meant no timeout at all to the kernel client: refused, exit 2."""
    monkeypatch.setattr(batch, "ProcessPoolExecutor", lambda *a, **k: pytest.fail("ran"))
    nb = _project(tmp_path / "project") / "batch.ipynb"
    shutil.copy(BATCH, nb)
    with pytest.raises(SystemExit) as e:
        main(["batch", "--root", str(nb.parent), str(nb), "-p", "a", "1", *args])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not (nb.parent / "_build").exists()
    with pytest.raises(UsageError, match=r"--timeout must be a whole number of seconds >= 1"):
        batch.run_batch(nb.parent, nb, [["a", "1"]], timeout=-5)     # the API refuses it too


@pytest.mark.parametrize("root, message", [
    ("missing", "--root {root}: no such folder (the project root, holding _toc.yml and "
                "fovea_core/)"),
    ("elsewhere", "--root {root} holds no fovea_core/ folder, so the runs' cache key would not "
                  "follow the code; pass the project root"),
])
def test_a_root_the_cache_key_cannot_follow_is_refused(tmp_path, monkeypatch, capsys, root,
                                                      message):
    """A root without the sources (missing, or another folder) made every run's key blind to
    code changes: a changed method read as already done. Refused: exit 2, one line."""
    monkeypatch.setattr(batch, "ProcessPoolExecutor", lambda *a, **k: pytest.fail("ran"))
    nb = _project(tmp_path / "project") / "batch.ipynb"
    shutil.copy(BATCH, nb)
    bad = tmp_path / root
    if root == "elsewhere":
        bad.mkdir()
    code = main(["batch", "--root", str(bad), str(nb), "-p", "a", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert message.format(root=bad.resolve()) in err
    assert not (bad / "_build").exists() and not (nb.parent / "_build").exists()


@pytest.mark.parametrize("text, reason", [
    ('{"cells": [', r"not a notebook: not valid JSON \(Expecting value at line 1, column 12\)"),
    ('[{"cells": []}]', r"not a notebook: its JSON is a list, not an object with a 'cells' list"),
    ('{"cells": {"0": 1}}', r"not a notebook: 'cells' is a dict, not a list"),
    ('{"cells": [1]}', r"not a notebook: cell 0 is of type int, not an object"),
    (b"\xff\xfe{}", r"not a notebook: not UTF-8 text"),
], ids=["corrupt", "a list", "cells not a list", "cell not an object", "not UTF-8"])
def test_a_notebook_that_is_not_one_is_named_with_the_reason(tmp_path, monkeypatch, capsys,
                                                            text, reason):
    monkeypatch.setattr(batch, "ProcessPoolExecutor", lambda *a, **k: pytest.fail("ran"))
    root = _project(tmp_path / "project")
    nb = root / "broken.ipynb"
    nb.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(UsageError, match=rf"^{re.escape(str(nb))}: {reason}"):
        notebook_parameters(nb)
    code = main(["batch", "--root", str(root), str(nb), "-p", "a", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert re.search(rf"{re.escape(str(nb))}: {reason}", err), err


# --- an output folder that is a file, a value too long for a file name ----------------------

class _InlinePool:
    """A stand-in for the process pool: runs each job at once, in this process."""

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def submit(self, fn, *args):
        from concurrent.futures import Future

        fut = Future()
        fut.set_result(fn(*args))
        return fut


def _stub_run(src, path, profile, params, timeout, label):
    """A run that writes an empty executed notebook (to prove its file name can exist)."""
    path.write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return True, 0.0, None


def test_an_out_that_is_a_file_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(batch, "ProcessPoolExecutor", lambda *a, **k: pytest.fail("ran"))
    nb = _project(tmp_path / "project") / "batch.ipynb"
    shutil.copy(BATCH, nb)
    afile = tmp_path / "afile"
    afile.write_text("mine")
    for out, message in [(afile, f"--out {afile}: exists and is not a folder"),
                         (afile / "sub", f"--out {afile / 'sub'}: cannot create "
                                         f"{afile / 'sub' / 'batch'} (Not a directory)")]:
        code = main(["batch", "--root", str(nb.parent), str(nb), "-p", "a", "1",
                     "--out", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and message in err and "Traceback" not in err, err
    assert afile.read_text() == "mine"


def test_a_value_too_long_for_a_file_name_runs_under_a_shortened_name(tmp_path, monkeypatch,
                                                                      capsys):
    """A 300-character ``-p`` value: the run's file name is cut and ends in a hash (two long
    values that share their start still get two files); the table keeps the values."""
    monkeypatch.setattr(batch, "ProcessPoolExecutor", _InlinePool)
    monkeypatch.setattr(batch, "run_notebook", _stub_run)
    nb = _project(tmp_path / "project") / "batch.ipynb"
    shutil.copy(BATCH, nb)
    long_a, long_b = "x" * 300, "x" * 299 + "y"
    code = main(["batch", "--root", str(nb.parent), str(nb), "-p", "label", long_a, long_b,
                 "--out", str(tmp_path / "runs")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    files = sorted((tmp_path / "runs" / "batch").glob("*.ipynb"))
    assert len(files) == 2 and all(len(p.name) <= batch.MAX_RUN_NAME + 6 for p in files)
    assert all(re.fullmatch(r"label=x+~[0-9a-f]{12}\.ipynb", p.name) for p in files)
    rows = list(csv.DictReader((tmp_path / "runs" / "batch" / "glued.csv").read_text()
                               .splitlines()))
    assert sorted(r["label"] for r in rows) == sorted([long_a, long_b])
    assert run_name({"a": 1}) == "a=1"                                # short names unchanged
