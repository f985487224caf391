"""Saliency metrics of the MIT/Tuebingen saliency benchmark, vectorised.

Definitions follow Bylinskii, Judd, Oliva, Torralba & Durand, "What do different
evaluation metrics tell us about saliency models?" (IEEE TPAMI 41(3), 2019; online 2018,
cited as 2018 below), and the conventions
of the benchmark's reference MATLAB code (``cvzoya/saliency``, ``code_forMetrics``):

* ``cc`` (higher is better): the map against the blurred human fixation density;
* ``sim`` (higher): both as distributions, histogram intersection;
* ``kl_div`` (lower): both as distributions, KL of the prediction from the density;
* ``nss`` (higher): standardised map values at the fixated pixels;
* ``auc_judd`` (higher): ranks, fixated vs. non-fixated pixels;
* ``auc_shuffled`` (higher): ranks, fixated pixels vs. pixels fixated on other images.

Every function takes a saliency map ``[H, W]`` or a batch ``[B, H, W]`` (numpy or torch)
and a target of the same shape, and returns a float (one map) or a float64 array ``[B]``.
Fixation maps are binary: a pixel fixated by several observers counts once, as in the
reference code (Bylinskii et al. 2018). Maps must already have the target's shape
(the reference code ``imresize``-s silently; we raise instead).

Cross-checks: ``tests/test_saliency_metrics.py`` compares every metric with a
straightforward implementation written from those definitions (and sklearn's ROC area for
sAUC) and with analytic cases. A one-off comparison with ``pysaliency`` 0.2.22's
``metrics.py`` (read from its source distribution, not installed: its package needs a
Cython build) agreed to 1e-16 for CC, SIM and NSS (theirs uses the population standard
deviation: ours times ``sqrt(n / (n - 1))``) and to 2e-8 for KL (their ``eps`` is
``2.2204e-16`` typed to 5 digits).

Degenerate inputs get documented values instead of the reference code's NaN: a constant
saliency map carries no information, so its CC and NSS are 0 and its SIM / KL treat it as
the uniform distribution. An image with no fixations gives NaN for the location metrics.
"""

from __future__ import annotations

import numpy as np
import torch

#: MATLAB's ``eps`` (``2**-52``), the regulariser of the reference ``KLdiv.m``.
EPS = float(np.finfo(np.float64).eps)

ArrayLike = np.ndarray | torch.Tensor


def _to_batch(x: ArrayLike, name: str) -> tuple[np.ndarray, bool]:
    """``[H, W]`` or ``[B, H, W]`` -> float64 ``[B, H, W]`` and whether it was one map."""
    a = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    if a.ndim not in (2, 3):
        raise ValueError(f"{name} must be [H, W] or [B, H, W], got shape {a.shape}")
    if a.size == 0:
        raise ValueError(f"{name} is empty (shape {a.shape})")
    a = a.astype(np.float64, copy=False)
    if not np.isfinite(a).all():
        raise ValueError(f"{name} must be finite (found NaN or inf)")
    return (a[None], True) if a.ndim == 2 else (a, False)


def _pair(saliency: ArrayLike, target: ArrayLike, target_name: str
          ) -> tuple[np.ndarray, np.ndarray, bool]:
    s, single = _to_batch(saliency, "saliency")
    t, _ = _to_batch(target, target_name)
    if s.shape != t.shape:
        raise ValueError(f"saliency {s.shape[-2:] if single else s.shape} and {target_name} "
                         f"{t.shape[-2:] if single else t.shape} must have the same shape")
    return s, t, single


def _out(values: np.ndarray, single: bool) -> float | np.ndarray:
    return float(values[0]) if single else values


def _flat(a: np.ndarray) -> np.ndarray:
    return a.reshape(a.shape[0], -1)


def _as_distribution(a: np.ndarray, rescale: bool) -> np.ndarray:
    """Per map: optionally min-max rescale to [0, 1], then divide by the sum.

    Constant maps (or all-zero maps) become the uniform distribution.
    """
    f = _flat(a)
    lo, hi = f.min(1, keepdims=True), f.max(1, keepdims=True)
    const = (hi - lo) <= 0
    if rescale:
        f = np.where(const, 1.0, (f - lo) / np.where(const, 1.0, hi - lo))
    elif (f < 0).any():
        raise ValueError("a map used as a distribution must be non-negative")
    tot = f.sum(1, keepdims=True)
    return np.where(tot > 0, f / np.where(tot > 0, tot, 1.0), 1.0 / f.shape[1])


