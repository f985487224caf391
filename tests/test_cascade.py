"""The budgeted cascade: gist geometry, exact budgets, stage labels, what it reads, metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fovea_core import build_pyramid
from fovea_core.methods import ALLOCATORS, INFO, allocate
from fovea_core.allocators.grid import resize_grid
from fovea_book.eval.localisation import OracleLocaliser
from fovea_core.cascade import (STAGE_FOVEA, STAGE_GIST, cascade, cascade_parts, gist,
                                gist_to_grid, place_fovea)
from fovea_core.cascade.core import fovea_grid, grid_mass, overlap_matrix, page_key
from fovea_core.cascade.localisers import answer_mass, uniform
from fovea_book.eval.localisation import cell_auc, coverage_raster, fovea_share
from fovea_book.eval.documents import make_document
from fovea_core.sample import sample


def _page(h: int = 512, w: int = 384, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.random((h, w, 3)) * 255).astype(np.uint8)


def _box_localiser(box):
    """A localiser that puts all its mass on one box (a stand-in for the oracle)."""
    def loc(g, query):
        return answer_mass([box], g.image_size, g.patch)[None].expand(g.image.shape[0], -1, -1)
    return loc


# ----------------------------------------------------------------------------- (a) gist
@pytest.mark.parametrize("size,budget", [((512, 384), 48), ((1024, 1024), 64),
                                         ((1900, 800), 96), ((300, 900), 64)])
def test_gist_is_the_resize_grid(size, budget):
    pyr = build_pyramid(_page(*size))
    g = gist(pyr, budget)
    r, c, level = resize_grid(size, budget, 16)
    assert (g.rows, g.cols) == (r, c) and g.budget == r * c <= budget
    assert g.tokens.budget == r * c and (g.tokens.stage == STAGE_GIST).all()
    assert torch.allclose(g.tokens.levels, torch.full_like(g.tokens.levels, level))
    assert tuple(g.image.shape) == (1, 3, 16 * r, 16 * c)
    # the same cells the resize baseline reads (its first r*c tokens), centred on the page
    res = allocate("resize", pyr, torch.zeros(1, *pyr.grid_shape(16, 0)), r * c)
    assert torch.allclose(res.centers, g.tokens.centers, atol=1e-6)
    assert torch.allclose(res.levels, g.tokens.levels)


def test_gist_image_is_the_sampled_patches_in_place():
    pyr = build_pyramid(_page(640, 480, 3))
    g = gist(pyr, 64)
    patches = sample(pyr, g.tokens)                                    # [1, G, C, p, p]
    k = 7                                                              # token (row, col)
    i, j = divmod(k, g.cols)
    assert torch.equal(g.image[0, :, 16 * i:16 * (i + 1), 16 * j:16 * (j + 1)], patches[0, k])


def test_gist_pixel_centres_match_the_page():
    # a horizontal ramp: the gist pixel at base x shows the ramp's value at x
    h, w = 768, 1024
    ramp = np.tile(np.linspace(0, 1, w, dtype=np.float32), (h, 1))
    pyr = build_pyramid(np.repeat(ramp[:, :, None], 3, 2))
    g = gist(pyr, 64)
    ys, xs = g.pixel_centres()
    inside = (xs > g.pixel) & (xs < w - g.pixel)
    want = (xs[inside] / w).float()                                    # ramp at the centre
    got = g.image[0, 0, g.image.shape[-2] // 2, inside]
    assert torch.allclose(got, want, atol=1.5 / w * g.pixel)


def test_gist_rejects_a_too_small_budget_for_the_pyramid():
    pyr = build_pyramid(_page(512, 512), num_levels=2)
    with pytest.raises(ValueError, match="levels"):
        gist(pyr, 16)


# ----------------------------------------------------------------------------- resampling
def test_overlap_matrix_moves_mass_exactly():
    a = overlap_matrix(10, 16.0, 0.0, 7, 23.5, -5.0, 150.0)            # [out, in]
    on_page = torch.tensor([max(0, min(150, -5 + 23.5 * (j + 1)) - max(0, -5 + 23.5 * j)) > 0
                            for j in range(7)])
    assert torch.allclose(a.sum(0)[on_page], torch.ones(int(on_page.sum()), dtype=a.dtype))
    m = torch.rand(2, 9, 13)
    pyr = build_pyramid(_page(300, 420))
    g = gist(pyr, 48)
    vals = torch.rand(1, *g.image.shape[-2:]) * g.inside()
    out = gist_to_grid(vals, g)
    assert out.shape == (1, *pyr.grid_shape(16, 0))
    assert torch.allclose(out.sum(), vals.sum(), rtol=1e-5)
    assert torch.allclose(grid_mass(m, (130, 200), 16.0).sum((1, 2)), m.sum((1, 2)), rtol=1e-5)


# ----------------------------------------------------------------------------- (c) fovea
def test_foveate_takes_the_cells_that_hold_the_mass():
    size = (640, 480)
    box = (100, 200, 260, 230)
    mass = answer_mass([box], size)[None]
    t = place_fovea(mass, 30, image_size=size, level=0.5, context_weight=0.0)
    assert t.budget == 30 and bool(t.is_distinct()[0])
    assert torch.allclose(t.levels, torch.full_like(t.levels, 0.5))
    assert (t.stage == STAGE_FOVEA).all()
    # every cell of the level grid that holds mass is taken before any other cell
    nr, nc, side = fovea_grid(size, 0.5)
    cells = grid_mass(mass, size, side)[0]
    assert 0 < int((cells > 0).sum()) <= 30
    xy = (t.centers_px()[0] / side).floor().long()
    taken = torch.zeros(nr, nc, dtype=torch.bool)
    taken[xy[:, 1], xy[:, 0]] = True
    assert bool(taken[cells > 0].all())
    b = t.boxes()[0]
    hit = (b[:, 2] > box[0]) & (b[:, 0] < box[2]) & (b[:, 3] > box[1]) & (b[:, 1] < box[3])
    assert bool(hit.any())


def test_foveate_context_prefers_neighbours():
    size = (512, 512)
    mass = torch.zeros(1, 32, 32)
    mass[0, 10, 10] = 1.0
    mass[0, 30, 30] = 0.01                                             # a faint far cell
    t = place_fovea(mass, 3, image_size=size, level=0.0, context=(0, 1), context_weight=0.5)
    cols = (t.centers_px()[0, :, 0] // 16).long().sort().values
    rows = (t.centers_px()[0, :, 1] // 16).long()
    assert (rows == 10).all() and cols.tolist() == [9, 10, 11]
    t0 = place_fovea(mass, 2, image_size=size, level=0.0, context_weight=0.0)
    assert 30 in (t0.centers_px()[0, :, 1] // 16).long().tolist()


# ----------------------------------------------------------------------------- the cascade
@settings(max_examples=25, deadline=None)
@given(h=st.integers(300, 1400), w=st.integers(300, 1400), gb=st.sampled_from([32, 48, 64, 96]),
       n=st.sampled_from([144, 273]), level=st.sampled_from([0.0, 0.5, 1.3]))
def test_cascade_spends_exactly_n_tokens_in_two_stages(h, w, gb, n, level):
    pyr = build_pyramid(np.full((h, w, 3), 200, np.uint8))
    assume(pyr.grid_shape(16, 0)[0] * pyr.grid_shape(16, 0)[1] >= n)
    r, c, glevel = resize_grid((h, w), gb, 16)
    assume(level <= glevel - 0.5)
    for surround in (0.0, 0.5):
        parts = cascade_parts(pyr, n, query="q", gist_budget=gb, localiser=uniform, level=level,
                              surround=surround)
        t = parts.tokens
        assert t.budget == n and bool(t.is_distinct()[0])
        assert int((t.stage == STAGE_GIST).sum()) == r * c
        assert int((t.stage == STAGE_FOVEA).sum()) == n - r * c
        lv = t.levels[t.stage == STAGE_FOVEA]
        core = float(parts.levels[0])
        assert core <= level + 1e-6 and float(lv.min()) == pytest.approx(core)
        assert float(lv.max()) <= min(core + 1.0, glevel - 0.5) + 1e-6
        if surround == 0.0:
            assert float(lv.max()) == pytest.approx(core)


def test_cascade_is_registered_and_runs_through_allocate():
    for name in ("cascade", "cascade_gist_query", "cascade_prior"):
        assert name in ALLOCATORS and INFO[name]["family"] == "cascade"
        assert INFO[name]["reads"](None) == 0
    doc = make_document(3)
    pyr = build_pyramid(doc.image)
    q = doc.questions[0]
    t = allocate("cascade_gist_query", pyr, torch.zeros(1, 64, 64), 273, query=q.question,
                 level=0.5)
    assert t.budget == 273 and t.stage is not None


def test_oracle_cascade_reads_the_answer_at_full_budget():
    doc = make_document(5)
    orc = OracleLocaliser([doc])
    pyr = build_pyramid(doc.image)
    for q in doc.questions:
        t = cascade(pyr, None, 273, query=q.question, localiser=orc, level=0.5)
        assert fovea_share(t, q.boxes) == pytest.approx(1.0)
        # the answer lies under the fine core, not only under the surround
        core = t.levels == t.levels[t.stage == STAGE_FOVEA].min()
        from fovea_core.tokens import TokenSet
        sub = TokenSet(t.centers[core][None], t.levels[core][None], t.scores[core][None],
                       t.fixations, t.image_size, t.patch, t.stage[core][None])
        assert fovea_share(sub, q.boxes) == pytest.approx(1.0)
    with pytest.raises(KeyError):
        cascade(pyr, None, 273, query="an unknown question", localiser=orc, level=0.5)


def test_a_given_size_sets_the_fovea_level():
    """``cascade_parts(size=...)`` reads the level from the given text heights instead of the
    gist's estimate: the oracle's answer height gives ``log2(height / LEGIBLE_PX)`` (clipped
    to the allowed levels), a NaN map keeps the estimate, and a map of another shape is
    refused."""
    from fovea_core.cascade.allocator import LEGIBLE_PX, cascade_parts

    doc = make_document(5)
    orc = OracleLocaliser([doc])
    pyr = build_pyramid(doc.image)
    q = doc.questions[0]
    plain = cascade_parts(pyr, 273, query=q.question, localiser="learned")
    given = cascade_parts(pyr, 273, query=q.question, localiser="learned", size=orc.text_size)
    h = float(np.median([b[3] - b[1] for b in q.boxes]))
    top = given.gist.level - 2.0
    level = min(max(math.log2(h / LEGIBLE_PX), 0.0), top)
    assert float(given.levels[0]) == pytest.approx(level, abs=1e-5)
    assert given.tokens.budget == 273
    tall = cascade_parts(pyr, 273, query=q.question, localiser="learned",
                         size=lambda g, qq: orc.text_size(g, qq) + 2.0)      # 4x taller text
    level = min(max(math.log2(4 * h / LEGIBLE_PX), 0.0), top)
    assert float(tall.levels[0]) == pytest.approx(level, abs=1e-5)
    nan = cascade_parts(pyr, 273, query=q.question, localiser="learned",
                        size=lambda g, qq: torch.full_like(orc.text_size(g, qq), float("nan")))
    assert torch.equal(nan.levels, plain.levels)
    with pytest.raises(ValueError, match="size returned"):
        cascade_parts(pyr, 273, query=q.question, size=lambda g, qq: torch.zeros(1, 2, 2))


def test_cascade_sees_the_page_only_through_its_gist(monkeypatch):
    """Budgeted: the cascade's decisions depend on the page only through its gist's tokens.
    Every pixel read goes through ``sample`` of the gist (G tokens), and a page that differs
    from another only at full resolution (a +-0.1 checkerboard of period 2 px, which pyrDown
    removes, so the coarsest level and the page key agree), read through the other page's
    gist, gets the same tokens: nothing else of it was looked at."""
    import fovea_core.cascade.core as core

    doc = make_document(2)
    img = 0.2 + 0.6 * doc.image.astype(np.float32) / 255.0
    yy, xx = np.indices(img.shape[:2])
    other = img + np.where((yy + xx) % 2 == 0, 0.1, -0.1)[:, :, None].astype(np.float32)
    a, b = build_pyramid(img), build_pyramid(other)
    assert (a.base - b.base).abs().max() > 0.09
    assert torch.allclose(a.levels[-1], b.levels[-1], atol=1e-6)
    real, seen = core.sample, []

    def through_page_a(pyramid, tokens, *args, **kwargs):
        seen.append(tokens)
        return real(a, tokens, *args, **kwargs)

    monkeypatch.setattr(core, "sample", through_page_a)
    for loc, level in (("gist_query", 0.5), (uniform, 0.5), ("learned", "auto")):
        seen.clear()
        ta = cascade(a, None, 273, query=doc.questions[1].question, localiser=loc, level=level,
                     gist_budget=64)
        tb = cascade(b, None, 273, query=doc.questions[1].question, localiser=loc, level=level,
                     gist_budget=64)
        assert torch.equal(ta.centers, tb.centers) and torch.equal(ta.levels, tb.levels)
        assert seen and all(t.budget <= 64 and float(t.levels.min()) >= 1 for t in seen), \
            [(t.budget, float(t.levels.min())) for t in seen]


def test_page_key_identifies_pages():
    a, b = make_document(1), make_document(2)
    ka, kb = page_key(build_pyramid(a.image))[0], page_key(build_pyramid(b.image))[0]
    assert ka != kb and ka == page_key(build_pyramid(a.image))[0]


# ----------------------------------------------------------------------------- metrics
def test_fovea_share_and_auc():
    size = (512, 512)
    box = (64, 96, 192, 120)
    mass = answer_mass([box], size)[None]
    pyr = build_pyramid(_page(*size))
    t = cascade(pyr, None, 200, localiser=_box_localiser(box), gist_budget=32, level=0.0,
                surround=0.0)
    assert fovea_share(t, [box]) == pytest.approx(1.0)
    far = (400, 400, 480, 440)
    assert fovea_share(t, [far]) == pytest.approx(0.0)
    assert cell_auc(mass[0], [box], size) == pytest.approx(1.0)
    assert cell_auc(torch.ones(32, 32), [box], size) == pytest.approx(0.5)
    assert cell_auc(-mass[0], [box], size) == pytest.approx(0.0)
    cov = coverage_raster(t, stages=(STAGE_GIST,))
    assert bool(cov.all())                                              # the gist tiles the page


def test_cascade_takes_any_budget_and_batch_like_the_other_allocators():
    """The gallery runs every allocator on a batch of two small images, without a question;
    the sweep and the M-RoPE positions take its TokenSet."""
    from fovea_core.methods import allocator_reads
    from fovea_core.vlm.positions import merged_grid_shape, mrope_positions

    imgs = np.stack([_page(256, 256, 1), make_document(3).image[::4, ::4]])
    pyr = build_pyramid(imgs)
    t = allocate("cascade", pyr, torch.zeros(2, 16, 16), 64)
    assert t.budget == 64 and t.batch_size == 2 and bool(t.is_distinct().all())
    assert allocator_reads("cascade", pyr) == 0
    pos = mrope_positions(t, merged_grid_shape((256, 256)))
    assert pos is not None


def test_cascade_fixates_at_the_shared_rule_on_its_localiser_map():
    """The cascade ignores the score map it is given; its fixation is the shared rule
    (:func:`resolve_fixation`) applied to its own localiser's map."""
    from fovea_core.allocators.base import resolve_fixation
    from fovea_core.cascade import cascade_parts

    doc = make_document(5)
    pyr = build_pyramid(doc.image)
    q = doc.questions[2]
    parts = cascade_parts(pyr, 273, query=q.question, localiser=OracleLocaliser([doc]))
    want = resolve_fixation(None, parts.scores)
    assert torch.allclose(parts.tokens.fixations[:, 0], want, atol=1e-6)
    flat = torch.ones_like(parts.scores)                 # a different map fixates elsewhere
    assert not torch.allclose(resolve_fixation(None, flat), want, atol=1e-3)


