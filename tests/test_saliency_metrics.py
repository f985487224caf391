"""Saliency metrics: hand-worked values, the invariances of Bylinskii et al. (2018), errors."""

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fovea_book.eval import saliency_metrics as sm

# A 2x2 map with fixations on the 0.1 and 0.8 pixels (worked by hand in the comments).
S = np.array([[0.1, 0.4], [0.35, 0.8]])
F = np.array([[1, 0], [0, 1]])


def test_nss_hand_worked():
    # mean 0.4125, sample std sqrt(0.251875 / 3) = 0.289756;
    # z(0.1) = -1.078494, z(0.8) = 1.337333; NSS = mean = 0.129419
    assert sm.nss(S, F) == pytest.approx(0.129419, abs=1e-6)


def test_auc_judd_hand_worked():
    # thresholds 0.8, 0.1: (fp, tp) = (0, 0.5), (1, 1) -> area 0.5 * (0.5 + 1) = 0.75
    assert sm.auc_judd(S, F) == pytest.approx(0.75)


def test_auc_shuffled_hand_worked():
    # positives {0.1, 0.8}, negatives {0.4, 0.35}: 0.8 beats both, 0.1 neither -> 2/4
    assert sm.auc_shuffled(S, F, 1 - F) == pytest.approx(0.5)
    # negatives only at the 0.35 pixel and a tie at the 0.8 pixel: (0 + 1 + 0.5) / (2 * 2)
    other = np.array([[0, 0], [1, 1]])
    assert sm.auc_shuffled(S, F, other) == pytest.approx(1.5 / 4)


def test_cc_sim_kl_hand_worked():
    p = np.array([[1.0, 0.0], [0.0, 1.0]])
    q = np.array([[1.0, 1.0], [0.0, 0.0]])
    # p, q as +-1 patterns: they agree in 2 of 4 pixels -> correlation 0
    assert sm.cc(p, q) == pytest.approx(0.0, abs=1e-12)
    assert sm.cc(p, 1 - p) == pytest.approx(-1.0)
    # distributions (0.5, 0, 0, 0.5) and (0.5, 0.5, 0, 0): overlap 0.5
    assert sm.sim(p, q) == pytest.approx(0.5)
    # KL(q || p) = 0.5 log(1) + 0.5 log(eps + 0.5 / eps) ~ 0.5 * log(0.5 / 2**-52)
    assert sm.kl_div(p, q) == pytest.approx(0.5 * np.log(0.5 / sm.EPS), rel=1e-9)


def test_kl_matches_reference_formula_on_random_maps():
    rng = np.random.default_rng(0)
    a, b = rng.random((5, 7)), rng.random((5, 7))
    pa, pb = a / a.sum(), b / b.sum()
    want = (pb * np.log(sm.EPS + pb / (pa + sm.EPS))).sum()
    assert sm.kl_div(a, b) == pytest.approx(want, rel=1e-12)
    assert sm.kl_div(a, b) > 0


maps = arrays(np.float64, (6, 5), elements=st.floats(0.0, 1.0, width=32))


def _fix(seed: int) -> np.ndarray:
    f = np.random.default_rng(seed).random((6, 5)) < 0.3
    f[0, 0], f[5, 4] = True, False  # at least one fixated and one free pixel
    return f


@settings(max_examples=25, deadline=None)
@given(maps, maps, st.floats(0.1, 10.0), st.floats(-5.0, 5.0), st.integers(0, 10_000))
def test_affine_invariance(a, b, scale, shift, seed):
    f = _fix(seed)
    assume(a.std() >= 1e-3 and b.std() >= 1e-3)        # CC/NSS undefined on flat maps
    assert sm.cc(a * scale + shift, b) == pytest.approx(sm.cc(a, b), abs=1e-9)
    assert sm.cc(a, b * scale + shift) == pytest.approx(sm.cc(a, b), abs=1e-9)
    assert sm.nss(a * scale + shift, f) == pytest.approx(sm.nss(a, f), abs=1e-9)
    # SIM rescales each map to [0, 1] first: invariant to positive affine transforms
    assert sm.sim(a * scale + shift, b) == pytest.approx(sm.sim(a, b), abs=1e-9)


