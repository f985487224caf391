"""The cascade's rule for spending its budget like ``resize`` on a small page, and its fit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from fovea_book.eval.documents import make_document
from fovea_book.eval.photo import photo_like
from fovea_book.eval.fitting import grid_ratio
from fovea_book.eval.tried.resize_rule import THRESHOLDS, fit_threshold, read_record, rule_curve
from fovea_core import build_pyramid
from fovea_core.allocators.grid import resize
from fovea_core.cascade.allocator import cascade_parts
from fovea_core.methods import allocate


def _page(h: int, w: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.random((h, w, 3)) * 255).astype(np.uint8)


def _same(a, b) -> bool:
    return bool(torch.equal(a.centers, b.centers) and torch.equal(a.levels, b.levels))


# ------------------------------------------------------------------ the rule in the cascade
def test_a_page_within_the_threshold_gets_the_resize_tokens():
    pyr = build_pyramid(_page(400, 300))                  # 25 x 19 = 475 cells = 1.74 N
    parts = cascade_parts(pyr, 273, query="total", resize_within=2.0)
    flat = torch.ones(1, 25, 19)
    assert _same(parts.tokens, resize(pyr, flat, 273))
    assert parts.tokens.centers.shape[1] == 273
    assert torch.allclose(parts.scores, torch.full_like(parts.scores, 1 / 475))
    assert parts.side is None


def test_a_page_above_the_threshold_gets_the_cascade_unchanged():
    pyr = build_pyramid(_page(400, 300))
    plain = cascade_parts(pyr, 273, query="total")
    assert _same(cascade_parts(pyr, 273, query="total", resize_within=1.5).tokens, plain.tokens)
    assert _same(cascade_parts(pyr, 273, query="total", resize_within=0).tokens, plain.tokens)
    assert not _same(plain.tokens, resize(pyr, torch.ones(1, 25, 19), 273))


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "2", True])
def test_a_bad_threshold_is_refused_by_name(bad):
    pyr = build_pyramid(_page(400, 300))
    with pytest.raises(ValueError, match="resize_within"):
        cascade_parts(pyr, 273, query="total", resize_within=bad)


def test_allocate_passes_the_threshold_to_the_cascade():
    pyr = build_pyramid(_page(400, 300))
    got = allocate("cascade", pyr, None, 273, query="total", resize_within=2.0)
    assert _same(got, resize(pyr, torch.ones(1, 25, 19), 273))


def test_the_committed_fit_is_consistent():
    rec = read_record()
    curve = pd.DataFrame(rec["curve"])
    assert list(curve.threshold) == list(THRESHOLDS)
    assert fit_threshold(curve) == rec["resize_within"]
    assert rec["pages"] and all(name.endswith("-train") or name == "synthetic"
                                for name in rec["pages"])
    assert curve.anls.iloc[0] == pytest.approx(rec["cascade_anls"])
    assert curve.anls.iloc[-1] >= rec["resize_anls"] - 1e-9 or curve.resized.iloc[-1] < 1


# ------------------------------------------------------------------ the fit
def test_photo_like_scales_the_page_and_its_boxes():
    doc = make_document(5, layout="receipt")
    half = photo_like(doc, 0.5)
    assert half.doc_id.endswith("@0.5")
    assert half.size == (round(doc.size[0] / 2), round(doc.size[1] / 2))
    sy, sx = half.size[0] / doc.size[0], half.size[1] / doc.size[1]
    for q, q2 in zip(doc.questions, half.questions):
        for b, b2 in zip(q.boxes, q2.boxes):
            assert b2[0] == int(b[0] * sx + 1e-6) and b2[1] == int(b[1] * sy + 1e-6)
            assert b2[2] >= b[2] * sx - 1e-6 and b2[3] >= b[3] * sy - 1e-6
            assert b2[2] <= half.size[1] and b2[3] <= half.size[0]
    same = photo_like(doc, 1.0)
    assert same.size == doc.size and not np.array_equal(same.image, doc.image)   # JPEG
    assert grid_ratio(half) == pytest.approx(grid_ratio(doc) / 4, rel=0.1)


@pytest.mark.parametrize("kw", [dict(scale=0), dict(scale=1.5), dict(scale=0.5, quality=0)])
def test_photo_like_refuses_bad_arguments(kw):
    with pytest.raises(ValueError):
        photo_like(make_document(5, layout="receipt"), **kw)


def _rows(values: dict[str, tuple[float, float]]) -> pd.DataFrame:
    rows = []
    for doc, (c, r) in values.items():
        for q in ("a", "b"):
            rows += [dict(doc_id=doc, qid=q, allocator="cascade | learned", anls=c),
                     dict(doc_id=doc, qid=q, allocator="resize", anls=r)]
    return pd.DataFrame(rows)


def test_rule_curve_reads_small_pages_with_resize_and_large_ones_with_the_cascade():
    table = _rows({"small": (0.2, 1.0), "mid": (0.5, 0.6), "big": (1.0, 0.1)})
    ratios = {"small": 1.5, "mid": 5.0, "big": 40.0}
    curve = rule_curve(table, ratios, thresholds=(0, 2, 8, 64)).set_index("threshold")
    assert curve.anls[0] == pytest.approx((0.2 + 0.5 + 1.0) / 3)          # the cascade
    assert curve.anls[2] == pytest.approx((1.0 + 0.5 + 1.0) / 3)
    assert curve.anls[8] == pytest.approx((1.0 + 0.6 + 1.0) / 3)
    assert curve.anls[64] == pytest.approx((1.0 + 0.6 + 0.1) / 3)          # resize
    assert list(curve.resized) == pytest.approx([0, 1 / 3, 2 / 3, 1])
    assert fit_threshold(curve.reset_index()) == 8


def test_fit_threshold_breaks_ties_towards_the_cascade():
    curve = pd.DataFrame(dict(threshold=[0.0, 2.0, 4.0], anls=[0.5, 0.7, 0.7]))
    assert fit_threshold(curve) == 2.0
    with pytest.raises(ValueError):
        fit_threshold(curve.iloc[:0])


def test_rule_curve_needs_both_methods_and_every_ratio():
    table = _rows({"a": (0.2, 1.0)})
    with pytest.raises(ValueError, match="no grid ratio"):
        rule_curve(table, {})
    with pytest.raises(ValueError, match="resize"):
        rule_curve(table[table.allocator != "resize"], {"a": 1.0})
