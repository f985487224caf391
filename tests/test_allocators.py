"""Contract and property tests for every registered allocator (fovea_core.allocators).

Synthetic images and score maps only (no importance scorer). Every fixed-budget
allocator: exact budget, distinct tokens, in bounds, deterministic, batch == per-image
loop, graceful on flat/zero maps, ValueError on NaN; then each method's own guarantee.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fovea_core.methods import ALLOCATORS, INFO, allocate
from fovea_core.allocators.base import (_order_sorts, group_rank, largest_remainder, lex_key,
                                        order, pool_scores, stratum_ids)
from fovea_book.logpolar_training import train_pseudo_logpolar
from fovea_core.allocators.logpolar import logpolar_bins
from fovea_core.allocators.wrappers import BucketResult, fixations_with_ior
from fovea_book.bench.allocators import (logpolar_reference, selected_cells,
                                         stratified_reference)
from fovea_core.pyramid import Pyramid, build_pyramid

PATCH = 16
EXPECTED = {"uniform", "random", "full", "topk", "topk_coverage", "stratified", "stratified_8x8",
            "adaptive_stratified", "pseudo_logpolar", "logpolar", "hybrid", "pyramid",
            "pyramid_global", "foveated_pyramid", "atlas", "lod_dag", "frequency", "divprune",
            "visionzip", "multi_fixation", "adaptive_budget"}
FIXED = sorted(k for k in ALLOCATORS if INFO[k]["kind"] == "fixed" and k != "full")
SLOW = {"atlas", "frequency", "divprune", "visionzip", "pseudo_logpolar", "cascade",
        "cascade_gist_query", "cascade_prior"}  # fewer examples
SIZES = [(128, 128), (96, 160), (200, 136)]          # 8x8, 6x10, 13x9 (ragged) patch grids


@functools.lru_cache(maxsize=None)
def image(size: tuple[int, int], batch: int = 3, seed: int = 0) -> Pyramid:
    g = torch.Generator().manual_seed(seed)
    h, w = size
    low = torch.rand(batch, 3, max(h // 16, 2), max(w // 16, 2), generator=g)
    img = torch.nn.functional.interpolate(low, size=size, mode="bilinear", align_corners=False)
    img = (img + 0.2 * torch.rand(batch, 3, h, w, generator=g)).clamp(0, 1)
    return build_pyramid(img, patch=PATCH)


def min_budget(name: str, pyr: Pyramid) -> int:
    """The smallest budget each method accepts (documented in its docstring)."""
    if name in ("topk_coverage", "stratified"):
        return 16
    if name == "stratified_8x8":
        return 64
    if name == "adaptive_stratified":
        return 4
    if name in ("lod_dag", "resize", "resize_nonblank"):
        gh, gw = pyr.grid_shape(PATCH, pyr.num_levels - 1)
        return gh * gw
    if name == "multi_fixation":
        return 2
    if INFO[name]["family"] == "cascade":      # its gist (~23 % of N) must reach the top level
        from fovea_core.cascade.allocator import gist_budget_for

        th, tw = pyr.grid_shape(PATCH, pyr.num_levels - 1)
        gh, gw = pyr.grid_shape(PATCH, 0)
        return next((n for n in range(1, gh * gw + 1) if th * tw <= gist_budget_for(n) < n),
                    gh * gw + 1)
    return 1


def fits(name: str, pyr: Pyramid) -> bool:
    gh, gw = pyr.grid_shape(PATCH, 0)
    return min_budget(name, pyr) <= gh * gw and not (name == "stratified_8x8" and min(gh, gw) < 8)


def same(a, b) -> bool:
    return (torch.equal(a.centers, b.centers) and torch.equal(a.levels, b.levels)
            and torch.allclose(a.scores, b.scores) and torch.equal(a.fixations, b.fixations))


def check_contract(ts, pyr: Pyramid, budget: int) -> None:
    b = pyr.batch_size
    assert ts.batch_size == b and ts.budget == budget
    assert ts.is_distinct().all()
    assert (ts.centers >= 0).all() and (ts.centers <= 1).all()
    assert (ts.levels >= 0).all() and (ts.levels < pyr.num_levels).all()
    assert ts.image_size == pyr.image_size and ts.patch == PATCH
    assert torch.isfinite(ts.scores).all()


# ----------------------------------------------------------------------------- registry
def test_registry_has_every_method_of_the_issue():
    missing = EXPECTED - set(ALLOCATORS)
    assert not missing, missing
    for name, info in INFO.items():
        assert info["kind"] in ("fixed", "buckets")
        assert ALLOCATORS[name].__doc__, f"{name} has no docstring"


def test_unknown_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown allocator"):
        allocate("nope", image((128, 128)), torch.rand(3, 8, 8), 10)


# ----------------------------------------------------------------------------- contract
@pytest.mark.parametrize("name", [k for k in FIXED if k not in SLOW])
@settings(max_examples=6, deadline=None)
@given(size_i=st.integers(0, len(SIZES) - 1), frac=st.floats(0, 1), seed=st.integers(0, 2**16))
def test_contract(name, size_i, frac, seed):
    run_contract(name, size_i, frac, seed)


@pytest.mark.parametrize("name", [k for k in FIXED if k in SLOW])
@settings(max_examples=3, deadline=None)
@given(size_i=st.integers(0, len(SIZES) - 1), frac=st.floats(0, 1), seed=st.integers(0, 2**16))
def test_contract_content_methods(name, size_i, frac, seed):
    run_contract(name, size_i, frac, seed)


def run_contract(name, size_i, frac, seed):
    pyr = image(SIZES[size_i])
    if not fits(name, pyr):
        return
    gh, gw = pyr.grid_shape(PATCH, 0)
    lo, hi = min_budget(name, pyr), gh * gw
    n = lo + int(round(frac * (hi - lo)))
    rng = np.random.default_rng(seed)
    sc = torch.from_numpy(rng.random((pyr.batch_size, gh, gw)).astype(np.float32) ** 3)
    ts = allocate(name, pyr, sc, n, seed=seed)
    check_contract(ts, pyr, n)
    # deterministic for a seed
    assert same(ts, allocate(name, pyr, sc, n, seed=seed))
    # batch == per-image loop (a learned network's batched convolutions round differently
    # in the last float bit: the same tokens up to 1e-6)
    for i in range(pyr.batch_size):
        one = Pyramid(tuple(lv[i:i + 1] for lv in pyr.levels))
        alone = allocate(name, one, sc[i:i + 1], n, seed=seed)
        if INFO[name].get("learned"):
            assert all(torch.allclose(getattr(ts[i], k), getattr(alone, k), atol=1e-6, rtol=0)
                       for k in ("centers", "levels", "scores", "fixations")), f"image {i}"
        else:
            assert same(ts[i], alone), f"image {i}"


@pytest.mark.parametrize("name", FIXED)
def test_flat_and_zero_maps_are_handled(name):
    pyr = image((128, 128))
    n = max(min_budget(name, pyr), 20)
    for fill in (0.0, 0.37):
        ts = allocate(name, pyr, torch.full((3, 8, 8), fill), n)
        check_contract(ts, pyr, n)


@pytest.mark.parametrize("name", sorted(ALLOCATORS))
def test_nan_scores_raise(name):
    pyr = image((128, 128))
    sc = torch.rand(3, 8, 8)
    sc[1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        allocate(name, pyr, sc, None if name == "full" else 20)


@pytest.mark.parametrize("name", ["topk", "logpolar", "lod_dag", "pyramid", "atlas"])
def test_bad_arguments_name_the_argument(name):
    pyr = image((128, 128))
    with pytest.raises(ValueError, match="budget"):
        allocate(name, pyr, torch.rand(3, 8, 8), 0)
    with pytest.raises(ValueError, match="budget"):
        allocate(name, pyr, torch.rand(3, 8, 8), 10_000)
    with pytest.raises(ValueError, match="scores"):
        allocate(name, pyr, torch.rand(3, 9, 8), 10)
    with pytest.raises(ValueError, match="fixation"):
        allocate(name, pyr, torch.rand(3, 8, 8), 20, fixation=(1.5, 0.2))


def test_full_returns_every_patch_and_rejects_other_budgets():
    pyr = image((96, 160))
    ts = allocate("full", pyr, torch.rand(3, 6, 10))
    assert ts.budget == 60 and ts.is_distinct().all() and (ts.levels == 0).all()
    with pytest.raises(ValueError, match="Gh\\*Gw"):
        allocate("full", pyr, torch.rand(3, 6, 10), 59)


# ----------------------------------------------------------------------------- guarantees
def test_topk_takes_the_best_scores():
    pyr = image((128, 128))
    sc = torch.rand(3, 8, 8)
    ts = allocate("topk", pyr, sc, 10)
    kth = torch.sort(sc.flatten(1), 1, descending=True).values[:, 9]
    assert (ts.scores.min(1).values >= kth).all()


@pytest.mark.parametrize("name,strata", [("topk_coverage", 4), ("stratified", 4),
                                         ("stratified_8x8", 8)])
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), extra=st.integers(0, 40))
def test_every_stratum_holds_a_token(name, strata, seed, extra):
    pyr = image((200, 136))                                 # 13 x 9 grid: uneven strata
    gh, gw = pyr.grid_shape(PATCH, 0)
    assert strata <= min(gh, gw)                            # every stratum fits the grid
    sc = torch.from_numpy(np.random.default_rng(seed).random((3, gh, gw)).astype(np.float32) ** 8)
    n = strata * strata + extra
    rc = allocate(name, pyr, sc, n).base_cells()
    gid, ng = stratum_ids((gh, gw), strata)
    hit = gid[rc[..., 0] * gw + rc[..., 1]]
    assert all(len(set(h.tolist())) == ng for h in hit)


def test_stratified_is_importance_proportional():
    pyr = image((256, 256))
    sc = torch.zeros(3, 16, 16)
    sc[:, :8, :8] = 1.0                                     # all importance in one quadrant
    rc = allocate("stratified", pyr, sc, 32, strata=2).base_cells()
    in_q = ((rc[..., 0] < 8) & (rc[..., 1] < 8)).sum(1)
    assert (in_q == 29).all()                               # 1 + (32 - 4) in the hot quadrant


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), fx=st.floats(0, 1), fy=st.floats(0, 1))
def test_logpolar_covers_every_nonempty_bin(seed, fx, fy):
    pyr = image((128, 128), batch=1)
    sc = torch.from_numpy(np.random.default_rng(seed).random((1, 8, 8)).astype(np.float32))
    from fovea_core.allocators.base import cell_centers
    bins, _, nb = logpolar_bins(cell_centers((8, 8), 0, (128, 128), PATCH, torch.float64),
                                torch.tensor([[fx, fy]]), (128, 128), n_rho=3, n_theta=6)
    nonempty = set(bins[0].tolist())
    rc = allocate("logpolar", pyr, sc, len(nonempty), fixation=(fx, fy), n_rho=3,
                  n_theta=6).base_cells()[0]
    assert set(bins[0, rc[:, 0] * 8 + rc[:, 1]].tolist()) == nonempty


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(16, 200))
def test_loop_references_select_the_same_patches(seed, n):
    pyr = image((224, 256), batch=2)                        # 14 x 16 grid
    sc = torch.from_numpy(np.random.default_rng(seed).random((2, 14, 16)).astype(np.float32))
    fix = torch.from_numpy(np.random.default_rng(seed + 1).random((2, 2)).astype(np.float32))
    assert stratified_reference(sc.numpy(), n, 4) == selected_cells(
        allocate("stratified", pyr, sc, n), 16)
    assert logpolar_reference(sc.numpy(), fix.numpy(), n, image_size=(224, 256)) == \
        selected_cells(allocate("logpolar", pyr, sc, n, fixation=fix), 16)


def test_hybrid_ratio_one_is_topk_and_zero_is_logpolar():
    pyr = image((128, 128))
    sc = torch.rand(3, 8, 8)
    assert same(allocate("hybrid", pyr, sc, 20, ratio=1.0), allocate("topk", pyr, sc, 20))
    assert same(allocate("hybrid", pyr, sc, 20, ratio=0.0), allocate("logpolar", pyr, sc, 20))
    with pytest.raises(ValueError, match="ratio"):
        allocate("hybrid", pyr, sc, 20, ratio=1.5)


def test_hybrid_differs_from_logpolar_only_when_uncovered_bins_overflow():
    g = torch.Generator().manual_seed(0)
    pyr = build_pyramid(torch.rand(1, 3, 512, 512, generator=g))
    sc = torch.rand(1, 32, 32, generator=g) ** 6
    # 129 bins <= 140 free slots: identical by construction (see the hybrid docstring)
    assert same(allocate("hybrid", pyr, sc, 200, ratio=0.3), allocate("logpolar", pyr, sc, 200))
    # 18 free slots, far fewer than the uncovered bins: the top-K share shows
    small = allocate("hybrid", pyr, sc, 60, ratio=0.7)
    assert not same(small, allocate("logpolar", pyr, sc, 60))
    top = set(allocate("topk", pyr, sc, 42).keys()[0].tolist())
    assert top <= set(small.keys()[0].tolist())


def _base_cover(ts, gh, gw):
    """Times each level-0 cell is covered by a token footprint ``[B, Gh, Gw]``."""
    cover = torch.zeros(ts.batch_size, gh, gw, dtype=torch.long)
    for b in range(ts.batch_size):
        for (x, y), lv in zip(ts.centers_px()[b].tolist(), ts.levels[b].tolist()):
            k = 2**int(lv)
            r0, c0 = int(y // (PATCH * k)) * k, int(x // (PATCH * k)) * k
            cover[b, r0:r0 + k, c0:c0 + k] += 1
    return cover


@pytest.mark.parametrize("size", [(256, 256), (200, 136)])
def test_lod_dag_tokens_never_overlap_and_tile_the_image(size):
    pyr = image(size)
    gh, gw = pyr.grid_shape(PATCH, 0)
    sc = torch.rand(3, gh, gw) ** 4
    for n in (min_budget("lod_dag", pyr), 40, 41, 42, gh * gw):
        ts = allocate("lod_dag", pyr, sc, n)
        cover = _base_cover(ts, gh, gw)
        assert cover.max() <= 1
        holes = (cover == 0).sum((1, 2))
        assert (holes <= 2 * 4**(pyr.num_levels - 2)).all()  # at most 2 children left out
        if n == gh * gw:
            assert (cover == 1).all()


def test_lod_dag_refines_where_importance_is():
    pyr = image((256, 256))
    sc = torch.zeros(3, 16, 16)
    sc[:, :4, :4] = 1.0
    ts = allocate("lod_dag", pyr, sc, 40)
    fine = ts.levels == ts.levels.min(1, keepdim=True).values
    assert (ts.centers[..., 0][fine] < 0.25).all() and (ts.centers[..., 1][fine] < 0.25).all()


def test_pyramid_per_level_budget_is_respected():
    pyr = build_pyramid(torch.rand(1, 3, 1024, 1024))
    ts = allocate("pyramid", pyr, torch.rand(1, 64, 64), 273)
    assert [(ts.levels == lv).sum().item() for lv in range(4)] == [64, 128, 64, 17]
    small = build_pyramid(torch.rand(1, 3, 512, 512))        # level 3 holds only 16 cells
    ts = allocate("pyramid", small, torch.rand(1, 32, 32), 273)
    assert [(ts.levels == lv).sum().item() for lv in range(4)] == [65, 128, 64, 16]


def test_foveated_pyramid_is_fine_at_the_fixation_and_coarse_away():
    pyr = build_pyramid(torch.rand(1, 3, 512, 512))
    ts = allocate("foveated_pyramid", pyr, torch.ones(1, 32, 32), 100, fixation=(0.2, 0.3))
    ecc = (ts.centers[0] - torch.tensor([0.2, 0.3])).norm(dim=-1)
    lv = ts.levels[0].float()
    assert torch.corrcoef(torch.stack([ecc, lv]))[0, 1] > 0.7
    assert lv[ecc.argmin()] == 0


def test_atlas_covers_every_given_region():
    pyr = image((128, 128))
    regions = torch.zeros(3, 8, 8, dtype=torch.long)
    regions[:, :, 4:] = 1
    regions[:, 6:, :] = 2
    sc = torch.zeros(3, 8, 8)
    sc[:, :2, :2] = 5.0
    rc = allocate("atlas", pyr, sc, 6, regions=regions).base_cells()
    assert all(set(regions[b, rc[b, :, 0], rc[b, :, 1]].tolist()) == {0, 1, 2} for b in range(3))


def test_frequency_prefers_text_like_horizontal_structure():
    img = torch.full((1, 3, 256, 256), 0.5)
    img[..., :128, :, ] = 0.5
    rows = torch.arange(128)
    img[..., :128, :] = (0.5 + 0.4 * torch.sign(torch.sin(rows * 2.1)))[:, None]  # text-ish lines
    pyr = build_pyramid(img)
    ts = allocate("frequency", pyr, torch.ones(1, 16, 16), 40)
    assert (ts.centers[0, :, 1] < 0.5).float().mean() > 0.8


def test_divprune_is_more_diverse_than_topk():
    from fovea_core.allocators.peers import patch_features
    pyr = image((256, 256))
    sc = torch.rand(3, 16, 16)
    f = patch_features(pyr)
    f = f / f.norm(dim=-1, keepdim=True).clamp(min=1e-8)

    def min_dist(ts):
        rc = ts.base_cells()
        idx = rc[..., 0] * 16 + rc[..., 1]
        sel = f[torch.arange(3)[:, None], idx]
        d = 1 - sel @ sel.transpose(1, 2) + 3 * torch.eye(idx.shape[1])
        return d.amin((1, 2))

    assert (min_dist(allocate("divprune", pyr, sc, 30)) > min_dist(allocate("topk", pyr, sc, 30))).all()


def test_visionzip_keeps_the_dominant_tokens():
    pyr = image((256, 256))
    sc = torch.rand(3, 16, 16)
    ts = allocate("visionzip", pyr, sc, 64)
    rc = ts.base_cells()
    chosen = set((rc[0, :, 0] * 16 + rc[0, :, 1]).tolist())
    assert set(torch.topk(sc[0].flatten(), 54).indices.tolist()) <= chosen


def test_uniform_ignores_content():
    pyr = image((128, 128))
    a = allocate("uniform", pyr, torch.rand(3, 8, 8), 16)
    b = allocate("uniform", pyr, torch.rand(3, 8, 8), 16)
    assert torch.equal(a.centers, b.centers) and (a.levels == 1).all()


def test_random_depends_on_seed_not_on_score_order():
    pyr = image((128, 128))
    sc = torch.rand(3, 8, 8)
    a, b = allocate("random", pyr, sc, 20, seed=0), allocate("random", pyr, sc, 20, seed=1)
    assert not torch.equal(a.centers, b.centers)
    assert not torch.equal(a.centers, allocate("topk", pyr, sc, 20).centers)


# ----------------------------------------------------------------------------- wrappers
def test_multi_fixation_modes_and_inhibition_of_return():
    pyr = image((256, 256))
    sc = torch.zeros(3, 16, 16)
    sc[:, 2, 2] = 1.0
    sc[:, 13, 12] = 0.9
    fix = fixations_with_ior(sc, 2, ior_radius=0.2)
    assert (fix[:, 0] - fix[:, 1]).norm(dim=-1).min() > 0.2
    split = allocate("multi_fixation", pyr, sc, 40, k=2)
    check_contract(split, pyr, 40)
    assert split.fixations.shape == (3, 2, 2)
    per = allocate("multi_fixation", pyr, sc, 40, k=2, mode="per_fixation")
    assert per.budget == 80 and per.is_distinct().all()


def test_adaptive_budget_groups_images_by_complexity():
    flat = torch.full((1, 3, 256, 256), 0.5)
    noisy = torch.rand(1, 3, 256, 256)
    pyr = build_pyramid(torch.cat([noisy, flat, noisy]))
    res = allocate("adaptive_budget", pyr, torch.rand(3, 16, 16), 40)
    assert all(isinstance(r, BucketResult) for r in res)
    got = {int(i): r.budget for r in res for i in r.indices}
    assert sorted(got) == [0, 1, 2]
    assert got[1] < got[0] == got[2]
    for r in res:
        assert r.tokens.budget == r.budget and r.tokens.is_distinct().all()


# ----------------------------------------------------------------------------- helpers
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), m=st.integers(1, 300))
def test_int64_keys_order_like_stable_multisort(seed, m):
    g = torch.Generator().manual_seed(seed)
    p = (torch.randint(-3, 3, (2, m), generator=g) * 0.5).float()
    p[0, 0] = -0.0
    t = torch.randint(0, 3, (2, m), generator=g)
    assert torch.equal(order(p, t), _order_sorts([t, p]))
    assert lex_key(p, t).unique(dim=1).shape[1] == m


def test_group_rank_and_largest_remainder():
    p = torch.tensor([[0.1, 0.9, 0.5, 0.9, 0.2]])
    g = torch.tensor([0, 1, 0, 1, 0])
    assert group_rank(p, g, 2).tolist() == [[2, 0, 0, 1, 1]]
    q = largest_remainder(torch.tensor([[1.0, 1.0, 2.0]]), 10, minimum=1)
    assert q.tolist() == [[3, 3, 4]]
    assert largest_remainder(torch.zeros(1, 4), 6).tolist() == [[2, 2, 1, 1]]


def test_pool_scores_max_and_mean_on_ragged_grids():
    s = torch.arange(15.0).view(1, 3, 5)
    assert pool_scores(s, 1, "max").tolist() == [[[6.0, 8.0, 9.0], [11.0, 13.0, 14.0]]]
    assert pool_scores(s, 1, "mean")[0, 1, 2].item() == 14.0


def test_pseudo_logpolar_training_reduces_the_loss():
    sc = torch.rand(4, 16, 16) ** 4
    centres, hist = train_pseudo_logpolar(sc, torch.full((4, 2), 0.5), (256, 256), steps=30)
    assert hist[-1] < hist[0]
    pyr = image((256, 256), batch=4)
    ts = allocate("pseudo_logpolar", pyr, sc, 50, centres=centres)
    check_contract(ts, pyr, 50)


@pytest.mark.parametrize("size", [(1024, 1024), (468, 1024), (1024, 600)])
@pytest.mark.parametrize("budget", [64, 100, 144, 273, 400])
def test_uniform_footprints_tile_the_whole_image(size, budget):
    """The plain-VLM baseline sees every pixel: no holes, whatever N."""
    h, w = size
    pyr = build_pyramid(torch.rand(1, 3, h, w))
    gh, gw = pyr.grid_shape(16)
    t = allocate("uniform", pyr, torch.rand(1, gh, gw), budget)
    assert t.budget == budget and bool(t.is_distinct().all())
    covered = torch.zeros(h, w, dtype=torch.bool)
    ys, xs = torch.arange(h)[:, None] + 0.5, torch.arange(w)[None, :] + 0.5
    for x0, y0, x1, y1 in t.boxes()[0].tolist():      # test-side reference loop over boxes
        covered |= (xs >= x0) & (xs <= x1) & (ys >= y0) & (ys <= y1)
    assert bool(covered.all()), f"{int((~covered).sum())} pixels unseen"


@pytest.mark.parametrize("name", [n for n in FIXED if not INFO[n]["uses_scores"]])
def test_allocators_that_declare_no_use_of_the_scores_ignore_them(name):
    """``uses_scores=False`` lets the sweep not charge the scorer's reads to the method:
    its tokens must then be the same for any score map."""
    pyr = image((128, 128))
    n = max(min_budget(name, pyr), 20)
    g = torch.Generator().manual_seed(1)
    a = allocate(name, pyr, torch.rand(3, 8, 8, generator=g), n)
    b = allocate(name, pyr, torch.rand(3, 8, 8, generator=g) ** 4, n)
    assert torch.equal(a.centers, b.centers) and torch.equal(a.levels, b.levels)


def test_the_score_using_allocators_do_depend_on_the_scores():
    # the guard of the test above: on the same two maps top-K moves its tokens
    pyr = image((128, 128))
    g = torch.Generator().manual_seed(1)
    a = allocate("topk", pyr, torch.rand(3, 8, 8, generator=g), 20)
    b = allocate("topk", pyr, torch.rand(3, 8, 8, generator=g) ** 4, 20)
    assert not torch.equal(a.centers, b.centers)
    assert INFO["topk"]["uses_scores"] and not INFO["resize"]["uses_scores"]
