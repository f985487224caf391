"""The protocol's statistics: minimum documents, Holm, the fixed split, sign-flip p-values."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fovea_core.eval.stats import (MIN_DOCS, holm, paired_diffs, paired_family,
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
