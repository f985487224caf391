"""Whole-retina totals (chapter 01): the cone and ganglion-cell counts the density models
integrate to, and whether they fall inside the published counts.

Every count is :func:`fovea_book.biology.retina.count_in_disc` of a density; the notebook
shows the numbers and the figure, the integrals and their checks are here (tested in
``tests/test_biology.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fovea_book.biology import retina as R

#: the Curcio cone table ends at this retinal eccentricity (mm)
CONE_TABLE_END_MM = 17.91
#: radius (mm) of the eye's sphere for the curved area element
EYE_RADIUS_MM = 12.0
#: the disc radii (deg) that bracket the visual field's extent for the RGC total
RGC_BRACKET_DEG = (60.0, 100.0)


def rgc_density_xy(x_deg, y_deg):
    """Watson's (2014) ganglion-cell density (cells/deg^2) at visual-field ``(x, y)`` deg,
    with his elliptical interpolation between the meridians."""
    return R.density_xy(x_deg, y_deg, R.rgc_density)


def rgc_in_disc(radius_deg: float, *, n_r: int, n_theta: int) -> float:
    """Ganglion cells (all types) inside a visual-field disc of ``radius_deg`` degrees."""
    return R.count_in_disc(rgc_density_xy, radius_deg, n_r=n_r, n_theta=n_theta)


def cumulative_rgc(radii_deg: Sequence[float], *, n_r: int, n_theta: int) -> np.ndarray:
    """:func:`rgc_in_disc` for each radius of ``radii_deg`` (cells; increasing radii give a
    non-decreasing curve)."""
    radii = np.asarray(radii_deg, dtype=float)
    if radii.ndim != 1 or radii.size == 0:
        raise ValueError(f"radii_deg must be a non-empty 1-D sequence, got shape {radii.shape}")
    return np.array([rgc_in_disc(float(r), n_r=n_r, n_theta=n_theta) for r in radii])


@dataclass(frozen=True)
class RetinaTotals:
    """Counts (cells, not millions) of :func:`retina_totals`.

    Attributes:
        cones_flat, cones_sphere: the Curcio cone table integrated to its end (17.91 mm) with
            a planar and with a spherical (12 mm) area element.
        rgc_total, midget_total: Watson's ganglion and midget cells within ``max_ecc_deg``.
        rgc_bracket: ganglion cells within 60 and 100 deg (the field's extent is uncertain).
    """

    max_ecc_deg: float
    cones_flat: float
    cones_sphere: float
    rgc_total: float
    midget_total: float
    rgc_bracket: dict[float, float]

    @property
    def rgc_z(self) -> float:
        """``rgc_total`` in SDs from the optic-nerve fibre mean (Jonas et al. 1990)."""
        return (self.rgc_total - R.JONAS_FIBRES_MEAN) / R.JONAS_FIBRES_SD

    @property
    def rgc_counts(self) -> tuple[float, ...]:
        """The three RGC totals: within 60 deg, ``max_ecc_deg`` and 100 deg."""
        return (self.rgc_bracket[RGC_BRACKET_DEG[0]], self.rgc_total,
                self.rgc_bracket[RGC_BRACKET_DEG[1]])

    @property
    def within_jonas(self) -> bool:
        """Every RGC total lies within the optic-nerve fibre mean +- 1 SD."""
        return all(abs(v - R.JONAS_FIBRES_MEAN) <= R.JONAS_FIBRES_SD for v in self.rgc_counts)

    @property
    def within_curcio_allen(self) -> bool:
        """Every RGC total lies inside Curcio & Allen's range of total ganglion cells."""
        lo, hi = R.CURCIO_ALLEN_TOTAL_RGC_RANGE
        return all(lo <= v <= hi for v in self.rgc_counts)


def retina_totals(max_ecc_deg: float, *, n_r: int, n_theta: int) -> RetinaTotals:
    """Integrate the cone table and Watson's ganglion-cell densities over the retina.

    Args:
        max_ecc_deg: radius (deg) of the visual-field disc for the RGC totals.
        n_r, n_theta: the polar grid of :func:`fovea_book.biology.retina.count_in_disc`.
    """
    if not (np.isfinite(max_ecc_deg) and max_ecc_deg > 0):
        raise ValueError(f"max_ecc_deg must be finite and > 0, got {max_ecc_deg}")
    kw = dict(n_r=n_r, n_theta=n_theta)
    return RetinaTotals(
        max_ecc_deg=float(max_ecc_deg),
        cones_flat=R.count_in_disc(R.cone_density_xy_mm, CONE_TABLE_END_MM, **kw),
        cones_sphere=R.count_in_disc(R.cone_density_xy_mm, CONE_TABLE_END_MM,
                                     sphere_radius=EYE_RADIUS_MM, **kw),
        rgc_total=rgc_in_disc(max_ecc_deg, **kw),
        midget_total=R.count_in_disc(R.density_xy, max_ecc_deg, **kw),
        rgc_bracket={r: rgc_in_disc(r, **kw) for r in RGC_BRACKET_DEG})
