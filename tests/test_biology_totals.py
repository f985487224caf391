"""Whole-retina totals of chapter 01 (fovea_book.biology.totals)."""

from __future__ import annotations

import numpy as np
import pytest

from fovea_book.biology import retina as R
from fovea_book.biology.totals import (RGC_BRACKET_DEG, cumulative_rgc, retina_totals,
                                       rgc_in_disc)

KW = dict(n_r=120, n_theta=90)


def test_totals_are_the_integrals_of_the_densities():
    t = retina_totals(90.0, **KW)
    rgc = lambda x, y: R.density_xy(x, y, R.rgc_density)  # noqa: E731
    assert t.rgc_total == R.count_in_disc(rgc, 90.0, **KW)
    assert t.midget_total == R.count_in_disc(R.density_xy, 90.0, **KW)
    assert t.cones_flat == R.count_in_disc(R.cone_density_xy_mm, 17.91, **KW)
    assert t.cones_sphere == R.count_in_disc(R.cone_density_xy_mm, 17.91, sphere_radius=12.0,
                                             **KW)
    assert set(t.rgc_bracket) == set(RGC_BRACKET_DEG)
    assert t.rgc_bracket[60.0] < t.rgc_total < t.rgc_bracket[100.0]
    assert t.midget_total < t.rgc_total
    assert t.cones_sphere < t.cones_flat          # the sphere's area element is smaller
    assert t.rgc_z == pytest.approx((t.rgc_total - R.JONAS_FIBRES_MEAN) / R.JONAS_FIBRES_SD)


def test_verdicts_follow_the_published_counts():
    t = retina_totals(90.0, **KW)
    # Watson's field holds about a million cells: inside both published spreads
    assert t.within_jonas and t.within_curcio_allen
    # a disc of 5 deg holds far fewer: outside both
    small = retina_totals(5.0, **KW)
    assert small.rgc_counts[1] < R.JONAS_FIBRES_MEAN - R.JONAS_FIBRES_SD
    assert t.rgc_counts == (t.rgc_bracket[60.0], t.rgc_total, t.rgc_bracket[100.0])
    with pytest.raises(ValueError, match="max_ecc_deg"):
        retina_totals(0.0, **KW)


def test_cumulative_rgc_grows_with_the_disc():
    radii = np.linspace(1, 90, 6)
    cum = cumulative_rgc(radii, **KW)
    assert cum.shape == (6,) and np.all(np.diff(cum) > 0)
    assert cum[-1] == rgc_in_disc(90.0, **KW)
    with pytest.raises(ValueError, match="radii_deg"):
        cumulative_rgc([], **KW)
