"""Chapter 03's checks of the log-polar transform (fovea_book.eval.logpolar_checks)."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from fovea_book.eval.logpolar_checks import (opencv_agreement, opencv_angle_error,  # noqa: E402
                                             shift_checks, shift_mismatch)
from fovea_book.plotting import shift_search_figure  # noqa: E402


def test_agreement_on_noise_forward_exact_inverse_bounded():
    rng = np.random.default_rng(0)
    side, ho, wo = 64, 64, 32
    noise = rng.random((side, side, 3), dtype=np.float32)
    a = opencv_agreement(noise, (30.0, 20.0), 28.0, (ho, wo))
    assert list(a.table.comparison)[0].startswith("forward LUT")
    assert len(a.table) == 6
    assert a.lut_identical                       # the forward map is OpenCV's, bit for bit
    assert a.fwd_err <= 1e-5
    assert a.table["max |diff|"].iloc[0] == 0
    # the inverse differs only by OpenCV's approximate angle: bounded by e * Ho / 2 pi
    ang = opencv_angle_error(rng.uniform(-side, side, (2, 10_000)).astype(np.float32))
    assert 0 < ang < math.radians(0.5)
    assert 0 < a.inv_err_max <= ang * ho / (2 * np.pi) + 1e-5
    assert 0 <= a.inv_err_mean <= a.inv_err_max
    assert 0.4 <= a.u8_err < 2                   # integer rounding and fixed-point weights


def test_agreement_rejects_bad_images():
    with pytest.raises(ValueError, match="image must be an"):
        opencv_agreement(np.zeros((8, 8), np.float32), (4, 4), 3, (8, 8))
    with pytest.raises(ValueError, match="image must be square"):
        opencv_agreement(np.zeros((8, 9, 3), np.float32), (4, 4), 3, (8, 8))
    with pytest.raises(ValueError, match="xy must be"):
        opencv_angle_error(np.zeros((3, 4)))


def test_shift_mismatch_finds_a_known_roll():
    rng = np.random.default_rng(1)
    ref = rng.random((16, 12, 3))
    moved = np.roll(ref, 3, axis=0)
    err = shift_mismatch(ref, moved, range(-5, 6), axis=0)
    assert int(np.arange(-5, 6)[err.argmin()]) == 3 and err.min() == 0
    moved = np.roll(ref, -2, axis=1)
    err = shift_mismatch(ref, moved, range(-4, 5), axis=1, columns=slice(4, 8))
    assert int(np.arange(-4, 5)[err.argmin()]) == -2
    with pytest.raises(ValueError, match="axis"):
        shift_mismatch(ref, ref, [0], axis=2)
    with pytest.raises(ValueError, match="moved must have"):
        shift_mismatch(ref, ref[:4], [0], axis=0)


def test_zoom_and_rotation_move_the_log_polar_image_as_predicted():
    yy, xx = np.mgrid[0:160, 0:160] / 160.0
    img = np.stack([np.sin(9 * xx) * np.cos(7 * yy), xx * yy, np.cos(13 * (xx - yy))], -1)
    img = ((img - img.min()) / np.ptp(img)).astype(np.float32)
    c = shift_checks(img, (74.0, 70.0), 70.0, (128, 64), zoom_columns=4, rotate_rows=9)
    assert c.scale == pytest.approx(math.exp(4 * math.log(70.0) / 64))
    assert c.angle_deg == pytest.approx(-360 * 9 / 128)
    assert c.rotation.expected == pytest.approx(9.0)
    assert c.zoom.expected == pytest.approx(4.0)
    assert c.rotation.found == 9 and c.rotation.holds
    assert c.zoom.found == 4 and c.zoom.holds
    assert c.zoom.residual < c.zoom.unshifted and c.rotation.residual < c.rotation.unshifted
    fig = shift_search_figure(c)
    assert len(fig.axes) == 6
