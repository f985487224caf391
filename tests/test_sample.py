"""The torch reference samplers (fovea_core.sample): conventions, oracles, borders, render."""

from __future__ import annotations

import shutil

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fovea_core.pyramid import Pyramid, build_pyramid
from fovea_book.reference_samplers import (pyramid_atlas, remap, remap_fast, remap_reference,
                                           render_blocks, sample_mip, sample_reference)
from fovea_core.sample import render, sample, sample_positions
from fovea_core.tokens import TokenSet


def _tokens(centers, levels, size, patch=16):
    c = torch.as_tensor(centers, dtype=torch.float32)
    lv = torch.as_tensor(levels, dtype=torch.float32)
    return TokenSet(c, lv, torch.zeros(lv.shape), torch.full((c.shape[0], 1, 2), 0.5), size,
                    patch)


def _bilinear_ref(level: torch.Tensor, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Clamp-to-edge bilinear read of ``level [C, H, W]`` at index coordinates ``u, v [N, p]``
    (a separable grid per token) with ``F.grid_sample`` (align_corners=True, border):
    ``[N, C, p, p]``."""
    c, h, w = level.shape
    gx = 2 * u.clamp(0, w - 1) / max(w - 1, 1) - 1
    gy = 2 * v.clamp(0, h - 1) / max(h - 1, 1) - 1
    n, p = u.shape
    grid = torch.stack([gx[:, None, :].expand(n, p, p), gy[:, :, None].expand(n, p, p)], -1)
    out = F.grid_sample(level[None].expand(n, -1, -1, -1), grid, mode="bilinear",
                        padding_mode="border", align_corners=True)
    return out


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
    """A grid-aligned token of level l reads exactly its cell of mip level l (no
    interpolation), and its cell of the page's 2**l box average with the area filter."""
    h, w = 4 * patch * 8, 5 * patch * 8
    pyr = build_pyramid(torch.rand(1, 3, h, w), num_levels=4)
    gh, gw = pyr.grid_shape(patch, level)
    r, c = min(row, gh - 1), min(col, gw - 1)
    ts = TokenSet.from_grid(torch.tensor([[r]]), torch.tensor([[c]]), level,
                            image_size=(h, w), patch=patch)
    got = sample_mip(pyr, ts)[0, 0]
    want = pyr.levels[level][0, :, r * patch:(r + 1) * patch, c * patch:(c + 1) * patch]
    assert torch.equal(got, want)
    f = 2**level                                            # area: box means of the cell
    box = F.avg_pool2d(pyr.base[:, :, r * patch * f:(r + 1) * patch * f,
                                c * patch * f:(c + 1) * patch * f], f)[0]
    assert torch.allclose(sample(pyr, ts)[0, 0], box, atol=1e-6)


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
    got = sample_mip(pyr, ts)
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
    # level 1.5: levels 1 and 2 read at the same base positions (spacing 2**1.5), blended
    mid_ts = _tokens(ts.centers, torch.full((1, 7), 1.5), (128, 128))
    mid = sample_mip(pyr, mid_ts)
    assert not torch.allclose(mid, sample_mip(pyr, lo)) \
        and not torch.allclose(mid, sample_mip(pyr, hi))
    assert mid.shape == (1, 7, 3, 16, 16)
    # = 0.5 * (bilinear in level 1 + bilinear in level 2) at the positions of spacing 2**1.5
    xs, ys = sample_positions(mid_ts)
    want = 0
    for m in (1, 2):
        u, v = xs[0] / 2**m - 0.5, ys[0] / 2**m - 0.5
        lv = pyr.levels[m][0]
        want = want + 0.5 * _bilinear_ref(lv, u, v)
    assert torch.allclose(mid[0], want, atol=1e-5)


def test_sample_rejects_bad_input():
    pyr = build_pyramid(torch.rand(1, 3, 64, 64), num_levels=2)
    with pytest.raises(ValueError, match="tokens.levels must lie in"):
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
    patches = sample(pyr, ts)
    assert torch.equal(render_blocks(ts, patches, background=pyr), img)
    # bicubic at the samples' own positions reads them back (up to grid_sample's rounding)
    assert torch.allclose(render(ts, patches, background=pyr), img, atol=1e-5)


def test_blocks_painter_fine_over_coarse_and_background():
    img = torch.rand(1, 3, 128, 128)
    pyr = build_pyramid(img, num_levels=3)
    # one coarse token (level 2: 64 px) at the top-left cell and one fine token inside it
    ts = TokenSet.from_grid(torch.tensor([[0, 1]]), torch.tensor([[0, 1]]),
                            torch.tensor([[2, 0]]), image_size=(128, 128))
    patches = sample_mip(pyr, ts)
    out = render_blocks(ts, patches, background=pyr)
    fine = img[0, :, 16:32, 16:32]
    assert torch.equal(out[0, :, 16:32, 16:32], fine)                  # fine on top
    coarse = pyr.levels[2][0, :, :16, :16].repeat_interleave(4, 1).repeat_interleave(4, 2)
    assert torch.equal(out[0, :, :16, :64], coarse[:, :16, :64])        # coarse elsewhere
    bg = F.interpolate(pyr.levels[-1], size=(128, 128), mode="bilinear", align_corners=False)
    assert torch.equal(out[0, :, 64:, 64:], bg[0, :, 64:, 64:])         # gaps: background
    small = render_blocks(ts, patches, size=(64, 64), background=pyr)
    assert small.shape == (1, 3, 64, 64)
    assert torch.equal(small[0, :, 8:16, 8:16], fine[:, 1::2, 1::2])   # pixel-centre sampling
    nobg = render_blocks(ts, patches)
    assert torch.allclose(nobg[0, :, 100, 100], patches[0].mean(dim=(0, 2, 3)))


def test_smooth_painter_fine_over_coarse_with_soft_edges_and_background():
    """Coarse to fine: a fine token shows its own samples (deep inside it), the coarse
    token elsewhere in its footprint, the background beyond every token, and the change from
    one to the other is gradual (a soft edge, no step larger than the content's)."""
    img = torch.rand(1, 3, 128, 128)
    pyr = build_pyramid(img, num_levels=3)
    ts = TokenSet.from_grid(torch.tensor([[0, 1]]), torch.tensor([[0, 1]]),
                            torch.tensor([[2, 0]]), image_size=(128, 128))
    patches = sample(pyr, ts)
    out = render(ts, patches, background=pyr)
    assert torch.allclose(out[0, :, 18:30, 18:30], img[0, :, 18:30, 18:30], atol=1e-5)
    only_coarse = TokenSet.from_grid(torch.tensor([[0]]), torch.tensor([[0]]),
                                     torch.tensor([[2]]), image_size=(128, 128))
    ref = render(only_coarse, patches[:, :1], background=pyr)
    assert torch.allclose(out[0, :, 40:60, 40:60], ref[0, :, 40:60, 40:60], atol=1e-6)
    bg = F.interpolate(pyr.levels[-1], size=(128, 128), mode="bilinear", align_corners=False)
    assert torch.allclose(out[0, :, 80:, 80:], bg[0, :, 80:, 80:], atol=1e-6)
    # the coarse token's region ends within one of its samples (4 px) of its footprint
    assert torch.allclose(out[0, :, 70:, :], bg[0, :, 70:, :], atol=1e-6)


def test_smooth_window_equals_the_crop_and_rejects_bad_windows():
    g = torch.Generator().manual_seed(3)
    img = torch.rand(1, 3, 70, 90, generator=g)
    pyr = build_pyramid(img, num_levels=3)
    ts = _tokens(torch.rand(1, 20, 2, generator=g), torch.rand(1, 20, generator=g) * 2, (70, 90), 4)
    patches = sample(pyr, ts)
    for paint in (render, render_blocks):
        for size in (None, (35, 120)):
            full = paint(ts, patches, size, background=pyr)
            win = paint(ts, patches, size, background=pyr, window=(5, 30, 7, 33))
            assert torch.allclose(win, full[..., 5:30, 7:33], atol=1e-6)
    for bad in [(0, 0, 0, 5), (5, 3, 0, 5), (0, 71, 0, 5), (0.5, 3, 0, 5), "all"]:
        with pytest.raises(ValueError, match="window"):
            render(ts, patches, window=bad)
    with pytest.raises(ValueError, match="NaN"):
        render(ts, patches * float("nan"))


# ------------------------------------------------------------------------------ any scale
def _text_page() -> np.ndarray:
    """A grey synthetic text page (chapter 07's, seed 1000), 512 x 512 float32 in [0, 1]."""
    from fovea_book.eval.documents import make_document

    page = make_document(1000).image                         # 1024 x 1024 RGB uint8
    return np.ascontiguousarray(page[256:768, 256:768].mean(-1) / 255.0, dtype=np.float32)


@pytest.mark.parametrize("level", [1.0, 1.25, 1.5, 1.76, 2.0, 2.5])
def test_area_filter_is_the_processors_area_resample(level):
    """A token at level l carries the page resized by 2**-l the way a processor resizes it.

    Reference: ``cv2.resize(INTER_AREA)`` of the page to scale ``2**-l``, then the token's
    ``p x p`` cell of that image (the token grid is aligned with the resized pixel grid).
    The area filter equals it at every fractional level; the Gaussian pyramid's trilinear
    read (``sample_mip``, the kernels') is blurrier: on this text page its mean absolute
    error is ~0.045 and its contrast (std) ~25 % lower, the handicap that made every coarse
    token (``resize``, peripheries) read worse than a processor's resize.
    """
    img = _text_page()
    pyr = build_pyramid(torch.from_numpy(img)[None, None])
    side = int(round(512 * 2.0**-level))                     # resized page, square pixels
    lv = float(np.log2(512 / side))                          # the exact scale of that size
    area = cv2.resize(img, (side, side), interpolation=cv2.INTER_AREA)
    k = side // 16                                          # whole 16-px cells of it
    rows, cols = torch.meshgrid(torch.arange(k), torch.arange(k), indexing="ij")
    cell = 16 * 2**lv                                       # base px per cell
    cx = ((cols.flatten() + 0.5) * cell / 512)[None]
    cy = ((rows.flatten() + 0.5) * cell / 512)[None]
    ts = TokenSet(torch.stack([cx, cy], -1).float(), torch.full(cx.shape, lv),
                  torch.zeros(cx.shape), torch.full((1, 1, 2), 0.5), (512, 512), 16)
    want = torch.from_numpy(area[:k * 16, :k * 16]).reshape(k, 16, k, 16).permute(
        0, 2, 1, 3).reshape(k * k, 16, 16)
    got = sample(pyr, ts)[0, :, 0]
    # box edges are snapped to 1/1024 px (sample_area): up to ~2e-4 here, < 1/255
    assert float((got - want).abs().max()) < 1e-3
    mip = sample_mip(pyr, ts)[0, :, 0]
    assert float((mip - want).abs().mean()) > 0.03
    assert float(mip.std()) < 0.85 * float(want.std())


def _area_bicubic(img: np.ndarray, level: float) -> np.ndarray:
    """A processor's view of the page and back: INTER_AREA down to scale 2**-level,
    INTER_CUBIC up to the page size, clipped to [0, 1]."""
    h, w = img.shape
    s = 2.0**-level
    down = cv2.resize(img, (round(w * s), round(h * s)), interpolation=cv2.INTER_AREA)
    return np.clip(cv2.resize(down, (w, h), interpolation=cv2.INTER_CUBIC), 0, 1)


@pytest.mark.parametrize("page", ["synthetic", "receipt", "skimage"])
def test_resize_reconstructs_to_an_area_down_bicubic_up_resize(page):
    """The fair reading of coarse tokens (DESIGN.md): ``resize``'s TokenSet, sampled and
    painted, is the page resized the way a processor resizes it and upsampled bicubically
    (mean absolute difference <= 0.03; measured 0.001-0.003 here, and 0.002-0.024 on three
    SROIE receipts, where the rest is the sub-pixel phase of resize's centred grid). The old
    reading (mip filter, block painter) misses it by 5-10x."""
    from fovea_core.methods import ALLOCATORS
    from fovea_book.eval.documents import make_receipt

    if page == "synthetic":
        img = _text_page()
    elif page == "receipt":
        img = np.ascontiguousarray(make_receipt(3).image.mean(-1) / 255.0, dtype=np.float32)
    else:
        import skimage.data

        img = (skimage.data.page() / 255.0).astype(np.float32)
    pyr = build_pyramid(torch.from_numpy(img)[None, None])
    ts = ALLOCATORS["resize"](pyr, torch.zeros(1, *pyr.grid_shape(16)), 273)
    level = float(ts.levels.max())
    ref = _area_bicubic(img, level)
    fair = render(ts, sample(pyr, ts), background=pyr)[0, 0].clamp(0, 1).numpy()
    old = render_blocks(ts, sample_mip(pyr, ts), background=pyr)[0, 0]
    assert np.abs(fair - ref).mean() <= 0.03
    assert np.abs(old.clamp(0, 1).numpy() - ref).mean() > 2 * np.abs(fair - ref).mean()


def test_fractional_levels_render_and_sample_consistently():
    """A resize-style grid at a fractional level, rendered at the page size, puts every
    sample over the base pixels it was read from (no half-cell shift)."""
    img = torch.zeros(1, 1, 96, 96)
    img[..., 40:56, 40:56] = 1.0                            # a bright square in the middle
    pyr = build_pyramid(img)
    lv = float(np.log2(96 / (16 * 5)))                      # a 5 x 5 grid of 19.2 px cells
    cell = 16 * 2**lv
    rows, cols = torch.meshgrid(torch.arange(5), torch.arange(5), indexing="ij")
    cx = ((cols.flatten() + 0.5) * cell / 96)[None]
    cy = ((rows.flatten() + 0.5) * cell / 96)[None]
    ts = TokenSet(torch.stack([cx, cy], -1), torch.full(cx.shape, lv), torch.zeros(cx.shape),
                  torch.full((1, 1, 2), 0.5), (96, 96), 16)
    out = render(ts, sample(pyr, ts))
    assert out.shape == (1, 1, 96, 96)
    # the bright square stays where it is (centre of mass within one sample spacing)
    ys, xs = torch.meshgrid(torch.arange(96.0), torch.arange(96.0), indexing="ij")
    m = out[0, 0] - out[0, 0].min()
    com = ((m * xs).sum() / m.sum(), (m * ys).sum() / m.sum())
    assert abs(float(com[0]) - 48) < 2**lv and abs(float(com[1]) - 48) < 2**lv


@pytest.mark.parametrize("bad, match", [
    (dict(size=(0, 0)), "size"),
    (dict(size=(-4, 8)), "size"),
    (dict(size=(4.5, 8)), "size"),
    (dict(patch_side=8), "patches"),
    (dict(levels_beyond=True), "levels"),
])
def test_render_rejects_bad_input(bad, match):
    pyr = build_pyramid(torch.rand(1, 3, 64, 64), num_levels=2)
    ts = _tokens([[[0.5, 0.5]]], [[3.0 if bad.get("levels_beyond") else 0.0]], (64, 64))
    p = bad.get("patch_side", 16)
    patches = torch.rand(1, 1, 3, p, p)
    with pytest.raises(ValueError, match=match):
        render(ts, patches, bad.get("size"), background=pyr)


# ------------------------------------------------------------------------------ fast paths
def test_packed_atlas_levels_and_borders():
    """build_pyramid packs every level into one atlas (views of one storage, sides powers of
    two); the lines right of and below each level are 0, so no read can meet a NaN."""
    from fovea_core.pyramid import atlas_layout

    pyr = build_pyramid(torch.rand(2, 3, 70, 45), num_levels=4)
    at = pyramid_atlas(pyr)
    assert at is not None
    atlas, origins = at
    (ha, wa), org, sizes = atlas_layout(70, 45, 4)
    assert tuple(atlas.shape) == (2, 3, ha, wa) and origins == org
    assert ha & (ha - 1) == 0 and wa & (wa - 1) == 0
    for (y, x), (h, w), lv in zip(origins, sizes, pyr.levels):
        assert torch.equal(atlas[..., y:y + h, x:x + w], lv)
        right = atlas[..., y:y + h, x + w]
        below = atlas[..., y + h, x:x + w]
        assert torch.isfinite(right).all() and torch.isfinite(below).all()
    moved = pyr.to("meta")
    assert pyramid_atlas(moved) is not None                  # moved as one buffer
    assert pyramid_atlas(Pyramid(tuple(lv.contiguous() for lv in pyr.levels))) is None


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), h=st.integers(16, 90), w=st.integers(16, 90),
       frac=st.booleans(), atlas=st.booleans())
