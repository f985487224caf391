"""The cascade's rule for spending its budget like ``resize`` when its map is unsure
(:func:`fovea_core.cascade.allocator.map_confidence`, ``resize_below``), and its fit
(:mod:`fovea_book.eval.tried.confidence_rule`)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from fovea_book.eval.fitting import photo_variants
from fovea_book.eval.tried.confidence_rule import (BASES, CONFIDENCES, VARIANTS,
                                                   confidence_curve, confidence_fit_table,
                                                   read_record)
from fovea_book.eval.documents import make_document
from fovea_book.eval.tried.resize_rule import fit_threshold
from fovea_core import build_pyramid
from fovea_core.cascade.allocator import _as_resize, cascade_parts, map_confidence


# ----------------------------------------------------------------------------- the measure
def test_confidence_is_the_mass_on_the_top_cells():
    sure = torch.zeros(1, 10, 10)
    sure[0, 3, 4] = 1.0
    flat = torch.ones(1, 10, 10)
    half = torch.zeros(1, 10, 10)
    half[0, 0, :5] = 1.0                                  # 5 hot cells = the top 5 %
    half[0, 5:] = 5.0 / 50                                # and as much spread over 50 cells
    c = map_confidence(torch.cat([sure, flat, half, torch.zeros(1, 10, 10)]))
    assert c.tolist() == pytest.approx([1.0, 0.05, 0.5, 0.05])   # no mass: flat
    with pytest.raises(ValueError, match=r"\[B, Gh, Gw\]"):
        map_confidence(torch.ones(10, 10))
    with pytest.raises(ValueError, match="top"):
        map_confidence(flat, top=0.0)


# ----------------------------------------------------------------------------- in the cascade
def test_an_unsure_map_gets_the_resize_tokens_and_a_sure_one_the_cascade(receipt):
    pyr, q = receipt
    plain = cascade_parts(pyr, 273, query=q)
    c = float(map_confidence(plain.scores)[0])
    below = cascade_parts(pyr, 273, query=q, resize_below=min(c + 1e-3, 1.0))
    res = _as_resize(pyr, plain.gist, 273, 16)
    assert torch.equal(below.tokens.centers, res.tokens.centers)
    assert torch.equal(below.tokens.levels, res.tokens.levels)
    assert below.tokens.budget == 273 and bool((below.tokens.stage == 0).all())
    assert torch.equal(below.scores, plain.scores)             # the map it was judged by
    above = cascade_parts(pyr, 273, query=q, resize_below=max(c - 1e-3, 0.0))
    assert torch.equal(above.tokens.centers, plain.tokens.centers)
    assert torch.equal(cascade_parts(pyr, 273, query=q, resize_below=0.0).tokens.centers,
                       plain.tokens.centers)                  # 0: never


def test_a_batch_gates_each_image_on_its_own_map():
    imgs = [make_document(s, layout="receipt").image for s in (0, 1)]
    h, w = min(i.shape[0] for i in imgs), min(i.shape[1] for i in imgs)
    pyr = build_pyramid(torch.stack([torch.as_tensor(i[:h, :w]).permute(2, 0, 1).float() / 255
                                     for i in imgs]))
    plain = cascade_parts(pyr, 273, query="What is the total?")
    c = map_confidence(plain.scores)
    cut = float(c.mean())
    if float(c[0]) == float(c[1]):
        pytest.skip("both maps equally sure")
    gated = cascade_parts(pyr, 273, query="What is the total?", resize_below=cut)
    res = _as_resize(pyr, plain.gist, 273, 16)
    for b in range(2):
        want = res.tokens if float(c[b]) < cut else plain.tokens
        assert torch.equal(gated.tokens.centers[b], want.centers[b])


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "0.5", True])
def test_a_bad_confidence_threshold_is_refused_by_name(receipt, bad):
    pyr, q = receipt
    with pytest.raises(ValueError, match="resize_below"):
        cascade_parts(pyr, 273, query=q, resize_below=bad)


# ----------------------------------------------------------------------------- the fit
def test_photo_variants_are_the_page_on_a_table_and_photographed_at_each_scale():
    doc = make_document(2, layout="receipt")
    vs = photo_variants(doc, scales=(1.0, 0.5))
    assert [v.doc_id for v in vs] == [f"{doc.doc_id}-{n}@{s:g}" for n in VARIANTS
                                      for s in (1.0, 0.5)]
    scan, table = vs[0], vs[2]
    assert scan.size == doc.size and table.size[0] > doc.size[0]     # the table's frame
    assert all(len(v.questions) == len(doc.questions) for v in vs)
    again = photo_variants(doc, scales=(1.0, 0.5))
    assert all(np.array_equal(a.image, b.image) for a, b in zip(vs, again))   # seeded


def _rows():
    """Two documents of two questions: resize reads 0.5 everywhere, the cascade 1.0 where
    its map is sure (0.9) and 0.0 where it is not (0.3)."""
    rows = []
    for d in ("a", "b"):
        for q, conf, cascade in (("q1", 0.9, 1.0), ("q2", 0.3, 0.0)):
            rows.append(dict(dataset="x", doc_id=d, qid=q, allocator="resize", anls=0.5))
            rows.append(dict(dataset="x", doc_id=d, qid=q, allocator="cascade | learned",
                             anls=cascade, map_confidence=conf))
    return pd.DataFrame(rows)


def test_the_curve_sends_unsure_questions_to_resize():
    curve = confidence_curve(_rows(), "cascade | learned", (0.0, 0.5, 0.95))
    assert curve.anls.tolist() == pytest.approx([0.5, 0.75, 0.5])
    assert curve.resized.tolist() == pytest.approx([0.0, 0.5, 1.0])
    assert fit_threshold(curve) == 0.5
    with pytest.raises(ValueError, match="no rows"):
        confidence_curve(_rows(), "cascade | on the sheet")


def test_the_committed_fit_is_consistent():
    rec = read_record()
    assert set(rec["fits"]) == set(BASES) and rec["thresholds"] == list(CONFIDENCES)
    for fit in rec["fits"].values():
        assert fit["resize_below"] == fit_threshold(pd.DataFrame(fit["curve"]))
    ids = [p.split("-")[0] for p in rec["pages"]["sroie-train"]]
    assert ids and all(int(i[5:]) % 16 for i in ids)            # never a sroie-dev receipt


def test_the_fit_table_marks_the_chosen_threshold_and_says_what_it_changes():
    rec = dict(thresholds=[0.0, 0.5], variants=["scan", "photo"], fits={
        "cascade | learned": dict(resize_below=0.5, curve=dict(
            threshold=[0.0, 0.5], anls=[0.4, 0.45], resized=[0.0, 0.6]),
            by_variant=dict(scan=[0.9, 0.8], photo=[0.1, 0.3])),
        "cascade | on the sheet": dict(resize_below=0.0, curve=dict(
            threshold=[0.0, 0.5], anls=[0.6, 0.5], resized=[0.0, 0.5]),
            by_variant=dict(scan=[0.9, 0.8], photo=[0.3, 0.2]))})
    table, words = confidence_fit_table(rec)
    assert table["learned: chosen"].tolist() == ["", "<-"]
    assert table["on the sheet: chosen"].tolist() == ["<-", ""]
    assert table["learned: ANLS"].tolist() == [40.0, 45.0]
    assert "the learned cascade the fit chose 0.5 (the largest threshold tried)" in words
    assert "scan -10.0, photo +20.0" in words and "on the sheet the fit chose 0" in words
