"""v4 ``lod_dag``: Nanite-style level of detail on a quadtree over the mip pyramid.

Nanite [Karis et al., SIGGRAPH 2021] keeps a DAG of clusters at several levels of detail
and refines, where the screen-space error is largest, until a budget is met. Here the
clusters are the cells of the patch-grid quadtree: node ``(l, i, j)`` covers level-0
cells ``[i 2^l, (i+1) 2^l) x [j 2^l, (j+1) 2^l)`` and has up to four children at level
``l - 1``. The error of a node is

    E(l, i, j) = mass(l, i, j) * 2**(alpha * l),   mass = sum of (s - min s) over the block

(importance times footprint size; ``alpha = 1`` by default). Because a child's mass never
exceeds its parent's and its footprint is half as wide, ``E(child) <= E(parent)``. The
greedy loop "refine the leaf with the largest error" therefore refines nodes in the order
(E desc, coarser first, index asc) -- a parent always comes before its children -- so it
is computed without a loop: sort the internal nodes once, and the token count after the
first ``k`` refinements is ``R + cumsum(children - 1)``. Refinement stops at the largest
``k`` that stays within ``budget``; if tokens remain (the quadtree grows in steps of 3),
the next node in the order is *partially* refined: its ``r + 1`` children with the most
mass replace it and its other children stay uncovered. Tokens have mixed sizes, never
overlap, and cover the image except for at most those 1-2 partial-refinement holes.
"""

from __future__ import annotations

import torch

from fovea_core.allocators.base import (candidate_grid, cells_to_tokens, check_inputs,
                                        group_rank, nonneg, order_lex, resolve_fixation,
                                        select)
from fovea_core.allocators.registry import register
from fovea_core.pyramid import Pyramid
from fovea_core.tokens import TokenSet


@register("lod_dag", family="lod_dag", version="v4", coverage="tiling")
def lod_dag(pyramid: Pyramid, scores, budget: int, *, alpha: float = 1.0,
            max_level: int | None = None, fixation=None, query=None, seed: int = 0,
            patch: int = 16) -> TokenSet:
    """v4: refine the quadtree node with the largest error until ``budget`` tokens are used.

    Roots are the cells of level ``L = max_level`` (default: the coarsest pyramid level);
    ``budget`` must be at least the number of roots (else ``ValueError``). See the module
    docstring for the error metric and the exact-budget rule. Token scores are the node's mean
    score.
    """
    s, n = check_inputs(pyramid, scores, budget, patch=patch, name="lod_dag")
    fix = resolve_fixation(fixation, s)
    b = s.shape[0]
    top = pyramid.num_levels - 1 if max_level is None else min(max_level, pyramid.num_levels - 1)
    levels = list(range(top + 1))
    dev = s.device
    cand = candidate_grid(pyramid, levels, patch, dev)
    m = cand.size
    mass = cand.gather_scores(nonneg(s), "sum").double()                       # [B, M]
    err = mass * torch.pow(2.0, alpha * cand.levels.double())[None]
    mean = cand.gather_scores(s, "mean")
    # parent index of every node (level l -> l + 1), -1 for roots
    parent = torch.full((m,), -1, dtype=torch.long, device=dev)
    for i, lv in enumerate(levels[:-1]):                                       # over levels
        sl = cand.slice(i)
        ph, pw = cand.shapes[i + 1]
        parent[sl] = cand.offsets[i + 1] + (cand.rows[sl] // 2) * pw + cand.cols[sl] // 2
    has_parent = parent >= 0
    nchild = torch.zeros(m, dtype=torch.long, device=dev).index_add_(   # roots add 0 at 0
        0, parent.clamp(min=0), has_parent.long())
    n_roots = cand.shapes[-1][0] * cand.shapes[-1][1]
    if n_roots > n:
        raise ValueError(f"lod_dag: budget {n} is below the {n_roots} root cells at level {top}")
    # refinement order over internal nodes: (error desc, level desc, index asc)
    internal = (nchild > 0)[None].expand(b, m)
    perm = order_lex([internal.long(), err, cand.levels.double()[None].expand(b, m)], tier_max=1)
    gain = (nchild - 1)[perm] * internal.gather(1, perm)                       # [B, M]
    count = n_roots + torch.cumsum(gain, 1)
    k = (count <= n).sum(1)                                                    # refinements done
    ar = torch.arange(m, device=dev)[None]
    refined_sorted = (ar < k[:, None]) & internal.gather(1, perm)
    refined = torch.zeros(b, m, dtype=torch.bool, device=dev).scatter(1, perm, refined_sorted)
    used = torch.where(k > 0, count.gather(1, (k - 1).clamp(min=0)[:, None])[:, 0],
                       torch.full_like(k, n_roots))
    r = n - used                                                               # leftover tokens
    partial = perm.gather(1, k.clamp(max=m - 1)[:, None])[:, 0]                # next node
    partial = torch.where(r > 0, partial, torch.full_like(partial, -1))
    # leaves: not refined and (root or parent refined); plus children of the partial node
    par_ref = torch.where(has_parent[None], refined.gather(1, parent.clamp(min=0)[None].expand(b, m)),
                          torch.ones(b, m, dtype=torch.bool, device=dev))
    leaf = ~refined & par_ref
    is_pchild = has_parent[None] & (parent[None] == partial[:, None])
    # -inf, not a finite sentinel: the ranking grid's scale is the children's largest mass
    crank = group_rank(torch.where(is_pchild, mass, -torch.inf).float(),
                       is_pchild.long(), 2)
    take_child = is_pchild & (crank < (r + 1)[:, None])
    leaf = torch.where((partial >= 0)[:, None] & (ar == partial[:, None]),
                       torch.zeros_like(leaf), leaf) | take_child
    idx = select(leaf.float(), n)
    return cells_to_tokens(cand, idx, mean, pyramid.image_size, fix, patch)
