"""Photograph-like versions of a page, one factor at a time, and what each does to the map.

A phone photograph of a receipt differs from a scan in several ways at once: the sheet lies
on a table and fills part of the frame, the camera sees it in perspective and a little
rotated, the text is blurred, the light uneven, the image small and compressed. To find
which of these breaks the learned localiser, each is applied alone to training pages the
localiser never saw (:data:`FACTORS`, :func:`factor_table`), and the map is scored against
the answer's boxes (cell AUC and the answer's share inside the fovea,
:mod:`fovea_book.eval.localisation`). Answer boxes go through the same transform (the
bounding box of the transformed corners, clipped to the frame). No OCR is run: the
localisation metrics need only the map and the boxes.

Every transform is deterministic given its ``numpy`` generator; the parameters (the sheet's
share of the frame, the corner jitter, the blur's sigma, ...) are stated in :data:`FACTORS`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np
import pandas as pd

from fovea_book.eval.document_types import Document

__all__ = ["JPEG_QUALITY", "photo_like", "warp", "on_background", "perspective", "rotated",
           "blurred", "uneven_light", "page_rows", "half_page", "FACTORS", "factor_table"]

EPS = 1e-6
#: JPEG quality of :func:`photo_like` (a phone camera's default is 75-95)
JPEG_QUALITY = 75


def photo_like(doc: Document, scale: float, *, quality: int = JPEG_QUALITY) -> Document:
    """``doc`` resized by ``scale`` (area interpolation) and re-encoded as a JPEG of
    ``quality``; answer boxes scaled with it (outward rounding, clipped to the page). The id
    becomes ``"<doc_id>@<scale>"``. Text elements are dropped (the scaled page has none
    drawn at a known size).

    Raises ``ValueError`` for ``scale`` outside ``(0, 1]`` or ``quality`` outside [1, 100]."""
    if not (isinstance(scale, (int, float)) and 0 < scale <= 1):
        raise ValueError(f"scale must be in (0, 1], got {scale!r}")
    if not (isinstance(quality, int) and 1 <= quality <= 100):
        raise ValueError(f"quality must be an int in [1, 100], got {quality!r}")
    h, w = doc.size
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    img = doc.image if (nh, nw) == (h, w) else cv2.resize(doc.image, (nw, nh),
                                                          interpolation=cv2.INTER_AREA)
    ok, buf = cv2.imencode(".jpg", np.ascontiguousarray(img[..., ::-1]),
                           [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise RuntimeError(f"{doc.doc_id}: JPEG encoding failed")
    img = np.ascontiguousarray(cv2.imdecode(buf, cv2.IMREAD_COLOR)[..., ::-1])
    m = np.diag([nw / w, nh / h, 1.0])
    qs = tuple(replace(q, boxes=_boxes(q.boxes, m, (nh, nw)),
                       size_px=int(round(q.size_px * scale))) for q in doc.questions)
    return Document(f"{doc.doc_id}@{scale:g}", img, qs, (), doc.source)


def _boxes(boxes: Sequence, m: np.ndarray, out_hw: tuple[int, int]) -> tuple:
    """Boxes ``[K, 4]`` ``(x0, y0, x1, y1)`` through the 3 x 3 homography ``m``: the bounding
    box of the four transformed corners, rounded outward, clipped to ``out_hw``, at least
    one pixel (a corner within ``EPS`` of a pixel edge stays on it: float round-off)."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    corners = np.stack([b[:, [0, 1]], b[:, [2, 1]], b[:, [0, 3]], b[:, [2, 3]]], 1)  # [K,4,2]
    p = cv2.perspectiveTransform(corners.reshape(1, -1, 2), m)[0].reshape(-1, 4, 2)
    h, w = out_hw
    x0 = np.clip(np.floor(p[..., 0].min(1) + EPS), 0, w - 1)
    y0 = np.clip(np.floor(p[..., 1].min(1) + EPS), 0, h - 1)
    x1 = np.clip(np.maximum(np.ceil(p[..., 0].max(1) - EPS), x0 + 1), 1, w)
    y1 = np.clip(np.maximum(np.ceil(p[..., 1].max(1) - EPS), y0 + 1), 1, h)
    return tuple(tuple(int(v) for v in r) for r in np.stack([x0, y0, x1, y1], 1))


