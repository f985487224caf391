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
  scans give no font size; a synthetic answer's is its font size).

Validation (``validation`` in the record): held-out synthetic pages (seeds from
:data:`VALID_SEED`; ``paper``, ``receipt`` and the never-trained ``invoice`` layout) and the
held-out pages of the real training folders (``sroie``, ``funsd``), each in the held-out
and the training wordings. These are tuning numbers on pages the run never trained on, not
results: the book reports on the ``*-dev`` folders only.

Model and loss: :class:`~fovea_core.cascade.learned.GistLocaliserNet`, cross-entropy
between the softmax over the page's gist pixels and the answer boxes' area on them
(:func:`~fovea_core.cascade.learned.answer_targets`, the one definition), Adam with a
cosine learning-rate decay.

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

from fovea_core.cascade.core import Gist, gist
from fovea_core.cascade.learned import (GistLocaliserNet, answer_targets, file_sha256,
                                        gist_features, pool_target, question_embedding,
                                        weights_path)
from fovea_book.eval.documents import FORM_FIELD, Document, Question, make_document
from fovea_book.paths import DatasetNotFound, dataset_path, project_root
from fovea_core.pyramid import Pyramid, default_num_levels

__all__ = ["TRAIN_SEED", "VALID_SEED", "REAL_SOURCES", "REPEATED_RULE", "TrainConfig",
           "Sample", "RealPage", "TrainingSet", "make_sample", "answer_text_px",
           "merge_repeated", "real_pages", "training_samples", "train", "evaluate",
           "validation_samples", "vocabulary", "default_output", "build_parser", "output_path",
           "main"]

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
    return Sample(gist_features(g)[0].half(), ys, xs, g.pixel / 2, g.inside(), queries, boxes,
                  sizes, layout, budget, dict(doc_id=doc.doc_id, size=doc.size))


def _slot(q: Question, layout: str) -> str:
    """The template slot of a question: a form's key (``{key}``), the table item an
    ``amount`` question names (``{item}``, from its default wording), else ``""``."""
    if layout == "funsd":
        return q.field
    if q.field != "amount":
        return ""
    return q.question.removeprefix("What is the amount for ").rstrip("?")


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
        """The samples of page ``index`` (one per gist budget)."""
        if index < self.cfg.pages:
            return training_samples(self.cfg, index)
        page = self.real[index - self.cfg.pages]
        null = _page_rng(self.cfg, index, 17).random() < self.cfg.null_share
        doc = page.document()
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
    return [make_sample(doc, b, null=null, layout=layout) for b in budgets]


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


#: standard deviation of the Gaussian noise added to each embedding coordinate in training
EMBED_NOISE = 0.01


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
    v = lam * emb[pool[i]] + (1 - lam) * emb[pool[j]]
    v = v + EMBED_NOISE * torch.randn(v.shape, generator=gen)
    return v / v.norm().clamp(min=1e-6)


def collate(samples: list[Sample], emb: dict, *, augment: torch.Generator | None = None,
            wording: str = "train"):
    """Pad a list of pages to one batch: ``x [B, 7, H, W]``, ``mask [B, H, W]``,
    ``q [Q, 384]``, ``page [Q]``, ``target [Q, H, W]``, ``size [Q]`` (log2 text height in
    gist pixels). Questions are phrased from the ``wording`` pool
    (:func:`phrase_embedding`). With ``augment`` (a generator), the phrasing is random, and
    the ink channel is given a random gamma and gain and a little noise."""
    hmax = max(s.x.shape[1] for s in samples)
    wmax = max(s.x.shape[2] for s in samples)
    b = len(samples)
    x = torch.zeros(b, 7, hmax, wmax)
    mask = torch.zeros(b, hmax, wmax, dtype=torch.bool)
    tg, qs, page, size = [], [], [], []
    for i, s in enumerate(samples):                     # pages of one batch
        h, w = s.x.shape[1:]
        x[i, :, :h, :w] = s.x.float()
        mask[i, :h, :w] = s.inside
        t = answer_targets(s.ys, s.xs, s.half, s.inside, s.boxes)
        tg.append(torch.nn.functional.pad(t, (0, wmax - w, 0, hmax - h)))
        qs += [phrase_embedding(q, emb, wording, augment) for q in s.queries]
        page += [i] * len(s.queries)
        size += s.sizes
    if augment is not None:
        gamma = torch.exp(torch.randn(b, 1, 1, generator=augment) * 0.25)
        gain = torch.exp(torch.randn(b, 1, 1, generator=augment) * 0.15)
        noise = torch.randn(b, hmax, wmax, generator=augment) * 0.03
        ink = (x[:, 0].clamp(min=0) ** gamma * gain + noise).clamp(0, 1)
        x[:, 0] = ink * mask
    return x, mask, torch.stack(qs), torch.tensor(page), torch.cat(tg), torch.tensor(size)


