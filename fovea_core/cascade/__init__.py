"""The budgeted Homunculus: gist -> localise -> foveate, all inside the token budget N.

Stages (each callable alone): :func:`~fovea_core.cascade.core.gist`, a localiser of
:mod:`fovea_core.cascade.localisers` (learned, query scorer on the gist, ...) or any
callable ``(gist, question) -> map`` (the book's oracle is one),
:func:`~fovea_core.cascade.core.place_fovea`; :func:`~fovea_core.cascade.allocator.cascade`
chains them and is registered as the allocator ``"cascade"``. The learned localiser is
trained by ``python -m fovea_book.train``; localisation metrics are in
:mod:`fovea_book.eval.localisation`.

The modules are layers; each imports only the ones before it (``tests/test_layers.py``):

1. :mod:`~fovea_core.cascade.raster` -- the token footprints on a raster (one rule, used
   by the algorithm and by the metrics);
2. :mod:`~fovea_core.cascade.core` -- the stages (gist, foveate, resampling);
3. :mod:`~fovea_core.cascade.localisers`, :mod:`~fovea_core.cascade.learned` -- the maps,
   and :mod:`~fovea_core.cascade.side` -- the text detector (side compute);
4. :mod:`~fovea_core.cascade.allocator` -- the chaining and the registered allocators;
5. :mod:`~fovea_core.cascade.reading` -- the read-then-look cascades (``cascade_read``,
   ``foveate``'s default ``cascade_glance``), on the allocator's stages;
6. on top, the evaluation: :mod:`~fovea_book.eval.localisation`,
   :mod:`~fovea_book.eval.cascade`, :mod:`~fovea_book.train` (this package's
   ``__init__`` imports none of them).
"""

from fovea_core.cascade.core import STAGE_FOVEA, STAGE_GIST, Gist, place_fovea, gist, gist_to_grid
from fovea_core.cascade.allocator import cascade, cascade_parts, choose_level  # registers
from fovea_core.cascade.localisers import LOCALISERS, get_localiser

__all__ = ["STAGE_GIST", "STAGE_FOVEA", "Gist", "gist", "place_fovea",
           "gist_to_grid", "cascade", "cascade_parts", "choose_level", "LOCALISERS",
           "get_localiser"]
import fovea_core.cascade.reading  # noqa: E402,F401  (registers "cascade_read")
from fovea_core.cascade.pseudo_labels import PseudoLabel, labels_from_read, page_labels  # noqa: E402

__all__ += ["PseudoLabel", "labels_from_read", "page_labels"]
