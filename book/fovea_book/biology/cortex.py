"""V1 cortical magnification, cortical-area integrals, the complex-log map, token budgets.

* Horton & Hoyt (1991), Arch Ophthalmol 109:816-824: linear magnification of human V1
  ``M(E) = k / (E + e0)`` mm/deg with ``k = 17.3 mm`` and ``e0 = 0.75 deg`` (the standard
  form of their fit to the scotoma data; status "unverified" in
  ``data/biology/published_anchors.csv``: the paper was not re-read here). ``k`` is a
  constant, not the foveal value: ``M(0) = 17.3 / 0.75 = 23.07 mm/deg``.
* Areal magnification is ``M^2`` (mm^2/deg^2), assuming local isotropy.
* Cortical area of the visual disc of radius E: a ring ``[eps, eps + d eps]`` of one
  hemifield has visual area ``pi * eps * d eps`` and maps to ``pi * eps * M(eps)^2 d eps`` mm^2,
  so per hemisphere ``A(E) = pi k^2 [ln((E + e0)/e0) - E/(E + e0)]`` (closed form of that
  integral; ``hemifields=2`` for both hemispheres).
* **The half-disc assumption.** ``A(E)`` integrates a half-disc of radius ``E`` at every
  polar angle. The real hemifield is not a half-disc: the nasal field of the eye on the
  same side ends near 60 deg, the superior field near 60 deg and the inferior near
  70-75 deg; only the other eye's temporal field reaches 90 deg and beyond (approximate
  textbook limits). So "the V1 total" ``A(90)`` (3,577 mm^2 per hemisphere with Horton &
  Hoyt) is a half-disc total, an upper-end value, and every "share of V1" divided by it
  inherits that assumption (``A(60)`` is 10 % smaller).
* Independent check: Dougherty et al. (2003, abstract) measured a mean V1 area of 1,470 mm^2
  between 2 and 12 deg (per hemisphere, fMRI, 14 hemispheres), varying about 2.5-fold
  across people; Horton & Hoyt's law gives 1,241 mm^2 (``tests/test_biology.py``).
* Schwartz (1980), Vision Res 20:645-669 (after Schwartz 1977, Biol Cybern 25:181): complex-log map
  ``w = k log(z + a)``; ``a ~ 0.75 deg`` (Horton & Hoyt's e0), Schira et al. (2010) use 1.05.

All functions are vectorised numpy; eccentricities in degrees, validated (NaN or negative
values raise ``ValueError``).
"""

from __future__ import annotations

import numpy as np

from fovea_book.biology import check_eccentricity

from fovea_core.allocators.cortical import HORTON_HOYT_E0, HORTON_HOYT_K  # (Horton & Hoyt 1991)
#: Dougherty et al. (2003) V1 fit of M(E) = A / (E + E2), as commonly quoted:
#: A = 29.2 mm, E2 = 3.67 deg (fMRI, central 12 deg). UNVERIFIED: not checked against the
#: paper here (published_anchors.csv). Only the 2-12 deg V1 area (1,470 mm^2) was.
DOUGHERTY_K: float = 29.2
DOUGHERTY_E0: float = 3.67
#: Schira et al. (2010) foveal parameter of the log map (deg).
SCHIRA_A: float = 1.05


def _check_params(k: float, e0: float) -> None:
    if not (np.isfinite(k) and k > 0):
        raise ValueError(f"k must be finite and > 0 (mm), got {k}")
    if not (np.isfinite(e0) and e0 > 0):
        raise ValueError(f"e0 must be finite and > 0 (deg), got {e0}")


def _check_hemifields(hemifields: int) -> None:
    if hemifields not in (1, 2):
        raise ValueError(f"hemifields must be 1 (one hemisphere) or 2 (both), got {hemifields}")


