"""Papermill batch runs: a notebook over a Cartesian grid of parameters, and its glued scalars.

``python -m fovea_book.build batch NOTEBOOK -p NAME v1 v2 ... [-p NAME2 ...]`` executes one
copy of ``NOTEBOOK`` per combination of the values into
``_build/runs/<notebook>/<name>=<v>,<name2>=<w>.ipynb`` (several processes at once where
the machine has the cores), then collects every glued scalar (numbers, booleans and text
glued with ``myst_nb.glue``; figures and tables are skipped) of every run into one table,
``_build/runs/<notebook>/glued.csv`` (one row per run: its parameters, status, seconds,
then one column per glue key), and prints it.

Checked before anything runs (:func:`check_grid`; a :class:`~fovea_book.build.runner.UsageError`
otherwise, which the command prints and exits 2 on):

* every ``NAME`` is assigned in the notebook's cell tagged ``parameters`` (read with
  :mod:`ast`, no kernel; :func:`notebook_parameters`), and is not ``profile`` (that is
  ``--profile``): a typo would otherwise run the defaults for minutes and label them with it;
* every value is a Python literal (``64``, ``0.5``, ``True``, ``[64, 144]``, ``'"text"'``),
  or, only where the parameter's default is a string, plain text (``-p backend dask``);
  anything else is refused with the parser's reason (:func:`parse_parameter`);
* every run's file stays inside ``<out>/<notebook>/``: names are identifiers, values are
  reduced to ``[A-Za-z0-9._+-]`` (:func:`slug`), and the resolved path is checked;
* the notebook is a notebook (:func:`read_notebook`: a corrupt file, or JSON that is a list,
  is refused naming the file and the reason), ``--root`` is the project root holding
  ``fovea_core/`` (:func:`check_root`: else the cache key would not follow the code) and
  ``--timeout`` is at least one second (a negative one would mean no timeout at all).

Resumable: a run whose executed copy exists and whose inputs (notebook, ``fovea_core``,
data manifest, environment, parameters; see :mod:`fovea_book.build.cache`) are unchanged
is not executed again, so an interrupted batch continues where it stopped.
"""

from __future__ import annotations

import ast
import csv
import hashlib
import itertools
import json
import os
import re
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from fovea_book.build.cache import CacheRecords, Inputs, notebook_key
from fovea_book.build.runner import UsageError, run_notebook

#: Tag of the cell whose assignments are a notebook's parameters (papermill's convention).
PARAMETERS_TAG = "parameters"
#: Set by ``--profile``, never by ``-p``.
PROFILE_PARAMETER = "profile"

GLUE_PREFIX = "application/papermill.record/"
_NUMPY_SCALAR = re.compile(r"^np\.(?:float|int|uint|bool_?|complex)\w*\((.*)\)$|^np\.(True|False)_$")


def parse_value(text: str) -> object:
    """A value as text: a Python literal when it parses, else the text itself (used to
    read back the table's columns; command-line values go through :func:`parse_parameter`)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


@dataclass(frozen=True)
class Parameter:
    """One assignment of a notebook's ``parameters`` cell."""

    name: str
    source: str                # the default as written (``None``, ``"processes"``, ...)
    default: object = None     # its value, when ``literal``
    literal: bool = False      # whether the default is a Python literal

    @property
    def text_default(self) -> bool:
        """Whether the default is a string (so that plain text is a valid value)."""
        return self.literal and isinstance(self.default, str)


def read_notebook(path: Path) -> dict:
    """The notebook at ``path`` as a dict with a list of cells, or :class:`UsageError`
    naming the file and the reason: unreadable, not UTF-8, not JSON (with the line and
    column), JSON that is not an object (e.g. a list), or no ``cells`` list."""
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the notebook ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not a notebook: not UTF-8 text ({exc.reason} at byte "
                         f"{exc.start})") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not a notebook: not valid JSON ({exc.msg} at line "
                         f"{exc.lineno}, column {exc.colno})") from None
    if not isinstance(nb, dict):
        raise UsageError(f"{path}: not a notebook: its JSON is a {type(nb).__name__}, not an "
                         "object with a 'cells' list")
    if not isinstance(nb.get("cells", []), list):
        raise UsageError(f"{path}: not a notebook: 'cells' is a "
                         f"{type(nb['cells']).__name__}, not a list")
    return nb


