"""Benchmark plumbing: bootstrap CIs, interleaved timing, source fingerprints and staleness, and
the rule for records (default output in _build, --record gated by load and coverage)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from fovea_book.bench import common
from fovea_book.qwen_models import qwen_config


def test_speedup_interval_is_a_bootstrap_ci_over_repeats():
    from fovea_book.bench import vlm_latency

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


# ----------------------------------------------------------------------------- records
# Every test below runs against copies in tmp_path: common.results_dir / common.build_dir are
# monkeypatched, and the autouse guard fails a test that changed a real committed record.
from pathlib import Path  # noqa: E402

from fovea_book.bench.__main__ import main as bench_main  # noqa: E402
from fovea_book.paths import project_root  # noqa: E402

REAL = project_root() / "data" / "benchmarks"
#: the smallest allocator benchmark: 2 images of 128 px, 2 allocators, 1 repeat, 1 round
TINY = ["allocators", "--batch", "2", "--size", "128", "--budget", "16", "--repeats", "1",
        "--ref-rounds", "1", "--ref-images", "1", "--only", "uniform", "stratified"]


@pytest.fixture(autouse=True)
def _committed_records_untouched():
    before = {p.name: p.read_bytes() for p in REAL.glob("*.json")}
    yield
    after = {p.name: p.read_bytes() for p in REAL.glob("*.json")}
    assert after == before, "a test changed a committed record under data/benchmarks"


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """``(data, build)``: tmp stand-ins for data/benchmarks (holding copies of three
    committed records) and _build/benchmarks; the load average is quiet unless a test
    says otherwise."""
    data, build = tmp_path / "data", tmp_path / "build"
    data.mkdir()
    build.mkdir()
    for name in ("allocators.json", "sampling.json", "sampling_gpu.json"):
        (data / name).write_bytes((REAL / name).read_bytes())
    monkeypatch.setattr(common, "results_dir", lambda: data)
    monkeypatch.setattr(common, "build_dir", lambda: build, raising=False)
    monkeypatch.setattr(common, "_load_average", lambda: [0.05, 0.05, 0.05])
    return data, build


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_default_output_goes_to_build_and_leaves_the_committed_record(dirs):
    data, build = dirs
    committed = _snapshot(data)
    assert bench_main(TINY) == 0
    assert _snapshot(data) == committed                       # byte for byte
    rec = json.loads((build / "allocators.json").read_text())
    assert set(rec["allocators"]) == {"uniform", "stratified"}
    assert rec["args"]["size"] == 128 and "record" not in rec["args"]
    assert rec["load"]["before"] == [0.05] * 3 and rec["load"]["after"] == [0.05] * 3
    assert rec["load"]["cpu_count"] >= 1 and rec["loaded"] is False


def test_record_that_measured_less_is_refused_and_the_file_is_identical(dirs):
    data, build = dirs
    committed = _snapshot(data)
    with pytest.raises(common.BenchError) as err:
        bench_main([*TINY, "--record"])
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("refused to replace")
    assert re.search(r"\d+ of the old record's \d+ timings not measured "        # fewer
                     r"\(allocators\.adaptive_stratified, allocators\.atlas", msg)  # methods
    assert "config.image_size 128 (old 1024)" in msg                     # smaller workload
    assert "config.repeats 1 < 5" in msg                                 # fewer repeats
    assert err.value.code == msg                                         # exit status 1
    assert _snapshot(data) == committed
    assert (build / "allocators.json").exists()                          # not lost


def test_record_is_written_when_it_measured_as_much(dirs):
    data, build = dirs
    (data / "allocators.json").unlink()
    assert bench_main([*TINY, "--record"]) == 0                 # nothing to replace
    first = (data / "allocators.json").read_bytes()
    assert bench_main([*TINY, "--record"]) == 0                 # the same coverage again
    assert (data / "allocators.json").read_bytes() != first
    with pytest.raises(common.BenchError, match=r"--only lacks stratified"):
        bench_main([*TINY[:-1], "--record"])                   # one allocator fewer
    assert bench_main([*TINY, "--record", "--repeats", "2"]) == 0     # more repeats: fine
    with pytest.raises(common.BenchError, match=r"--repeats 1 < 2"):
        bench_main([*TINY, "--record"])                        # then fewer: refused


def test_gpu_only_without_a_gpu_exits_non_zero_and_writes_nothing(dirs, monkeypatch):
    from fovea_book.bench import sampling

    data, build = dirs
    committed = _snapshot(data)
    no_gpu = {"cuda": "no CUDA GPU (test)", "cpu": None, "pycuda": "no CUDA GPU (test)"}
    monkeypatch.setattr(sampling.K, "backend_status", lambda: no_gpu)
    for extra in ([], ["--record"]):
        with pytest.raises(SystemExit) as err:
            bench_main(["sampling", "--gpu-only", *extra])
        assert err.value.code not in (0, None)
        assert "--gpu-only" in str(err.value.code) and "no CUDA GPU" in str(err.value.code)
    assert _snapshot(data) == committed
    assert list(build.iterdir()) == []


def test_the_reproduced_stub_would_be_refused_against_the_h100_record():
    """Issue 21 item 6: the stub a CPU machine wrote over sampling_gpu.json measured less."""
    old = json.loads((REAL / "sampling_gpu.json").read_text())
    stub = {"benchmark": "sampling_gpu", "hardware": {"gpu": None},
            "backends": old["backends"], "targets_issue13": old["targets_issue13"],
            "gpu": {"measured": False, "reason": "torch sees no CUDA GPU"}}
    reasons = common.shortfalls(old, stub)
    assert reasons[0].startswith("no GPU (the old record was measured on NVIDIA")
    assert any("timings not measured" in r and "gpu.B1.timings." in r for r in reasons)
    assert common.shortfalls(old, old) == []


def test_shortfalls_fewer_rounds_options_and_workload():
    old = {"hardware": {"gpu": None}, "args": {"rounds": 60, "gpu_batches": [1, 64],
                                               "quick": False, "only": None, "size": 1024},
           "cpu": {"timings": {"a": {"median_ms": 1.0, "repeats": 60}}},
           "config": {"batch": 32}}
    same = json.loads(json.dumps(old))
    assert common.shortfalls(old, same) == []
    more = json.loads(json.dumps(old))
    more["args"].update(rounds=90, gpu_batches=[1, 8, 64])
    more["cpu"]["timings"]["a"]["repeats"] = 90
    more["cpu"]["timings"]["b"] = {"median_ms": 2.0, "repeats": 90}
    assert common.shortfalls(old, more) == []
    less = json.loads(json.dumps(old))
    less["args"].update(rounds=5, gpu_batches=[1], quick=True, only=["a"], size=256)
    less["cpu"]["timings"]["a"]["repeats"] = 5
    less["config"]["batch"] = 4
    text = " | ".join(common.shortfalls(old, less))
    for part in ("cpu.timings.a.repeats 5 < 60", "config.batch 4 (old 32)", "--rounds 5 < 60",
                 "--gpu-batches lacks 64", "--quick", "--only selects 1", "--size 256"):
        assert part in text
    # a stage named like a workload key ("side": side compute) is timed, not sized: its
    # timings may differ, its sizes may not
    staged = {"stages": {"side": {"median_ms": 30.4, "min_ms": 30.4, "pixels": 512}}}
    retimed = {"stages": {"side": {"median_ms": 28.7, "min_ms": 28.6, "pixels": 512}}}
    assert common.shortfalls(staged, retimed) == []
    resized = {"stages": {"side": {"median_ms": 30.4, "min_ms": 30.4, "pixels": 256}}}
    assert "stages.side.pixels 256 (old 512)" in common.shortfalls(staged, resized)[0]
    # runs in a list are matched by what they are, not by position; a flag that an older
    # record lacks counts as off
    runs = [{"model": "m", "device": "cpu", "points": [{"visual_tokens": n, "median_ms": 1.0,
                                                         "repeats": 5} for n in (273, 4096)]}]
    newer = [{**runs[0], "cuda_graph": False}, {**runs[0], "cuda_graph": True}]
    assert common.shortfalls({"runs": runs}, {"runs": newer[::-1]}) == []
    assert "runs.[model=m,device=cpu,cuda_graph=True].points.[visual_tokens=4096]" in \
        common.shortfalls({"runs": newer}, {"runs": runs})[0]


def test_bad_arguments_are_argparse_errors_naming_the_flag(capsys):
    from fovea_book.bench import allocators, sampling, vlm_latency

    cases = [(sampling.main, ["--rounds", "0"], "--rounds"),
             (sampling.main, ["--gpu-batches", "0"], "--gpu-batches"),
             (sampling.main, ["--gpu-batches"], "--gpu-batches"),
             (allocators.main, ["--size", "-16"], "--size"),
             (allocators.main, ["--budget", "300", "--size", "128"], "--budget"),
             (allocators.main, ["--only", "nosuch"], "--only"),
             (vlm_latency.main, ["--name", "../../x"], "--name"),
             (vlm_latency.main, ["--threads", "0"], "--threads")]
    for fn, argv, flag in cases:
        with pytest.raises(SystemExit) as err:
            fn(argv)
        assert err.value.code == 2, argv
        assert f"argument {flag}" in capsys.readouterr().err, argv


def test_per_round_ratios_on_a_fake_timer():
    durations = {"a": [2.0, 4.0, 6.0, 8.0], "b": [1.0, 1.0, 2.0, 2.0]}     # ms per round
    now, order = [0.0], []

    def clock() -> float:
        return now[0]

    def work(name: str, i=iter(range(8))):
        k = next(i)
        order.append(name)
        now[0] += durations[name][k // 2] / 1e3
    t = common.time_rounds({"a": lambda: work("a"), "b": lambda: work("b")}, rounds=4,
                           warmup=0, clock=clock)
    assert order == ["a", "b"] * 4
    assert t["a"]["rounds_ms"] == pytest.approx(durations["a"])
    assert t["b"]["rounds_ms"] == pytest.approx(durations["b"])
    r = common.ratio(t, "a", "b")                  # per-round ratios 2, 4, 3, 4
    assert r["min_of_round_ratios"] == pytest.approx(2.0)
    assert r["median_of_round_ratios"] == pytest.approx(3.5)
    assert r["ratio_of_medians"] == pytest.approx(5.0 / 1.5)
    assert r["ratio_of_minima"] == pytest.approx(2.0 / 1.0)       # each path's fastest round
    assert r["rounds"] == 4 and r["ci95"][0] <= 3.5 <= r["ci95"][1]
    with pytest.raises(ValueError, match="equal length"):
        common.round_ratios([1.0, 2.0], [1.0])


def test_high_load_refuses_a_record(dirs, monkeypatch):
    data, build = dirs
    (data / "allocators.json").unlink()                 # nothing to replace: only the load
    committed = _snapshot(data)
    monkeypatch.setattr(common, "_load_average", lambda: [1000.0, 900.0, 800.0])
    with pytest.raises(common.BenchError, match=r"--record refused before measuring: the "
                       r"machine was loaded \(1-minute load average 1000\.00 > \d+ cores\)"):
        bench_main([*TINY, "--record"])
    assert _snapshot(data) == committed and list(build.iterdir()) == []
    # quiet at the start, loaded by the end: refused at the end, kept in _build, marked
    calls = iter(range(100))
    monkeypatch.setattr(common, "_load_average",
                        lambda: [0.05] * 3 if next(calls) == 0 else [1000.0] * 3)
    with pytest.raises(common.BenchError, match=r"refused to replace .*loaded"):
        bench_main([*TINY, "--record"])
    assert _snapshot(data) == committed
    assert json.loads((build / "allocators.json").read_text())["loaded"] is True
    # without --record a loaded run is written to _build, marked loaded
    monkeypatch.setattr(common, "_load_average", lambda: [1000.0] * 3)
    (build / "allocators.json").unlink()
    assert bench_main(TINY) == 0
    assert json.loads((build / "allocators.json").read_text())["loaded"] is True
    assert _snapshot(data) == committed


def test_promote_goes_through_the_same_gate(dirs):
    data, build = dirs
    committed = _snapshot(data)
    assert bench_main(TINY) == 0
    with pytest.raises(common.BenchError, match="refused to replace"):      # measured less
        bench_main(["promote", str(build / "allocators.json")])
    assert _snapshot(data) == committed
    (data / "allocators.json").unlink()
    assert bench_main(["promote", str(build / "allocators.json")]) == 0
    assert (data / "allocators.json").read_bytes() == (build / "allocators.json").read_bytes()
    old_style = json.loads((REAL / "importance.json").read_text())
    old_style.pop("load", None)                                 # a record from before the rule
    old_style.pop("loaded", None)
    (build / "importance.json").write_text(json.dumps(old_style))
    with pytest.raises(common.BenchError, match="load average is unknown"):
        bench_main(["promote", str(build / "importance.json")])
    assert not (data / "importance.json").exists()
