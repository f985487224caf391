"""The receipt and invoice layouts and the question wordings of fovea_book.eval.documents/sroie."""

from __future__ import annotations

import numpy as np
import pytest

from fovea_book.eval.documents import (LAYOUTS, WORDING_SETS, WORDINGS, make_document, phrase,
                                       reword, synthetic_documents)
from fovea_book.eval.sroie import QUESTIONS, load_sroie, reworded
from fovea_book.paths import DatasetNotFound, dataset_path

RECEIPTS = synthetic_documents(8, seed=300, layout="receipt")
INVOICES = synthetic_documents(4, seed=300, layout="invoice")


def test_layouts_and_wording_sets():
    assert LAYOUTS == ("paper", "receipt", "invoice")
    assert WORDING_SETS == ("default", "train", "heldout")
    with pytest.raises(ValueError, match="layout"):
        make_document(0, layout="poster")
    with pytest.raises(ValueError, match="wording"):
        make_document(0, wording="clever")


@pytest.mark.parametrize("doc", RECEIPTS + INVOICES, ids=lambda d: d.doc_id)
def test_answers_are_the_printed_strings_in_their_boxes(doc):
    assert {q.field for q in doc.questions} == {"company", "date", "address", "total"}
    by_box = {e.box: e.text for e in doc.elements}
    h, w = doc.size
    for q in doc.questions:
        printed = [by_box[b] for b in q.boxes]          # every answer box is a drawn string
        if q.field == "address":
            assert q.answers[0] == " ".join(printed)
        elif q.field == "company":
            assert q.answers[0].replace(" ", "") == "".join(printed).replace(" ", "")
        else:
            assert printed == [q.answers[0]]
        for x0, y0, x1, y1 in q.boxes:
            assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h
            # the box holds ink darker than the paper around it
            patch = doc.image[y0:y1, x0:x1].min()
            assert patch < np.median(doc.image) - 30


def test_receipt_totals_add_up_and_layouts_differ():
    for d in RECEIPTS:
        tot = next(q for q in d.questions if q.field == "total")
        val = float(tot.answers[-1].replace(",", ""))
        items = [float(e.text.replace(",", "")) for e in d.elements if e.kind == "item"
                 and e.text.replace(",", "").replace(".", "").isdigit()]
        assert val == pytest.approx(sum(items), abs=0.1 + 0.07 * sum(items))  # + tax, rounding
    sizes = {d.size for d in RECEIPTS}
    assert len(sizes) == len(RECEIPTS)                  # pages differ in size and aspect
    assert all(h > w for h, w in sizes)                 # receipts are tall
    inv = INVOICES[0]
    comp = next(q for q in inv.questions if q.field == "company").boxes[0]
    assert comp[0] < 0.2 * inv.size[1]                  # letterhead at the left, not centred


def test_default_wording_is_unchanged_and_pools_are_disjoint():
    d = make_document(7)
    assert [q.question for q in d.questions][:3] == [
        "What is the date in the header?", "What is the title?", "Who is the first author?"]
    for field, pool in WORDINGS["train"].items():
        assert not set(pool) & set(WORDINGS["heldout"][field]), field
        assert len(pool) >= 4 and len(WORDINGS["heldout"][field]) >= 2
    assert WORDINGS["default"]["receipt_total"][0] == QUESTIONS["total"]


def test_reword_changes_only_the_question():
    for wording in ("train", "heldout"):
        a, b = make_document(11), make_document(11, wording=wording)
        assert np.array_equal(a.image, b.image)
        for qa, qb in zip(a.questions, b.questions):
            assert (qa.answers, qa.boxes, qa.field) == (qb.answers, qb.boxes, qb.field)
            assert qb.question in [phrase(k, wording, i, item=_item(qa))
                                   for k in (qa.field,) for i in range(8)]
            assert qb.question != qa.question
    r = make_document(4, layout="receipt", wording="heldout")
    assert all(q.question in {t for p in WORDINGS["heldout"].values() for t in p}
               for q in r.questions)
    assert reword(r.questions, "default", 4) == tuple(r.questions)


def _item(q):
    return q.question.removeprefix("What is the amount for ").rstrip("?") \
        if q.field == "amount" else ""


def test_sroie_heldout_wording():
    try:
        root = dataset_path("sroie-dev")
    except DatasetNotFound as err:
        pytest.skip(str(err))
    a = load_sroie(root, limit=3)
    b = load_sroie(root, limit=3, wording="heldout")
    for da, db in zip(a, b):
        assert np.array_equal(da.image, db.image)
        for qa, qb in zip(da.questions, db.questions):
            assert qa.question == QUESTIONS[qa.field]
            key = "receipt_" + qa.field if qa.field in ("date", "total") else qa.field
            assert qb.question in WORDINGS["heldout"][key]
            assert (qa.answers, qa.boxes) == (qb.answers, qb.boxes)
        assert reworded(da, "heldout").questions == db.questions
        assert reworded(db, "default").questions == da.questions