def test_fast_sample_equals_the_reference(seed, h, w, frac, atlas):
    """sample (one grid_sample on the atlas, or one per level) == sample_reference (the
    kernels' exact arithmetic) up to rounding of the normalised coordinates."""
    g = torch.Generator().manual_seed(seed)
    pyr = build_pyramid(torch.rand(2, 3, h, w, generator=g), num_levels=3)
    if not atlas:
        pyr = Pyramid(tuple(lv.contiguous() for lv in pyr.levels))
    cen = torch.rand(2, 30, 2, generator=g)
    cen[:, :4] = torch.tensor([[0.0, 0.0], [1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    lv = torch.rand(2, 30, generator=g) * 2 if frac else torch.randint(0, 3, (2, 30), generator=g)
    ts = _tokens(cen, lv, (h, w))
    ref = sample_reference(pyr, ts)
    assert (sample_mip(pyr, ts) - ref).abs().max() <= 1e-4


def test_fast_remap_equals_the_reference():

    g = torch.Generator().manual_seed(0)
    img = torch.rand(2, 3, 31, 47, generator=g)
    lut = torch.rand(2, 20, 25, 2, generator=g) * torch.tensor([51.0, 35.0]) - 2
    ref = remap_reference(img, lut)
    assert torch.equal(remap(img, lut), ref)
    assert (remap_fast(img, lut) - ref).abs().max() <= 1e-5
    assert (remap_fast(img.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2), lut)
            - ref).abs().max() <= 1e-5
    ys, xs = torch.meshgrid(torch.arange(31.0), torch.arange(47.0), indexing="ij")
    assert torch.equal(remap_fast(img, torch.stack([xs, ys], -1)[None]), img)  # integer LUT


# without g++ the C++ painter cannot be built and both renders would be the torch painter's
@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no CPU painter build")
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), h=st.integers(8, 70), w=st.integers(8, 70),
       frac=st.booleans(), size=st.sampled_from([None, (33, 47), (90, 20)]))
