"""Two-part questions of chapter 14 (fovea_book.eval.multipart)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fovea_book.eval.document_types import Document, Question
from fovea_book.eval.multipart import (PAIRS, by_question_type, claim_line, pair_parts,
                                       pair_questions, two_part)


def _rows() -> pd.DataFrame:
    """Two pages x two allocators; page p2 has no citation, and p1's date is misread."""
    rows = []
    for alloc, scale in (("resize", 1.0), ("topk", 0.5)):
        for doc, fields in (("p1", {"date": 0.2, "citation": 0.9, "total": 0.6}),
                            ("p2", {"date": 0.7, "total": 0.4})):
            for f, anls in fields.items():
                rows.append(dict(dataset="synthetic", doc_id=doc, qid=f, field=f,
                                 allocator=alloc, budget=273, anls=anls * scale,
                                 em=float(anls * scale > 0.5), ceiling_anls=1.0 - 0.1 * len(f) / 8))
    return pd.DataFrame(rows)


def test_two_part_is_the_minimum_of_both_parts_per_page_and_allocator():
    t = _rows()
    tp = two_part(t)
    # pairs present: date+citation (p1 only), date+total (p1, p2); no title/company rows
    assert sorted(tp.field.unique()) == ["date+citation", "date+total"]
    assert (tp.qid == tp.field).all()
    assert len(tp) == 2 * (1 + 2)
    for r in tp.itertuples():
        a, b = r.field.split("+")
        part = t[(t.doc_id == r.doc_id) & (t.allocator == r.allocator)].set_index("field")
        for col in ("anls", "em", "ceiling_anls"):
            assert getattr(r, col) == min(part.loc[a, col], part.loc[b, col])
    # rows come pair by pair in PAIRS order
    assert tp.field.tolist()[:2] == ["date+citation"] * 2
    got = tp.set_index(["doc_id", "allocator", "field"]).anls
    assert got[("p1", "resize", "date+total")] == pytest.approx(0.2)
    assert got[("p2", "topk", "date+total")] == pytest.approx(0.2)


def test_two_part_names_missing_columns_and_bad_pairs():
    with pytest.raises(ValueError, match="ceiling_anls"):
        two_part(_rows().drop(columns="ceiling_anls"))
    with pytest.raises(ValueError, match="pairs"):
        two_part(_rows(), pairs=[("date",)])


def test_by_question_type_labels_both_types_in_the_dataset():
    t = _rows()
    qt = by_question_type(t)
    assert set(qt.dataset) == {"synthetic | single-field", "synthetic | two-part"}
    assert (qt.dataset == "synthetic | single-field").sum() == len(t)
    assert (qt.dataset == "synthetic | two-part").sum() == len(two_part(t))


def _doc() -> Document:
    qs = (Question("q1", "When?", ("1 May",), ((0, 0, 10, 5),), "date", 12),
          Question("q2", "What is cited?", ("Smith 2001",), ((0, 90, 40, 95),), "citation", 9),
          Question("q3", "Total?", ("4.20",), ((50, 50, 60, 55), (50, 56, 60, 60)), "total", 11))
    return Document("d", np.zeros((100, 100, 3), np.uint8), qs)


def test_pair_questions_join_text_answers_and_boxes():
    qs = pair_questions(_doc())
    assert [q.qid for q in qs] == ["date+citation", "date+total"]
    dc, dt = qs
    assert dc.question == "When? What is cited?" and dc.answers == ("1 May Smith 2001",)
    assert dc.boxes == ((0, 0, 10, 5), (0, 90, 40, 95)) and dc.size_px == 9
    assert dt.field == "date+total" and len(dt.boxes) == 3 and dt.size_px == 11
    assert pair_questions(_doc(), pairs=[("title", "total")]) == ()


def test_pair_parts_lists_the_pairs_the_page_can_ask():
    t = pair_parts(_doc())
    assert t.pair.tolist() == ["date+citation", "date+total"]
    assert t.parts.tolist()[1] == "When? / Total?"
    assert len(PAIRS) == 4


def test_claim_line_reads_two_part_then_single_field():
    claim = pd.DataFrame([dict(dataset="synthetic | single-field", verdict="worse",
                               text="-3.0 [-5.0, -1.0]", n_docs=40),
                          dict(dataset="synthetic | two-part", verdict="better",
                               text="+2.0 [0.5, 3.5]", n_docs=40)])
    assert claim_line(claim, "synthetic") == (
        "two-part questions **better** (+2.0 [0.5, 3.5] ANLS points, n = 40); "
        "single-field questions **worse** (-3.0 [-5.0, -1.0])")
    assert claim_line(claim, "sroie") == "not measured (no SROIE data)"
