"""Reading benchmark records for the chapters (05, 15): the record file, its round
ratios with their CIs, and whether a target was met, as the words the text uses.

A record is the JSON written by ``python -m fovea_book.bench ...`` (committed under
``data/benchmarks/``); a ratio entry is ``{"median_of_round_ratios": r, "ci95": [lo, hi]}``
and a target entry ``{"met": bool, ...}`` (:mod:`fovea_book.bench.common`).
:func:`speed_targets` sets the book's four speed targets beside the records (and
:func:`read_ncu` the profiler's DRAM throughput beside the GPU gather).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from fovea_book.paths import project_root

#: the folder of the committed benchmark records, relative to the project root
RECORDS = Path("data") / "benchmarks"


def read_record(path: str | Path | None, default: str) -> dict | None:
    """The benchmark record at ``path``, or at ``data/benchmarks/<default>`` when ``path`` is
    empty; ``None`` when the file does not exist (a chapter then says "not measured")."""
    if not default:
        raise ValueError("default must name a record file, e.g. 'sampling.json'")
    p = Path(path) if path else project_root() / RECORDS / default
    return json.loads(p.read_text()) if p.exists() else None


def ratio_value(ratios: Mapping | None, key: str) -> float:
    """The median of round ratios of ``ratios[key]``; NaN when the record lacks it."""
    return ratios[key]["median_of_round_ratios"] if ratios and key in ratios else float("nan")


def ratio_ci_text(ratios: Mapping | None, key: str) -> str:
    """``"[lo, hi]"`` (2 decimals) of ``ratios[key]``'s 95 % CI; ``"n/a"`` when absent."""
    return ("[{:.2f}, {:.2f}]".format(*ratios[key]["ci95"]) if ratios and key in ratios
            else "n/a")


def target_word(targets: Mapping | None, key: str) -> str:
    """``"meets"`` when ``targets[key]["met"]`` is true, else ``"misses"`` (an absent
    target is not met)."""
    return "meets" if (targets or {}).get(key, {}).get("met", False) else "misses"


# ----------------------------------------------------------------------------- speed targets
#: the speed targets (set on 2026-11-25, commit cf51aac): (threshold, moonshot, direction)
SPEED_TARGETS = {
    "gpu_gather_bandwidth": (0.70, 0.80, "above"),
    "gpu_side_over_prefill": (0.05, None, "below"),
    "gpu_prefill_over_bound": (0.75, 0.90, "above"),
    "cpu_e2e_over_copy": (2.0, 1.5, "below"),
}


#: the profiler's report of the gather kernels from the last GPU session (cuda/gpu_session.sh)
NCU_LOG = RECORDS / "gpu_logs" / "ncu_gather.txt"


def read_ncu(path: str | Path | None = None) -> list[dict]:
    """The kernels of an ``ncu`` text report (``--metrics ...`` without ``--csv``; default the
    committed ``NCU_LOG``): one dict per profiled launch, ``{"kernel": name, metric: value}``;
    ``[]`` when there is no file."""
    import re

    path = project_root() / NCU_LOG if path is None else Path(path)
    if not path.exists():
        return []
    out: list[dict] = []
    for line in path.read_text().splitlines():
        head = re.match(r"\s{2}(\w+) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", line)
        if head:
            out.append({"kernel": head.group(1)})
            continue
        metric = re.match(r"\s+([a-z_]+__[\w.]+)\s+\S+(?: \S+)?\s+([\d.,]+)$", line)
        if metric and out:
            out[-1][metric.group(1)] = float(metric.group(2).replace(",", ""))
    return out


def gather_paths(gpu: Mapping | None) -> dict[str, dict]:
    """The GPU gather kernels' bandwidth entries at batch 64 of a GPU sampling record
    (``sampling_gpu.json``): ``{path: {"GBps", "fraction_of_copy", "fraction_of_datasheet"}}``
    for every ``gather_kernel*`` path with a datasheet fraction; ``{}`` without such a run."""
    runs = (gpu or {}).get("gpu")
    b64 = runs.get("B64") if isinstance(runs, Mapping) else None
    paths = (b64 or {}).get("bandwidth", {}).get("paths", {})
    return {k: v for k, v in paths.items()
            if k.startswith("gather_kernel") and v.get("fraction_of_datasheet") is not None}


def _verdict(value: float, threshold: float | None, direction: str) -> str:
    if threshold is None:
        return ""
    if value != value:                                     # NaN: nothing measured
        return "not measured"
    ok = value >= threshold if direction == "above" else value <= threshold
    return "met" if ok else "not met"