def test_cpu_painter_equals_the_torch_painter(seed, h, w, frac, size):
    """The C++ block painter (CPU) paints exactly the pixels of the torch painter: random
    off-grid centres, overlapping footprints, fractional levels, rescaled output."""
    g = torch.Generator().manual_seed(seed)
    n, p = 25, 4
    cen = torch.rand(2, n, 2, generator=g)
    lv = torch.rand(2, n, generator=g) * 3 if frac else torch.randint(0, 3, (2, n), generator=g)
    ts = _tokens(cen, lv, (h, w), p)
    patches = torch.rand(2, n, 3, p, p, generator=g)
    fast = render_blocks(ts, patches, size)
    ref = render_blocks(ts, patches, size, fast=False)
    assert torch.equal(fast, ref)


def test_smooth_windows_of_the_same_tokens_reuse_their_canvases(monkeypatch):
    """A reader renders one crop per answer line, and a page's questions share the tokens of
    a query-agnostic method: the canvases are built once per (tokens, patches, background),
    and rebuilt when the patches change (in place or another tensor)."""
    import fovea_core.sample as S

    g = torch.Generator().manual_seed(5)
    pyr = build_pyramid(torch.rand(1, 3, 64, 80, generator=g), num_levels=3)
    ts = _tokens(torch.rand(1, 12, 2, generator=g), torch.rand(1, 12, generator=g) * 2, (64, 80), 4)
    patches = sample(pyr, ts)
    calls = []
    real = S._canvases
    monkeypatch.setattr(S, "_canvases", lambda *a: calls.append(1) or real(*a))
    full = render(ts, patches, background=pyr)
    for win in [(0, 10, 0, 10), (20, 40, 5, 60), (50, 64, 70, 80)]:
        assert torch.equal(render(ts, patches, background=pyr, window=win),
                           full[..., win[0]:win[1], win[2]:win[3]])
    assert len(calls) == 1
    patches.mul_(0.5)                                        # in place: rebuilt
    halved = render(ts, patches, background=pyr)
    assert not torch.equal(halved, full) and len(calls) == 2
    assert torch.equal(render(ts, patches.clone(), background=pyr), halved)   # another tensor
    assert len(calls) == 3


