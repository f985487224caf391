"""Homunculus allocators: importance map -> exactly N tokens per image (a :class:`TokenSet`).

Every registered name is called as ``allocate(name, pyramid, scores, budget, *,
fixation=None, query=None, seed=0, **params)`` (the signature:
:mod:`~fovea_core.allocators.registry`):

* ``pyramid``: :class:`~fovea_core.pyramid.Pyramid` of the image batch ``[B, C, H, W]``;
* ``scores``: importance on the level-0 patch grid ``[B, Gh, Gw]``, ``Gh = ceil(H / patch)``
  (finite; NaN raises ``ValueError``);
* ``budget``: N, the same for every image; the result has exactly N distinct tokens;
* ``fixation``: ``(x, y)`` in ``[0, 1]`` (or ``[B, 2]``); ``None`` = derived from the scores
  (:func:`~fovea_core.allocators.base.fixation_from_scores`);
* ``query``: accepted by every allocator so that one call fits all; query-awareness enters
  through ``scores`` (the query scorers of :mod:`fovea_core.importance`);
* ``seed``: only the random methods use it; results are deterministic for a seed and the
  batch result equals the per-image loop.

Rankings are deterministic and the same on every CPU (:mod:`~fovea_core.allocators.base`).
:mod:`fovea_core.methods` is the registry of every method, the cascade's included.
"""

from fovea_core.allocators.registry import ALLOCATORS, INFO, allocate, register
from fovea_core.allocators import grid, logpolar  # noqa: F401  (registration)
from fovea_core.allocators import pyramid, lod_dag, atlas, frequency, peers, wrappers  # noqa: F401
from fovea_core.allocators import cortical as _cortical

register("v1_cortical", family="cortical", version="v1c", coverage=None)(_cortical.v1_cortical)

__all__ = ["ALLOCATORS", "INFO", "allocate", "register"]
