"""What every fit on training pages shares: the pages the localiser never trained on, their
photograph-like variants, the command line, the evaluation of the variants and the record.

The fits of ``foveate``'s default read them: :mod:`fovea_book.eval.glance_rule` (the glance
rule: its share of N and its gate) and :mod:`fovea_book.eval.reading_fit` (where to look
after reading, and fixation 1's share). So do the rules tried on pages unlike the training
pages and dropped, in :mod:`fovea_book.eval.tried`.

**Training pages only** (``../shared/PROTOCOL.md``): :func:`unseen_training_pages` returns
the pages of ``sroie-train`` and ``funsd-train`` the localiser was not trained on (its
record's held-out fifth and pages added to the folders since) and synthetic validation pages
(seeds from :data:`fovea_book.train.VALID_SEED`); no dev page is ever read. A fit is run as
``python -m fovea_book.eval.<module>`` (:func:`start_fit`) and writes its record to
``data/models/<name>.json`` (:func:`models_record_path`, :func:`write_fit_record`,
:func:`fit_provenance`).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import platform
import subprocess
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from fovea_book.eval.document_types import Document

__all__ = ["SCALES", "MIN_RATIO", "PHOTO_VARIANTS", "grid_ratio", "localiser_record",
           "weights_record", "unseen_pages", "unseen_training_pages", "photo_variants",
           "smallest_best", "models_record_path", "read_models_record", "with_localiser",
           "start_fit", "variant_sets", "read_variants", "write_fit_record", "fit_provenance",
           "git_commit"]

#: scales of the training pages a fit reads (each page at each scale; 1 = as stored)
SCALES = (1.0, 0.5, 0.25)
#: a rescaled page must hold at least this many times N cells (the cascade needs its gist
#: and a fovea; ``resize`` at N needs N cells)
MIN_RATIO = 1.05
#: the photograph-like variants of each training page (:func:`photo_variants`)
PHOTO_VARIANTS = ("scan", "table", "photo")


def grid_ratio(doc: Document, budget: int = 273, patch: int = 16) -> float:
    """The page's level-0 patch grid ``ceil(H / patch) * ceil(W / patch)`` over ``budget``:
    the quantity the rule thresholds."""
    h, w = doc.size
    return math.ceil(h / patch) * math.ceil(w / patch) / budget

def localiser_record() -> dict:
    """The committed localiser's training record (the JSON beside its weights)."""
    from fovea_core.cascade.learned import weights_path

    return json.loads(weights_path().with_suffix(".json").read_text())

@functools.lru_cache(maxsize=8)
def weights_record(weights: str) -> dict:
    """The training record beside localiser ``weights`` (a path relative to the project
    root, e.g. ``data/models/gist_localiser_photo.pt``), read once (a localiser's ``repr``
    enters every row's cache key); ``FileNotFoundError`` naming the command that trains them."""
    from fovea_book.paths import project_root

    rec = (project_root() / weights).with_suffix(".json")
    if not rec.is_file():
        raise FileNotFoundError(f"no record {rec} beside the localiser weights {weights}; "
                                f"train them with python -m fovea_book.train --out {weights} "
                                "(see fovea_book.eval.unseen.LOCO_WEIGHTS)")
    return json.loads(rec.read_text())

def unseen_pages(record: Mapping, name: str, *, data_dir=None) -> list[Document]:
    """The pages of the training folder ``name`` (``"sroie-train"`` or ``"funsd-train"``,
    questions in the training wording) that the localiser of ``record`` (its training
    record) did not train on: every page not among the record's training ``page_ids`` (so
    its held-out fifth and pages added since), sorted by id. A missing folder raises
    :class:`~fovea_book.paths.DatasetNotFound`."""
    from fovea_book.eval.funsd import load_funsd
    from fovea_book.eval.sroie import load_sroie
    from fovea_book.paths import dataset_path

    loaders = {"sroie-train": lambda root: load_sroie(root, wording="train", log=lambda _: None),
               "funsd-train": lambda root: load_funsd(root, wording="train", log=lambda _: None)}
    if name not in loaders:
        raise ValueError(f"name must be one of {sorted(loaders)}, got {name!r}")
    trained = set(record["train"]["sources"].get(name, {}).get("page_ids", ()))
    return [d for d in loaders[name](dataset_path(name, data_dir)) if d.doc_id not in trained]

