"""Shared benchmark plumbing: hardware/version record, robust timing, JSON output, staleness.

**Where records go** (one rule for every benchmark, :class:`Run`): a benchmark writes
``_build/benchmarks/<name>.json`` (:func:`build_dir`) unless it is given ``--record``
(:func:`add_output_args`). Only then does it replace the committed record
``data/benchmarks/<name>.json`` (:func:`results_dir`), and even then it refuses, exiting
non-zero with a one-line reason (:class:`BenchError`) and leaving the committed file
byte-identical, when

* the machine was loaded: the 1-minute load average before or after the run was above the
  core count (a record taken on a shared, busy machine measures the neighbours), or
* the new record measured less than the one it replaces (:func:`shortfalls`): no GPU where
  the old one had one, timings missing (methods, sizes, rows, sections), fewer rounds or
  repeats, a smaller or different workload.

A refused record is still written to ``_build/benchmarks/`` (the measurement is not lost).
``python -m fovea_book.bench promote FILE`` puts a record measured elsewhere (e.g. on a
lent GPU machine) through the same gate (:func:`promote`).

Every record carries the git commit it was measured at, a SHA-1 fingerprint of the source
files it measured (``sources``), the command-line arguments (``args``) and the load
average before and after the run with the core count (``load``, ``loaded``);
:func:`staleness` compares the fingerprint with the sources as they are now, so a chapter
can mark a figure "from commit X (stale)" when the measured code has changed since.

Comparisons between paths are timed in interleaved rounds (:func:`time_rounds`) and
reported as the minimum and the median of the per-round ratios with a bootstrap CI, beside
the ratio of medians (:func:`ratio`, :func:`round_ratios`).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import platform
import re
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from fovea_book.paths import project_root

#: sources every benchmark measures besides its own list (the shared data types; the timing
#: plumbing of this module is not fingerprinted: changing it does not change what was measured)
COMMON_SOURCES = ("fovea_core/tokens.py", "fovea_core/pyramid.py")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, cwd=project_root(),
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _load_average() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def hardware_info() -> dict:
    """The machine, library versions and git commit a timing was taken with."""
    import numpy
    import torch

    info = {
        "timestamp_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "load_average_1_5_15": _load_average(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "torch": torch.__version__,
        "gpu": None,
    }
    try:
        import cv2
        info["opencv"] = cv2.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        props = torch.cuda.get_device_properties(0)
        info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        info["gpu_multiprocessors"] = props.multi_processor_count
        info["gpu_capability"] = f"{props.major}.{props.minor}"
        try:
            info["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            info["driver"] = None
        info["cuda"] = torch.version.cuda
    commit = os.environ.get("FOVEA_GIT_COMMIT")   # a copy of the tree (e.g. on a GPU machine):
    if commit:                                     # git there may answer for another checkout
        info["git_dirty"] = False
    elif (commit := _git("rev-parse", "HEAD")) is None:
        info["git_dirty"] = False
    else:
        info["git_dirty"] = bool(_git("status", "--porcelain", "--untracked-files=no"))
    info["git_commit"] = commit
    return info


# ----------------------------------------------------------------------------- fingerprints
def _expand(sources: Iterable[str]) -> list[str]:
    """Repository-relative files named by ``sources`` (files, or folders: their .py/.cu/.cuh)."""
    root = project_root()
    files: set[str] = set()
    for s in sources:
        p = root / s
        if p.is_dir():
            files.update(str(f.relative_to(root)) for f in p.rglob("*")
                         if f.suffix in (".py", ".cu", ".cuh") and "build" not in f.parts)
        else:
            files.add(s)
    return sorted(files)


def source_fingerprint(sources: Iterable[str]) -> dict:
    """``{"files": [...], "sha1": hex}``: SHA-1 over the named files' paths and bytes (a
    missing file hashes as missing)."""
    files = _expand(sources)
    h = hashlib.sha1()
    root = project_root()
    for f in files:
        h.update(f.encode() + b"\0")
        p = root / f
        h.update(p.read_bytes() if p.exists() else b"<missing>")
        h.update(b"\0")
    return {"files": files, "sha1": h.hexdigest()}


def staleness(record: dict) -> dict:
    """Is a benchmark record still about the current sources?

    Returns ``{"commit": short commit or None, "stale": bool, "measured_sha1": ...,
    "current_sha1": ..., "label": "commit abc1234" or "commit abc1234 (stale)"}``. A record
    without a fingerprint (written before fingerprints existed) counts as stale.
    """
    hw = record.get("hardware", {})
    commit = hw.get("git_commit")
    short = commit[:7] if isinstance(commit, str) else None
    src = record.get("sources")
    if not src or "files" not in src:
        return {"commit": short, "stale": True, "measured_sha1": None, "current_sha1": None,
                "label": f"commit {short or 'unknown'} (stale: no source fingerprint)"}
    now = source_fingerprint(src["files"])["sha1"]
    stale = now != src.get("sha1")          # the measured files themselves, byte for byte
    return {"commit": short, "stale": stale, "measured_sha1": src.get("sha1"),
            "current_sha1": now,
            "label": f"commit {short or 'unknown'}" + (" (stale)" if stale else "")}


def load_result(name: str) -> dict | None:
    """``data/benchmarks/<name>.json`` as a dict (None when absent)."""
    path = results_dir() / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


# ----------------------------------------------------------------------------- timing
def time_it(fn: Callable[[], object], repeats: int = 20, warmup: int = 3,
            sync: Callable[[], None] | None = None) -> dict:
    """Wall-clock ``fn()`` ``repeats`` times after ``warmup`` calls.

    Returns ``{"median_ms", "min_ms", "max_ms", "repeats"}``. ``sync`` (e.g.
    ``torch.cuda.synchronize``) is called before each clock read on asynchronous devices.
    """
    for _ in range(warmup):
        fn()
    times = timed_calls(fn, repeats, sync)
    return {"median_ms": statistics.median(times), "min_ms": min(times),
            "max_ms": max(times), "repeats": repeats}


def timed_calls(fn: Callable[[], object], repeats: int,
                sync: Callable[[], None] | None = None) -> list[float]:
    """Wall milliseconds of ``repeats`` calls of ``fn``, one after another (no warm-up);
    ``sync`` (e.g. ``torch.cuda.synchronize``) is called before each clock read."""
    times = []
    for _ in range(repeats):
        if sync:
            sync()
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def time_rounds(fns: dict[str, Callable[[], object]], rounds: int = 30, warmup: int = 2,
                sync: Callable[[], None] | None = None,
                clock: Callable[[], float] = time.perf_counter,
                before: Callable[[str], None] | None = None) -> dict:
    """Interleaved timing for a shared machine: every round calls each ``fn`` once, in turn.

    Load that comes and goes hits all paths of a round alike, so ratios are computed per
    round and their median reported (:func:`ratio`). Returns ``{name: {"median_ms",
    "min_ms", "max_ms", "cpu_median_ms", "repeats", "rounds_ms": [...]}}``; ``cpu_median_ms``
    is the median process CPU time (all threads; less sensitive to waiting for a core).
    ``clock`` (seconds, default :func:`time.perf_counter`) is the wall clock; a test passes
    a fake one. ``before(name)``, if given, is called before every call of ``fns[name]``
    (warm-up calls included), outside the timed interval (e.g. to hand the call a new page).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    for _ in range(warmup):
        for k, fn in fns.items():
            if before:
                before(k)
            fn()
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            if before:
                before(k)
            if sync:
                sync()
            t0, c0 = clock(), time.process_time()
            fn()
            if sync:
                sync()
            wall[k].append((clock() - t0) * 1e3)
            cpu[k].append((time.process_time() - c0) * 1e3)
    return {k: {"median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v),
                "cpu_median_ms": statistics.median(cpu[k]), "repeats": rounds,
                "rounds_ms": [round(t, 4) for t in v]} for k, v in wall.items()}


