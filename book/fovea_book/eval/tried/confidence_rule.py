"""When is the localiser's map too unsure to follow? A rule fitted on photograph-like
training pages: spend the budget like ``resize`` when the map's confidence is below ``c``.

The page-size rule (:mod:`fovea_book.eval.tried.resize_rule`) asks whether a page is small
enough for ``resize``; this one asks whether the map knows where to look:
:func:`~fovea_core.cascade.allocator.map_confidence` (the share of the map's mass on its
top 5 % of cells), below ``c`` -> the cascade spends its N tokens as ``resize`` does
(:func:`~fovea_core.cascade.allocator.cascade_parts`' ``resize_below``). The map is the
localiser's, computed from the gist inside N, so the rule keeps the cascade budgeted.

**Fitted on training pages only** (``../shared/PROTOCOL.md``): the pages of
:func:`~fovea_book.eval.fitting.unseen_training_pages` (receipts and forms the
localiser never trained on, synthetic validation pages), each made photograph-like in the
ways chapter 14.8 found to break the map
(:func:`~fovea_book.eval.fitting.photo_variants`: as scanned, lying on a table, and
photographed -- on a table, in perspective, turned, under uneven light) at the page-size
rule's scales as JPEG. ``resize`` and each cascade of :data:`BASES` read every
page with the book's reader (rapidocr); per base, the threshold among :data:`CONFIDENCES`
with the highest mean over pages of the rule's ANLS is chosen (ties to the smaller: the
cascade unless the data say otherwise). No dev page and no WildReceipt page is read.

``python -m fovea_book.eval.tried.confidence_rule [--out PATH] [--data-dir DIR]`` runs the fit
and writes the record (default ``data/models/confidence_rule.json``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from fovea_book.eval.fitting import PHOTO_VARIANTS, photo_variants

__all__ = ["VARIANTS", "CONFIDENCES", "BASES", "confidence_curve",
           "confidence_fit_table", "default_record_path", "read_record", "main"]

#: the photograph-like variants of each training page
#: (:func:`~fovea_book.eval.fitting.photo_variants`)
VARIANTS = PHOTO_VARIANTS
#: candidate thresholds on :func:`~fovea_core.cascade.allocator.map_confidence` (0 = never)
CONFIDENCES = (0.0, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95)
#: the cascades the rule is fitted for: ``{label: localiser}``
BASES = {"cascade | learned": "learned", "cascade | on the sheet": "learned_paper"}
#: training pages read (the localiser's unseen receipts, first by crc32 of their id; forms;
#: synthetic validation pages)
RECEIPTS, FORMS, SYNTHETIC = 24, 6, 6


def confidence_curve(table: pd.DataFrame, base: str,
                     thresholds: Sequence[float] = CONFIDENCES, *,
                     resize: str = "resize") -> pd.DataFrame:
    """The rule's mean ANLS at each threshold, for the cascade ``base``.

    ``table``: evaluator rows (``dataset``, ``doc_id``, ``qid``, ``allocator``, ``anls``;
    ``base``'s rows with ``map_confidence``) with ``base`` and ``resize``. Each question is
    read by ``resize`` when its map's confidence is below the threshold, else by ``base``;
    questions are averaged within a document, documents over all. One row per threshold:
    ``threshold``, ``anls``, ``resized`` (the share of questions sent to ``resize``) and
    ``n_docs``."""
    keys = ["dataset", "doc_id", "qid"]
    b = table[table.allocator == base].set_index(keys)
    r = table[table.allocator == resize].set_index(keys)
    if b.empty or r.empty:
        raise ValueError(f"table has no rows of {base!r} or {resize!r}")
    both = b[["anls", "map_confidence"]].join(r.anls.rename("resize"), how="inner")
    conf = both.map_confidence.to_numpy()                                    # [Q]
    t = np.asarray(thresholds, dtype=float)                                  # [T]
    use = conf[None, :] < t[:, None]                                         # [T, Q]
    anls = np.where(use, both.resize.to_numpy()[None], both.anls.to_numpy()[None])
    docs = both.index.droplevel("qid")
    per_doc = pd.DataFrame(anls.T, index=docs).groupby(level=[0, 1]).mean()  # [D, T]
    return pd.DataFrame(dict(threshold=t, anls=per_doc.mean().to_numpy(),
                             resized=use.mean(1), n_docs=len(per_doc)))


def confidence_fit_table(record: Mapping) -> tuple[pd.DataFrame, str]:
    """The fit's record (:func:`main`) as ``(table, sentence)``.

    ``table``: one row per threshold, per base of :data:`BASES` the rule's mean ANLS (in
    points) and the share of questions it sends to ``resize`` (%), the chosen threshold
    marked. ``sentence``: per base, the chosen threshold, the rule's mean ANLS against the
    base alone and, per variant (:data:`VARIANTS`), what the rule changes (points; tuning
    numbers on training pages, no CI)."""
    fits = record["fits"]
    thresholds = record["thresholds"]
    table = pd.DataFrame({"threshold": thresholds})
    parts = []
    for label, fit in fits.items():
        name = label.split(" | ")[1]
        who = {"learned": "the learned cascade"}.get(name, f"the cascade {name}")
        c = pd.DataFrame(fit["curve"])
        chosen = fit["resize_below"]
        table[f"{name}: ANLS"] = (100 * c.anls).round(1)
        table[f"{name}: to resize (%)"] = (100 * c.resized).round(0).astype(int)
        table[f"{name}: chosen"] = np.where(np.isclose(c.threshold, chosen), "<-", "")
        i = int(np.flatnonzero(np.isclose(c.threshold, chosen))[0])
        if chosen == 0:
            parts.append(f"for {who} the fit chose 0 (never resize): every "
                         f"threshold reads less ({100 * c.anls[0]:.1f} at 0)")
            continue
        edge = " (the largest threshold tried)" if chosen == max(thresholds) else ""
        by = fit["by_variant"]
        change = ", ".join(f"{v} {100 * (by[v][i] - by[v][0]):+.1f}" for v in record["variants"])
        parts.append(f"for {who} the fit chose {chosen:g}{edge}, sending "
                     f"{100 * c.resized[i]:.0f} % of the questions to resize: "
                     f"{100 * c.anls[i]:.1f} against {100 * c.anls[0]:.1f} without the rule "
                     f"(by variant, in points: {change})")
    return table, "; ".join(parts)[0].upper() + "; ".join(parts)[1:]


def default_record_path() -> Path:
    """``data/models/confidence_rule.json`` of the repository."""
    from fovea_book.eval.fitting import models_record_path

    return models_record_path("tried.confidence_rule")


def read_record(path: str | Path | None = None) -> dict:
    """The fit's record (:func:`main` writes it)."""
    from fovea_book.eval.fitting import read_models_record

    return read_models_record("tried.confidence_rule", path)


