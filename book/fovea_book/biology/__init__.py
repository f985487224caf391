"""Biological models of foveated sampling (retina, cortex, psychophysics).

Submodules (import them explicitly; this package import stays light, numpy only):

- :mod:`fovea_book.biology.retina` -- cone density (Curcio et al. 1990) and the
  Watson (2014) retinal ganglion-cell density formula, deg<->mm conversions.
- :mod:`fovea_book.biology.cortex` -- V1 cortical magnification (Horton & Hoyt 1991),
  cortical-area integrals, the complex-log map (Schwartz 1980) and token budgets per
  eccentricity band.
- :mod:`fovea_book.biology.psychophysics` -- receptive-field / pRF size scaling,
  acuity and the eccentricity -> mip-level rule.

Provenance: every external number is a row of ``data/biology/published_anchors.csv``
(:func:`published_anchors`) with its source, the place in the source, the stated spread and a
status: ``published`` (read here in the source's words), ``unverified`` (attributed but not
checked against the paper) or ``derived``. Values our own formulas produce are regression
pins (``data/biology/regression_pins.csv``, :func:`regression_pins`), never "published".
"""

from __future__ import annotations

import numpy as np

__all__ = ["check_eccentricity", "published_anchors", "regression_pins", "anchor",
           "ANCHOR_STATUSES"]

ANCHORS_CSV = "data/biology/published_anchors.csv"
PINS_CSV = "data/biology/regression_pins.csv"
ANCHOR_STATUSES = ("published", "unverified", "derived")


def _read(rel: str):
    import pandas as pd

    from fovea_book.paths import project_root

    return pd.read_csv(project_root() / rel, comment="#").set_index("quantity")


def published_anchors():
    """External values with provenance, a DataFrame indexed by ``quantity`` with columns
    ``value, unit, status, source, location, spread, note`` (see the CSV header)."""
    return _read(ANCHORS_CSV)


def regression_pins():
    """Values our formulas produce, frozen (``value, unit, formula, note``): not data."""
    return _read(PINS_CSV)


def anchor(quantity: str) -> float:
    """The value of one row of :func:`published_anchors` (``KeyError`` if absent)."""
    return float(published_anchors().loc[quantity, "value"])


def check_eccentricity(ecc, name: str = "ecc_deg", *, upper: float | None = None,
                       unit: str = "deg") -> np.ndarray:
    """Validate eccentricities: a float array, finite, ``>= 0`` (and ``<= upper`` if given).

    Raises:
        ValueError: naming ``name`` and the accepted range, for NaN/inf, negative or
            too-large values.
    """
    e = np.asarray(ecc, dtype=float)
    rng = f"[0, {upper:g}] {unit}" if upper is not None else f"[0, inf) {unit}"
    if not np.all(np.isfinite(e)):
        raise ValueError(f"{name} must be finite (no NaN/inf); accepted range {rng}")
    if np.any(e < 0):
        raise ValueError(f"{name} must be >= 0; accepted range {rng}, got min {e.min():g}")
    if upper is not None:
        if np.any(e > upper * (1 + 1e-9)):  # tolerance for round-off, e.g. hypot(x, y)
            raise ValueError(f"{name} must be <= {upper:g}; accepted range {rng}, "
                             f"got max {e.max():g}")
        e = np.minimum(e, upper)
    return e
