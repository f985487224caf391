"""ANLS against hand-worked examples, coverage metrics, bootstrap CIs."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from fovea_book.eval.metrics import (anls, bootstrap_ci, exact_match, largest_empty_disc,
                                     levenshtein, normalize_answer, normalized_levenshtein,
                                     strata_coverage)
from fovea_core.tokens import TokenSet


def _lev_reference(a: str, b: str) -> int:
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1])
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, sub)
    return d[-1][-1]


@pytest.mark.parametrize("a,b,d", [("kitten", "sitting", 3), ("flaw", "lawn", 2), ("", "abc", 3),
                                   ("abc", "abc", 0), ("intention", "execution", 5),
                                   ("1,234.50", "1234.50", 1)])
def test_levenshtein_hand_examples(a, b, d):
    assert levenshtein(a, b) == d == levenshtein(b, a)


@settings(max_examples=25, deadline=None)
@given(st.text(alphabet="abc 1.,", max_size=12), st.text(alphabet="abc 1.,", max_size=12))
def test_levenshtein_matches_reference_dp(a, b):
    assert levenshtein(a, b) == _lev_reference(a, b)


def test_anls_hand_worked_examples():
    # DocVQA / ST-VQA (Biten et al. 2019, Eq. 1): s = 1 - NL if NL < 0.5 else 0
    assert anls("the cat", ["the cat"]) == 1.0
    assert anls("  The   CAT ", "the cat") == 1.0                 # normalised
    assert anls("the dog", "the cat") == pytest.approx(1 - 3 / 7)  # NL = 3/7 < 0.5
    assert anls("1234", "1,234") == pytest.approx(1 - 1 / 5)      # one deletion
    assert anls("ab", "ax") == 0.0                                 # NL = 0.5 is not < 0.5
    assert anls("abc", "xyz") == 0.0                               # NL = 1
    assert anls("", "abc") == 0.0
    assert anls("Jun 3", ["June 3", "3 June"]) == pytest.approx(1 - 1 / 6)  # best answer
    assert anls("the dog", "the cat", tau=0.4) == 0.0              # 3/7 >= 0.4
    assert normalized_levenshtein("", "") == 0.0


def test_exact_match_and_normalisation():
    assert normalize_answer("  A  b\tC ") == "a b c"
    assert exact_match("Total  1.00", ["total 1.00"]) == 1.0
    assert exact_match("total 1.0", ["total 1.00", "x"]) == 0.0


def test_anls_bad_arguments():
    with pytest.raises(ValueError, match="tau"):
        anls("a", "a", tau=0)
    with pytest.raises(ValueError, match="answers"):
        anls("a", [])


def _tokens(xy, size=(512, 512)):
    c = torch.as_tensor(xy, dtype=torch.float32)[None]
    n = c.shape[1]
    return TokenSet(c, torch.zeros(1, n, dtype=torch.long), torch.zeros(1, n),
                    torch.full((1, 1, 2), 0.5), size)


def test_strata_coverage():
    g = (torch.arange(8) + 0.5) / 8
    grid = torch.stack(torch.meshgrid(g, g, indexing="xy"), -1).reshape(-1, 2)
    assert float(strata_coverage(_tokens(grid))[0]) == 1.0
    corner = torch.full((64, 2), 0.05)
    assert float(strata_coverage(_tokens(corner))[0]) == pytest.approx(1 / 64)
    half = grid[grid[:, 1] < 0.5]
    assert float(strata_coverage(_tokens(half))[0]) == pytest.approx(0.5)
    assert float(strata_coverage(_tokens(grid), strata=4)[0]) == 1.0
    with pytest.raises(ValueError, match="strata"):
        strata_coverage(_tokens(grid), strata=0)


def test_largest_empty_disc():
    # one token at the centre of a 512 px square: farthest lattice point is a corner cell
    r = float(largest_empty_disc(_tokens([[0.5, 0.5]]), resolution=64)[0])
    far = 256 - 4  # lattice points at (i + 0.5) * 8 px
    assert r == pytest.approx(math.hypot(far, far), rel=1e-5)
    # denser sets leave smaller holes; a set covering one half leaves the other empty
    g = (torch.arange(16) + 0.5) / 16
    grid = torch.stack(torch.meshgrid(g, g, indexing="xy"), -1).reshape(-1, 2)
    r_grid = float(largest_empty_disc(_tokens(grid))[0])
    r_top = float(largest_empty_disc(_tokens(grid[grid[:, 1] < 0.5]))[0])
    assert r_grid < 0.5 * 512 / 16 * math.sqrt(2) + 1e-3 and r_top > 200


def test_bootstrap_ci():
    est, lo, hi = bootstrap_ci(np.full(10, 0.7))
    assert est == lo == hi == pytest.approx(0.7)
    v = np.random.default_rng(0).normal(size=200)
    est, lo, hi = bootstrap_ci(v, n_boot=1000)
    assert lo < est < hi and hi - lo == pytest.approx(2 * 1.96 / math.sqrt(200), rel=0.25)
    assert bootstrap_ci([0.3]) == (0.3, 0.3, 0.3)
    assert all(math.isnan(x) for x in bootstrap_ci([]))
    pairs = np.array([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]])
    est, lo, hi = bootstrap_ci(pairs, stat=lambda a: a[..., 0].sum(1) / a[..., 1].sum(1))
    assert est == lo == hi == pytest.approx(0.5)
    with pytest.raises(ValueError, match="ci"):
        bootstrap_ci(v, ci=1.5)