def unseen_training_pages(record: Mapping, *, data_dir=None, synthetic: int = 12,
                          forms: int | None = 12, receipts: int | None = None
                          ) -> dict[str, list[Document]]:
    """Training pages the localiser of ``record`` (its training record, the JSON beside the
    weights) never trained on: ``{"sroie-train": [...], "funsd-train": [...],
    "synthetic": [...]}``.

    Real pages: :func:`unseen_pages`; ``forms`` and ``receipts`` cap the FUNSD and SROIE
    pages (the first by ``crc32`` of their id; ``None``: all). Synthetic pages: ``synthetic``
    pages from the validation seeds (:data:`fovea_book.train.VALID_SEED`), alternating the
    receipt and paper layouts. A missing folder raises
    :class:`~fovea_book.paths.DatasetNotFound`."""
    from fovea_book.eval.layouts import make_document
    from fovea_book.train import VALID_SEED

    def first(name: str, n: int | None) -> list[Document]:
        docs = sorted(unseen_pages(record, name, data_dir=data_dir),
                      key=lambda d: zlib.crc32(d.doc_id.encode()))
        return docs if n is None else docs[:n]

    out = {"sroie-train": (unseen_pages(record, "sroie-train", data_dir=data_dir)
                           if receipts is None else first("sroie-train", receipts)),
           "funsd-train": first("funsd-train", forms)}
    out["synthetic"] = [make_document(VALID_SEED + i, layout=("receipt", "paper")[i % 2])
                        for i in range(synthetic)]
    return out

def smallest_best(values: Sequence[float], scores: Sequence[float], *,
                  tol: float = 1e-9) -> float:
    """The smallest of ``values`` whose score is within ``tol`` of the highest of
    ``scores`` (one per value): a fit's choice with ties broken towards the smaller value
    (``ValueError`` when there is none)."""
    v, sc = np.asarray(values, float), np.asarray(scores, float)
    if v.size == 0 or v.shape != sc.shape:
        raise ValueError(f"need one score per value and at least one, got {v.size} values "
                         f"and {sc.size} scores")
    return float(v[sc >= sc.max() - tol].min())

def models_record_path(module: str) -> Path:
    """``data/models/<name>.json`` of the repository, ``name`` the last part of ``module``
    (``"glance_rule"``, ``"tried.safe_rule"``): the record the fit
    ``python -m fovea_book.eval.<module>`` writes."""
    from fovea_book.paths import project_root

    return project_root() / "data" / "models" / f"{module.rsplit('.', 1)[-1]}.json"

def read_models_record(module: str, path: str | Path | None = None) -> dict:
    """The record of the fit ``python -m fovea_book.eval.<module>`` (default
    :func:`models_record_path`); ``FileNotFoundError`` naming the command when it is
    missing."""
    p = models_record_path(module) if path is None else Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no record of this fit; run "
                                f"`python -m fovea_book.eval.{module}`")
    return json.loads(p.read_text())

def with_localiser(path: Path, weights: str | None) -> Path:
    """``path`` of a fit's record, for a fit with other localiser ``weights`` (``None``: the
    committed localiser, ``path`` itself): the weights' file name, less
    ``gist_localiser_``, appended to the stem (``glance_rule.json`` with
    ``data/models/gist_localiser_photo_noposition.pt``: ``glance_rule_photo_noposition.json``)."""
    if weights is None:
        return path
    stem = Path(weights).stem.removeprefix("gist_localiser_")
    return path.with_name(f"{path.stem}_{stem}{path.suffix}")

def start_fit(module: str, description: str, out_default: Path,
              argv: Sequence[str] | None, *, receipts: int | None = None,
              forms: int | None = 12, synthetic: int = 12, localiser: bool = False
              ) -> tuple[argparse.Namespace, dict, dict[str, list[Document]], float]:
    """The common start of a fit on training pages, ``python -m fovea_book.eval.<module>``.

    Parses ``argv``: ``--out`` (the record's path, default ``out_default``), ``--data-dir``,
    ``--receipts``, ``--forms``, ``--synthetic`` (these defaults) and ``--workers``; with
    ``localiser``, also ``--localiser WEIGHTS`` (other localiser weights, a path relative
    to the project root with their training record beside them; default: the committed
    localiser; given, ``--out`` defaults to ``out_default`` with the weights' name appended,
    e.g. ``glance_rule_photo_noposition.json``). Uses one torch thread (the evaluation's
    processes share the cores); starts the clock; reads the localiser's training record
    (:func:`localiser_record`, or the weights') and the training pages it never trained on
    (:func:`unseen_training_pages`). Returns ``(args, record, pages, started)``,
    ``args.out`` set to the path to write (and ``args.localiser``: ``None`` or the weights'
    path)."""
    import torch

    from fovea_book.paths import project_root

    ap = argparse.ArgumentParser(prog=f"python -m fovea_book.eval.{module}",
                                 description=description.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None,
                    help=f"record path (default {out_default.relative_to(project_root())})")
    if localiser:
        ap.add_argument("--localiser", default=None, metavar="WEIGHTS",
                        help="localiser weights to fit with, relative to the project root "
                             "(e.g. data/models/gist_localiser_photo_noposition.pt; default: "
                             "the committed localiser)")
    ap.add_argument("--data-dir", default=None, help="folder holding sroie-train/ and "
                    "funsd-train/ (default $FOVEA_DATA, else data/external)")
    ap.add_argument("--receipts", type=int, default=receipts,
                    help="unseen sroie-train pages read (default: %(default)s; None: all)")
    ap.add_argument("--forms", type=int, default=forms)
    ap.add_argument("--synthetic", type=int, default=synthetic)
    ap.add_argument("--workers", type=int, default=None, help="processes (default: CPUs)")
    args = ap.parse_args(argv)
    loc = getattr(args, "localiser", None)
    try:
        record = localiser_record() if loc is None else weights_record(loc)
    except FileNotFoundError as err:
        ap.error(f"--localiser: {err}")
    if args.out is None:
        args.out = with_localiser(out_default, loc)
    torch.set_num_threads(1)
    started = time.perf_counter()
    pages = unseen_training_pages(record, data_dir=args.data_dir, synthetic=args.synthetic,
                                  forms=args.forms, receipts=args.receipts)
    return args, record, pages, started