def magnification(ecc_deg, k: float = HORTON_HOYT_K, e0: float = HORTON_HOYT_E0):
    """Linear cortical magnification ``M(E) = k / (E + e0)`` in mm/deg (Horton & Hoyt 1991).

    Args:
        ecc_deg: eccentricity (deg), any shape, >= 0.
    Returns:
        array of the same shape, mm of V1 per degree of visual angle.
    """
    _check_params(k, e0)
    e = check_eccentricity(ecc_deg)
    return k / (e + e0)


def areal_magnification(ecc_deg, k: float = HORTON_HOYT_K, e0: float = HORTON_HOYT_E0):
    """Areal magnification ``M(E)^2`` in mm^2/deg^2 (isotropic local map)."""
    return magnification(ecc_deg, k, e0) ** 2


def cortical_area(ecc_deg, k: float = HORTON_HOYT_K, e0: float = HORTON_HOYT_E0,
                  hemifields: int = 1):
    """V1 area (mm^2) representing the visual disc ``0..E`` (closed form).

    ``A(E) = h * pi * k^2 [ln((E + e0)/e0) - E/(E + e0)]`` = ``int_0^E h pi eps M(eps)^2 d eps``,
    with ``h`` hemifields (1 = one hemisphere, which represents one hemifield).

    Assumes the hemifield is a half-disc of radius ``E`` at every polar angle. For large
    ``E`` that overstates the field (the nasal field ends near 60 deg, see the module
    docstring): ``cortical_area(90)`` is the V1 total *of a 0-90 deg half-disc*, not of the
    real visual field.
    """
    _check_params(k, e0)
    _check_hemifields(hemifields)
    e = check_eccentricity(ecc_deg)
    x = e / e0
    # ln(1+x) - x/(1+x) = sum_{n>=2} (-1)^n (n-1)/n x^n; the series avoids cancellation
    series = x**2 / 2 - 2 * x**3 / 3 + 3 * x**4 / 4 - 4 * x**5 / 5
    direct = np.log1p(x) - x / (1.0 + x)
    return hemifields * np.pi * k**2 * np.where(x < 1e-3, series, direct)


def cortical_area_quad(ecc_deg, k: float = HORTON_HOYT_K, e0: float = HORTON_HOYT_E0,
                       hemifields: int = 1):
    """The same integral as :func:`cortical_area` by adaptive quadrature (``scipy.integrate.quad``),
    as an independent check of the closed form. Loops over the (few) requested upper limits."""
    from scipy.integrate import quad

    _check_params(k, e0)
    _check_hemifields(hemifields)
    e = check_eccentricity(ecc_deg)
    f = lambda eps: hemifields * np.pi * eps * (k / (eps + e0)) ** 2  # noqa: E731
    flat = [quad(f, 0.0, float(x), limit=200, epsabs=1e-10, epsrel=1e-12)[0] for x in e.ravel()]
    return np.asarray(flat, dtype=float).reshape(e.shape)


def seed_cortical_area(ecc_deg, k: float = HORTON_HOYT_K, e0: float = HORTON_HOYT_E0,
                       hemifields: int = 1):
    """The seed documents' integral ``int_0^E h pi M(eps)^2 d eps`` -- the ring circumference
    factor ``eps`` is missing, so it is NOT an area. Closed form ``h pi k^2 (1/e0 - 1/(E+e0))``.
    Kept only to show how much it over-weights the fovea."""
    _check_params(k, e0)
    _check_hemifields(hemifields)
    e = check_eccentricity(ecc_deg)
    return hemifields * np.pi * k**2 * (1.0 / e0 - 1.0 / (e + e0))


def cortical_distance(ecc_deg, k: float = HORTON_HOYT_K, e0: float = HORTON_HOYT_E0):
    """Distance along V1 (mm) from the foveal representation to eccentricity E along a
    meridian: ``int_0^E M = k ln((E + e0)/e0)`` (the real part of the complex-log map)."""
    _check_params(k, e0)
    e = check_eccentricity(ecc_deg)
    return k * np.log((e + e0) / e0)