def round_ratios(num_ms: Sequence[float], den_ms: Sequence[float]) -> dict:
    """Per-round ratios ``num_ms[i] / den_ms[i]`` of two paths timed in the same rounds.

    Returns ``{"min_of_round_ratios", "median_of_round_ratios", "ci95", "rounds"}``: the
    minimum and the median of the per-round ratios, and a percentile bootstrap 95 % CI of that
    median over rounds (2,000 resamples). The minimum is the round in which the denominator
    was slowed most against the numerator, not the quietest round: on a shared machine one
    disturbed round of a short denominator can put it below what the paths can do (below 1
    for a path that includes the denominator's work). For each path at its least disturbed,
    compare their minimum times (:func:`ratio`'s ``ratio_of_minima``).
    """
    if len(num_ms) != len(den_ms) or not len(num_ms):
        raise ValueError(f"num_ms and den_ms must be non-empty and of equal length (one time "
                         f"per round), got {len(num_ms)} and {len(den_ms)}")
    per = [x / y for x, y in zip(num_ms, den_ms)]
    lo, hi = bootstrap_ci(per, statistics.median)
    return {"min_of_round_ratios": min(per), "median_of_round_ratios": statistics.median(per),
            "ci95": [lo, hi], "rounds": len(per)}


def ratio(timings: dict, num: str, den: str) -> dict:
    """``num / den`` from :func:`time_rounds`: :func:`round_ratios` of the two paths' rounds
    (minimum and median of the per-round ratios, CI of the median), the ratio of medians and
    the ratio of minima (each path's fastest round: what each costs with the fewest
    neighbours, measured in the same run)."""
    return {**round_ratios(timings[num]["rounds_ms"], timings[den]["rounds_ms"]),
            "ratio_of_medians": timings[num]["median_ms"] / timings[den]["median_ms"],
            "ratio_of_minima": timings[num]["min_ms"] / timings[den]["min_ms"]}


