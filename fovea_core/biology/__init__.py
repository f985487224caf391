"""Biological models of foveated sampling (retina, cortex, psychophysics).

Submodules (import them explicitly; this package import stays light, numpy only):

- :mod:`fovea_core.biology.retina` -- cone density (Curcio et al. 1990) and the
  Watson (2014) retinal ganglion-cell density formula, deg<->mm conversions.
- :mod:`fovea_core.biology.cortex` -- V1 cortical magnification (Horton & Hoyt 1991),
  cortical-area integrals, the complex-log map (Schwartz 1980) and token budgets per
  eccentricity band.
- :mod:`fovea_core.biology.psychophysics` -- receptive-field / pRF size scaling,
  acuity and the eccentricity -> mip-level rule.
"""

from __future__ import annotations

import numpy as np

__all__ = ["check_eccentricity"]


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
