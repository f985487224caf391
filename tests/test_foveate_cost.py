"""What a ``foveate`` call computes: the work its result needs and no more.

* the view is rendered when first asked for, never for a caller of the tokens or patches;
* a method that places its tokens from the page's size alone reads a file once, at the
  finest scale a token needs (:data:`~fovea_core.foveation.PLACED_BEFORE_DECODING`), with
  the tokens of a full decode;
* the read-then-look cascade reads a view at the scale its fixation-1 tokens carry, and the
  default's glance rule decides its path without the gate's gist or localiser.

Timings live in the page-size benchmark (``python -m fovea_book.bench pages``), not here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from fovea_core import build_pyramid
from fovea_core.allocators import allocate
from fovea_core.cascade import reading
from fovea_core.foveation import (PLACED_BEFORE_DECODING, _decode_for, _geometry_pyramid,
                                  foveate, load_image)
from fovea_core.importance.text import TextRead
from fovea_core.pyramid import ReducedPyramid
from fovea_book.reference_samplers import sample_mip
from fovea_core.sample import sample, sample_area


def _page(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A text-like 8-bit page: dark strokes on white, smooth enough for JPEG."""
    g = np.random.default_rng(seed)
    img = np.full((h, w, 3), 235, np.uint8)
    for _ in range(h // 12):
        y, x = int(g.integers(0, h - 8)), int(g.integers(0, w - 60))
        img[y:y + 6, x:x + int(g.integers(20, 60))] = g.integers(0, 90, 3)
    return img


@pytest.fixture(scope="module")
def jpeg(tmp_path_factory):
    d = tmp_path_factory.mktemp("cost")
    path = d / "page.jpg"
    Image.fromarray(_page(1000, 740)).save(path, quality=95)
    return path


# ----------------------------------------------------------------------------- the view
def test_tokens_and_patches_never_render_the_view(jpeg, monkeypatch):
    import fovea_core.sample as smp

    calls = []
    real = smp.render
    monkeypatch.setattr(smp, "render", lambda *a, **k: calls.append(1) or real(*a, **k))
    for method in ("resize", "cascade"):
        f = foveate(jpeg, budget=64, method=method)
        assert f.tokens.budget == 64 and f.patches.shape[:2] == (1, 64)
        assert calls == [], method                            # nothing rendered yet
        v = f.view
        assert v.shape == (3, 1000, 740) and len(calls) == 1
        assert f.view is v and len(calls) == 1                # made once, then kept
        calls.clear()
    small = f.render((100, 74))
    assert small.shape == (3, 100, 74) and float(small.min()) >= 0 and float(small.max()) <= 1


# ----------------------------------------------------------------------------- decoding
@pytest.mark.parametrize("method", sorted(PLACED_BEFORE_DECODING))
@pytest.mark.parametrize("size", [(1000, 740), (613, 1999), (257, 300), (4096, 3072)])
@pytest.mark.parametrize("budget", [5, 64, 273])
def test_a_geometric_method_places_the_tokens_of_a_full_pyramid(method, size, budget):
    """The size-only stand-in gives exactly the tokens of the page's pyramid: what allows
    placing them before the page is decoded."""
    h, w = size
    geo = _geometry_pyramid(size, 16)
    full = build_pyramid(torch.zeros(1, 1, h, w))
    assert geo.num_levels == full.num_levels and geo.image_size == full.image_size
    zeros = torch.zeros(1, *geo.grid_shape(16, 0))

    def run(pyr):
        try:
            return allocate(method, pyr, zeros, budget)
        except ValueError as err:                  # a budget the page cannot take: the same
            return str(err)                        # refusal from both
    ta, tb = run(geo), run(full)
    if isinstance(ta, str) or isinstance(tb, str):
        assert ta == tb
        return
    assert torch.equal(ta.centers, tb.centers) and torch.equal(ta.levels, tb.levels)
    assert torch.equal(ta.scores, tb.scores) and torch.equal(ta.fixations, tb.fixations)


@pytest.mark.parametrize("method", sorted(PLACED_BEFORE_DECODING))
def test_a_jpeg_is_decoded_once_at_the_scale_the_tokens_need(jpeg, method, monkeypatch):
    x = load_image(jpeg)
    full = foveate(x, budget=64, method=method)           # a tensor: the whole page
    decoded = []
    real = _decode_for

    def spy(image, tokens, num_levels):
        pyr = real(image, tokens, num_levels)
        decoded.append(pyr)
        return pyr
    import fovea_core.foveation as fov
    monkeypatch.setattr(fov, "_decode_for", spy)
    f = foveate(jpeg, budget=64, method=method)
    assert len(decoded) == 1
    pyr = decoded[0]
    k = math.floor(float(f.tokens.levels.min()))
    assert isinstance(pyr, ReducedPyramid) and pyr.base_level == min(k, 3) > 0
    assert tuple(pyr.levels[0].shape[-2:]) == (math.ceil(1000 / 2**pyr.base_level),
                                               math.ceil(740 / 2**pyr.base_level))
    assert torch.equal(f.tokens.centers, full.tokens.centers)
    assert torch.equal(f.tokens.levels, full.tokens.levels)
    # patches of the reduced decode: the full decode's up to the decoder's rounding
    d = (f.patches - full.patches).abs()
    assert float(d.mean()) < 0.01, float(d.mean())


@pytest.mark.parametrize("size", [(1001, 739), (2913, 4120), (999, 1003)])
def test_a_jpeg_of_any_size_decodes_at_the_reduced_scale_itself(tmp_path, size, monkeypatch):
    """Sides that are no multiple of 2**k still decode reduced (libjpeg's ceil size), never
    whole and averaged."""
    import fovea_core.foveation as fov

    h, w = size
    path = tmp_path / "odd.jpg"
    Image.fromarray(_page(h, w, seed=4)).save(path, quality=90)
    full = foveate(load_image(path), budget=64, method="resize")

    def whole(*a, **k):
        raise AssertionError("the JPEG was decoded whole")
    monkeypatch.setattr(fov, "load_image", whole)
    f = foveate(path, budget=64, method="resize")
    assert torch.equal(f.tokens.levels, full.tokens.levels)
    assert float((f.patches - full.patches).abs().mean()) < 0.01


def test_a_png_is_decoded_whole_and_averaged_to_the_scale(tmp_path):
    path = tmp_path / "page.png"
    Image.fromarray(_page(1000, 740, seed=3)).save(path)
    f = foveate(path, budget=64, method="resize")
    full = foveate(load_image(path), budget=64, method="resize")
    assert torch.equal(f.tokens.levels, full.tokens.levels)
    assert float((f.patches - full.patches).abs().mean()) < 0.01


def test_a_reduced_pyramid_reads_what_the_full_page_holds():
    """``sample_area`` on a page stored from level k equals the full page's read where the
    stored pixels are exact 2**k block means and the boxes fall on whole blocks."""
    torch.manual_seed(0)
    x = torch.rand(1, 3, 256, 192)
    k = 2
    small = torch.nn.functional.avg_pool2d(x, 2**k)
    red = ReducedPyramid(build_pyramid(small).levels, k, (256, 192))
    full = build_pyramid(x)
    assert red.num_levels == k + build_pyramid(small).num_levels
    from fovea_core.tokens import TokenSet

    # level-3 tokens on the 8-px block grid: every box is whole level-2 blocks
    cx = torch.tensor([64.0, 128.0]) / 192
    cy = torch.tensor([64.0, 128.0, 192.0]) / 256
    cen = torch.stack(torch.meshgrid(cx, cy, indexing="xy"), -1).reshape(1, -1, 2)
    t = TokenSet(cen, torch.full((1, cen.shape[1]), 3.0), torch.zeros(1, cen.shape[1]),
                 torch.full((1, 1, 2), 0.5), (256, 192), 16)
    np.testing.assert_allclose(sample_area(red, t).numpy(), sample_area(full, t).numpy(),
                               atol=1e-5)
    with pytest.raises(ValueError, match="level 0 is not stored"):
        red.base
    with pytest.raises(ValueError, match="sample_mip reads"):
        sample_mip(red, t)
    fine = TokenSet(cen, torch.full((1, cen.shape[1]), 1.0), torch.zeros(1, cen.shape[1]),
                    torch.full((1, 1, 2), 0.5), (256, 192), 16)
    with pytest.raises(ValueError, match=">= 2"):
        sample_area(red, fine)
    with pytest.raises(ValueError, match="levels\\[0\\] must be page level"):
        ReducedPyramid(build_pyramid(small).levels, 1, (256, 192))


# ----------------------------------------------------------------------------- reading
def _empty(view):
    return TextRead(np.zeros((0, 4), np.float32), (), np.zeros(0, np.float32))


def test_the_reading_reads_a_view_at_the_scale_of_fixation_one(monkeypatch):
    """A large page whose fixation 1 sits at level >= 1 everywhere is read at that octave,
    and the lines come back in the page's pixels."""
    h, w = 2048, 1536
    pyr = build_pyramid(torch.from_numpy(_page(h, w, seed=5)).permute(2, 0, 1)[None])
    shapes = []

    def one_line(view):
        shapes.append(tuple(view.shape[-2:]))
        vh, vw = view.shape[-2:]                 # "TOTAL 9.00" across the view's middle
        return TextRead(np.float32([[0.1 * vw, 0.5 * vh, 0.9 * vw, 0.52 * vh]]),
                        ("TOTAL 9.00",), np.float32([0.99]))
    monkeypatch.setattr(reading, "read_view", one_line)
    parts = reading.reading_parts(pyr, 273, query="What is the total?", localiser="uniform")
    first = parts.first.tokens
    k = reading.view_scale(first)
    assert k == math.floor(float(first.levels.min())) >= 1
    assert shapes == [(math.ceil(h / 2**k), math.ceil(w / 2**k))]
    r = parts.readings[0]
    assert r.view_pixels == shapes[0][0] * shapes[0][1]
    np.testing.assert_allclose(r.lines.boxes[0], [0.1 * w, 0.5 * h, 0.9 * w, 0.52 * h],
                               rtol=2e-3)
    # a page whose fixation 1 reaches level 0 is read at its own size, as before
    small = build_pyramid(torch.from_numpy(_page(256, 256)).permute(2, 0, 1)[None])
    shapes.clear()
    reading.reading_parts(small, 200, query="What is the total?", localiser="uniform")
    assert shapes == [(256, 256)]


def test_a_glance_on_every_page_runs_no_gate(monkeypatch):
    """``glance_below=1``: one gist (the glance) and one localiser call; the gate's gist and
    map are not computed. Its tokens are the gated rule's."""
    pyr = build_pyramid(torch.from_numpy(_page(768, 768, seed=2)).permute(2, 0, 1)[None])
    monkeypatch.setattr(reading, "read_view", _empty)
    calls = []

    def uniform(g, query):                      # a flat map on the page's grid, counted
        calls.append(g.budget)
        h, w = g.image_size
        return torch.ones(1, math.ceil(h / 16), math.ceil(w / 16))
    gists = []
    real_gist = reading.gist
    monkeypatch.setattr(reading, "gist", lambda *a, **k: gists.append(1) or real_gist(*a, **k))
    kw = dict(query="What is the total?", localiser=uniform, glance_share=0.9)
    always = reading.reading_parts(pyr, 273, glance_below=1.0, **kw)
    assert len(gists) == 1 and len(calls) == 1, (gists, calls)
    gists.clear(), calls.clear()
    gated = reading.reading_parts(pyr, 273, glance_below=0.999999, **kw)   # a gate that opens
    assert len(gists) == 2 and len(calls) == 2
    assert torch.equal(always.tokens.centers, gated.tokens.centers)
    assert torch.equal(always.tokens.levels, gated.tokens.levels)