def bootstrap_ci(values: Sequence[float], stat: Callable[[Sequence[float]], float] = statistics.median,
                 n_boot: int = 2000, alpha: float = 0.05, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of ``stat`` over ``values`` (resampled with replacement)."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, v.size, size=(n_boot, v.size))
    boots = np.array([stat(list(row)) for row in v[idx]])
    return float(np.quantile(boots, alpha / 2)), float(np.quantile(boots, 1 - alpha / 2))


# ----------------------------------------------------------------------------- arguments
class BenchError(SystemExit):
    """A benchmark refuses to run or to write: exits non-zero with this one-line message.

    A :class:`SystemExit` (status 1, the message printed to stderr) so that a refusal is
    never swallowed by an ``except Exception`` on its way out of a benchmark's ``main``.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def int_at_least(lo: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer ``>= lo``; otherwise argparse names the flag, e.g.
    ``argument --rounds: must be an integer >= 1, got '0'``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {lo}, got {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be an integer >= {lo}, got {text!r}")
        return value
    parse.__name__ = f"int>={lo}"
    return parse


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\Z")


def record_name(text: str) -> str:
    """An argparse ``type``: a record name (letters, digits, ``_ . -``; no folders), so
    ``<name>.json`` stays inside the benchmark folders."""
    if not _NAME.match(text):
        raise argparse.ArgumentTypeError(
            f"must be a file name of letters, digits, '_', '.', '-' (no '/', not starting with "
            f"'.'), got {text!r}")
    return text


def add_output_args(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--record`` (the one way to replace a committed record) to a benchmark's parser."""
    ap.add_argument("--record", action="store_true",
                    help="replace the committed record data/benchmarks/NAME.json (refused, "
                         "exit 1, when the machine was loaded or the new record measured less "
                         "than the old one); default: write _build/benchmarks/NAME.json")
    return ap


# ----------------------------------------------------------------------------- output
def results_dir() -> Path:
    """``data/benchmarks/``: the committed records (read by the chapters; written only by
    ``--record`` through :func:`place_record`)."""
    path = project_root() / "data" / "benchmarks"
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_dir() -> Path:
    """``_build/benchmarks/``: where a benchmark writes by default (not committed)."""
    path = project_root() / "_build" / "benchmarks"
    path.mkdir(parents=True, exist_ok=True)
    return path


def load_state() -> dict:
    """``{"load_average_1_5_15": [...] or None, "cpu_count": int}`` of this machine now."""
    return {"load_average_1_5_15": _load_average(), "cpu_count": os.cpu_count() or 1}


def loaded(load: dict | None) -> bool | None:
    """Was the machine loaded during a run? ``load`` is a record's ``load`` section
    (``before`` / ``after`` load averages, ``cpu_count``): True when the 1-minute load
    average before or after was above the core count, None when the load is unknown."""
    if not load:
        return None
    ones = [v[0] for v in (load.get("before"), load.get("after")) if v]
    if not ones or not load.get("cpu_count"):
        return None
    return max(ones) > load["cpu_count"]


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(project_root()))
    except ValueError:
        return str(path)


