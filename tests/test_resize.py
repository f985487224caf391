"""Tokens at any scale: the ``resize`` baseline and fractional levels through the pipeline
(sample, render, density, M-RoPE positions)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fovea_core import TokenSet, build_pyramid
from fovea_core.methods import allocate
from fovea_core.allocators.grid import resize_grid
from fovea_book.eval.density import token_density
from fovea_book.reference_samplers import render_blocks
from fovea_core.sample import render, sample
from fovea_book.qwen_pooled import footprint_weights
from fovea_core.vlm.positions import mrope_positions, token_scale


# ----------------------------------------------------------------------------- the rule
@settings(max_examples=200, deadline=None)
@given(h=st.integers(16, 3000), w=st.integers(16, 3000), frac=st.floats(0, 1),
       patch=st.sampled_from([14, 16]))
def test_resize_grid_is_the_largest_scale_that_fits(h, w, frac, patch):
    gh, gw = math.ceil(h / patch), math.ceil(w / patch)
    n = 1 + int(frac * (gh * gw - 1))
    rows, cols, level = resize_grid((h, w), n, patch)
    s = 2.0**-level
    assert 0 < s <= 1 and rows * cols <= n
    # the grid covers the page at that scale, with less than one cell of padding per axis
    assert rows == math.ceil(h * s / patch - 1e-9) and cols == math.ceil(w * s / patch - 1e-9)
    # any larger scale needs more cells than the budget (unless it is already full size)
    if s < 1:
        bigger = s * (1 + 1e-6)
        assert math.ceil(h * bigger / patch) * math.ceil(w * bigger / patch) > n


def test_resize_grid_examples_and_errors():
    assert resize_grid((1024, 1024), 273) == (16, 16, 2.0)            # 64 px cells
    assert resize_grid((1024, 1024), 4096) == (64, 64, 0.0)           # the full grid
    r, c, lv = resize_grid((1800, 600), 273)
    assert (r, c) == (27, 9) and lv == pytest.approx(math.log2(600 / (9 * 16)))
    for bad in (0, 4097, 2.5, True):
        with pytest.raises(ValueError, match="budget"):
            resize_grid((1024, 1024), bad)
    with pytest.raises(ValueError, match="image_size"):
        resize_grid((0, 10), 1)


# ----------------------------------------------------------------------------- the allocator
@pytest.mark.parametrize("size", [(1024, 1024), (1800, 600), (700, 450), (333, 517)])
@pytest.mark.parametrize("budget", [48, 96, 273])
def test_resize_tokens_tile_the_page_once(size, budget):
    h, w = size
    pyr = build_pyramid(torch.rand(1, 3, h, w))
    gh, gw = pyr.grid_shape(16, 0)
    ts = allocate("resize", pyr, torch.rand(1, gh, gw), budget)
    r, c, level = resize_grid(size, budget)
    assert ts.budget == budget and ts.is_distinct().all()
    main, extra = ts.levels[0, :r * c], ts.levels[0, r * c:]
    assert torch.allclose(main, torch.tensor(level)) and len(extra) == budget - r * c
    assert (extra == max(level - 1, 0)).all()
    # every base pixel lies in exactly one footprint of the main grid (no holes, no overlap);
    # points a hair off the pixel centres, so none sits exactly on a float32 cell boundary
    box = ts.boxes()[0, :r * c]
    ys, xs = torch.meshgrid(torch.arange(h) + 0.513, torch.arange(w) + 0.513, indexing="ij")
    px, py = xs.flatten()[::97], ys.flatten()[::97]
    inside = ((box[:, 0:1] <= px) & (px < box[:, 2:3]) & (box[:, 1:2] <= py) & (py < box[:, 3:4]))
    assert (inside.sum(0) == 1).all()
    # the grid is centred: the padding beyond the page is the same on both sides
    assert float(box[:, 0].min() + box[:, 2].max()) == pytest.approx(w, abs=1e-2)
    assert float(box[:, 1].min() + box[:, 3].max()) == pytest.approx(h, abs=1e-2)


@pytest.mark.parametrize("size", [(128, 128), (96, 160), (200, 136), (40, 40)])
def test_resize_accepts_every_budget_on_small_pages(size):
    """Every budget from the coarsest grid to the full one gives exactly that many distinct
    tokens. On tiny grids the leftovers outnumber the cells (a 1x1 grid at budget 3 leaves
    2): they cycle over the cells nearest the centre, each pass one octave finer (found by
    hypothesis in CI: 128 x 128, budget 3)."""
    h, w = size
    pyr = build_pyramid(torch.rand(1, 3, h, w))
    gh, gw = pyr.grid_shape(16, 0)
    th, tw = pyr.grid_shape(16, pyr.num_levels - 1)
    for budget in range(th * tw, gh * gw + 1):
        ts = allocate("resize", pyr, torch.rand(1, gh, gw), budget)
        r, c, level = resize_grid(size, budget)
        assert ts.budget == budget and ts.is_distinct().all(), budget
        k = torch.arange(budget - r * c)
        want = (level - 1 - k // (r * c)).clamp(min=0).float()
        torch.testing.assert_close(ts.levels[0, r * c:], want)


def test_resize_ignores_scores_and_fixation():
    pyr = build_pyramid(torch.rand(2, 3, 300, 500))
    gh, gw = pyr.grid_shape(16, 0)
    a = allocate("resize", pyr, torch.rand(2, gh, gw), 100)
    b = allocate("resize", pyr, torch.rand(2, gh, gw), 100, fixation=(0.1, 0.9))
    assert torch.equal(a.centers, b.centers) and torch.equal(a.levels, b.levels)
    assert torch.equal(a.centers[0], a.centers[1])


def test_resize_reconstruction_equals_a_plain_downscale_upscale():
    """What the reader sees from ``resize`` is the page at scale 2**-level, blown up again:
    on a page made of flat blocks aligned with the grid every token sample is that block's
    value, and the reconstruction keeps it away from the block edges."""
    h, w, budget = 512, 768, 96
    r, c, level = resize_grid((h, w), budget)
    side = 16 * 2**level
    img = torch.zeros(1, 1, h, w)
    rng = np.random.default_rng(0)
    vals = torch.from_numpy(rng.random((r, c)).astype(np.float32))
    oy, ox = (h - r * side) / 2, (w - c * side) / 2
    ys, xs = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
    ri = ((ys - oy) / side).floor().long().clamp(0, r - 1)
    ci = ((xs - ox) / side).floor().long().clamp(0, c - 1)
    img[0, 0] = vals[ri, ci]
    pyr = build_pyramid(img)
    ts = allocate("resize", pyr, torch.zeros(1, *pyr.grid_shape(16, 0)), budget)
    out = render(ts[0:1], sample(pyr, ts))
    # away from block edges (the bicubic reaches two samples), values are kept
    core = (((ys - oy) / side).frac() - 0.5).abs() < 0.2
    core &= (((xs - ox) / side).frac() - 0.5).abs() < 0.2
    assert (out[0, 0][core] - img[0, 0][core]).abs().max() < 0.02


# ----------------------------------------------------------------------------- other consumers
def _fractional_tokens() -> TokenSet:
    centers = torch.tensor([[[0.25, 0.25], [0.7, 0.4], [0.5, 0.8]]])
    levels = torch.tensor([[0.5, 1.3, 2.0]])
    return TokenSet(centers, levels, torch.ones(1, 3), torch.full((1, 1, 2), 0.5), (224, 224),
                    patch=28)


def test_positions_use_the_continuous_scale():
    ts = _fractional_tokens()
    scale = token_scale(ts, (8, 8))                       # merged cell = 28 px = one patch
    torch.testing.assert_close(scale, ts.levels)
    w = footprint_weights(ts, (8, 8))
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 3))
    # footprints of 28 * 2**l px (39.6, 68.9, 112 px) hold the merged-cell centres
    # 2 x 2, 3 x 2 and 4 x 4 (worked out by hand from the centres 14, 42, ... px)
    assert (w[0] > 0).sum(-1).tolist() == [4, 6, 16]
    pos = mrope_positions(ts, (8, 8))
    torch.testing.assert_close(pos.scale[0], ts.levels[0, pos.order[0]])


def test_density_mass_follows_the_fractional_footprint():
    ts = _fractional_tokens()
    d = token_density(ts, kernel="box", normalize=False)[0]   # tokens per pixel
    area = (28 * 2 ** ts.levels[0]) ** 2                        # footprint areas
    # each box token puts mass 1 over its footprint; token 2 (y in [123.2, 235.2)) loses the
    # 11.2 px beyond the 224 px page: the map integrates to 2 + 100.8 / 112 = 2.9
    assert float(d.sum()) == pytest.approx(2.9, rel=1e-4)
    # inside token 0 only (a 39.6 px square at (56, 56)): density = 1 / area
    assert float(d[56, 56]) == pytest.approx(1 / float(area[0]), rel=1e-3)


def test_render_paints_fractional_footprints_exactly():
    ts = _fractional_tokens()
    patches = torch.arange(3.0)[None, :, None, None, None].expand(1, 3, 1, 28, 28) + 1
    out = render_blocks(ts, patches.contiguous(), background=torch.zeros(1, 1, 4, 4))[0, 0]
    for n in range(3):
        x0, y0, x1, y1 = ts.boxes()[0, n].tolist()
        # pixel centres well inside the footprint (away from finer tokens) show token n
        i, j = int(y0 + 1), int(x0 + 1)
        if n == 2:                                       # the coarsest: check its bottom row
            i = min(int(y1 - 2), 223)
        assert out[i, j] == n + 1, (n, i, j)
    # just outside every footprint: background
    assert out[0, 223] == 0
