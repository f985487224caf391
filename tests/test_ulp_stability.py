"""The same tokens on any x86 CPU: no selection flips on the last bit of a float sum.

A score map, a band energy or a network's output is a float sum whose last bits depend on
the CPU that computed it (SIMD width, BLAS kernels). Every registered method ranks on the
rounding-robust grid of :func:`fovea_core.allocators.base.rank_grid` (ties to the lower
index) and reads pixels on :func:`~fovea_core.allocators.base.pixel_grid`, so a few ulps
of difference in its inputs must not change which tokens it takes. Here the inputs of every
registered method (the page's pixels and the score map) are multiplied by ``1 + k * eps``
(``k`` uniform in ``[-4, 4]`` per value, ``eps`` = float32's), which breaks every exact
tie by noise, as another CPU's rounding would; the tokens (centres, levels, stages) must be
those of the unperturbed call.

The pages are what readers foveate: 8-bit pixels (``k / 255``), a white background with
dark strokes and a photograph in one corner, and (for the allocators that take a score map)
a blank page with one line. The score maps hold exact ties (an integer map, a flat map) and
one continuous map. The cascade reads its own map from the pixels (a network, saliency):
its pages are the two documents; on a nearly blank page the spectral-residual saliency of
``cascade_gist_query`` is not robust to float noise (the phases of near-zero spectral
components are noise), a property of that scorer, not of the ranking.
"""

from __future__ import annotations

import pytest
import torch

from fovea_core.methods import ALLOCATORS, INFO, allocate
from fovea_core.pyramid import Pyramid, build_pyramid

PATCH = 16
EPS = torch.finfo(torch.float32).eps
TRIALS = 2


def page(h: int, w: int, seed: int) -> torch.Tensor:
    """A document-like page ``[3, H, W]`` of 8-bit values: strokes on white, a photo corner
    (``seed < 0``: a blank page with one line of dark strokes)."""
    g = torch.Generator().manual_seed(seed)
    img = torch.full((3, h, w), 255.0)
    if seed < 0:
        img[:, h // 3:h // 3 + 3, w // 8:w - w // 8] = 50.0
        return img / 255.0
    for _ in range(h // 12):                                          # text-like strokes
        y = int(torch.randint(0, h - 4, (1,), generator=g))
        x = int(torch.randint(0, w // 2, (1,), generator=g))
        img[:, y:y + 3, x:x + int(torch.randint(8, w // 2, (1,), generator=g))] = float(
            torch.randint(0, 80, (1,), generator=g))
    img[:, -h // 4:, -w // 4:] = torch.randint(0, 256, (3, h // 4, w // 4), generator=g).float()
    return img / 255.0


def score_maps(b: int, gh: int, gw: int) -> torch.Tensor:
    """``[b, gh, gw]``: integer ties, a flat map, then continuous maps."""
    g = torch.Generator().manual_seed(11)
    s = torch.rand(b, gh, gw, generator=g)
    s[0] = torch.randint(0, 4, (gh, gw), generator=g).float()
    s[1] = 0.37
    return s


def perturb(x: torch.Tensor, seed: int) -> torch.Tensor:
    """``x * (1 + k * eps)`` with ``k`` uniform in ``{-4, ..., 4}`` per value."""
    k = torch.randint(-4, 5, x.shape, generator=torch.Generator().manual_seed(seed))
    return x * (1 + k.float() * EPS)


def _min_budget(name: str, pyr: Pyramid) -> int:
    """A budget the method accepts on ``pyr`` (about a third of the grid)."""
    gh, gw = pyr.grid_shape(PATCH, 0)
    n = gh * gw // 3
    if INFO[name]["family"] == "cascade":        # its gist must reach the top level
        from fovea_core.cascade.allocator import gist_budget_for

        th, tw = pyr.grid_shape(PATCH, pyr.num_levels - 1)
        return max(n, next(m for m in range(1, gh * gw + 1) if th * tw <= gist_budget_for(m) < m))
    if name in ("lod_dag", "resize", "resize_nonblank"):
        th, tw = pyr.grid_shape(PATCH, pyr.num_levels - 1)
        return max(n, th * tw)
    return max(n, 64 if name == "stratified_8x8" else 16)


def _tokens(result) -> list[tuple[str, torch.Tensor]]:
    """What must not move: centres, levels and stages (per bucket for ``adaptive_budget``)."""
    if isinstance(result, list):
        return [(f"bucket {r.budget} {f}", t) for r in result
                for f, t in [("indices", r.indices)] + _tokens(r.tokens)]
    out = [("centers", result.centers), ("levels", result.levels)]
    return out + ([] if result.stage is None else [("stage", result.stage)])


#: cheap methods on small pages; the content methods and the cascade (its localiser's map
#: is a network's output) on pages just large enough for them
SIZE = {"cascade": (256, 256)}


@pytest.fixture(scope="module")
def images() -> dict:
    return {}


@pytest.mark.parametrize("name", sorted(ALLOCATORS))
def test_tokens_do_not_move_with_a_few_ulps(name, images):
    cascade = INFO[name]["family"] == "cascade"
    h, w = SIZE["cascade"] if cascade else (160, 128)
    b = 2 if cascade else 3
    img = torch.stack([page(h, w, i) for i in range(b - 1)] + [page(h, w, -1 if b > 2 else 1)])
    pyr = build_pyramid(img, patch=PATCH)
    gh, gw = pyr.grid_shape(PATCH, 0)
    s = score_maps(b, gh, gw)
    n = None if name == "full" else _min_budget(name, pyr)
    want = _tokens(allocate(name, pyr, s, n))
    for trial in range(TRIALS):
        got = _tokens(allocate(name, build_pyramid(perturb(img, trial), patch=PATCH),
                               perturb(s, 100 + trial), n))
        assert [f for f, _ in got] == [f for f, _ in want], (name, trial)
        for (field, a), (_, b_) in zip(got, want):
            assert torch.equal(a, b_), f"{name}: {field} moved with a few ulps (trial {trial})"


def test_rank_grid_ties_noise_and_keeps_the_order():
    """Values a few ulps apart share a grid index; distinct values keep their order; +inf and
    NaN rank above, -inf below every finite value; an all-zero row is all ties."""
    from fovea_core.allocators.base import rank_grid

    x = torch.tensor([[1.0, 1.0 * (1 + 4 * EPS), 0.5, 0.5 * (1 - 3 * EPS), 0.25, 0.0,
                       -float("inf"), float("inf"), float("nan")]])
    q = rank_grid(x)[0].tolist()
    assert q[0] == q[1] and q[2] == q[3]
    assert q[8] > q[7] > q[0] > q[2] > q[4] > q[5] > q[6]
    assert rank_grid(torch.zeros(2, 5)).eq(0).all()
    # the scale is per row along dim: a row of small values is ranked as finely
    small = torch.tensor([[1e-6, 2e-6, 3e-6], [1.0, 2.0, 3.0]])
    assert torch.equal(rank_grid(small)[0], rank_grid(small)[1])
    with pytest.raises(ValueError, match="bits must be in"):
        rank_grid(x, bits=40)
