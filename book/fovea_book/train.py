"""Train the cascade's learned localiser on synthetic and real training pages.

Run as ``python -m fovea_book.train``.

Data:

* synthetic pages of two layouts of :mod:`fovea_book.eval.documents`: ``"paper"`` (the
  book's pages) and ``"receipt"``, with seeds from :data:`TRAIN_SEED` upwards (far from the
  seeds any chapter evaluates on: 1000 + k);
* real pages of the *training* folders :data:`REAL_SOURCES` (``sroie-train``: scanned
  receipts, :mod:`fovea_book.eval.sroie`; ``funsd-train``: scanned forms,
  :mod:`fovea_book.eval.funsd`), found with :func:`~fovea_book.paths.dataset_path`. A page
  whose id hashes to 0 modulo :attr:`TrainConfig.real_valid_mod` (``crc32(doc_id) % 5``)
  is held out for validation, never trained on. The ``*-dev`` folders the book reports on
  are never read here. A missing training folder stops the run with a message saying where
  it was looked for, unless ``--allow-missing-real`` is given (the record then says which
  folder was missing);
* on a form, a question text can repeat (a column header ``SCORE`` linked to many answers):
  such a question has no single answer, so its answers are merged into one question whose
  target is the union of their boxes (:data:`REPEATED_RULE`; counted in the record);
* questions phrased with the ``"train"`` wording pools (:data:`~fovea_book.eval.documents.
  WORDINGS`, :data:`~fovea_book.eval.documents.FORM_WORDINGS` for forms, ``{key}`` filled
  with the form's own label); the ``"heldout"`` pools and the ``"invoice"`` layout are kept
  for evaluation;
* each page seen at :attr:`TrainConfig.gists_per_page` gist budgets ``G`` drawn from
  :attr:`TrainConfig.gists`;
* for a share :attr:`TrainConfig.null_share` of the pages, one extra "question" with no
  text whose answer is every answer of the page (the question-agnostic prior);
* the text size a real answer is trained on is the median height of its line boxes (the
  scans give no font size; a synthetic answer's is its font size);
* with ``--photo`` (:attr:`TrainConfig.photo`), every training page, synthetic or real, is
  first turned into a photo-like copy (:func:`photo_page`: crop, scale-down, rotation and
  keystone, blur, uneven light, tone curve, JPEG; ranges and reasons in
  :class:`PhotoRanges`), its answer boxes and text sizes moved with the pixels, drawn
  from ``(seed, page index)`` alone; all gists of a page come from the same copy.

Validation (``validation`` in the record): held-out synthetic pages (seeds from
:data:`VALID_SEED`; ``paper``, ``receipt`` and the never-trained ``invoice`` layout) and the
held-out pages of the real training folders (``sroie``, ``funsd``), each in the held-out
and the training wordings, and photo-like copies of the held-out ``receipt``, ``sroie`` and
``funsd`` pages (``+photo``, :func:`valid_photo_rng`: the same copies for every run). These
are tuning numbers on pages the run never trained on, not results: the book reports on the
``*-dev`` folders only.

Model and loss: :class:`~fovea_core.cascade.learned.GistLocaliserNet`, cross-entropy
between the softmax over the page's gist pixels and the answer boxes' area on them
(:func:`~fovea_core.cascade.learned.answer_targets`, the one definition, with the loss
:func:`~fovea_core.cascade.learned.batch_loss` and the ink augmentation shared with
:func:`fovea_core.adapt`), Adam with a
cosine learning-rate decay over the run (``cfg.epochs`` epochs, or exactly
:attr:`TrainConfig.steps` steps: :mod:`fovea_book.learning_curve` gives every point the
same count).

Reproducibility: one seed fixes the pages, the gist budgets, the initial weights, the
batch order and the augmentation; page ``i`` is a pure function of ``(seed, i)``, so the
first steps can be re-run without generating the whole set (a real page is read from its
folder on first use). The defaults of
:class:`TrainConfig` and of every command-line option are the configuration of the
committed run (``fovea_core/weights/gist_localiser.json`` records it; a test compares them).

Output: ``<name>.pt`` (float32 state dict) and ``<name>.json`` beside it (its SHA-256, the
configuration, the loss of every step, what each source contributed (pages, questions,
layouts, page ids), validation metrics, the time it took). By default
they go to ``_build/models/gist_localiser.pt``, never over the committed weights;
``--replace-committed`` writes ``fovea_core/weights/gist_localiser.pt`` and its record, which the
book loads (and whose SHA-256 ``tests/test_cascade_train.py`` pins, so a replacement must
be committed with the new hash on purpose). ``--out`` naming the committed file without
that flag is refused before anything is trained. ``tests/test_cascade_train.py`` also
re-runs the first steps and compares them with the record.

Examples::

    python -m fovea_book.train                      # -> _build/models/ (minutes)
    python -m fovea_book.train --epochs 8 --out _build/models/e8.pt
    python -m fovea_book.train --replace-committed  # -> fovea_core/weights/ (then commit
                                                            #    it with the new hash)
    python -m fovea_book.train --allow-missing-real --out _build/models/syn.pt
                                                            # without a missing real folder
    python -m fovea_book.train --photo --out data/models/gist_localiser_photo.pt
                                                            # on photo-like pages
    python -m fovea_book.train --real funsd-train --out data/models/gist_localiser_no_sroie.pt
                                                            # leave SROIE out
    python -m fovea_book.train --part 0.5 --out data/models/gist_localiser_part.pt
                                                            # half the pages shown in part
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import sys
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fovea_core.cascade.core import Gist, gist
from fovea_core.cascade.learned import (EMBED_NOISE, SIZE_WEIGHT, GistLocaliserNet,  # noqa: F401
                                        answer_targets, batch_loss, collate_pages,
                                        file_sha256, gist_features, jitter_embedding,
                                        pool_target, weights_path)
from fovea_book.eval.documents import FORM_FIELD, Document, Question, make_document
from fovea_book.paths import DatasetNotFound, dataset_path, project_root
from fovea_core.pyramid import Pyramid, default_num_levels

__all__ = ["TRAIN_SEED", "VALID_SEED", "REAL_SOURCES", "REPEATED_RULE", "TrainConfig",
           "Sample", "RealPage", "TrainingSet", "make_sample", "answer_text_px",
           "merge_repeated", "real_pages", "training_samples", "train", "evaluate",
           "validation_samples", "vocabulary", "default_output", "build_parser", "output_path",
           "main", "PHOTO", "PHOTO_SALT", "PHOTO_MIN_CELLS", "PhotoRanges", "photo_page",
           "photo_training_page", "valid_photo_rng", "VALIDATIONS", "validation_key",
           "validate", "answer_targets", "target_map", "pool_target"]

#: first seed of the training pages (chapters evaluate seeds 1000 + k)
TRAIN_SEED = 10_000_000
#: first seed of the validation pages (held out from training)
VALID_SEED = 20_000_000
#: the real training folders (dataset name -> layout name of their pages); never a ``*-dev``
REAL_SOURCES: dict[str, str] = {"sroie-train": "sroie", "funsd-train": "funsd"}
#: what a question whose text repeats on one page trains on: one question, the union of the
#: repeated questions' answer boxes (:func:`merge_repeated`)
REPEATED_RULE = "union"


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines the trained weights. The defaults are the committed run's
    configuration (``config`` in ``fovea_core/weights/gist_localiser.json``; tested)."""

    seed: int = 0
    pages: int = 400                      # training pages
    gists_per_page: int = 2               # samples per page (distinct gist budgets)
    receipt_share: float = 0.6            # share of receipts among them (rest: paper)
    gists: tuple[int, ...] = (48, 64, 96)
    null_share: float = 0.25              # pages with an extra question-agnostic target
    epochs: int = 5
    batch: int = 8                        # pages per step
    lr: float = 3e-3
    weight_decay: float = 1e-4
    width: int = 16                       # network width (GistLocaliserNet)
    maps: int = 32
    wording: str = "train"
    valid_pages: int = 48                 # per synthetic validation set
    real: tuple[str, ...] = tuple(REAL_SOURCES)  # real training folders (REAL_SOURCES)
    real_pages: int | None = None         # at most this many training pages per real folder
                                          # (the first by id; None: all of them)
    real_valid_mod: int = 5               # real page held out if crc32(doc_id) % this == 0
    photo: bool = False                   # photo-like augmentation of every training page
                                          # (:func:`photo_page`; False: the committed run)
    steps: int | None = None              # optimiser steps (the cosine schedule spans them;
                                          # epochs then ignored); None: epochs x an epoch's
                                          # batches (the committed run)
    part: float = 0.0                     # share of training pages shown in part (:func:`part_page`:
                                          # a band of rows, so the text is taller against the
                                          # frame; 0.0: the committed run)
    position: bool = True                 # the net sees where on the page a pixel lies
                                          # (GistLocaliserNet; False: position-free)


