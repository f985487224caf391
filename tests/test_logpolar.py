"""fovea_book.logpolar: agreement with cv2.warpPolar, inverse, scale/rotation -> translation.

Tolerances (OpenCV 5.x, float32 images):
* forward: our LUT is OpenCV's internal map bit for bit (checked by feeding it to cv2.remap),
  and OpenCV's float32 remap uses exact float bilinear weights, so sampled outputs agree to
  float32 rounding of the weight products (1e-5 on [0, 1] images).
* inverse: OpenCV computes the angle with ``cv::cartToPolar`` (a float polynomial atan; the
  docs say "about 0.3 degrees", we measure at most 1.7e-4 rad = 0.01 degrees), we use
  ``atan2``. An angle error ``e`` moves a sample by ``e * Ho / (2 pi)`` rows, so on white
  noise (neighbour differences up to 1) outputs may differ by up to ``CART_TO_POLAR_ERR * Ho /
  (2 pi)``; on an image constant along the angle (only the radius mapping matters) the
  agreement is 1e-5 again.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fovea_book.logpolar import (from_logpolar, inverse_logpolar_lut, logpolar_lut, to_logpolar,
                                 wrap_angle)
from fovea_book.reference_samplers import remap

FLAGS = cv2.WARP_POLAR_LOG | cv2.INTER_LINEAR | cv2.WARP_FILL_OUTLIERS
CART_TO_POLAR_ERR = 2e-4   # rad: bound on cv2.cartToPolar's angle error (checked below)
CASES = [  # image (H, W), centre (x, y), max radius, log-polar (Ho, Wo)
    ((200, 240), (117.3, 95.6), 90.0, (64, 50)),
    ((128, 128), (0.0, 0.0), 181.0, (90, 128)),          # corner centre, circle leaves image
    ((97, 131), (130.0, 48.25), 40.5, (33, 17)),         # odd sizes, centre on the right edge
]


def _noise(h: int, w: int, c: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((h, w, c), dtype=np.float32)


def _smooth(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A smooth RGB float32 test image (blurred noise), so bilinear resampling is accurate."""
    img = cv2.GaussianBlur(_noise(h, w, 3, seed), (0, 0), 6.0)
    return ((img - img.min()) / (img.max() - img.min())).astype(np.float32)


