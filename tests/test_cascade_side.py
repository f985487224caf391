"""The cascade's side compute (``fovea_core.cascade.side``): the text detector says where text
is and how tall, its cost is counted, and the cascade stays inside N with it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fovea_core.methods import INFO, allocate
from fovea_core.cascade import cascade_parts
from fovea_core.cascade.allocator import SIDES
from fovea_core.cascade.localisers import uniform
from fovea_core.cascade.side import (RENDER_SIDE, SideCost, TextLayout, detect_text,
                                     detector_flops, render_size)
from fovea_book.eval.documents import make_document
from fovea_book.eval.evaluator import side_compute
from fovea_core.pyramid import build_pyramid


@pytest.fixture(scope="module")
def page():
    doc = make_document(5, layout="receipt")
    return doc, build_pyramid(doc.image)


def _answer_cells(doc, size, patch=16):
    gh, gw = -(-size[0] // patch), -(-size[1] // patch)
    m = torch.zeros(gh, gw, dtype=torch.bool)
    for q in doc.questions:
        for x0, y0, x1, y1 in q.boxes:
            m[int(y0) // patch:-(-int(y1) // patch), int(x0) // patch:-(-int(x1) // patch)] = True
    return m


def test_render_size_is_the_longer_side_in_multiples_of_32():
    assert render_size((1000, 500)) == (512, 256)
    assert render_size((100, 60)) == (96, 64)          # never enlarged (rounded to 32)
    assert render_size((2000, 1000), 384) == (384, 192)
    for bad in (0, 31, 32.5, True):
        with pytest.raises(ValueError, match="side"):
            render_size((100, 100), bad)


def test_detector_finds_the_answers_and_their_height(page):
    doc, pyr = page
    lay = detect_text(pyr)
    assert isinstance(lay, TextLayout)
    gh, gw = pyr.grid_shape(16, 0)
    assert lay.mask.shape == lay.log_px.shape == (1, gh, gw)
    ans = _answer_cells(doc, pyr.image_size)
    # the answers are printed text: nearly all of their cells are called text
    assert float(lay.mask[0][ans].mean()) > 0.9
    # a receipt is mostly paper: the mask is far from everything
    assert float(lay.mask.mean()) < 0.8
    # the measured height where the answers are is their box height, within half an octave
    heights = np.array([b[3] - b[1] for q in doc.questions for b in q.boxes], float)
    measured = torch.nanmedian(lay.log_px[0][ans]).item()
    assert abs(measured - math.log2(np.median(heights))) < 0.5
    assert torch.isnan(lay.log_px[lay.mask == 0]).float().mean() > 0.5


def test_a_blank_page_has_no_text_and_the_cascade_still_runs():
    pyr = build_pyramid(torch.ones(1, 3, 320, 256))
    lay = detect_text(pyr)
    assert float(lay.mask.sum()) == 0 and bool(torch.isnan(lay.log_px).all())
    parts = cascade_parts(pyr, 200, localiser=uniform, gist_budget=16, side="text")
    assert parts.tokens.budget == 200


def test_side_cost_counts_the_render_and_the_detector(page):
    doc, pyr = page
    lay = detect_text(pyr)
    rh, rw = render_size(pyr.image_size)
    assert lay.cost.pixels == rh * rw == INFO["cascade_text"]["reads"](pyr)
    assert lay.cost.flops == detector_flops(rh, rw) and lay.cost.cpu_ms > 0
    assert lay.cost.token_equivalents == rh * rw / 256
    # convolutions dominate: FLOPs grow with the input's area (within the head's constant part)
    ratio = detector_flops(512, 512) / detector_flops(256, 256)
    assert 3.9 < ratio < 4.1
    with pytest.raises(ValueError, match="multiples of 32"):
        detector_flops(500, 512)


def test_the_cascade_with_the_text_side_stays_inside_n_and_reports_its_cost(page):
    doc, pyr = page
    q = doc.questions[0].question
    plain = cascade_parts(pyr, 273, query=q)
    side = cascade_parts(pyr, 273, query=q, side="text")
    assert plain.side is None and isinstance(side.side, SideCost)
    assert side.tokens.budget == plain.tokens.budget == 273
    assert int((side.tokens.stage[0] == 0).sum()) == int((plain.tokens.stage[0] == 0).sum())
    # the fovea's mass sits on the cells the detector calls text
    lay = detect_text(pyr)
    on_text = (side.scores[0] * lay.mask[0]).sum() / side.scores[0].sum()
    assert float(on_text) > 0.95
    # the registered allocator is the same method, labelled side compute
    t = allocate("cascade_text", pyr, None, 273, query=q)
    assert torch.equal(t.centers, side.tokens.centers) and torch.equal(t.levels, side.tokens.levels)
    assert side_compute("cascade_text") and side_compute("resize_nonblank")
    assert not side_compute("cascade") and not side_compute("resize")


def test_bad_side_and_missing_detector_model_say_what_cannot_run(page, monkeypatch, tmp_path):
    import rapidocr

    from fovea_core.cascade import side as side_mod
    from fovea_core.importance import fixation as fx

    doc, pyr = page
    with pytest.raises(ValueError, match=r"side must be None or one of \('text',\)"):
        cascade_parts(pyr, 273, side="ocr")
    assert SIDES == ("text",)
    monkeypatch.setattr(rapidocr, "__file__", str(tmp_path / "__init__.py"))
    fx.text_session.cache_clear()
    side_mod._LAYOUTS.clear()
    try:
        with pytest.raises(fx.ModelFileMissing, match=r"side='text'.*cascade_text.*cannot run.*"
                                                      r"rapidocr wheel"):
            detect_text(build_pyramid(torch.rand(1, 3, 64, 64)))
    finally:
        fx.text_session.cache_clear()


def test_render_side_default_is_what_the_cascade_uses(page):
    doc, pyr = page
    a = detect_text(pyr)
    b = detect_text(pyr, side=RENDER_SIDE)
    assert torch.equal(a.mask, b.mask)