@dataclass
class Sample:
    """One training page: its gist features, geometry and questions."""

    x: torch.Tensor                       # [7, h, w] float16
    ys: torch.Tensor                      # [h] gist pixel centres (base px), float64
    xs: torch.Tensor                      # [w]
    half: float                           # half a gist pixel (base px)
    inside: torch.Tensor                  # [h, w] bool
    queries: list[tuple[str, str] | None]  # per question (wording key, {item} slot); None
                                           # = no question
    boxes: list[np.ndarray]               # per question [K, 4] base px
    sizes: list[float]                    # per question: log2 text height in gist pixels
    layout: str
    gist_budget: int
    meta: dict = field(default_factory=dict)


def _page_rng(cfg: TrainConfig, index: int, salt: int) -> np.random.Generator:
    return np.random.default_rng([cfg.seed, index, salt])


def page_spec(cfg: TrainConfig, index: int, *, base: int = TRAIN_SEED
              ) -> tuple[str, int, list[int]]:
    """``(layout, page seed, gist budgets)`` of training page ``index`` (a pure function)."""
    rng = _page_rng(cfg, index, base % 9973)
    layout = "receipt" if rng.random() < cfg.receipt_share else "paper"
    k = min(cfg.gists_per_page, len(cfg.gists))
    budgets = [int(b) for b in rng.choice(cfg.gists, size=k, replace=False)]
    return layout, base + cfg.seed * 100_003 + index, budgets


def gist_of(doc: Document, budget: int) -> Gist:
    """The gist of a page, building only the pyramid levels it needs."""
    from fovea_core.allocators.grid import resize_grid

    h, w = doc.size
    level = resize_grid((h, w), budget, 16)[2]
    levels = min(default_num_levels(h, w, 16), int(math.floor(level)) + 2)
    return gist(fast_pyramid(doc.image, levels), budget)


def fast_pyramid(image: np.ndarray, num_levels: int) -> Pyramid:
    """The page's :class:`~fovea_core.pyramid.Pyramid` built with ``cv2.pyrDown`` (what
    :func:`~fovea_core.pyramid.pyr_down` reproduces, ``tests/test_pyramid.py``), on one
    channel when the page is grey: several times faster for generating training data."""
    import cv2

    grey = bool((image[..., :1] == image).all())             # synthetic pages: R = G = B
    x = (image[..., 0] if grey else image).astype(np.float32) / 255.0
    levels = [x]
    for _ in range(num_levels - 1):
        levels.append(cv2.pyrDown(levels[-1]))
    as_t = (lambda a: torch.from_numpy(a)[None, None]) if grey else \
        (lambda a: torch.from_numpy(a).permute(2, 0, 1)[None])  # noqa: E731
    return Pyramid(tuple(as_t(np.ascontiguousarray(a)) for a in levels))


def target_map(g: Gist, boxes) -> torch.Tensor:
    """``[h, w]`` training target of one question on gist ``g``:
    :func:`~fovea_core.cascade.learned.answer_targets` of its ``boxes`` (``[K, 4]`` base px)
    on the gist's pixels."""
    ys, xs = g.pixel_centres()
    return answer_targets(ys, xs, g.pixel / 2, g.inside(), [boxes])[0]


def answer_text_px(q: Question) -> float:
    """The text height (base px) an answer's size target is built from: its font size on a
    synthetic page (``q.size_px``), else (scans, ``size_px == 0``) the median height of its
    line boxes, each box one printed line (SROIE's text lines, FUNSD's :func:`~fovea_core.
    eval.funsd.answer_lines`)."""
    if q.size_px > 0:
        return float(q.size_px)
    b = np.asarray(q.boxes, np.float64).reshape(-1, 4)
    return float(max(np.median(b[:, 3] - b[:, 1]), 1.0))


def make_sample(doc: Document, budget: int, *, null: bool, layout: str) -> Sample:
    """Gist features and targets of one page (plus the question-agnostic target if ``null``).

    ``layout``: the page's layout (``"paper"``, ``"receipt"``, ``"invoice"``, or a real
    source's :data:`REAL_SOURCES` layout ``"sroie"`` / ``"funsd"``), which picks the wording
    pool of each question (:func:`~fovea_book.eval.wordings.wording_key`); a form's
    question is its key (``q.field``) in the :data:`~fovea_book.eval.documents.FORM_WORDINGS`
    templates."""
    if not doc.questions:
        raise ValueError(f"make_sample: page {doc.doc_id} has no question to train on")
    g = gist_of(doc, budget)
    ys, xs = g.pixel_centres()
    from fovea_book.eval.wordings import wording_key

    queries: list[tuple[str, str] | None] = [(wording_key(q.field, layout), _slot(q, layout))
                                             for q in doc.questions]
    boxes = [np.asarray(q.boxes, np.float64).reshape(-1, 4) for q in doc.questions]
    sizes = [float(np.log2(answer_text_px(q) / g.pixel)) for q in doc.questions]
    if null:
        queries.append(None)
        boxes.append(np.concatenate(boxes))
        sizes.append(float(np.mean(sizes)))
    fields = [FORM_FIELD if layout == "funsd" else q.field for q in doc.questions]
    return Sample(gist_features(g)[0].half(), ys, xs, g.pixel / 2, g.inside(), queries, boxes,
                  sizes, layout, budget, dict(doc_id=doc.doc_id, size=doc.size,
                                              fields=fields + ([""] if null else [])))


def _slot(q: Question, layout: str) -> str:
    """The template slot of a question: a form's key (``{key}``), the table item an
    ``amount`` question names (``{item}``, from its default wording), else ``""``."""
    if layout == "funsd":
        return q.field
    if q.field != "amount":
        return ""
    return q.question.removeprefix("What is the amount for ").rstrip("?")


# ----------------------------------------------------------------------------- photo pages
#: salt of a training page's photo-augmentation stream (:func:`_page_rng`; 17 draws the
#: null flag, ``TRAIN_SEED % 9973`` the layout and gist budgets)
PHOTO_SALT = 29
#: a photo-like training page keeps at least ``PHOTO_MIN_CELLS x`` the largest gist budget
#: in level-0 16-px cells: the gist needs ``budget`` cells (:func:`~fovea_core.allocators.
#: grid.resize_grid` refuses fewer); twice that keeps the gist a downsampling of the page
PHOTO_MIN_CELLS = 2
#: salt of the draws of :func:`part_page` (and whether a page is shown in part)
PART_SALT = 31
#: the band of rows :func:`part_page` shows, as shares of the page's height
PART: tuple[float, float] = (0.35, 0.7)