def notebook_parameters(path: Path) -> dict[str, Parameter]:
    """The names assigned in the cells of ``path`` tagged ``parameters``, in order, with
    their defaults (read with :mod:`ast`; no kernel starts). A notebook without such a cell
    has none; one that is not a notebook (:func:`read_notebook`) or whose cell does not
    parse raises :class:`UsageError` naming the file and the reason."""
    nb = read_notebook(path)
    found: dict[str, Parameter] = {}
    for i, cell in enumerate(nb.get("cells", [])):
        if not isinstance(cell, dict):
            raise UsageError(f"{path}: not a notebook: cell {i} is of type "
                             f"{type(cell).__name__}, not an object")
        meta = cell.get("metadata", {})
        tags = meta.get("tags", []) if isinstance(meta, dict) else []
        if cell.get("cell_type") != "code" or not isinstance(tags, list) \
                or PARAMETERS_TAG not in tags:
            continue
        source = cell.get("source", "")
        if isinstance(source, list) and all(isinstance(line, str) for line in source):
            source = "".join(source)
        if not isinstance(source, str):
            raise UsageError(f"{path}: not a notebook: the source of cell {i} is not text")
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            raise UsageError(f"{path.name}: its parameters cell does not parse ({exc.msg}, "
                             f"line {exc.lineno})") from None
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) and node.value else []
            for target in targets:
                names = [target] if isinstance(target, ast.Name) else \
                    list(target.elts) if isinstance(target, ast.Tuple) else []
                for name in (n for n in names if isinstance(n, ast.Name)):
                    found[name.id] = _parameter(name.id, node.value, len(names) == 1)
    return found


def _parameter(name: str, value: ast.expr, single: bool) -> Parameter:
    source = ast.unparse(value)
    if single:
        try:
            return Parameter(name, source, ast.literal_eval(value), True)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
    return Parameter(name, source)


def parse_parameter(param: Parameter, text: str) -> object:
    """A command-line value of ``param``: the Python literal ``text`` spells; else, where the
    default is a string, ``text`` itself; else :class:`UsageError` with the reason."""
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        if param.text_default:
            return text
        raise UsageError(
            f"-p {param.name} {text!r}: not a Python literal ({_why_not_literal(text)}); "
            f"the default of "
            f"{param.name} is {param.source}, not a string, so text is not taken as it is: "
            f"quote it to pass a string (-p {param.name} '\"{text}\"')") from None


def _why_not_literal(text: str) -> str:
    """Why :func:`ast.literal_eval` refuses ``text``, in words."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        return exc.msg if exc.msg.startswith("invalid syntax") else f"invalid syntax: {exc.msg}"
    except (ValueError, MemoryError, RecursionError) as exc:
        return type(exc).__name__
    if isinstance(node, ast.Name):
        return "it reads as a variable name"
    return f"it is a {type(node).__name__} expression, not a constant"


def check_grid(notebook: Path, params: list[list[str]]) -> list[dict[str, object]]:
    """:func:`grid` of ``params`` with every name checked against ``notebook``'s
    ``parameters`` cell and every value parsed by :func:`parse_parameter`; raises
    :class:`UsageError` (naming the notebook's parameters) before anything runs."""
    known = notebook_parameters(notebook)
    bad = [p for p in params if len(p) < 2]
    if bad:
        raise UsageError(f"-p needs a name and at least one value: {bad}")
    names = [p[0] for p in params]
    valid = ", ".join(n for n in known if n != PROFILE_PARAMETER) or "(none)"
    if PROFILE_PARAMETER in names:
        raise UsageError(f"-p {PROFILE_PARAMETER}: the profile is set with --profile")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"{notebook.name} has no parameter {', '.join(map(repr, unknown))}; "
                         f"its parameters cell defines: {valid}")
    return grid(params, known)


def slug(value: object) -> str:
    """File-name-safe form of one parameter value (``[64]`` -> ``64``, ``0.5`` -> ``0.5``,
    ``"../x"`` -> ``x``): only ``[A-Za-z0-9._+-]``, never a path separator, never only dots."""
    text = value if isinstance(value, str) else json.dumps(value)
    text = re.sub(r"[\[\]{}()'\" ]", "", text)
    text = re.sub(r"(?:\.{2,}|[^A-Za-z0-9._+-])+", "_", text).strip("_")   # no "/", no ".."
    return text or "empty"