# values on a 1/1000 grid: distinct values stay distinct under the transforms in float64
grid_maps = arrays(np.int64, (6, 5), elements=st.integers(0, 1000)).map(lambda a: a / 1000)


@settings(max_examples=25, deadline=None)
@given(grid_maps, st.integers(0, 10_000))
def test_auc_invariant_to_monotone_transforms(a, seed):
    f = _fix(seed)
    other = _fix(seed + 1)
    for g in (np.exp, lambda x: x**3 + 2.0, lambda x: np.log1p(x) * 7):
        assert sm.auc_judd(g(a), f) == pytest.approx(sm.auc_judd(a, f), abs=1e-12)
        assert sm.auc_shuffled(g(a), f, other) == pytest.approx(
            sm.auc_shuffled(a, f, other), abs=1e-12)


@settings(max_examples=25, deadline=None)
@given(maps)
def test_identical_maps(a):
    b = a + 0.01  # strictly positive, non-constant in general
    assert sm.sim(b, b) == pytest.approx(1.0)
    assert sm.kl_div(b, b) == pytest.approx(0.0, abs=1e-9)
    if b.std() > 1e-3:
        assert sm.cc(b, b) == pytest.approx(1.0)


@settings(max_examples=25, deadline=None)
@given(maps, maps, st.integers(0, 10_000))
def test_ranges(a, b, seed):
    f = _fix(seed)
    assert -1 - 1e-9 <= sm.cc(a, b) <= 1 + 1e-9
    assert -1e-12 <= sm.sim(a, b) <= 1 + 1e-12
    assert sm.kl_div(a, b) >= -1e-9
    assert 0 <= sm.auc_judd(a, f) <= 1
    assert 0 <= sm.auc_shuffled(a, f, ~f) <= 1


def test_constant_map_is_chance():
    f = _fix(3)
    c = np.full((6, 5), 0.7)
    assert sm.auc_judd(c, f) == pytest.approx(0.5)
    assert sm.auc_shuffled(c, f, ~f) == pytest.approx(0.5)
    assert sm.nss(c, f) == 0.0
    assert sm.cc(c, np.random.default_rng(0).random((6, 5))) == 0.0
    # constant = uniform distribution for SIM and KL
    u = np.full((6, 5), 1 / 30)
    d = np.random.default_rng(1).random((6, 5))
    assert sm.kl_div(c, d) == pytest.approx(sm.kl_div(u, d))


def test_perfect_and_inverted_predictions():
    rng = np.random.default_rng(0)
    s = rng.random((20, 30))
    f = s > np.quantile(s, 0.95)  # the top 5 % of pixels are fixated
    assert sm.auc_judd(s, f) == pytest.approx(1.0)
    assert sm.auc_judd(-s, f) < 0.05
    assert sm.auc_shuffled(s, f, ~f) == pytest.approx(1.0)
    assert sm.auc_shuffled(-s, f, ~f) == pytest.approx(0.0)
    assert sm.nss(s, f) > 1.5 > -1.5 > sm.nss(-s, f)


def test_auc_judd_matches_reference_loop_without_ties():
    """Our vectorised sweep equals a literal transcription of ``AUC_Judd.m`` (no ties)."""
    rng = np.random.default_rng(1)
    s = rng.random((15, 12))
    f = rng.random((15, 12)) < 0.1
    sal, sth = s.ravel(), s.ravel()[f.ravel()]
    th = np.sort(sth)[::-1]
    nf, npx = th.size, sal.size
    tp, fp = [0.0], [0.0]
    for i, t in enumerate(th, 1):
        tp.append(i / nf)
        fp.append(((sal >= t).sum() - i) / (npx - nf))
    want = np.trapezoid(tp + [1.0], fp + [1.0])
    assert sm.auc_judd(s, f) == pytest.approx(want, abs=1e-12)


