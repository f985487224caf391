"""Shared benchmark plumbing: hardware/version record, robust timing, JSON output, staleness.

Every record written by :func:`write_result` carries the git commit it was measured at and a
SHA-1 fingerprint of the source files it measured (``sources``); :func:`staleness` compares
that fingerprint with the sources as they are now, so a chapter can mark a figure
"from commit X (stale)" when the measured code has changed since.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from fovea_core.paths import project_root

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
    times = []
    for _ in range(repeats):
        if sync:
            sync()
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times),
            "max_ms": max(times), "repeats": repeats}


def time_rounds(fns: dict[str, Callable[[], object]], rounds: int = 30, warmup: int = 2,
                sync: Callable[[], None] | None = None) -> dict:
    """Interleaved timing for a shared machine: every round calls each ``fn`` once, in turn.

    Load that comes and goes hits all paths of a round alike, so ratios are computed per
    round and their median reported (:func:`ratio`). Returns ``{name: {"median_ms",
    "min_ms", "max_ms", "cpu_median_ms", "repeats", "rounds_ms": [...]}}``; ``cpu_median_ms``
    is the median process CPU time (all threads; less sensitive to waiting for a core).
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            if sync:
                sync()
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            if sync:
                sync()
            wall[k].append((time.perf_counter() - t0) * 1e3)
            cpu[k].append((time.process_time() - c0) * 1e3)
    return {k: {"median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v),
                "cpu_median_ms": statistics.median(cpu[k]), "repeats": rounds,
                "rounds_ms": [round(t, 4) for t in v]} for k, v in wall.items()}


def ratio(timings: dict, num: str, den: str) -> dict:
    """``num / den`` from :func:`time_rounds`: the median of per-round ratios, with its
    bootstrap 95 % CI over rounds (percentile, 2,000 resamples) and the ratio of medians."""
    a, b = timings[num]["rounds_ms"], timings[den]["rounds_ms"]
    per = [x / y for x, y in zip(a, b)]
    lo, hi = bootstrap_ci(per, statistics.median)
    return {"median_of_round_ratios": statistics.median(per), "ci95": [lo, hi],
            "ratio_of_medians": timings[num]["median_ms"] / timings[den]["median_ms"]}


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


# ----------------------------------------------------------------------------- output
def results_dir() -> Path:
    path = project_root() / "data" / "benchmarks"
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_result(name: str, payload: dict, sources: Iterable[str] = ()) -> Path:
    """Write ``data/benchmarks/<name>.json`` with ``hardware_info()`` and the fingerprint of
    ``sources`` (plus :data:`COMMON_SOURCES`) added; return the path."""
    fp = source_fingerprint([*COMMON_SOURCES, *sources])
    path = results_dir() / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "hardware": hardware_info(), "sources": fp,
                                **payload}, indent=1, default=float) + "\n")
    print(f"wrote {path}")
    return path