def test_a_fovea_level_near_the_gist_is_refused():
    """A fovea less than half an octave finer than the gist would re-read its cells."""
    pyr = build_pyramid(np.full((355, 355, 3), 200, np.uint8))
    glevel = resize_grid((355, 355), 96, 16)[2]
    with pytest.raises(ValueError, match="half an octave finer than the gist"):
        cascade_parts(pyr, 144, query="q", gist_budget=96, localiser=uniform,
                      level=glevel - 0.2)
    t = cascade_parts(pyr, 144, query="q", gist_budget=96, localiser=uniform,
                      level=glevel - 0.5).tokens
    assert bool(t.is_distinct()[0])


def test_a_small_page_that_pushes_core_and_surround_onto_one_grid_reads_it_once():
    """300 x 398 px, G = 32, core level 1.3: both stages fit only at level ~1.05; the
    surround is folded into the core instead of re-reading the core's cells."""
    pyr = build_pyramid(np.full((300, 398, 3), 200, np.uint8))
    t = cascade_parts(pyr, 273, query="q", gist_budget=32, localiser=uniform, level=1.3,
                      surround=0.5).tokens
    assert t.budget == 273 and bool(t.is_distinct()[0])


def test_gist_query_reads_each_gist_once_with_the_query_scorers_numbers(monkeypatch):
    """A page's questions share the OCR of its upsampled gist; each map is the ``query``
    scorer's on that image, bit for bit."""
    import fovea_core.importance as imp
    from fovea_core.cascade import localisers as L
    from fovea_core.cascade.core import gist

    doc = make_document(3)
    g = gist(build_pyramid(doc.image), 64)
    L._SALIENCY.clear()
    calls = []
    read_page = imp.read_page
    monkeypatch.setattr(imp, "read_page", lambda *a, **k: calls.append(1) or read_page(*a, **k))
    questions = [q.question for q in doc.questions[:3]]
    maps = [L.gist_query(g, q) for q in questions]
    assert len(calls) == 1 and all(torch.isfinite(m).all() for m in maps)
    (big, _, text), = L._SALIENCY.values()
    for q in questions:
        assert torch.equal(imp.query_map(text, q, patch=16), imp.score("query", big, query=q))