class Run:
    """One benchmark run: the load it ran under and where its record goes.

    Create it right after parsing the arguments (it reads the load average then), call
    :meth:`write` once at the end. With ``args.record`` a run that starts on a loaded
    machine is refused at once (:class:`BenchError`: nothing is measured or written).

    Args:
        name: the record's name (``<name>.json``), see :func:`record_name`.
        args: the parsed command line (recorded in ``args``; ``args.record`` picks the
            destination), or None (no arguments, write to ``_build``).
    """

    def __init__(self, name: str, args: argparse.Namespace | None = None) -> None:
        if not _NAME.match(name):
            raise ValueError(f"name must be a file name of letters, digits, '_', '.', '-' "
                             f"(no '/', not starting with '.'), got {name!r}")
        self.name = name
        opts = dict(vars(args)) if args is not None else {}
        self.record = bool(opts.pop("record", False))
        self.args = opts
        self.before = load_state()
        self.t0 = time.perf_counter()
        if self.record:
            now = {"before": self.before["load_average_1_5_15"],
                   "cpu_count": self.before["cpu_count"]}
            if loaded(now) is not False:
                why = _load_reason(now)
                raise BenchError(f"--record refused before measuring: {why}; nothing "
                                 f"written (run it when the machine is quieter, or without "
                                 f"--record to write _build/benchmarks/{self.name}.json)")

    def write(self, payload: dict, sources: Iterable[str] = ()) -> Path:
        """Add hardware, source fingerprint, arguments and load to ``payload`` and place the
        record (:func:`place_record`); return its path. Raises :class:`BenchError` when a
        ``--record`` is refused (the record then lies in ``_build/benchmarks``)."""
        after = load_state()
        load = {"before": self.before["load_average_1_5_15"],
                "after": after["load_average_1_5_15"], "cpu_count": after["cpu_count"],
                "rule": "loaded: the 1-minute load average before or after the run above "
                        "cpu_count; a loaded run is never recorded under data/"}
        record = {"benchmark": self.name, "hardware": hardware_info(),
                  "sources": source_fingerprint([*COMMON_SOURCES, *sources]),
                  "args": self.args, "load": load, "loaded": loaded(load),
                  "wall_s": time.perf_counter() - self.t0, **payload}
        return place_record(record, to_data=self.record)


def _load_reason(load: dict) -> str:
    """Why ``load`` (a record's ``load`` section) bars a record (:func:`loaded` not False)."""
    ones = [v[0] for v in (load.get("before"), load.get("after")) if v]
    if loaded(load) is None:
        return ("the load average is unknown (no os.getloadavg here, or a record without a "
                "load section)")
    return (f"the machine was loaded (1-minute load average {max(ones):.2f} > "
            f"{load['cpu_count']} cores)")


