"""The read-then-look cascade's fitted defaults: the answer geometry from key-answer pairs
(:func:`fovea_book.eval.reading_fit.fit_geometry`), the pairs read off training pages
(:mod:`fovea_book.eval.reading_fit`), the share's choice, and the shipped record."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fovea_book.eval import reading_fit
from fovea_book.eval.document_types import Document, Question
from fovea_book.eval.reading_fit import (SHARES, choose_share, fit_geometry, form_pairs,
                                         geometry_to_dict, pair_offsets, receipt_pairs,
                                         share_curve)
from fovea_core.cascade import reading
from fovea_core.cascade.reading import (PRIOR_GEOMETRY, geometry_from_dict, load_fitted,
                                        match_lines, read_map)
from fovea_core.importance.text import TextRead

KEY = (100.0, 50.0, 140.0, 60.0)                    # a key 40 px wide on a 10 px line


def _doc(questions, size=(400, 400)) -> Document:
    return Document("t", np.full((*size, 3), 255, np.uint8), tuple(questions), (), "sroie")


# ----------------------------------------------------------------------------- offsets
def test_offsets_are_measured_from_the_key_in_its_line_heights():
    o = pair_offsets(np.array([KEY]), np.array([[160.0, 50.0, 200.0, 60.0]]))
    assert o.tolist() == [[2.0, 6.0, 6.0, 10.0, 0.0, 1.0]]
    below = pair_offsets(np.array([KEY]), np.array([[90.0, 65.0, 130.0, 75.0]]))
    assert below[0, 2:].tolist() == [-1.0, 3.0, 1.5, 2.5]
    with pytest.raises(ValueError, match="zero or negative height"):
        pair_offsets(np.array([[0.0, 5.0, 10.0, 5.0]]), np.array([[0.0, 0.0, 1.0, 1.0]]))
    with pytest.raises(ValueError, match=r"\[P, 4\]"):
        pair_offsets(np.zeros((2, 4)), np.zeros((3, 4)))


# ----------------------------------------------------------------------------- the fit
def _pairs(row: int, below: int) -> np.ndarray:
    """``row`` answers 2-6 line heights right of the key on its line, ``below`` answers on
    the next line under the key's left end."""
    right = [[160.0, 50.0, 200.0, 60.0]] * row
    under = [[100.0, 62.0, 160.0, 72.0]] * below
    return pair_offsets(np.array([KEY] * (row + below)), np.array(right + under))


def test_the_fit_puts_the_mass_where_the_answers_are():
    g, summary = fit_geometry(_pairs(30, 10), mass=1.0)
    assert summary["pairs"] == 40 and summary["classes"]["row"]["pairs"] == 30
    assert summary["outside"] == pytest.approx(0.0) and summary["rects"] == len(g.rects)
    rows = [r for r in g.rects if r.anchor == "right"]
    offs = [r for r in g.rects if r.anchor == "left"]
    # the row answers cover x 2..6, y 0..1 from the key's right end: 2 x 2 bins of 2 x 0.5
    assert sorted((r.x0, r.x1, r.y0, r.y1) for r in rows) == [
        (2.0, 4.0, 0.0, 0.5), (2.0, 4.0, 0.5, 1.0), (4.0, 6.0, 0.0, 0.5), (4.0, 6.0, 0.5, 1.0)]
    assert all(r.weight == pytest.approx(1.0) for r in rows)
    # the answers below: a third as many, spread over 3 x 2 bins of twice the area
    assert {(r.x0, r.x1) for r in offs} == {(0.0, 2.0), (2.0, 4.0), (4.0, 6.0)}
    assert all(r.weight < 0.2 for r in offs)
    # as a map: more mass right of the key than under it, none elsewhere
    read = TextRead(np.array([KEY], np.float32), ("TOTAL",), np.ones(1, np.float32))
    m = match_lines("What is the total?", read, (400, 400), geometry=g)
    mp = read_map(m, read, (400, 400), patch=10, geometry=g)
    assert float(mp[5, 16:20].sum()) > float(mp[6, 10:16].sum()) > 0
    assert float(mp[:5].sum()) == 0 and float(mp[8:].sum()) == 0


def test_the_kept_mass_drops_the_rare_bins_first():
    g_all, s_all = fit_geometry(_pairs(30, 3), mass=1.0)
    g_most, s_most = fit_geometry(_pairs(30, 3), mass=0.9)
    assert len(g_most.rects) < len(g_all.rects)
    assert all(r.anchor == "right" for r in g_most.rects)     # the rare answers below go
    assert 0.9 <= s_most["kept"] < 1.0 and s_all["kept"] == pytest.approx(1.0)


@pytest.mark.parametrize("bad,match", [(np.zeros((0, 6)), "P >= 1"),
                                       (np.full((2, 6), np.nan), "finite"),
                                       (np.zeros((2, 6)), "positive width")])
def test_the_fit_rejects_bad_offsets(bad, match):
    with pytest.raises(ValueError, match=match):
        fit_geometry(bad)
    with pytest.raises(ValueError, match="mass"):
        fit_geometry(_pairs(2, 0), mass=0.0)


def test_a_geometry_round_trips_through_its_record():
    g, _ = fit_geometry(_pairs(5, 5))
    assert geometry_from_dict(json.loads(json.dumps(geometry_to_dict(g)))) == g
    assert geometry_from_dict(geometry_to_dict(PRIOR_GEOMETRY)) == PRIOR_GEOMETRY
    with pytest.raises(ValueError, match="not an answer geometry"):
        geometry_from_dict({"rects": [["right", 0, 1]]})


