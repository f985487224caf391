"""Reading benchmark records for chapter 05 (fovea_core.eval.benchreport) and its figure."""

from __future__ import annotations

import json
import math

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from fovea_core.eval.benchreport import (ratio_ci_text, ratio_value, read_record,  # noqa: E402
                                         target_word)
from fovea_core.plotting import timing_bars  # noqa: E402

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
