"""Photograph-like pages (fovea_book.eval.photo) and the localiser that finds the sheet first."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from fovea_book.eval.document_types import Document, Question
from fovea_book.eval.documents import make_document
from fovea_book.eval.photo import (FACTORS, factor_table, on_background, perspective, rotated,
                                   uneven_light)
from fovea_core import build_pyramid
from fovea_core.cascade.allocator import cascade_parts
from fovea_core.cascade.core import gist
from fovea_core.cascade.learned import LearnedLocaliser, paper_region


def _card(h: int = 600, w: int = 400) -> Document:
    """A white page with one black bar: the answer, at a known box."""
    img = np.full((h, w, 3), 250, np.uint8)
    box = (100, 200, 300, 240)
    img[box[1]:box[3], box[0]:box[2]] = 0
    return Document("card", img, (Question("q", "What?", ("x",), (box,), "total"),))


def _ink_inside(doc: Document) -> float:
    """Share of the dark pixels that lie inside the answer's (first) box."""
    dark = doc.image.mean(2) < 60
    x0, y0, x1, y1 = doc.questions[0].boxes[0]
    return float(dark[y0:y1, x0:x1].sum()) / max(1, int(dark.sum()))


@pytest.mark.parametrize("transform", [on_background, perspective, rotated])
def test_boxes_follow_the_page_through_each_warp(transform):
    out = transform(_card(), np.random.default_rng(3))
    assert _ink_inside(out) > 0.97
    x0, y0, x1, y1 = out.questions[0].boxes[0]
    h, w = out.size
    assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h


def test_on_background_places_the_sheet_at_its_share_of_the_frame():
    doc = _card()
    out = on_background(doc, np.random.default_rng(0), share=0.36)
    assert out.size[0] == pytest.approx(doc.size[0] / 0.6, abs=1)
    bright = out.image.mean(2) > 240
    assert bright.mean() == pytest.approx(0.36 - 0.36 * (200 * 40) / (600 * 400), abs=0.02)
    b = out.questions[0].boxes[0]
    assert (b[2] - b[0], b[3] - b[1]) == (200, 40)                    # a shift, no scaling
    with pytest.raises(ValueError, match="share"):
        on_background(doc, np.random.default_rng(0), share=0)


def test_transforms_are_deterministic_per_generator():
    doc = make_document(3, layout="receipt")
    for f in FACTORS.values():
        a = f(doc, np.random.default_rng(7))
        b = f(doc, np.random.default_rng(7))
        assert np.array_equal(a.image, b.image) and a.questions == b.questions
    lit = uneven_light(doc, np.random.default_rng(1))
    assert lit.image.dtype == np.uint8 and (lit.image <= doc.image).all()


def _gist_of(doc: Document):
    return gist(build_pyramid(doc.image), 64)


def test_paper_region_finds_the_sheet_on_a_table_and_nothing_on_a_scan():
    doc = make_document(4, layout="receipt")
    assert paper_region(_gist_of(doc)) is None                       # the sheet is the page
    photo = on_background(doc, np.random.default_rng(2), share=0.4)
    g = _gist_of(photo)
    region = paper_region(g)
    assert region is not None and region.shape == g.image.shape[:1] + g.image.shape[2:]
    ys, xs = g.pixel_centres()
    cy, cx = ys[:, None].numpy(), xs[None, :].numpy()
    # where the sheet truly is: the frame minus the table (the sheet's pixels are bright)
    sheet = np.zeros(region.shape[1:], bool)
    h, w = photo.size
    yi = np.clip(cy.astype(int), 0, h - 1)
    xi = np.clip(cx.astype(int), 0, w - 1)
    sheet[:] = photo.image[yi, xi].mean(2) > 200
    r = region[0].numpy()
    assert (r & sheet).sum() / sheet.sum() > 0.9                     # it covers the sheet
    assert (r & ~sheet).sum() / r.sum() < 0.35                       # and little of the table


def test_the_paper_localiser_is_the_plain_one_on_a_scan_and_stays_on_the_sheet_on_a_photo():
    doc = make_document(4, layout="receipt")
    g = _gist_of(doc)
    q = doc.questions[0].question
    assert torch.equal(LearnedLocaliser(paper=True)(g, q), LearnedLocaliser()(g, q))
    photo = on_background(doc, np.random.default_rng(2), share=0.4)
    g = _gist_of(photo)
    m = LearnedLocaliser(paper=True)(g, q)[0]                         # [Gh, Gw] mass per cell
    assert m.sum().item() == pytest.approx(1.0, abs=1e-4)
    region = paper_region(g)[0].float()[None, None]
    # the sheet's rectangle on the level-0 grid: (almost) no mass off it (the map lives on
    # 2 x 2 blocks of gist pixels moved to the cells by area, which blur its edge by a cell)
    on = torch.nn.functional.interpolate(region, size=m.shape, mode="area")[0, 0] > 0
    plain = LearnedLocaliser()(g, q)[0]
    assert m[~on].sum().item() < 1e-3 < plain[~on].sum().item()
    assert not torch.equal(m, LearnedLocaliser()(g, q)[0])


def test_cascade_paper_is_registered_and_spends_exactly_n():
    from fovea_core.methods import allocate

    photo = on_background(make_document(4, layout="receipt"), np.random.default_rng(2),
                          share=0.4)
    t = allocate("cascade_paper", build_pyramid(photo.image), None, 273, query="total?")
    assert t.centers.shape[1] == 273
    parts = cascade_parts(build_pyramid(photo.image), 273, query="total?",
                          localiser="learned_paper")
    assert torch.equal(parts.tokens.centers, t.centers)


