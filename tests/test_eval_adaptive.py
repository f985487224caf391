"""Adaptive budgets against fixed ones (fovea_book.eval.adaptive) and the one bucket rule
(fovea_core.allocators.wrappers.bucket_budgets)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from fovea_core import build_pyramid
from fovea_core.methods import allocate
from fovea_core.allocators.wrappers import bucket_budgets
from fovea_book.eval.adaptive import (adaptive_family, adaptive_line, adaptive_table,
                                      bucket_assignments, fixed_rows, mean_budgets,
                                      page_complexity, threshold_rules)
from fovea_book.eval.document_types import Document, Question


def test_bucket_budgets_is_the_rule_adaptive_budget_applies():
    c = torch.tensor([0.0, 0.25, 0.2499, 0.5, 0.74, 0.75, 1.0])
    assert bucket_budgets(c).tolist() == [180, 273, 180, 365, 365, 456, 456]
    assert bucket_budgets(c, 100).tolist() == [66, 100, 66, 134, 134, 167, 167]
    assert bucket_budgets(c, 273, 300).tolist() == [180, 273, 180, 300, 300, 300, 300]
    per = torch.tensor([500, 200, 500, 500, 500, 500, 100])
    assert bucket_budgets(c, 273, per).tolist() == [180, 200, 180, 365, 365, 456, 100]
    with pytest.raises(ValueError, match="thresholds"):
        bucket_budgets(c, thresholds=(0.5,))
    pyr = build_pyramid(torch.rand(len(c), 3, 256, 256))
    for budget in (40, 100):
        res = allocate("adaptive_budget", pyr, torch.rand(len(c), 16, 16), budget, complexity=c)
        got = torch.zeros(len(c), dtype=torch.long)
        for r in res:
            got[r.indices] = r.budget
        assert got.tolist() == bucket_budgets(c, budget, 256).tolist()


def _cx() -> pd.DataFrame:
    return pd.DataFrame(dict(dataset=["syn"] * 4 + ["rec"] * 2,
                             doc_id=["a", "b", "c", "d", "r1", "r2"],
                             complexity=[0.1, 0.3, 0.6, 0.9, 0.2, 0.8],
                             cells=[1000, 1000, 1000, 1000, 1000, 300]))


def test_threshold_rules_seed_and_quartiles():
    rules = threshold_rules(_cx())
    assert list(rules) == ["seed thresholds", "quartile thresholds"]
    assert list(rules["seed thresholds"]) == ["syn", "rec"]
    assert rules["seed thresholds"]["rec"] == (0.25, 0.5, 0.75)
    assert rules["quartile thresholds"]["syn"] == pytest.approx(
        tuple(np.quantile([0.1, 0.3, 0.6, 0.9], [0.25, 0.5, 0.75])))
    with pytest.raises(ValueError, match="cx"):
        threshold_rules(_cx().iloc[:0])


def test_bucket_assignments_per_page_and_rule_in_page_order():
    cx = _cx()
    rules = {"seed thresholds": {"syn": (0.25, 0.5, 0.75), "rec": (0.25, 0.5, 0.75)},
             "low": {"syn": (0.05, 0.06, 0.07), "rec": (0.05, 0.06, 0.07)}}
    a = bucket_assignments(cx, rules, 273)
    assert a.columns.tolist() == ["dataset", "doc_id", "rule", "complexity", "budget"]
    assert a.doc_id.tolist() == [d for d in cx.doc_id for _ in rules]
    assert a.rule.tolist() == list(rules) * len(cx)
    seed = a[a.rule == "seed thresholds"].set_index("doc_id").budget
    assert seed.to_dict() == {"a": 180, "b": 273, "c": 365, "d": 456, "r1": 180, "r2": 300}
    assert a[a.rule == "low"].budget.tolist() == [456] * 5 + [300]
    per_page = bucket_budgets(torch.tensor(cx.complexity.to_numpy()), 273,
                              torch.tensor(cx.cells.to_numpy()))
    assert seed.tolist() == per_page.tolist()
    means = mean_budgets(a)
    assert means[("seed thresholds", "syn")] == round((180 + 273 + 365 + 456) / 4)
    assert means.dtype.kind == "i"
    with pytest.raises(ValueError, match="rec"):
        bucket_assignments(cx, {"r": {"syn": (0.2, 0.4, 0.6)}}, 273)


def test_page_complexity_one_row_per_page():
    flat = np.full((128, 160, 3), 128, np.uint8)
    noisy = np.random.default_rng(0).integers(0, 256, (128, 128, 3), dtype=np.uint8)
    docs = {"syn": [Document("f", flat, ()), Document("n", noisy, ())]}
    cx = page_complexity(docs)
    assert cx[["dataset", "doc_id"]].values.tolist() == [["syn", "f"], ["syn", "n"]]
    assert cx.cells.tolist() == [8 * 10, 8 * 8]
    assert cx.complexity[0] == 0.0 and cx.complexity[1] > 0.5


def _docs():
    q = (Question("q1", "?", ("x",), ((0, 0, 1, 1),), "total"),)
    img = np.zeros((16, 16, 3), np.uint8)
    return {"syn": [Document(d, img, q) for d in "ab"]}


def _fake_sweep(calls):
    def sweep(allocators, docs, budgets):
        calls.append((list(allocators), {k: [d.doc_id for d in v] for k, v in docs.items()},
                      list(budgets)))
        rows = [dict(dataset=ds, doc_id=d.doc_id, qid="q1", allocator=a, budget=b,
                     anls=(b / 1000 + (a == "topk") * 0.1 + (d.doc_id == "b") * 0.05))
                for ds, ds_docs in docs.items() for d in ds_docs
                for a in [*allocators, "full"] for b in budgets]
        return pd.DataFrame(rows), None
    return sweep


def test_fixed_rows_and_adaptive_table_compare_at_the_mean():
    assign = pd.DataFrame(dict(dataset="syn", doc_id=["a", "b"], rule="r",
                               complexity=[0.1, 0.9], budget=[180, 456]))
    means = mean_budgets(assign)
    assert means[("r", "syn")] == 318
    calls = []
    fixed = fixed_rows(assign, means, _docs(), _fake_sweep(calls))
    assert calls == [(["topk"], {"syn": ["a"]}, [180]), (["topk", "resize"], {"syn": ["a", "b"]}, [318]),
                     (["topk"], {"syn": ["b"]}, [456])]
    assert "full" not in set(fixed.allocator)
    t = adaptive_table(assign, fixed, means)
    assert set(t.dataset) == {"syn | r"}
    ada = t[t.allocator == "adaptive topk (r)"].set_index("doc_id")
    assert (ada.budget == 318).all()
    assert ada.anls.to_dict() == pytest.approx({"a": 0.18 + 0.1, "b": 0.456 + 0.15})
    assert sorted(set(t.allocator)) == ["adaptive topk (r)", "resize (r)", "topk (r)"]
    fam = adaptive_family(t, ["r"], seed=0)
    assert fam.baseline.tolist() == ["topk (r)", "resize (r)"]
    assert (fam.p_holm >= fam.p).all() and fam.verdict.str.startswith("too few").all()
    line = adaptive_line(fam, "syn", "r")
    assert line.startswith("minus fixed `topk` at 318 tokens: **too few documents (n = 2)**")
    assert "; minus fixed `resize` at 318 tokens" in line
    assert adaptive_line(fam, "sroie", "r") == "not measured (no SROIE data)"
