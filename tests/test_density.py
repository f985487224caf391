"""Token density maps: mass, shape, scaling, and agreement with a per-token reference."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from fovea_book.eval.density import token_density
from fovea_core.tokens import TokenSet


def _tokens(centers, levels, size=(64, 96), patch=4):
    c = torch.as_tensor(centers, dtype=torch.float32)[None]
    lv = torch.as_tensor(levels)[None]
    return TokenSet(c, lv, torch.zeros_like(lv, dtype=torch.float32), torch.full((1, 1, 2), 0.5),
                    size, patch)


def test_box_token_inside_image_is_its_footprint():
    # a level-1 token (side 8 px) centred on pixel corner (48, 32): covers cols 44..51, rows 28..35
    t = _tokens([[0.5, 0.5]], [1])
    d = token_density(t, kernel="box", normalize=False)[0]
    assert d.sum() == pytest.approx(1.0)
    want = torch.zeros(64, 96)
    want[28:36, 44:52] = 1 / 64
    torch.testing.assert_close(d, want)


def test_box_partial_pixel_coverage_and_border_loss():
    # side 4 px centred at x = 1.0 (px): [-1, 3) -> half the mass leaves the image on the left
    t = _tokens([[1.0 / 96, 0.5]], [0])
    d = token_density(t, kernel="box", normalize=False)[0]
    assert d.sum() == pytest.approx(0.75)  # x in [0, 3) of [-1, 3) is 3/4 of the mass
    # centred at x = 10.5: [8.5, 12.5) covers half of pixel 8, pixels 9-11, half of pixel 12
    t = _tokens([[10.5 / 96, 0.5]], [0])
    row = token_density(t, kernel="box", normalize=False)[0].sum(0)
    np.testing.assert_allclose(row[7:14].numpy(), [0, 0.125, 0.25, 0.25, 0.25, 0.125, 0], atol=1e-6)


def test_gaussian_moments_follow_sigma_scale():
    t = _tokens([[0.5, 0.5]], [2])  # side 16 px
    for scale in (0.25, 0.5):
        d = token_density(t, sigma_scale=scale, normalize=False)[0].double()
        assert d.sum() == pytest.approx(1.0, abs=1e-4)
        x = torch.arange(96, dtype=torch.float64) + 0.5 - 48
        var = (d.sum(0) * x**2).sum()
        # pixel integration adds the box variance 1/12
        assert float(var) == pytest.approx((scale * 16) ** 2 + 1 / 12, rel=1e-3)


def test_fine_tokens_make_denser_regions():
    # four level-0 tokens on the left, one level-2 token on the right: same count, 16x the area
    left = [[0.20, 0.45], [0.24, 0.45], [0.20, 0.52], [0.24, 0.52]]
    t = _tokens(left + [[0.75, 0.5]], [0, 0, 0, 0, 2])
    d = token_density(t, kernel="box", normalize=False)[0]
    assert d[:, :48].max() > 10 * d[:, 48:].max()
    assert d[:, :48].sum() == pytest.approx(4.0, abs=1e-4)


def test_regular_grid_gives_flat_map():
    rows, cols = torch.meshgrid(torch.arange(8), torch.arange(12), indexing="ij")
    t = TokenSet.from_grid(rows.reshape(1, -1), cols.reshape(1, -1), 0, image_size=(64, 96),
                           patch=8)
    d = token_density(t, normalize=True)[0]
    inner = d[16:48, 16:80]  # away from the borders, where mass leaks out
    # peak to peak <= 4 * 2 exp(-2 pi^2 0.5^2) = 5.8 % of the mean (see the module docstring)
    assert float((inner.max() - inner.min()) / inner.mean()) < 0.058
    rough = token_density(t, sigma_scale=0.25)[0][16:48, 16:80]
    assert float((rough.max() - rough.min()) / rough.mean()) > 0.5
    box = token_density(t, kernel="box")[0]
    torch.testing.assert_close(box, torch.full_like(box, 1 / (64 * 96)))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 12), st.sampled_from(["gaussian", "box"]),
       st.integers(0, 10_000), st.sampled_from([(20, 30), (64, 96)]))
def test_matches_per_token_reference(b, n, kernel, seed, size):
    """The batched product equals summing each token's own separable map (a slow loop)."""
    g = torch.Generator().manual_seed(seed)
    t = TokenSet(torch.rand(b, n, 2, generator=g), torch.randint(0, 3, (b, n), generator=g),
                 torch.rand(b, n, generator=g), torch.full((b, 1, 2), 0.5), (64, 96), 4)
    w = torch.rand(b, n, generator=g)
    d = token_density(t, size, kernel=kernel, weights=w, normalize=False).double()
    h, wd = size
    ref = torch.zeros(b, h, wd, dtype=torch.float64)
    ys, xs = torch.arange(h + 1.0).double(), torch.arange(wd + 1.0).double()
    for i in range(b):
        for j in range(n):
            cx, cy = float(t.centers[i, j, 0]) * wd, float(t.centers[i, j, 1]) * h
            sx, sy = float(t.footprint()[i, j]) * wd / 96, float(t.footprint()[i, j]) * h / 64
            if kernel == "box":
                fx = (xs[1:].clamp(cx - sx / 2, cx + sx / 2)
                      - xs[:-1].clamp(cx - sx / 2, cx + sx / 2)) / sx
                fy = (ys[1:].clamp(cy - sy / 2, cy + sy / 2)
                      - ys[:-1].clamp(cy - sy / 2, cy + sy / 2)) / sy
            else:
                fx = np.diff(norm.cdf(xs.numpy(), cx, 0.5 * sx))
                fy = np.diff(norm.cdf(ys.numpy(), cy, 0.5 * sy))
            ref[i] += float(w[i, j]) * torch.outer(torch.as_tensor(fy), torch.as_tensor(fx))
    torch.testing.assert_close(d, ref, atol=1e-6, rtol=1e-4)


def test_normalize_and_resize():
    t = _tokens([[0.3, 0.3], [0.7, 0.6]], [0, 1])
    d = token_density(t, (16, 24))
    assert d.shape == (1, 16, 24)
    assert float(d.sum()) == pytest.approx(1.0, abs=1e-5)


def test_errors():
    t = _tokens([[0.5, 0.5]], [0])
    with pytest.raises(ValueError, match="kernel"):
        token_density(t, kernel="disc")
    with pytest.raises(ValueError, match="sigma_scale"):
        token_density(t, sigma_scale=0)
    with pytest.raises(ValueError, match="size"):
        token_density(t, (0, 5))
    with pytest.raises(ValueError, match="weights"):
        token_density(t, weights=torch.ones(1, 2))
    with pytest.raises(ValueError, match="weights"):
        token_density(t, weights=-torch.ones(1, 1))
