"""TokenSet: the fixed-size token contract and its geometry."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fovea_core import TokenSet


def make(b=2, n=5, **overrides):
    g = torch.Generator().manual_seed(0)
    fields = dict(centers=torch.rand(b, n, 2, generator=g), levels=torch.randint(0, 3, (b, n)),
                  scores=torch.rand(b, n, generator=g), fixations=torch.full((b, 2), 0.5),
                  image_size=(64, 96), patch=8)
    fields.update(overrides)
    return TokenSet(**fields)


def test_shapes_and_dtypes():
    t = make()
    assert (t.batch_size, t.budget) == (2, 5)
    assert t.centers.dtype == torch.float32 and t.levels.dtype == torch.float32
    assert t.fixations.shape == (2, 1, 2)          # [B, 2] is promoted to [B, 1, 2]


@pytest.mark.parametrize("field, value, message", [
    ("centers", torch.full((2, 5, 2), 1.5), "in \\[0, 1\\]"),
    ("centers", torch.full((2, 5, 2), float("nan")), "finite"),
    ("centers", torch.rand(10, 2), "ragged"),
    ("levels", -torch.ones(2, 5, dtype=torch.long), "levels must be >= 0"),
    ("levels", torch.zeros(2, 4, dtype=torch.long), "levels must be \\[B, N\\]"),
    ("scores", torch.full((2, 5), float("nan")), "scores must be finite"),
    ("scores", torch.full((2, 5), float("inf")), "scores must be finite"),
    ("levels", torch.full((2, 5), float("inf")), "levels must be finite"),
    ("levels", torch.full((2, 5), float("nan")), "levels must be finite"),
    ("fixations", torch.full((2, 2), 2.0), "fixations"),
    ("fixations", torch.full((3, 1, 2), 0.5), "fixations must be \\[B, K, 2\\]"),
])
def test_bad_input_is_named(field, value, message):
    with pytest.raises(ValueError, match=message):
        make(**{field: value})


def test_ragged_batch_cannot_be_built():
    with pytest.raises(ValueError, match="equal budget"):
        TokenSet.cat([make(n=5), make(n=6)])


def test_footprint_and_boxes():
    t = TokenSet(centers=[[[0.5, 0.5]]], levels=[[2]], scores=[[1.0]], fixations=[[0.5, 0.5]],
                 image_size=(64, 96), patch=8)
    assert t.footprint().item() == 32.0
    assert t.boxes()[0, 0].tolist() == [48 - 16, 32 - 16, 48 + 16, 32 + 16]


@settings(max_examples=30, deadline=None)
@given(rows=st.lists(st.integers(0, 7), min_size=1, max_size=20),
       level=st.integers(0, 2))
def test_from_grid_centres_fall_in_their_cell(rows, level):
    r = torch.tensor([rows])
    c = torch.flip(r, dims=[1])
    t = TokenSet.from_grid(r, c, level, image_size=(256, 256), patch=8)
    side = 8 * 2**level
    cell = torch.floor(t.centers_px() / side).long()
    inside = (r < 256 // side) & (c < 256 // side)
    assert torch.equal(cell[..., 1][inside], r[inside]) and torch.equal(cell[..., 0][inside], c[inside])


def test_distinctness():
    r = torch.tensor([[0, 1, 1], [0, 0, 0]])
    c = torch.tensor([[0, 1, 1], [0, 1, 2]])
    t = TokenSet.from_grid(r, c, 0, image_size=(64, 64), patch=16)
    assert t.is_distinct().tolist() == [False, True]


def test_batch_indexing_and_cat_roundtrip():
    t = make(b=3)
    again = TokenSet.cat([t[0], t[1:]])
    assert torch.equal(again.centers, t.centers) and torch.equal(again.levels, t.levels)