def _textbook_table(base: torch.Tensor) -> torch.Tensor:
    """The summed-area table of ``base`` ``[B, C, H, W]`` padded by one replicated pixel,
    ``[B, H + 3, W + 3, C]`` float64, built the obvious way."""
    pad = F.pad(base.double(), (1, 1, 1, 1), mode="replicate").permute(0, 2, 3, 1)
    ref = torch.zeros(base.shape[0], base.shape[2] + 3, base.shape[3] + 3, base.shape[1],
                      dtype=torch.float64)
    ref[:, 1:, 1:] = pad.cumsum(2).cumsum(1)
    return ref


@pytest.mark.parametrize("eight_bit,float32_sums", [(True, True), (True, False), (False, False)])
def test_corner_table_is_the_padded_summed_area_table_at_its_corners(eight_bit, float32_sums,
                                                                     monkeypatch):
    """The table sample_area reads is the textbook one at the corners it asks for (relative
    to the first corner): exactly for an 8-bit page (integer sums, scale 255; in float32 or,
    past its exact range, float64), to float64 rounding for another; corners on the padding
    and beyond it included."""
    import fovea_core.sample as S
    from fovea_core.sample import _corner_table

    if not float32_sums:
        monkeypatch.setattr(S, "_EXACT_F32", 1.0)             # every sum past float32's range

    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 256, (2, 3, 40, 56), generator=g) / 255.0 if eight_bit else \
        torch.rand(2, 3, 40, 56, generator=g)
    pyr = build_pyramid(x)
    ref = _textbook_table(pyr.base)
    for rows, cols in [(torch.arange(43), torch.arange(59)),
                       (torch.tensor([0, 1, 7, 8, 30, 42]), torch.tensor([2, 3, 57, 58])),
                       (torch.tensor([5, 6, 11]), torch.tensor([40, 41]))]:
        table, scale = _corner_table(pyr, rows, cols)
        want = ref[:, rows][:, :, cols]
        want = want - want[:, :1] - want[:, :, :1] + want[:, :1, :1]
        assert scale == (255.0 if eight_bit else 1.0)
        if eight_bit:
            assert torch.equal(table, torch.round(want * 255))
        else:
            torch.testing.assert_close(table, want, rtol=0, atol=1e-12)


