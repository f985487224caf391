"""Tests of fovea_book.eval.experiments (shared set-up of the experiment chapters)."""


import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from fovea_core import build_pyramid
from fovea_core.allocators.base import cell_centers
from fovea_book.eval.foveal_ratio import foveal_ratio_pyramid
from fovea_book.eval import experiments
from fovea_book.eval.experiments import ci_text, footprint_coverage, load_datasets, verdict
from fovea_core.tokens import TokenSet


def test_foveal_ratio_is_an_allocator_still_importable_from_experiments():
    """It moved to ``fovea_core.allocators`` (issue 21 item 4); chapter 09 imports it from
    ``eval.experiments``, and it stays out of the registry, as before."""
    from fovea_core.methods import ALLOCATORS

    assert experiments.foveal_ratio_pyramid is foveal_ratio_pyramid
    assert foveal_ratio_pyramid.__module__ == "fovea_book.eval.foveal_ratio"
    assert foveal_ratio_pyramid not in ALLOCATORS.values()


def _pyr(b=1, h=256, w=192, seed=0):
    rng = np.random.default_rng(seed)
    return build_pyramid(torch.from_numpy(rng.random((b, 3, h, w), dtype=np.float32)))


def _scores(pyr, seed=0):
    gh, gw = pyr.grid_shape(16, 0)
    return torch.from_numpy(np.random.default_rng(seed).random((pyr.batch_size, gh, gw),
                                                                dtype=np.float32))


@settings(max_examples=25, deadline=None)
@given(ratio=st.floats(0.0, 1.0), budget=st.integers(1, 150), fx=st.floats(0, 1),
       fy=st.floats(0, 1))
def test_foveal_ratio_exact_budget_and_share(ratio, budget, fx, fy):
    pyr = _pyr()
    tok = foveal_ratio_pyramid(pyr, _scores(pyr), budget, ratio=ratio, fixation=(fx, fy))
    assert tok.budget == budget
    assert bool(tok.is_distinct().all())
    n0 = int(round(ratio * budget))
    # the fovea is exactly n0 level-0 tokens when the periphery can hold the rest; extra
    # level-0 tokens only come from the shortfall fill
    assert int((tok.levels[0] == 0).sum()) >= n0


def test_foveal_ratio_fovea_is_nearest_cells():
    pyr = _pyr(h=320, w=320)
    fix = torch.tensor([0.3, 0.6])
    tok = foveal_ratio_pyramid(pyr, _scores(pyr), 100, ratio=0.4, fixation=fix)
    lv0 = tok.levels[0] == 0
    assert int(lv0.sum()) == 40
    # every level-0 cell nearer the fixation than the farthest foveal token is in the fovea
    ecc_tok = ((tok.centers[0][lv0] - fix) * 320 / 16).norm(dim=-1)
    all_c = cell_centers(pyr.grid_shape(16, 0), 0, (320, 320))
    ecc_all = ((all_c - fix) * 320 / 16).norm(dim=-1)
    assert int((ecc_all < ecc_tok.max() - 1e-6).sum()) <= 40
    # coarse tokens lie outside the fovea disc
    ecc_coarse = ((tok.centers[0][~lv0] - fix) * 320 / 16).norm(dim=-1)
    assert float(ecc_coarse.min()) > float(ecc_tok.max())


def test_foveal_ratio_batch_equals_loop():
    pyr = _pyr(b=3)
    s = _scores(pyr)
    tb = foveal_ratio_pyramid(pyr, s, 60, ratio=0.3)
    for i in range(3):
        ti = foveal_ratio_pyramid(build_pyramid(pyr.base[i:i + 1]), s[i:i + 1], 60, ratio=0.3)
        assert torch.equal(tb.keys()[i], ti.keys()[0])


@pytest.mark.parametrize("kw", [dict(ratio=1.5), dict(ratio=-0.1), dict(max_level=0)])
def test_foveal_ratio_rejects_bad_arguments(kw):
    pyr = _pyr()
    with pytest.raises(ValueError, match="ratio|max_level"):
        foveal_ratio_pyramid(pyr, _scores(pyr), 50, **kw)


