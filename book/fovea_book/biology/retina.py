"""Photoreceptor and retinal ganglion-cell sampling of the human retina.

Two sources:

* Curcio, Sloan, Kalina & Hendrickson (1990), *Human photoreceptor topography*, J Comp
  Neurol 292:497-523: measured cone density (cones/mm^2) along the four retinal meridians
  (``data/biology/curcio1990_cone_density.csv``, the data of their Fig. 6), interpolated
  here linearly in log density.
* Watson (2014), *A formula for human retinal ganglion cell receptive field density as a
  function of visual field location*, J Vis 14(7):15: closed-form RGC receptive-field
  density along the four VISUAL-FIELD meridians (eq. 4), the midget fraction (eq. 7), the
  midget RF density (eq. 8), spacing on a hexagonal lattice, the elliptical interpolation
  between meridians, and the mm<->deg conversions of his appendix (eqs. A5-A7).

Conventions: eccentricities are non-negative floats (degrees of visual angle unless a name
says ``_mm``); every function is vectorised over array input of any shape and returns an
array of the same shape. Watson's meridians are visual-field meridians ("temporal" visual
field = nasal retina); Curcio's are retinal meridians. Bad input raises ``ValueError``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable

import numpy as np

from fovea_book.biology import check_eccentricity

# Provenance of every constant below: data/biology/published_anchors.csv (status, place in
# the source, spread).
# --- Curcio et al. 1990 (abstract) --------------------------------------------------------
CURCIO_PEAK_CONES_PER_MM2 = 199_000.0       # mean of individual foveal peaks
CURCIO_PEAK_RANGE = (100_000.0, 324_000.0)  # across the 8 retinas
CURCIO_TOTAL_CONES = 4.6e6                  # per retina (4.08-5.29 million)
CURCIO_TOTAL_RODS = 92e6                    # per retina (77.9-107.3 million)
CURCIO_ROD_FREE_ZONE_MM = 0.350             # horizontal diameter (= 1.25 deg)
RETINAL_MERIDIANS = ("temporal", "superior", "nasal", "inferior")

# --- Curcio & Allen 1990 (abstract): total ganglion cells, 6 retinas ----------------------
CURCIO_ALLEN_TOTAL_RGC_RANGE = (0.7e6, 1.5e6)

# --- Jonas et al. 1990 (abstract): optic-nerve fibre count, 22 nerves ---------------------
JONAS_FIBRES_MEAN = 1_159_000.0
JONAS_FIBRES_SD = 196_000.0
JONAS_FIBRES_RANGE = (816_000.0, 1_502_000.0)

# --- Watson 2014 (Tables 1 and 3) ---------------------------------------------------------
WATSON_DC0 = 14_804.6        # peak cone density, cones/deg^2
WATSON_DGF0 = 33_162.3       # peak RGC receptive-field density, cells/deg^2 (eq. 4)
WATSON_RM = 41.03            # deg, scale of the midget fraction (eq. 7)
WATSON_F0 = 1.0 / 1.12       # midget fraction at the fovea (eq. 7)
#: (a_k, r2_k, re_k) per VISUAL-FIELD meridian, Watson (2014) Table 1.
WATSON_PARAMS: dict[str, tuple[float, float, float]] = {
    "temporal": (0.9851, 1.058, 22.14),
    "superior": (0.9935, 1.035, 16.35),
    "nasal": (0.9729, 1.084, 7.633),
    "inferior": (0.9960, 0.9932, 12.13),
}
VISUAL_FIELD_MERIDIANS = tuple(WATSON_PARAMS)
WATSON_MAX_ECC_DEG = 100.0   # the appendix polynomials are fits over 0-100 deg
MAX_RETINA_MM = 25.0


def _meridian(meridian: str, allowed: tuple[str, ...]) -> str:
    if meridian not in allowed:
        raise ValueError(f"meridian must be one of {allowed}, got {meridian!r}")
    return meridian


# --- unit conversions (Watson 2014, appendix) -----------------------------------------------
def mm_to_deg(r_mm):
    """Retinal eccentricity in mm -> visual angle in deg (Watson 2014, eq. A5).

    ``r_deg = 3.556 r + 0.05993 r^2 - 0.007358 r^3 + 0.0003027 r^4`` (r in mm), a fit to the
    Drasdo & Fowler (1974) schematic eye, measured from the fovea.
    """
    r = check_eccentricity(r_mm, "r_mm", upper=MAX_RETINA_MM, unit="mm")
    return 3.556 * r + 0.05993 * r**2 - 0.007358 * r**3 + 0.0003027 * r**4


def deg_to_mm(r_deg):
    """Visual angle in deg -> retinal eccentricity in mm (Watson 2014, eq. A6).

    ``r_mm = 0.268 r + 0.0003427 r^2 - 8.3309e-6 r^3`` (r in deg).
    """
    r = check_eccentricity(r_deg, "r_deg", upper=WATSON_MAX_ECC_DEG)
    return 0.268 * r + 0.0003427 * r**2 - 8.3309e-6 * r**3


def mm2_per_deg2(r_deg):
    """Retinal area per unit visual area, mm^2/deg^2, at eccentricity ``r_deg`` (eq. A7).

    ``a(r) = 0.0752 + 5.846e-5 r - 1.064e-5 r^2 + 4.116e-8 r^3``. Multiply a density per
    mm^2 by this factor to get a density per deg^2.
    """
    r = check_eccentricity(r_deg, "r_deg", upper=WATSON_MAX_ECC_DEG)
    return 0.0752 + 5.846e-5 * r - 1.064e-5 * r**2 + 4.116e-8 * r**3


# --- Curcio et al. 1990 cone density ----------------------------------------------------
CURCIO_CSV = "data/biology/curcio1990_cone_density.csv"


@lru_cache(maxsize=1)
def _curcio_table():
    import pandas as pd

    from fovea_book.paths import project_root

    df = pd.read_csv(project_root() / CURCIO_CSV, comment="#")
    return df.drop(columns=["deg"])


def curcio_table():
    """The Curcio et al. (1990) cone-density table as a DataFrame (columns ``mm`` and the
    four retinal meridians, cones/mm^2; NaN where not measured), a fresh copy. Read from
    ``data/biology/curcio1990_cone_density.csv`` (see its header for provenance)."""
    return _curcio_table().copy()


def cone_density_mm(r_mm, meridian: str = "mean"):
    """Cone density (cones/mm^2) at retinal eccentricity ``r_mm`` (Curcio et al. 1990, Fig. 6).

    Linear interpolation of log density between the tabulated eccentricities, per retinal
    meridian (missing cells, e.g. the optic disc on the nasal meridian, are bridged).
    ``meridian="mean"`` is the arithmetic mean of the four meridians (defined up to the
    shortest meridian's last sample, 17.91 mm). Eccentricities beyond a meridian's last
    measurement raise ``ValueError``.
    """
    m = _meridian(meridian, RETINAL_MERIDIANS + ("mean",))
    df = _curcio_table()
    names = RETINAL_MERIDIANS if m == "mean" else (m,)
    last = min(float(df["mm"][df[n].notna()].max()) for n in names)
    r = check_eccentricity(r_mm, "r_mm", upper=last, unit="mm")
    out = np.zeros_like(r)
    for n in names:  # loop over <= 4 meridians
        ok = df[n].notna().to_numpy()
        out += np.exp(np.interp(r, df["mm"].to_numpy()[ok], np.log(df[n].to_numpy()[ok])))
    return out / len(names)


def cone_density(ecc_deg, meridian: str = "mean", *, per: str = "mm2"):
    """Cone density at visual eccentricity ``ecc_deg`` (deg).

    Converts with :func:`deg_to_mm` (Watson eq. A6) and reads :func:`cone_density_mm`.
    ``meridian`` names a RETINAL meridian (or ``"mean"``). ``per="mm2"`` gives cones/mm^2,
    ``per="deg2"`` cones/deg^2 (times :func:`mm2_per_deg2`, eq. A7).
    """
    if per not in ("mm2", "deg2"):
        raise ValueError(f"per must be 'mm2' or 'deg2', got {per!r}")
    e = check_eccentricity(ecc_deg, "ecc_deg", upper=WATSON_MAX_ECC_DEG)
    d = cone_density_mm(deg_to_mm(e), meridian)
    return d * mm2_per_deg2(e) if per == "deg2" else d


def seed_exponential_cone_density(ecc_deg, peak: float = 199_000.0, rate: float = 0.42):
    """The seed documents' cone model ``peak * exp(-rate * E)`` (cones/mm^2). Shown only to
    be compared with the data: it falls far too fast (Curcio's density flattens out)."""
    e = check_eccentricity(ecc_deg, "ecc_deg")
    return peak * np.exp(-rate * e)


# --- Watson 2014 RGC formula ------------------------------------------------------------
def _watson_shape(r: np.ndarray, meridian: str) -> np.ndarray:
    a, r2, re = WATSON_PARAMS[_meridian(meridian, VISUAL_FIELD_MERIDIANS)]
    return a * (1.0 + r / r2) ** -2 + (1.0 - a) * np.exp(-r / re)


def rgc_density(ecc_deg, meridian: str = "temporal"):
    """Total RGC receptive-field density (cells/deg^2) on a visual-field meridian.

    Watson (2014) eq. 4: ``d_gf(r, k) = d_gf(0) [a_k (1 + r/r2_k)^-2 + (1 - a_k) exp(-r/re_k)]``
    with ``d_gf(0) = 33,162.3 deg^-2`` and ``(a, r2, re)`` from :data:`WATSON_PARAMS`. This is
    the density of receptive fields (ganglion cells referred to their inputs, i.e. with the
    foveal displacement removed).
    """
    r = check_eccentricity(ecc_deg, "ecc_deg", upper=WATSON_MAX_ECC_DEG)
    return WATSON_DGF0 * _watson_shape(r, meridian)


def midget_fraction(ecc_deg):
    """Fraction of RGCs that are midget cells, ``f(r) = f0 (1 + r/r_m)^-1`` with
    ``f0 = 1/1.12``, ``r_m = 41.03 deg`` (Watson 2014, eq. 7)."""
    r = check_eccentricity(ecc_deg, "ecc_deg", upper=WATSON_MAX_ECC_DEG)
    return WATSON_F0 / (1.0 + r / WATSON_RM)


def midget_rf_density(ecc_deg, meridian: str = "temporal"):
    """Midget RGC receptive-field density (cells/deg^2, ON + OFF) on a visual-field meridian.

    Watson (2014) eq. 8:
    ``d_mf(r, k) = 2 d_c(0) (1 + r/r_m)^-1 [a_k (1 + r/r2_k)^-2 + (1 - a_k) exp(-r/re_k)]``
    with ``d_c(0) = 14,804.6 cones/deg^2`` (two midget cells per foveal cone).
    """
    r = check_eccentricity(ecc_deg, "ecc_deg", upper=WATSON_MAX_ECC_DEG)
    return 2.0 * WATSON_DC0 / (1.0 + r / WATSON_RM) * _watson_shape(r, meridian)


def spacing_from_density(density):
    """Centre-to-centre spacing of a hexagonal lattice with ``density`` points per unit area:
    ``s = sqrt(2 / (sqrt(3) d))`` (Watson 2014, the spacing formula following eq. 8). For
    ON or OFF midget cells alone use ``density / 2``."""
    d = np.asarray(density, dtype=float)
    if not np.all(np.isfinite(d)) or np.any(d <= 0):
        raise ValueError("density must be finite and > 0")
    return np.sqrt(2.0 / (np.sqrt(3.0) * d))


def density_xy(x_deg, y_deg, fn: Callable = midget_rf_density):
    """Density at visual-field position ``(x, y)`` (deg) by Watson's elliptical interpolation.

    Watson (2014) assumes iso-spacing contours are ellipses through the four meridians:
    ``s(x, y)^2 = (x^2 s_h(r)^2 + y^2 s_v(r)^2) / r^2`` with ``r = sqrt(x^2 + y^2)``, which for
    densities (``d ~ 1/s^2``) reads ``d = r^2 / (x^2/d_h(r) + y^2/d_v(r))``. ``x > 0`` is the
    temporal visual field (right eye: the right side), ``y > 0`` the superior field.
    ``fn(r, meridian)`` is :func:`midget_rf_density` or :func:`rgc_density`. Shapes of
    ``x_deg`` and ``y_deg`` broadcast.
    """
    x, y = np.broadcast_arrays(np.asarray(x_deg, dtype=float), np.asarray(y_deg, dtype=float))
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("x_deg and y_deg must be finite (no NaN/inf)")
    r = np.hypot(x, y)
    check_eccentricity(r, "hypot(x_deg, y_deg)", upper=WATSON_MAX_ECC_DEG)
    dh = np.where(x >= 0, fn(r, "temporal"), fn(r, "nasal"))
    dv = np.where(y >= 0, fn(r, "superior"), fn(r, "inferior"))
    with np.errstate(invalid="ignore", divide="ignore"):
        d = r**2 / (x**2 / dh + y**2 / dv)
    return np.where(r == 0, dh, d)


def count_in_disc(fn_xy: Callable, radius: float, *, n_r: int = 400, n_theta: int = 360,
                  sphere_radius: float | None = None, r_min: float = 0.0) -> float:
    """Integrate a 2-D density over the annulus ``r_min <= r <= radius`` (polar trapezoid).

    ``fn_xy(x, y)`` returns a density per unit area of the coordinates. By default the area
    element is planar (``r dr dtheta``); with ``sphere_radius=R`` (same units as ``r``) it is
    the area element of a sphere with ``r`` measured as arc length from the pole,
    ``R sin(r/R) dr dtheta`` (use it for retinal mm). The grid is vectorised: ``[n_r, n_theta]``.
    """
    if not np.isfinite(radius) or radius <= r_min:
        raise ValueError(f"radius must be finite and > r_min={r_min}, got {radius}")
    r = np.linspace(r_min, radius, n_r)
    th = np.linspace(0.0, 2 * np.pi, n_theta, endpoint=False)
    rr, tt = np.meshgrid(r, th, indexing="ij")
    dens = fn_xy(rr * np.cos(tt), rr * np.sin(tt))
    jac = rr if sphere_radius is None else sphere_radius * np.sin(rr / sphere_radius)
    ring = dens.mean(axis=1) * 2 * np.pi * jac[:, 0]
    return float(np.trapezoid(ring, r))


def cone_density_xy_mm(x_mm, y_mm):
    """Curcio cone density (cones/mm^2) at retinal position ``(x, y)`` in mm, interpolated
    between the four meridians with the same elliptical rule as :func:`density_xy`.
    ``x > 0`` = temporal retina, ``y > 0`` = superior retina. Defined up to 17.91 mm."""
    x, y = np.broadcast_arrays(np.asarray(x_mm, dtype=float), np.asarray(y_mm, dtype=float))
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("x_mm and y_mm must be finite (no NaN/inf)")
    r = np.hypot(x, y)
    dh = np.where(x >= 0, cone_density_mm(r, "temporal"), cone_density_mm(r, "nasal"))
    dv = np.where(y >= 0, cone_density_mm(r, "superior"), cone_density_mm(r, "inferior"))
    with np.errstate(invalid="ignore", divide="ignore"):
        d = r**2 / (x**2 / dh + y**2 / dv)
    return np.where(r == 0, dh, d)