def warp(doc: Document, m: np.ndarray, out_hw: tuple[int, int],
         fill: tuple[int, int, int]) -> Document:
    """``doc`` through the homography ``m`` (3 x 3, page -> frame) into a frame of
    ``out_hw`` filled with ``fill`` where the page does not reach; boxes follow
    (:func:`_boxes`)."""
    h, w = out_hw
    img = cv2.warpPerspective(doc.image, m, (w, h), flags=cv2.INTER_LINEAR,
                              borderMode=cv2.BORDER_CONSTANT, borderValue=fill)
    qs = tuple(replace(q, boxes=_boxes(q.boxes, m, out_hw)) for q in doc.questions)
    return Document(doc.doc_id, img, qs, (), doc.source)


def _table_colour(rng: np.random.Generator) -> tuple[int, int, int]:
    """A table top's colour: mid-grey to brown, darker than paper."""
    base = rng.uniform(60, 170)
    return tuple(int(np.clip(base + d, 0, 255)) for d in rng.uniform(-25, 25, 3))


def on_background(doc: Document, rng: np.random.Generator, *, share: float = 0.6) -> Document:
    """The sheet on a table: a frame ``1 / sqrt(share)`` times the page's size on each side
    (so the sheet covers ``share`` of it), the page at a random whole-pixel offset (pasted,
    not resampled), the rest a flat table colour."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share!r}")
    h, w = doc.size
    k = 1 / math.sqrt(share)
    fh, fw = int(round(h * k)), int(round(w * k))
    ox, oy = float(rng.integers(0, fw - w + 1)), float(rng.integers(0, fh - h + 1))
    m = np.array([[1, 0, ox], [0, 1, oy], [0, 0, 1]], dtype=np.float64)
    return warp(doc, m, (fh, fw), _table_colour(rng))


def perspective(doc: Document, rng: np.random.Generator, *, jitter: float = 0.08) -> Document:
    """A camera not square to the sheet: each corner moved by up to ``jitter`` of the
    page's side, the frame the page's size."""
    h, w = doc.size
    src = np.float32([[0, 0], [w, 0], [w, h], [0, h]])
    dst = src + (rng.uniform(-jitter, jitter, (4, 2)) * [w, h]).astype(np.float32)
    return warp(doc, cv2.getPerspectiveTransform(src, dst), (h, w), _table_colour(rng))


def rotated(doc: Document, rng: np.random.Generator, *, degrees: float = 5.0) -> Document:
    """The sheet turned by up to ``degrees`` about its centre."""
    h, w = doc.size
    a = cv2.getRotationMatrix2D((w / 2, h / 2), rng.uniform(-degrees, degrees), 1.0)
    return warp(doc, np.vstack([a, [0, 0, 1]]), (h, w), _table_colour(rng))


def blurred(doc: Document, rng: np.random.Generator, *, sigma: float = 2.0) -> Document:
    """Defocus: a Gaussian blur of ``sigma`` page pixels."""
    return replace(doc, image=cv2.GaussianBlur(doc.image, (0, 0), sigma), elements=())


def uneven_light(doc: Document, rng: np.random.Generator, *, low: float = 0.55) -> Document:
    """A lamp to one side: the page times a smooth gain falling from 1 at a random point to
    ``low`` a page-length away."""
    h, w = doc.size
    s = max(h, w)
    yy, xx = np.ogrid[:h, :w]
    cy, cx = rng.uniform(0, h), rng.uniform(0, w)
    d2 = ((yy - cy) ** 2 + (xx - cx) ** 2) / s**2
    gain = low + (1 - low) * np.clip(1 - d2, 0, 1)
    img = (doc.image * gain[..., None]).clip(0, 255).astype(np.uint8)
    return replace(doc, image=img, elements=())


def page_rows(doc: Document, y0: int, y1: int, *, tag: str = "part") -> Document:
    """The rows ``[y0, y1)`` of the page, its whole width: the text keeps its pixel height
    while the frame shrinks, so it is taller against the frame (a short receipt, or a long
    one photographed in part). The questions whose answers lie wholly inside are kept
    (boxes moved with the rows); the others are dropped, their answer not being in the
    picture. The id becomes ``"<doc_id>@<tag>"``.

    Raises ``ValueError`` unless ``0 <= y0 < y1 <= H``."""
    h, _ = doc.size
    if not (isinstance(y0, (int, np.integer)) and isinstance(y1, (int, np.integer))
            and 0 <= y0 < y1 <= h):
        raise ValueError(f"rows must satisfy 0 <= y0 < y1 <= {h}, got {y0!r}, {y1!r}")
    qs = tuple(replace(q, boxes=tuple((b[0], b[1] - y0, b[2], b[3] - y0) for b in q.boxes))
               for q in doc.questions if all(y0 <= b[1] and b[3] <= y1 for b in q.boxes))
    return Document(f"{doc.doc_id}@{tag}", doc.image[y0:y1].copy(), qs, (), doc.source)


def half_page(doc: Document, rng: np.random.Generator) -> Document:
    """A photograph of half of the receipt: its top or bottom half (at random) through
    :func:`page_rows`, so the text is twice as tall against the frame's height."""
    h = doc.size[0]
    top = bool(rng.random() < 0.5)
    return page_rows(doc, 0, h // 2, tag="top") if top else \
        page_rows(doc, h - h // 2, h, tag="bottom")


#: one factor at a time: ``{name: transform(doc, rng) -> doc}``
FACTORS: dict[str, Callable[[Document, np.random.Generator], Document]] = {
    "as stored": lambda d, rng: d,
    "a quarter of the size, JPEG": lambda d, rng: photo_like(d, 0.25),
    "on a table, 60 % of the frame": on_background,
    "perspective (corners moved by up to 8 %)": perspective,
    "rotated by up to 5 degrees": rotated,
    "blurred (sigma 2 px)": blurred,
    "uneven light (down to 55 %)": uneven_light,
    "half of the receipt (top or bottom)": half_page,
}


def factor_table(docs: Sequence[Document], localisers: Mapping[str, str], *,
                 factors: Mapping[str, Callable] = FACTORS, budget: int = 273,
                 seed: int = 0, cache_path: str | Path | None = "default") -> pd.DataFrame:
    """One row per (factor, localiser, page, question): ``cell_auc`` and ``fovea_share`` of
    the cascade with that localiser (a name of
    :data:`~fovea_core.cascade.localisers.LOCALISERS`, ``{label: name}``) on the page after
    the factor, its map's ``map_confidence``
    (:func:`~fovea_core.cascade.allocator.map_confidence`, what the glance rule's gate
    reads), and the page's ``grid`` (level-0 cells). The generator of page ``i`` is
    ``default_rng([seed, i])`` for every factor and localiser. Pages the cascade cannot
    run at ``budget`` after a factor (too small) are skipped.

    The rows of one (factor, page, localiser) are stored in the evaluator's cell cache
    (``cache_path``: ``"default"`` the sweep's,
    :func:`~fovea_book.eval.evaluator.cell_cache_path`, one file per version of the code;
    ``None``: none), keyed by the factor, the page's content, its generator, the budget
    and the localiser, so the chapters that read the same table compute it once."""
    from fovea_book.eval.evaluator import _fn_id, cell_cache_path, document_fingerprint
    from fovea_book.eval.localisation import cell_auc, fovea_share
    from fovea_core.cache import SqliteCache
    from fovea_core.cascade.allocator import budget_range, cascade_parts, map_confidence
    from fovea_core.cascade.core import gist
    from fovea_core.cascade.allocator import gist_budget_for
    from fovea_core.pyramid import build_pyramid

    cache = (None if cache_path is None else
             SqliteCache(cell_cache_path() if cache_path == "default" else Path(cache_path)))
    rows = []
    for fname, f in factors.items():
        for i, doc in enumerate(docs):
            keys = {label: hashlib.sha1(json.dumps(dict(
                kind="factor", f=fname, fn=_fn_id(f), dh=document_fingerprint(doc), i=i,
                seed=seed, b=int(budget), l=label, loc=_fn_id(loc)), sort_keys=True,
                default=str).encode()).hexdigest() for label, loc in localisers.items()}
            done = {label: json.loads(text) for label, k in keys.items()
                    if cache is not None and (text := cache.get(k)) is not None}
            todo = [label for label in localisers if label not in done]
            if todo:
                page = f(doc, np.random.default_rng([seed, i]))
                lo, hi = budget_range(page.size)
                fits = lo <= budget <= hi
                if fits:
                    pyr = build_pyramid(page.image)
                    g = gist(pyr, gist_budget_for(budget))
                for label in todo:
                    done[label] = []
                    for q in (page.questions if fits else []):
                        p = cascade_parts(pyr, budget, query=q.question,
                                          localiser=localisers[label], gist_obj=g)
                        done[label].append(dict(
                            factor=fname, localiser=label, doc_id=doc.doc_id, field=q.field,
                            grid=pyr.grid_shape(16, 0)[0] * pyr.grid_shape(16, 0)[1],
                            cell_auc=cell_auc(p.scores[0], q.boxes, page.size),
                            fovea_share=fovea_share(p.tokens, q.boxes),
                            map_confidence=float(map_confidence(p.scores[:1])[0])))
                    if cache is not None:
                        cache.put(keys[label], json.dumps(done[label], default=float))
            rows += [r for label in localisers for r in done[label]]
    return pd.DataFrame(rows)
