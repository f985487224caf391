"""Papermill batch runs: a notebook over a Cartesian grid of parameters, and its glued scalars.

``python -m fovea_core.book batch NOTEBOOK -p NAME v1 v2 ... [-p NAME2 ...]`` executes one
copy of ``NOTEBOOK`` per combination of the values into
``_build/runs/<notebook>/<name>=<v>,<name2>=<w>.ipynb`` (several processes at once where
the machine has the cores), then collects every glued scalar (numbers, booleans and text
glued with ``myst_nb.glue``; figures and tables are skipped) of every run into one table,
``_build/runs/<notebook>/glued.csv`` (one row per run: its parameters, status, seconds,
then one column per glue key), and prints it. Values are read as Python literals when
they parse (``64``, ``0.5``, ``True``, ``[64, 144]``), else as text.

Resumable: a run whose executed copy exists and whose inputs (notebook, ``fovea_core``,
data manifest, environment, parameters; see :mod:`fovea_core.book.cache`) are unchanged
is not executed again, so an interrupted batch continues where it stopped.
"""

from __future__ import annotations

import ast
import csv
import itertools
import json
import os
import re
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from fovea_core.book.cache import CacheRecords, Inputs, notebook_key
from fovea_core.book.runner import run_notebook

GLUE_PREFIX = "application/papermill.record/"
_NUMPY_SCALAR = re.compile(r"^np\.(?:float|int|uint|bool_?|complex)\w*\((.*)\)$|^np\.(True|False)_$")


def parse_value(text: str) -> object:
    """A command-line value: a Python literal when it parses, else the text itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def slug(value: object) -> str:
    """File-name-safe form of one parameter value (``[64]`` -> ``64``, ``0.5`` -> ``0.5``)."""
    text = value if isinstance(value, str) else json.dumps(value)
    text = re.sub(r"[\[\]{}()'\" ]", "", text)
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", text).strip("_") or "empty"


def grid(params: list[list[str]]) -> list[dict[str, object]]:
    """Cartesian product of ``[[name, v1, v2, ...], ...]``, in the order given."""
    names = [p[0] for p in params]
    if len(set(names)) != len(names):
        raise ValueError(f"a parameter is given twice: {names}")
    values = [[parse_value(v) for v in p[1:]] for p in params]
    return [dict(zip(names, combo)) for combo in itertools.product(*values)]


def run_name(params: dict[str, object]) -> str:
    """``budgets=64,seed=0``: the executed copy's file stem for one grid point."""
    return ",".join(f"{k}={slug(v)}" for k, v in params.items()) or "defaults"


def glue_scalar(output: dict) -> tuple[str, object] | None:
    """``(key, value)`` of a glue output holding a scalar; ``None`` for anything else."""
    meta = output.get("metadata", {}).get("scrapbook")
    if not meta:
        return None
    prefix = meta.get("mime_prefix", "")
    data = {k.removeprefix(prefix) if prefix else k: v for k, v in output.get("data", {}).items()}
    if any(k.startswith("image/") or k == "text/html" for k in data):
        return None                          # figures, tables
    if "text/markdown" in data:
        md = data["text/markdown"]
        return meta["name"], "".join(md) if isinstance(md, list) else md
    text = data.get("text/plain")
    if text is None:
        return None
    text = "".join(text) if isinstance(text, list) else text
    m = _NUMPY_SCALAR.match(text.strip())
    if m:
        text = m.group(1) if m.group(1) is not None else m.group(2)
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        try:
            value = float(text) if text.strip().lower() in ("nan", "inf", "-inf") else None
        except ValueError:
            value = None
        if value is None:
            return None
    if isinstance(value, (bool, int, float, str)):
        return meta["name"], value
    return None


def glued_scalars(path: Path) -> dict[str, object]:
    """Every glued scalar of an executed notebook, in the order they were glued."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    found: dict[str, object] = {}
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            kv = glue_scalar(output)
            if kv:
                found[kv[0]] = kv[1]
    return found


@dataclass
class BatchRun:
    name: str
    params: dict[str, object]
    status: str                # "ran", "cached", "failed"
    seconds: float
    error: str = ""


def _threads_per_job(jobs: int) -> int:
    return max(1, (os.cpu_count() or 1) // max(1, jobs))


def _worker_init(threads: int) -> None:
    """Each worker's kernels use their share of the cores (inherited through the environment)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)


