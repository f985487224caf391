"""Importance scorers: where should the fixed token budget go?

Every scorer has the signature ``scorer(image, *, query=None, patch=16) -> [B, Gh, Gw]``
(float32, finite, non-negative, per-image peak 1, ``Gh = ceil(H/patch)``,
``Gw = ceil(W/patch)``); ``image`` is anything :func:`fovea_core.as_image_batch` accepts
or a :class:`fovea_core.Pyramid`. Look them up by name in :data:`SCORERS` or call
:func:`score`:

================  ===========================================================================
name              map
================  ===========================================================================
spectral_residual Hou & Zhang (2007) spectral-residual saliency
edge_density      mean Sobel gradient magnitude per cell
center_bias       Clarke & Tatler (2014) anisotropic central Gaussian (sigma^2 = .22, nu = .45)
saliency          spectral_residual x center_bias
text              RapidOCR DB detector text probability, mean per cell
text_saliency     0.7 text + 0.3 saliency
query             query-aware: MiniLM similarity of peripheral OCR lines x spatial words
query_saliency    0.8 query + 0.2 saliency (needs ``query``)
query_noprior     ``query`` without the spatial word prior (the ablation of chapter 07)
query_saliency_noprior  0.8 query_noprior + 0.2 saliency
fixation          learned fixation predictor: saliency channels, faces, text, centre bias
                  (:mod:`~fovea_core.importance.fixation`, fitted on OSIE train images)
none              all zeros: for allocators that look at the pixels themselves (reads nothing)
================  ===========================================================================

The models (RapidOCR, MiniLM) load lazily, once per process, from files inside their wheels.

**Cost in tokens.** A scorer's look at the image is part of what a method spends:
:data:`READS` (pixels per scorer) and :func:`scorer_cost` (their 16 x 16-pixel token
equivalent). The registry and the cost rule live in :mod:`fovea_core.importance.registry`,
the scorers in
:mod:`~fovea_core.importance.saliency`, :mod:`~fovea_core.importance.text`,
:mod:`~fovea_core.importance.query` and :mod:`~fovea_core.importance.fixation`; this package
re-exports them.
"""

from __future__ import annotations

from fovea_core.importance.base import fixation_from_scores, normalise, pool_to_grid
from fovea_core.importance.fixation import fixation_scores
from fovea_core.importance.query import query_map, query_scores, read_page, spatial_prior
from fovea_core.importance.registry import (PAGE_PARTS, READS, SCORERS, TOKEN_PIXELS, Scorer,
                                            ScorerCost, query_saliency_from, score,
                                            scorer_cost)
from fovea_core.importance.saliency import center_bias, edge_density, spectral_residual
from fovea_core.importance.text import read_text, text_likelihood, text_probability

__all__ = ["PAGE_PARTS", "READS", "SCORERS", "ScorerCost", "query_saliency_from",
           "scorer_cost", "center_bias", "edge_density", "fixation_from_scores",
           "fixation_scores", "normalise", "pool_to_grid", "query_map", "query_scores",
           "read_page", "read_text", "score", "spatial_prior", "spectral_residual",
           "text_likelihood", "text_probability"]