def grid(params: list[list[str]], known: dict[str, Parameter] | None = None
         ) -> list[dict[str, object]]:
    """Cartesian product of ``[[name, v1, v2, ...], ...]``, in the order given. With
    ``known`` (:func:`notebook_parameters`), values are parsed by :func:`parse_parameter`,
    else as literals or text (:func:`parse_value`)."""
    names = [p[0] for p in params]
    if len(set(names)) != len(names):
        raise UsageError(f"a parameter is given twice: {names}")
    values = [[parse_parameter(known[p[0]], v) if known is not None else parse_value(v)
               for v in p[1:]] for p in params]
    return [dict(zip(names, combo)) for combo in itertools.product(*values)]


def check_root(root: Path) -> None:
    """``root`` must be the project's root: an existing folder holding the ``fovea_core``
    sources, which the cache key hashes (:func:`~fovea_book.build.cache.sources_fingerprint`).
    Elsewhere the key would not follow the code and a changed method would read as done,
    so :class:`UsageError` instead."""
    if not root.is_dir():
        raise UsageError(f"--root {root}: no such folder (the project root, holding _toc.yml "
                         "and fovea_core/)")
    if not (root / "fovea_core").is_dir():
        raise UsageError(f"--root {root} holds no fovea_core/ folder, so the runs' cache key "
                         "would not follow the code; pass the project root (the folder with "
                         "_toc.yml and fovea_core/)")


#: the longest run name (characters) kept as it is; file systems allow 255 bytes per name
#: (with ``.ipynb``), and a longer one ends in a hash of the whole
MAX_RUN_NAME = 120


def run_name(params: dict[str, object]) -> str:
    """``budgets=64,seed=0``: the executed copy's file stem for one grid point. A name
    longer than :data:`MAX_RUN_NAME` (a long ``-p`` value) is cut there and ends in ``~``
    and 12 hex digits of a SHA-1 of the full name, so it fits any file system and two
    points still differ (``glued.csv`` holds the values in full)."""
    name = ",".join(f"{slug(k)}={slug(v)}" for k, v in params.items()) or "defaults"
    if len(name) <= MAX_RUN_NAME:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:12]
    return f"{name[:MAX_RUN_NAME - 13]}~{digest}"


def run_path(folder: Path, name: str) -> Path:
    """``folder/<name>.ipynb``, refused (:class:`UsageError`) unless it lies directly in
    ``folder``: whatever a name or value holds, a run writes nowhere else."""
    path = folder / f"{name}.ipynb"
    if "/" in name or os.sep in name or path.resolve().parent != folder.resolve():
        raise UsageError(f"run {name!r} would be written outside {folder}")
    return path


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
    """Execute the grid; return the runs and the path of ``glued.csv`` (see module doc).
    Raises :class:`~fovea_book.build.runner.UsageError` before anything runs when ``root``
    is not a project root (:func:`check_root`), ``timeout`` is not a whole number of
    seconds >= 1, or the notebook, a parameter name or a value is not valid
    (:func:`check_grid`)."""
    check_root(root)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
        raise UsageError(f"--timeout must be a whole number of seconds >= 1 (per cell), got "
                         f"{timeout!r}")
    src = (notebook if notebook.is_absolute() else Path.cwd() / notebook).resolve()
    if not src.is_file() or src.suffix != ".ipynb":
        raise UsageError(f"{notebook}: no such notebook (.ipynb file)")
    points = check_grid(src, params)         # names, values and paths: before anything runs
    names = [run_name(p) for p in points]
    if len(set(names)) != len(names):        # two values with the same slug: disambiguate
        names = [f"{n}-{i}" for i, n in enumerate(names)]
    base = out or root / "_build" / "runs"
    if out is not None and out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a folder; pass a folder (created if "
                         "missing; default _build/runs)")
    folder = base / src.stem
    for name in names:
        run_path(folder, name)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {base}: cannot create {folder} "
                         f"({exc.strerror or type(exc).__name__})") from None
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
