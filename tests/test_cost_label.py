"""One cost-label rule (evaluator.cost_label) used by realsets.cost_labels (rows) and
sweep.ranked (summaries): issue 21 item 3."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fovea_book.eval.evaluator import COST_LABELS, cost_label
from fovea_book.eval.realsets import cost_labels
from fovea_book.eval.sweep import ranked


def test_cost_label_scalar_and_vectorised():
    assert cost_label(False, False) == "budgeted"
    assert cost_label(True, False) == "side compute"
    assert cost_label(False, True) == "unbudgeted"
    assert cost_label(True, True) == "side compute"      # a side-compute read is never unbudgeted
    assert isinstance(cost_label(np.bool_(True), False), str)
    got = cost_label(pd.Series([False, True, False, None, np.nan, True]),
                     np.array([False, False, True, np.nan, True, True], dtype=object))
    assert got.tolist() == ["budgeted", "side compute", "unbudgeted", "budgeted",
                            "unbudgeted", "side compute"]
    assert set(got) <= set(COST_LABELS)
    assert cost_label(np.zeros((2, 3), bool), np.ones((2, 3), bool)).shape == (2, 3)
    with pytest.raises(ValueError, match="side_compute"):
        cost_label([True, False], [True])


def test_cost_labels_on_rows_use_the_rule_per_method():
    rows = pd.DataFrame(dict(
        allocator=["full", "a", "a", "b", "b", "c", "c", "d"],
        side_compute=[False, False, False, True, True, False, False, None],
        unbudgeted=[True, False, False, False, False, False, True, np.nan]))
    assert cost_labels(rows) == {"a": "budgeted", "b": "side compute", "c": "unbudgeted",
                                 "d": "budgeted"}
    assert cost_labels(rows.drop(columns="side_compute"))["b"] == "budgeted"
    assert cost_labels(rows.drop(columns=["side_compute", "unbudgeted"])) == dict.fromkeys(
        "abcd", "budgeted")


def _summary() -> pd.DataFrame:
    m = [("full", 1.00, False, False), ("resize", 0.50, False, False),
         ("topk", 0.60, False, False), ("ocr", 0.90, False, True),
         ("nonblank", 0.80, True, False), ("grid", 0.40, False, False)]
    return pd.DataFrame([dict(dataset="syn", allocator=a, budget=273, kept=k, kept_lo=k - .1,
                              kept_hi=k + .1, n_docs=3, total_tokens=273.0,
                              side_compute=s, unbudgeted=u) for a, k, s, u in m])


def test_ranked_labels_come_from_the_rule():
    r = ranked(_summary(), 273)
    assert r.allocator.tolist() == ["full", "resize", "topk", "grid", "nonblank", "ocr"]
    assert r.label.tolist() == ["baseline", "baseline", "", "", "side compute", "unbudgeted"]
    assert r["rank"].tolist() == ["-", "-", "1", "2", "-", "-"]
    s = _summary()
    r = ranked(s.drop(columns="side_compute"), 273).set_index("allocator")
    assert r.loc["nonblank", "label"] == "" and r.loc["nonblank", "rank"] == "1"
    shown = ranked(s, 273).set_index("allocator").label.replace("", "budgeted").to_dict()
    rule = dict(zip(s.allocator, cost_label(s.side_compute, s.unbudgeted)))
    assert {a: v for a, v in shown.items() if a not in ("full", "resize")} == {
        a: v for a, v in rule.items() if a not in ("full", "resize")}