@dataclass(frozen=True)
class PhotoRanges:
    """What :func:`photo_page` draws from (uniform unless said), each range and why. The
    target is a phone photograph of a receipt or form, unlike the flatbed scans and clean
    renders trained on: fewer pixels, a tilted and slightly keystoned page on a background,
    defocus, light falling off across the page, a camera's tone curve and JPEG.

    Attributes:
        scale: factor of the page's long side, log-uniform (each octave equally likely):
            down to a quarter (a 1,700-px SROIE scan becomes ~430 px, a small photo), never
            up; never below ``min_cells`` of :func:`photo_page`.
        crop: each side of the page is cut by up to this share of its margin outside the
            union of the answer boxes (a photo framed tighter than the scan; every answer
            stays whole).
        rotate_deg: in-plane rotation in ``[-r, r]`` degrees (a hand-held camera is rarely
            square to the page; a few degrees keep lines readable).
        perspective: each page corner moves by up to this share of the page's width (x) and
            height (y): a mild keystone, the camera a little off the page's normal.
        margin: background added beyond the warped page on each side, up to this share of
            the page's side (the table around the receipt).
        background: grey level of the background (0-255; a dark table to a white sheet).
        blur_sigma: Gaussian blur in output pixels (0: sharp; 1.2: soft defocus at the low
            resolution).
        gradient: amplitude ``a`` of a linear light ramp ``1 + a t``, ``t`` in ``[-1, 1]``
            along a random direction (light from one side).
        vignette: depth ``v`` of a radial fall-off ``1 - v r^2`` (``r`` 0 at a random centre
            near the middle, 1 at the farthest corner); with the ramp the light stays in
            ``[(1 - a)(1 - v), 1 + a]``, at least ~0.5.
        gamma: tone-curve exponent, log-uniform (below 1 lifts mid-tones, above 1 darkens).
        black: the level ink is lifted to (photos rarely have pure black).
        white: the level white paper comes out at (photos rarely have pure white).
        jpeg: JPEG quality, an integer in the closed range (a phone's or a messenger's
            re-encoding).
    """

    scale: tuple[float, float] = (0.25, 1.0)
    crop: float = 0.35
    rotate_deg: float = 4.0
    perspective: float = 0.04
    margin: float = 0.06
    background: tuple[float, float] = (60.0, 230.0)
    blur_sigma: tuple[float, float] = (0.0, 1.2)
    gradient: float = 0.25
    vignette: float = 0.3
    gamma: tuple[float, float] = (0.7, 1.5)
    black: tuple[float, float] = (0.0, 50.0)
    white: tuple[float, float] = (180.0, 255.0)
    jpeg: tuple[int, int] = (25, 90)


#: the ranges training uses (:attr:`TrainConfig.photo`)
PHOTO = PhotoRanges()


def _homography_scale(hm: np.ndarray, pts: np.ndarray) -> np.ndarray:
    """``sqrt |det J|`` of the homography ``hm`` at the points ``pts [K, 2]``: how much it
    scales lengths there (text height maps by it)."""
    p = np.concatenate([pts, np.ones((len(pts), 1))], 1) @ hm.T            # [K, 3]
    w = p[:, 2:]
    xy = p[:, :2] / w
    jac = (hm[None, :2, :2] - xy[:, :, None] * hm[None, 2:, :2]) / w[:, :, None]  # [K, 2, 2]
    return np.sqrt(np.abs(np.linalg.det(jac)))


def _warp_points(hm: np.ndarray, pts: np.ndarray) -> np.ndarray:
    """Points ``[..., 2]`` mapped through the homography ``hm`` ``[3, 3]``."""
    p = np.concatenate([pts, np.ones(pts.shape[:-1] + (1,))], -1) @ hm.T
    return p[..., :2] / p[..., 2:]