def complex_log_map(z_deg, a: float = HORTON_HOYT_E0, k: float = HORTON_HOYT_K):
    """Schwartz (1980) map of one hemifield onto cortex: ``w = k log(z + a)`` (mm).

    Args:
        z_deg: complex visual-field positions in deg, ``Re z >= 0`` (the contralateral
            hemifield; mirror the other one), any shape.
    Returns:
        complex cortical positions ``w`` (mm), same shape.
    """
    _check_params(k, a)
    z = np.asarray(z_deg, dtype=complex)
    if not np.all(np.isfinite(z)):
        raise ValueError("z_deg must be finite (no NaN/inf)")
    if np.any(z.real < 0):
        raise ValueError("z_deg must lie in one hemifield: Re(z) >= 0 (mirror the other)")
    return k * np.log(z + a)


def inverse_complex_log_map(w_mm, a: float = HORTON_HOYT_E0, k: float = HORTON_HOYT_K):
    """Inverse of :func:`complex_log_map`: ``z = exp(w / k) - a`` (deg)."""
    _check_params(k, a)
    w = np.asarray(w_mm, dtype=complex)
    if not np.all(np.isfinite(w)):
        raise ValueError("w_mm must be finite (no NaN/inf)")
    return np.exp(w / k) - a


def cortical_grid(max_ecc_deg: float, n_u: int, n_v: int, a: float = HORTON_HOYT_E0,
                  k: float = HORTON_HOYT_K) -> np.ndarray:
    """A uniform ``[n_u, n_v]`` grid on the cortical image of the right hemifield, mapped back
    to the visual field: returns complex positions ``z`` (deg), shape ``[n_u, n_v]``.

    The cortical grid spans ``Re w`` in ``[k log a, k log(E_max + a)]`` and ``Im w`` in
    ``k * [-pi/2, pi/2]`` (the image of the vertical meridian is only approximately straight
    near the fovea, which is what the ``a`` term does). Cell centres are used, so no point
    falls exactly on the boundary.
    """
    _check_params(k, a)
    e = float(check_eccentricity(max_ecc_deg, "max_ecc_deg"))
    for name, n in (("n_u", n_u), ("n_v", n_v)):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"{name} must be an int >= 1, got {n!r}")
    u = np.log(a) + (np.arange(n_u) + 0.5) / n_u * (np.log(e + a) - np.log(a))
    v = -np.pi / 2 + (np.arange(n_v) + 0.5) / n_v * np.pi
    z = np.exp(u[:, None] + 1j * v[None, :]) - a
    return np.where(z.real < 0, 1j * z.imag, z)  # clamp round-off across the meridian