def _t(hwc: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(hwc).permute(2, 0, 1)[None]


def _np(bchw: torch.Tensor) -> np.ndarray:
    return bchw[0].permute(1, 2, 0).numpy()


@pytest.mark.parametrize("size, center, radius, lp_size", CASES)
def test_forward_lut_is_opencvs_map_exactly(size, center, radius, lp_size):
    img = _noise(*size)
    ref = cv2.warpPolar(img, lp_size[::-1], center, radius, FLAGS)
    lut = logpolar_lut(center, lp_size, radius)[0].numpy()
    mine = cv2.remap(img, lut[..., 0], lut[..., 1], cv2.INTER_LINEAR,
                     borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    np.testing.assert_array_equal(mine, ref)


@pytest.mark.parametrize("backend", ["torch", "opencv", "auto"])
@pytest.mark.parametrize("size, center, radius, lp_size", CASES)
def test_to_logpolar_matches_warppolar(size, center, radius, lp_size, backend):
    img = _noise(*size)
    ref = cv2.warpPolar(img, lp_size[::-1], center, radius, FLAGS)
    out = to_logpolar(_t(img), center, radius, lp_size, backend=backend)
    assert out.shape == (1, 3, *lp_size)
    np.testing.assert_allclose(_np(out), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", ["torch", "opencv"])
def test_from_logpolar_matches_opencv_inverse(backend):
    size, center, radius, lp_size = CASES[0]
    lp = _noise(*lp_size, seed=1)
    ref = cv2.warpPolar(lp, size[::-1], center, radius, FLAGS | cv2.WARP_INVERSE_MAP)
    out = _np(from_logpolar(_t(lp), center, radius, size, backend=backend))
    err = np.abs(out - ref)
    bound = CART_TO_POLAR_ERR * lp_size[0] / (2 * math.pi)
    assert err.max() <= bound + 1e-5, (err.max(), bound)
    assert err.mean() < 0.1 * bound, (err.mean(), bound)
    # constant along angle: only the radius formula matters, which must match to rounding
    lp_r = np.repeat(lp[:1], lp_size[0], axis=0)
    ref_r = cv2.warpPolar(lp_r, size[::-1], center, radius, FLAGS | cv2.WARP_INVERSE_MAP)
    out_r = _np(from_logpolar(_t(lp_r), center, radius, size, backend=backend))
    np.testing.assert_allclose(out_r, ref_r, atol=1e-5, rtol=0)


def test_opencv_angle_error_is_within_the_assumed_bound():
    """The inverse tolerance rests on this: re-derive it if OpenCV changes cartToPolar."""
    rng = np.random.default_rng(0)
    x, y = (rng.uniform(-600, 600, 200_000).astype(np.float32) for _ in range(2))
    _, ang = cv2.cartToPolar(x, y)
    d = np.abs(ang.ravel() - np.mod(np.arctan2(y.astype(np.float64), x), 2 * np.pi))
    assert np.minimum(d, 2 * np.pi - d).max() < CART_TO_POLAR_ERR


def test_inverse_after_forward_is_identity_away_from_centre_and_border():
    h, w, center, radius = 160, 192, (95.5, 80.0), 75.0
    img = _smooth(h, w)
    lp = to_logpolar(_t(img), center, radius, (720, 256), backend="torch")
    back = _np(from_logpolar(lp, center, radius, (h, w), backend="torch"))
    yy, xx = np.mgrid[:h, :w]
    r = np.hypot(xx - center[0], yy - center[1])
    ring = (r > 4) & (r < radius - 4)
    err = np.abs(back - img)[ring]
    assert err.mean() < 2e-3 and err.max() < 0.03, (err.mean(), err.max())
    assert np.all(back[r > radius] == 0)          # outside the bounding circle: zeros


def _best_shift(a: np.ndarray, b: np.ndarray, axis: int, shifts: range, valid) -> int:
    """The cyclic shift of ``b`` along ``axis`` that best matches ``a`` (on ``valid``)."""
    errs = [np.abs(a - np.roll(b, s, axis=axis))[valid].mean() for s in shifts]
    return list(shifts)[int(np.argmin(errs))]


def test_scaling_becomes_translation_along_log_radius():
    h = w = 257
    c, radius, lp_size, k = (128.0, 128.0), 128.0, (256, 128), 9
    s = math.exp(k * math.log(radius) / lp_size[1])   # zoom that moves k log-radius columns
    img = _t(_smooth(h, w, seed=3))
    yy, xx = torch.meshgrid(torch.arange(h, dtype=torch.float32),
                            torch.arange(w, dtype=torch.float32), indexing="ij")
    zoom = torch.stack([c[0] + (xx - c[0]) / s, c[1] + (yy - c[1]) / s], -1)[None]
    zoomed = remap(img, zoom)                          # I_s(x) = I(c + (x - c) / s)
    a = _np(to_logpolar(img, c, radius, lp_size, backend="torch"))
    b = _np(to_logpolar(zoomed, c, radius, lp_size, backend="torch"))
    valid = np.zeros(a.shape, bool)
    valid[:, 40:lp_size[1] - 20] = True                # r >> 1 where log(r+1) ~ log r
    assert _best_shift(a, b, axis=1, shifts=range(-20, 21), valid=valid) == -k
    err = np.abs(a[:, 40:-20] - b[:, 40 + k:lp_size[1] - 20 + k])
    assert err.mean() < 0.01, err.mean()


def test_rotation_becomes_cyclic_translation_along_angle():
    h = w = 201
    c, radius, lp_size, k = (100.0, 100.0), 95.0, (120, 96), 7
    a_rad = 2 * math.pi * k / lp_size[0]
    img = _t(_smooth(h, w, seed=4))
    yy, xx = torch.meshgrid(torch.arange(h, dtype=torch.float32),
                            torch.arange(w, dtype=torch.float32), indexing="ij")
    ca, sa = math.cos(a_rad), math.sin(a_rad)
    dx, dy = xx - c[0], yy - c[1]   # rotated image: I_a(x) = I(c + R(-a)(x - c))
    rot = torch.stack([c[0] + ca * dx + sa * dy, c[1] - sa * dx + ca * dy], -1)[None]
    rotated = remap(img, rot)
    a = _np(to_logpolar(img, c, radius, lp_size))
    b = _np(to_logpolar(rotated, c, radius, lp_size))
    valid = np.zeros(a.shape, bool)
    valid[:, 10:] = True
    assert _best_shift(b, a, axis=0, shifts=range(-30, 31), valid=valid) == k
    assert np.abs(b - np.roll(a, k, axis=0))[valid].mean() < 5e-3


def test_batched_centres_equal_single_calls():
    img = _t(_noise(90, 110))
    centres = torch.tensor([[10.0, 20.0], [55.5, 44.0], [109.0, 89.0]])
    radii = torch.tensor([30.0, 60.0, 12.5])
    lut = logpolar_lut(centres, (40, 24), radii)
    assert lut.shape == (3, 40, 24, 2) and lut.dtype == torch.float32
    out = to_logpolar(img, centres, radii, (40, 24))
    for b in range(3):
        torch.testing.assert_close(lut[b], logpolar_lut(centres[b], (40, 24), radii[b])[0],
                                   rtol=0, atol=0)
        torch.testing.assert_close(out[b], to_logpolar(img, centres[b], float(radii[b]),
                                                       (40, 24), backend="opencv")[0],
                                   rtol=0, atol=1e-5)


def test_wrap_angle_pads_cyclically():
    lp = torch.arange(12.0).reshape(1, 1, 4, 3)
    w = wrap_angle(lp)
    assert w.shape == (1, 1, 6, 3)
    torch.testing.assert_close(w[0, 0, 0], lp[0, 0, -1])
    torch.testing.assert_close(w[0, 0, -1], lp[0, 0, 0])


@settings(max_examples=25, deadline=None)
@given(cx=st.floats(0, 300), cy=st.floats(0, 300), radius=st.floats(1.5, 500),
       ho=st.integers(1, 64), wo=st.integers(1, 64), b=st.integers(1, 3))
def test_lut_shape_and_ranges(cx, cy, radius, ho, wo, b):
    lut = logpolar_lut([[cx, cy]] * b, (ho, wo), radius)
    assert lut.shape == (b, ho, wo, 2) and lut.dtype == torch.float32
    c = torch.tensor([cx, cy], dtype=torch.float32)
    torch.testing.assert_close(lut[:, :, 0], c.expand(b, ho, 2), rtol=0, atol=0)  # rho_0 = 0
    r = torch.linalg.vector_norm(lut.double() - c.double(), dim=-1)              # [b, ho, wo]
    tol = 1e-6 * (radius + abs(cx) + abs(cy))
    assert (r <= radius - 1 + tol).all()                          # column wo would be R - 1
    assert (r[..., 1:] - r[..., :-1] >= -tol).all()               # radius grows with column
    torch.testing.assert_close(r, r[:, :1].expand_as(r), rtol=0, atol=tol)  # same per row
    inv = inverse_logpolar_lut([cx, cy], (17, 23), radius, (ho, wo))
    assert inv.shape == (1, 17, 23, 2)
    assert (inv[..., 0] >= 0).all() and (inv[..., 1] >= 1).all()
    assert (inv[..., 1] <= ho + 1).all()                          # inside the wrapped rows


@pytest.mark.parametrize("kwargs, match", [
    (dict(center=(-1.0, 5.0)), "center must lie in the image"),
    (dict(center=(5.0, 64.0)), "center must lie in the image"),
    (dict(center=(1.0, 2.0, 3.0)), "center must be"),
    (dict(center=(float("nan"), 2.0)), "center must be finite"),
    (dict(max_radius=-3.0), "max_radius must be finite and > 1"),
    (dict(max_radius=1.0), "max_radius must be finite and > 1"),
    (dict(max_radius=[10.0, 20.0]), "one value per centre"),
    (dict(out_size=(0, 8)), "out_size must be a pair of positive ints"),
    (dict(out_size=(8.5, 8)), "out_size must be a pair of positive ints"),
    (dict(out_size=8), "out_size must be a pair of positive ints"),
    (dict(backend="cuda"), "backend must be one of"),
])
def test_bad_inputs_raise_clear_errors(kwargs, match):
    args = dict(image=torch.rand(1, 3, 64, 80), center=(40.0, 30.0), max_radius=30.0,
                out_size=(16, 16))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        to_logpolar(**args)


def test_batch_mismatch_raises():
    with pytest.raises(ValueError, match="center has 3 rows but image batch is 2"):
        to_logpolar(torch.rand(2, 1, 32, 32), torch.full((3, 2), 10.0), 10.0, (8, 8))


def test_one_centre_many_images_and_autograd_uses_torch():
    imgs = torch.rand(2, 1, 40, 50, requires_grad=True)
    out = to_logpolar(imgs, (20.0, 25.0), 18.0, (12, 10))        # auto -> torch (needs grad)
    assert out.shape == (2, 1, 12, 10)
    out.sum().backward()
    assert imgs.grad is not None and imgs.grad.abs().sum() > 0
    ref = to_logpolar(imgs.detach(), (20.0, 25.0), 18.0, (12, 10), backend="opencv")
    torch.testing.assert_close(out.detach(), ref, rtol=0, atol=1e-5)
