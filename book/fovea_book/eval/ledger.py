"""The claims ledger of the results chapter: every seed prediction beside its measurement.

A :class:`Claim` is one row: what the seed documents (or the issue's targets) said, the
number measured in this build (with its CI when there is one), where it was measured, and
a verdict selected by :func:`judge` from the numbers, never typed in. A measurement that
this build did not produce (a benchmark JSON not yet written, a dataset folder missing)
gives the verdict :data:`NOT_MEASURED` and the measured text says so.

Verdict rules of :func:`judge` (``p`` the prediction, ``[lo, hi]`` the CI of the
measurement, ``lo = hi = est`` when there is none):

* ``"approx"`` (``p`` within a relative tolerance ``tol``): "confirmed" when the CI
  overlaps ``p (1 +- tol)`` and the estimate lies inside it, "not confirmed (measured
  higher)" / "(measured lower)" when the whole CI lies above / below it, else "undecided";
* ``"above"`` / ``"below"`` (a threshold): "confirmed" when the whole CI is above (below)
  ``p``, "not confirmed" when it is entirely on the other side, else "undecided";
* ``"within"`` (equivalence of a difference, margin ``tol`` in the measure's units):
  "confirmed" when the CI lies inside ``[-tol, tol]``, "not confirmed (measured higher)"
  / "(measured lower)" when it lies entirely above / below, else "undecided".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from fovea_book.eval.benchreport import gather_paths
from fovea_book.eval.stats import too_few

__all__ = ["Claim", "benchmark_claims", "judge", "ledger_frame", "NOT_MEASURED", "STAND_IN",
           "MODES"]

NOT_MEASURED = "not measured in this build"
#: a claim about a system this build cannot run (e.g. a 2-7 B model on a GPU) measured on a
#: stand-in (a small random-weight model on a CPU): shown as context, never judged
STAND_IN = "not measured (CPU stand-in)"
MODES = ("approx", "above", "below", "within")
HIGHER, LOWER = "not confirmed (measured higher)", "not confirmed (measured lower)"


@dataclass(frozen=True)
class Claim:
    """One row of the ledger (all fields are display text; ``where`` names a chapter)."""

    claim: str
    source: str
    predicted: str
    measured: str
    unit: str
    where: str
    verdict: str


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(float(x))


def judge(predicted: float, est: float | None, lo: float | None = None,
          hi: float | None = None, *, mode: str = "approx", tol: float = 0.1,
          n_docs: int | None = None) -> str:
    """Verdict of a measurement ``est`` (CI ``[lo, hi]``, optional) against ``predicted``.

    ``mode`` in :data:`MODES` (rules in the module docstring); ``tol`` >= 0 is relative
    for ``"approx"`` and absolute (the equivalence margin) for ``"within"``, unused
    otherwise. ``est`` ``None`` or NaN -> :data:`NOT_MEASURED`. ``n_docs``: for a
    measurement over documents, the number behind it; below
    :data:`~fovea_book.eval.stats.MIN_DOCS` the verdict is "too few documents (n = K)"
    (:func:`~fovea_book.eval.stats.too_few`), whatever the numbers say.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not (_finite(tol) and tol >= 0):
        raise ValueError(f"tol must be a finite number >= 0, got {tol!r}")
    if not _finite(predicted):
        raise ValueError(f"predicted must be a finite number, got {predicted!r}")
    if not _finite(est):
        return NOT_MEASURED
    if n_docs is not None and too_few(n_docs):
        return too_few(n_docs)
    lo = float(est) if not _finite(lo) else float(lo)
    hi = float(est) if not _finite(hi) else float(hi)
    if lo > hi:
        raise ValueError(f"lo must be <= hi, got [{lo}, {hi}]")
    p = float(predicted)
    if mode == "approx":
        a, b = p - tol * abs(p), p + tol * abs(p)
        if hi < a or lo > b:
            return LOWER if hi < a else HIGHER
        return "confirmed" if a <= est <= b else "undecided"
    if mode == "above":
        return "confirmed" if lo > p else "not confirmed" if hi <= p else "undecided"
    if mode == "below":
        return "confirmed" if hi < p else "not confirmed" if lo >= p else "undecided"
    # "within": the difference est must lie in [-tol, tol]
    if lo >= -tol and hi <= tol:
        return "confirmed"
    return LOWER if hi < -tol else HIGHER if lo > tol else "undecided"


def ledger_frame(claims: list[Claim]):
    """The claims as a ``pandas.DataFrame``, one row per claim, columns the fields."""
    import pandas as pd

    if not claims:
        raise ValueError("claims must be a non-empty list of Claim")
    return pd.DataFrame([asdict(c) for c in claims])


