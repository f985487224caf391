"""One cost rule (:func:`fovea_core.cost.method_cost`, labelled by ``cost_label``) used by
``foveate``, by the evaluator's rows, by realsets.cost_labels (rows) and by sweep.ranked
(summaries)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from fovea_book.eval.evaluator import COST_LABELS, cost_label
from fovea_book.eval.realsets import cost_labels
from fovea_book.eval.sweep import ranked


def test_cost_label_scalar_and_vectorised():
    assert cost_label(False, False) == "budgeted"
    assert cost_label(True, False) == "side compute"
    assert cost_label(False, True) == "unbudgeted"
    assert cost_label(True, True) == "unbudgeted"        # the dearest label any page gave
    assert isinstance(cost_label(np.bool_(True), False), str)
    got = cost_label(pd.Series([False, True, False, None, np.nan, True]),
                     np.array([False, False, True, np.nan, True, True], dtype=object))
    assert got.tolist() == ["budgeted", "side compute", "unbudgeted", "budgeted",
                            "unbudgeted", "unbudgeted"]
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


def _first_cells(state, method, query, budget, seed):
    """An allocate hook: the first ``budget`` level-0 cells (the cost rule reads only the
    method's and the scorer's names, never the tokens)."""
    from fovea_core.tokens import TokenSet

    gw = state.pyramid.grid_shape(state.patch, 0)[1]
    idx = torch.arange(budget)
    return TokenSet.from_grid(idx[None] // gw, idx[None] % gw, 0,
                              image_size=state.pyramid.image_size), None


class _Blind:
    """A reader that reads nothing (the rows' labels do not depend on what is read)."""

    id, margin = "blind", 0.0

    def read(self, image, boxes) -> str:
        return ""


def test_foveate_and_the_evaluator_label_every_method_and_scorer_alike(monkeypatch):
    """For every method ``foveate`` runs and every scorer, the label of ``foveate``'s cost
    record and the label of the evaluator's rows (their flags through ``cost_label``, as
    the book's tables show them) are the same; a score-map method whose scorer reads
    pixels outside N (``topk`` with ``saliency``) is side compute, never budgeted, and one
    whose scorer reads the text (``query_saliency``) unbudgeted."""
    from fovea_book.eval import evaluator as E
    from fovea_book.eval.documents import make_document
    from fovea_core import build_pyramid
    from fovea_core.foveation import _cost, load_image, method_names
    from fovea_core.importance import SCORERS

    monkeypatch.setattr(E, "read_answer", lambda *a, **k: "")     # nothing rendered or read
    doc = make_document(61, layout="receipt", width=384, height=384)
    budget = 64
    pyr = build_pyramid(load_image(doc.image))
    scorers = sorted(SCORERS)
    pairs = [(m, s) for m in method_names() for s in scorers]
    methods = [E.Method(f"{m}/{s}", m, scorer=s, query_aware=False, allocate=_first_cells)
               for m, s in pairs]
    rows = E.rows_frame(E.evaluate_document(doc, "syn", methods, [budget],
                                            reader=_Blind()))
    rows = rows[rows.allocator != "full"].groupby("allocator")[["side_compute", "unbudgeted"]]
    flags = rows.any()
    evaluator = dict(zip(flags.index, cost_label(flags.side_compute, flags.unbudgeted)))
    fov = {f"{m}/{s}": _cost(m, s, pyr, budget, 0.0).label for m, s in pairs}
    assert evaluator == fov
    assert fov["topk/saliency"] == "side compute" and fov["topk/none"] == "budgeted"
    assert fov["topk/query_saliency"] == "unbudgeted"
    assert fov["resize/saliency"] == "budgeted"               # resize ignores the map
    assert fov["cascade_text/none"] == "side compute"
    assert set(fov.values()) == set(COST_LABELS)