def _write_json(path: Path, record: dict) -> None:
    """Write atomically (a temporary file renamed over ``path``): never a half-written record."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1, default=float) + "\n")
    os.replace(tmp, path)


def place_record(rec: dict, *, to_data: bool = False, keep_refused: bool = True) -> Path:
    """Write a finished record where the rule says; return the path written.

    ``to_data=False``: ``_build/benchmarks/<benchmark>.json`` (a loaded run is written,
    marked ``"loaded": true``). ``to_data=True``: ``data/benchmarks/<benchmark>.json``, unless
    the run was loaded (or its load unknown) or it measured less than the record there
    (:func:`shortfalls`): then :class:`BenchError` with the reasons on one line, the
    committed file untouched, and (``keep_refused``) the new record written to ``_build``.
    """
    name = rec.get("benchmark")
    if not isinstance(name, str) or not _NAME.match(name):
        raise BenchError(f"not a benchmark record: its 'benchmark' name is {name!r}")
    build = build_dir() / f"{name}.json"
    if not to_data:
        _write_json(build, rec)
        note = " (LOADED: load average above the core count; never recorded)" \
            if rec.get("loaded") else ""
        print(f"wrote {_rel(build)}{note}; --record replaces data/benchmarks/{name}.json")
        return build
    target = results_dir() / f"{name}.json"
    reasons = [] if loaded(rec.get("load")) is False else [_load_reason(rec.get("load") or {})]
    if target.exists():
        reasons += shortfalls(json.loads(target.read_text()), rec)
    if reasons:
        kept = ""
        if keep_refused:
            _write_json(build, rec)
            kept = f"; the new record is in {_rel(build)}"
        raise BenchError(f"refused to replace {_rel(target)}: {'; '.join(reasons)}{kept}")
    _write_json(target, rec)
    print(f"recorded {_rel(target)}")
    return target


def promote(path: str | Path) -> Path:
    """Record a finished record file (e.g. one a lent GPU machine wrote under its
    ``_build/benchmarks``) as ``data/benchmarks/<benchmark>.json``, through the same gate as
    ``--record`` (:func:`place_record`); the file itself is left where it is."""
    src = Path(path)
    try:
        rec = json.loads(src.read_text())
    except (OSError, ValueError) as exc:
        raise BenchError(f"cannot read a record from {src}: {exc}") from None
    if not isinstance(rec, dict):
        raise BenchError(f"{src} holds no benchmark record (a JSON object)")
    if src.resolve() == (results_dir() / f"{rec.get('benchmark')}.json").resolve():
        raise BenchError(f"{src} is the committed record itself")
    return place_record(rec, to_data=True, keep_refused=False)


# ----------------------------------------------------------------------------- "measured less"
#: counts: a record replaces another only with at least as many at the same place
COUNT_KEYS = frozenset({"repeats", "rounds", "reps", "iters", "calls_per_replay", "ref_rounds",
                        "ref_images", "images"})
#: keys that size a workload: a record replaces another only with the same values
WORKLOAD_KEYS = frozenset({"batch", "size", "image_size", "budget", "patch", "side", "image",
                           "page_shape", "max_radius", "out_sizes_hw", "out_size_hw", "grid",
                           "remap_output", "visual_tokens", "seq_len", "text_tokens"})
#: a timing's statistics: never a workload, even under a workload key (a stage named
#: ``side`` is timed, not sized)
TIMING_LEAVES = frozenset({"median_ms", "min_ms", "max_ms", "mean_ms", "median", "min", "max",
                           "mean"})
#: options that make a run measure less when set (``--quick``, ...)
REDUCING_FLAGS = frozenset({"quick", "no_gpu", "no_cpu"})
#: fields that name an element of a list of dicts (a run, a point) better than its index
ID_KEYS = ("model", "device", "dtype", "batch", "cuda_graph", "visual_tokens", "name")
#: sections that describe the run, not what it measured
_META = frozenset({"hardware", "sources", "load", "loaded", "wall_s", "benchmark"})


def _leaves(obj, path: tuple = ()):
    """``(path, value)`` for every scalar (or list of scalars) in a nested record; a list of
    dicts is keyed by each element's :data:`ID_KEYS` (``"[model=a,device=cuda]"``; a key
    that is False or None is left out), else by its index."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, (*path, str(k)))
    elif isinstance(obj, list) and obj and all(isinstance(v, dict) for v in obj):
        for i, v in enumerate(obj):
            ids = [f"{k}={v[k]}" for k in ID_KEYS            # False/None = absent (older
                   if v.get(k) not in (None, False)          # records lack a new flag)
                   and not isinstance(v[k], (dict, list))]
            yield from _leaves(v, (*path, "[" + ",".join(ids) + "]" if ids else f"[{i}]"))
    else:
        yield path, obj


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _examples(paths: list[str], k: int = 3) -> str:
    return ", ".join(paths[:k]) + (f" and {len(paths) - k} more" if len(paths) > k else "")


