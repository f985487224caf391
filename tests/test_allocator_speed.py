"""What makes allocators fast keeps their results: content caches, separable nearest-centre."""

from __future__ import annotations

import torch

from fovea_core.methods import allocate
from fovea_core.allocators.logpolar import _nearest_centre
from fovea_core.pyramid import build_pyramid


def test_content_cost_is_paid_once_per_page():
    """atlas and frequency cache what they compute from pixels per page: a budget sweep over
    the same page segments / decomposes it once, and the result does not change."""
    from fovea_core.allocators import content_cache

    pyr = build_pyramid(torch.rand(2, 3, 256, 256, generator=torch.Generator().manual_seed(5)))
    scores = torch.rand(2, 16, 16, generator=torch.Generator().manual_seed(6))
    for name in ("atlas", "frequency"):
        content_cache.clear()
        first = allocate(name, pyr, scores, 40)
        assert content_cache.STATS == {"hits": 0, "misses": 2}         # one per page
        again = allocate(name, pyr, scores, 40)
        other = allocate(name, pyr, scores, 60)
        assert content_cache.STATS == {"hits": 4, "misses": 2}
        assert torch.equal(first.centers, again.centers) and other.budget == 60
        content_cache.clear()
        assert torch.equal(allocate(name, pyr, scores, 60).centers, other.centers)



def test_separable_nearest_centre_equals_the_direct_argmin():
    g = torch.Generator().manual_seed(0)
    gh, gw = 7, 9
    ys, xs = torch.meshgrid(torch.linspace(-0.5, 0.6, gh), torch.linspace(-0.4, 0.7, gw),
                            indexing="ij")
    off = torch.stack([xs, ys], -1).reshape(1, -1, 2) + torch.rand(3, 1, 2, generator=g) * 0.1
    c = torch.rand(20, 2, generator=g) - 0.5
    direct = ((off[:, :, None, :] - c) ** 2).sum(-1).argmin(-1)
    assert torch.equal(_nearest_centre((gh, gw), off, c), direct)


def test_divprune_cpp_greedy_equals_the_torch_loop():
    """The C++ greedy (CPU) selects what the batched torch loop selects: random features
    (no near ties), a blank region of identical features (exact ties to the lower index)."""
    from fovea_core import kernels as K
    from fovea_core.allocators.peers import _divprune_torch, _unit

    g = torch.Generator().manual_seed(2)
    f = _unit(torch.randn(3, 300, 19, generator=g))
    f[2, 100:200] = f[2, 100]                                      # a blank region
    first = torch.tensor([0, 17, 150])
    assert torch.equal(K.divprune_greedy(f, first, 40), _divprune_torch(f, first, 40))
