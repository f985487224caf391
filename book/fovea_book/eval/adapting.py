"""Chapter 14.9's adaptation to a collection's own unlabelled pages: the weights it reads,
the learning curve's runs, and the numbers it reports.

The method is the core's (:func:`fovea_core.adapt`, ``python -m fovea_core adapt``); what
lives here is what the book does with it:

* :data:`ADAPTED`, :data:`LOCO_ADAPTED`: the adapted weights the chapter evaluates, each
  made by the core's command (the commands are in each constant's comment; the record
  beside the weights says what the run read and did);
* :func:`curve_pages` / :func:`adapt_curve` (``python -m fovea_book.eval.adapting curve``):
  the learning curve's runs, the committed localiser adapted to nested random subsets of
  the unlabelled photographs (:data:`CURVE_PAGES`), written to :func:`curve_weights`;
* :func:`recovery_share`: the share of the supervised localiser's gain over a baseline that
  the adapted one recovers, with a bootstrap CI over documents;
* :func:`label_quality`: the pseudo-labeller's precision and recall on the labelled
  training pages at the thresholds it keeps (its record, ``data/models/pseudo_labels.json``);
* :func:`labels_figure`: the pseudo-labels of one unlabelled page drawn on it;
* :func:`moved_question`: the question whose fovea the adaptation moved most.

Nothing here reads a dev page to choose anything: the weights are fitted on unlabelled
pages only (the photographs' training split; the images of ``sroie-train`` or
``funsd-train`` with their labels never opened), and the dev sets are evaluated by the
chapter with the same evaluator as every other row.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from fovea_book.eval.document_types import Document

__all__ = ["ADAPTED", "LOCO_ADAPTED", "CURVE_PAGES", "CURVE_SEED", "curve_weights",
           "curve_pages", "adapt_curve", "recovery_share", "label_quality", "labels_figure",
           "moved_question", "RECEIPT_FAMILIES", "FIT_PAGES", "pseudo_documents", "fit_pages",
           "fit_real_glance", "main"]

#: the committed localiser adapted to the 649 unlabelled WildReceipt photographs
#: (``python -m fovea_core adapt data/external/wildreceipt-unlabelled/img --out
#: data/models/gist_localiser_wildreceipt.pt``)
ADAPTED = "data/models/gist_localiser_wildreceipt.pt"
#: each localiser trained with one real collection left out, adapted to the *images* of that
#: collection's training folder (its labels never read): ``{left-out dataset: weights}``,
#: made by ``python -m fovea_core adapt data/external/sroie-train/img --start
#: data/models/gist_localiser_no_sroie.pt --out data/models/gist_localiser_no_sroie_adapted.pt``
#: (and ``funsd-train/images`` from ``gist_localiser_no_funsd.pt``)
LOCO_ADAPTED = {"sroie": "data/models/gist_localiser_no_sroie_adapted.pt",
                "funsd": "data/models/gist_localiser_no_funsd_adapted.pt"}
#: the learning curve's numbers of unlabelled pages (the whole folder is :data:`ADAPTED`)
CURVE_PAGES = (25, 50, 100, 200)
#: the seed of the curve's page order (:func:`curve_pages`)
CURVE_SEED = 0


def curve_weights(n: int) -> str:
    """The learning curve's weights adapted to ``n`` pages (a path relative to the project
    root; its record beside it)."""
    return f"data/models/adapt_curve/gist_localiser_wildreceipt_{int(n)}.pt"


def curve_pages(folder: str | Path, n: int, *, seed: int = CURVE_SEED) -> list[Path]:
    """The first ``n`` pages of ``folder`` (:func:`fovea_core.adaptation.list_pages`) in one
    random order fixed by ``seed``: nested, so the run on 50 pages saw the 25 of the run
    on 25. ``ValueError`` when ``n`` is not in ``[1, pages in the folder]``."""
    from fovea_core.adaptation import list_pages

    files = list_pages(folder)
    if not 1 <= int(n) <= len(files):
        raise ValueError(f"n must be in [1, {len(files)}] (the pages of {folder}), got {n}")
    order = np.random.default_rng(seed).permutation(len(files))
    return [files[i] for i in order[:int(n)]]


def adapt_curve(folder: str | Path, sizes: Sequence[int] = CURVE_PAGES, *,
                root: str | Path | None = None, force: bool = False) -> list[dict]:
    """Adapt the committed localiser to each :func:`curve_pages` subset of ``folder``
    (:func:`fovea_core.adapt` with its defaults) and write :func:`curve_weights` under
    ``root`` (default the project root); weights already there are kept unless ``force``.
    Returns the records, in ``sizes``' order. The OCR cache makes the pages read by an
    earlier run (or by the run on the whole folder) free."""
    from fovea_core.adaptation import adapt
    from fovea_book.paths import project_root

    base = Path(root) if root is not None else project_root()
    out = []
    for n in sizes:
        path = base / curve_weights(n)
        if path.is_file() and not force:
            out.append(json.loads(path.with_suffix(".json").read_text()))
            continue
        out.append(adapt(curve_pages(folder, n), out=path))
    return out


def recovery_share(table: pd.DataFrame, adapted: str, supervised: str, *,
                   baseline: str = "resize", n_boot: int = 2000, seed: int = 0) -> dict:
    """The share of ``supervised``'s gain over ``baseline`` that ``adapted`` keeps:
    ``(sum adapted - sum baseline) / (sum supervised - sum baseline)`` of the documents' mean
    ANLS (a document's questions averaged first; the rows of one dataset), with a
    percentile bootstrap CI over documents resampled in pairs.

    Returns ``{"share", "lo", "hi", "n_docs", "gain_supervised", "gain_adapted"}`` (gains as
    *kept* differences: over the ceiling's summed ANLS). A supervised gain whose CI holds 0
    makes the share's CI wide or infinite: the caller shows the gains beside it.
    ``ValueError`` when a method has no rows.
    """
    from fovea_book.eval.metrics import bootstrap_ci

    methods = [adapted, supervised, baseline]
    missing = [m for m in methods if m not in set(table.allocator)]
    if missing:
        raise ValueError(f"recovery_share: no rows of {missing} (methods: "
                         f"{sorted(set(table.allocator))})")
    per = (table[table.allocator.isin(methods)]
           .groupby(["doc_id", "allocator"]).agg(anls=("anls", "mean"), ceil=("ceiling_anls", "mean"))
           .unstack("allocator").dropna())
    arr = np.stack([per[("anls", m)] for m in methods] + [per[("ceil", adapted)]], 1)

    def share(x: np.ndarray) -> np.ndarray:          # [R, n, 4] -> [R]
        s = x.sum(-2)
        with np.errstate(divide="ignore", invalid="ignore"):
            return (s[..., 0] - s[..., 2]) / (s[..., 1] - s[..., 2])

    est, lo, hi = bootstrap_ci(arr, n_boot=n_boot, seed=seed, stat=share)
    ceil = max(arr[:, 3].sum(), 1e-12)
    return dict(share=float(est), lo=float(lo), hi=float(hi), n_docs=len(arr),
                gain_supervised=float((arr[:, 1].sum() - arr[:, 2].sum()) / ceil),
                gain_adapted=float((arr[:, 0].sum() - arr[:, 2].sum()) / ceil))


def label_quality(record: dict) -> pd.DataFrame:
    """The pseudo-labeller's quality on the labelled training pages at the threshold each
    family keeps (``python -m fovea_book.eval.pseudo_labels --record``'s record): rows
    ``family, threshold, kept, precision, recall, verdict`` (``verdict``: precision at
    least the record's target, ``"met"``/``"not met"``; a family with no threshold kept
    is ``"not met"`` with NaN numbers)."""
    t = pd.DataFrame(record["table"])
    rows = []
    for fam, thr in record["thresholds"].items():
        at = t[(t.family == fam) & np.isclose(t.threshold, thr if thr is not None else -1)]
        if thr is None or at.empty:
            rows.append(dict(family=fam, threshold=np.nan, kept=0, precision=np.nan,
                             recall=np.nan, verdict="not met"))
            continue
        r = at.iloc[0]
        rows.append(dict(family=fam, threshold=float(thr), kept=int(r["kept"]),
                         precision=float(r["precision"]), recall=float(r["recall"]),
                         verdict="met" if r["precision"] >= record["target"] else "not met"))
    return pd.DataFrame(rows)


#: each pseudo-label family's colour in :func:`labels_figure`
FAMILY_COLOURS = {"company": "tab:blue", "date": "tab:orange", "total": "tab:red",
                  "form": "tab:purple"}


def labels_figure(image: np.ndarray, labels: Sequence[dict], *, title: str = "",
                  width: float = 4.2):
    """One page with its pseudo-labels (``labels``: the adaptation record's ``labels`` of
    that page, ``{"family", "box", "confidence", ...}``) outlined in their family's colour
    and named with their confidence. ``image``: ``[H, W]`` or ``[H, W, 3]``."""
    import matplotlib.pyplot as plt

    h, w = image.shape[:2]
    fig, ax = plt.subplots(figsize=(width, width * h / w + 0.4), layout="constrained")
    ax.imshow(image, cmap="gray" if image.ndim == 2 else None)
    for lab in labels:
        x0, y0, x1, y1 = lab["box"]
        c = FAMILY_COLOURS.get(lab["family"], "k")
        ax.add_patch(plt.Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, ec=c, lw=1.5))
        ax.text(x0, y0 - 4, f"{lab['family']} {lab['confidence']:.2f}", color=c, fontsize=7,
                va="bottom", bbox=dict(fc="white", ec="none", alpha=0.7, pad=0.5))
    ax.set_title(title, fontsize=9)
    ax.set_axis_off()
    return fig


def moved_question(table: pd.DataFrame, before: str, after: str) -> dict:
    """The question whose answer's share inside the fovea (``fovea_share``) grew most from
    method ``before`` to ``after`` (rows of one evaluation): ``{"dataset", "doc_id",
    "qid", "before", "after"}`` (the two shares). ``ValueError`` when the two methods
    share no question."""
    key = ["dataset", "doc_id", "qid"]
    a = table[table.allocator == before].groupby(key).fovea_share.mean()
    b = table[table.allocator == after].groupby(key).fovea_share.mean()
    both = a.index.intersection(b.index)
    if both.empty:
        raise ValueError(f"moved_question: {before!r} and {after!r} share no question")
    at = (b.loc[both] - a.loc[both]).idxmax()
    return dict(zip(key, at), before=float(a.loc[at]), after=float(b.loc[at]))


#: the receipt families a photograph's pseudo-documents ask (the book's receipt questions)
RECEIPT_FAMILIES = ("company", "date", "total")
#: unlabelled photographs the default's path is fitted on (:func:`fit_pages`)
FIT_PAGES = 40


def pseudo_documents(files: Sequence[str | Path], *, families: Sequence[str] = RECEIPT_FAMILIES,
                     source: str = "pseudo", variant: str = "real") -> list[Document]:
    """Documents made of unlabelled pages and their pseudo-labels: for each page of ``files``
    the labels of ``families`` the labeller keeps
    (:func:`~fovea_core.cascade.pseudo_labels.page_labels`, its OCR cached on disk) as
    questions, each answered by the text read in its box at full resolution
    (:attr:`~fovea_core.cascade.pseudo_labels.PseudoLabel.answer`). Kept is the share of
    the full page's reading a method keeps, so these pages score a method as the book's
    labelled pages do, without anyone's labels (the reading's own mistakes are the
    answer). Ids ``"<source><stem>-<variant>@1"`` (the fits' variant column); pages with
    no label are left out."""
    import cv2

    from fovea_core.cascade.pseudo_labels import page_labels
    from fovea_core.foveation import load_image
    from fovea_book.eval.document_types import Question

    docs = []
    for path in map(Path, files):                            # tens of pages, read once each
        labels = [p for p in page_labels(load_image(path)) if p.family in families and p.answer]
        if not labels:
            continue
        image = cv2.cvtColor(cv2.imread(str(path), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION),
                             cv2.COLOR_BGR2RGB)
        qs = tuple(Question(p.family, p.question, (p.answer,),
                            (tuple(int(round(v)) for v in p.box),), p.family) for p in labels)
        docs.append(Document(f"{source}{path.stem}-{variant}@1", image, qs, (), source))
    return docs


def fit_pages(folder: str | Path, n: int = FIT_PAGES) -> list[Path]:
    """The ``n`` unlabelled pages of ``folder`` the default's path is fitted on: pages of the
    adaptation's validation split (``crc32(name) % 5 == 0``,
    :func:`fovea_core.adaptation.page_split`: never trained on by the adapted localiser,
    never seen by the committed one), first by name."""
    from fovea_core.adaptation import list_pages, page_split

    return [p for p in list_pages(folder) if page_split(p.name) == "validation"][:n]


def fit_real_glance(folder: str | Path, *, localiser: str | None = None, n: int = FIT_PAGES,
                    out: str | Path | None = None, workers: int | None = None) -> dict:
    """Fit the default's path (:mod:`fovea_book.eval.glance_rule`: glance first with a share
    of N when the map's confidence is below a threshold) on real photographs: the
    :func:`pseudo_documents` of :func:`fit_pages`, read by ``resize`` and the glance fit's
    methods with the committed localiser or ``localiser`` (weights), rapidocr at N = 273;
    the objective is the glance fit's, with the photographs as its one variant. Writes the
    record (default ``data/models/glance_rule_real[_<weights>].json``) and returns it."""
    import time

    from fovea_book.eval.cascade import Method
    from fovea_book.eval.fitting import (fit_provenance, localiser_record, models_record_path,
                                         read_variants, weights_record, with_localiser,
                                         write_fit_record)
    from fovea_book.eval.glance_rule import (GLANCE_SHARES, THRESHOLDS, choose_rule,
                                             glance_curve, glance_methods)
    from fovea_book.eval.unseen import WeightsLocaliser

    t0 = time.perf_counter()
    loc = "learned" if localiser is None else WeightsLocaliser(localiser)
    record = localiser_record() if localiser is None else weights_record(localiser)
    docs = pseudo_documents(fit_pages(folder, n))
    if not docs:
        raise ValueError(f"folder {folder}: no page with a pseudo-label to fit on")
    sets = {"photographs": docs}
    table = read_variants(sets, [Method("resize", "resize", scorer="none", query_aware=False),
                                 *glance_methods(loc)], workers)
    curve = glance_curve(table, GLANCE_SHARES)
    chosen = choose_rule(curve)
    means = table.groupby("allocator").anls.mean()
    rec = dict(rule="the glance rule's (fovea_book.eval.glance_rule), fitted on real "
                    "photographs and their pseudo-labels",
               chosen=chosen, glance_share=chosen["share"], glance_below=chosen["threshold"],
               localiser="learned" if localiser is None else localiser,
               shares=list(GLANCE_SHARES), thresholds=list(THRESHOLDS),
               questions=int(sum(len(d.questions) for d in docs)),
               curve=curve.astype(object).where(curve.notna(), None).to_dict("list"),
               resize=curve.attrs["resize"], anls=means.to_dict(),
               **fit_provenance(record, sets, t0))
    path = Path(out) if out is not None else with_localiser(
        models_record_path("glance_rule_real"), localiser)
    write_fit_record(rec, path)
    return rec


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fovea_book.eval.adapting curve|fit [PAGES_DIR]``: the learning curve's
    runs, or the default's path fitted on real photographs."""
    from fovea_book.paths import dataset_path

    p = argparse.ArgumentParser(prog="python -m fovea_book.eval.adapting",
                                description=main.__doc__)
    p.add_argument("what", choices=["curve", "fit"],
                   help="curve: the learning curve's runs; fit: the default's path fitted on "
                        "real photographs (with --localiser: with those weights)")
    p.add_argument("pages", nargs="?", default=None,
                   help="the unlabelled pages (default: wildreceipt-unlabelled/img of the data root)")
    p.add_argument("--force", action="store_true", help="adapt again where weights exist")
    p.add_argument("--localiser", default=None, metavar="WEIGHTS",
                   help="fit: the localiser's weights (default: the committed localiser)")
    args = p.parse_args(argv)
    folder = Path(args.pages) if args.pages else dataset_path("wildreceipt-unlabelled") / "img"
    if args.what == "fit":
        rec = fit_real_glance(folder, localiser=args.localiser)
        print(f"chosen: {rec['chosen']} ({rec['questions']} questions, {rec['seconds']:.0f} s)")
        return 0
    for n, rec in zip(CURVE_PAGES, adapt_curve(folder, force=args.force)):
        v = rec["validation"]
        print(f"{n} pages: {rec['labels']['train']} labels; validation hit mass "
              f"{v['before']['hit_mass']:.3f} -> {v['after']['hit_mass']:.3f}; "
              f"{rec['seconds']['total']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
