"""Localisers for stage (b) of the cascade: gist (+ question) -> score map ``[B, Gh, Gw]``.

Compared on the same footing in the cascade chapter (same gist, same fovea, same budget):

* ``"learned"`` -- :class:`~fovea_core.cascade.learned.LearnedLocaliser`, the small network
  trained on synthetic pages (the seeds' supervised Homunculus);
* ``"learned_prior"`` -- the same network asked *no* question (its question-agnostic prior
  of where answers sit): what the question adds;
* ``"gist_query"`` -- today's query scorer (:func:`~fovea_core.importance.query.query_scores`:
  OCR + MiniLM + spatial words) run on the gist image only, upsampled to the page's size
  so that the OCR's detector sees text at a usual scale (upsampling adds no information);
* ``"uniform"`` -- every cell equal (the fovea then reads the page's top-left corner:
  the floor a localiser must beat);
* a path to weights of the learned network (``"my_pages.pt"``, e.g. written by
  :func:`fovea_core.adapt` from a folder of a user's pages; its JSON record beside it is
  verified as the committed weights' is): :class:`~fovea_core.cascade.learned.
  LearnedLocaliser` with those weights (:func:`weights_localiser`);
* the oracle (:class:`fovea_book.eval.localisation.OracleLocaliser`, the book's) -- the
  answer boxes, given: the upper bound of perfect localisation at this budget. It is the
  only localiser that knows anything but the gist and the question, and it is labelled
  "oracle" wherever it appears; :func:`answer_mass` is its map of given boxes.
"""

from __future__ import annotations

import functools
import math
import os
from collections import OrderedDict
from pathlib import Path
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from fovea_core.cascade.core import Gist

__all__ = ["LOCALISERS", "get_localiser", "gist_query", "uniform", "answer_mass",
           "weights_localiser", "is_weights_path"]


def _grid(g: Gist, patch: int | None = None) -> tuple[int, int]:
    p = g.patch if patch is None else patch
    h, w = g.image_size
    return math.ceil(h / p), math.ceil(w / p)


def uniform(g: Gist, query: str | None) -> torch.Tensor:
    """Every level-0 cell the same score ``[B, Gh, Gw]``."""
    gh, gw = _grid(g)
    return torch.ones(g.image.shape[0], gh, gw)


_SALIENCY: OrderedDict = OrderedDict()   # the upsampled gist, its saliency and OCR, per page