def _standardise(a: np.ndarray, ddof: int) -> np.ndarray:
    """Per map ``(a - mean) / std``; a constant map becomes all zeros."""
    f = _flat(a)
    const = f.max(1, keepdims=True) == f.min(1, keepdims=True)
    sd = np.where(const, 1.0, f.std(1, ddof=ddof, keepdims=True))
    return np.where(const, 0.0, (f - f.mean(1, keepdims=True)) / sd)


def _binary(fixations: np.ndarray) -> np.ndarray:
    if (fixations < 0).any():
        raise ValueError("fixations must be a binary (0/1) or non-negative count map")
    return _flat(fixations) > 0


# --------------------------------------------------------------------- distribution metrics
def cc(saliency: ArrayLike, density: ArrayLike) -> float | np.ndarray:
    """Pearson's linear correlation coefficient (Bylinskii et al. 2018).

    ``CC = cov(P, Q) / (sigma(P) sigma(Q))`` over all pixels. In ``[-1, 1]``; invariant to
    positive affine transforms of either map. 0 if either map is constant.

    Args:
        saliency: predicted map ``[H, W]`` or ``[B, H, W]``.
        density: human fixation density (blurred fixations), same shape.
    """
    s, d, single = _pair(saliency, density, "density")
    zs, zd = _standardise(s, 0), _standardise(d, 0)
    return _out((zs * zd).mean(1), single)


def sim(saliency: ArrayLike, density: ArrayLike) -> float | np.ndarray:
    """Similarity (histogram intersection; Bylinskii et al. 2018).

    Both maps are min-max rescaled to ``[0, 1]`` and divided by their sums (as
    ``similarity.m``), then ``SIM = sum_i min(P_i, Q_i)``: 1 for identical maps, 0 for
    disjoint supports.
    """
    s, d, single = _pair(saliency, density, "density")
    p, q = _as_distribution(s, rescale=True), _as_distribution(d, rescale=True)
    return _out(np.minimum(p, q).sum(1), single)


def kl_div(saliency: ArrayLike, density: ArrayLike, eps: float = EPS) -> float | np.ndarray:
    """Kullback-Leibler divergence of the saliency map from the fixation density.

    ``KL = sum_i Q^D_i log(eps + Q^D_i / (P_i + eps))`` with both maps divided by their sums
    (Bylinskii et al. 2018; ``KLdiv.m`` with MATLAB ``eps = 2**-52``). ``Q^D`` is the
    human density, ``P`` the prediction; 0 for identical maps, lower is better. Both maps
    must be non-negative.
    """
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    s, d, single = _pair(saliency, density, "density")
    p, q = _as_distribution(s, rescale=False), _as_distribution(d, rescale=False)
    return _out((q * np.log(eps + q / (p + eps))).sum(1), single)


# --------------------------------------------------------------------- location metrics
def nss(saliency: ArrayLike, fixations: ArrayLike) -> float | np.ndarray:
    """Normalized Scanpath Saliency (Peters et al. 2005; Bylinskii et al. 2018).

    The saliency map is standardised (zero mean, unit sample standard deviation, ``ddof=1``
    as MATLAB's ``std``) and averaged over the fixated pixels. 0 = chance; invariant to
    positive affine transforms of the map. NaN for an image without fixations.

    Args:
        saliency: ``[H, W]`` or ``[B, H, W]``.
        fixations: binary fixation map of the same shape (non-zero = fixated).
    """
    s, f, single = _pair(saliency, fixations, "fixations")
    fb = _binary(f)
    z = _standardise(s, 1)
    n = fb.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return _out(np.where(n > 0, (z * fb).sum(1) / n, np.nan), single)


def _auc_judd_one(s: np.ndarray, fb: np.ndarray) -> float:
    pos = s[fb]
    n_fix, n_pix = pos.size, s.size
    if n_fix == 0:
        return float("nan")
    if n_fix == n_pix:
        raise ValueError("fixations cover every pixel: AUC-Judd needs non-fixated pixels")
    thresholds = np.unique(pos)[::-1]  # the saliency values at fixations, descending
    above_all = n_pix - np.searchsorted(np.sort(s), thresholds, side="left")
    above_fix = n_fix - np.searchsorted(np.sort(pos), thresholds, side="left")
    tp = np.concatenate([[0.0], above_fix / n_fix, [1.0]])
    fp = np.concatenate([[0.0], (above_all - above_fix) / (n_pix - n_fix), [1.0]])
    return float(np.trapezoid(tp, fp))


