"""The cascade's legibility switch to ``resize`` (:func:`fovea_core.cascade.allocator.
page_legibility`, ``resize_legible``), the registered ``cascade_safe``, and the fit of the
pair on photograph-like training pages (:mod:`fovea_book.eval.tried.safe_rule`)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from fovea_book.eval.documents import make_document
from fovea_book.eval.tried.safe_rule import (BASE, CONFIDENCES, LEGIBLES, choose_safe,
                                             read_record, safe_curve, safe_fit_table,
                                             switch_sentence, switch_summary)
from fovea_core import build_pyramid, foveate
from fovea_core.allocators.grid import resize_grid
from fovea_core.cascade.allocator import (LEGIBLE_PX, SAFE_RESIZE_BELOW, SAFE_RESIZE_LEGIBLE,
                                          _as_resize, cascade_parts, map_confidence,
                                          page_legibility, text_heights)


# ----------------------------------------------------------------------------- the measure
def test_legibility_is_the_median_text_height_read_at_the_resize_level(receipt):
    pyr, q = receipt
    g = cascade_parts(pyr, 273, query=q).gist
    want = (float(text_heights(g).flatten().median()) - math.log2(LEGIBLE_PX)
            - float(resize_grid(pyr.image_size, 273, 16)[2]))
    assert float(page_legibility(g, 273)[0]) == pytest.approx(want)
    # a larger budget reads the page finer: the same text is more legible, by the octaves
    # between the two resize levels
    up = float(resize_grid(pyr.image_size, 273, 16)[2] - resize_grid(pyr.image_size, 1024, 16)[2])
    assert float(page_legibility(g, 1024)[0] - page_legibility(g, 273)[0]) == pytest.approx(up)
    assert float(page_legibility(g, 273, legible_px=2 * LEGIBLE_PX)[0]) == pytest.approx(want - 1)


# ----------------------------------------------------------------------------- in the cascade
def test_a_legible_page_gets_the_resize_tokens_and_an_illegible_one_the_cascade(receipt):
    pyr, q = receipt
    plain = cascade_parts(pyr, 273, query=q)
    lg = float(page_legibility(plain.gist, 273)[0])
    res = _as_resize(pyr, plain.gist, 273, 16)
    legible = cascade_parts(pyr, 273, query=q, resize_legible=-lg + 1e-3)   # lg >= -L
    assert torch.equal(legible.tokens.centers, res.tokens.centers)
    assert torch.equal(legible.tokens.levels, res.tokens.levels)
    assert legible.tokens.budget == 273 and bool((legible.tokens.stage == 0).all())
    assert torch.equal(legible.scores, plain.scores)            # the map stays
    not_legible = cascade_parts(pyr, 273, query=q, resize_legible=-lg - 1e-3)
    assert torch.equal(not_legible.tokens.centers, plain.tokens.centers)
    # either reason sends the page to resize: a sure map is still resized when legible
    c = float(map_confidence(plain.scores)[0])
    both = cascade_parts(pyr, 273, query=q, resize_below=max(c - 1e-3, 0.0),
                         resize_legible=-lg + 1e-3)
    assert torch.equal(both.tokens.centers, res.tokens.centers)
    neither = cascade_parts(pyr, 273, query=q, resize_below=max(c - 1e-3, 0.0),
                            resize_legible=-lg - 1e-3)
    assert torch.equal(neither.tokens.centers, plain.tokens.centers)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "1", True])
def test_a_bad_legibility_tolerance_is_refused_by_name(receipt, bad):
    pyr, q = receipt
    with pytest.raises(ValueError, match="resize_legible"):
        cascade_parts(pyr, 273, query=q, resize_legible=bad)


def test_cascade_safe_is_the_cascade_with_the_fitted_pair_and_spends_exactly_n(receipt):
    pyr, q = receipt
    doc = make_document(0, layout="receipt")
    f = foveate(doc.image, q, method="cascade_safe")
    want = cascade_parts(pyr, 273, query=q, resize_below=SAFE_RESIZE_BELOW,
                         resize_legible=SAFE_RESIZE_LEGIBLE)
    assert f.tokens.budget == 273
    assert torch.equal(f.tokens.centers, want.tokens.centers)


def test_the_package_constants_are_the_committed_fit():
    rec = read_record()
    assert (SAFE_RESIZE_BELOW, SAFE_RESIZE_LEGIBLE) == (rec["resize_below"],
                                                        rec["resize_legible"])


# ----------------------------------------------------------------------------- the fit
def _rows() -> pd.DataFrame:
    """Two variants, one document each, two questions: ``resize`` reads 0.5; the cascade
    reads 1.0 on the scan (sure map 0.9, text far below legible: -2 octaves) and 0.0 on
    the photo (sure but wrong map 0.9, legible text: -0.5 octaves)."""
    rows = []
    for variant, conf, leg, read in (("scan", 0.9, -2.0, 1.0), ("photo", 0.9, -0.5, 0.0)):
        for q in ("q1", "q2"):
            base = dict(dataset="x", doc_id=f"d-{variant}@1", qid=q, variant=variant)
            rows += [dict(base, allocator="resize", anls=0.5),
                     dict(base, allocator=BASE, anls=read, map_confidence=conf,
                          page_legibility=leg)]
    return pd.DataFrame(rows)


def test_the_curve_resizes_the_legible_pages_and_the_fit_keeps_resize_beaten():
    curve = safe_curve(_rows(), (0.0, 0.95), (None, 1.0))
    at = curve.set_index(["resize_below", "resize_legible"])
    never = curve[(curve.resize_below == 0) & curve.resize_legible.isna()].iloc[0]
    assert never.anls == pytest.approx(0.5) and never.resized == 0
    assert never.margin_photo == pytest.approx(-0.5) and not never.feasible
    legible = at.loc[(0.0, 1.0)]                    # the photo's -0.5 >= -1: resized
    assert legible.anls == pytest.approx(0.75) and legible.resized == pytest.approx(0.5)
    assert legible.margin_scan == pytest.approx(0.5) and legible.margin_photo == 0
    assert legible.feasible
    gate = at.loc[(0.95, 1.0)]                      # every map below 0.95: all resized
    assert gate.anls == pytest.approx(0.5) and gate.resized == 1 and gate.feasible
    chosen = choose_safe(curve)
    assert (chosen["resize_below"], chosen["resize_legible"]) == (0.0, 1.0)
    assert chosen["feasible"]


def test_with_none_feasible_the_fit_takes_the_least_losing_pair_and_never_is_none():
    rows = _rows()
    rows.loc[rows.allocator == BASE, "page_legibility"] = -5.0     # nothing legible
    chosen = choose_safe(safe_curve(rows, (0.0,), (None, 1.0)))
    assert not chosen["feasible"] and chosen["resize_legible"] is None
    assert chosen["worst"] == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="no rows of"):
        safe_curve(rows[rows.allocator == "resize"])


def test_the_fit_table_marks_the_chosen_pair_and_says_what_it_does():
    curve = safe_curve(_rows(), (0.0, 0.95), (None, 1.0))
    chosen = choose_safe(curve)
    row = curve[(curve.resize_below == 0.0) & (curve.resize_legible == 1.0)].iloc[0].to_dict()
    rec = dict(curve=curve.astype(object).where(curve.notna(), None).to_dict("list"),
               chosen=dict(row, resize_legible=chosen["resize_legible"]),
               variants=["photo", "scan"])
    table, sentence = safe_fit_table(rec)
    assert table.chosen.tolist().count("<-") == 1
    assert table[table.chosen == "<-"].iloc[0].resize_legible == "1"
    assert "every variant reads at least as well" in sentence and "50 %" in sentence


def test_the_committed_record_is_the_fit_it_says():
    rec = read_record()
    curve = pd.DataFrame(rec["curve"]).astype({"resize_legible": float})
    assert rec["confidences"] == list(CONFIDENCES)
    assert rec["legibles"] == [None if x is None else x for x in LEGIBLES]
    chosen = choose_safe(curve)
    assert (rec["resize_below"], rec["resize_legible"]) == (chosen["resize_below"],
                                                            chosen["resize_legible"])
    assert rec["chosen"]["feasible"] == chosen["feasible"]
    ids = [p.split("-")[0] for p in rec["pages"]["sroie-train"]]
    assert ids and all(int(i[5:]) % 16 for i in ids)            # never a sroie-dev receipt


def test_the_switch_summary_says_why_each_question_went_to_resize_and_how_the_rest_read():
    rows = _rows()
    rows["ceiling_anls"] = 1.0
    rows.loc[rows.doc_id == "d-scan@1", "dataset"] = "y"
    s = switch_summary(rows, BASE, resize_below=0.5, resize_legible=1.0)
    x, y = s.loc["x"], s.loc["y"]                    # x: the photo (legible), y: the scan
    assert (x.n_questions, x.resized, x.unsure, x.legible) == (2, 1.0, 0.0, 1.0)
    assert np.isnan(x.kept_rule) and "no question stays" in switch_sentence(x, 1.0)
    assert (y.resized, y.kept_rule, y.kept_resize) == (0.0, 1.0, 0.5)
    assert y.legibility_q50 == -2.0
    words = switch_sentence(y, 1.0)
    assert "0 % of the 2 questions" in words and "-1.00" in words and "keeps 100 %" in words
    sure = switch_summary(rows, BASE, resize_below=0.95, resize_legible=None)
    assert sure.unsure.tolist() == [1.0, 1.0] and sure.legible.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="no rows of"):
        switch_summary(rows, "nothing", resize_below=0.5, resize_legible=1.0)
