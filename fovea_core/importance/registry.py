"""The scorer registry: :data:`SCORERS` (name -> scorer), :func:`score`, the parts a page's
questions share (:data:`PAGE_PARTS`), and what each scorer reads
(:data:`READS`, :func:`scorer_cost`). The table of scorers and the cost rule are in
:mod:`fovea_core.importance`'s docstring; that package re-exports every name here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fovea_core.importance.base import ImageLike, normalise, prepare
from fovea_core.importance.fixation import fixation_reads, fixation_scores
from fovea_core.importance.query import query_scores
from fovea_core.importance.saliency import center_bias, edge_density, spectral_residual
from fovea_core.importance.text import text_likelihood

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


def _query(image: ImageLike, *, query: str | None = None, patch: int = 16,
           prior: bool = True) -> torch.Tensor:
    """Query-aware map (:func:`~fovea_core.importance.query.query_scores`); needs ``query``."""
    if query is None:
        raise ValueError("the 'query' scorer needs query= (a non-empty question string)")
    return query_scores(image, query, patch=patch, prior=prior)


def query_saliency_from(query_map: torch.Tensor, saliency_map: torch.Tensor) -> torch.Tensor:
    """The ``query_saliency`` map ``[B, Gh, Gw]`` from its parts, the ``query`` (or
    ``query_noprior``) map and the ``saliency`` map: ``0.8 * query + 0.2 * saliency``, peak 1.
    A page asked several questions needs its saliency once (:data:`PAGE_PARTS`)."""
    return normalise(0.8 * query_map + 0.2 * saliency_map)


#: scorers whose map is a per-question function of per-page parts: ``{name: (spatial prior?,
#: the parts: "text" = the OCR read (:func:`~fovea_core.importance.query.read_page`),
#: "saliency" = the saliency map)}``; the book's sweep computes each part once per page
PAGE_PARTS: dict[str, tuple[bool, tuple[str, ...]]] = {
    "query": (True, ("text",)),
    "query_noprior": (False, ("text",)),
    "query_saliency": (True, ("text", "saliency")),
    "query_saliency_noprior": (False, ("text", "saliency")),
}


def _query_saliency(image: ImageLike, *, query: str | None = None, patch: int = 16,
                    prior: bool = True) -> torch.Tensor:
    """``0.8 * query + 0.2 * saliency``, peak 1; needs ``query``."""
    x, _ = prepare(image, patch)
    return query_saliency_from(_query(x, query=query, patch=patch, prior=prior),
                               _saliency(x, patch=patch))


def _query_noprior(image: ImageLike, *, query: str | None = None, patch: int = 16
                   ) -> torch.Tensor:
    """:func:`_query` without the spatial word prior (ablation)."""
    return _query(image, query=query, patch=patch, prior=False)


def _query_saliency_noprior(image: ImageLike, *, query: str | None = None, patch: int = 16
                            ) -> torch.Tensor:
    """:func:`_query_saliency` without the spatial word prior (ablation)."""
    return _query_saliency(image, query=query, patch=patch, prior=False)


def _none(image: ImageLike, *, query: str | None = None, patch: int = 16) -> torch.Tensor:
    """All zeros ``[B, Gh, Gw]``: no look at the page (the allocator reads what it needs)."""
    x, (gh, gw) = prepare(image, patch)
    return torch.zeros(x.shape[0], gh, gw)


SCORERS: dict[str, Scorer] = {
    "spectral_residual": _no_query(spectral_residual),
    "edge_density": _no_query(edge_density),
    "center_bias": _no_query(center_bias),
    "saliency": _saliency,
    "text": _no_query(text_likelihood),
    "text_saliency": _text_saliency,
    "query": _query,
    "query_saliency": _query_saliency,
    "query_noprior": _query_noprior,
    "query_saliency_noprior": _query_saliency_noprior,
    "fixation": _no_query(fixation_scores),
    "none": _none,
}

#: equivalent token side: costs are counted in 16 x 16-pixel tokens whatever the patch
TOKEN_PIXELS = 16 * 16


def _thumbnail_px(h: int, w: int, size: int = 64) -> int:
    """Pixels of the spectral residual's working image (longer side ``size``, area-resized)."""
    s = size / max(h, w)
    return max(3, round(h * s)) * max(3, round(w * s))


def _det_px(h: int, w: int, limit: int = 2048) -> int:
    """Pixels of the text detector's input (multiples of 32, longer side capped at ``limit``)."""
    r = min(1.0, limit / max(h, w))
    return max(32, round(int(h * r) / 32) * 32) * max(32, round(int(w * r) / 32) * 32)


def _half_px(h: int, w: int) -> int:
    """Pixels of pyramid level 1 (the half-resolution page the query scorer OCRs)."""
    return math.ceil(h / 2) * math.ceil(w / 2)


#: pixels each scorer reads for an ``H x W`` page (the view its computation looks at)
READS: dict[str, Callable[[int, int], int]] = {
    "spectral_residual": _thumbnail_px,
    "edge_density": lambda h, w: h * w,
    "center_bias": lambda h, w: 0,
    "saliency": _thumbnail_px,
    "text": _det_px,
    "text_saliency": lambda h, w: _det_px(h, w) + _thumbnail_px(h, w),
    "query": _half_px,
    "query_saliency": lambda h, w: _half_px(h, w) + _thumbnail_px(h, w),
    "query_noprior": _half_px,
    "query_saliency_noprior": lambda h, w: _half_px(h, w) + _thumbnail_px(h, w),
    "fixation": fixation_reads,
    "none": lambda h, w: 0,
}


@dataclass(frozen=True)
class ScorerCost:
    """What a scorer read: ``pixels`` and ``tokens = ceil(pixels / 256)`` (16-px tokens)."""

    pixels: int
    tokens: int


def scorer_cost(name: str, image_size: tuple[int, int]) -> ScorerCost:
    """The pixels scorer ``name`` reads on an ``(H, W)`` page, and their token equivalent.

    E.g. on a 1024 x 1024 page: ``saliency`` reads a 64 x 64 thumbnail (16 tokens), ``query``
    the 512 x 512 half-resolution page (1,024 tokens: unbudgeted at N = 273), ``none`` 0.
    A callable scorer declares its cost with an attribute ``reads(h, w) -> pixels``.
    """
    reads = getattr(name, "reads", None) if callable(name) else READS.get(name)
    if reads is None:
        raise ValueError(f"scorer {name!r} declares no cost; known: {sorted(READS)} (a callable "
                         "scorer needs an attribute reads(h, w) -> pixels)")
    h, w = (int(v) for v in image_size)
    if h < 1 or w < 1:
        raise ValueError(f"image_size must be positive (H, W), got {image_size!r}")
    px = int(reads(h, w))
    return ScorerCost(px, math.ceil(px / TOKEN_PIXELS))


def score(name: str, image: ImageLike, *, query: str | None = None, patch: int = 16
          ) -> torch.Tensor:
    """Score map ``[B, Gh, Gw]`` of scorer ``name`` (a key of :data:`SCORERS`)."""
    if name not in SCORERS:
        raise ValueError(f"unknown scorer {name!r}; choose one of {sorted(SCORERS)}")
    return SCORERS[name](image, query=query, patch=patch)


__all__ = ["PAGE_PARTS", "READS", "SCORERS", "TOKEN_PIXELS", "Scorer", "ScorerCost",
           "query_saliency_from", "score", "scorer_cost"]