#: weight of the text-size loss (squared error in octaves) beside the location loss
SIZE_WEIGHT = 0.5


def batch_loss(net: GistLocaliserNet, batch, *, parts: bool = False):
    """Mean cross-entropy ``-sum_pixels target * log_softmax(logits)`` over the questions,
    plus :data:`SIZE_WEIGHT` x the squared error (octaves) of the size map averaged over the
    answer's pixels. ``parts``: return ``(total, location, size)``."""
    x, mask, q, page, target, size = batch
    logit, smap = net(x, mask, q, page)
    logp = torch.log_softmax(logit.flatten(1), 1)
    t = pool_target(target).flatten(1)
    loc = -(t * torch.where(t > 0, logp, torch.zeros_like(logp))).sum(1).mean()
    pred = (t * smap[page].flatten(1)).sum(1)
    err = ((pred - size) ** 2).mean()
    total = loc + SIZE_WEIGHT * err
    return (total, loc, err) if parts else total


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
    :data:`EMBED_CHUNK` (the same chunks for the same vocabulary, whatever is cached)."""
    out: dict[str, torch.Tensor] = {}
    for k in range(0, len(vocab), EMBED_CHUNK):              # a few chunks
        part = vocab[k:k + EMBED_CHUNK]
        out.update(zip(part, question_embedding(part)))
    return out


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
    to use (:func:`real_pages`; :func:`record_ids` gives a record's)."""
    if threads:
        torch.set_num_threads(threads)
    data = TrainingSet(cfg, data_dir=data_dir, allow_missing=allow_missing, only_ids=only_ids)
    torch.manual_seed(cfg.seed)
    net = GistLocaliserNet(width=cfg.width, maps=cfg.maps)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = len(epoch_batches(cfg, torch.Generator().manual_seed(cfg.seed), data))
    total = steps_per_epoch * cfg.epochs
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
    for epoch in range(cfg.epochs):
        for ids in epoch_batches(cfg, gen, data):
            if max_steps is not None and step >= max_steps:
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
            print(f"epoch {epoch + 1}/{cfg.epochs}: mean loss {recent:.4f} "
                  f"({time.perf_counter() - t0:.0f} s, {len(cache)} pages)", flush=True)
        if max_steps is not None and step >= max_steps:
            break
    net.eval()
    sources = data.contributions(cache)
    record = dict(loss=losses, steps=step, seconds=time.perf_counter() - t0,
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
                       data_dir: str | Path | None = None, allow_missing: bool = False
                       ) -> list[Sample]:
    """Held-out pages of ``layout`` (:data:`VALID_LAYOUTS`): synthetic ones from seeds
    :data:`VALID_SEED` upwards, ``cfg.valid_pages`` of them (or ``n``); for ``"sroie"`` /
    ``"funsd"`` the pages of that real *training* folder held out by
    ``cfg.real_valid_mod`` (never trained on; empty if the folder is not in ``cfg.real`` or
    is missing under ``allow_missing``). Gist budget cycling through ``cfg.gists``."""
    if layout not in VALID_LAYOUTS:
        raise ValueError(f"layout must be one of {VALID_LAYOUTS}, got {layout!r}")
    if layout in ("sroie", "funsd"):
        _, valid, _ = real_pages(tuple(cfg.real), cfg.real_pages, cfg.real_valid_mod,
                                 None if data_dir is None else str(data_dir), allow_missing)
        pages = [p for p in valid if p.layout == layout][:n]
        return [make_sample(p.document(), cfg.gists[i % len(cfg.gists)], null=False,
                            layout=layout) for i, p in enumerate(pages)]
    n = cfg.valid_pages if n is None else n
    out = []
    for i in range(n):                                      # a few dozen pages
        doc = make_document(VALID_SEED + i, layout=layout)
        out.append(make_sample(doc, cfg.gists[i % len(cfg.gists)], null=False, layout=layout))
    return out


