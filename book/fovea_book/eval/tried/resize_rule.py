"""When should the cascade spend its budget like ``resize``? A rule fitted on training pages.

The cascade wins where a page is large for its budget: ``resize`` then reads the text too
small and the fovea zooms in. On a page whose native patch grid is only a few times N,
``resize`` already reads near native resolution, and a fovea that looks in the wrong place
loses what the resize would have read. The rule: spend the budget like ``resize`` when the
page's level-0 grid holds at most ``resize_within * N`` cells
(:func:`fovea_core.cascade.allocator.cascade_parts`' ``resize_within``).

**Fitted on training pages only** (``../shared/PROTOCOL.md``): the pages of ``sroie-train``
and ``funsd-train`` the localiser was not trained on (its record's held-out fifth and pages
added to the folders since; :func:`~fovea_book.eval.fitting.unseen_training_pages`) and
synthetic validation pages (seeds from :data:`fovea_book.train.VALID_SEED`), each at the
scales :data:`~fovea_book.eval.fitting.SCALES` and re-encoded as JPEG
(:func:`~fovea_book.eval.photo.photo_like`: a smaller, compressed page, as a phone photograph
of the same receipt would be), so that the fit sees pages from a few to tens of times N.
Both ``resize`` and the learned cascade read every page with the book's reader; the chosen
threshold (:func:`fit_threshold`) maximises the mean over pages of the rule's ANLS among
:data:`THRESHOLDS` (ties go to the smaller threshold: the cascade unless the data say
otherwise). No dev page is read.

``python -m fovea_book.eval.tried.resize_rule [--out PATH] [--data-dir DIR]`` runs the fit
and writes the record (default ``data/models/resize_rule.json``): the pages, the scales, the
curve (rule ANLS against threshold) and the chosen value, with the commit and versions.
The record of this repository's fit chose 0 (never resize): on the training pages the
cascade reads at least as well as ``resize`` at every page size; the appendix chapter 97
shows the curve. ``resize_within`` therefore stays an option of the cascade, not a registered method.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from fovea_book.eval.fitting import (MIN_RATIO, SCALES, fit_provenance, grid_ratio,
                                     models_record_path, read_models_record, smallest_best,
                                     start_fit, variant_sets, write_fit_record)
from fovea_book.eval.photo import JPEG_QUALITY, photo_like

__all__ = ["THRESHOLDS", "rule_curve", "fit_threshold", "default_record_path",
           "read_record", "main"]

#: candidate thresholds (multiples of N; 0 = never resize, the plain cascade)
THRESHOLDS = (0.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)


def rule_curve(table: pd.DataFrame, ratios: Mapping[str, float],
               thresholds: Sequence[float] = THRESHOLDS, *, cascade: str = "cascade | learned",
               resize: str = "resize") -> pd.DataFrame:
    """Mean over documents of the rule's ANLS at each threshold.

    ``table``: evaluator rows (``doc_id``, ``qid``, ``allocator``, ``anls``) with both
    ``cascade`` and ``resize``; ``ratios``: ``{doc_id: grid_ratio}``. The rule reads a
    document with ``resize`` when its ratio is ``<= threshold``, else with the cascade.
    Returns one row per threshold: ``threshold``, ``anls`` (the rule), ``resized`` (share of
    documents sent to ``resize``) and ``n_docs``; ``attrs["cascade"]`` and
    ``attrs["resize"]`` hold the two methods' own means."""
    per_doc = (table[table.allocator.isin([cascade, resize])]
               .groupby(["doc_id", "allocator"]).anls.mean().unstack())
    missing = {cascade, resize} - set(per_doc.columns)
    if missing:
        raise ValueError(f"table has no rows of {sorted(missing)}")
    per_doc = per_doc.dropna()
    unknown = set(per_doc.index) - set(ratios)
    if unknown:
        raise ValueError(f"no grid ratio for {len(unknown)} documents, e.g. {sorted(unknown)[:3]}")
    r = np.array([ratios[d] for d in per_doc.index])                         # [D]
    t = np.asarray(thresholds, dtype=float)                                  # [T]
    use_resize = r[None, :] <= t[:, None]                                    # [T, D]
    rule = np.where(use_resize, per_doc[resize].to_numpy()[None], per_doc[cascade].to_numpy()[None])
    out = pd.DataFrame(dict(threshold=t, anls=rule.mean(1), resized=use_resize.mean(1),
                            n_docs=len(per_doc)))
    out.attrs.update(cascade=float(per_doc[cascade].mean()), resize=float(per_doc[resize].mean()))
    return out


def fit_threshold(curve: pd.DataFrame, *, tol: float = 1e-9) -> float:
    """The threshold of ``curve`` (:func:`rule_curve`) with the highest rule ANLS; among
    thresholds within ``tol`` of it, the smallest (the cascade unless the data say
    otherwise)."""
    if curve.empty:
        raise ValueError("empty curve: no document to fit on")
    return smallest_best(curve.threshold, curve.anls, tol=tol)


def default_record_path() -> Path:
    """``data/models/resize_rule.json`` of the repository."""
    return models_record_path("tried.resize_rule")


def read_record(path: str | Path | None = None) -> dict:
    """The fit's record (:func:`main` writes it)."""
    return read_models_record("tried.resize_rule", path)


def main(argv: Sequence[str] | None = None) -> int:
    """Fit the rule (see the module docstring) and write its record."""
    from fovea_book.eval.cascade import Method, cascade_method, evaluate
    from fovea_book.eval.reader import Reader

    args, record, pages, t0 = start_fit("tried.resize_rule", __doc__, default_record_path(),
                                        argv)
    sets = variant_sets(pages, lambda d: [photo_like(d, s) for s in SCALES])
    methods = [Method("resize", "resize", scorer="none", query_aware=False),
               cascade_method("cascade | learned", "learned")]
    table = evaluate(sets, methods, 273, reader=Reader(), workers=args.workers, progress=True)
    ratios = {d.doc_id: grid_ratio(d) for docs in sets.values() for d in docs}
    curve = rule_curve(table, ratios)
    chosen = fit_threshold(curve)
    by_set = {name: rule_curve(table[table.dataset == name], ratios).to_dict("list")
              for name in sets}
    out = dict(
        rule="spend the budget like resize when the level-0 grid holds <= resize_within * N "
             "cells",
        resize_within=chosen, budget=273, scales=list(SCALES), jpeg_quality=JPEG_QUALITY,
        min_ratio=MIN_RATIO, thresholds=list(THRESHOLDS), objective="mean over pages of "
        "the rule's ANLS (rapidocr); ties to the smaller threshold",
        curve=curve.to_dict("list"), cascade_anls=curve.attrs["cascade"],
        resize_anls=curve.attrs["resize"], by_set=by_set,
        **fit_provenance(record, sets, t0))
    path = write_fit_record(out, args.out)
    print(curve.to_string(index=False))
    print(f"resize_within = {chosen:g} (wrote {path}, {out['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
