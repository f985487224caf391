"""Reading benchmark records for chapter 05 (fovea_book.eval.benchreport) and its figure."""

from __future__ import annotations

import json
import math

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from fovea_book.eval.benchreport import (ratio_ci_text, ratio_value, read_record,  # noqa: E402
                                         target_word)
from fovea_book.plotting import timing_bars  # noqa: E402

RATIOS = {"a/b": {"median_of_round_ratios": 1.25, "ci95": [1.111, 1.406]}}


def test_read_record_from_a_path_or_the_committed_default(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"cpu": {"timings": {}}}))
    assert read_record(p, "sampling.json") == {"cpu": {"timings": {}}}
    assert read_record(tmp_path / "absent.json", "sampling.json") is None
    committed = read_record(None, "sampling.json")      # the committed CPU record
    assert committed is not None and "cpu" in committed
    assert read_record("", "no_such_record.json") is None
    with pytest.raises(ValueError, match="default"):
        read_record(None, "")


def test_ratios_and_words():
    assert ratio_value(RATIOS, "a/b") == 1.25
    assert math.isnan(ratio_value(RATIOS, "c/d")) and math.isnan(ratio_value({}, "a/b"))
    assert ratio_ci_text(RATIOS, "a/b") == "[1.11, 1.41]"
    assert ratio_ci_text(RATIOS, "c/d") == "n/a" and ratio_ci_text(None, "a/b") == "n/a"
    assert target_word({"t": {"met": True}}, "t") == "meets"
    assert target_word({"t": {"met": False}}, "t") == "misses"
    assert target_word({}, "t") == "misses" and target_word(None, "t") == "misses"


def test_timing_bars():
    fig = timing_bars(np.array([1.0, 2.0]), ["a", "b"], ["#999", "#c63"], target_ms=2.0,
                      target_label="target")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and len(ax.patches) == 2
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["target"]
    empty = timing_bars(None, ["a"], ["#999"], target_ms=2.0, target_label="t")
    assert len(empty.axes[0].patches) == 0
    with pytest.raises(ValueError, match="same length"):
        timing_bars(np.array([1.0]), ["a", "b"], ["#999"], target_ms=2.0, target_label="t")


NCU_TEXT = """==PROF== Connected to process 1
  gather_patches (17472, 1, 1)x(256, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: Command line profiler metrics
    dram__bytes_read.sum                                         Mbyte        62.96
    dram__throughput.avg.pct_of_peak_sustained_elapsed               %        24.10
  gather_tokens (264, 1, 1)x(256, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    dram__throughput.avg.pct_of_peak_sustained_elapsed               %        71.50
    launch__registers_per_thread                       register/thread           96
  gather_tokens (264, 1, 1)x(256, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    dram__throughput.avg.pct_of_peak_sustained_elapsed               %        73.25
"""


def _speed_records(fused: float | None, batches=(1, 8), pipeline=True, cpu_min=1.9):
    paths = {"gather_kernel_graph": {"fraction_of_datasheet": 0.33},
             "grid_sample_one_call": {"fraction_of_datasheet": 0.9}}   # not a gather kernel
    if fused is not None:
        paths["gather_kernel_fused_graph"] = {"fraction_of_datasheet": fused}
    gpu = {"hardware": {"gpu": "H100"}, "gpu": {"B64": {"bandwidth": {"paths": paths}}}}
    runs = [{"model": "m", "dtype": "bfloat16", "batch": b, "cuda_graph": g,
             "speedup_measured": 10.0 + b + g, "flop_ratio_bound": 15.0,
             "speedup_over_bound": (10.0 + b + g) / 15.0} for b in batches for g in (0, 1)]
    vlm = {"hardware": {}, "runs": runs + [{"model": "m", "error": "OOM"}]}
    if pipeline:
        vlm["pipeline"] = {"model": "m", "budget": 273, "batch": 8, "allocator": "a",
                           "shares": {"pyramid": 0.01, "prefill": 0.99},
                           "side_over_prefill": 0.04}
    cpu = {"hardware": {"cpu": "EPYC", "load_average_1_5_15": [0.5]}, "cpu": {"ratios": {
        "e2e_kernel/copy_floor": {"ratio_of_minima": 3.0, "min_of_round_ratios": 1.0,
                                  "median_of_round_ratios": 4.0},
        "e2e_onepass/copy_floor": {"ratio_of_minima": cpu_min, "min_of_round_ratios": 0.6,
                                   "median_of_round_ratios": 2.2},
        "e2e_torch/copy_floor": {"ratio_of_minima": 0.1, "min_of_round_ratios": 0.1,
                                 "median_of_round_ratios": 0.1}}}}
    return cpu, gpu, vlm


def test_read_ncu_parses_every_launch(tmp_path):
    from fovea_book.eval.benchreport import read_ncu
    p = tmp_path / "ncu.txt"
    p.write_text(NCU_TEXT)
    got = read_ncu(p)
    assert [r["kernel"] for r in got] == ["gather_patches", "gather_tokens", "gather_tokens"]
    assert got[0]["dram__bytes_read.sum"] == 62.96
    assert got[1]["launch__registers_per_thread"] == 96
    assert read_ncu(tmp_path / "absent.txt") == []
    assert {r["kernel"] for r in read_ncu()} >= {"gather_patches"}      # the committed log


def test_speed_targets_pick_one_run_per_target_and_judge_it(tmp_path):
    from fovea_book.eval.benchreport import read_ncu, speed_targets
    p = tmp_path / "ncu.txt"
    p.write_text(NCU_TEXT)
    t = speed_targets(*_speed_records(0.75), ncu=read_ncu(p))
    bw = t.loc["gpu_gather_bandwidth"]
    assert bw.measured == 0.75 and bw.verdict == "met" and bw.moonshot_verdict == "not met"
    assert "gather_kernel_fused_graph" in bw.detail and "73 %" in bw.detail  # its own kernel
    pf = t.loc["gpu_prefill_over_bound"]                     # batch >= 8 only, the best mode
    assert pf.measured == pytest.approx(19 / 15) and "batch 8, CUDA graph" in pf.detail
    assert t.loc["gpu_side_over_prefill"].verdict == "met"
    cpu = t.loc["cpu_e2e_over_copy"]                         # best e2e path, torch excluded
    assert cpu.measured == 1.9 and "e2e_onepass" in cpu.detail and cpu.verdict == "met"
    assert cpu.moonshot_verdict == "not met"


def test_speed_targets_say_not_measured_rather_than_guess():
    from fovea_book.eval.benchreport import speed_targets
    t = speed_targets(*_speed_records(None, batches=(1,), pipeline=False, cpu_min=2.5))
    assert t.loc["gpu_gather_bandwidth"].verdict == "not met"
    assert "fused kernel not yet measured" in t.loc["gpu_gather_bandwidth"].detail
    assert t.loc["gpu_prefill_over_bound"].verdict == "not measured"
    assert "the record has batch 1" in t.loc["gpu_prefill_over_bound"].detail
    assert t.loc["gpu_side_over_prefill"].verdict == "not measured"
    assert t.loc["cpu_e2e_over_copy"].verdict == "not met"
    none = speed_targets(None, None, None)
    assert set(none.verdict) == {"not measured"} and none.measured.isna().all()