def speed_targets(cpu: Mapping | None, gpu: Mapping | None, vlm_gpu: Mapping | None,
                  ncu: list[dict] | None = None):
    """The four speed targets (set on 2026-11-25) beside what the committed records measured.

    Args:
        cpu: the CPU sampling record (``sampling.json``); the end-to-end kernel path's ratio
            of minimum times to the copy floor's (each at its least disturbed, in one run; the
            minimum of per-round ratios can fall below 1 on a shared machine and is only
            shown), the path with the smallest such ratio.
        gpu: the GPU sampling record (``sampling_gpu.json``); the gather path that reached the
            largest fraction of the datasheet bandwidth at batch 64, with ``ncu``'s DRAM
            throughput of that kernel beside it when ``ncu`` (:func:`read_ncu`) has it.
        vlm_gpu: the GPU prefill record (``vlm_latency_gpu.json``): the best speedup / FLOP
            ratio (273 vs 4096 tokens) at batch >= 8, and the ``pipeline`` entry.
        ncu: the profiled launches of the gather kernels.

    Returns:
        A DataFrame indexed by target key with ``target``, ``moonshot``, ``measured`` (NaN
        when the records hold no such measurement), ``detail`` (which path, batch and record,
        ``(stale)`` when its sources changed since), ``verdict`` and ``moonshot_verdict``
        (``"met"``, ``"not met"`` or ``"not measured"``). Every ratio in a row comes from one
        run of one record.
    """
    import pandas as pd

    from fovea_book.bench.common import staleness

    nan = float("nan")
    label = lambda rec: staleness(rec)["label"]                       # noqa: E731
    rows: dict[str, tuple[float, str]] = {}

    paths = gather_paths(gpu)
    if paths:
        best = max(paths, key=lambda k: paths[k]["fraction_of_datasheet"])
        kernel = "gather_tokens" if "fused" in best else "gather_patches"
        dram = [r["dram__throughput.avg.pct_of_peak_sustained_elapsed"] for r in ncu or []
                if r.get("kernel") == kernel
                and "dram__throughput.avg.pct_of_peak_sustained_elapsed" in r]
        ncu_text = (f"; ncu: {kernel} at {max(dram):.0f} % of peak DRAM throughput" if dram
                    else f"; ncu: no profile of {kernel}")
        fused = "" if any("fused" in k for k in paths) else "; the fused kernel not yet measured"
        rows["gpu_gather_bandwidth"] = (paths[best]["fraction_of_datasheet"],
                                        f"{best}, batch 64, {gpu['hardware'].get('gpu')}, "
                                        f"{label(gpu)}{ncu_text}{fused}")
    else:
        rows["gpu_gather_bandwidth"] = (nan, "no GPU sampling record at batch 64")

    pipe = (vlm_gpu or {}).get("pipeline")
    if pipe:
        shares = ", ".join(f"{k} {100 * v:.1f} %" for k, v in pipe["shares"].items())
        rows["gpu_side_over_prefill"] = (pipe["side_over_prefill"],
                                         f"{pipe['model']}, N = {pipe['budget']}, batch "
                                         f"{pipe['batch']}, {pipe['allocator']}; shares: "
                                         f"{shares}; {label(vlm_gpu)}")
    else:
        rows["gpu_side_over_prefill"] = (nan, "no pipeline in the GPU prefill record")

    runs = [r for r in (vlm_gpu or {}).get("runs", []) if "speedup_over_bound" in r]
    big = [r for r in runs if r.get("batch", 1) >= 8]
    if big:
        r = max(big, key=lambda r: r["speedup_over_bound"])
        rows["gpu_prefill_over_bound"] = (
            r["speedup_over_bound"],
            f"{r['model']} {r['dtype']}, batch {r['batch']}, "
            f"{'CUDA graph' if r.get('cuda_graph') else 'eager'}: {r['speedup_measured']:.1f}x "
            f"of a {r['flop_ratio_bound']:.1f}x FLOP ratio; {label(vlm_gpu)}")
    else:
        seen = sorted({r.get("batch", 1) for r in runs})
        rows["gpu_prefill_over_bound"] = (nan, "no GPU prefill run at batch >= 8" + (
            f" (the record has batch {', '.join(map(str, seen))})" if seen else ""))

    ratios = ((cpu or {}).get("cpu") or {}).get("ratios", {})
    e2e = {k: v for k, v in ratios.items() if k.endswith("/copy_floor") and k.startswith("e2e_")
           and not k.startswith("e2e_torch") and "ratio_of_minima" in v}
    if e2e:
        k = min(e2e, key=lambda k: e2e[k]["ratio_of_minima"])
        load = cpu["hardware"].get("load_average_1_5_15", ["?"])[0]
        rows["cpu_e2e_over_copy"] = (e2e[k]["ratio_of_minima"],
                                     f"{k.split('/')[0]}, fastest rounds (per-round ratios: "
                                     f"median {e2e[k]['median_of_round_ratios']:.2f}, minimum "
                                     f"{e2e[k]['min_of_round_ratios']:.2f}), "
                                     f"{cpu['hardware'].get('cpu')}, load {load}; {label(cpu)}")
    else:
        rows["cpu_e2e_over_copy"] = (nan, "no CPU record with the ratio of minimum times")

    table = []
    for key, (value, detail) in rows.items():
        thr, moon, direction = SPEED_TARGETS[key]
        table.append({"target key": key, "target": thr, "moonshot": moon,
                      "direction": direction, "measured": value, "detail": detail,
                      "verdict": _verdict(value, thr, direction),
                      "moonshot_verdict": _verdict(value, moon, direction)})
    return pd.DataFrame(table).set_index("target key")
