"""The protocol's statistics: minimum documents, Holm, the fixed split, sign-flip p-values."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fovea_book.eval.stats import (MIN_DOCS, curve_budget_at, curve_kept_at, holm,
                                   paired_diffs, paired_family, prefill_flops, saving_factor,
                                   sign_flip_pvalue, split_halves, verdict)


def test_no_verdict_below_the_minimum_number_of_documents():
    assert MIN_DOCS == 20
    assert verdict(0.1, 0.3, 19) == "too few documents (n = 19)"
    assert verdict(0.1, 0.3, 20) == "better"
    assert verdict(-0.3, -0.1, 20) == "worse"
    # a significant CI but a Holm-adjusted p above alpha: no verdict word
    assert verdict(0.1, 0.3, 50, p=0.2) == "no detectable difference"
    assert verdict(0.1, 0.3, 50, p=0.01) == "better"
    assert verdict(0.1, 0.3, 50, better="agrees") == "agrees"


def test_holm_matches_a_hand_worked_example():
    # p = (0.01, 0.04, 0.03, 0.005), m = 4: sorted 0.005*4 = 0.02, 0.01*3 = 0.03,
    # 0.03*2 = 0.06, 0.04*1 = 0.04 -> monotone 0.06 (Holm 1979, step-down)
    adj = holm([0.01, 0.04, 0.03, 0.005])
    np.testing.assert_allclose(adj, [0.03, 0.06, 0.06, 0.02])
    assert np.isnan(holm([np.nan, 0.5])[0]) and holm([np.nan, 0.5])[1] == 0.5
    assert holm([0.9, 0.8]).max() <= 1.0


def test_split_halves_depends_only_on_the_id():
    ids = [f"doc{i:03d}" for i in range(200)]
    sel, rep = split_halves(ids)
    assert not set(sel) & set(rep) and set(sel) | set(rep) == set(ids)
    assert 70 < len(sel) < 130                                  # about half
    sel2, rep2 = split_halves(list(reversed(ids[:50])) + ["other"])
    assert set(sel2) - {"other"} == set(sel) & set(ids[:50])      # same id -> same half


def test_sign_flip_pvalue_is_calibrated_and_detects_shifts():
    rng = np.random.default_rng(0)
    null = [sign_flip_pvalue(rng.normal(size=25), n_perm=500, seed=i) for i in range(200)]
    assert 0.02 < np.mean(np.array(null) < 0.05) < 0.10            # ~5 % false positives
    assert sign_flip_pvalue(rng.normal(1.0, 1.0, size=25), n_perm=2000) < 0.01
    assert np.isnan(sign_flip_pvalue([]))


def _table(n_docs: int, shift: float, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for d in range(n_docs):
        for q in range(3):
            base = dict(dataset="syn", doc_id=f"d{d}", qid=f"q{q}")
            x = float(rng.random())
            rows += [dict(base, allocator="base", budget=100, anls=x),
                     dict(base, allocator="up", budget=100, anls=min(1.0, x + shift)),
                     dict(base, allocator="noise", budget=100, anls=float(rng.random())),
                     dict(base, allocator="full", budget=4096, anls=1.0)]
    return pd.DataFrame(rows)


def test_paired_family_verdicts_and_correction():
    t = _table(40, 0.2)
    fam = paired_family(t, ["up", "noise", "missing"], "base", 100).set_index("method")
    assert fam.loc["up", "verdict"] == "better" and fam.loc["up", "n_docs"] == 40
    assert fam.loc["up", "p_holm"] >= fam.loc["up", "p"]
    assert fam.loc["noise", "verdict"] == "no detectable difference"
    assert "missing" not in fam.index
    few = paired_family(_table(8, 0.2), ["up"], "base", 100)
    assert few.verdict.iloc[0] == "too few documents (n = 8)"
    # restricting to the report half uses only those documents
    _, rep = split_halves(t.doc_id)
    half = paired_family(t, ["up"], "base", 100, docs=rep)
    assert half.n_docs.iloc[0] == len(rep)
    # against full: its own budget is paired with the method's budget
    d = paired_diffs(t, "up", "full", budget=100)
    assert len(d) == 40 and (d["diff"] <= 0).all()
    with pytest.raises(ValueError, match="baseline"):
        paired_family(t, ["up"], "nope", 100)


# ----------------------------------------------------------------------------- resize curve
BUDGETS = np.array([273, 400, 576, 1024, 1600, 2304, 4096], float)


def _log_linear(n, a=0.1, b=0.12):
    """A curve linear in log2 N: piecewise-linear interpolation in log N is exact on it."""
    return a + b * np.log2(np.asarray(n, float) / 273)


def test_curve_interpolation_is_piecewise_linear_in_log_n():
    # two points (100, 0.2), (400, 0.6): half way in log N is N = 200, kept 0.4
    np.testing.assert_allclose(curve_kept_at([100, 400], [0.2, 0.6], 200), 0.4)
    np.testing.assert_allclose(curve_kept_at([100, 400], [[0.2, 0.6], [0.0, 1.0]], [100, 200]),
                               [[0.2, 0.4], [0.0, 0.5]])
    n, cens = curve_budget_at([100, 400], [0.2, 0.6], 0.4)
    assert cens[0] == 0 and n[0] == pytest.approx(200)
    np.testing.assert_allclose(curve_kept_at(BUDGETS, _log_linear(BUDGETS), 800), _log_linear(800))
    with pytest.raises(ValueError, match="range"):
        curve_kept_at([100, 400], [0.2, 0.6], 50)
    with pytest.raises(ValueError, match="increasing"):
        curve_kept_at([400, 100], [0.2, 0.6], 200)


def test_the_first_crossing_of_a_non_monotone_curve():
    # the curve reaches 0.5 between 200 and 400 first (again later): the first crossing counts
    n, cens = curve_budget_at([100, 200, 400, 800], [0.2, 0.4, 0.6, 0.45], 0.5)
    assert cens[0] == 0 and n[0] == pytest.approx(200 * 2**0.5)


@pytest.mark.parametrize("true_factor", [1.3, 2.0, 3.5, 7.25])
def test_saving_factor_recovers_a_known_factor(true_factor):
    rng = np.random.default_rng(1)
    d = 30
    off = rng.normal(0, 0.05, size=(d, 1))                    # per-document level, shared
    curve = _log_linear(BUDGETS)[None] + off
    method = _log_linear(273 * true_factor) + off[:, 0]
    f, lo, hi, det = saving_factor(BUDGETS, curve, 273, method)
    # paired: every resample's offsets cancel, so even the CI is the truth
    assert f == pytest.approx(true_factor) and det["censored"] is None
    assert lo == pytest.approx(true_factor) and hi == pytest.approx(true_factor)
    assert det["n_star"] == pytest.approx(273 * true_factor) and det["ci_method"] == "percentile"


def test_saving_factor_ci_contains_the_truth_with_noise():
    rng = np.random.default_rng(2)
    d, true_factor = 40, 3.0
    off = rng.normal(0, 0.05, size=(d, 1))                    # per-document level, shared
    e = rng.normal(0, 0.02, size=(d, len(BUDGETS)))
    u = rng.normal(0, 0.03, size=d)
    # zero-mean noise, so the mean curve and the method's mean cross exactly at 3 x 273
    curve = _log_linear(BUDGETS)[None] + off + e - e.mean(0)
    method = _log_linear(273 * true_factor) + off[:, 0] + u - u.mean()
    f, lo, hi, det = saving_factor(BUDGETS, curve, 273, method)
    assert f == pytest.approx(true_factor, rel=1e-9)
    assert lo < true_factor < hi and hi - lo > 0.05            # a real interval around it
    # unpaired noise widens it: the paired CI is tighter than shuffling the method's rows
    _, lo2, hi2, _ = saving_factor(BUDGETS, curve, 273, rng.permutation(method))
    assert hi2 - lo2 > hi - lo


def test_censored_factors_are_flagged_not_invented():
    d = 25
    curve = np.tile(_log_linear(BUDGETS), (d, 1))
    above = np.full(d, _log_linear(BUDGETS[-1]) + 0.05)       # beats the full-resolution end
    f, lo, hi, det = saving_factor(BUDGETS, curve, 273, above)
    assert np.isnan(f) and det["censored"] == "above"
    assert det["bound"] == pytest.approx(4096 / 273) and det["text"] == ">= 15.0x"
    assert hi == np.inf and det["boot_above"] == 1.0
    below = np.full(d, _log_linear(273) - 0.01)                 # below the curve's first point
    f, lo, hi, det = saving_factor(BUDGETS, curve, 273, below)
    assert np.isnan(f) and det["censored"] == "below" and det["text"] == "<= 1.0x"
    assert det["bound"] == pytest.approx(1.0) and lo == 0.0
    # a method at a smaller N: the bound is min_N / N
    f, _, _, det = saving_factor(BUDGETS, curve, 136.5, below)
    assert det["bound"] == pytest.approx(2.0)


def test_saving_factor_bad_input():
    curve = np.tile(_log_linear(BUDGETS), (5, 1))
    m = np.full(5, 0.3)
    with pytest.raises(ValueError, match="method_kept"):
        saving_factor(BUDGETS, curve, 273, m[:4])
    with pytest.raises(ValueError, match="curve_kept"):
        saving_factor(BUDGETS, curve[:, :3], 273, m)
    with pytest.raises(ValueError, match="curve_kept"):
        saving_factor(BUDGETS, np.where(curve > 0.3, np.nan, curve), 273, m)
    with pytest.raises(ValueError, match="method_budget"):
        saving_factor(BUDGETS, curve, 0, m)
    with pytest.raises(ValueError, match="curve_budgets"):
        saving_factor(BUDGETS[::-1], curve, 273, m)
    with pytest.raises(ValueError, match="n_boot"):
        saving_factor(BUDGETS, curve, 273, m, n_boot=10)


# ----------------------------------------------------------------------------- compute view
def test_prefill_flops_is_chapter_15s_count():
    pytest.importorskip("transformers")
    from fovea_book.bench.vlm_latency import TEXT_AFTER, TEXT_BEFORE
    from fovea_book.qwen_models import lm_prefill_flops, qwen_config

    tc = qwen_config("qwen2-vl-2b").text_config
    text = TEXT_BEFORE + TEXT_AFTER
    got = prefill_flops([273, 4096])
    want = [lm_prefill_flops(tc, n + text)["total"] for n in (273, 4096)]
    np.testing.assert_allclose(got, want)
    assert float(prefill_flops(273, n_text=0)) < float(got[0]) < float(got[1])
    assert prefill_flops(np.array([[273]])).shape == (1, 1)
    for bad in (-1, 2.5, float("nan")):
        with pytest.raises(ValueError, match="n_visual"):
            prefill_flops(bad)
    with pytest.raises(ValueError, match="n_text"):
        prefill_flops(273, n_text=-3)


def test_target_verdict_reads_the_ci_against_the_bar():
    from fovea_book.eval.stats import target_verdict

    assert target_verdict(0.72, 0.80, 0.70, 30) == "met"
    assert target_verdict(0.50, 0.69, 0.70, 30) == "not met"
    assert target_verdict(0.65, 0.75, 0.70, 30) == "undecided"
    assert target_verdict(0.65, float("inf"), 0.70, 30) == "undecided"
    assert target_verdict(0.01, 0.04, 0.05, 30, at_most=True) == "met"        # a gap <= 5
    assert target_verdict(0.06, 0.20, 0.05, 30, at_most=True) == "not met"
    assert target_verdict(0.02, 0.08, 0.05, 30, at_most=True) == "undecided"
    assert target_verdict(0.9, 1.0, 0.7, 12) == "too few documents (n = 12)"
    with pytest.raises(ValueError, match="lo must be <= hi"):
        target_verdict(0.8, 0.7, 0.7, 30)


def test_target_row_formats_and_judges():
    from fovea_book.eval.stats import target_row

    r = target_row("kept >= 70 %", 0.81, 0.74, 0.87, 0.70, 40)
    assert r == dict(target="kept >= 70 %", measured="81 % [74, 87] (n = 40)", verdict="met")
    r = target_row("factor >= 3x", float("nan"), 2.5, float("inf"), 3.0, 35, scale=1, unit="x",
                   digits=1)
    assert r["measured"] == "n/a [2.5, inf] (n = 35)" and r["verdict"] == "undecided"


# ----------------------------------------------------------------------------- chosen family
def test_report_or_all_is_the_report_half_or_everything():
    from fovea_book.eval.stats import report_or_all

    ids = [f"d{i}" for i in range(30)]
    sel, rep = split_halves(ids)
    assert sel and rep and report_or_all(ids) == rep
    only_select = sel[:3]                       # no report-half document: all, in their order
    assert report_or_all(only_select[::-1]) == only_select[::-1]


def test_family_with_chosen_tests_the_choice_on_its_report_half_in_one_holm_family():
    from fovea_book.eval.stats import family_with_chosen

    t = _table(80, 0.2)
    fam = family_with_chosen(t, ["noise"], {"syn": "up", "absent": "up"}, "base", 100,
                             prefix="best: ")
    f = fam.set_index("method")
    assert list(f.index) == ["noise", "best: up"]          # no row for an absent dataset
    _, rep = split_halves(t.doc_id)
    assert f.loc["noise", "n_docs"] == 80 and f.loc["best: up", "n_docs"] == len(rep) >= 20
    alone = paired_family(t, ["up"], "base", 100, docs=rep, correct=False)
    assert f.loc["best: up", "diff"] == pytest.approx(alone["diff"].iloc[0])
    np.testing.assert_allclose(fam.p_holm, holm(fam.p.to_numpy()))   # one family
    assert f.loc["best: up", "verdict"] == "better"
    assert f.loc["noise", "verdict"] == "no detectable difference"
    with pytest.raises(TypeError, match="methods"):
        family_with_chosen(t, "noise", {}, "base", 100)
