"""Every method by name: :mod:`fovea_core.allocators` registers the score-map allocators and
:mod:`fovea_core.cascade`, a layer above them, adds the cascade's methods to the same table
(:mod:`~fovea_core.allocators.registry`) when it is imported. This module imports both, so
its ``ALLOCATORS``, ``INFO``, ``allocate`` and ``allocate_parts`` list and run every method.
"""

from fovea_core.allocators.registry import (ALLOCATORS, INFO, allocate, allocate_parts,
                                            allocator_reads, register)
import fovea_core.allocators  # noqa: F401,E402  (registers the allocators)
import fovea_core.cascade  # noqa: F401,E402  (registers the cascade's methods)

__all__ = ["ALLOCATORS", "INFO", "allocate", "allocate_parts", "allocator_reads", "register"]