def variant_sets(pages: Mapping[str, Sequence[Document]],
                 variants: Callable[[Document], list[Document]]) -> dict[str, list[Document]]:
    """``{set: every variant of its pages}``: ``variants(page)`` for each page of ``pages``
    (:func:`start_fit`'s), keeping those whose grid holds at least :data:`MIN_RATIO` N
    (:func:`grid_ratio`); prints one line per set (its pages and variants kept)."""
    sets = {name: [v for d in docs for v in variants(d) if grid_ratio(v) >= MIN_RATIO]
            for name, docs in pages.items()}
    for name, docs in sets.items():
        print(f"{name}: {len(pages[name])} pages, {len(docs)} variants "
              f"(grid >= {MIN_RATIO} N)", flush=True)
    return sets

def read_variants(sets: Mapping[str, Sequence[Document]], methods: Sequence,
                  workers: int | None = None):
    """Every method of ``methods`` on every variant of ``sets`` (:func:`variant_sets`' ids,
    ``"<page>-<variant>@<scale>"``), read by the book's reader (rapidocr) at N = 273: the
    evaluator's rows (:func:`~fovea_book.eval.cascade.evaluate`, cached like the chapters'),
    with the ``variant`` of each row."""
    from fovea_book.eval.cascade import evaluate
    from fovea_book.eval.reader import Reader

    table = evaluate(sets, methods, 273, reader=Reader(), workers=workers, progress=True)
    table["variant"] = table.doc_id.str.extract(r"-(\w+)@")[0]
    return table

def write_fit_record(out: Mapping, path: Path) -> Path:
    """Write a fit's record ``out`` as indented JSON to ``path`` (its folder made); return
    ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    return path

def fit_provenance(record: Mapping, sets: Mapping[str, Sequence[Document]],
                   started: float) -> dict:
    """The provenance fields of a fit's record: the ``pages`` read per set, the localiser's
    ``sha256`` (``record``: its training record), the ``commit``, the ``seconds`` since
    ``started`` (a :func:`time.perf_counter` value) and the ``environment``."""
    import torch

    return dict(pages={name: [d.doc_id for d in docs] for name, docs in sets.items()},
                localiser_sha256=record["sha256"], commit=git_commit(),
                seconds=time.perf_counter() - started,
                environment=dict(python=platform.python_version(), torch=torch.__version__,
                                 machine=platform.machine()))

def git_commit() -> str | None:
    """The checkout's commit (``None`` outside a git checkout)."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def photo_variants(doc: Document, scales: Sequence[float] | None = None) -> list[Document]:
    """``doc`` as scanned, on a table (the sheet 60 % of the frame,
    :func:`~fovea_book.eval.photo.on_background`) and photographed (on a table, then
    :func:`~fovea_book.eval.photo.perspective`, :func:`~fovea_book.eval.photo.rotated` and
    :func:`~fovea_book.eval.photo.uneven_light`), each at ``scales`` (default the page-size
    :data:`SCALES`) as JPEG
    (:func:`~fovea_book.eval.photo.photo_like`); ids ``"<id>-<variant>@<scale>"``. The
    random draws are seeded by the page's id (the same pages every run)."""
    from fovea_book.eval.photo import (on_background, perspective, photo_like, rotated,
                                       uneven_light)

    rng = np.random.default_rng(zlib.crc32(doc.doc_id.encode()))
    table = on_background(doc, rng)
    photo = uneven_light(rotated(perspective(on_background(doc, rng), rng), rng), rng)
    return [photo_like(replace(page, doc_id=f"{doc.doc_id}-{name}"), s)
            for name, page in zip(PHOTO_VARIANTS, (doc, table, photo))
            for s in (SCALES if scales is None else scales)]