def main(argv: Sequence[str] | None = None) -> int:
    """Fit the rule for each base (see the module docstring) and write the record."""
    from fovea_book.eval.cascade import Method, cascade_method
    from fovea_book.eval.tried.resize_rule import fit_threshold
    from fovea_book.eval.fitting import (MIN_RATIO, SCALES, fit_provenance,
                                             read_variants, start_fit, variant_sets,
                                             write_fit_record)
    from fovea_core.cascade.allocator import CONFIDENCE_TOP

    args, record, pages, t0 = start_fit("tried.confidence_rule", __doc__, default_record_path(), argv,
                                        receipts=RECEIPTS, forms=FORMS, synthetic=SYNTHETIC)
    sets = variant_sets(pages, photo_variants)
    methods = [Method("resize", "resize", scorer="none", query_aware=False)]
    methods += [cascade_method(label, loc) for label, loc in BASES.items()]
    table = read_variants(sets, methods, args.workers)
    fits = {}
    for label in BASES:
        curve = confidence_curve(table, label)
        chosen = fit_threshold(curve)
        by_variant = {v: confidence_curve(table[table.variant == v], label).anls.tolist()
                      for v in VARIANTS}
        fits[label] = dict(resize_below=chosen, curve=curve.to_dict("list"),
                           by_variant=by_variant)
        print(label, curve.to_string(index=False), f"resize_below = {chosen:g}", sep="\n")
    means = table.groupby(["variant", "allocator"]).anls.mean().unstack()
    out = dict(
        rule="spend the budget like resize when map_confidence (the map's mass on its top "
             f"{CONFIDENCE_TOP:g} of cells) < resize_below", fits=fits,
        variants=list(VARIANTS), thresholds=list(CONFIDENCES), budget=273,
        scales=list(SCALES), min_ratio=MIN_RATIO,
        objective="mean over pages of the rule's ANLS (rapidocr); ties to the smaller "
                  "threshold",
        anls_by_variant={v: means.loc[v].to_dict() for v in means.index},
        **fit_provenance(record, sets, t0))
    path = write_fit_record(out, args.out)
    print(means.round(3).to_string())
    print(f"wrote {path} ({out['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
