"""``resize_nonblank``: the finest resize whose non-blank, non-duplicate cells fit N
(the PixelPrune-style document peer, issue 20 item 6).

No test depends on exact sampled pixel values (the sampler is area-based and may change);
they depend on which cells are uniform or repeated, and on the grid geometry.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fovea_core import as_image_batch, build_pyramid
from fovea_core.methods import INFO, allocate
from fovea_core.methods import allocator_reads
from fovea_core.allocators.grid import (NONBLANK_THRESHOLD, nonblank_cells, resize_grid,
                                        resize_scales)
from fovea_book.eval.documents import make_document
from fovea_core.pyramid import Pyramid


def _zeros(pyr: Pyramid) -> torch.Tensor:
    return torch.zeros(pyr.batch_size, *pyr.grid_shape(16, 0))


def _run(pyr: Pyramid, n: int, **kw):
    return allocate("resize_nonblank", pyr, _zeros(pyr), n, **kw)


def _check(ts, pyr: Pyramid, n: int) -> None:
    assert ts.budget == n and ts.batch_size == pyr.batch_size
    assert bool(ts.is_distinct().all())
    assert (ts.levels >= 0).all() and (ts.levels <= pyr.num_levels - 1).all()
    assert (ts.centers >= 0).all() and (ts.centers <= 1).all()


def _blank_page(h: int, w: int, box: tuple[int, int, int, int], seed: int = 0) -> torch.Tensor:
    """White ``[1, 3, h, w]`` page with random noise (no two cells alike) inside ``box``."""
    g = torch.Generator().manual_seed(seed)
    img = torch.ones(1, 3, h, w)
    y0, x0, y1, x1 = box
    img[..., y0:y1, x0:x1] = torch.rand(1, 3, y1 - y0, x1 - x0, generator=g)
    return img


# ----------------------------------------------------------------------------- the contract
@pytest.mark.parametrize("size", [(256, 256), (300, 500), (333, 517)])
@pytest.mark.parametrize("budget", [40, 150])
def test_exactly_n_distinct_tokens_on_random_pages(size, budget):
    g = torch.Generator().manual_seed(sum(size) + budget)
    pyr = build_pyramid(torch.rand(2, 3, *size, generator=g))
    gh, gw = pyr.grid_shape(16, 0)
    if budget > gh * gw:
        pytest.skip("budget beyond the full grid")
    ts = _run(pyr, budget)
    _check(ts, pyr, budget)
    # batch == per-image loop (the scale is chosen per image)
    for i in range(2):
        one = Pyramid(tuple(lv[i:i + 1] for lv in pyr.levels))
        alone = _run(one, budget)
        assert torch.equal(ts.centers[i], alone.centers[0])
        assert torch.equal(ts.levels[i], alone.levels[0])


def _document_with_margin() -> torch.Tensor:
    """A synthetic page (768 x 768) with a white margin of 256 px right and below."""
    doc = make_document(3, width=768, height=768)
    img = np.full((1024, 1024, 3), 255, np.uint8)
    img[:768, :768] = doc.image
    return as_image_batch(img)


@pytest.mark.parametrize("budget", [273, 576])
def test_synthetic_document_with_a_white_margin(budget):
    pyr = build_pyramid(_document_with_margin())
    ts = _run(pyr, budget)
    _check(ts, pyr, budget)
    _, _, level = resize_grid(pyr.image_size, budget)
    # the white margin and the paper between lines are skipped, so the page is read finer
    assert float(ts.levels[0].max()) < level - 0.25
    # no token of the chosen grid sits deep in the margin (only blank cells are there)
    side = 16 * 2 ** float(ts.levels[0].max())
    px = ts.centers_px()[0]
    assert not ((px[:, 0] > 768 + side) & (px[:, 1] > 768 + side)).any()


# ----------------------------------------------------------------------------- the rule
def test_a_large_blank_area_is_read_finer_than_resize():
    pyr = build_pyramid(_blank_page(512, 512, (64, 64, 192, 192)))     # 1/16 of the page
    n = 96
    ts = _run(pyr, n)
    _check(ts, pyr, n)
    _, _, level = resize_grid(pyr.image_size, n)
    main = float(ts.levels[0].max())                                    # the chosen grid
    assert main <= level - 1.0, (main, level)
    # and its kept cells fit: the grid's tokens (level == main) are at most n
    assert int((ts.levels[0] == ts.levels[0].max()).sum()) <= n


def test_the_chosen_scale_is_the_finest_that_fits():
    pyr = build_pyramid(_blank_page(384, 448, (40, 50, 200, 260), seed=1))
    n = 120
    ts = _run(pyr, n)
    sc, rr, cc = resize_scales(pyr.image_size)
    main = float(ts.levels[0].max())
    k = int(torch.argmin((torch.log2(1 / sc) - main).abs()))
    assert abs(math.log2(1 / float(sc[k])) - main) < 1e-5
    kept = nonblank_cells(pyr, int(rr[k]), int(cc[k]), main)[0]
    assert int(kept.sum()) <= n
    if k + 1 < len(sc):                                                   # next finer overflows
        nxt = nonblank_cells(pyr, int(rr[k + 1]), int(cc[k + 1]), math.log2(1 / float(sc[k + 1])))
        assert int(nxt.sum()) > n


@pytest.mark.parametrize("size,budget", [((256, 256), 64), ((300, 500), 100), ((333, 517), 273)])
def test_no_blank_cell_means_resize_exactly(size, budget):
    pyr = build_pyramid(torch.rand(1, 3, *size, generator=torch.Generator().manual_seed(5)))
    a = _run(pyr, budget)
    b = allocate("resize", pyr, _zeros(pyr), budget)
    assert torch.equal(a.centers, b.centers) and torch.equal(a.levels, b.levels)


def test_blank_and_duplicate_cells():
    # a motif repeated on the 16 px grid: every interior cell is the same patch
    g = torch.Generator().manual_seed(2)
    motif = torch.rand(3, 16, 16, generator=g)
    tiled = motif.repeat(1, 8, 8)[None]                                  # 128 x 128, 8 x 8 cells
    distinct = torch.rand(1, 3, 128, 128, generator=g)
    pyr = build_pyramid(torch.cat([tiled, distinct, torch.full((1, 3, 128, 128), 0.5)]))
    kept = nonblank_cells(pyr, 8, 8, 0.0)
    # repeated: at most one cell per kind of neighbourhood (corner, edge, interior) is kept
    assert 1 <= int(kept[0].sum()) <= 9
    assert int(kept[1].sum()) == 64                                      # nothing repeats
    assert int(kept[2].sum()) == 0                                       # uniform grey: blank
    # a faint ripple below one grey level is blank by default, not at threshold 0
    faint = 0.5 + 0.3 / 255 * torch.rand(1, 3, 128, 128, generator=g)
    fp = build_pyramid(faint)
    assert int(nonblank_cells(fp, 8, 8, 0.0).sum()) == 0
    assert int(nonblank_cells(fp, 8, 8, 0.0, threshold=0.0).sum()) == 64


def test_an_all_blank_page_reads_the_full_grid_nearest_the_centre():
    pyr = build_pyramid(torch.ones(1, 3, 128, 192))
    ts = _run(pyr, 20)
    _check(ts, pyr, 20)
    assert (ts.levels == 0).all()
    # the 20 level-0 cells nearest the page centre
    d = ((ts.centers_px()[0] - torch.tensor([96.0, 64.0])) ** 2).sum(-1)
    assert float(d.max()) <= 2 * 32.0**2


def test_leftovers_reread_kept_cells_one_octave_finer():
    pyr = build_pyramid(_blank_page(512, 512, (64, 64, 192, 192)))
    ts = _run(pyr, 96)
    lv = ts.levels[0]
    main = lv.max()
    extra = lv[lv < main]
    assert len(extra) == 96 - int((lv == main).sum())
    assert torch.allclose(extra, (main - 1).clamp(min=0).expand_as(extra))


def test_registered_as_a_content_method_that_ignores_scores():
    info = INFO["resize_nonblank"]
    assert info["content"] and not info["uses_scores"] and info["kind"] == "fixed"
    pyr = build_pyramid(torch.rand(1, 3, 128, 160))
    assert allocator_reads("resize_nonblank", pyr) == 128 * 160
    a = _run(pyr, 40)
    b = allocate("resize_nonblank", pyr, torch.rand(1, 8, 10), 40, fixation=(0.1, 0.9))
    assert torch.equal(a.centers, b.centers) and torch.equal(a.levels, b.levels)
    assert NONBLANK_THRESHOLD == pytest.approx(1 / 255)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("budget", [0, -3, 81, 2.5, True])
def test_budget_out_of_range_is_a_clear_error(budget):
    pyr = build_pyramid(torch.rand(1, 3, 128, 160))                     # 8 x 10 grid
    with pytest.raises(ValueError, match="budget"):
        _run(pyr, budget)


def test_budget_below_the_pyramid_depth_is_a_clear_error():
    pyr = build_pyramid(torch.rand(1, 3, 96, 160))                      # top grid 2 x 3
    with pytest.raises(ValueError, match="budget 2 needs level"):
        _run(pyr, 2)


@pytest.mark.parametrize("threshold", [-0.01, float("nan"), float("inf"), "0.1", None, True])
def test_bad_threshold_is_a_clear_error(threshold):
    pyr = build_pyramid(torch.rand(1, 3, 128, 160))
    with pytest.raises(ValueError, match="threshold"):
        _run(pyr, 40, threshold=threshold)
