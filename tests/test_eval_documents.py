"""Synthetic documents (boxes match ink, determinism) and the SROIE loader."""

import json

import numpy as np
import pytest

from fovea_book.eval.documents import (element_mask, ink_mask, make_document,
                                       synthetic_documents)
from fovea_book.eval.sroie import load_sroie, match_field, parse_box_file
from fovea_book.paths import DatasetNotFound, dataset_path

DOCS = synthetic_documents(6, seed=11)


def test_deterministic_from_seed():
    a, b = make_document(7), make_document(7)
    assert np.array_equal(a.image, b.image)
    assert a.questions == b.questions and a.elements == b.elements
    assert not np.array_equal(a.image, make_document(8).image)


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.doc_id)
def test_every_ink_pixel_lies_in_a_recorded_box(doc):
    ink = ink_mask(doc.image, threshold=255)  # any darkening at all
    outside = ink & ~element_mask(doc.elements, doc.size)
    assert outside.sum() == 0, f"{outside.sum()} ink pixels outside every element box"


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.doc_id)
def test_boxes_are_tight_and_disjoint(doc):
    ink = ink_mask(doc.image, threshold=255)
    for el in doc.elements:  # a few dozen elements: each box has ink on all four edges
        x0, y0, x1, y1 = el.box
        sub = ink[y0:y1, x0:x1]
        assert sub[0].any() and sub[-1].any() and sub[:, 0].any() and sub[:, -1].any(), el
    b = np.asarray([e.box for e in doc.elements])
    ox = np.minimum(b[:, None, 2], b[None, :, 2]) - np.maximum(b[:, None, 0], b[None, :, 0])
    oy = np.minimum(b[:, None, 3], b[None, :, 3]) - np.maximum(b[:, None, 1], b[None, :, 1])
    overlap = (ox > 0) & (oy > 0)
    np.fill_diagonal(overlap, False)
    assert not overlap.any(), "element boxes overlap"
    h, w = doc.size
    assert (b[:, :2] >= 0).all() and (b[:, 2] <= w).all() and (b[:, 3] <= h).all()


def test_answers_are_printed_elements_and_sizes_span_8_to_28():
    docs = synthetic_documents(20, seed=0)
    sizes = np.array([e.size_px for d in docs for e in d.elements if e.kind != "rule"])
    assert sizes.min() >= 8 and sizes.max() <= 28
    assert sizes.min() <= 9 and sizes.max() >= 26
    for d in docs:
        assert {q.field for q in d.questions} >= {"title", "total", "citation", "date"}
        texts = {e.box: e.text for e in d.elements}
        for q in d.questions:
            assert texts[q.boxes[0]] == q.answers[0]
        total = next(q for q in d.questions if q.field == "total")
        amounts = [float(e.text.replace(",", "")) for e in d.elements
                   if e.kind == "table" and e.size_px == total.size_px
                   and e.text.replace(",", "").replace(".", "").isdigit() and "." in e.text]
        assert abs(sum(amounts[:-1]) - amounts[-1]) < 0.011  # the total is the sum


def test_answer_locations_differ():
    d = DOCS[0]
    ys = {q.field: q.boxes[0][1] for q in d.questions}
    assert ys["date"] < ys["title"] < ys["total"] < ys["citation"]
    assert ys["citation"] > 0.9 * d.size[0]  # the footer is at the bottom


def test_bad_arguments():
    with pytest.raises(ValueError, match="width and height"):
        make_document(0, width=100)
    with pytest.raises(ValueError, match="seed"):
        make_document(-1)


# ------------------------------------------------------------------ SROIE
def test_parse_box_file_keeps_commas_in_text(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("10,20,110,20,110,40,10,40,NO.53 55,57 & 59, JALAN\n"
                 "5,50,60,50,60,70,5,70,TOTAL: 9.00\n")
    rows = parse_box_file(p)
    assert rows[0] == ((10, 20, 111, 41), "NO.53 55,57 & 59, JALAN")
    assert rows[1][1] == "TOTAL: 9.00"


def test_match_field_multiline_and_total():
    lines = [((0, 0, 10, 10), "SHOP SDN BHD"), ((0, 10, 10, 20), "NO.1, JALAN A,"),
             ((0, 20, 10, 30), "81100 JOHOR."), ((0, 30, 10, 40), "SUBTOTAL"),
             ((20, 30, 40, 40), "9.00"), ((0, 40, 10, 50), "TOTAL"),
             ((20, 40, 40, 50), "9.00"), ((0, 50, 10, 60), "DATE: 25/12/2018 10:30")]
    assert match_field("NO.1, JALAN A, 81100 JOHOR.", lines) == [1, 2]
    assert match_field("9.00", lines) == [6]          # the one on the TOTAL row
    assert match_field("25/12/2018", lines) == [7]    # printed inside a longer line
    assert match_field("SOMETHING ELSE ENTIRELY", lines) is None


def test_missing_sroie_dir_is_a_clear_error(tmp_path):
    with pytest.raises(DatasetNotFound, match="img"):
        load_sroie(tmp_path)


def test_real_sroie_receipts():
    try:
        root = dataset_path("sroie-dev")
    except DatasetNotFound as err:
        pytest.skip(str(err))
    docs = load_sroie(root, limit=4)
    assert len(docs) == 4
    for d in docs:
        keys = json.loads((root / "key" / f"{d.doc_id[5:]}.json").read_text())
        assert len(d.questions) >= 3
        h, w = d.size
        for q in d.questions:
            assert q.answers[0] == keys[q.field].strip()
            x0, y0, x1, y1 = q.union_box
            assert 0 <= x0 < x1 <= w + 1 and 0 <= y0 < y1 <= h + 1