def shortfalls(old: dict, new: dict) -> list[str]:
    """Ways in which record ``new`` measured less than record ``old`` (empty: it may replace it).

    * no GPU: ``old`` was measured with a GPU (``hardware.gpu``), ``new`` without;
    * missing timings: a timing of ``old`` (a dict with ``median_ms`` or ``median``: a
      method, size, row, batch or section) that ``new`` lacks;
    * fewer rounds: a count (:data:`COUNT_KEYS`) smaller at the same place;
    * a different workload: a number under a :data:`WORKLOAD_KEYS` key that differs (a
      timing statistic, :data:`TIMING_LEAVES`, never counts);
    * options (``args``, when both records have them): a list option (``--gpu-batches``,
      ``--only``) missing one of the old values, a selection where the old run had none,
      a count option smaller, a reducing flag (:data:`REDUCING_FLAGS`) newly set.
    """
    reasons: list[str] = []
    old_gpu = (old.get("hardware") or {}).get("gpu")
    if old_gpu and not (new.get("hardware") or {}).get("gpu"):
        reasons.append(f"no GPU (the old record was measured on {old_gpu})")
    lo = {p: v for p, v in _leaves(old) if p and p[0] not in _META and p[0] != "args"}
    ln = {p: v for p, v in _leaves(new) if p and p[0] not in _META and p[0] != "args"}
    timed = lambda leaves: {".".join(p[:-1]) for p, v in leaves.items()  # noqa: E731
                            if p[-1] in ("median_ms", "median") and _number(v)}
    missing = sorted(timed(lo) - timed(ln))
    if missing:
        reasons.append(f"{len(missing)} of the old record's {len(timed(lo))} timings not "
                       f"measured ({_examples(missing)})")
    fewer, other = [], []
    for p, v in lo.items():
        if p not in ln or p[-1] == "rounds_ms":
            continue
        w = ln[p]
        if p[-1] in COUNT_KEYS and _number(v) and _number(w) and w < v:
            fewer.append(f"{'.'.join(p)} {w:g} < {v:g}")
        elif p[-1] not in TIMING_LEAVES and any(k in WORKLOAD_KEYS for k in p) and v != w and (
                _number(v) or (isinstance(v, list) and all(map(_number, v)))):
            other.append(f"{'.'.join(p)} {w} (old {v})")
    if fewer:
        reasons.append(f"fewer rounds/repeats: {_examples(fewer)}")
    if other:
        reasons.append(f"a different workload: {_examples(other)}")
    ao, an = old.get("args"), new.get("args")
    if isinstance(ao, dict) and isinstance(an, dict):
        opts = []
        for k, v in ao.items():
            w = an.get(k)
            if isinstance(v, list) and isinstance(w, list):
                lost = [x for x in v if x not in w]
                if lost:
                    opts.append(f"{_flag(k)} lacks {', '.join(map(str, lost))}")
            elif v is None and isinstance(w, list):
                opts.append(f"{_flag(k)} selects {len(w)} where the old run took all")
            elif k in COUNT_KEYS and _number(v) and _number(w) and w < v:
                opts.append(f"{_flag(k)} {w} < {v}")
            elif k in WORKLOAD_KEYS and _number(v) and w != v:
                opts.append(f"{_flag(k)} {w} (old {v})")
            elif k in REDUCING_FLAGS and w is True and v is False:
                opts.append(f"{_flag(k)} (the old run was without it)")
        if opts:
            reasons.append(f"options measure less: {_examples(opts, k=8)}")
    return reasons