def evaluate(net: GistLocaliserNet, samples: list[Sample], wording: str = "heldout") -> dict:
    """Validation metrics: cross-entropy, the probability mass on the answer
    (``hit_mass``), whether the arg-max output pixel lies on the answer (``top1``), and the
    text-size error in octaves (``size_rmse``: the size map averaged under the *predicted*
    location, as the cascade uses it). Each question is asked in every template of
    ``wording`` in turn (one template per page, cycling)."""
    keys = sorted({q[1] for s in samples for q in s.queries if q and q[0] == FORM_FIELD})
    emb = embed_vocabulary(vocabulary(wording, keys))
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
    return dict(questions=n, cross_entropy=sum(ce) / max(n, 1), hit_mass=float(np.mean(mass)),
                top1=float(np.mean(top1)), size_rmse=float(np.sqrt(np.mean(np.square(serr)))))


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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        out = output_path(args)
    except ValueError as exc:
        parser.error(str(exc))
    cfg = TrainConfig(seed=args.seed, pages=args.pages, epochs=args.epochs)
    where = "the COMMITTED weights " if out == weights_path() else ""
    print(f"training the gist localiser into {where}{out}: {cfg}", flush=True)
    try:
        net, rec = train(cfg, threads=args.threads, data_dir=args.data_dir,
                         allow_missing=args.allow_missing_real)
    except DatasetNotFound as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    vs = {layout: validation_samples(cfg, layout, data_dir=args.data_dir,
                                     allow_missing=args.allow_missing_real)
          for layout in VALID_LAYOUTS}
    valid = {f"{layout}/{wording}": evaluate(net, vs[layout], wording)
             for layout, wording in (("paper", "heldout"), ("receipt", "heldout"),
                                     ("invoice", "heldout"), ("sroie", "heldout"),
                                     ("funsd", "heldout"), ("paper", "train"),
                                     ("receipt", "train"), ("sroie", "train"),
                                     ("funsd", "train"))
             if vs[layout]}
    out.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone().float() for k, v in net.state_dict().items()}
    torch.save(state, out)
    meta = dict(sha256=file_sha256(out), arch=dict(width=cfg.width, maps=cfg.maps),
                parameters=int(sum(v.numel() for v in state.values())),
                config=asdict(cfg), train=rec,
                data=dict(allow_missing_real=args.allow_missing_real,
                          missing=sorted(k for k, v in rec.get("sources", {}).items()
                                         if "missing" in v),
                          repeated_rule=REPEATED_RULE,
                          size_target="synthetic: font size; real: median line-box height",
                          validation=("synthetic: seeds from VALID_SEED; real: pages of the "
                                      "*-train folders with crc32(doc_id) % real_valid_mod == "
                                      "0, never trained on; no *-dev page")),
                validation=valid, validation_seconds=time.perf_counter() - t0,
                environment=dict(torch=torch.__version__, python=platform.python_version(),
                                 machine=platform.machine(), threads=args.threads))
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
