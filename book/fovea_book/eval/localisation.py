"""Localisation quality of a cascade: did the fovea land on the answer, and does the map rank
the answer's cells first?

* :func:`~fovea_core.cascade.raster.coverage_raster` (re-exported here) -- the raster of
  the tokens' footprints, shared with the algorithm;
* :func:`fovea_share` -- the share of the answer's area inside the foveated region (the
  union of the footprints of the fovea's tokens, stages >= 1), area-weighted;
* :func:`cell_auc` -- the ROC AUC of a score map over the level-0 cells, answer cells
  (those the answer's boxes touch) against the rest: the probability that a random answer
  cell outranks a random other cell, ties counting half [Hanley & McNeil 1982];
* :func:`localisation_row` -- both, plus the fovea's level, for one question;
* :class:`OracleLocaliser` -- the localiser told the answer's boxes: the upper bound of
  localisation the chapters measure the cascade against (never a fair method).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import torch

from fovea_core.cascade.core import Gist, page_key
from fovea_core.cascade.localisers import _grid, answer_mass
from fovea_core.cascade.raster import coverage_raster
from fovea_core.pyramid import build_pyramid
from fovea_core.tokens import TokenSet

__all__ = ["coverage_raster", "fovea_share", "cell_auc", "localisation_row", "OracleLocaliser"]

Box = tuple[int, int, int, int]


def fovea_share(tokens: TokenSet, boxes: Sequence[Box], *, index: int = 0,
                stages: Sequence[int] | None = (1, 2), step: int = 4) -> float:
    """Share of the answer's area inside the footprints of the tokens of ``stages`` of
    image ``index``; 1 = the fovea covers the whole answer.

    Evaluated on a ``step``-px raster of the answer's bounding region only: raster pixel
    centres inside a box count 1 each (the raster of :func:`coverage_raster`, restricted
    to the region; no loop over tokens or pixels)."""
    b = torch.as_tensor(np.asarray(boxes, dtype=np.float64).reshape(-1, 4))
    x0, y0 = float(b[:, 0].min()), float(b[:, 1].min())
    x1, y1 = float(b[:, 2].max()), float(b[:, 3].max())
    i0, i1 = int(np.floor(y0 / step)), int(np.ceil(y1 / step))
    j0, j1 = int(np.floor(x0 / step)), int(np.ceil(x1 / step))
    ys = (torch.arange(i0, i1, dtype=torch.float64) + 0.5) * step           # raster centres
    xs = (torch.arange(j0, j1, dtype=torch.float64) + 0.5) * step
    in_ans = (((ys[None, :, None] >= b[:, 1, None, None]) & (ys[None, :, None] < b[:, 3, None, None]))
              & ((xs[None, None, :] >= b[:, 0, None, None]) & (xs[None, None, :] < b[:, 2, None, None])
                 )).any(0)                                                   # [ny, nx]
    t = tokens[index]
    fb = t.boxes()[0].double()                                               # [N, 4]
    keep = torch.ones(fb.shape[0], dtype=torch.bool) if stages is None else \
        torch.isin(t.stage[0], torch.as_tensor(list(stages)))
    fb = fb[keep]
    inside = (((ys[None, :, None] >= fb[:, 1, None, None]) & (ys[None, :, None] < fb[:, 3, None, None]))
              & ((xs[None, None, :] >= fb[:, 0, None, None]) & (xs[None, None, :] < fb[:, 2, None, None]))
              ).any(0) if fb.shape[0] else torch.zeros_like(in_ans)
    tot = int(in_ans.sum())
    return float((in_ans & inside).sum()) / tot if tot > 0 else float("nan")


def cell_auc(scores: torch.Tensor, boxes: Sequence[Box], image_size: tuple[int, int], *,
             patch: int = 16) -> float:
    """ROC AUC of a score map ``[Gh, Gw]`` for the level-0 cells the answer's boxes touch
    (Mann-Whitney U from average ranks; NaN if the answer covers no cell or every cell)."""
    from scipy.stats import rankdata

    pos = (answer_mass(boxes, image_size, patch) > 0).flatten().numpy()
    s = torch.as_tensor(scores, dtype=torch.float64).flatten().numpy()
    n1, n0 = int(pos.sum()), int((~pos).sum())
    if n1 == 0 or n0 == 0:
        return float("nan")
    r = rankdata(s)
    return float((r[pos].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def localisation_row(tokens: TokenSet, scores: torch.Tensor, boxes: Sequence[Box],
                     *, index: int = 0, patch: int = 16) -> dict:
    """``{"fovea_share", "core_share", "cell_auc", "fovea_level"}`` of image ``index`` for
    one answer: ``core_share`` is the :func:`fovea_share` of the fovea's finest tokens
    alone (its core, read at ``fovea_level``)."""
    t = tokens[index]
    fov = t.stage >= 1                          # a cascade's tokens carry their stages
    lv = t.levels[fov]
    level = float(lv.min()) if lv.numel() else float("nan")
    core = fov & (t.levels <= level + 1e-6)
    as_core = TokenSet(t.centers, t.levels, t.scores, t.fixations, t.image_size, t.patch,
                       core.long())
    return dict(fovea_share=fovea_share(tokens, boxes, index=index),
                core_share=fovea_share(as_core, boxes, stages=(1,)) if lv.numel() else 0.0,
                cell_auc=cell_auc(scores[index], boxes, tokens.image_size, patch=patch),
                fovea_level=level)


class OracleLocaliser:
    """The answer boxes, given (upper bound of localisation; never a fair method).

    Built from the documents to be evaluated: ``(page, question) -> boxes``. The page is
    recognised by :func:`~fovea_core.cascade.core.page_key` (a hash of its pyramid's
    coarsest level), so the oracle fits the allocator interface (it receives the gist and
    the question). An unknown page or question raises ``KeyError``.
    """

    def __init__(self, documents: Iterable, patch: int = 16):
        self.patch = patch
        self.table: dict[tuple[str, str], tuple] = {}
        for d in documents:                                    # one pyramid per document
            key = page_key(build_pyramid(d.image, patch=patch))[0]
            for q in d.questions:
                self.table[(key, q.question)] = tuple(q.boxes)

    def __repr__(self) -> str:
        # stable across runs (it enters cache keys, which also hold the document's hash)
        return "OracleLocaliser()"

    def add(self, key: str, question: str, boxes) -> None:
        self.table[(key, question)] = tuple(boxes)

    def text_size(self, g: Gist, query: str | None) -> torch.Tensor:
        """``[B, Gh, Gw]`` log2 of the answer's text height (the median height of its boxes,
        base pixels) on every level-0 cell: the size a perfect estimate would give the
        cascade (``cascade_parts(..., size=oracle.text_size)``)."""
        if not g.key:
            raise KeyError("the oracle needs the gist's page key")
        gh, gw = _grid(g, self.patch)
        out = []
        for k in g.key:                                         # images of the batch
            if (k, query) not in self.table:
                raise KeyError(f"oracle: no answer boxes for this page and question {query!r}")
            b = np.asarray(self.table[(k, query)], dtype=np.float64).reshape(-1, 4)
            out.append(torch.full((gh, gw), math.log2(max(1.0, float(np.median(b[:, 3] - b[:, 1]))))))
        return torch.stack(out).double()

    def __call__(self, g: Gist, query: str | None) -> torch.Tensor:
        if not g.key:
            raise KeyError("the oracle needs the gist's page key")
        maps = []
        for k in g.key:                                         # images of the batch
            if (k, query) not in self.table:
                raise KeyError(f"oracle: no answer boxes for this page and question {query!r}")
            maps.append(answer_mass(self.table[(k, query)], g.image_size, self.patch))
        return torch.stack(maps)