def test_footprint_coverage_known_areas():
    full = TokenSet.from_grid(torch.arange(4).repeat_interleave(4)[None],
                              torch.arange(4).repeat(4)[None], 0, image_size=(64, 64))
    assert float(footprint_coverage(full)[0]) == 1.0
    one = TokenSet.from_grid(torch.tensor([[0]]), torch.tensor([[0]]), 1, image_size=(64, 64))
    assert float(footprint_coverage(one)[0]) == pytest.approx(0.25)   # 32x32 of 64x64
    with pytest.raises(ValueError, match="resolution"):
        footprint_coverage(one, resolution=0)


def test_verdict_and_ci_text():
    assert verdict(0.01, 0.2, 40) == "better"
    assert verdict(-0.3, -0.1, 40) == "worse"
    assert verdict(-0.1, 0.1, 40) == "no detectable difference"
    assert verdict(float("nan"), 0.1, 40, same="n/a") == "n/a"
    assert verdict(0.01, 0.2, 6) == "too few documents (n = 6)"
    with pytest.raises(ValueError):
        verdict(0.2, 0.1, 40)
    assert ci_text(0.031, 0.005, 0.056) == "+3.1 [0.5, 5.6]"


def test_load_datasets_missing_receipts_gives_message(tmp_path):
    data, msg = load_datasets(1, 3, data_dir=tmp_path, cache_dir=None)
    assert list(data) == ["synthetic"] and len(data["synthetic"]) == 1
    assert "SROIE skipped" in msg and "not found" in msg
    data, msg = load_datasets(1, 0, cache_dir=None)
    assert list(data) == ["synthetic"] and "n_receipts = 0" in msg
    with pytest.raises(ValueError, match="n_synthetic"):
        load_datasets(0, 0)


