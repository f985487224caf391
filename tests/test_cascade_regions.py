"""The fovea with a level per region (issue 20 item 3): every cell read at the coarsest
candidate level that keeps its text legible, several modes each at its own level."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fovea_core import build_pyramid
from fovea_core.allocators.grid import resize_grid
from fovea_core.cascade import STAGE_FOVEA, STAGE_GIST, cascade_parts
from fovea_core.cascade.allocator import LEGIBLE_PX, REGION_STEP
from fovea_core.cascade.core import foveate_regions, region_levels
from fovea_core.cascade.localisers import answer_mass, uniform


def test_region_levels_takes_the_coarsest_level_at_or_below_the_need():
    levels = torch.tensor([0.0, 0.5, 1.0, 1.5])
    need = torch.tensor([[[-1.0, 0.0, 0.49, 0.5], [0.99, 1.2, 7.0, float("nan")]]])
    assert region_levels(need, levels).tolist() == [[[0, 0, 0, 1], [1, 2, 3, 0]]]


def _two_modes(size=(512, 512)):
    """Mass on two boxes: small text top-left (needs level 0), large text bottom-right
    (needs level 1.6)."""
    small, large = (32, 32, 160, 64), (288, 352, 480, 480)
    mass = answer_mass([small], size)[None] + answer_mass([large], size)[None]
    need = torch.zeros(1, *mass.shape[-2:])
    gh, gw = mass.shape[-2:]
    ys, xs = torch.meshgrid(torch.arange(gh) * 16.0, torch.arange(gw) * 16.0, indexing="ij")
    need[0][(ys >= 256) & (xs >= 256)] = 1.6
    return mass, need, small, large


def test_each_mode_is_read_at_its_own_level_and_every_token_is_spent():
    size = (512, 512)
    mass, need, small, large = _two_modes(size)
    levels = [0.0, 0.5, 1.0, 1.5]
    t = foveate_regions(mass, 40, image_size=size, need=need, levels=levels,
                        context_weight=0.0)
    assert t.budget == 40 and bool(t.is_distinct()[0]) and (t.stage == STAGE_FOVEA).all()
    c = t.centers_px()[0]
    lv = t.levels[0]
    in_small = (c[:, 0] >= small[0]) & (c[:, 0] < small[2]) & (c[:, 1] >= small[1]) \
        & (c[:, 1] < small[3])
    in_large = (c[:, 0] >= large[0] - 32) & (c[:, 1] >= large[1] - 32)
    assert int(in_small.sum()) == 16                 # 8 x 2 level-0 cells cover the small box
    assert bool((lv[in_small] == 0.0).all())
    assert bool(in_large.any()) and bool((lv[in_large] == 1.5).all())
    # the large region is read coarsely: few tokens for 12 x 8 level-0 cells of mass
    assert int(in_large.sum()) < 12 * 8 / 4


def test_the_map_orders_the_regions_not_the_cheapness_of_a_coarse_level():
    """A faint, large-text region does not take tokens before a dense small-text one."""
    size = (512, 512)
    mass, need, small, large = _two_modes(size)
    gh, gw = mass.shape[-2:]
    ys, xs = torch.meshgrid(torch.arange(gh) * 16.0, torch.arange(gw) * 16.0, indexing="ij")
    mass = mass * torch.where((ys >= 256) & (xs >= 256), 0.3, 1.0)[None]
    t = foveate_regions(mass, 16, image_size=size, need=need, levels=[0.0, 0.5, 1.0, 1.5],
                        context_weight=0.0)
    c = t.centers_px()[0]
    assert bool(((c[:, 0] < 256) & (c[:, 1] < 256)).all())   # all on the dense small text


def test_foveate_regions_rejects_bad_input():
    size = (256, 256)
    mass = torch.ones(1, 16, 16)
    need = torch.zeros(1, 16, 16)
    with pytest.raises(ValueError, match="ascending"):
        foveate_regions(mass, 4, image_size=size, need=need, levels=[0.5, 0.5])
    with pytest.raises(ValueError, match="ascending"):
        foveate_regions(mass, 4, image_size=size, need=need, levels=[-0.5, 0.5])
    with pytest.raises(ValueError, match="need"):
        foveate_regions(mass, 4, image_size=size, need=need[:, :8], levels=[0.0])
    with pytest.raises(ValueError, match="budget"):
        foveate_regions(mass, 257, image_size=size, need=need, levels=[0.0, 1.0])


@settings(max_examples=20, deadline=None)
@given(h=st.integers(300, 1400), w=st.integers(300, 1400), gb=st.sampled_from([32, 64, 96]),
       n=st.sampled_from([144, 273]))
def test_cascade_with_regions_spends_exactly_n_tokens(h, w, gb, n):
    pyr = build_pyramid(np.full((h, w, 3), 200, np.uint8))
    assume(pyr.grid_shape(16, 0)[0] * pyr.grid_shape(16, 0)[1] >= n)
    r, c, glevel = resize_grid((h, w), gb, 16)
    parts = cascade_parts(pyr, n, query="q", gist_budget=gb, localiser=uniform,
                          fovea="regions")
    t = parts.tokens
    assert t.budget == n and bool(t.is_distinct()[0])
    assert int((t.stage == STAGE_GIST).sum()) == r * c
    lv = t.levels[t.stage == STAGE_FOVEA]
    assert lv.numel() == n - r * c
    assert float(lv.max()) <= max(glevel - 0.5, 0.0) + 1e-6
    assert float(parts.levels[0]) == pytest.approx(float(lv.min()))
    # the candidate levels are REGION_STEP apart
    steps = (lv - lv.min()) / REGION_STEP
    assert torch.allclose(steps, steps.round(), atol=1e-4)


def test_cascade_regions_reads_large_text_coarser_than_small_text():
    """The gist's size head is replaced by a known size map (the side channel's route):
    the region whose text is four times taller is read two octaves coarser."""
    from fovea_core.cascade import allocator as A

    size = (768, 768)
    pyr = build_pyramid(np.full((*size, 3), 200, np.uint8))
    small, large = (32, 32, 224, 64), (400, 400, 736, 736)
    mass = lambda g, q: (answer_mass([small], size) + answer_mass([large], size))[None]  # noqa: E731
    gh, gw = pyr.grid_shape(16, 0)
    ys, xs = torch.meshgrid(torch.arange(gh) * 16.0, torch.arange(gw) * 16.0, indexing="ij")
    log_px = torch.where((ys >= 384) & (xs >= 384), math.log2(4 * LEGIBLE_PX),
                         math.log2(LEGIBLE_PX))[None]
    orig = A.text_size_map
    A.text_size_map = lambda g: log_px
    try:
        parts = cascade_parts(pyr, 273, query="q", localiser=mass, fovea="regions")
    finally:
        A.text_size_map = orig
    t = parts.tokens
    f = t.stage[0] == STAGE_FOVEA
    c, lv = t.centers_px()[0][f], t.levels[0][f]
    top_left = (c[:, 0] < 300) & (c[:, 1] < 300)
    far = (c[:, 0] >= 380) & (c[:, 1] >= 380)
    assert bool(top_left.any()) and bool(far.any())
    assert float(lv[far].min()) >= float(lv[top_left].max()) + 2 * REGION_STEP - 1e-6


def test_cascade_rejects_an_unknown_fovea_and_a_fixed_level_with_regions():
    pyr = build_pyramid(np.full((512, 512, 3), 200, np.uint8))
    with pytest.raises(ValueError, match="fovea must be one of"):
        cascade_parts(pyr, 273, query="q", localiser=uniform, fovea="rings")
    with pytest.raises(ValueError, match="level='auto'"):
        cascade_parts(pyr, 273, query="q", localiser=uniform, fovea="regions", level=0.5)
