"""Pseudo-labels from a page's own reading (:mod:`fovea_core.cascade.pseudo_labels`).

Every test reads hand-made lines (no OCR runs): :func:`labels_from_read` directly, or
:func:`page_labels` with the page reader replaced."""

from __future__ import annotations

import numpy as np
import pytest

from fovea_core.cascade import pseudo_labels as pl
from fovea_core.cascade.pseudo_labels import KEEP, PseudoLabel, labels_from_read, page_labels
from fovea_core.importance.text import TextRead

SIZE = (400, 300)


def _lines(*rows) -> TextRead:
    """A hand-made read: ``(text, (x0, y0, x1, y1)[, conf])`` per line."""
    texts = tuple(r[0] for r in rows)
    boxes = np.array([r[1] for r in rows], np.float32).reshape(-1, 4)
    conf = np.array([r[2] if len(r) > 2 else 0.99 for r in rows], np.float32)
    return TextRead(boxes, texts, conf)


def _one(labels: list[PseudoLabel], family: str) -> PseudoLabel:
    found = [p for p in labels if p.family == family]
    assert found, f"no {family} label in {labels}"
    return found[0]


def _inside(box, target, tol: float = 1.0) -> bool:
    return (box[0] >= target[0] - tol and box[1] >= target[1] - tol
            and box[2] <= target[2] + tol and box[3] <= target[3] + tol)


RECEIPT = _lines(
    ("TAN WOON YANN", (60, 10, 240, 30)),
    ("YONGFATT ENTERPRISE", (40, 40, 260, 64)),
    ("NO 122 JALAN DEDAP 13", (50, 70, 250, 82)),
    ("TEL 07-3523888", (80, 86, 220, 98)),
    ("DATE: 25/12/2018 10:30", (10, 110, 230, 122)),
    ("ITEM A", (10, 150, 70, 162)), ("3.00", (240, 150, 280, 162)),
    ("SUB-TOTAL", (10, 200, 90, 212)), ("80.90", (240, 200, 280, 212)),
    ("TOTAL", (10, 230, 60, 242)), ("80.90", (240, 230, 280, 242)),
    ("CASH", (10, 260, 50, 272)), ("100.00", (230, 260, 280, 272)),
    ("CHANGE", (10, 290, 70, 302)), ("19.10", (240, 290, 280, 302)),
)


def test_the_total_is_the_amount_right_of_total_not_the_cash():
    total = _one(labels_from_read(RECEIPT, SIZE, families="total", keep=None), "total")
    assert total.question == "What is the total?"
    assert _inside(total.box, (240, 230, 280, 242))
    assert "total key" in total.evidence and "largest" in total.evidence
    assert total.answer == "80.90"                        # the text read in its box


def test_the_cash_just_below_the_total_is_not_the_total():
    # a narrow receipt: the cash line lies where a form's value below its key would
    narrow = _lines(("TOTAL", (10, 230, 60, 242)), ("80.90", (150, 230, 190, 242)),
                    ("CASH", (10, 246, 50, 258)), ("100.00", (140, 246, 190, 258)))
    total = _one(labels_from_read(narrow, SIZE, families="total", keep=None), "total")
    assert _inside(total.box, (150, 230, 190, 242))


def test_a_date_is_found_by_its_pattern_with_or_without_a_key():
    date = _one(labels_from_read(RECEIPT, SIZE, families="date", keep=None), "date")
    assert date.question == "What is the date?"
    # the date's own characters, inside the line "DATE: 25/12/2018 10:30"
    assert _inside(date.box, (10, 110, 230, 122)) and date.box[0] > 50 and date.box[2] < 180
    bare = _lines(("SHOP", (10, 10, 60, 22)), ("12/03/2019 10:15", (10, 40, 170, 52)))
    alone = _one(labels_from_read(bare, SIZE, families="date", keep=None), "date")
    assert _inside(alone.box, (10, 40, 110, 52))
    assert date.confidence > alone.confidence             # a key beside it makes it surer
    assert (date.answer, alone.answer) == ("25/12/2018", "12/03/2019")


def test_the_company_is_the_head_line_with_a_company_word():
    company = _one(labels_from_read(RECEIPT, SIZE, families="company", keep=None), "company")
    assert company.question == "What is the company?"
    assert company.box == (40.0, 40.0, 260.0, 64.0)     # not the person's name above it
    assert company.answer == "YONGFATT ENTERPRISE"
    plain = _lines(("corner shop", (60, 10, 240, 22)), ("TAX INVOICE", (60, 30, 240, 42)),
                   ("TEL 07-3523888", (60, 50, 240, 62)))
    first = _one(labels_from_read(plain, SIZE, families="company", keep=None), "company")
    assert first.box == (60.0, 10.0, 240.0, 22.0)
    assert company.confidence > first.confidence


FORM = _lines(
    ("NAME:", (10, 100, 60, 112)), ("John Smith", (80, 100, 180, 112)),
    ("REMARKS:", (10, 200, 90, 212)), ("to be sent on Monday", (10, 216, 200, 228)),
    ("DATE: 12/10/98", (10, 300, 150, 312)),
)


