"""Receptive-field size, acuity and the eccentricity -> mip-level rule.

Scalings used here (all linear in eccentricity E, deg), each with the quantity it
describes. The three constants of Harvey & Dumoulin, Freeman & Simoncelli and Song et al.
are UNVERIFIED: they are the values quoted in the project's seed documents and were not checked
against the papers' own numbers (``data/biology/published_anchors.csv``, status
``unverified``); treat them as plausible defaults, and the mip rule as a parameterised
rule, not as a fact about vision.

* Harvey & Dumoulin (2011), J Neurosci 31:13604: human V1 population receptive field
  (pRF) size grows linearly with E; ``sigma ~ 0.5 + 0.10 E`` deg (unverified), where sigma
  is the standard deviation of the 2-D Gaussian pRF.
* Freeman & Simoncelli (2011), Nat Neurosci 14:1195: "metamers of the ventral stream";
  V2-like pooling regions with scaling ``s ~ 0.46`` (unverified), where ``s`` is the ratio of
  pooling-region DIAMETER (radial extent) to eccentricity, ``d = s E``.
* Song, Levi & Pelli (2014), J Vis 14(5):3: acuity threshold size grows as
  ``a(E) = a0 (1 + E / E2)`` with ``E2 ~ 2.7`` deg (unverified; the eccentricity at which the
  foveal threshold doubles).
* Foveal cone Nyquist frequency: for a hexagonal mosaic with density ``d`` cones/deg^2 the
  Nyquist limit is ``f_N = 0.5 sqrt(2 d / sqrt(3))`` cycles/deg; Curcio et al.'s (1990) mean
  peak 199,000 cones/mm^2 (x 0.0752 mm^2/deg^2, Watson 2014 eq. A7) gives 65.7 c/deg, and
  Watson's own d_c(0) = 14,804.6 cones/deg^2 gives the 65.37 c/deg of his Table 3.

The mip-level rule (:func:`mip_level_for_eccentricity`) turns any of these size laws into a
pyramid level: level ``l`` samples every ``2**l`` base pixels, and the level increases by
one each time the chosen receptive-field quantity doubles relative to its value at the
point of fixation.
"""

from __future__ import annotations

import math

import numpy as np

from fovea_book.biology import check_eccentricity
from fovea_book.biology.cortex import HORTON_HOYT_E0, HORTON_HOYT_K, magnification

# UNVERIFIED constants (the seed documents' values, not checked against the papers):
HARVEY_SIGMA0 = 0.5       # deg, V1 pRF sigma intercept (Harvey & Dumoulin 2011)
HARVEY_SLOPE = 0.10       # deg/deg
FREEMAN_V2_SCALING = 0.46  # pooling diameter / eccentricity (Freeman & Simoncelli 2011)
SONG_E2 = 2.7             # deg (Song, Levi & Pelli 2014)

#: The receptive-field laws the mip rule can use: name -> (callable E -> size, quantity).
RF_MODELS = ("prf_sigma", "acuity", "cortical", "midget_spacing")


def prf_sigma(ecc_deg, intercept: float = HARVEY_SIGMA0, slope: float = HARVEY_SLOPE):
    """V1 pRF Gaussian sigma (deg): ``intercept + slope * E`` (Harvey & Dumoulin 2011;
    the default constants are unverified, see the module docstring)."""
    if not (np.isfinite(intercept) and intercept > 0):
        raise ValueError(f"intercept must be finite and > 0 deg, got {intercept}")
    if not (np.isfinite(slope) and slope >= 0):
        raise ValueError(f"slope must be finite and >= 0 deg/deg, got {slope}")
    e = check_eccentricity(ecc_deg)
    return intercept + slope * e


def pooling_diameter(ecc_deg, scaling: float = FREEMAN_V2_SCALING):
    """Pooling-region diameter (deg) ``s * E`` (Freeman & Simoncelli 2011; V2 s ~ 0.46).
    Zero at the fovea: the law is meant for the periphery."""
    if not (np.isfinite(scaling) and scaling > 0):
        raise ValueError(f"scaling must be finite and > 0, got {scaling}")
    e = check_eccentricity(ecc_deg)
    return scaling * e


def acuity_size(ecc_deg, e2: float = SONG_E2, a0: float = 1.0):
    """Acuity threshold size relative to the fovea: ``a0 (1 + E / E2)`` (Song et al. 2014)."""
    if not (np.isfinite(e2) and e2 > 0):
        raise ValueError(f"e2 must be finite and > 0 deg, got {e2}")
    e = check_eccentricity(ecc_deg)
    return a0 * (1.0 + e / e2)


def nyquist_from_density(density_per_deg2):
    """Nyquist frequency (cycles/deg) of a hexagonal lattice with the given density:
    row spacing ``sqrt(3)/2 * s`` with ``s = sqrt(2/(sqrt(3) d))``, ``f_N = 1 / (2 * row)``
    = ``0.5 * sqrt(2 d / sqrt(3))``."""
    d = np.asarray(density_per_deg2, dtype=float)
    if not np.all(np.isfinite(d)) or np.any(d <= 0):
        raise ValueError("density_per_deg2 must be finite and > 0")
    return 0.5 * np.sqrt(2.0 * d / np.sqrt(3.0))


