"""Pin fovea_core.pyramid to OpenCV's cv2.pyrDown and to pyrtools' Gaussian pyramid."""

from __future__ import annotations

import cv2
import numpy as np
import pyrtools as pt
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fovea_core.pyramid import as_image_batch, build_pyramid, default_num_levels, pyr_down

# float32 round-off: the two implementations sum the same 25 products in different orders
ATOL = 1e-6


def _cv2_chain(img: np.ndarray, levels: int) -> list[np.ndarray]:
    out = [img]
    for _ in range(levels - 1):
        out.append(cv2.pyrDown(out[-1]))
    return out


@pytest.mark.parametrize("shape", [(32, 32), (33, 47), (5, 9), (3, 3), (64, 17), (101, 64)])
def test_pyr_down_matches_cv2_single_channel(shape):
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    ref = cv2.pyrDown(x)
    got = pyr_down(torch.from_numpy(x)[None, None])[0, 0].numpy()
    assert got.shape == ref.shape == ((shape[0] + 1) // 2, (shape[1] + 1) // 2)
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)


def test_build_pyramid_matches_cv2_batch_and_channels():
    rng = np.random.default_rng(1)
    batch = rng.random((3, 67, 45, 3), dtype=np.float32)  # [B,H,W,C], odd sizes
    pyr = build_pyramid(batch, num_levels=4)
    assert pyr.batch_size == 3 and pyr.channels == 3 and pyr.num_levels == 4
    for b in range(3):
        ref = _cv2_chain(batch[b], 4)  # cv2 handles HxWx3 float32 per channel
        for lvl, r in enumerate(ref):
            got = pyr.levels[lvl][b].permute(1, 2, 0).numpy()
            assert got.shape == r.shape
            np.testing.assert_allclose(got, r, atol=ATOL, rtol=0)


@settings(max_examples=25, deadline=None)
@given(h=st.integers(3, 70), w=st.integers(3, 70), seed=st.integers(0, 2**31 - 1))
def test_pyr_down_matches_cv2_any_size(h, w, seed):
    x = np.random.default_rng(seed).random((h, w), dtype=np.float32)
    got = pyr_down(torch.from_numpy(x)[None, None])[0, 0].numpy()
    np.testing.assert_allclose(got, cv2.pyrDown(x), atol=ATOL, rtol=0)


def test_uint8_input_is_scaled_then_matches_cv2():
    img = (np.random.default_rng(2).random((40, 30, 3)) * 255).astype(np.uint8)
    pyr = build_pyramid(img, num_levels=2)
    ref = cv2.pyrDown(img.astype(np.float32) / 255.0)
    np.testing.assert_allclose(pyr.levels[1][0].permute(1, 2, 0).numpy(), ref, atol=ATOL)


def test_matches_pyrtools_gaussian_pyramid():
    # pyrtools' 'binom5' is normalised to sum sqrt(2) per dimension (edge 'reflect1' =
    # reflect-101), so its level l equals ours times 2**l.
    x = np.random.default_rng(3).random((48, 40)).astype(np.float64)
    gp = pt.pyramids.GaussianPyramid(x, height=4)  # levels 0..3
    ours = build_pyramid(torch.from_numpy(x.astype(np.float32))[None, None], num_levels=4)
    for lvl in range(1, 4):
        ref = gp.pyr_coeffs[(lvl, 0)] / 2.0**lvl
        np.testing.assert_allclose(ours.levels[lvl][0, 0].numpy(), ref, atol=ATOL)


def test_mean_preserved_and_constant_image_fixed():
    # the binomial kernel sums to 1: a constant image stays constant at every level
    pyr = build_pyramid(torch.full((2, 1, 37, 29), 0.3), num_levels=4)
    for lvl in pyr.levels:
        assert torch.allclose(lvl, torch.tensor(0.3), atol=1e-6)


def test_levels_shapes_and_grid():
    pyr = build_pyramid(torch.zeros(1, 3, 100, 70), patch=16)
    assert pyr.num_levels == default_num_levels(100, 70, 16) == 3
    assert [tuple(l.shape[-2:]) for l in pyr.levels] == [(100, 70), (50, 35), (25, 18)]
    assert pyr.grid_shape(16, 0) == (7, 5) and pyr.grid_shape(16, 2) == (2, 2)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="H, W >= 3"):
        pyr_down(torch.zeros(1, 1, 2, 8))
    with pytest.raises(ValueError, match="num_levels"):
        build_pyramid(torch.zeros(1, 1, 32, 32), num_levels=0)
    with pytest.raises(ValueError, match="smaller than"):
        default_num_levels(8, 8, 16)
    with pytest.raises(TypeError):
        as_image_batch([[0.0]])


def test_integer_page_is_the_8bit_page_whatever_its_form():
    """An 8-bit page is known as one from a uint8 input (kept apart from the caller's
    tensor) and found from its float values k / 255; a page of other values has none."""
    from fovea_core.pyramid import integer_page

    g = torch.Generator().manual_seed(2)
    u8 = torch.randint(0, 256, (1, 3, 33, 47), generator=g).to(torch.uint8)
    want = u8.permute(0, 2, 3, 1).float()
    from_u8 = build_pyramid(u8.clone())
    assert torch.equal(integer_page(from_u8), want)
    from_float = build_pyramid(u8.float() / 255.0)
    assert torch.equal(integer_page(from_float), want)
    src = u8.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)   # channels last, as a file
    pyr = build_pyramid(src)
    src.zero_()                                              # the caller reuses its tensor
    assert torch.equal(integer_page(pyr), want)
    noisy = u8.float() / 255.0
    noisy[0, 1, 5, 7] += 1e-3
    assert integer_page(build_pyramid(noisy)) is None
    assert integer_page(build_pyramid(torch.rand(1, 3, 33, 47, generator=g))) is None
