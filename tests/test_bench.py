"""Benchmark plumbing: bootstrap CIs, interleaved timing, source fingerprints and staleness."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fovea_core.bench import common
from fovea_core.vlm.qwen import qwen_config


def test_speedup_interval_is_a_bootstrap_ci_over_repeats():
    from fovea_core.bench import vlm_latency

    cfg = qwen_config("qwen2-vl-tiny").text_config
    rng = np.random.default_rng(0)
    small = list(2.0 + 0.1 * rng.standard_normal(15))
    large = list(30.0 + 1.0 * rng.standard_normal(15))
    pts = [{"visual_tokens": 273, "seq_len": 305, "median_ms": float(np.median(small)),
            "min_ms": min(small), "max_ms": max(small), "times_ms": small},
           {"visual_tokens": 4096, "seq_len": 4128, "median_ms": float(np.median(large)),
            "min_ms": min(large), "max_ms": max(large), "times_ms": large}]
    s = vlm_latency.summary(pts, cfg)
    lo, hi = s["speedup_ci95"]
    assert lo < s["speedup_measured"] < hi
    # narrower than the min/max range of the repeats (a CI of a median, not the extremes)
    assert s["speedup_range"][0] < lo and hi < s["speedup_range"][1]
    assert "bootstrap" in s["speedup_ci_method"]


def test_bootstrap_ci_covers_and_shrinks():
    rng = np.random.default_rng(1)
    few = list(rng.normal(5.0, 1.0, 10))
    many = list(rng.normal(5.0, 1.0, 400))
    lo1, hi1 = common.bootstrap_ci(few, np.median)
    lo2, hi2 = common.bootstrap_ci(many, np.median)
    assert lo1 < 5.0 < hi1 and lo2 < 5.0 < hi2
    assert hi2 - lo2 < hi1 - lo1


def test_time_rounds_interleaves_and_ratio_uses_rounds():
    calls: list[str] = []
    t = common.time_rounds({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                           rounds=4, warmup=1)
    assert calls == ["a", "b"] * 5                          # warm-up round, then interleaved
    assert len(t["a"]["rounds_ms"]) == 4 and t["a"]["repeats"] == 4
    t["a"]["rounds_ms"], t["b"]["rounds_ms"] = [2, 4, 6, 8], [1, 1, 2, 2]
    t["a"]["median_ms"], t["b"]["median_ms"] = 5.0, 1.5
    r = common.ratio(t, "a", "b")
    assert r["median_of_round_ratios"] == pytest.approx(3.5)   # median of 2, 4, 3, 4
    assert r["ci95"][0] <= 3.5 <= r["ci95"][1]


def test_staleness_follows_the_measured_sources(tmp_path, monkeypatch):
    root = tmp_path
    (root / "pkg").mkdir()
    (root / "pkg" / "a.py").write_text("x = 1\n")
    (root / "pkg" / "b.cu").write_text("// kernel\n")
    monkeypatch.setattr(common, "project_root", lambda: root)
    fp = common.source_fingerprint(["pkg"])
    assert fp["files"] == ["pkg/a.py", "pkg/b.cu"]
    record = {"hardware": {"git_commit": "0123456789abcdef", "git_dirty": False}, "sources": fp}
    now = common.staleness(record)
    assert now == {**now, "commit": "0123456", "stale": False, "label": "commit 0123456"}
    (root / "pkg" / "b.cu").write_text("// kernel, changed\n")
    later = common.staleness(json.loads(json.dumps(record)))
    assert later["stale"] and later["label"] == "commit 0123456 (stale)"
    assert common.staleness({"hardware": {"git_commit": "abc"}})["stale"]   # no fingerprint