def test_area_read_of_an_8bit_page_is_its_exact_block_mean():
    """On an 8-bit page a grid-aligned token at level l reads the mean of its 2**l-pixel
    blocks rounded once to float32 (exact integer sums): the same value on any machine,
    whatever else is read in the same call."""
    from fovea_core.tokens import TokenSet

    g = torch.Generator().manual_seed(8)
    u8 = torch.randint(0, 256, (1, 3, 64, 96), generator=g)
    pyr = build_pyramid(u8.to(torch.uint8))
    p = 4
    for lv in (0, 1, 2):
        side = p * 2**lv
        gy, gx = torch.meshgrid(torch.arange(64 // side), torch.arange(96 // side),
                                indexing="ij")
        cen = torch.stack([(gx.reshape(-1) + 0.5) * side / 96,
                           (gy.reshape(-1) + 0.5) * side / 64], -1)[None]
        n = cen.shape[1]
        t = TokenSet(cen, torch.full((1, n), float(lv)), torch.zeros(1, n),
                     torch.full((1, 1, 2), 0.5), (64, 96), p)
        k = 2**lv
        sums = F.avg_pool2d(u8.double(), k) * (k * k)                   # exact integers
        want = (sums / (255.0 * k * k)).float()                        # [1, 3, 64/k, 96/k]
        want = want.unfold(2, p, p).unfold(3, p, p)                    # [1, 3, gh, gw, p, p]
        want = want.permute(0, 2, 3, 1, 4, 5).reshape(1, n, 3, p, p)
        got = sample(pyr, t)
        assert torch.equal(got, want), lv
        assert torch.equal(sample(pyr, TokenSet(cen[:, :1], t.levels[:, :1], t.scores[:, :1],
                                                t.fixations, (64, 96), p)), want[:, :1])


def test_an_8bit_page_token_reads_the_same_patch_alone_or_with_others():
    """Off the pixel grid and at fractional levels too, a token of an 8-bit page reads the
    same patch, bit for bit, alone or with any other tokens (each token's table is taken
    relative to its own corner, exactly; a shared table's large values would round the
    bilinear reads differently): a cascade may keep the patches its gist read."""
    from fovea_core.tokens import TokenSet

    g = torch.Generator().manual_seed(12)
    h, w = 600, 800                        # the shared table's values grow with the page
    pyr = build_pyramid(torch.randint(0, 256, (1, 3, h, w), generator=g).to(torch.uint8))
    n = 120
    cen = 0.6 + 0.4 * torch.rand(1, n, 2, generator=g)                  # far from the origin
    cen[0, 0] = 0.01                                                    # and one near it
    t = TokenSet(cen, torch.rand(1, n, generator=g), torch.zeros(1, n),
                 torch.full((1, 1, 2), 0.5), (h, w), 16)
    together = sample(pyr, t)
    rest = TokenSet(t.centers[:, 1:], t.levels[:, 1:], t.scores[:, 1:], t.fixations, (h, w), 16)
    assert torch.equal(sample(pyr, rest), together[:, 1:])


def test_area_reads_in_chunks_equal_one_read(monkeypatch):
    """sample_area bounds its memory by reading tokens in chunks; no sample changes."""
    import fovea_core.sample as S
    from fovea_core.tokens import TokenSet

    x = torch.rand(2, 3, 96, 128, generator=torch.Generator().manual_seed(4))
    pyr = build_pyramid(x)
    g = torch.Generator().manual_seed(5)
    t = TokenSet(torch.rand(2, 50, 2, generator=g), torch.rand(2, 50, generator=g) * 2,
                 torch.zeros(2, 50), torch.full((2, 1, 2), 0.5), (96, 128), 16)
    whole = S.sample_area(pyr, t)
    monkeypatch.setattr(S, "AREA_CHUNK", 14)                   # 7 tokens a chunk over B = 2
    assert torch.equal(S.sample_area(pyr, t), whole) and whole.shape == (2, 50, 3, 16, 16)