# ----------------------------------------------------------------------------- the pairs
def test_a_receipt_pair_is_the_key_nearest_to_the_value():
    lines = [((20, 20, 80, 32), "TOTAL QTY: 3"), ((20, 200, 80, 212), "TOTAL"),
             ((300, 201, 360, 213), "9.00"), ((20, 300, 80, 312), "CASH 10.00")]
    q = Question("total", "What is the total?", ("9.00",), ((300, 201, 360, 213),), "total")
    company = Question("company", "What is the company?", ("ACME",), ((20, 5, 80, 15),),
                       "company")
    pairs, counts = receipt_pairs(_doc([q, company]), lines)
    assert counts == dict(pairs=1, no_key_cue=1, no_key_read=0, value_not_in_line=0)
    (key, ans), = pairs
    assert key[1] == 200 and ans == (300.0, 201.0, 360.0, 213.0)   # not TOTAL QTY


def test_a_value_on_its_key_line_is_its_own_characters():
    lines = [((0, 100, 200, 110), "DATE: 12/03/2019")]
    q = Question("date", "What is the date?", ("12/03/2019",), ((0, 100, 200, 110),), "date")
    (key, ans), = receipt_pairs(_doc([q]), lines)[0]
    assert key[2] <= ans[0] and ans[2] == pytest.approx(200.0)   # right of DATE, to the end
    assert ans[0] == pytest.approx(200 * 6 / 16)
    q_bad = Question("date", "What is the date?", ("01/01/2001",), ((0, 100, 200, 110),),
                     "date")
    assert receipt_pairs(_doc([q_bad]), lines)[1]["value_not_in_line"] == 1


def test_a_form_pair_follows_the_link():
    entities = [{"id": 0, "box": [10, 10, 60, 20], "text": "Date:", "label": "question"},
                {"id": 1, "box": [70, 10, 130, 20], "text": "12/10/98", "label": "answer"},
                {"id": 2, "box": [10, 40, 60, 50], "text": "Date:", "label": "question"},
                {"id": 3, "box": [10, 60, 40, 70], "text": "TO:", "label": "question"}]
    q = Question("q2-a1", "What is the Date?", ("12/10/98",), ((70, 10, 131, 21),), "Date")
    to = Question("q3-a1", "What is the TO?", ("x",), ((70, 10, 131, 21),), "TO")
    pairs, counts = form_pairs(_doc([q, to], (100, 200)), entities)
    assert counts == dict(pairs=1, no_cue_read=1)                 # "to" names nothing
    (key, ans), = pairs
    assert key[1] == 40 and ans == (70.0, 10.0, 131.0, 21.0)      # the linked label, not id 0


# ----------------------------------------------------------------------------- the share
def test_the_share_with_the_best_mean_over_the_sets_is_chosen():
    rows = [dict(dataset=ds, allocator=a, doc_id=f"{ds}{i}", anls=v)
            for a, vals in (("s35", (0.9, 0.1)), ("s50", (0.5, 0.7)), ("s65", (0.5, 0.7)))
            for ds, v in zip(("rec", "form"), vals) for i in range(3)]
    curve = share_curve(pd.DataFrame(rows), {"s35": 0.35, "s50": 0.5, "s65": 0.65})
    assert curve.score.round(6).tolist() == [0.5, 0.6, 0.6]
    assert choose_share(curve) == 0.5                              # a tie: the smaller
    with pytest.raises(ValueError, match="no rows"):
        share_curve(pd.DataFrame(rows), {"s80": 0.8})


# ----------------------------------------------------------------------------- the record
def test_the_shipped_record_is_the_default():
    path = reading.fitted_path()
    record = json.loads(path.read_text())
    geometry, share = load_fitted()
    assert reading.FITTED and reading.DEFAULT_GEOMETRY == geometry == \
        geometry_from_dict(record["geometry"])
    assert reading.FIRST_SHARE == share == record["first_share"] and share in SHARES
    assert share == choose_share(pd.DataFrame(record["curve"]))
    # fitted on training pages only: receipts of sroie-train (ids 3 mod 6 or 480-625, never a
    # multiple of 16), forms of funsd-train, synthetic validation pages
    ids = [int(d[5:]) for d in record["pages"]["sroie-train"]]
    assert ids and all(i % 16 and (i % 6 == 3 or 480 <= i <= 625) for i in ids)
    assert sum(p["pairs"] for p in record["pairs"].values()) == \
        record["geometry_summary"]["pairs"]


def test_a_bad_record_is_refused(tmp_path):
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"first_share": 1.5, "geometry": geometry_to_dict(PRIOR_GEOMETRY)}))
    with pytest.raises(ValueError, match="first_share"):
        load_fitted(p)
    p.write_text(json.dumps({"first_share": 0.5}))
    with pytest.raises(ValueError, match="not an answer geometry"):
        load_fitted(p)


def test_the_fitted_geometry_looks_right_of_the_key_first():
    """What the training pages say, as the record holds it: most answers on the key's line,
    the densest region right of the key on its line, and every region inside the bins."""
    g = reading.DEFAULT_GEOMETRY
    record = json.loads(reading.fitted_path().read_text())
    assert record["geometry_summary"]["classes"]["row"]["share"] > 0.5
    top = max(g.rects, key=lambda r: r.weight)
    assert top.anchor == "right" and top.x0 >= 0 and 0 <= top.y0 < top.y1 <= 1
    assert all(r.x0 >= reading_fit.X_EDGES[0] and r.x1 <= reading_fit.X_EDGES[-1] for r in g.rects)