def test_a_form_value_right_of_or_below_its_key():
    labels = labels_from_read(FORM, SIZE, families="form", keep=None)
    by_q = {p.question: p for p in labels}
    assert set(by_q) == {"What is the NAME?", "What is the REMARKS?", "What is the DATE?"}
    assert by_q["What is the NAME?"].box == (80.0, 100.0, 180.0, 112.0)
    assert by_q["What is the REMARKS?"].box == (10.0, 216.0, 200.0, 228.0)
    assert "below" in by_q["What is the REMARKS?"].evidence
    assert [by_q[f"What is the {k}?"].answer for k in ("NAME", "REMARKS", "DATE")] == [
        "John Smith", "to be sent on Monday", "12/10/98"]
    date = by_q["What is the DATE?"]                     # the value after the colon
    assert date.box[0] > 60 and _inside(date.box, (10, 300, 150, 312))
    # a value on the key's own line is surer than one below, and labels come best first
    assert date.confidence > by_q["What is the REMARKS?"].confidence
    assert [p.confidence for p in labels] == sorted((p.confidence for p in labels), reverse=True)


def test_confidence_orders_receipt_labels_and_keep_drops_the_unsure():
    sure = _one(labels_from_read(RECEIPT, SIZE, families="total", keep=None), "total")
    bare = _lines(("ITEM A", (10, 150, 70, 162)), ("3.00", (240, 150, 280, 162)))
    unsure = _one(labels_from_read(bare, SIZE, families="total", keep=None), "total")
    assert sure.confidence > unsure.confidence
    assert all(0.0 <= p.confidence <= 1.0 for p in (sure, unsure))
    keep = {"total": (sure.confidence + unsure.confidence) / 2}
    assert labels_from_read(bare, SIZE, families="total", keep=keep) == []
    assert labels_from_read(RECEIPT, SIZE, families="total", keep=keep) == [sure]


def test_faint_lines_are_not_used_and_nothing_read_gives_no_label():
    faint = _lines(("TOTAL", (10, 230, 60, 242), 0.2), ("80.90", (240, 230, 280, 242), 0.2))
    assert labels_from_read(faint, SIZE, keep=None) == []
    assert labels_from_read(_lines(), SIZE, keep=None) == []


def test_page_labels_reads_the_page_once_at_full_resolution(monkeypatch):
    import fovea_core.importance.query as query

    calls = []

    def fake_read_page(image, *, coarse_level, min_conf):
        calls.append((coarse_level, min_conf))
        return query.PageText((RECEIPT,), SIZE)

    monkeypatch.setattr(query, "read_page", fake_read_page)
    page = np.full((*SIZE, 3), 255, np.uint8)
    labels = page_labels(page, families=("company", "date", "total"), keep=None)
    assert calls == [(0, 0.0)]
    assert [p.family for p in labels] == ["company", "date", "total"]
    monkeypatch.setattr(pl, "read_full_page", lambda image: (RECEIPT, SIZE))
    assert page_labels(page, families="total", keep={"total": 0.0}) == labels[2:]


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="families"):
        labels_from_read(RECEIPT, SIZE, families=("address",))
    with pytest.raises(ValueError, match="families"):
        labels_from_read(RECEIPT, SIZE, families=())
    with pytest.raises(ValueError, match="image_size"):
        labels_from_read(RECEIPT, (0, 300))
    with pytest.raises(TypeError, match="TextRead"):
        labels_from_read([("TOTAL", (0, 0, 1, 1))], SIZE)
    broken = TextRead(np.zeros((2, 4), np.float32), ("TOTAL",), np.ones(1, np.float32))
    with pytest.raises(ValueError, match="one box"):
        labels_from_read(broken, SIZE)
    with pytest.raises(ValueError, match="keep"):
        labels_from_read(RECEIPT, SIZE, families="total", keep={"date": 0.5})
    with pytest.raises(ValueError, match="keep"):
        labels_from_read(RECEIPT, SIZE, families="total", keep={"total": 1.5})
    assert set(KEEP) == set(pl.FAMILIES)


def test_the_measure_hit_rule_printings_and_threshold_choice():
    import pandas as pd

    from fovea_book.eval.pseudo_labels import choose_thresholds, hits, printed_values

    truth = np.array([[10, 110, 230, 122], [0, 0, 5, 5]])
    assert hits((100, 110, 140, 122), truth).tolist() == [True, False]  # centre in, IoU 0.18
    assert not hits((240, 110, 300, 122), truth).any()
    rows = [((10, 230, 60, 242), "TOTAL 80.90"), ((10, 260, 60, 272), "CASH 180.90"),
            ((10, 290, 60, 302), "NETT TOTAL: RM80.90")]
    assert printed_values(rows, "80.90", "total") == [(10, 230, 60, 242), (10, 290, 60, 302)]
    assert printed_values(rows, "80.90", "company") == []
    table = pd.DataFrame(dict(family=["total"] * 4 + ["total (own box)"] * 4,
                              threshold=[0.0, 0.5, 0.8, 0.9] * 2, kept=[100, 80, 40, 10] * 2,
                              precision=[0.8, 0.95, 0.85, 0.99, 0.99, 0.99, 0.99, 0.99]))
    # 0.5 meets the target but 0.8 does not: the first threshold from which all do is none
    # with 20 labels or more, below 0.9 (10 labels: too few to count)
    assert choose_thresholds(table) == {"total": None}
    table.loc[2, "precision"] = 0.91
    assert choose_thresholds(table) == {"total": 0.5}