def _bench(bench_dir, name: str) -> dict | None:
    import json
    from pathlib import Path

    p = Path(bench_dir) / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def _source_text(record: dict) -> str:
    """``"commit abcd1234"`` (+ ``" (stale)"`` when the measured sources changed since)."""
    from fovea_book.bench.common import staleness

    return staleness(record)["label"]


def benchmark_claims(bench_dir) -> list[Claim]:
    """The speed targets of the issues as ledger rows, from the benchmark JSON in
    ``bench_dir`` (``sampling``, ``allocators``, ``sampling_gpu``, ``vlm_latency_gpu``).

    Each row names the target, the measured value and the commit it came from, marked
    ``(stale)`` when the measured sources changed since
    (:func:`fovea_book.bench.common.staleness`); a missing file gives no row. Verdicts come
    from :func:`judge` (thresholds: ``"below"`` / ``"above"``)."""
    rows: list[Claim] = []
    s = _bench(bench_dir, "sampling")
    names = {"e2e_kernel_le_2ms": ("CPU pyramid + gather of 273 tokens, 1024^2 (median)",
                                   "ms", "05_5_kernel_speed"),
             "e2e_over_copy_le_1.5_moonshot": ("CPU end to end / copy floor (moonshot)", "x",
                                               "05_5_kernel_speed"),
             "e2e_over_copy_minima_le_2": ("CPU end to end / copy floor, fastest rounds",
                                           "x", "05_5_kernel_speed"),
             "torch_over_grid_sample_le_1.5": ("torch sample / one grid_sample call", "x",
                                               "05_5_kernel_speed"),
             "remap_torch_over_cv2_le_2": ("torch log-polar remap / cv2.remap", "x",
                                           "05_5_kernel_speed")}
    if s and "targets" in s.get("cpu", {}):
        src = _source_text(s)
        for key, t in s["cpu"]["targets"].items():
            claim, unit, where = names.get(key, (key, "", "05_5_kernel_speed"))
            rows.append(Claim(claim, "issue target", f"<= {t['target']:g}",
                              f"{t['measured']:.3g} ({src})", unit, where,
                              judge(t["target"], t["measured"], mode="below")))
    a = _bench(bench_dir, "allocators")
    if a and "allocators" in a:
        target = float(a.get("target_ms_per_image_issue13", 1.0))
        timed = {k: v for k, v in a["allocators"].items() if not v.get("exempt")}
        worst = max(timed, key=lambda k: timed[k]["median_ms_per_image"])
        ok = sum(v["median_ms_per_image"] <= target for v in timed.values())
        rows.append(Claim(f"every allocator that does not read pixels <= {target:g} ms/image "
                          f"at batch 32 ({ok} of {len(timed)} meet it; slowest: {worst})",
                          "issue target", f"<= {target:g}",
                          f"{timed[worst]['median_ms_per_image']:.3g} ({_source_text(a)})",
                          "ms/image", "06_allocator_gallery",
                          judge(target, timed[worst]["median_ms_per_image"], mode="below")))
    g = _bench(bench_dir, "sampling_gpu")
    kern = gather_paths(g)
    if kern:
        best = max(kern, key=lambda k: kern[k]["fraction_of_datasheet"])
        frac = kern[best]["fraction_of_datasheet"]
        rows.append(Claim(f"GPU gather at B = 64: fraction of the memory bandwidth ({best}, "
                          f"{g['hardware'].get('gpu', 'GPU')})", "issue target", ">= 0.5",
                          f"{frac:.2f} ({_source_text(g)})", "of datasheet",
                          "05_5_kernel_speed", judge(0.5, frac, mode="above")))
    v = _bench(bench_dir, "vlm_latency_gpu")
    runs = [r for r in (v or {}).get("runs", []) if "speedup_over_bound" in r]
    if runs:
        r = max(runs, key=lambda r: r["speedup_over_bound"])
        mode = "CUDA graph" if r.get("cuda_graph") else "eager"
        rows.append(Claim(f"VLM prefill 273 vs 4096 tokens, {r['model']} {r['dtype']} on "
                          f"{r['device']} ({mode}): share of the FLOP-ratio bound",
                          "issue target", ">= 0.8",
                          f"{r['speedup_over_bound']:.2f} ({_source_text(v)})",
                          "of bound", "15_vlm_integration",
                          judge(0.8, r["speedup_over_bound"], mode="above")))
    return rows