def gist_query(g: Gist, query: str | None, *, max_side: int = 2048) -> torch.Tensor:
    """Today's query scorer restricted to what the gist shows.

    The gist image (only its on-page part) is upsampled bicubically to the page's size
    (longer side at most ``max_side``) and given to
    :func:`~fovea_core.importance.query.query_scores` with ``coarse_level=0`` (no further
    downsampling), then ``0.8 query + 0.2 saliency`` as the ``query_saliency`` scorer does;
    the map is moved to the level-0 grid by area (:func:`gist_to_grid`, mean). Without a
    question, the saliency part alone.
    """
    from fovea_core.importance import query_map, read_page, score

    h, w = g.image_size
    s = min(1.0, max_side / max(h, w))
    cell = 16
    key = (g.key, g.rows, g.cols, g.level, max_side)
    if g.key and key in _SALIENCY:
        big, sal, text = _SALIENCY[key]
    else:
        x = g.image.float()
        inside = g.inside()
        rows = torch.nonzero(inside.any(1)).flatten()
        cols = torch.nonzero(inside.any(0)).flatten()
        crop = x[:, :, rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
        big = F.interpolate(crop, size=(max(16, round(h * s)), max(16, round(w * s))),
                            mode="bicubic", align_corners=False).clamp(0, 1)
        sal, text = score("saliency", big, patch=cell), None
    if query and text is None:
        text = read_page(big)           # the OCR half of score("query", big): once per page
    if g.key:
        _SALIENCY[key] = (big, sal, text)
        _SALIENCY.move_to_end(key)
        while len(_SALIENCY) > 8:
            _SALIENCY.popitem(last=False)
    if query:
        m = 0.8 * query_map(text, query, patch=cell) + 0.2 * sal
    else:
        m = sal
    # the map's cells are `cell` px of the upsampled crop = cell / s base px, from the crop's
    # first on-page gist pixel (within half a gist pixel of the page's corner)
    gh, gw = _grid(g)
    from fovea_core.cascade.core import overlap_matrix

    side = cell / s
    ay = overlap_matrix(gh, g.patch, 0.0, m.shape[-2], side, 0.0, h)
    ax = overlap_matrix(gw, g.patch, 0.0, m.shape[-1], side, 0.0, w)
    num = torch.einsum("yi,bij,xj->byx", ay, m.double(), ax)
    den = torch.einsum("yi,xj->yx", ay.sum(1, keepdim=True), ax.sum(1, keepdim=True)).clamp(min=1e-12)
    out = (num / den).float()
    return out / out.flatten(1).sum(1).clamp(min=1e-12)[:, None, None]


def answer_mass(boxes: Sequence[tuple[int, int, int, int]], image_size: tuple[int, int],
                patch: int = 16) -> torch.Tensor:
    """``[Gh, Gw]``: area share of each level-0 cell covered by the answer's boxes, summed
    over boxes (:func:`~fovea_core.importance.query.box_coverage`)."""
    from fovea_core.importance.query import box_coverage

    b = torch.as_tensor(np.asarray(boxes, dtype=np.float32).reshape(-1, 4))
    return box_coverage(b, image_size, patch).sum(0)


def _learned(g: Gist, query: str | None) -> torch.Tensor:
    from fovea_core.cascade.learned import LearnedLocaliser

    return LearnedLocaliser()(g, query)


def _learned_prior(g: Gist, query: str | None) -> torch.Tensor:
    from fovea_core.cascade.learned import LearnedLocaliser

    return LearnedLocaliser()(g, None)


def _learned_paper(g: Gist, query: str | None) -> torch.Tensor:
    from fovea_core.cascade.learned import LearnedLocaliser

    return LearnedLocaliser(paper=True)(g, query)


#: named localisers (the book's oracle is built per evaluation from its documents)
LOCALISERS: dict[str, Callable[[Gist, "str | None"], torch.Tensor]] = {
    "learned": _learned,
    "learned_prior": _learned_prior,
    "learned_paper": _learned_paper,
    "gist_query": gist_query,
    "uniform": uniform,
}


def is_weights_path(localiser: object) -> bool:
    """Whether ``localiser`` names a weights file rather than a localiser: a
    :class:`os.PathLike`, or a string ending in ``.pt`` that is no name of
    :data:`LOCALISERS`."""
    return isinstance(localiser, os.PathLike) or (
        isinstance(localiser, str) and localiser not in LOCALISERS
        and localiser.lower().endswith(".pt"))


@functools.lru_cache(maxsize=8)
def _weights_localiser(path: str, mtime_ns: int, size: int):
    from fovea_core.cascade.learned import LearnedLocaliser, load_model

    return LearnedLocaliser(net=load_model.__wrapped__(path, verify=True))   # this version


def weights_localiser(path: str | os.PathLike) -> Callable[[Gist, "str | None"], torch.Tensor]:
    """The learned localiser with the weights at ``path`` (a ``.pt`` file whose JSON record
    beside it gives their SHA-256 and architecture, as :func:`fovea_core.adapt` and the
    book's training write them), verified on first use and loaded once per file version
    (a rewritten file is loaded again).

    Raises ``ValueError`` naming the path when there is no such file or its record is
    missing or does not vouch for it."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"localiser: no weights file at {p} (a .pt file written by "
                         "fovea_core.adapt or the book's training, its .json record beside it)")
    st = p.stat()
    return _weights_localiser(str(p.resolve()), st.st_mtime_ns, st.st_size)


def get_localiser(localiser: str | os.PathLike | Callable
                  ) -> Callable[[Gist, "str | None"], torch.Tensor]:
    """A localiser by name (:data:`LOCALISERS`), the learned localiser with the weights at a
    path (:func:`weights_localiser`: a ``.pt`` file, e.g. :func:`fovea_core.adapt`'s), or
    the callable itself."""
    if callable(localiser):
        return localiser
    if is_weights_path(localiser):
        return weights_localiser(localiser)
    if localiser not in LOCALISERS:
        raise ValueError(f"unknown localiser {localiser!r}; choose one of {sorted(LOCALISERS)}, "
                         "a path to a .pt file of localiser weights (fovea_core.adapt writes "
                         "one), or pass a callable (gist, query) -> [B, Gh, Gw]")
    return LOCALISERS[localiser]