def test_shuffled_auc_equals_mean_of_subsampled_splits():
    """Exact sAUC = the expectation of the reference's random-subset procedure."""
    rng = np.random.default_rng(2)
    s = rng.random((10, 10))
    f = rng.random((10, 10)) < 0.1
    o = rng.random((10, 10)) < 0.3
    pos, neg = s[f], s[o]
    sub = [np.mean(pos[:, None] > rng.choice(neg, size=pos.size, replace=False)[None, :])
           for _ in range(4000)]
    assert sm.auc_shuffled(s, f, o) == pytest.approx(np.mean(sub), abs=0.01)


def test_batch_equals_per_image_and_torch_inputs():
    rng = np.random.default_rng(3)
    s, d = rng.random((3, 8, 9)), rng.random((3, 8, 9))
    f = rng.random((3, 8, 9)) < 0.2
    f[:, 0, 0] = True
    batch = sm.all_metrics(s, d, f, ~f)
    for i in range(3):
        one = sm.all_metrics(torch.from_numpy(s[i]), d[i], f[i], ~f[i])
        for k in sm.METRICS:
            assert isinstance(one[k], float)
            assert batch[k][i] == pytest.approx(one[k], abs=1e-12)


def test_no_fixations_gives_nan():
    z = np.zeros((4, 4), bool)
    assert np.isnan(sm.nss(S.repeat(2, 0).repeat(2, 1), z))
    assert np.isnan(sm.auc_judd(np.ones((4, 4)), z))


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="same shape"):
        sm.cc(np.ones((3, 3)), np.ones((3, 4)))
    with pytest.raises(ValueError, match="saliency must be"):
        sm.nss(np.ones(5), np.ones(5))
    with pytest.raises(ValueError, match="finite"):
        sm.sim(np.array([[np.nan, 1.0]]), np.ones((1, 2)))
    with pytest.raises(ValueError, match="non-negative"):
        sm.kl_div(-np.ones((2, 2)) + np.eye(2) * 3, np.ones((2, 2)))
    with pytest.raises(ValueError, match="eps"):
        sm.kl_div(S, S, eps=0.0)
    with pytest.raises(ValueError, match="every pixel"):
        sm.auc_judd(S, np.ones((2, 2)))


# --------------------------------------------------------------------- independent checks
# pysaliency (Kuemmerer et al.) is not installable here (its sdist builds a Cython extension
# and pulls many dependencies); each metric is checked instead against a straightforward
# implementation written from the definitions of Bylinskii, Judd, Oliva, Torralba & Durand,
# "What do different evaluation metrics tell us about saliency models?", IEEE TPAMI 41(3),
# 2019, Section 3, and against analytic cases.
def _ref_cc(s, d):
    return np.corrcoef(s.ravel(), d.ravel())[0, 1]           # Pearson's r (their Eq. 7)


def _ref_nss(s, f):
    z = (s - s.mean()) / s.std(ddof=1)                        # their Eq. 4 (MATLAB std)
    return float(np.mean([z[r, c] for r, c in zip(*np.nonzero(f))]))


def _ref_kl(s, d, eps=sm.EPS):
    p, q = s / s.sum(), d / d.sum()                           # their Eq. 9
    return float(sum(qi * np.log(eps + qi / (pi + eps)) for pi, qi in zip(p.ravel(), q.ravel())))


