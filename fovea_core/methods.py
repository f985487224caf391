"""Every method by name: the allocators and the budgeted cascade in one registry.

:mod:`fovea_core.allocators` registers the score-map allocators (grid top-K, pyramid, atlas,
LOD DAG, frequency, log-polar, ...) and :mod:`fovea_core.cascade`, a layer above them, adds
the cascade's methods (``"cascade"``, ``"cascade_gist_query"``, ``"cascade_prior"``,
``"cascade_text"``) to the same table when it is imported. This module imports both, so::

    from fovea_core.methods import ALLOCATORS, INFO, allocate, allocate_parts

lists and runs every method (see :func:`~fovea_core.allocators.registry.allocate` for the
call, :func:`~fovea_core.allocators.registry.allocate_parts` for a cascade's intermediates
and :func:`~fovea_core.allocators.registry.register` for what ``INFO`` holds: metadata,
options, runner).
"""

from fovea_core.allocators.registry import (ALLOCATORS, INFO, allocate, allocate_parts,
                                            allocator_reads, register)
import fovea_core.allocators  # noqa: F401,E402  (registers the allocators)
import fovea_core.cascade  # noqa: F401,E402  (registers the cascade's methods)

__all__ = ["ALLOCATORS", "INFO", "allocate", "allocate_parts", "allocator_reads", "register"]
