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
================  ===========================================================================

The models (RapidOCR, MiniLM) load lazily, once per process, from files inside their wheels.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fovea_core.importance.base import (ImageLike, fixation_from_scores, normalise,
                                        pool_to_grid, prepare)
from fovea_core.importance.query import query_scores, spatial_prior
from fovea_core.importance.saliency import center_bias, edge_density, spectral_residual
from fovea_core.importance.text import read_text, text_likelihood, text_probability

Scorer = Callable[..., torch.Tensor]


def _no_query(fn: Callable[..., torch.Tensor]) -> Scorer:
    def scorer(image: ImageLike, *, query: str | None = None, patch: int = 16) -> torch.Tensor:
        return fn(image, patch=patch)
    scorer.__doc__ = fn.__doc__
    scorer.__name__ = fn.__name__
    return scorer


def _saliency(image: ImageLike, *, query: str | None = None, patch: int = 16) -> torch.Tensor:
    """Spectral residual x centre bias (elementwise), peak 1."""
    x, _ = prepare(image, patch)
    return normalise(spectral_residual(x, patch=patch) * center_bias(x, patch=patch))


def _text_saliency(image: ImageLike, *, query: str | None = None, patch: int = 16
                   ) -> torch.Tensor:
    """``0.7 * text + 0.3 * saliency`` (both peak 1), peak 1."""
    x, _ = prepare(image, patch)
    return normalise(0.7 * text_likelihood(x, patch=patch) + 0.3 * _saliency(x, patch=patch))


def _query(image: ImageLike, *, query: str | None = None, patch: int = 16) -> torch.Tensor:
    """Query-aware map (:func:`~fovea_core.importance.query.query_scores`); needs ``query``."""
    if query is None:
        raise ValueError("the 'query' scorer needs query= (a non-empty question string)")
    return query_scores(image, query, patch=patch)


def _query_saliency(image: ImageLike, *, query: str | None = None, patch: int = 16
                    ) -> torch.Tensor:
    """``0.8 * query + 0.2 * saliency``, peak 1; needs ``query``."""
    x, _ = prepare(image, patch)
    return normalise(0.8 * _query(x, query=query, patch=patch) + 0.2 * _saliency(x, patch=patch))


SCORERS: dict[str, Scorer] = {
    "spectral_residual": _no_query(spectral_residual),
    "edge_density": _no_query(edge_density),
    "center_bias": _no_query(center_bias),
    "saliency": _saliency,
    "text": _no_query(text_likelihood),
    "text_saliency": _text_saliency,
    "query": _query,
    "query_saliency": _query_saliency,
}


def score(name: str, image: ImageLike, *, query: str | None = None, patch: int = 16
          ) -> torch.Tensor:
    """Score map ``[B, Gh, Gw]`` of scorer ``name`` (a key of :data:`SCORERS`)."""
    if name not in SCORERS:
        raise ValueError(f"unknown scorer {name!r}; choose one of {sorted(SCORERS)}")
    return SCORERS[name](image, query=query, patch=patch)


__all__ = ["SCORERS", "center_bias", "edge_density", "fixation_from_scores", "normalise",
           "pool_to_grid", "query_scores", "read_text", "score", "spatial_prior",
           "spectral_residual", "text_likelihood", "text_probability"]
