"""The torch reference samplers (fovea_core.sample): conventions, oracles, borders, render."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fovea_core.pyramid import build_pyramid
from fovea_core.sample import remap, render, sample
from fovea_core.tokens import TokenSet


def _tokens(centers, levels, size, patch=16):
    c = torch.as_tensor(centers, dtype=torch.float32)
    lv = torch.as_tensor(levels, dtype=torch.int64)
    return TokenSet(c, lv, torch.zeros(lv.shape), torch.full((c.shape[0], 1, 2), 0.5), size,
                    patch)


# ------------------------------------------------------------------------------ remap
@settings(max_examples=25, deadline=None)
@given(h=st.integers(2, 40), w=st.integers(2, 40), seed=st.integers(0, 10_000))
def test_remap_matches_cv2_constant_border(h, w, seed):
    """Random LUTs reaching 3 px beyond every border: equal to cv2.remap (BORDER_CONSTANT 0)."""
    g = torch.Generator().manual_seed(seed)
    img = torch.rand(1, 3, h, w, generator=g)
    lut = torch.rand(1, 17, 13, 2, generator=g) * torch.tensor([w + 6.0, h + 6.0]) - 3
    ours = remap(img, lut)[0].permute(1, 2, 0).numpy()
    ref = cv2.remap(img[0].permute(1, 2, 0).numpy(), lut[0, ..., 0].numpy(),
                    lut[0, ..., 1].numpy(), cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT,
                    borderValue=0)
    # cv2 uses 5-bit fixed-point interpolation weights: agree to 1/32 of the pixel range
    assert np.abs(ours - ref).max() <= 1 / 32


def test_remap_identity_and_outside():
    img = torch.rand(2, 3, 9, 11)
    ys, xs = torch.meshgrid(torch.arange(9.0), torch.arange(11.0), indexing="ij")
    ident = torch.stack([xs, ys], -1)[None]
    assert torch.equal(remap(img, ident), img)                   # integer LUT reads pixels
    far = torch.full((1, 4, 5, 2), -5.0)
    assert torch.equal(remap(img, far), torch.zeros(2, 3, 4, 5))  # outside -> 0
    half = torch.tensor([[[[-0.5, 0.0]]]])                        # half a pixel left of 0
    assert torch.allclose(remap(img, half)[..., 0, 0], 0.5 * img[..., 0, 0])


def test_remap_per_image_lut_and_errors():
    img = torch.rand(2, 1, 5, 5)
    lut = torch.zeros(2, 1, 1, 2)
    lut[1] = 4.0
    out = remap(img, lut)
    assert out[0, 0, 0, 0] == img[0, 0, 0, 0] and out[1, 0, 0, 0] == img[1, 0, 4, 4]
    with pytest.raises(ValueError, match="lut"):
        remap(img, torch.zeros(3, 1, 1, 2))
    with pytest.raises(ValueError, match="image"):
        remap(img[0], lut)


# ------------------------------------------------------------------------------ sample
@settings(max_examples=25, deadline=None)
@given(level=st.integers(0, 3), row=st.integers(0, 3), col=st.integers(0, 4),
       patch=st.sampled_from([8, 14, 16]))
def test_grid_tokens_read_exact_pixels(level, row, col, patch):
    """A grid-aligned token of level l reads exactly its cell of level l (no interpolation)."""
    h, w = 4 * patch * 8, 5 * patch * 8
    pyr = build_pyramid(torch.rand(1, 3, h, w), num_levels=4)
    gh, gw = pyr.grid_shape(patch, level)
    r, c = min(row, gh - 1), min(col, gw - 1)
    ts = TokenSet.from_grid(torch.tensor([[r]]), torch.tensor([[c]]), level,
                            image_size=(h, w), patch=patch)
    got = sample(pyr, ts)[0, 0]
    want = pyr.levels[level][0, :, r * patch:(r + 1) * patch, c * patch:(c + 1) * patch]
    assert torch.equal(got, want)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), h=st.integers(16, 90), w=st.integers(16, 90),
       patch=st.sampled_from([4, 14, 16]))
def test_sample_matches_grid_sample_border(seed, h, w, patch):
    """Independent oracle: F.grid_sample (align_corners=False, padding 'border') per level."""
    g = torch.Generator().manual_seed(seed)
    pyr = build_pyramid(torch.rand(2, 2, h, w, generator=g), num_levels=3)
    n = 12
    centers = torch.rand(2, n, 2, generator=g)
    centers[:, :4] = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.37]])  # edges
    levels = torch.randint(0, 3, (2, n), generator=g)
    ts = _tokens(centers, levels, (h, w), patch)
    got = sample(pyr, ts)
    k = torch.arange(patch) - (patch - 1) / 2
    for b in range(2):
        for m in range(3):
            sel = (levels[b] == m).nonzero().squeeze(1)
            if sel.numel() == 0:
                continue
            lvl = pyr.levels[m][b:b + 1]
            hl, wl = lvl.shape[-2:]
            xs = centers[b, sel, 0:1] * w / 2**m + k                  # level-m continuous coords
            ys = centers[b, sel, 1:2] * h / 2**m + k
            gx = (2 * xs / wl - 1)[:, None, :].expand(-1, patch, -1)
            gy = (2 * ys / hl - 1)[:, :, None].expand(-1, -1, patch)
            grid = torch.stack([gx, gy], -1).reshape(1, -1, patch, 2)
            ref = F.grid_sample(lvl, grid, mode="bilinear", padding_mode="border",
                                align_corners=False)
            ref = ref.reshape(2, sel.numel(), patch, patch).permute(1, 0, 2, 3)
            assert (got[b, sel] - ref).abs().max() <= 1e-5


def test_clamp_to_edge_at_the_corner():
    """Token centred on the image corner: the samples beyond the border replicate pixel 0."""
    img = torch.rand(1, 3, 64, 64)
    pyr = build_pyramid(img, num_levels=1)
    out = sample(pyr, _tokens([[[0.0, 0.0]]], [[0]], (64, 64)))[0, 0]
    # sample k sits at index coordinate k - 8: k <= 8 clamps to pixel 0
    assert torch.equal(out[:, :9, :9], img[0, :, :1, :1].expand(3, 9, 9))
    assert torch.equal(out[:, 9:, 9:], img[0, :, 1:8, 1:8])


def test_constant_image_and_trilinear():
    pyr = build_pyramid(torch.full((1, 1, 128, 128), 0.25), num_levels=3)
    ts = _tokens(torch.rand(1, 20, 2), torch.randint(0, 3, (1, 20)), (128, 128))
    assert torch.allclose(sample(pyr, ts), torch.tensor(0.25), atol=1e-6)
    pyr = build_pyramid(torch.rand(1, 3, 128, 128), num_levels=3)
    ts = _tokens(torch.rand(1, 7, 2), torch.ones(1, 7, dtype=torch.int64), (128, 128))
    lo, hi = ts, _tokens(ts.centers, torch.full((1, 7), 2), (128, 128))
    assert torch.equal(sample(pyr, ts, lod=torch.ones(1, 7)), sample(pyr, lo))
    # lod 1.5: the average of levels 1 and 2 read at the same base positions (spacing 2**1.5)
    mid = sample(pyr, ts, lod=torch.full((1, 7), 1.5))
    assert not torch.allclose(mid, sample(pyr, lo)) and not torch.allclose(mid, sample(pyr, hi))
    assert mid.shape == (1, 7, 3, 16, 16)


def test_sample_rejects_bad_input():
    pyr = build_pyramid(torch.rand(1, 3, 64, 64), num_levels=2)
    with pytest.raises(ValueError, match="levels must lie in"):
        sample(pyr, _tokens([[[0.5, 0.5]]], [[2]], (64, 64)))
    with pytest.raises(ValueError, match="image_size"):
        sample(pyr, _tokens([[[0.5, 0.5]]], [[0]], (32, 64)))
    with pytest.raises(ValueError, match="batch"):
        sample(pyr, _tokens([[[0.5, 0.5]]] * 2, [[0]] * 2, (64, 64)))


# ------------------------------------------------------------------------------ render
def test_render_full_grid_reproduces_the_image():
    img = torch.rand(2, 3, 64, 96)
    pyr = build_pyramid(img, num_levels=2)
    rows, cols = torch.meshgrid(torch.arange(4), torch.arange(6), indexing="ij")
    ts = TokenSet.from_grid(rows.reshape(1, -1).expand(2, -1), cols.reshape(1, -1).expand(2, -1),
                            0, image_size=(64, 96))
    assert torch.equal(render(ts, sample(pyr, ts), background=pyr), img)


def test_render_fine_over_coarse_and_background():
    img = torch.rand(1, 3, 128, 128)
    pyr = build_pyramid(img, num_levels=3)
    # one coarse token (level 2: 64 px) at the top-left cell and one fine token inside it
    ts = TokenSet.from_grid(torch.tensor([[0, 1]]), torch.tensor([[0, 1]]),
                            torch.tensor([[2, 0]]), image_size=(128, 128))
    patches = sample(pyr, ts)
    out = render(ts, patches, background=pyr)
    fine = img[0, :, 16:32, 16:32]
    assert torch.equal(out[0, :, 16:32, 16:32], fine)                  # fine on top
    coarse = pyr.levels[2][0, :, :16, :16].repeat_interleave(4, 1).repeat_interleave(4, 2)
    assert torch.equal(out[0, :, :16, :64], coarse[:, :16, :64])        # coarse elsewhere
    bg = F.interpolate(pyr.levels[-1], size=(128, 128), mode="bilinear", align_corners=False)
    assert torch.equal(out[0, :, 64:, 64:], bg[0, :, 64:, 64:])         # gaps: background
    small = render(ts, patches, size=(64, 64), background=pyr)          # other output size
    assert small.shape == (1, 3, 64, 64)
    assert torch.equal(small[0, :, 8:16, 8:16], fine[:, 1::2, 1::2])   # pixel-centre sampling
    nobg = render(ts, patches)
    assert torch.allclose(nobg[0, :, 100, 100], patches[0].mean(dim=(0, 2, 3)))
