"""Homunculus allocators: importance map -> exactly N tokens per image (a :class:`TokenSet`).

Interface (every registered name)::

    allocate(name, pyramid, scores, budget, *, fixation=None, query=None, seed=0, **params)

* ``pyramid``: :class:`~fovea_core.pyramid.Pyramid` of the image batch ``[B, C, H, W]``;
* ``scores``: importance on the level-0 patch grid ``[B, Gh, Gw]``, ``Gh = ceil(H / patch)``
  (finite; NaN raises ``ValueError``);
* ``budget``: N, the same for every image; the result has exactly N distinct tokens;
* ``fixation``: ``(x, y)`` in ``[0, 1]`` (or ``[B, 2]``); ``None`` = derived from the scores
  (:func:`~fovea_core.allocators.base.fixation_from_scores`);
* ``query``: accepted by every allocator so that one call fits all; query-awareness enters
  through ``scores`` (the query scorers of :mod:`fovea_core.importance`), no allocator
  here reads it;
* ``seed``: only the random methods use it; results are deterministic for a seed and the
  batch result equals the per-image loop.

``ALLOCATORS`` maps names to callables, ``INFO`` to metadata (family, Homunculus version,
coverage guarantee, kind). Two wrappers differ in output: ``multi_fixation`` with
``mode="per_fixation"`` returns ``k * budget`` tokens, and ``adaptive_budget`` (kind
``"buckets"``) returns a list of per-bucket results because a TokenSet has one N per batch.

Scores of coarser levels are pooled from the level-0 map (max within a level, mean across
levels; each allocator's docstring says which). Every ranking compares values on a grid
well above float noise (:func:`~fovea_core.allocators.base.rank_grid`: values within about
``max / 2**17`` of each other tie), and ties always break towards the lower candidate index
(row-major, finer level first), so results are deterministic and the same on every CPU
(a few ulps of difference in a score map, a band energy or a pixel do not move a token). ``v1_cortical`` comes from :mod:`fovea_core.allocators.cortical`
when that module is present. The budgeted cascade's methods
(a higher layer, built from these allocators) join the same table when
:mod:`fovea_core.cascade` is imported; :mod:`fovea_core.methods` imports both and is the
registry of every method.
"""

from fovea_core.allocators.registry import ALLOCATORS, INFO, allocate, register
from fovea_core.allocators import grid, logpolar  # noqa: F401  (registration)
from fovea_core.allocators import pyramid, lod_dag, atlas, frequency, peers, wrappers  # noqa: F401

try:  # the CUDA helper's biology-based allocator (optional module)
    from fovea_core.allocators import cortical as _cortical
    if "v1_cortical" not in ALLOCATORS and hasattr(_cortical, "v1_cortical"):
        register("v1_cortical", family="cortical", version="v1c",
                 coverage=None)(_cortical.v1_cortical)
except ImportError:  # pragma: no cover - depends on the other helper's file
    pass

__all__ = ["ALLOCATORS", "INFO", "allocate", "register"]