def run_batch(root: Path, notebook: Path, params: list[list[str]], *, profile: str = "default",
              jobs: int | None = None, out: Path | None = None, force: bool = False,
              timeout: int = 3600, echo=print) -> tuple[list[BatchRun], Path]:
    """Execute the grid; return the runs and the path of ``glued.csv`` (see module doc)."""
    src = (notebook if notebook.is_absolute() else Path.cwd() / notebook).resolve()
    if not src.exists():
        raise FileNotFoundError(src)
    points = grid(params)
    names = [run_name(p) for p in points]
    if len(set(names)) != len(names):        # two values with the same slug: disambiguate
        names = [f"{n}-{i}" for i, n in enumerate(names)]
    folder = (out or root / "_build" / "runs") / src.stem
    folder.mkdir(parents=True, exist_ok=True)
    records = CacheRecords.load(folder / ".cache.json")
    shared = Inputs.of(root)
    jobs = max(1, min(jobs or (os.cpu_count() or 1), len(points)))
    runs: dict[str, BatchRun] = {}
    todo = []
    for name, p in zip(names, points):
        inputs = notebook_key(src, profile, p, shared)
        if not force and records.fresh(name, inputs, folder / f"{name}.ipynb"):
            runs[name] = BatchRun(name, p, "cached", records.records[name]["seconds"])
        else:
            todo.append((name, p, inputs))
    echo(f"{src.name}: {len(points)} runs (profile={profile}), {len(runs)} already done, "
         f"{len(todo)} to run with {jobs} process(es) x {_threads_per_job(jobs)} thread(s) "
         f"into {os.path.relpath(folder)}")
    start = time.perf_counter()
    if todo:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"),
                                 initializer=_worker_init,
                                 initargs=(_threads_per_job(jobs),)) as pool:
            futures = {pool.submit(run_notebook, src, folder / f"{name}.ipynb", profile, p,
                                   timeout, f"{name}.ipynb"): (name, p, inputs)
                       for name, p, inputs in todo}
            for fut in as_completed(futures):
                name, p, inputs = futures[fut]
                ok, seconds, error = fut.result()
                if ok:
                    records.record(name, inputs, folder / f"{name}.ipynb", seconds)
                else:
                    records.forget(name)
                records.save()
                runs[name] = BatchRun(name, p, "ran" if ok else "failed", seconds, error)
                echo(f"  {name:<40} {runs[name].status:<6} {seconds:7.1f} s   "
                     f"total {time.perf_counter() - start:7.1f} s")
                if error:
                    echo(f"    {error}")
    ordered = [runs[n] for n in names]
    table = folder / "glued.csv"
    write_table(folder, ordered, table)
    return ordered, table


def write_table(folder: Path, runs: list[BatchRun], table: Path) -> list[dict[str, object]]:
    """One row per run: parameters, status, seconds, then every glued scalar."""
    rows = []
    for r in runs:
        glued = glued_scalars(folder / f"{r.name}.ipynb") if r.status != "failed" else {}
        rows.append({"run": r.name, **{k: _cell(v) for k, v in r.params.items()},
                     "status": r.status, "seconds": round(r.seconds, 1), **glued})
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    with open(table, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return rows


def _cell(value: object) -> object:
    return json.dumps(value) if isinstance(value, (list, dict, tuple)) else value


def format_table(table: Path, max_width: int = 30) -> str:
    """``glued.csv`` transposed for the terminal: one row per glue key, one column per run.

    Columns are named by the parameters that vary; numbers are shown to 4 significant
    digits (the CSV keeps them all); long text is cut at ``max_width`` characters.
    """
    import pandas as pd

    df = pd.read_csv(table, dtype=str, keep_default_na=False)
    params = [c for c in df.columns[1:df.columns.get_loc("status")]]
    varying = [c for c in params if df[c].nunique() > 1] or params[:1]
    df.index = [",".join(f"{c}={slug(parse_value(row[c]))}" for c in varying) or row["run"]
                for _, row in df.iterrows()]

    def show(text: str) -> str:
        try:
            x = float(text)
            text = text if x.is_integer() and "." not in text else f"{x:.4g}"
        except ValueError:
            pass
        return text if len(text) <= max_width else text[:max_width - 3] + "..."

    view = df.drop(columns=["run"]).T.map(show)
    with pd.option_context("display.max_rows", None, "display.max_columns", None,
                           "display.width", 250, "display.max_colwidth", max_width):
        return view.to_string()