def hamilton(weights, total, *, minimum: int = 0, capacity=None) -> np.ndarray:
    """Hamilton's apportionment: integer quotas ``[..., G]`` proportional to ``weights``
    that sum to ``total`` per row.

    Each of the ``G`` groups first gets ``minimum``; the remaining ``total - minimum * G``
    (clipped at 0) is split in proportion to ``max(weights, 0)`` by Hamilton's
    largest-remainder method: every group gets the floor of its exact quota, and the units
    still missing go to the largest fractional remainders (float64), ties to the lower group
    index. A row whose weights sum to zero is split equally. With ``capacity``
    (broadcastable to the weights) the quotas are clipped to it afterwards, so the sum can
    then fall short (callers fill the rest).

    The definition of how a token budget is split, in numpy: the allocators run its torch
    twin (:func:`fovea_core.allocators.base.largest_remainder`: the same float64 steps in the
    same order, on the scores' device without host syncs), and
    ``tests/test_allocators_device.py`` holds the two to identical quotas.

    Args:
        weights: ``[..., G]`` finite real weights (negative values count as 0), ``G >= 1``.
        total: non-negative integer total, a scalar or one per row (shape ``weights.shape[:-1]``).
        minimum: integer floor given to every group before the proportional split.
        capacity: optional per-group upper bound, broadcastable to ``weights``.

    Returns:
        int64 array of the weights' shape; each row sums to ``max(total, minimum * G)``
        unless ``capacity`` clips it.

    Raises:
        ValueError: naming ``weights`` (empty, NaN/inf), ``total`` (negative or not an
            integer) or ``minimum`` (negative).
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim == 0 or w.shape[-1] == 0:
        raise ValueError(f"weights must have a non-empty last axis [..., G], got shape {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValueError("weights must be finite (no NaN/inf)")
    t = np.asarray(total, dtype=np.float64)
    if not np.all(np.isfinite(t)) or np.any(t < 0) or np.any(t != np.floor(t)):
        raise ValueError(f"total must be a non-negative integer (per row), got {total!r}")
    if int(minimum) != minimum or minimum < 0:
        raise ValueError(f"minimum must be a non-negative integer, got {minimum!r}")
    g = w.shape[-1]
    rest = np.maximum(np.broadcast_to(t, w.shape[:-1]) - minimum * g, 0.0)
    w = np.maximum(w, 0.0)
    wsum = w.sum(axis=-1, keepdims=True)
    share = np.where(wsum > 0, w / np.where(wsum > 0, wsum, 1.0), 1.0 / g)
    quota = share * rest[..., None]
    base = np.floor(quota)
    left = np.rint(rest - base.sum(axis=-1)).astype(np.int64)            # 0 <= left < G
    order = np.argsort(-(quota - base), axis=-1, kind="stable")        # largest remainder first
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(g), order.shape), axis=-1)
    q = base.astype(np.int64) + (rank < left[..., None]) + int(minimum)
    return q if capacity is None else np.minimum(q, np.asarray(capacity, dtype=np.int64))


def largest_remainder(weights, total: int) -> np.ndarray:
    """Integer counts proportional to ``weights`` that sum exactly to ``total``
    (Hamilton / largest-remainder rounding; ties go to the lower index).

    Validates its arguments (all-zero weights are an error here) and calls
    :func:`hamilton`, the rule whose torch twin the allocators run on the scores' device
    (held to the same quotas by ``tests/test_allocators_device.py``).

    Args:
        weights: 1-D, finite, >= 0, not all zero.
        total: non-negative integer.
    Returns:
        int64 array, same length as ``weights``, ``sum == total``.
    """
    w = np.asarray(weights, dtype=float)
    if w.ndim != 1 or w.size == 0:
        raise ValueError(f"weights must be a non-empty 1-D array, got shape {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError("weights must be finite, >= 0 and not all zero")
    integral = isinstance(total, (int, np.integer)) or (
        isinstance(total, (float, np.floating)) and bool(np.isfinite(total))
        and float(total).is_integer())
    if isinstance(total, bool) or not integral or total < 0:
        raise ValueError(f"total must be a non-negative integer, got {total!r}")
    return hamilton(w, int(total))


def band_weights(edges_deg, model: str = "cortex", k: float = HORTON_HOYT_K,
                 e0: float = HORTON_HOYT_E0) -> np.ndarray:
    """Relative share of each eccentricity band ``[edges[i], edges[i+1])`` under ``model``:

    * ``"cortex"``: V1 area of the annulus, ``A(E_i+1) - A(E_i)`` (:func:`cortical_area`);
    * ``"uniform"``: visual area of the annulus, ``E_i+1^2 - E_i^2`` (uniform sampling);
    * ``"seed"``: the seeds' integral without the ``eps`` factor (:func:`seed_cortical_area`).
    """
    edges = check_eccentricity(edges_deg, "edges_deg")
    if edges.ndim != 1 or edges.size < 2 or np.any(np.diff(edges) <= 0):
        raise ValueError("edges_deg must be 1-D, strictly increasing, with >= 2 entries")
    if model == "cortex":
        cum = cortical_area(edges, k, e0)
    elif model == "uniform":
        cum = edges**2
    elif model == "seed":
        cum = seed_cortical_area(edges, k, e0)
    else:
        raise ValueError(f"model must be 'cortex', 'uniform' or 'seed', got {model!r}")
    return np.diff(cum)


def band_budget(edges_deg, budget: int, k: float = HORTON_HOYT_K, e0: float = HORTON_HOYT_E0,
                *, model: str = "cortex", coverage=None) -> np.ndarray:
    """How many of ``budget`` tokens each eccentricity band gets.

    Tokens are shared in proportion to :func:`band_weights` (by default the V1 area of each
    annulus, Horton & Hoyt 1991 with parameters ``k``, ``e0``), times ``coverage`` (the
    fraction of each annulus that lies inside the image, shape ``[n_bands]``, default 1),
    and rounded by :func:`largest_remainder`, so the counts are integers summing exactly to
    ``budget``.

    Args:
        edges_deg: ``[n_bands + 1]`` strictly increasing eccentricities (deg).
        budget: total number of tokens N.
    Returns:
        int64 ``[n_bands]``.
    """
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 0:
        raise ValueError(f"budget must be an int >= 0 (tokens), got {budget!r}")
    w = band_weights(edges_deg, model, k, e0)
    if coverage is not None:
        c = np.asarray(coverage, dtype=float)
        if c.shape != w.shape or not np.all(np.isfinite(c)) or np.any((c < 0) | (c > 1)):
            raise ValueError(f"coverage must have shape {w.shape} with values in [0, 1]")
        w = w * c
    return largest_remainder(w, budget)


def annulus_coverage(edges_deg, half_width_deg: float, half_height_deg: float,
                     fixation_deg=(0.0, 0.0), samples: int = 512) -> np.ndarray:
    """Fraction of each annulus ``[edges[i], edges[i+1])`` around ``fixation_deg`` that lies
    inside the image rectangle ``[-half_width, half_width] x [-half_height, half_height]`` (deg).

    Numerical: the rectangle is sampled on a ``samples x samples`` grid of cell centres and the
    area falling in each annulus is divided by the annulus area (error ~ 1/samples). Pass the
    result as ``coverage`` to :func:`band_budget` so bands cut by the image border get fewer
    tokens.

    Returns:
        float ``[n_bands]`` in ``[0, 1]``.
    """
    edges = check_eccentricity(edges_deg, "edges_deg")
    if edges.ndim != 1 or edges.size < 2 or np.any(np.diff(edges) <= 0):
        raise ValueError("edges_deg must be 1-D, strictly increasing, with >= 2 entries")
    if not (np.isfinite(half_width_deg) and np.isfinite(half_height_deg)
            and half_width_deg > 0 and half_height_deg > 0):
        raise ValueError("half_width_deg and half_height_deg must be finite and > 0, got "
                         f"{half_width_deg}, {half_height_deg}")
    fix = np.asarray(fixation_deg, dtype=float)
    if fix.shape != (2,) or not np.all(np.isfinite(fix)):
        raise ValueError(f"fixation_deg must be a finite (x, y) in deg, got {fixation_deg!r}")
    if samples < 2:
        raise ValueError(f"samples must be >= 2, got {samples}")
    fx, fy = (float(v) for v in fixation_deg)
    xs = (np.arange(samples) + 0.5) / samples * 2 * half_width_deg - half_width_deg
    ys = (np.arange(samples) + 0.5) / samples * 2 * half_height_deg - half_height_deg
    r = np.hypot(xs[None, :] - fx, ys[:, None] - fy).ravel()
    cell = (2 * half_width_deg / samples) * (2 * half_height_deg / samples)
    inside, _ = np.histogram(r, bins=edges)
    ring = np.pi * np.diff(edges**2)
    return np.clip(inside * cell / ring, 0.0, 1.0)