def _fake_table(n_docs=6, seed=0):
    """A run_sweep-shaped table: 'good' reads every answer, 'bad' half of them."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    rows = []
    for d in range(n_docs):
        for q in range(3):
            base = dict(dataset="synthetic", doc_id=f"d{d}", qid=f"q{q}", ceiling_anls=1.0,
                        em=0.0, strata_cov=1.0, empty_disc_frac=0.0, alloc_ms=1.0)
            rows.append(dict(base, allocator="full", budget=4096, anls=1.0))
            rows.append(dict(base, allocator="good", budget=100, anls=1.0))
            rows.append(dict(base, allocator="bad", budget=100, anls=float(rng.random() < 0.5)))
            rows.append(dict(base, allocator="same", budget=100, anls=1.0))
    return pd.DataFrame(rows)


def test_table_helpers_on_a_known_table():
    from fovea_book.eval.experiments import ci_table, paired_vs, predicted_vs_measured
    from fovea_book.eval.sweep import summarize

    table = _fake_table(n_docs=24)
    summary = summarize(table, n_boot=200)
    view = ci_table(summary, [100])
    assert list(view.columns) == ["100", "all"]
    assert view.loc[("synthetic", "good"), "100"] == "1.00 [1.00, 1.00]"
    assert view.loc[("synthetic", "full"), "all"] == "1.00 [1.00, 1.00]"
    pv = paired_vs(table, ["bad", "same", "missing"], "good", 100).set_index("method")
    assert pv.loc["bad", "verdict"] == "worse" and pv.loc["bad", "diff"] < 0
    assert pv.loc["same", "verdict"] == "no detectable difference"
    assert "missing" not in pv.index
    few = paired_vs(_fake_table(n_docs=6), ["bad"], "good", 100).set_index("method")
    assert few.loc["bad", "verdict"] == "too few documents (n = 6)"
    pm = predicted_vs_measured(summary, {"good": 81.3, "bad": None, "nope": 1.0}, 100)
    assert pm.loc["good"].iloc[0] == "81.3" and pm.loc["bad"].iloc[0] == "none given"
    assert pm.loc["good"].iloc[1].startswith("100.0") and pm.loc["nope"].iloc[1] == "n/a"


def _diff_table(diffs, *, a="cand", n_a=150, b="grid", n_b=273, dataset="synthetic"):
    """Two methods on ``len(diffs)`` documents, one question each: ``b`` reads 0.5, ``a``
    reads ``0.5 + diff`` (so the per-document paired difference is ``diff``)."""
    import pandas as pd

    rows = []
    for i, d in enumerate(diffs):
        base = dict(dataset=dataset, doc_id=f"doc{i:03d}", qid="q0")
        rows.append(dict(base, allocator=b, budget=n_b, anls=0.5))
        rows.append(dict(base, allocator=a, budget=n_a, anls=0.5 + d))
    return pd.DataFrame(rows)


def test_equivalence_family_words_follow_the_margin():
    from fovea_book.eval.experiments import equivalence_family

    rng = np.random.default_rng(0)
    pair = [("cand", 150, "grid", 273)]
    tiny = _diff_table(rng.normal(0.0, 0.01, 40))          # |diff| << margin: equivalent
    out = equivalence_family(tiny, pair, 0.05).iloc[0]
    assert out.verdict == "equivalent" and out.p_tost_holm < 0.05 and out.n_docs == 40
    short = _diff_table(rng.normal(-0.2, 0.02, 40))        # far below: a detectable shortfall
    out = equivalence_family(short, pair, 0.05).iloc[0]
    assert out.verdict == "below" and out["diff"] < -0.15 and out.p_tost_holm > 0.5
    noisy = _diff_table(rng.normal(0.0, 0.3, 40))          # wide CI around 0: inconclusive
    assert equivalence_family(noisy, pair, 0.05).iloc[0].verdict == "inconclusive"
    few = _diff_table(rng.normal(0.0, 0.01, 8))
    assert equivalence_family(few, pair, 0.05).iloc[0].verdict == "too few documents (n = 8)"
    # the budgets are part of the pair: a pair at a budget that did not run is skipped
    with pytest.raises(ValueError, match="none of the pairs"):
        equivalence_family(tiny, [("cand", 273, "grid", 273)], 0.05)
    with pytest.raises(ValueError, match="margin"):
        equivalence_family(tiny, pair, 0.0)


def test_equivalence_family_holm_counts_the_family():
    import pandas as pd

    from fovea_book.eval.experiments import equivalence_family

    rng = np.random.default_rng(1)
    t = pd.concat([_diff_table(rng.normal(0.03, 0.02, 25)),
                   _diff_table(rng.normal(0.03, 0.02, 25), dataset="sroie")])
    one = equivalence_family(t[t.dataset == "synthetic"], [("cand", 150, "grid", 273)], 0.05)
    two = equivalence_family(t, [("cand", 150, "grid", 273)], 0.05)
    assert len(two) == 2
    syn = two.set_index("dataset").loc["synthetic"]
    assert syn.p_tost_holm >= one.iloc[0].p_tost - 1e-12     # correction never lowers a p
    raw = equivalence_family(t, [("cand", 150, "grid", 273)], 0.05, correct=False)
    assert np.allclose(raw.p_tost_holm, raw.p_tost)


def test_choose_on_select_half_and_report_half():
    import pandas as pd

    from fovea_book.eval.documents import Document
    from fovea_book.eval.experiments import choose_on_select_half, report_half
    from fovea_book.eval.stats import split_halves

    ids = [f"doc{i:03d}" for i in range(30)]
    sel, rep = split_halves(ids)
    rows = []
    for d in ids:   # "a" wins on the select half only, "b" on the report half only
        a, b = (0.9, 0.1) if d in sel else (0.1, 0.9)
        rows += [dict(dataset="synthetic", doc_id=d, qid="q", allocator="a", budget=10, anls=a),
                 dict(dataset="synthetic", doc_id=d, qid="q", allocator="b", budget=10, anls=b)]
    ch = choose_on_select_half(pd.DataFrame(rows), ["a", "b", "absent"], 10).iloc[0]
    assert ch.best == "a" and ch.n_select == len(sel) and ch.select_mean == pytest.approx(0.9)
    docs = [Document(doc_id=d, image=np.zeros((16, 16, 3), np.uint8), questions=())
            for d in ids]
    half = report_half({"synthetic": docs})["synthetic"]
    assert [d.doc_id for d in half] == rep


def _select_table(scores, *, n_docs=30, budget=10, dataset="synthetic"):
    """One question per document; ``scores[name] = (on select half, on report half)``."""
    import pandas as pd

    from fovea_book.eval.stats import split_halves

    ids = [f"doc{i:03d}" for i in range(n_docs)]
    sel, _ = split_halves(ids)
    return pd.DataFrame([dict(dataset=dataset, doc_id=d, qid="q", allocator=name,
                              budget=budget, anls=s[0] if d in sel else s[1])
                         for d in ids for name, s in scores.items()])


@pytest.mark.parametrize("order", [["b", "a", "c"], ["a", "b", "c"], ["c", "b", "a"]])
def test_choose_on_select_half_tie_goes_to_the_candidate_listed_first(order):
    """Equal select-half means: the first of them in ``candidates`` wins, whatever the
    alphabet says (the old copies gave it to the alphabetical first); a lower one never."""
    from fovea_book.eval.experiments import choose_on_select_half, select_then_report

    t = _select_table({"a": (0.5, 0.9), "b": (0.5, 0.1), "c": (0.4, 1.0), "base": (0.3, 0.3)})
    tied = [c for c in order if c in ("a", "b")]
    ch = choose_on_select_half(t, order, 10).iloc[0]
    assert ch.best == tied[0] and ch.select_mean == pytest.approx(0.5)
    assert list(ch.index[4:]) == order                   # one column per candidate, in order
    # select_then_report chooses with the same rule
    assert select_then_report(t, order, "base", 10).iloc[0].best == tied[0]


def test_choose_on_select_half_skips_nan_and_absent_and_checks_arguments():
    import pandas as pd

    from fovea_book.eval.experiments import choose_on_select_half

    t = _select_table({"a": (float("nan"), 1.0), "b": (0.2, 0.0)})
    # "a" has no finite select-half mean: never chosen, even listed first
    ch = choose_on_select_half(t, ["a", "b", "gone"], 10).iloc[0]
    assert ch.best == "b" and np.isnan(ch["a"]) and np.isnan(ch["gone"])
    # nothing at this budget, or only NaN: no row for the dataset (columns kept)
    none = choose_on_select_half(t, ["a"], 10)
    assert none.empty and list(none.columns) == ["dataset", "best", "select_mean",
                                                 "n_select", "a"]
    assert choose_on_select_half(t, ["b"], 99).empty
    # datasets are chosen separately, in sorted order
    two = pd.concat([_select_table({"a": (0.9, 0), "b": (0.1, 0)}, dataset="sroie"),
                     _select_table({"a": (0.1, 0), "b": (0.9, 0)})])
    assert list(choose_on_select_half(two, ["a", "b"], 10).best) == ["a", "b"]
    with pytest.raises(TypeError, match="candidates"):
        choose_on_select_half(t, "ab", 10)
    with pytest.raises(ValueError, match="candidates is empty"):
        choose_on_select_half(t, [], 10)
    with pytest.raises(ValueError, match="kept"):
        choose_on_select_half(t, ["a"], 10, metric="kept")


def test_chosen_line_says_each_case():
    import pandas as pd

    from fovea_book.eval.experiments import chosen_line

    chosen = pd.DataFrame([dict(dataset="synthetic", best="pyramid 70/30", select_mean=0.5,
                                n_select=np.int64(12))])
    rep = pd.DataFrame([dict(dataset="synthetic", method="chosen split", n_docs=20,
                             verdict="no detectable difference", text="+1.2 [-0.3, 2.7]")])
    assert chosen_line(chosen, "synthetic", rep) == (
        "`pyramid 70/30` (chosen on 12 documents); on the 20 report-half documents, minus "
        "`resize`: **no detectable difference** (+1.2 [-0.3, 2.7] ANLS points)")
    assert chosen_line(chosen, "synthetic", rep, note="`atlas` = 24", baseline="topk",
                       unit="points") == (
        "`pyramid 70/30` (`atlas` = 24; chosen on 12 documents); on the 20 report-half "
        "documents, minus `topk`: **no detectable difference** (+1.2 [-0.3, 2.7] points)")
    assert chosen_line(chosen, "synthetic", rep.iloc[:0]) == (
        "`pyramid 70/30` (chosen on 12 documents); not tested (no report-half document)")
    assert chosen_line(chosen, "synthetic", None).endswith("not tested (no report-half document)")
    assert chosen_line(chosen, "synthetic", rep, result="**equivalent**") == (
        "`pyramid 70/30` (chosen on 12 documents): **equivalent**")
    assert chosen_line(chosen, "sroie", rep) == (
        "not chosen (no ablation document in the select half)")
    assert chosen_line(chosen.iloc[:0], "sroie", what="variant") == (
        "not chosen (no variant document in the select half)")
    assert chosen_line(chosen, "sroie", measured=False) == "not measured (no SROIE data)"
    with pytest.raises(ValueError, match="report has 2 rows"):
        chosen_line(chosen, "synthetic", pd.concat([rep, rep]))
    with pytest.raises(ValueError, match="chosen has 2 rows"):
        chosen_line(pd.concat([chosen, chosen]), "synthetic", rep)


def test_relabel_exact_then_first_matching_pattern():
    import pandas as pd

    from fovea_book.eval.experiments import relabel

    t = pd.DataFrame(dict(allocator=["pseudo_logpolar_centres((0.1, 0.2),)", "pseudo_logpolar",
                                     "resize", "pyramid_level_budget64", "hybrid"],
                          anls=[0.1, 0.2, 0.3, 0.4, 0.5]))
    out = relabel(t, {"pseudo_logpolar_centres*": "pseudo_logpolar",
                      "pseudo_logpolar": "pseudo_logpolar_init",
                      "pseudo_*": "never (an earlier key matched)",
                      "pyramid_level_budget64": "pyramid 64", "h?brid": "hybrid!"})
    assert list(out.allocator) == ["pseudo_logpolar", "pseudo_logpolar_init", "resize",
                                   "pyramid 64", "hybrid!"]
    assert list(out.anls) == list(t.anls) and t.allocator[0].startswith("pseudo_logpolar_c")
    m = relabel(t.rename(columns={"allocator": "method"}), {"resize": "r"}, column="method")
    assert list(m.method)[2] == "r"
    with pytest.raises(ValueError, match="no column 'method'"):
        relabel(t, {}, column="method")


def test_loaded_datasets_are_cached_exactly(tmp_path, monkeypatch):
    """The second load reads the cache (no page is drawn again) and gives the same documents
    byte for byte; other arguments are another entry; ``cache_dir=None`` never caches."""
    import fovea_book.eval.experiments as ex

    first, msg = load_datasets(2, 0, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.pkl"))) == 1
    monkeypatch.setattr(ex, "synthetic_documents", lambda *a, **k: pytest.fail("drawn again"))
    again, msg2 = load_datasets(2, 0, cache_dir=tmp_path)
    assert msg2 == msg
    for a, b in zip(first["synthetic"], again["synthetic"], strict=True):
        assert (a.doc_id, a.questions, a.elements, a.source) == \
            (b.doc_id, b.questions, b.elements, b.source)
        assert a.image.dtype == b.image.dtype and np.array_equal(a.image, b.image)
    with pytest.raises(pytest.fail.Exception, match="drawn again"):
        load_datasets(2, 0, cache_dir=tmp_path, wording="heldout")
    with pytest.raises(pytest.fail.Exception, match="drawn again"):
        load_datasets(2, 0, cache_dir=None)