def rf_size(ecc_deg, rf: str = "prf_sigma"):
    """Receptive-field size (deg) at ``ecc_deg`` under one of :data:`RF_MODELS`:

    * ``"prf_sigma"``: V1 pRF sigma, Harvey & Dumoulin (2011);
    * ``"acuity"``: acuity threshold size, Song et al. (2014), foveal value 1 (relative);
    * ``"cortical"``: ``1 / M(E)`` (deg per mm of V1, Horton & Hoyt 1991) -- the visual
      extent of a fixed patch of cortex;
    * ``"midget_spacing"``: midget RGC spacing on the temporal meridian (Watson 2014).
    """
    e = check_eccentricity(ecc_deg)
    if rf == "prf_sigma":
        return prf_sigma(e)
    if rf == "acuity":
        return acuity_size(e)
    if rf == "cortical":
        return 1.0 / magnification(e, HORTON_HOYT_K, HORTON_HOYT_E0)
    if rf == "midget_spacing":
        from fovea_book.biology.retina import midget_rf_density, spacing_from_density

        return spacing_from_density(midget_rf_density(e, "temporal"))
    raise ValueError(f"rf must be one of {RF_MODELS}, got {rf!r}")


def pixels_per_degree(fov_deg: float, image_px: int) -> float:
    """Pixels per degree when ``image_px`` pixels span ``fov_deg`` degrees.

    Assumption: a flat image viewed so that the visual angle per pixel is constant (small-
    angle approximation; for a 60 deg field the error at the edge is ~10%).
    """
    if not (np.isfinite(fov_deg) and 0 < fov_deg <= 180):
        raise ValueError(f"fov_deg must be in (0, 180], got {fov_deg}")
    if int(image_px) != image_px or image_px < 1:
        raise ValueError(f"image_px must be a positive integer, got {image_px}")
    return image_px / fov_deg


def max_mip_level(image_px: int, patch: int = 16) -> int:
    """Coarsest level at which one ``patch`` still fits: ``floor(log2(image_px / patch))``
    (the same rule as :func:`fovea_core.pyramid.default_num_levels`, minus one)."""
    if patch < 1 or image_px < patch:
        raise ValueError(f"need 1 <= patch <= image_px, got patch={patch}, image_px={image_px}")
    return int(math.floor(math.log2(image_px / patch)))


def mip_level_for_eccentricity(ecc_deg, *, fov_deg: float, image_px: int, patch: int = 16,
                               rf: str = "prf_sigma", max_level: int | None = None):
    """Pyramid level for a token centred at eccentricity ``ecc_deg`` from the fixation.

    Rule: ``level = floor(log2(size(E) / size(0)))`` clipped to ``[0, max_level]``, where
    ``size`` is the receptive-field law named by ``rf`` (see :func:`rf_size`): the level goes
    up by one -- the token's sample spacing doubles, ``2**level`` base pixels -- each time the
    receptive field doubles relative to the fixated one. ``floor`` is conservative: a token
    is never coarser than the receptive field allows.

    Assumptions (stated because they matter):
        * the image's ``image_px`` pixels (its longer side) span ``fov_deg`` degrees, and
          visual angle per pixel is constant (:func:`pixels_per_degree`); callers turn pixel
          distances into ``ecc_deg`` with :func:`pixel_eccentricity`, and ``fov_deg`` bounds
          the valid eccentricities (at most the image diagonal);
        * level 0 (full resolution) is the best the image offers, so it is assigned at the
          fixation whatever the viewing distance (a high-ppd image is not up-sampled);
        * ``max_level`` defaults to :func:`max_mip_level` ``(image_px, patch)``.

    Args:
        ecc_deg: eccentricities (deg), any shape, >= 0 and <= the image diagonal in deg.
    Returns:
        int64 array of levels, same shape as ``ecc_deg``.
    """
    ppd = pixels_per_degree(fov_deg, image_px)
    top = max_mip_level(image_px, patch) if max_level is None else int(max_level)
    if top < 0:
        raise ValueError(f"max_level must be >= 0, got {max_level}")
    e = check_eccentricity(ecc_deg, upper=math.sqrt(2.0) * image_px / ppd)
    ratio = rf_size(e, rf) / rf_size(0.0, rf)
    return np.clip(np.floor(np.log2(ratio) + 1e-12), 0, top).astype(np.int64)


def pixel_eccentricity(xy_px, fixation_px, *, fov_deg: float, image_px: int):
    """Eccentricity (deg) of pixel positions ``xy_px`` ``[..., 2]`` relative to
    ``fixation_px`` ``[2]`` (or broadcastable), under :func:`pixels_per_degree`."""
    ppd = pixels_per_degree(fov_deg, image_px)
    d = np.asarray(xy_px, dtype=float) - np.asarray(fixation_px, dtype=float)
    if d.shape[-1] != 2 or not np.all(np.isfinite(d)):
        raise ValueError("xy_px and fixation_px must be finite with a last axis of size 2")
    return np.hypot(d[..., 0], d[..., 1]) / ppd
