"""Saliency metrics: hand-worked values, the invariances of Bylinskii et al. (2018), errors."""

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fovea_core.eval import saliency_metrics as sm

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
