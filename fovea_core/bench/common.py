"""Shared benchmark plumbing: hardware/version record, robust timing, JSON output."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from fovea_core.paths import project_root


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def hardware_info() -> dict:
    """The machine and library versions a timing was taken with."""
    import numpy
    import torch

    info = {
        "timestamp_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
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
        try:
            info["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            info["driver"] = None
        info["cuda"] = torch.version.cuda
    try:
        info["git_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                            capture_output=True, text=True,
                                            cwd=project_root()).stdout.strip() or None
    except OSError:
        info["git_commit"] = None
    return info


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


def results_dir() -> Path:
    path = project_root() / "data" / "benchmarks"
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_result(name: str, payload: dict) -> Path:
    """Write ``data/benchmarks/<name>.json`` with ``hardware_info()`` added; return the path."""
    path = results_dir() / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "hardware": hardware_info(), **payload},
                               indent=1, default=float) + "\n")
    print(f"wrote {path}")
    return path
