"""The chapters' glued sentences from the experiment kit (fovea_book.eval.experiments):
baselines_family / baselines_line, cost_line, equivalence_line, selected_line."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fovea_book.eval.experiments import (baselines_family, baselines_line, cost_line,
                                         equivalence_family, equivalence_line,
                                         select_then_report, selected_line)
from fovea_book.eval.stats import holm, paired_family


def _table(n_docs: int = 30, dataset: str = "synthetic") -> pd.DataFrame:
    """``v`` reads 0.2 more than ``a`` on every document, the same as ``b`` up to noise."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n_docs):
        base = dict(dataset=dataset, doc_id=f"d{i:03d}", qid="q0", budget=273)
        rows += [dict(base, allocator="a", anls=0.4 + 0.01 * rng.standard_normal()),
                 dict(base, allocator="b", anls=0.6 + 0.1 * rng.standard_normal()),
                 dict(base, allocator="v", anls=0.6 + 0.01 * rng.standard_normal())]
    return pd.DataFrame(rows)


def test_baselines_family_is_one_holm_family():
    t = _table()
    fam = baselines_family(t, "v", ["a", "b"], 273, seed=0)
    assert list(fam.baseline) == ["a", "b"] and set(fam.method) == {"v"}
    raw = pd.concat([paired_family(t, ["v"], b, 273, seed=0, correct=False)
                     for b in ("a", "b")], ignore_index=True)
    assert np.allclose(fam.p_holm, holm(raw.p.to_numpy()))
    assert list(fam.verdict) == ["better", "no detectable difference"]
    with pytest.raises(ValueError, match="baselines"):
        baselines_family(t, "v", [], 273)


def test_baselines_line_words_each_baseline():
    fam = baselines_family(_table(), "v", ["a", "b"], 273, seed=0)
    line = baselines_line(fam, "synthetic")
    a, b = fam.iloc[0], fam.iloc[1]
    assert line == (f"minus `a`: **better** ({a.text} ANLS points, n = 30); "
                    f"minus `b`: **no detectable difference** ({b.text} ANLS points, n = 30)")
    assert baselines_line(fam, "sroie") == "not measured (no SROIE data)"


def test_cost_line_labels_budgeted_and_unbudgeted():
    summary = pd.DataFrame([
        dict(dataset="synthetic", allocator="x", budget=273, total_tokens=400.0,
             unbudgeted=True),
        dict(dataset="sroie", allocator="x", budget=273, total_tokens=300.7, unbudgeted=False),
        dict(dataset="synthetic", allocator="x", budget=100, total_tokens=1.0,
             unbudgeted=False)])
    assert cost_line(summary, "x", "synthetic", 273) == (
        "400 tokens in all (median; unbudgeted: what it reads outside the budget exceeds N)")
    assert cost_line(summary, "x", "sroie", 273).startswith("300 tokens in all (median; "
                                                            "budgeted:")
    assert cost_line(summary, "y", "sroie", 273) == "not measured (no SROIE data)"
    assert cost_line(summary, "x", "sroie", 100, missing="-") == "-"


def test_equivalence_line():
    rng = np.random.default_rng(0)
    rows = []
    for i, d in enumerate(rng.normal(0.0, 0.01, 30)):
        base = dict(dataset="synthetic", doc_id=f"d{i:03d}", qid="q0")
        rows += [dict(base, allocator="g", budget=273, anls=0.5),
                 dict(base, allocator="c", budget=150, anls=0.5 + d)]
    eq = equivalence_family(pd.DataFrame(rows), [("c", 150, "g", 273)], 0.05)
    r = eq.iloc[0]
    assert equivalence_line(eq, "synthetic") == (
        f"`c` @ 150 minus `g` @ 273: **equivalent** ({r.text} ANLS points, n = 30)")
    assert equivalence_line(eq, "synthetic", label="the variant").startswith(
        "the variant @ 150 minus")
    assert equivalence_line(pd.DataFrame(columns=["dataset"]), "synthetic",
                            missing="not tested") == "not tested"


def test_selected_line():
    t = _table(40)
    sel = select_then_report(t, ["a", "v"], "b", 273, seed=0)
    r = sel.set_index("dataset").loc["synthetic"]
    assert r.best == "v"
    assert selected_line(sel, "synthetic") == (
        f"`v` (chosen on {r.n_select} documents), which on the other {r.n_docs} is "
        f"**{r.verdict}** compared with `resize` ({r.text} ANLS points)")
    assert selected_line(sel, "sroie").startswith("not measured")


def test_chapter_17_sentences():
    from fovea_book.eval.experiments import best_line, kept_ci_text, verdict_counts_line

    kept = pd.DataFrame([dict(dataset="synthetic", allocator="resize", kept=0.812,
                              kept_lo=0.736, kept_hi=0.874)]).set_index(["dataset", "allocator"])
    assert kept_ci_text(kept, "synthetic", "resize") == "81 % [74, 87]"
    with pytest.raises(KeyError, match="uniform"):
        kept_ci_text(kept, "synthetic", "uniform")
    counts = pd.DataFrame({"better": [3, 0], "worse": [0, 2],
                           "no detectable difference": [5, 1]}, index=["synthetic", "sroie"])
    assert verdict_counts_line(counts, "synthetic") == "3 better, 5 no detectable difference"
    assert verdict_counts_line(counts, "sroie") == "2 worse, 1 no detectable difference"
    assert verdict_counts_line(counts, "funsd") == "not measured (no data)"
    best = pd.DataFrame([dict(group="best budgeted", dataset="synthetic", best="topk",
                              total_tokens=290.4, kept=0.81, verdict="better",
                              text="+3.1 [0.5, 5.6]", n_docs=20)])
    assert best_line(best, "best budgeted", "synthetic") == (
        "`topk` (290 tokens in all; 81 % kept), **better** compared with `resize` on the "
        "report half (+3.1 [0.5, 5.6] points, n = 20)")
    assert best_line(best, "best unbudgeted", "synthetic") == "not measured"


def test_conditions_line():
    from fovea_book.eval.experiments import conditions_line

    fam = pd.DataFrame([dict(dataset="synthetic", wording=w, verdict=v, text=t, n_docs=30)
                        for w, v, t in (("default", "helps", "+2.0 [0.5, 3.1]"),
                                        ("heldout", "hurts", "-1.0 [-2.0, -0.1]"))])
    lead = "with the {} wording the prior"
    assert conditions_line(fam, "synthetic", ("default", "heldout"), column="wording",
                           lead=lead) == (
        "with the default wording the prior **helps** (+2.0 [0.5, 3.1] points, n = 30); "
        "with the heldout wording the prior **hurts** (-1.0 [-2.0, -0.1] points, n = 30)")
    assert conditions_line(fam, "sroie", ("default",), column="wording",
                           lead=lead) == "not measured (no SROIE data)"