def test_factor_table_scores_each_factor_and_localiser():
    docs = [make_document(i, layout="receipt") for i in range(2)]
    t = factor_table(docs, {"learned": "learned", "paper": "learned_paper"},
                     factors={k: FACTORS[k] for k in ("as stored", "on a table, 60 % of the frame")})
    assert set(t.factor) == {"as stored", "on a table, 60 % of the frame"}
    assert set(t.localiser) == {"learned", "paper"}
    n_q = sum(len(d.questions) for d in docs)
    assert len(t) == 2 * 2 * n_q
    assert t.cell_auc.between(0, 1).all() and t.fovea_share.between(0, 1).all()
    stored = t[t.factor == "as stored"].set_index(["localiser", "doc_id", "field"])
    assert np.allclose(stored.loc["learned"].cell_auc, stored.loc["paper"].cell_auc)


def test_a_batch_gives_each_page_what_it_gets_alone():
    import torch

    from fovea_core.cascade.core import gist as make_gist
    from fovea_core.pyramid import build_pyramid as bp

    scan = make_document(4, layout="receipt")
    photo = on_background(make_document(5, layout="receipt"), np.random.default_rng(2),
                          share=0.4)
    h = min(scan.size[0], photo.size[0])
    w = min(scan.size[1], photo.size[1])
    pages = np.stack([scan.image[:h, :w], photo.image[:h, :w]])
    g = make_gist(bp(pages), 64)
    q = "What is the total?"
    both = LearnedLocaliser(paper=True)(g, q)
    for b in range(2):
        alone = LearnedLocaliser(paper=True)(make_gist(bp(pages[b:b + 1]), 64), q)
        assert torch.allclose(both[b], alone[0], atol=1e-6)


def _two_answers() -> Document:
    """A 600-row page with an answer in the top half and one in the bottom half."""
    img = np.full((600, 400, 3), 250, np.uint8)
    top, bottom = (100, 100, 300, 130), (100, 450, 300, 480)
    for x0, y0, x1, y1 in (top, bottom):
        img[y0:y1, x0:x1] = 0
    return Document("two", img, (Question("t", "Top?", ("t",), (top,), "company"),
                                 Question("b", "Bottom?", ("b",), (bottom,), "total")))


def test_page_rows_keeps_the_answers_inside_and_moves_their_boxes():
    from fovea_book.eval.photo import half_page, page_rows

    doc = _two_answers()
    top = page_rows(doc, 0, 300, tag="top")
    assert top.size == (300, 400) and [q.qid for q in top.questions] == ["t"]
    assert top.questions[0].boxes == ((100, 100, 300, 130),) and _ink_inside(top) == 1.0
    bottom = page_rows(doc, 300, 600)
    assert [q.qid for q in bottom.questions] == ["b"]
    assert bottom.questions[0].boxes == ((100, 150, 300, 180),) and _ink_inside(bottom) == 1.0
    assert page_rows(doc, 120, 600).questions[0].qid == "b"      # the top answer is cut: dropped
    for bad in ((0, 0), (300, 200), (-1, 10), (0, 601)):
        with pytest.raises(ValueError, match="rows must satisfy"):
            page_rows(doc, *bad)
    halves = {half_page(doc, np.random.default_rng(s)).doc_id for s in range(8)}
    assert halves == {"two@top", "two@bottom"}


def test_part_page_shows_a_band_or_the_whole_page():
    from fovea_book.train import PART, part_page

    doc = _two_answers()
    for s in range(20):
        out = part_page(doc, np.random.default_rng(s), min_cells=10)
        if out is doc:
            continue
        h = out.size[0]
        assert PART[0] * 600 - 1 <= h <= PART[1] * 600 + 1 and out.size[1] == 400
        assert 1 <= len(out.questions) <= 2
        for q in out.questions:                               # each kept box is its bar
            x0, y0, x1, y1 = q.boxes[0]
            assert (out.image[y0:y1, x0:x1] == 0).all() and y1 - y0 == 30
    # a band too small for the gist, or one holding no answer, gives the page itself
    assert part_page(doc, np.random.default_rng(0), min_cells=10_000) is doc


def test_factor_table_computes_a_page_once_and_reads_it_back(tmp_path, monkeypatch):
    """The rows of a (factor, page, localiser) are stored and read back equal; another seed
    (another generator for the page) or no cache computes again."""
    import fovea_core.cascade.allocator as allocator

    docs = [make_document(i, layout="receipt") for i in range(2)]
    factors = {k: FACTORS[k] for k in ("as stored", "half of the receipt (top or bottom)")}
    locs = {"learned": "learned", "paper": "learned_paper"}
    cache = tmp_path / "rows.sqlite"
    first = factor_table(docs, locs, factors=factors, cache_path=cache)
    assert len(first) > 0

    def no_allocation(*args, **kwargs):
        raise RuntimeError("factor_table allocated instead of reading its cache")

    monkeypatch.setattr(allocator, "cascade_parts", no_allocation)
    again = factor_table(docs, locs, factors=factors, cache_path=cache)
    pd.testing.assert_frame_equal(first, again)
    with pytest.raises(RuntimeError, match="allocated"):
        factor_table(docs, locs, factors=factors, cache_path=cache, seed=1)
    with pytest.raises(RuntimeError, match="allocated"):
        factor_table(docs, locs, factors=factors, cache_path=None)
