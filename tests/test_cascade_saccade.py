"""The second look (issue 20 item 3): the coarse look first, then the fine core only where it
showed ink. What a look showed is :func:`look_ink`; the saccade is ``fovea="saccade"``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fovea_core import build_pyramid
from fovea_core.cascade import STAGE_FOVEA, STAGE_GIST, cascade_parts
from fovea_core.cascade.core import INK_MIN, place_fovea, look_ink
from fovea_core.cascade.localisers import answer_mass, uniform


def _page(size=(256, 256)) -> np.ndarray:
    return np.full((*size, 3), 255, np.uint8)


def test_look_ink_marks_the_cells_with_ink_and_the_cells_the_look_saw():
    img = _page()
    img[32:40, 64:96] = 0                        # a mark 8 px tall, in cells (2, 4) and (2, 5)
    pyr = build_pyramid(img)
    look = place_fovea(torch.ones(1, 16, 16), 64, image_size=(256, 256), level=1.0)  # whole page
    ink, seen = look_ink(pyr, look)
    assert ink.shape == seen.shape == (1, 16, 16) and bool(seen.all())
    inked = (ink[0] >= INK_MIN).nonzero().tolist()
    assert inked == [[2, 4], [2, 5]]
    assert float(ink[0, 2, 4]) == pytest.approx(1.0, abs=1e-4)   # black on white paper
    # a look at the left half sees only the left half; ink is 0 where nothing was seen
    left = place_fovea(torch.ones(1, 16, 16) * (torch.arange(16) < 8), 32, image_size=(256, 256),
                   level=1.0)
    ink, seen = look_ink(pyr, left)
    assert bool(seen[0, :, :8].all()) and not bool(seen[0, :, 8:].any())
    assert (ink[0] >= INK_MIN).nonzero().tolist() == [[2, 4], [2, 5]]
    assert float(ink[0, :, 8:].abs().sum()) == 0.0


def test_look_ink_is_blind_to_polarity():
    img = _page()
    img[:] = 0                                   # white text on a black page
    img[32:40, 64:96] = 255
    ink, _ = look_ink(build_pyramid(img),
                      place_fovea(torch.ones(1, 16, 16), 64, image_size=(256, 256), level=1.0))
    assert (ink[0] >= INK_MIN).nonzero().tolist() == [[2, 4], [2, 5]]


def test_look_ink_rejects_a_look_of_another_page():
    pyr = build_pyramid(_page())
    look = place_fovea(torch.ones(1, 8, 8), 4, image_size=(128, 128), level=0.0)
    with pytest.raises(ValueError, match="belong to this pyramid"):
        look_ink(pyr, look)


SIZE = (1024, 1024)
REGION = (128, 128, 896, 896)                    # where the localiser's mass is, uniformly


def _lines_left_half() -> np.ndarray:
    """Text-like lines (3 px of ink every 8 px) in the left half of REGION only."""
    img = _page(SIZE)
    x0, y0, x1, y1 = REGION
    for y in range(y0, y1, 8):
        img[y:y + 3, x0:(x0 + x1) // 2] = 0
    return img


def _region_mass(g, q):
    return answer_mass([REGION], SIZE)[None].expand(g.image.shape[0], -1, -1)


def _fine_centres(parts):
    t = parts.tokens
    f = (t.stage[0] == STAGE_FOVEA) & (t.levels[0] == t.levels[0][t.stage[0] == 1].min())
    return t.centers_px()[0][f]


def test_the_second_look_reads_finely_only_where_the_first_showed_ink():
    pyr = build_pyramid(_lines_left_half())
    kw = dict(query="q", localiser=_region_mass, level=0.0, context_weight=0.0)
    sac = cascade_parts(pyr, 273, fovea="saccade", **kw)
    core = cascade_parts(pyr, 273, fovea="core", **kw)
    mid = (REGION[0] + REGION[2]) / 2
    # without the look the core spreads over the blank right half too (row-major ties) ...
    assert bool((_fine_centres(core)[:, 0] > mid).any())
    # ... after it, every fine token is on the lines the first look showed
    c = _fine_centres(sac)
    assert c.shape[0] == core.tokens.budget - core.gist.budget - 104
    assert bool((c[:, 0] < mid).all())
    # the first look is the surround's tokens, one octave coarser, placed before the core
    t = sac.tokens
    fov = t.stage[0] == STAGE_FOVEA
    assert t.budget == 273 and bool(t.is_distinct()[0])
    assert int((t.stage == STAGE_GIST).sum()) == sac.gist.budget
    assert sorted(set(t.levels[0][fov].tolist())) == [0.0, 1.0]
    first = t.levels[0][fov] == 1.0
    assert int(first.sum()) == 104 and bool(first[:104].all())


def test_saccade_on_a_batch_equals_each_image_alone():
    imgs = np.stack([_lines_left_half(), _lines_left_half()[:, ::-1].copy()])
    kw = dict(query="q", localiser=_region_mass, fovea="saccade")
    both = cascade_parts(build_pyramid(imgs), 273, **kw).tokens
    for b in range(2):
        one = cascade_parts(build_pyramid(imgs[b]), 273, **kw).tokens
        assert torch.equal(both.centers[b], one.centers[0])
        assert torch.equal(both.levels[b], one.levels[0])


def test_without_a_surround_share_there_is_no_first_look_and_the_saccade_is_the_core():
    pyr = build_pyramid(_lines_left_half())
    kw = dict(query="q", localiser=_region_mass, surround=0.0)
    sac = cascade_parts(pyr, 273, fovea="saccade", **kw).tokens
    core = cascade_parts(pyr, 273, fovea="core", **kw).tokens
    assert torch.equal(sac.centers, core.centers) and torch.equal(sac.levels, core.levels)


def test_core_share_counts_only_the_fovea_s_finest_tokens():
    """The answer (48 x 16 px): its first 16 px under a level-0 token, the rest under a
    level-1 one. The fovea covers all of it, its core a third."""
    from fovea_book.eval.localisation import localisation_row
    from fovea_core.tokens import TokenSet

    size = (256, 256)
    px = torch.tensor([[[24.0, 8.0], [48.0, 16.0], [128.0, 128.0]]])      # centres, px
    t = TokenSet(px / 256, torch.tensor([[0.0, 1.0, 3.0]]), torch.ones(1, 3),
                 torch.full((1, 1, 2), 0.5), size, 16, torch.tensor([[1, 1, 0]]))
    row = localisation_row(t, torch.ones(1, 16, 16), [(16, 0, 64, 16)])
    assert row["fovea_share"] == pytest.approx(1.0)
    assert row["core_share"] == pytest.approx(1 / 3)     # x 16..32 of 16..64 under level 0
    assert row["fovea_level"] == 0.0