def photo_page(doc: Document, rng: np.random.Generator, *, min_cells: int = 192,
               ranges: PhotoRanges = PHOTO, patch: int = 16) -> Document:
    """A photo-like copy of ``doc`` with its answer boxes moved with the pixels.

    In order (each draw from ``rng`` in a fixed order, so the result is a pure function of
    the page and the generator's state; :class:`PhotoRanges` gives the ranges and why):

    1. crop: each side cut into its margin outside the union of every answer box;
    2. scale-down (``cv2.INTER_AREA``) of the long side by a log-uniform factor, but never
       to fewer than ``min_cells`` level-0 ``patch``-px cells (what the gist needs) and
       never up;
    3. one homography: a rotation about the centre and a keystone (each corner moved), the
       output canvas the warped page's bounding box plus a background margin
       (``cv2.warpPerspective``, bilinear, a constant background tone);
    4. Gaussian blur; 5. a smooth multiplicative light field (a linear ramp times a radial
       fall-off); 6. a tone curve (gamma, then black and white levels); 7. JPEG
       re-encoding (``cv2.imencode``).

    Boxes (``x0, y0, x1, y1``, exclusive ends, page pixels) go through the crop, the scale
    and the homography; a new box is the bounding box of the four mapped corners, clipped
    to the image and rounded outwards. Each answer's ``size_px`` becomes its text height
    (:func:`answer_text_px`: the font size, or a scan's median line height) times the
    local scale of steps 2-3 at its centre (a float: a rotated line's bounding box is
    taller than its text, so the height is not re-measured from the new boxes). Pages
    whose three channels are equal stay grey (one channel warped and encoded). Elements
    (synthetic layout boxes) are dropped: they are not moved. Returns a new
    :class:`Document` with the same ``doc_id`` and an ``[H', W', 3]`` uint8 image.
    """
    import cv2

    if not doc.questions:
        raise ValueError(f"photo_page: page {doc.doc_id} has no answer box to keep")
    r = ranges
    # every draw first, in a fixed order (the same stream whatever the page's size)
    crop_u = rng.uniform(0.0, r.crop, 4)
    log_s = rng.uniform(np.log(r.scale[0]), np.log(r.scale[1]))
    theta = np.deg2rad(rng.uniform(-r.rotate_deg, r.rotate_deg))
    jitter = rng.uniform(-r.perspective, r.perspective, (4, 2))
    margin_u = rng.uniform(0.0, r.margin, 4)
    bg = float(rng.uniform(*r.background))
    sigma = float(rng.uniform(*r.blur_sigma))
    phi, amp = rng.uniform(0.0, 2 * np.pi), rng.uniform(0.0, r.gradient)
    vig, centre = rng.uniform(0.0, r.vignette), rng.uniform(-0.5, 0.5, 2)
    gamma = float(np.exp(rng.uniform(np.log(r.gamma[0]), np.log(r.gamma[1]))))
    black, white = float(rng.uniform(*r.black)), float(rng.uniform(*r.white))
    quality = int(rng.integers(r.jpeg[0], r.jpeg[1] + 1))

    img = doc.image
    h, w = img.shape[:2]
    grey = bool((img[..., :1] == img).all())
    page = img[..., 0] if grey else img
    counts = [len(q.boxes) for q in doc.questions]
    boxes = np.concatenate([np.asarray(q.boxes, np.float64).reshape(-1, 4)
                            for q in doc.questions])
    boxes = np.clip(boxes, 0, [w, h, w, h])                                  # [K, 4]
    # 1. crop, keeping the union of the answers
    u0, u1 = boxes[:, :2].min(0), boxes[:, 2:].max(0)
    slack = np.concatenate([u0, np.array([w, h]) - u1])
    cut = crop_u * slack
    x0, y0 = int(np.floor(cut[0])), int(np.floor(cut[1]))
    x1, y1 = int(np.ceil(w - cut[2])), int(np.ceil(h - cut[3]))
    page = page[y0:y1, x0:x1]
    ch, cw = y1 - y0, x1 - x0
    # 2. scale down (never below min_cells, with room for the keystone's shrink)
    s_min = np.sqrt(min_cells * patch ** 2 / (ch * cw)) * (1 + 2 * r.perspective)
    s = float(min(1.0, max(np.exp(log_s), s_min)))
    h1, w1 = max(1, round(ch * s)), max(1, round(cw * s))
    if (h1, w1) != (ch, cw):
        page = cv2.resize(page, (w1, h1), interpolation=cv2.INTER_AREA)
    pre = np.array([[w1 / cw, 0, -x0 * w1 / cw], [0, h1 / ch, -y0 * h1 / ch], [0, 0, 1]])
    # 3. rotation + keystone + margin: one homography on edge coordinates
    src = np.array([[0, 0], [w1, 0], [w1, h1], [0, h1]], np.float64)
    c = np.array([w1, h1]) / 2
    rot = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    dst = (src - c) @ rot.T + c + jitter * [w1, h1]
    lo = dst.min(0) - margin_u[:2] * [w1, h1]
    hi = dst.max(0) + margin_u[2:] * [w1, h1]
    dst -= lo
    w2, h2 = (int(v) for v in np.ceil(hi - lo))
    hm = cv2.getPerspectiveTransform(src.astype(np.float32), dst.astype(np.float32))
    half = np.array([[1, 0, 0.5], [0, 1, 0.5], [0, 0, 1]])                 # index -> edge
    hm_px = np.linalg.inv(half) @ hm @ half                                 # cv2: pixel index
    fill = (bg,) if grey else (bg, bg, bg)
    page = cv2.warpPerspective(page, hm_px, (w2, h2), flags=cv2.INTER_LINEAR,
                               borderMode=cv2.BORDER_CONSTANT, borderValue=fill)
    # the boxes: four corners each through crop + scale + homography, then their bbox
    full = hm @ pre
    corners = boxes[:, [[0, 1], [2, 1], [2, 3], [0, 3]]]                    # [K, 4, 2]
    moved = _warp_points(full, corners)
    nb = np.concatenate([moved.min(1), moved.max(1)], 1)
    nb = np.clip(nb, 0, [w2, h2, w2, h2])
    nb = np.concatenate([np.floor(nb[:, :2]), np.ceil(nb[:, 2:])], 1).astype(int)
    # 4. blur, 5. light, 6. tone curve
    if sigma > 0.3:
        page = cv2.GaussianBlur(page, (0, 0), sigma)
    yy = ((np.arange(h2, dtype=np.float32) + 0.5) / h2 * 2 - 1)[:, None]    # [-1, 1]
    xx = ((np.arange(w2, dtype=np.float32) + 0.5) / w2 * 2 - 1)[None, :]
    ramp = (np.cos(phi) * xx + np.sin(phi) * yy) / np.sqrt(2)
    r2 = (xx - centre[0]) ** 2 + (yy - centre[1]) ** 2
    r2 = r2 / max(float(r2.max()), 1e-6)
    light = ((1 + amp * ramp) * (1 - vig * r2)).astype(np.float32)          # [h2, w2]
    x = page.astype(np.float32) / 255.0 * (light if grey else light[..., None])
    x = black + (white - black) * np.clip(x, 0.0, 1.0) ** gamma
    page = np.clip(np.rint(x), 0, 255).astype(np.uint8)
    # 7. JPEG
    enc = page if grey else cv2.cvtColor(page, cv2.COLOR_RGB2BGR)
    ok, buf = cv2.imencode(".jpg", enc, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise RuntimeError(f"photo_page: JPEG encoding of {doc.doc_id} failed")
    if grey:
        dec = cv2.imdecode(buf, cv2.IMREAD_GRAYSCALE)
        image = np.repeat(dec[..., None], 3, axis=2)
    else:
        image = cv2.cvtColor(cv2.imdecode(buf, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    # the questions, their boxes and text heights moved
    splits = np.cumsum(counts)[:-1]
    per_q = np.split(nb, splits)
    centres = np.stack([(np.asarray(q.boxes, np.float64).reshape(-1, 4)[:, :2].min(0)
                         + np.asarray(q.boxes, np.float64).reshape(-1, 4)[:, 2:].max(0)) / 2
                        for q in doc.questions])
    scale_at = _homography_scale(full, centres)
    questions = tuple(
        replace(q, boxes=tuple(tuple(int(v) for v in b) for b in qb),
                size_px=float(answer_text_px(q) * k))   # a float height (see above)
        for q, qb, k in zip(doc.questions, per_q, scale_at, strict=True))
    return replace(doc, image=np.ascontiguousarray(image), questions=questions, elements=())


# ----------------------------------------------------------------------------- real pages
def merge_repeated(questions: tuple[Question, ...] | list[Question]
                   ) -> tuple[tuple[Question, ...], int]:
    """``(questions, merged)``: the questions of one page with every group that shares a
    ``field`` (a form's key: the same question text) replaced by one question whose boxes
    are all of the group's boxes and whose answers are all of its answers
    (:data:`REPEATED_RULE`: the union is the target, since the text alone cannot say which
    of them is meant); ``merged`` counts the questions that were in such groups. Order: by
    first occurrence."""
    groups: dict[str, list[Question]] = {}
    for q in questions:                                   # a page's questions
        groups.setdefault(q.field, []).append(q)
    out, merged = [], 0
    for field_, qs in groups.items():
        if len(qs) == 1:
            out.append(qs[0])
            continue
        merged += len(qs)
        out.append(replace(qs[0], qid="+".join(q.qid for q in qs),
                           answers=tuple(dict.fromkeys(a for q in qs for a in q.answers)),
                           boxes=tuple(b for q in qs for b in q.boxes)))
    return tuple(out), merged


@dataclass(frozen=True)
class RealPage:
    """A page of a real training folder: where it is and its (merged) questions. The image
    is read again on use (:meth:`RealPage.document`), so that a run holds only the gists."""

    source: str                           # dataset name, e.g. "funsd-train"
    layout: str                           # REAL_SOURCES[source]
    root: str                             # the dataset's folder
    stem: str                             # file name without extension
    doc_id: str
    questions: tuple[Question, ...]       # after merge_repeated
    repeated: int                         # questions merged into a union

    def document(self) -> Document:
        """The page as loaded by its dataset's loader, with the merged questions."""
        if self.layout == "sroie":
            from fovea_book.eval.sroie import load_receipt

            doc = load_receipt(self.root, self.stem)
        else:
            from fovea_book.eval.funsd import load_form

            doc = load_form(self.root, self.stem, skipped=[])
        return replace(doc, questions=self.questions)


@functools.lru_cache(maxsize=4)
def _scan(name: str, root: str) -> tuple[RealPage, ...]:
    """Every page of the real folder ``name`` at ``root``, read once with the dataset's own
    loader (:func:`~fovea_book.eval.sroie.load_sroie`, :func:`~fovea_book.eval.funsd.
    load_funsd`; default wording), keeping only its questions (merged by
    :func:`merge_repeated`), sorted by id. Cached per folder."""
    layout = REAL_SOURCES[name]
    if layout == "sroie":
        from fovea_book.eval.sroie import load_sroie

        docs = load_sroie(root)
    else:
        from fovea_book.eval.funsd import load_funsd

        docs = load_funsd(root)
    pages = []
    for doc in docs:                                      # ~100 pages
        qs, merged = merge_repeated(doc.questions)
        pages.append(RealPage(name, layout, root, doc.doc_id.removeprefix(layout), doc.doc_id,
                              qs, merged))
    return tuple(sorted(pages, key=lambda p: p.doc_id))


def real_pages(real: tuple[str, ...], limit: int | None, valid_mod: int,
               data_dir: str | None = None, allow_missing: bool = False,
               only_ids: Mapping[str, Sequence[str]] | None = None
               ) -> tuple[tuple[RealPage, ...], tuple[RealPage, ...], dict]:
    """``(train pages, validation pages, report)`` of the real folders ``real`` (names of
    :data:`REAL_SOURCES`) under ``data_dir`` (default: :func:`~fovea_book.paths.data_dir`).

    Each folder is read once (:func:`_scan`). A page is a validation page when
    ``crc32(doc_id) % valid_mod == 0``, else a training page (the first ``limit`` of them by
    id when ``limit`` is set); pages without a question are left out. ``report[name]``
    names every page id and counts what each folder gives. A missing folder raises
    :class:`~fovea_book.paths.DatasetNotFound` saying where it was looked for, or with
    ``allow_missing`` is recorded (``report[name]["missing"]``) and skipped. ``only_ids``
    (``{folder: page ids}``): use only those pages of a folder, e.g. a record's training and
    validation ids, to reproduce its run after more pages arrived in the folder."""
    if valid_mod < 2:
        raise ValueError(f"real_valid_mod must be at least 2 (1 would hold out every page), "
                         f"got {valid_mod}")
    if limit is not None and limit < 0:
        raise ValueError(f"real_pages must be None or >= 0, got {limit}")
    train_p: list[RealPage] = []
    valid_p: list[RealPage] = []
    report: dict = {}
    for name in real:                                     # two folders
        if name not in REAL_SOURCES:
            raise ValueError(f"real: unknown training folder {name!r}; accepted: "
                             f"{sorted(REAL_SOURCES)} (never a *-dev folder)")
        try:
            root = dataset_path(name, data_dir)
        except DatasetNotFound as exc:
            if not allow_missing:
                raise DatasetNotFound(
                    f"the localiser trains on the real pages of {name!r} but: {exc} Or pass "
                    "--allow-missing-real to train without it (the record says so).") from None
            report[name] = dict(missing=str(exc), pages=0, questions=0)
            continue
        pages = _scan(name, str(root))
        empty = sorted(p.doc_id for p in pages if not p.questions)
        pages = sorted((p for p in pages if p.questions), key=lambda p: p.doc_id)
        if only_ids is not None and name in only_ids:
            keep = set(only_ids[name])
            pages = [p for p in pages if p.doc_id in keep]
        held = [p for p in pages if zlib.crc32(p.doc_id.encode()) % valid_mod == 0]
        fit = [p for p in pages if zlib.crc32(p.doc_id.encode()) % valid_mod != 0]
        used = fit if limit is None else fit[:limit]
        train_p += used
        valid_p += held
        report[name] = dict(
            path=str(root), layout=REAL_SOURCES[name], pages=len(used),
            questions=sum(len(p.questions) for p in used),
            repeated_questions=dict(rule=REPEATED_RULE, merged=sum(p.repeated for p in used),
                                    into=sum(len({q.field for q in p.questions if "+" in q.qid})
                                             for p in used)),
            page_ids=[p.doc_id for p in used],
            validation_rule=f"crc32(doc_id) % {valid_mod} == 0",
            validation_ids=[p.doc_id for p in held],
            validation_questions=sum(len(p.questions) for p in held),
            unused_ids=[p.doc_id for p in fit[len(used):]], no_question_ids=empty)
    return tuple(train_p), tuple(valid_p), report


class TrainingSet:
    """The training pages: index ``i < cfg.pages`` is synthetic page ``i``
    (:func:`page_spec`), index ``cfg.pages + k`` real page ``k`` (:func:`real_pages`).
    Every page's layout, gist budgets and null flag are pure functions of ``(cfg.seed, i)``
    (and of the real pages' sorted ids)."""

    def __init__(self, cfg: TrainConfig, *, data_dir: str | Path | None = None,
                 allow_missing: bool = False,
                 only_ids: Mapping[str, Sequence[str]] | None = None):
        self.cfg = cfg
        self.real, self.valid, self.report = real_pages(
            tuple(cfg.real), cfg.real_pages, cfg.real_valid_mod,
            None if data_dir is None else str(data_dir), allow_missing, only_ids)
        self.specs = [self._spec(i) for i in range(len(self))]

    def __len__(self) -> int:
        return self.cfg.pages + len(self.real)

    def _spec(self, index: int) -> tuple[str, list[int]]:
        if index < self.cfg.pages:
            layout, _, budgets = page_spec(self.cfg, index)
            return layout, budgets
        rng = _page_rng(self.cfg, index, TRAIN_SEED % 9973)
        k = min(self.cfg.gists_per_page, len(self.cfg.gists))
        return self.real[index - self.cfg.pages].layout, \
            [int(b) for b in rng.choice(self.cfg.gists, size=k, replace=False)]

    def spec(self, index: int) -> tuple[str, list[int]]:
        """``(layout, gist budgets)`` of page ``index``."""
        return self.specs[index]

    def samples(self, index: int) -> list[Sample]:
        """The samples of page ``index`` (one per gist budget; with ``cfg.photo`` all of
        them from one photo-like copy of the page, :func:`photo_training_page`)."""
        if index < self.cfg.pages:
            return training_samples(self.cfg, index)
        page = self.real[index - self.cfg.pages]
        null = _page_rng(self.cfg, index, 17).random() < self.cfg.null_share
        doc = photo_training_page(self.cfg, index, page.document())
        return [make_sample(doc, b, null=null, layout=page.layout)
                for b in self.spec(index)[1]]

    def form_keys(self) -> list[str]:
        """The form keys the training pages ask about (``{key}`` of the form wordings)."""
        return sorted({q.field for p in self.real if p.layout == "funsd" for q in p.questions})

    def source(self, index: int) -> str:
        """``"synthetic"`` or the real folder's name of page ``index``."""
        return "synthetic" if index < self.cfg.pages else self.real[index - self.cfg.pages].source

    def contributions(self, cache: dict[int, list[Sample]]) -> dict:
        """What each source gave to a run whose generated pages are ``cache``: pages,
        questions (answers asked; ``null_questions``: the question-agnostic extras), pages
        per layout, and for the real folders the page ids and the rest of
        :func:`real_pages`' report."""
        out: dict = {}
        for name in ["synthetic", *self.report]:
            idx = [i for i in sorted(cache) if self.source(i) == name]
            null = sum(cache[i][0].queries[-1] is None for i in idx)
            layouts: dict[str, int] = {}
            for i in idx:                                 # a few hundred pages
                layouts[cache[i][0].layout] = layouts.get(cache[i][0].layout, 0) + 1
            out[name] = dict(self.report.get(name, {}), pages=len(idx), layouts=layouts,
                             questions=sum(len(cache[i][0].queries) for i in idx) - null,
                             null_questions=null)
        n = self.cfg.pages
        out["synthetic"]["seeds"] = [page_spec(self.cfg, 0)[1], page_spec(self.cfg, n - 1)[1]] \
            if n else []
        return out


def training_samples(cfg: TrainConfig, index: int) -> list[Sample]:
    """The samples of synthetic training page ``index`` (one per gist budget; a pure
    function of ``cfg.seed`` and ``index``)."""
    layout, seed, budgets = page_spec(cfg, index)
    null = _page_rng(cfg, index, 17).random() < cfg.null_share
    doc = make_document(seed, layout=layout)              # questions re-phrased per step
    doc = photo_training_page(cfg, index, doc)
    return [make_sample(doc, b, null=null, layout=layout) for b in budgets]


def photo_training_page(cfg: TrainConfig, index: int, doc: Document) -> Document:
    """Training page ``index`` as trained on: ``doc`` itself; with ``cfg.part`` a share of
    the pages shown in part (:func:`part_page`, drawn from ``(cfg.seed, index)`` alone); then
    with ``cfg.photo`` its photo-like copy (:func:`photo_page`, likewise)."""
    if cfg.part > 0:
        rng = _page_rng(cfg, index, PART_SALT)
        if rng.random() < cfg.part:
            doc = part_page(doc, rng, min_cells=PHOTO_MIN_CELLS * max(cfg.gists))
    if not cfg.photo:
        return doc
    return photo_page(doc, _page_rng(cfg, index, PHOTO_SALT),
                      min_cells=PHOTO_MIN_CELLS * max(cfg.gists))


def part_page(doc: Document, rng: np.random.Generator, *, heights: tuple[float, float] = PART,
              min_cells: int = 192, patch: int = 16) -> Document:
    """A band of the page's rows (:func:`~fovea_book.eval.photo.page_rows`): a height drawn
    uniformly from ``heights`` (shares of the page's height) at a uniform place, keeping the
    questions whose answers lie inside. ``doc`` itself when no question's answer would be
    inside or the band would hold fewer than ``min_cells`` level-0 cells (too small for the
    gist). The text keeps its pixel height (``size_px`` unchanged) while the frame shrinks:
    what a photograph of a short receipt, or of part of a long one, shows."""
    from fovea_book.eval.photo import page_rows

    h, w = doc.size
    band = max(1, int(round(h * rng.uniform(*heights))))
    y0 = int(rng.integers(0, h - band + 1))
    part = page_rows(doc, y0, y0 + band, tag=f"rows{y0}-{y0 + band}")
    cells = math.ceil(band / patch) * math.ceil(w / patch)
    return part if part.questions and cells >= min_cells else doc


def epoch_batches(cfg: TrainConfig, gen: torch.Generator, data: TrainingSet
                  ) -> list[list[tuple[int, int]]]:
    """One epoch's batches of ``(page, gist)`` sample ids over every page of ``data``: a
    random order, cut into groups of ``8 * batch`` samples, each group sorted by the page's
    seed-determined shape class (layout, gist budget) so that a batch pads little, then cut
    into batches; the batch order is shuffled again."""
    ids = [(i, j) for i in range(len(data)) for j in range(cfg.gists_per_page)]
    perm = torch.randperm(len(ids), generator=gen).tolist()
    ids = [ids[k] for k in perm]
    group = 8 * cfg.batch
    batches = []
    for g0 in range(0, len(ids), group):                    # sort within a group
        chunk = sorted(ids[g0:g0 + group], key=lambda t: (data.spec(t[0])[0],
                                                          data.spec(t[0])[1][t[1]]))
        batches += [chunk[k:k + cfg.batch] for k in range(0, len(chunk), cfg.batch)]
    order = torch.randperm(len(batches), generator=gen).tolist()
    return [batches[k] for k in order]


def _pool(field_: str, wording: str) -> tuple[str, ...]:
    """The templates of a wording key: :data:`~fovea_book.eval.documents.FORM_WORDINGS` for
    a form's question, else :data:`~fovea_book.eval.documents.WORDINGS`."""
    from fovea_book.eval.documents import FORM_WORDINGS, WORDINGS

    return FORM_WORDINGS[wording] if field_ == FORM_FIELD else WORDINGS[wording][field_]


def _fill(template: str, field_: str, slot: str) -> str:
    return template.format(key=slot) if field_ == FORM_FIELD else template.format(item=slot)


def phrase_embedding(key: tuple[str, str] | None, emb: dict, wording: str,
                     gen: torch.Generator | None) -> torch.Tensor:
    """The embedding of a question ``(wording key, slot)`` (slot: a table item, or a form's
    key for :data:`~fovea_book.eval.documents.FORM_FIELD`): with ``gen`` (training), a random
    mix ``lam e_i + (1 - lam) e_j`` of two random templates of the field plus Gaussian noise,
    renormalised (the network must not learn a handful of exact sentence vectors); without,
    the field's first template. ``None``: the empty question."""
    if key is None:
        return emb[""]
    field_, slot = key[:2]
    pool = [_fill(t, field_, slot) for t in _pool(field_, wording)]
    if gen is None:
        return emb[pool[key[2] % len(pool)] if len(key) > 2 else pool[0]]
    i, j = torch.randint(len(pool), (2,), generator=gen).tolist()
    lam = float(torch.rand((), generator=gen))
    return jitter_embedding(lam * emb[pool[i]] + (1 - lam) * emb[pool[j]], gen)


def collate(samples: list[Sample], emb: dict, *, augment: torch.Generator | None = None,
            wording: str = "train"):
    """Pad a list of pages to one batch (:func:`~fovea_core.cascade.learned.collate_pages`:
    ``x [B, 7, H, W]``, ``mask [B, H, W]``, ``q [Q, 384]``, ``page [Q]``, ``target [Q, H,
    W]``, ``size [Q]``). Questions are phrased from the ``wording`` pool
    (:func:`phrase_embedding`). With ``augment`` (a generator), the phrasing is random, and
    the ink channel is augmented (:func:`~fovea_core.cascade.learned.augment_ink`), in that
    order of draws."""
    qs = [phrase_embedding(q, emb, wording, augment) for s in samples for q in s.queries]
    return collate_pages(samples, torch.stack(qs), augment=augment)


def _rotate(s: Sample, wording: str, k: int) -> Sample:
    """``s`` whose questions use template ``k`` of their pool (as the first template, which
    :func:`phrase_embedding` takes without a generator)."""
    def rot(q):
        if q is None:
            return None
        return (q[0], q[1], k % len(_pool(q[0], wording)))
    return replace(s, queries=[rot(q) for q in s.queries])


def vocabulary(wording: str, form_keys: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Every question a training page can ask in ``wording`` (each template of every field,
    ``{item}`` filled with every table item; each form template with ``{key}`` filled with
    every key of ``form_keys``) and ``""`` (no question), sorted. Embedded once
    (:func:`embed_vocabulary`), so the embeddings do not depend on the order pages are
    generated in."""
    from fovea_book.eval.documents import _ITEMS, FORM_WORDINGS, WORDINGS

    out = {""}
    for pool in WORDINGS[wording].values():
        for t in pool:
            out.update(t.format(item=i) for i in _ITEMS) if "{item}" in t else out.add(t)
    out.update(t.format(key=k) for t in FORM_WORDINGS[wording] for k in form_keys)
    return sorted(out)


#: strings embedded per call of :func:`embed_vocabulary` (below the embedding cache's size)
EMBED_CHUNK = 2048


def embed_vocabulary(vocab: list[str]) -> dict[str, torch.Tensor]:
    """``{text: [384] MiniLM embedding}`` of a sorted vocabulary, embedded in fixed chunks of
    :data:`EMBED_CHUNK`, each chunk encoded whole by the encoder itself: the same numbers
    for the same vocabulary whatever this process embedded before (the string cache of
    :func:`~fovea_core.importance.query.embed` would encode only the strings it lacks, in
    other batches, which moves an embedding by ~1e-7 and a trained run with it).
    Memoised per vocabulary (:data:`EMBED_MEMO` vocabularies)."""
    key = tuple(vocab)
    if key in _EMBEDDED:
        return dict(_EMBEDDED[key])
    from fovea_core.importance.query import text_encoder

    out: dict[str, torch.Tensor] = {}
    for k in range(0, len(vocab), EMBED_CHUNK):              # a few chunks
        part = [t if t else "" for t in vocab[k:k + EMBED_CHUNK]]
        vecs = np.asarray(text_encoder().encode(part, normalize_embeddings=True,
                                                convert_to_numpy=True, show_progress_bar=False),
                          dtype=np.float32)
        out.update(zip(part, torch.from_numpy(vecs.copy())))
    _EMBEDDED[key] = out
    while len(_EMBEDDED) > EMBED_MEMO:
        _EMBEDDED.pop(next(iter(_EMBEDDED)))
    return dict(out)


#: vocabularies :func:`embed_vocabulary` keeps (a training and a few validation wordings)
EMBED_MEMO = 8
_EMBEDDED: dict[tuple[str, ...], dict[str, torch.Tensor]] = {}


def record_ids(record: Mapping) -> dict[str, list[str]]:
    """``{real folder: training and validation page ids}`` of a training record (the JSON
    beside the weights): the pages its run used, for :func:`train`'s ``only_ids``."""
    return {name: list(src.get("page_ids", [])) + list(src.get("validation_ids", []))
            for name, src in record["train"]["sources"].items() if name in REAL_SOURCES}


def train(cfg: TrainConfig = TrainConfig(), *, max_steps: int | None = None,
          progress: bool = True, threads: int | None = 1, data_dir: str | Path | None = None,
          allow_missing: bool = False, only_ids: Mapping[str, Sequence[str]] | None = None
          ) -> tuple[GistLocaliserNet, dict]:
    """Train on ``cfg`` (deterministic). Returns ``(net, record)`` with the loss of every
    step in ``record["loss"]`` and what each source gave in ``record["sources"]``.
    ``max_steps`` stops early (the test re-runs the first steps of the committed run); only
    the pages those steps need are generated. ``data_dir`` and ``allow_missing``: where the
    real folders are and whether a missing one may be left out; ``only_ids``: the real pages
    to use (:func:`real_pages`; :func:`record_ids` gives a record's). ``threads``: torch's
    and OpenCV's threads (1: deterministic, and one core on a shared machine).

    The run lasts ``cfg.epochs`` epochs (an epoch: every page's samples once,
    :func:`epoch_batches`), or with ``cfg.steps`` exactly that many steps (as many epochs
    as they need, the last one cut short), so that runs on more or fewer pages can take the
    same number of steps; the cosine schedule spans the run either way."""
    if cfg.steps is not None and cfg.steps < 1:
        raise ValueError(f"steps must be None or at least 1, got {cfg.steps}")
    if threads:
        import cv2

        torch.set_num_threads(threads)
        cv2.setNumThreads(threads)
    data = TrainingSet(cfg, data_dir=data_dir, allow_missing=allow_missing, only_ids=only_ids)
    torch.manual_seed(cfg.seed)
    net = GistLocaliserNet(width=cfg.width, maps=cfg.maps, position=cfg.position)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = len(epoch_batches(cfg, torch.Generator().manual_seed(cfg.seed), data))
    if steps_per_epoch == 0:
        raise ValueError("train: no training page (cfg.pages == 0 and no real page)")
    total = steps_per_epoch * cfg.epochs if cfg.steps is None else cfg.steps
    epochs = cfg.epochs if cfg.steps is None else math.ceil(cfg.steps / steps_per_epoch)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda k: 0.5 * (1 + math.cos(math.pi * min(k, total) / total)))
    gen = torch.Generator().manual_seed(cfg.seed)
    cache: dict[int, list[Sample]] = {}
    t0 = time.perf_counter()
    emb = embed_vocabulary(vocabulary(cfg.wording, data.form_keys()))
    embed_s = time.perf_counter() - t0
    losses: list[float] = []
    gen_s = 0.0
    step = 0
    for epoch in range(epochs):
        for ids in epoch_batches(cfg, gen, data):
            if step >= total or (max_steps is not None and step >= max_steps):
                break
            t1 = time.perf_counter()
            for i, _ in ids:                                # generate pages on first use
                if i not in cache:
                    cache[i] = data.samples(i)
            gen_s += time.perf_counter() - t1
            batch = collate([cache[i][j] for i, j in ids], emb, augment=gen, wording=cfg.wording)
            net.train()
            loss = batch_loss(net, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
            step += 1
        if progress:
            recent = np.mean(losses[-steps_per_epoch:]) if losses else float("nan")
            print(f"epoch {epoch + 1}/{epochs}: mean loss {recent:.4f} "
                  f"({time.perf_counter() - t0:.0f} s, {len(cache)} pages)", flush=True)
        if step >= total or (max_steps is not None and step >= max_steps):
            break
    net.eval()
    sources = data.contributions(cache)
    record = dict(loss=losses, steps=step, seconds=time.perf_counter() - t0,
                  **({} if cfg.steps is None else dict(steps_per_epoch=steps_per_epoch)),
                  data_seconds=gen_s, embed_seconds=embed_s, pages_generated=len(cache),
                  layouts={lay: n for src in sources.values()
                           for lay, n in src["layouts"].items()},
                  questions=sum(s["questions"] + s["null_questions"] for s in sources.values()),
                  vocabulary=len(emb), sources=sources)
    return net, record


#: layouts of the validation sets: synthetic (held-out seeds) and the real folders' held-out
#: pages (:func:`real_pages`)
VALID_LAYOUTS = ("paper", "receipt", "invoice", "sroie", "funsd")


def validation_samples(cfg: TrainConfig, layout: str, n: int | None = None, *,
                       data_dir: str | Path | None = None, allow_missing: bool = False,
                       photo: bool = False) -> list[Sample]:
    """Held-out pages of ``layout`` (:data:`VALID_LAYOUTS`): synthetic ones from seeds
    :data:`VALID_SEED` upwards, ``cfg.valid_pages`` of them (or ``n``); for ``"sroie"`` /
    ``"funsd"`` the pages of that real *training* folder held out by
    ``cfg.real_valid_mod`` (never trained on; empty if the folder is not in ``cfg.real`` or
    is missing under ``allow_missing``). Gist budget cycling through ``cfg.gists``.

    ``photo``: each page as a photo-like copy (:func:`photo_page`, drawn from
    :func:`valid_photo_rng`: the same copies whatever the run's seed or configuration), a
    stand-in for photographs that reads no ``*-dev`` page."""
    if layout not in VALID_LAYOUTS:
        raise ValueError(f"layout must be one of {VALID_LAYOUTS}, got {layout!r}")
    min_cells = PHOTO_MIN_CELLS * max(cfg.gists)

    def page(doc: Document, i: int) -> Document:
        return photo_page(doc, valid_photo_rng(layout, i), min_cells=min_cells) if photo \
            else doc

    if layout in ("sroie", "funsd"):
        _, valid, _ = real_pages(tuple(cfg.real), cfg.real_pages, cfg.real_valid_mod,
                                 None if data_dir is None else str(data_dir), allow_missing)
        pages = [p for p in valid if p.layout == layout][:n]
        return [make_sample(page(p.document(), i), cfg.gists[i % len(cfg.gists)], null=False,
                            layout=layout) for i, p in enumerate(pages)]
    n = cfg.valid_pages if n is None else n
    out = []
    for i in range(n):                                      # a few dozen pages
        doc = page(make_document(VALID_SEED + i, layout=layout), i)
        out.append(make_sample(doc, cfg.gists[i % len(cfg.gists)], null=False, layout=layout))
    return out


def valid_photo_rng(layout: str, index: int) -> np.random.Generator:
    """The generator of validation page ``index`` of ``layout``'s photo-like copy: a pure
    function of the two (never of a run's seed, so every run meets the same copies)."""
    return np.random.default_rng([VALID_SEED, zlib.crc32(layout.encode()), index, PHOTO_SALT])


def evaluate(net: GistLocaliserNet, samples: list[Sample], wording: str = "heldout") -> dict:
    """Validation metrics: cross-entropy, the probability mass on the answer
    (``hit_mass``), whether the arg-max output pixel lies on the answer (``top1``), and the
    text-size error in octaves (``size_rmse``: the size map averaged under the *predicted*
    location, as the cascade uses it). Each question is asked in every template of
    ``wording`` in turn (one template per page, cycling). ``fields``: ``questions``,
    ``hit_mass`` and ``top1`` per question field (a sample's ``meta["fields"]``, e.g. a
    receipt's ``company``, ``date``, ``address``, ``total``; every form question is
    :data:`~fovea_book.eval.documents.FORM_FIELD`)."""
    keys = sorted({q[1] for s in samples for q in s.queries if q and q[0] == FORM_FIELD})
    emb = embed_vocabulary(vocabulary(wording, keys))
    names = [f for s in samples
             for f in s.meta.get("fields", [q[0] if q else "" for q in s.queries])]
    ce, mass, top1, serr = [], [], [], []
    with torch.no_grad():
        for k in range(0, len(samples), 8):                 # batches of pages
            rot = [_rotate(s, wording, k + i) for i, s in enumerate(samples[k:k + 8])]
            batch = collate(rot, emb, wording=wording)
            ce.append(float(batch_loss(net, batch, parts=True)[1]) * batch[2].shape[0])
            x, mask, q, page, target, size = batch
            logit, smap = net(x, mask, q, page)
            p = torch.softmax(logit.flatten(1), 1)
            t = pool_target(target).flatten(1)
            mass += (p * (t > 0)).sum(1).tolist()
            top1 += (t.gather(1, p.argmax(1, keepdim=True))[:, 0] > 0).float().tolist()
            serr += ((p * smap[page].flatten(1)).sum(1) - size).tolist()
    n = len(mass)
    per: dict[str, dict] = {}
    for name in sorted(set(names)):                         # a handful of fields
        sel = [k for k, f in enumerate(names) if f == name]
        per[name] = dict(questions=len(sel), hit_mass=float(np.mean([mass[k] for k in sel])),
                         top1=float(np.mean([top1[k] for k in sel])))
    return dict(questions=n, cross_entropy=sum(ce) / max(n, 1), hit_mass=float(np.mean(mass)),
                top1=float(np.mean(top1)), size_rmse=float(np.sqrt(np.mean(np.square(serr)))),
                fields=per)


#: the validation numbers of a run's record: ``(layout, wording, photo)``; a key
#: ``"layout/wording"``, ``"layout+photo/wording"`` for the photo-like copies
#: (:func:`validation_samples`)
VALIDATIONS: tuple[tuple[str, str, bool], ...] = (
    ("paper", "heldout", False), ("receipt", "heldout", False), ("invoice", "heldout", False),
    ("sroie", "heldout", False), ("funsd", "heldout", False), ("paper", "train", False),
    ("receipt", "train", False), ("sroie", "train", False), ("funsd", "train", False),
    ("receipt", "heldout", True), ("sroie", "heldout", True), ("funsd", "heldout", True))


def validation_key(layout: str, wording: str, photo: bool) -> str:
    """The record's key of a validation set (:data:`VALIDATIONS`)."""
    return f"{layout}{'+photo' if photo else ''}/{wording}"


def validate(net: GistLocaliserNet, cfg: TrainConfig,
             which: Sequence[tuple[str, str, bool]] = VALIDATIONS, *,
             data_dir: str | Path | None = None, allow_missing: bool = False,
             sets: dict | None = None) -> dict[str, dict]:
    """:func:`evaluate` on each validation set of ``which`` (:data:`VALIDATIONS`), keyed by
    :func:`validation_key`; an empty set (a missing folder) is left out. ``sets``: a dict
    that keeps the generated samples per ``(layout, photo)`` between calls."""
    sets = {} if sets is None else sets
    out = {}
    for layout, wording, photo in which:                    # a dozen sets
        if (layout, photo) not in sets:
            sets[layout, photo] = validation_samples(cfg, layout, data_dir=data_dir,
                                                     allow_missing=allow_missing, photo=photo)
        if sets[layout, photo]:
            out[validation_key(layout, wording, photo)] = evaluate(net, sets[layout, photo],
                                                                   wording)
    return out


def default_output() -> Path:
    """Where a training run writes by default: ``_build/models/gist_localiser.pt`` (scratch,
    ignored by git), never the committed :func:`~fovea_core.cascade.learned.weights_path`."""
    return project_root() / "_build" / "models" / weights_path().name


def build_parser() -> argparse.ArgumentParser:
    """The command line. Every option that sets the configuration defaults to the committed
    run's value (:class:`TrainConfig`'s defaults; ``--threads`` to the record's 1)."""
    cfg = TrainConfig()
    parser = argparse.ArgumentParser(prog="python -m fovea_book.train",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write the weights (the JSON record goes beside them); "
                             f"default: {os.path.relpath(default_output(), project_root())}")
    parser.add_argument("--replace-committed", action="store_true",
                        help=f"write the committed weights {weights_path().name} and their "
                             "record under fovea_core/weights (the package's; their SHA-256 is pinned "
                             "in tests/test_cascade_train.py)")
    parser.add_argument("--pages", type=int, default=cfg.pages,
                        help="synthetic training pages, beside every real training page "
                             "(default: %(default)s, the committed run's)")
    parser.add_argument("--epochs", type=int, default=cfg.epochs,
                        help="epochs (default: %(default)s, the committed run's)")
    parser.add_argument("--seed", type=int, default=cfg.seed,
                        help="seed of pages, weights and batches (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default %(default)s: deterministic and fastest on "
                             "a shared machine; the committed run used 1)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="folder holding the real training folders "
                             f"{', '.join(REAL_SOURCES)} (default: $FOVEA_DATA, else "
                             "data/external)")
    parser.add_argument("--allow-missing-real", action="store_true",
                        help="train without a real training folder that is missing (default: "
                             "stop with a message); the record lists the missing folder")
    parser.add_argument("--part", type=float, default=cfg.part,
                        help="share of training pages shown in part: a band of 35-70 %% of the "
                             "page's rows, keeping the questions answered inside, so the text "
                             "is taller against the frame (default: %(default)s, the committed "
                             "run's)")
    parser.add_argument("--real", nargs="*", choices=sorted(REAL_SOURCES), default=cfg.real,
                        metavar="FOLDER",
                        help="the real training folders to train on, of "
                             f"{', '.join(REAL_SOURCES)} (default: all of them, the committed "
                             "run's); name fewer to leave a collection out (none: synthetic "
                             "pages only)")
    parser.add_argument("--photo", action=argparse.BooleanOptionalAction, default=cfg.photo,
                        help="train on photo-like copies of every page (photo_page: scale-down, "
                             "crop, rotation, keystone, blur, uneven light, tone curve, JPEG; "
                             "default: %(default)s, the committed run's)")
    parser.add_argument("--position", action=argparse.BooleanOptionalAction,
                        default=cfg.position,
                        help="let the network see where on the page each pixel lies (its "
                             "position and aspect channels; --no-position zeroes them, so no "
                             "layout prior can be learned; default: %(default)s, the "
                             "committed run's)")
    return parser


def output_path(args: argparse.Namespace) -> Path:
    """The weights file a run will write, checked before anything is trained: the committed
    file only with ``--replace-committed`` (which takes no other ``--out``). Raises
    ``ValueError`` naming the option otherwise."""
    for name in ("pages", "epochs", "threads"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be at least 1, got {getattr(args, name)}")
    committed = weights_path()
    if args.replace_committed:
        if args.out is not None and Path(args.out).resolve() != committed.resolve():
            raise ValueError(f"--replace-committed writes {committed}; drop --out "
                             f"({args.out}) or drop --replace-committed")
        return committed
    out = Path(args.out) if args.out is not None else default_output()
    if out.suffix != ".pt":
        raise ValueError(f"--out must name a .pt file (its record goes beside it as .json), "
                         f"got {out}")
    if out.resolve() == committed.resolve() or \
            out.with_suffix(".json").resolve() == committed.with_suffix(".json").resolve():
        raise ValueError(f"--out {out} is the committed weights (and their record); pass "
                         "--replace-committed to replace them on purpose")
    return out


def _versions() -> dict[str, str]:
    """Versions of what shapes the pages beside torch: numpy and OpenCV (JPEG, warps)."""
    import cv2

    return dict(numpy=np.__version__, opencv=cv2.__version__)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        out = output_path(args)
    except ValueError as exc:
        parser.error(str(exc))
    if not 0.0 <= args.part <= 1.0:
        parser.error(f"--part must be in [0, 1], got {args.part}")
    cfg = TrainConfig(seed=args.seed, pages=args.pages, epochs=args.epochs, photo=args.photo,
                      part=args.part, position=args.position,
                      real=tuple(r for r in REAL_SOURCES if r in args.real))
    where = "the COMMITTED weights " if out == weights_path() else ""
    print(f"training the gist localiser into {where}{out}: {cfg}", flush=True)
    try:
        net, rec = train(cfg, threads=args.threads, data_dir=args.data_dir,
                         allow_missing=args.allow_missing_real)
    except DatasetNotFound as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    valid = validate(net, cfg, data_dir=args.data_dir, allow_missing=args.allow_missing_real)
    out.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone().float() for k, v in net.state_dict().items()}
    torch.save(state, out)
    meta = dict(sha256=file_sha256(out), arch=dict(width=cfg.width, maps=cfg.maps, position=cfg.position),
                parameters=int(sum(v.numel() for v in state.values())),
                config=asdict(cfg), train=rec,
                data=dict(allow_missing_real=args.allow_missing_real,
                          missing=sorted(k for k, v in rec.get("sources", {}).items()
                                         if "missing" in v),
                          repeated_rule=REPEATED_RULE,
                          size_target="synthetic: font size; real: median line-box height",
                          validation=("synthetic: seeds from VALID_SEED; real: pages of the "
                                      "*-train folders with crc32(doc_id) % real_valid_mod == "
                                      "0, never trained on; no *-dev page; '+photo': the same "
                                      "pages as photo-like copies (photo_page, drawn from "
                                      "valid_photo_rng)"),
                          **({"photo": asdict(PHOTO)} if cfg.photo else {})),
                validation=valid, validation_seconds=time.perf_counter() - t0,
                environment=dict(torch=torch.__version__, python=platform.python_version(),
                                 machine=platform.machine(), threads=args.threads,
                                 **_versions()))
    out.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps({k: meta[k] for k in ("sha256", "parameters", "validation")}, indent=1))
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB) in "
          f"{rec['seconds']:.0f} s of training")
    if out == weights_path():
        print("replaced the committed weights: update COMMITTED_SHA256 in "
              "tests/test_cascade_train.py to the new hash above, and commit both")
    return 0


if __name__ == "__main__":
    sys.exit(main())