def _ref_sauc(s, f, o):
    from sklearn.metrics import roc_auc_score                 # an independent ROC area
    pos = s[f.astype(bool)]
    neg = np.repeat(s.ravel(), o.astype(int).ravel())         # one negative per fixation
    y = np.r_[np.ones(pos.size), np.zeros(neg.size)]
    return roc_auc_score(y, np.r_[pos, neg])


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_metrics_equal_independent_implementations(seed):
    rng = np.random.default_rng(seed)
    h, w = rng.integers(8, 40, 2)
    s = rng.random((h, w)) ** 3
    s[rng.random((h, w)) < 0.2] = 0.25                        # ties, as quantised maps have
    d = rng.random((h, w)) ** 2
    f = rng.random((h, w)) < 0.08
    f[0, 0] = True
    o = ((rng.random((h, w)) < 0.3) & ~f) * rng.integers(1, 4, (h, w))   # counts 0-3
    o[-1, -1] = 2
    assert sm.cc(s, d) == pytest.approx(_ref_cc(s, d), abs=1e-12)
    assert sm.nss(s, f) == pytest.approx(_ref_nss(s, f), abs=1e-12)
    assert sm.kl_div(s, d) == pytest.approx(_ref_kl(s, d), rel=1e-10)
    assert sm.auc_shuffled(s, f, o) == pytest.approx(_ref_sauc(s, f, o), abs=1e-12)


def test_analytic_cases():
    # NSS of a one-pixel map at its fixated pixel: values one 1 and n-1 zeros have mean
    # 1/n and sample std 1/sqrt(n), so NSS = (1 - 1/n) sqrt(n) = (n - 1) / sqrt(n)
    n = 7 * 9
    s = np.zeros((7, 9))
    s[3, 4] = 1.0
    assert sm.nss(s, s > 0) == pytest.approx((n - 1) / np.sqrt(n), rel=1e-12)
    # KL of (0.25, 0.75) from (0.5, 0.5): 0.5 ln 2 + 0.5 ln(2/3)
    kl = sm.kl_div(np.array([[0.25, 0.75]]), np.array([[0.5, 0.5]]))
    assert kl == pytest.approx(0.5 * np.log(2) + 0.5 * np.log(2 / 3), abs=1e-12)
    # CC of a positive affine transform is 1, of a negative one -1
    d = np.random.default_rng(0).random((5, 6))
    assert sm.cc(3 * d + 2, d) == pytest.approx(1.0) and sm.cc(2 - d, d) == pytest.approx(-1.0)


def test_shuffled_auc_discounts_a_centre_bias():
    """Every image's fixations come from one central Gaussian, the same for all images: a
    pure centre-bias map then has AUC-Judd well above 0.5 but sAUC = 0.5 up to sampling
    noise (negatives from the other images share the bias; Zhang et al. 2008)."""
    rng = np.random.default_rng(0)
    h, w, n_img = 60, 80, 30
    yy, xx = np.mgrid[0:h, 0:w]
    centre = np.exp(-((xx - w / 2) ** 2 / (2 * 12**2) + (yy - h / 2) ** 2 / (2 * 9**2)))
    fix = np.zeros((n_img, h, w), bool)
    pts = rng.normal([w / 2, h / 2], [12, 9], size=(n_img, 40, 2)).round().astype(int)
    pts = np.clip(pts, 0, [w - 1, h - 1])
    fix[np.arange(n_img)[:, None], pts[..., 1], pts[..., 0]] = True
    counts = np.zeros((n_img, h, w))
    np.add.at(counts, (np.arange(n_img)[:, None], pts[..., 1], pts[..., 0]), 1.0)
    other = counts.sum(0) - counts                      # the other images' fixation counts
    cb = np.broadcast_to(centre, fix.shape)
    assert sm.auc_judd(cb, fix).mean() > 0.8
    assert abs(sm.auc_shuffled(cb, fix, other).mean() - 0.5) < 0.02
    # a binary union counts the crowded centre once: the centre bias then scores above 0.5
    assert sm.auc_shuffled(cb, fix, other > 0).mean() > 0.53
    # a map that knows each image's fixations (blurred) keeps its sAUC well above 0.5
    from scipy.ndimage import gaussian_filter
    oracle = np.stack([gaussian_filter(f.astype(float), 2) for f in fix])
    assert sm.auc_shuffled(oracle, fix, other).mean() > 0.75
