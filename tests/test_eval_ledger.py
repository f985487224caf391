"""Tests of the claims-ledger verdicts (fovea_book.eval.ledger)."""

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fovea_book.eval.ledger import NOT_MEASURED, Claim, judge, ledger_frame


def test_approx_point_estimates():
    # 1 deg of V1: seed 20 %, measured 7 %
    assert judge(20.0, 7.25) == "not confirmed (measured lower)"
    assert judge(15.0, 14.0, tol=0.1) == "confirmed"
    assert judge(15.0, 16.6, tol=0.1) == "not confirmed (measured higher)"


def test_approx_with_ci():
    assert judge(15.0, 14.0, 10.0, 20.0, tol=0.05) == "undecided"   # estimate outside the band
    assert judge(15.0, 15.2, 10.0, 20.0, tol=0.05) == "confirmed"
    assert judge(15.0, 30.0, 25.0, 35.0, tol=0.2) == "not confirmed (measured higher)"


def test_thresholds():
    assert judge(0.7, 0.75, 0.72, 0.78, mode="above") == "confirmed"
    assert judge(0.7, 0.5, 0.4, 0.6, mode="above") == "not confirmed"
    assert judge(0.7, 0.69, 0.6, 0.8, mode="above") == "undecided"
    assert judge(5.0, 3.0, mode="below") == "confirmed"
    assert judge(5.0, 8.0, mode="below") == "not confirmed"


def test_equivalence():
    assert judge(0.0, 0.01, -0.02, 0.03, mode="within", tol=0.05) == "confirmed"
    assert (judge(0.0, -0.2, -0.3, -0.1, mode="within", tol=0.05)
            == "not confirmed (measured lower)")
    assert judge(0.0, -0.04, -0.1, 0.02, mode="within", tol=0.05) == "undecided"


def test_missing_measurement_is_not_measured():
    assert judge(15.0, None) == NOT_MEASURED
    assert judge(15.0, float("nan"), 1.0, 2.0) == NOT_MEASURED


@pytest.mark.parametrize("kw", [dict(mode="bigger"), dict(tol=-1.0), dict(tol=float("nan"))])
def test_bad_arguments(kw):
    with pytest.raises(ValueError):
        judge(1.0, 1.0, **kw)


def test_bad_interval_and_prediction():
    with pytest.raises(ValueError, match="lo must be <= hi"):
        judge(1.0, 1.0, 2.0, 0.5)
    with pytest.raises(ValueError, match="predicted"):
        judge(float("inf"), 1.0)


@settings(max_examples=25, deadline=None)
@given(p=st.floats(-100, 100), est=st.floats(-100, 100), w=st.floats(0, 50),
       mode=st.sampled_from(["above", "below"]))
def test_threshold_verdicts_are_mirror_images(p, est, w, mode):
    """Reflecting everything through 0 swaps "above" and "below" (strict ties aside)."""
    lo, hi = est - w, est + w
    assume(not (math.isclose(lo, p) or math.isclose(hi, p)))   # strict ties aside
    other = "below" if mode == "above" else "above"
    assert judge(p, est, lo, hi, mode=mode) == judge(-p, -est, -hi, -lo, mode=other)


@settings(max_examples=25, deadline=None)
@given(est=st.floats(-1, 1), w=st.floats(0, 1), tol=st.floats(0, 1))
def test_wider_ci_never_turns_undecided_into_a_verdict(est, w, tol):
    """Widening the interval can only move a verdict towards "undecided"."""
    narrow = judge(0.0, est, est - w, est + w, mode="within", tol=tol)
    wide = judge(0.0, est, est - 2 * w - 0.1, est + 2 * w + 0.1, mode="within", tol=tol)
    assert narrow != "undecided" or wide == "undecided"


def test_ledger_frame():
    c = Claim("c", "seed", "20 %", "7.3 %", "% of V1", "02_cortex", "not confirmed")
    df = ledger_frame([c, c])
    assert list(df.columns) == ["claim", "source", "predicted", "measured", "unit", "where",
                                "verdict"]
    assert len(df) == 2 and df.verdict.iloc[0] == "not confirmed"
    with pytest.raises(ValueError):
        ledger_frame([])


def test_judge_gives_no_verdict_below_the_minimum_documents():
    from fovea_book.eval.ledger import judge

    assert judge(0.9, 0.95, 0.92, 0.98, tol=0.1, n_docs=5) == "too few documents (n = 5)"
    assert judge(0.9, 0.95, 0.92, 0.98, tol=0.1, n_docs=40) == "confirmed"


def test_benchmark_claims_judge_targets_and_mark_stale_figures(tmp_path):
    import json

    from fovea_book.bench.common import source_fingerprint
    from fovea_book.eval.ledger import benchmark_claims

    fresh = source_fingerprint(["fovea_core/sample.py"])
    rec = {"hardware": {"git_commit": "0123456789abcdef"}, "sources": fresh,
           "cpu": {"targets": {"e2e_kernel_le_2ms": {"target": 2.0, "measured": 1.5},
                               "torch_over_grid_sample_le_1.5": {"target": 1.5,
                                                                 "measured": 3.0}}}}
    (tmp_path / "sampling.json").write_text(json.dumps(rec))
    rows = {c.claim: c for c in benchmark_claims(tmp_path)}
    e2e = rows["CPU pyramid + gather of 273 tokens, 1024^2 (median)"]
    assert e2e.verdict == "confirmed" and "commit 0123456" in e2e.measured
    assert "(stale)" not in e2e.measured
    assert rows["torch sample / one grid_sample call"].verdict == "not confirmed"
    # the measured source changed since (a different fingerprint): marked stale
    rec["sources"] = dict(fresh, sha1="0" * 40)
    (tmp_path / "sampling.json").write_text(json.dumps(rec))
    assert all("(stale)" in c.measured for c in benchmark_claims(tmp_path))
    assert benchmark_claims(tmp_path / "nothing") == []