def auc_judd(saliency: ArrayLike, fixations: ArrayLike) -> float | np.ndarray:
    """AUC-Judd (Judd et al. 2009; Bylinskii et al. 2018).

    ROC curve with one threshold per saliency value found at a fixated pixel: true-positive
    rate = fraction of fixated pixels at or above the threshold, false-positive rate =
    fraction of the *non-fixated* pixels at or above it; area by the trapezoid rule. Only
    the ranks of the map matter (invariant to strictly increasing transforms).

    Difference from ``AUC_Judd.m``: instead of breaking ties with random jitter (1e-7), equal
    saliency values at fixations share one threshold, so the result is deterministic and
    a constant map scores exactly 0.5.
    """
    s, f, single = _pair(saliency, fixations, "fixations")
    fb = _binary(f)
    vals = np.array([_auc_judd_one(si, fi) for si, fi in zip(_flat(s), fb)])  # loop over images
    return _out(vals, single)


def _auc_pos_neg(pos: np.ndarray, neg: np.ndarray, neg_weight: np.ndarray | None = None
                 ) -> float:
    """Exact ROC area between two score samples: ``P(pos > neg) + P(pos == neg) / 2``,
    each negative counted ``neg_weight`` times (default once)."""
    if pos.size == 0 or neg.size == 0:
        return float("nan")
    wts = np.ones(neg.size) if neg_weight is None else np.asarray(neg_weight, np.float64)
    order = np.argsort(neg, kind="stable")
    ns, cw = neg[order], np.concatenate([[0.0], np.cumsum(wts[order])])
    lo, hi = np.searchsorted(ns, pos, side="left"), np.searchsorted(ns, pos, side="right")
    return float((cw[lo].sum() + 0.5 * (cw[hi] - cw[lo]).sum()) / (pos.size * cw[-1]))


def auc_shuffled(saliency: ArrayLike, fixations: ArrayLike, other_fixations: ArrayLike
                 ) -> float | np.ndarray:
    """Shuffled AUC (Zhang et al. 2008; Bylinskii et al. 2018).

    Positives: saliency at this image's fixated pixels. Negatives: saliency at the
    fixations on *other* images (``other_fixations``: a map of how many of the other
    images' fixations fall on each pixel, e.g. the sum of their
    :func:`~fovea_book.eval.eyetracking.fixation_counts`; a pixel counts as many negatives
    as it holds fixations, so the negatives are the other images' fixations themselves,
    as in Bylinskii et al. 2019 and pysaliency's ``nonfixations='shuffled'``; a binary
    map counts each pixel once). Because negatives share the observers' centre bias, a
    pure centre-bias map scores about 0.5 with counts: sAUC rewards only what is
    image-specific. (With a binary union of many fixations the densely fixated centre is
    under-counted and a centre bias scores above 0.5; tested.)

    Difference from ``AUC_shuffled.m``: that code thresholds at steps of 0.1 on the
    [0, 1]-rescaled map and averages 100 random subsets of as many negatives as fixations;
    we use every negative and every threshold (the exact Mann-Whitney area, ties counting
    one half), which is the limit of that procedure as the step goes to 0 and is
    deterministic.

    Args:
        saliency: ``[H, W]`` or ``[B, H, W]``.
        fixations: binary map of this image's fixations, same shape.
        other_fixations: fixation counts (or a binary map) of the other images, same shape.
    """
    s, f, single = _pair(saliency, fixations, "fixations")
    _, o, _ = _pair(saliency, other_fixations, "other_fixations")
    fb, ob = _binary(f), _binary(o)
    of = _flat(o)
    vals = np.array([_auc_pos_neg(si[fi], si[oi], wi[oi])  # loop over images
                     for si, fi, oi, wi in zip(_flat(s), fb, ob, of)])
    return _out(vals, single)


METRICS: dict[str, str] = {
    "CC": "density", "SIM": "density", "KL": "density",
    "NSS": "fixations", "AUC-Judd": "fixations", "sAUC": "fixations",
}
"""Name -> target kind of every metric :func:`all_metrics` computes."""

HIGHER_IS_BETTER: dict[str, bool] = {m: m != "KL" for m in METRICS}


def all_metrics(saliency: ArrayLike, density: ArrayLike, fixations: ArrayLike,
                other_fixations: ArrayLike) -> dict[str, float | np.ndarray]:
    """All six metrics for one map (or a batch), keyed as in :data:`METRICS`."""
    return {
        "CC": cc(saliency, density), "SIM": sim(saliency, density),
        "KL": kl_div(saliency, density), "NSS": nss(saliency, fixations),
        "AUC-Judd": auc_judd(saliency, fixations),
        "sAUC": auc_shuffled(saliency, fixations, other_fixations),
    }
