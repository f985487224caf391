"""Learning curve of the cascade's learned localiser: its held-out numbers as the number of
real training pages grows.

Run as ``python -m fovea_book.learning_curve``.

Each point trains :func:`fovea_book.train.train` from scratch on the synthetic pages of the
configuration (the same for every point) plus a share of the real training pages of
``sroie-train`` and ``funsd-train`` (the fractions, default ``0, 1/4, 1/2, 1``, of each
folder's non-held-out pages). The subsets are nested: each folder's training pages are put
in one fixed order (a permutation drawn from ``(seed, crc32(folder))``, so a subset is not
the first pages by id, which would leave out the pages added to the folders last) and a
point takes the first ``round(fraction x n)`` of them. The held-out pages (``crc32(doc_id)
% 5 == 0``, :func:`~fovea_book.train.real_pages`) are the same fifth for every point and
never trained on; no ``*-dev`` folder is read.

**Only the data changes between points**: every point takes the same number of optimiser
steps (``--steps``; default: the step count of the full run, ``epochs`` epochs over every
synthetic and real page, i.e. what ``python -m fovea_book.train`` takes on the same
configuration) with the cosine schedule spanning them (:attr:`~fovea_book.train.
TrainConfig.steps`), the same seed, batch size and synthetic pages; a point with fewer real
pages repeats its pages over more epochs. The full point is therefore the very run
``python -m fovea_book.train`` makes with the same options.

Each point records the validation numbers :func:`~fovea_book.train.validate` computes
(cross-entropy, ``hit_mass``, ``top1``, ``size_rmse``, and ``hit_mass`` / ``top1`` per
question field, e.g. a receipt's ``company``, ``date``, ``address``, ``total``) on the
held-out sets :data:`CURVE_VALIDATIONS`: the held-out real pages (``sroie``, ``funsd``),
the held-out synthetic pages (``receipt``, ``paper``, ``invoice``), and photo-like copies
of the held-out pages (``+photo``, :func:`~fovea_book.train.photo_page` drawn from
:func:`~fovea_book.train.valid_photo_rng`, the same copies for every point); plus page
counts, steps, seconds, the configuration, the commit and the versions. ``reference``: the
committed weights (``fovea_core/weights/gist_localiser.pt``) on the same sets. These are
tuning numbers on pages of the *training* folders the runs never trained on, not results.

The JSON is rewritten after every point (``"complete": false`` until the last), so an
interrupted run keeps what it finished.

Examples::

    python -m fovea_book.learning_curve --photo                    # -> data/models/
    python -m fovea_book.learning_curve --photo --clean-full --jobs 2
    python -m fovea_book.learning_curve --fractions 0 1 --steps 40 --out _build/lc.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from fovea_book.paths import DatasetNotFound, project_root

__all__ = ["CURVE_VALIDATIONS", "DEFAULT_FRACTIONS", "Point", "curve_pages", "full_steps",
           "run_point", "learning_curve", "build_parser", "main"]

#: the held-out sets every point is scored on: ``(layout, wording, photo)``
#: (:data:`fovea_book.train.VALIDATIONS`); the questions in the held-out wordings
CURVE_VALIDATIONS: tuple[tuple[str, str, bool], ...] = (
    ("sroie", "heldout", False), ("funsd", "heldout", False), ("receipt", "heldout", False),
    ("paper", "heldout", False), ("invoice", "heldout", False), ("sroie", "heldout", True),
    ("funsd", "heldout", True), ("receipt", "heldout", True))
#: shares of each real folder's training pages (non-held-out), one point each
DEFAULT_FRACTIONS = (0.0, 0.25, 0.5, 1.0)
#: files whose code the numbers measure (their SHA-256 goes into the record)
MEASURED = ("book/fovea_book/train.py", "book/fovea_book/learning_curve.py",
            "fovea_core/cascade/learned.py", "fovea_core/cascade/core.py")


def default_output() -> Path:
    """``data/models/learning_curve.json`` under the project root."""
    return project_root() / "data" / "models" / "learning_curve.json"


@dataclass(frozen=True)
class Point:
    """One point of the curve: a share of every real folder's training pages, with or
    without the photo-like augmentation."""

    fraction: float
    photo: bool

    @property
    def label(self) -> str:
        return f"{self.fraction:g}{'+photo' if self.photo else ''}"


def curve_pages(cfg, fractions: Sequence[float], *, data_dir: str | Path | None = None
                ) -> tuple[list[dict[str, list[str]]], dict]:
    """``(only_ids per fraction, report)``: for each fraction the real pages a point uses
    (``{folder: training ids + every held-out id}``, for :func:`~fovea_book.train.train`'s
    ``only_ids``); ``report``: per folder its held-out ids, its training ids in the fixed
    order the subsets are cut from (nested: a smaller fraction's pages are among a larger
    one's) and the rule."""
    from fovea_book.train import real_pages

    if any(not 0.0 <= f <= 1.0 for f in fractions):
        raise ValueError(f"fractions must lie in [0, 1], got {list(fractions)}")
    train_p, valid_p, _ = real_pages(tuple(cfg.real), None, cfg.real_valid_mod,
                                     None if data_dir is None else str(data_dir))
    report: dict = {}
    for name in cfg.real:                                    # two folders
        ids = [p.doc_id for p in train_p if p.source == name]
        order = np.random.default_rng([cfg.seed, zlib.crc32(name.encode())]).permutation(len(ids))
        report[name] = dict(train_order=[ids[k] for k in order],
                            held_out=[p.doc_id for p in valid_p if p.source == name])
    subsets = []
    for f in fractions:                                      # a few points
        subsets.append({name: r["train_order"][:round(f * len(r["train_order"]))] + r["held_out"]
                        for name, r in report.items()})
    report = dict(folders=report, rule=(
        "per folder: the training pages (crc32(doc_id) % real_valid_mod != 0) in the order of "
        "numpy default_rng([seed, crc32(folder)]).permutation; a point takes the first "
        "round(fraction * n); every held-out page is kept for validation only"))
    return subsets, report


def full_steps(cfg, *, data_dir: str | Path | None = None) -> tuple[int, int]:
    """``(steps, steps per epoch)`` of ``cfg`` on every page (synthetic and every real
    training page): ``cfg.epochs`` epochs of :func:`~fovea_book.train.epoch_batches`, the
    step count of ``python -m fovea_book.train`` on that configuration."""
    import torch

    from fovea_book.train import TrainingSet, epoch_batches

    data = TrainingSet(replace(cfg, steps=None), data_dir=data_dir)
    per_epoch = len(epoch_batches(cfg, torch.Generator().manual_seed(cfg.seed), data))
    return per_epoch * cfg.epochs, per_epoch


#: validation samples per (configuration fields they depend on, layout, photo), kept
#: between the points one process runs
_SETS: dict = {}


def _valid_sets(cfg, limit: int | None, data_dir) -> dict:
    key = (cfg.gists, cfg.valid_pages, cfg.real, cfg.real_valid_mod, limit,
           None if data_dir is None else str(data_dir))
    if key not in _SETS:
        from fovea_book.train import validation_samples

        sets = {}
        for layout, _, photo in CURVE_VALIDATIONS:           # eight sets
            if (layout, photo) not in sets:
                sets[layout, photo] = validation_samples(cfg, layout, limit, data_dir=data_dir,
                                                         photo=photo)
        _SETS[key] = sets
    return _SETS[key]


def run_point(cfg, only_ids: Mapping[str, Sequence[str]] | None, *, max_steps: int | None = None,
              valid_limit: int | None = None, data_dir: str | Path | None = None,
              threads: int = 1) -> dict:
    """Train one point (``cfg``, the real pages ``only_ids``) and score it on
    :data:`CURVE_VALIDATIONS`; ``only_ids is None`` scores the committed weights instead
    (the reference). Returns the point's record."""
    import torch

    from fovea_book.train import train, validate

    t0 = time.perf_counter()
    sets = _valid_sets(cfg, valid_limit, data_dir)
    sets_s = time.perf_counter() - t0
    if only_ids is None:
        from fovea_core.cascade.learned import file_sha256, load_model, weights_path

        if threads:
            torch.set_num_threads(threads)
        net = load_model()
        t1 = time.perf_counter()
        valid = validate(net, cfg, CURVE_VALIDATIONS, data_dir=data_dir, sets=sets)
        return dict(weights=os.path.relpath(weights_path(), project_root()),
                    sha256=file_sha256(weights_path()), validation=valid,
                    seconds=dict(validation=time.perf_counter() - t1,
                                 validation_pages=sets_s))
    net, rec = train(cfg, max_steps=max_steps, progress=False, threads=threads,
                     data_dir=data_dir, only_ids=only_ids)
    t1 = time.perf_counter()
    valid = validate(net, cfg, CURVE_VALIDATIONS, data_dir=data_dir, sets=sets)
    src = rec["sources"]
    real = {k: v for k, v in src.items() if k != "synthetic"}
    return dict(
        real_pages={k: len(v["page_ids"]) for k, v in real.items()},
        pages_seen={k: v["pages"] for k, v in src.items()},
        synthetic_pages=cfg.pages,
        page_ids={k: v["page_ids"] for k, v in real.items()},
        held_out_pages={k: len(v["validation_ids"]) for k, v in real.items()},
        steps=rec["steps"], steps_per_epoch=rec.get("steps_per_epoch"),
        epochs=(rec["steps"] / rec["steps_per_epoch"]) if rec.get("steps_per_epoch") else None,
        loss_last_50=float(np.mean(rec["loss"][-50:])) if rec["loss"] else None,
        seconds=dict(total=rec["seconds"], data=rec["data_seconds"], embed=rec["embed_seconds"],
                     validation=time.perf_counter() - t1, validation_pages=sets_s),
        validation=valid)


def _task(args: tuple) -> tuple[str, dict]:
    label, cfg, only_ids, kw = args
    return label, run_point(cfg, only_ids, **kw)


def _git() -> dict:
    root = project_root()

    def run(*cmd: str) -> str:
        try:
            return subprocess.run(["git", *cmd], cwd=root, capture_output=True, text=True,
                                  timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            return ""
    dirty = run("status", "--porcelain", "--", *MEASURED)          # "XY path" per line
    return dict(head=run("rev-parse", "HEAD").strip() or None,
                measured_files_changed=[ln[3:] for ln in dirty.splitlines() if ln.strip()])


def _environment(threads: int) -> dict:
    import cv2
    import torch

    from fovea_core.paths import file_digest

    root = project_root()
    return dict(python=platform.python_version(), torch=torch.__version__,
                numpy=np.__version__, opencv=cv2.__version__, machine=platform.machine(),
                threads=threads, cpus=os.cpu_count(),
                code_sha256={f: file_digest(root / f) for f in MEASURED if (root / f).exists()})


def learning_curve(base, fractions: Sequence[float] = DEFAULT_FRACTIONS, *, photo: bool = True,
                   clean_full: bool = False, steps: int | None = None,
                   max_steps: int | None = None, valid_limit: int | None = None,
                   data_dir: str | Path | None = None, jobs: int = 1,
                   out: Path | None = None, reference: bool = True,
                   log=print, argv: Sequence[str] = ()) -> dict:
    """The curve of ``base`` (a :class:`~fovea_book.train.TrainConfig`) over ``fractions``
    (with ``photo``), plus with ``clean_full`` a point at the full page count with the other
    setting of ``photo``; written to ``out`` after every point when given. ``steps``: every
    point's step count (default :func:`full_steps`); ``max_steps``: stop each point early (a
    smoke test; the record says so). ``jobs``: points trained at once (processes of one
    thread each). Returns the record."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    if steps is not None and steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    t0 = time.perf_counter()
    fractions = list(fractions)
    subsets, pages = curve_pages(base, fractions + [1.0], data_dir=data_dir)
    full, per_epoch = full_steps(base, data_dir=data_dir)
    n_steps = full if steps is None else steps
    points = [Point(f, photo) for f in fractions] + ([Point(1.0, not photo)] if clean_full else [])
    ids = subsets[:len(fractions)] + ([subsets[-1]] if clean_full else [])
    kw = dict(max_steps=max_steps, valid_limit=valid_limit, data_dir=data_dir)
    tasks = [(p.label, replace(base, photo=p.photo, steps=n_steps), i, kw)
             for p, i in zip(points, ids, strict=True)]
    if reference:
        tasks.insert(0, ("reference", base, None, kw))
    record = dict(
        what=("learning curve of the gist localiser: held-out validation numbers (pages of the "
              "*-train folders never trained on, and synthetic held-out pages) against the "
              "number of real training pages; tuning numbers, not results"),
        complete=False, command=["python", "-m", "fovea_book.learning_curve", *argv],
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        commit=_git(), environment=_environment(1),
        config=asdict(replace(base, steps=n_steps)),
        steps=dict(per_point=n_steps, max_steps=max_steps, full_run=full,
                   full_run_per_epoch=per_epoch,
                   rule=("every point takes the same number of optimiser steps (the cosine "
                         "schedule spans them), the same seed, batch and synthetic pages; "
                         "only the real pages differ" + (
                             "" if steps is not None else
                             "; the number is that of the full run (epochs x steps per "
                             "epoch on every page)"))),
        fractions=fractions, photo=photo, clean_full=clean_full, pages=pages,
        photo_ranges=asdict(_photo_ranges()), validations=[
            _key(v) for v in CURVE_VALIDATIONS], valid_limit=valid_limit,
        reference=None, points=[None] * len(points))
    labels = [p.label for p in points]

    def store(label: str, res: dict) -> None:
        if label == "reference":
            record["reference"] = res
        else:
            k = labels.index(label)
            record["points"][k] = dict(label=label, fraction=points[k].fraction,
                                       photo=points[k].photo, **res)
        if out is not None:
            _write(out, record)

    if out is not None:
        _write(out, record)
    if jobs == 1:
        for task in tasks:                                   # a few points
            label, res = _task(task)
            store(label, res)
            log(_line(label, res))
    else:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        with multiprocessing.get_context("spawn").Pool(min(jobs, len(tasks))) as pool:
            for label, res in pool.imap_unordered(_task, tasks):
                store(label, res)
                log(_line(label, res))
    record["complete"] = all(p is not None for p in record["points"])
    record["seconds"] = time.perf_counter() - t0
    record["table"] = table(record)
    if out is not None:
        _write(out, record)
    return record


def _photo_ranges():
    from fovea_book.train import PHOTO

    return PHOTO


def _key(v: tuple[str, str, bool]) -> str:
    from fovea_book.train import validation_key

    return validation_key(*v)


def _write(out: Path, record: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(out)


#: the columns of :func:`table`: ``(validation key, field or None)``
TABLE_COLUMNS = (("sroie/heldout", None), ("funsd/heldout", None), ("receipt/heldout", None),
                 ("paper/heldout", None), ("sroie+photo/heldout", None),
                 ("funsd+photo/heldout", None), ("sroie/heldout", "company"),
                 ("sroie/heldout", "date"), ("sroie/heldout", "address"),
                 ("sroie/heldout", "total"))


def table(record: dict) -> list[dict]:
    """One row per point (and the reference): real pages, then ``hit_mass`` / ``top1`` of
    :data:`TABLE_COLUMNS`."""
    rows = []
    entries = [("reference", record.get("reference"))] + \
        [(p["label"], p) for p in record["points"] if p is not None]
    for label, e in entries:
        if e is None:
            continue
        row: dict = dict(label=label, real_pages=e.get("real_pages"))
        for key, fld in TABLE_COLUMNS:
            v = e["validation"].get(key)
            if v is not None and fld is not None:
                v = v["fields"].get(fld)
            name = key if fld is None else f"{key}:{fld}"
            row[name] = None if v is None else dict(hit_mass=round(v["hit_mass"], 4),
                                                    top1=round(v["top1"], 4),
                                                    questions=v["questions"])
        rows.append(row)
    return rows


def _line(label: str, res: dict) -> str:
    v = res["validation"]

    def f(k: str) -> str:
        return "-" if k not in v else f"{v[k]['hit_mass']:.3f}/{v[k]['top1']:.3f}"
    return (f"{label:>12}: real {res.get('real_pages', '-')}, sroie {f('sroie/heldout')}, "
            f"funsd {f('funsd/heldout')}, sroie+photo {f('sroie+photo/heldout')} "
            f"(hit_mass/top1; {res['seconds'].get('total', res['seconds'].get('validation')):.0f} s)")


def build_parser() -> argparse.ArgumentParser:
    from fovea_book.train import TrainConfig

    cfg = TrainConfig()
    parser = argparse.ArgumentParser(prog="python -m fovea_book.learning_curve",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None,
                        help="the JSON record (default: data/models/learning_curve.json)")
    parser.add_argument("--fractions", type=float, nargs="+", default=list(DEFAULT_FRACTIONS),
                        help="shares of each real folder's training pages, one point each "
                             "(default: %(default)s)")
    parser.add_argument("--photo", action=argparse.BooleanOptionalAction, default=True,
                        help="train the points on photo-like pages (default: %(default)s)")
    parser.add_argument("--clean-full", action="store_true",
                        help="add a point at the full page count with the other --photo "
                             "setting, for comparison")
    parser.add_argument("--steps", type=int, default=None,
                        help="optimiser steps of every point (default: the full run's: "
                             "epochs x steps per epoch on every page)")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="stop each point after this many steps (a smoke test; the "
                             "schedule still spans --steps)")
    parser.add_argument("--pages", type=int, default=cfg.pages,
                        help="synthetic training pages of every point (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=cfg.epochs,
                        help="epochs of the full run, which set the default --steps "
                             "(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=cfg.seed, help="seed (default: %(default)s)")
    parser.add_argument("--valid-pages", type=int, default=cfg.valid_pages,
                        help="synthetic validation pages per layout (default: %(default)s)")
    parser.add_argument("--valid-limit", type=int, default=None,
                        help="at most this many pages per validation set (default: all)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="points trained at once, one thread each (default: %(default)s)")
    parser.add_argument("--no-reference", action="store_true",
                        help="do not score the committed weights on the same sets")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="folder holding sroie-train and funsd-train (default: "
                             "$FOVEA_DATA, else data/external)")
    return parser


def main(argv: list[str] | None = None) -> int:
    from fovea_book.train import TrainConfig

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("pages", "epochs", "jobs", "valid_pages"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("steps", "max_steps", "valid_limit"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    out = args.out if args.out is not None else default_output()
    base = TrainConfig(seed=args.seed, pages=args.pages, epochs=args.epochs,
                       valid_pages=args.valid_pages)
    try:
        rec = learning_curve(base, args.fractions, photo=args.photo, clean_full=args.clean_full,
                             steps=args.steps, max_steps=args.max_steps,
                             valid_limit=args.valid_limit, data_dir=args.data_dir,
                             jobs=args.jobs, out=out, reference=not args.no_reference,
                             argv=argv)
    except DatasetNotFound as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(rec["table"], indent=1))
    print(f"wrote {out} ({rec['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
