"""When should read-then-look glance first? A rule fitted on photograph-like training pages.

The read-then-look cascade (:func:`~fovea_core.cascade.reading.cascade_read`) spends
fixation 1 on the gist and a first fovea that the localiser places. On a page unlike the
training pages the localiser's map looks in the wrong place, and fixation 1 reads little.
A *glance* spends fixation 1 on the whole page instead: a gist of ``round(share * N)``
tokens, a ``resize`` of the page at that share of N, read before the rest of N goes where
the answer was read (VisionThink's "downsampled image first", done inside N). The rule
joins the two: **glance first when the localiser's map on the default gist is unsure**
(:func:`~fovea_core.cascade.allocator.map_confidence` below ``glance_below``), else the
gist and a first fovea as before (``cascade_read``'s ``glance_below`` and
``glance_share``). The default gist is coarser than the glance, so a page that glances
has read nothing its tokens do not carry: the rule stays *budgeted*.

**Fitted on training pages only** (``../shared/PROTOCOL.md``): the pages of
:func:`~fovea_book.eval.fitting.unseen_training_pages` (receipts and forms the
localiser never trained on, synthetic validation pages), each in the variants of
:data:`VARIANTS`: the three of :func:`~fovea_book.eval.fitting.photo_variants` (as
scanned, on a table, photographed) and half of the page
(:func:`~fovea_book.eval.photo.half_page`, the one simulated factor with the photographs'
signature in chapter 14.5: text tall against the frame), each at the page-size rule's
scales as JPEG. ``resize``, the learned cascade (for its map's confidence), read-then-look
and read-then-look with a glance at each share of :data:`GLANCE_SHARES` read every page
with the book's reader (rapidocr). No dev page and no WildReceipt page is read.

**The objective, set before the fit** (chapter 14.5's carry-over target: never worse than
``resize``):
a rule ``(share, threshold)`` is *feasible* when on every variant its mean ANLS (over
documents) is at least ``resize``'s. Among the feasible rules the one with the highest
mean ANLS over all pages is chosen (ties to the smaller threshold, then the smaller share:
the less glancing). When none is feasible, the rule whose worst variant loses least to
``resize`` is chosen and the record says so.

``python -m fovea_book.eval.glance_rule [--out PATH] [--data-dir DIR] [--localiser WEIGHTS]``
runs the fit and writes the record (default ``data/models/glance_rule.json``). With
``--localiser`` (other weights, e.g. chapter 14.5's position-free candidates) the map whose
confidence gates the glance, the first fovea and the fallback are that localiser's, the
training pages are those it never trained on, and the record
(``data/models/glance_rule_<weights>.json``, :func:`default_record_path`) names it.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from fovea_book.eval.document_types import Document

__all__ = ["VARIANTS", "GLANCE_SHARES", "THRESHOLDS", "BUDGET", "READ_LABEL", "CONF_LABEL",
           "glance_label", "glance_variants", "glance_curve", "question_table", "score_rules",
           "choose_rule", "margin_table", "glance_fit_table", "fit_on_variants",
           "ungated_table", "default_record_path", "glance_methods", "read_record", "main"]

#: the variants of each training page (:func:`glance_variants`)
VARIANTS = ("scan", "table", "photo", "half")
#: the glance's candidate shares of N (fixation 1's gist: ``round(share * N)`` tokens)
GLANCE_SHARES = (0.65, 0.8, 0.9)
#: candidate thresholds on the default gist's map confidence (0: never glance; 1: glance
#: unless all of the map's mass lies on its top cells)
THRESHOLDS = (0.0, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0)
#: the read-then-look cascade (fixation 1: the default gist and a first fovea)
READ_LABEL = "read | fovea first"
#: the cascade whose rows carry the default gist's map confidence
CONF_LABEL = "cascade | learned"
#: N of the fit (tokens per page)
BUDGET = 273
#: training pages read (the localiser's unseen receipts, first by crc32 of their id; forms;
#: synthetic validation pages)
RECEIPTS, FORMS, SYNTHETIC = 12, 4, 4


def glance_label(share: float) -> str:
    """The row label of read-then-look with a glance of ``share`` of N."""
    return f"read | glance {share:g} N"


def glance_variants(doc: Document, scales: Sequence[float] | None = None) -> list[Document]:
    """``doc`` in each variant of :data:`VARIANTS` at ``scales`` (default the page-size rule's
    :data:`~fovea_book.eval.fitting.SCALES`) as JPEG: the three of
    :func:`~fovea_book.eval.fitting.photo_variants` and its top or bottom half
    (:func:`~fovea_book.eval.photo.half_page`, drawn by the page's id; the questions whose
    answer is cut off are dropped, and a half with none left is not returned). Ids
    ``"<id>-<variant>@<scale>"``."""
    from dataclasses import replace

    from fovea_book.eval.fitting import photo_variants
    from fovea_book.eval.photo import half_page, photo_like
    from fovea_book.eval.fitting import SCALES

    scales = SCALES if scales is None else scales
    out = photo_variants(doc, scales)
    half = half_page(doc, np.random.default_rng([zlib.crc32(doc.doc_id.encode()), 1]))
    if half.questions:
        out += [photo_like(replace(half, doc_id=f"{doc.doc_id}-half"), s) for s in scales]
    return out


def glance_curve(table: pd.DataFrame, shares: Sequence[float],
                 thresholds: Sequence[float] = THRESHOLDS, *, read: str = READ_LABEL,
                 conf: str = CONF_LABEL, resize: str = "resize") -> pd.DataFrame:
    """The rule's mean ANLS at each ``(share, threshold)``, overall and per variant.

    ``table``: evaluator rows (``dataset``, ``doc_id``, ``qid``, ``allocator``, ``anls``,
    ``variant``; ``conf``'s rows with ``map_confidence``) holding ``resize``, ``read``,
    ``conf`` and :func:`glance_label` of each share. A question is read by the glance when
    its map's confidence is below the threshold, else by ``read``; questions are averaged
    within a document, documents over all (``anls``) and within each variant
    (``anls_<variant>``, and ``margin_<variant>``: minus ``resize``'s mean there).
    ``worst``: the smallest margin; ``feasible``: ``worst >= 0``. One row per pair, with
    ``glanced`` (the share of questions that glance) and ``n_docs``."""
    both = question_table(table, [resize, read, conf, *(glance_label(s) for s in shares)],
                          conf, ["map_confidence"])
    c = both.map_confidence.to_numpy()                                       # [Q]
    t = np.asarray(thresholds, dtype=float)                                  # [T]
    glance = c[None, :] < t[:, None]                                         # [T, Q]
    read_q = both[read].to_numpy()[None]                                      # [1, Q]
    anls = np.concatenate([np.where(glance, both[glance_label(s)].to_numpy()[None], read_q)
                           for s in shares])                                 # [S*T, Q]
    rules = [dict(share=float(s), threshold=float(th), glanced=float(glance[j].mean()))
             for s in shares for j, th in enumerate(t)]
    return score_rules(rules, anls, both, resize)


def question_table(table: pd.DataFrame, labels: Sequence[str], source: str,
                   columns: Sequence[str]) -> pd.DataFrame:
    """One row per question (index ``dataset, doc_id, qid``): the ANLS of each method of
    ``labels`` (a column each; questions some method lacks are dropped), ``columns`` of
    ``source``'s rows (e.g. the cascade's ``map_confidence``) and the ``variant``.
    ``ValueError`` naming the labels ``table`` has no rows of."""
    keys = ["dataset", "doc_id", "qid"]
    missing = [m for m in labels if m not in set(table.allocator)]
    if missing:
        raise ValueError(f"table has no rows of {missing}")
    wide = table.pivot_table(index=keys, columns="allocator", values="anls")
    extra = table[table.allocator == source].set_index(keys)[list(columns)]
    variant = table.drop_duplicates(keys).set_index(keys).variant
    return wide[list(labels)].join(extra).join(variant).dropna(subset=list(labels))


def score_rules(rules: Sequence[Mapping], anls: np.ndarray, both: pd.DataFrame,
                resize: str = "resize") -> pd.DataFrame:
    """Score ``R`` rules on the same questions: ``rules`` (one dict of the rule's columns
    each, e.g. its thresholds) and ``anls`` ``[R, Q]`` (what each rule reads on the
    questions of ``both``, :func:`question_table`'s, with ``resize``'s ANLS). Questions are
    averaged within a document, documents over all (``anls``) and within each variant
    (``anls_<variant>``, and ``margin_<variant>``: minus ``resize``'s mean there). One row
    per rule: its columns, ``anls``, ``n_docs``, the per-variant columns, ``worst`` (the
    smallest margin) and ``feasible`` (``worst >= 0``); ``resize``'s mean per variant in
    ``attrs["resize"]``."""
    docs = both.index.droplevel("qid")
    doc_variant = both.variant.groupby(level=[0, 1]).first()
    res_var = both[resize].groupby(level=[0, 1]).mean().groupby(doc_variant).mean()
    per_doc = pd.DataFrame(np.asarray(anls).T, index=docs).groupby(level=[0, 1]).mean()
    per_var = per_doc.groupby(doc_variant).mean()                            # [V, R]
    out = []
    for j, rule in enumerate(rules):
        row = dict(rule, anls=float(per_doc[j].mean()), n_docs=len(per_doc))
        for v in per_var.index:
            row[f"anls_{v}"] = float(per_var.loc[v, j])
            row[f"margin_{v}"] = float(per_var.loc[v, j] - res_var[v])
        out.append(row)
    curve = pd.DataFrame(out)
    curve["worst"] = curve.filter(like="margin_").min(axis=1)
    curve["feasible"] = curve.worst >= 0
    curve.attrs["resize"] = {v: float(res_var[v]) for v in res_var.index}
    return curve


def choose_rule(curve: pd.DataFrame, *, tol: float = 1e-9,
                order: Sequence[str] = ("threshold", "share")) -> dict:
    """The rule :func:`glance_curve`'s rows choose (the module's objective): among the
    feasible rows the highest ``anls`` (ties within ``tol`` to the smallest values of the
    ``order`` columns, in turn: the smaller threshold, then the smaller share); with none
    feasible, the highest ``worst``. Returns the chosen row as a dict of Python scalars."""
    if curve.empty:
        raise ValueError("empty curve: no rule to choose")
    pool = curve[curve.feasible] if bool(curve.feasible.any()) else curve
    score = pool.anls if bool(curve.feasible.any()) else pool.worst
    best = pool[score >= score.max() - tol].sort_values(list(order)).iloc[0]
    return {k: v.item() if isinstance(v, np.generic) else v for k, v in best.items()}


def margin_table(near: pd.DataFrame, keys: Sequence[str], share: str, share_name: str,
                 variants: Sequence[str], chosen: np.ndarray) -> pd.DataFrame:
    """The rows a fit table shows: ``near`` (rows of :func:`score_rules`' curve) with its
    ``keys`` columns, ``anls`` and each variant's margin over ``resize`` in points, the
    ``share`` column in whole % (renamed ``share_name``) and ``"<-"`` where ``chosen``
    (a boolean per row of ``near``)."""
    cols = {"anls": "ANLS", **{f"margin_{v}": f"{v} - resize" for v in variants}}
    t = near[[*keys, *cols, share]].rename(columns=cols).copy()
    for k in cols.values():
        t[k] = (100 * t[k]).round(1)
    t[share] = (100 * t[share]).round(0).astype(int)
    t = t.rename(columns={share: share_name})
    t["chosen"] = np.where(chosen, "<-", "")
    return t.reset_index(drop=True)


def glance_fit_table(record: Mapping) -> tuple[pd.DataFrame, str]:
    """The fit's record as ``(table, sentence)``: one row per share at the chosen threshold
    and per threshold at the chosen share (mean ANLS and each variant's margin over
    ``resize``, in points; the share of questions that glance, %), the chosen row marked;
    and one sentence saying what was chosen and whether it meets the objective on these
    training pages (tuning numbers, no CI)."""
    c = pd.DataFrame(record["curve"])
    ch = record["chosen"]
    near = c[np.isclose(c.share, ch["share"]) | np.isclose(c.threshold, ch["threshold"])]
    t = margin_table(near, ["share", "threshold"], "glanced", "glance (%)", record["variants"],
                     np.isclose(near.share, ch["share"])
                     & np.isclose(near.threshold, ch["threshold"]))
    worst = min(record["variants"], key=lambda v: ch[f"margin_{v}"])
    if ch["threshold"] == 0:
        what = "never glance (read-then-look as before)"
    elif ch["glanced"] >= 1:
        what = (f"glance at {ch['share']:g} N on every question (no map's confidence on these "
                f"pages reached {ch['threshold']:g})")
    else:
        what = (f"glance at {ch['share']:g} N when the map's confidence is below "
                f"{ch['threshold']:g} ({100 * ch['glanced']:.0f} % of the questions)")
    verdict = ("every variant reads at least as well as `resize`" if ch["feasible"] else
               "no rule tried reads at least as well as `resize` on every variant; this one "
               "loses least")
    sentence = (f"The fit chose to {what}: {verdict} (worst: {worst}, "
                f"{100 * ch[f'margin_{worst}']:+.1f} points; mean ANLS "
                f"{100 * ch['anls']:.1f}; tuning numbers on training pages, no CI)")
    return t, sentence


def ungated_table(record: Mapping) -> tuple[pd.DataFrame, str]:
    """The rules of the fit's record whose path no fitted gate chooses, and the one whose
    worst training variant loses least to ``resize``: ``(table, chosen label)``.

    The candidates are the one-fixation cascade (:data:`CONF_LABEL`), read-then-look from
    the gist and a first fovea (:data:`READ_LABEL`) and a glance on every page at each of
    the record's shares (:func:`glance_label`). Per variant the margin is the candidate's
    mean ANLS over the variant's questions minus ``resize``'s (``anls_by_variant``, in
    points); ``worst`` is the smallest; the chosen row (``chosen``: ``"<-"``) has the
    largest ``worst`` (ties to the first candidate). This is the principle behind
    ``foveate``'s default (chapter 14.5): a gate fitted on simulated photographs did not
    carry over to real ones, so the default's safety may not rest on one.

    Raises:
        ValueError: a candidate or ``resize`` missing from a variant of the record.
    """
    means, variants = record["anls_by_variant"], list(record["variants"])
    cands = [CONF_LABEL, READ_LABEL, *(glance_label(s) for s in record["shares"])]
    missing = sorted({f"{m} on {v}" for v in variants for m in ("resize", *cands)
                      if m not in means.get(v, {})})
    if missing:
        raise ValueError(f"the record lacks {', '.join(missing)} (refit with "
                         f"python -m fovea_book.eval.glance_rule)")
    t = pd.DataFrame([{"method": m, **{f"{v} - resize": 100 * (means[v][m] - means[v]["resize"])
                                       for v in variants}} for m in cands])
    t["worst"] = t[[f"{v} - resize" for v in variants]].min(axis=1)
    best = int(t.worst.to_numpy().argmax())
    t["chosen"] = np.where(np.arange(len(t)) == best, "<-", "")
    return t.round(1), str(t.method.iloc[best])


def default_record_path(localiser: str | None = None) -> Path:
    """``data/models/glance_rule.json`` of the repository; with ``localiser`` (weights, as
    ``--localiser`` takes them) the record of the fit with them
    (:func:`~fovea_book.eval.fitting.with_localiser`)."""
    from fovea_book.eval.fitting import models_record_path, with_localiser

    return with_localiser(models_record_path("glance_rule"), localiser)


def glance_methods(localiser="learned") -> list:
    """The methods the fit reads besides ``resize``, all with ``localiser`` (``"learned"``,
    the committed one, or a :class:`~fovea_book.eval.unseen.WeightsLocaliser`): the cascade
    (its map's confidence, :data:`CONF_LABEL`), read-then-look with the gist and a first
    fovea (:data:`READ_LABEL`) and with a glance at each share of :data:`GLANCE_SHARES`."""
    from fovea_book.eval.cascade import Method, cascade_method

    kw = {} if localiser == "learned" else dict(localiser=localiser)
    return [cascade_method(CONF_LABEL, localiser),
            Method(READ_LABEL, "cascade_read", dict(kw), query_aware=True),
            *(Method(glance_label(s), "cascade_read",
                     dict(gist_budget=int(round(s * BUDGET)), **kw), query_aware=True)
              for s in GLANCE_SHARES)]


def read_record(path: str | Path | None = None) -> dict:
    """The fit's record (:func:`main` writes it)."""
    from fovea_book.eval.fitting import read_models_record

    return read_models_record("glance_rule", path)


def fit_on_variants(module: str, description: str, out_default: Path,
                    argv: Sequence[str] | None, methods: Sequence | Callable, fit) -> int:
    """The body of a fit on the training-page variants of :func:`glance_variants`
    (``python -m fovea_book.eval.<module>``; the glance rule's and the safe rule's).

    Reads ``resize`` and ``methods`` (evaluator methods; or ``methods(localiser)`` giving
    them for a localiser, ``"learned"`` or the ``--localiser`` weights'
    :class:`~fovea_book.eval.unseen.WeightsLocaliser`, which the command line then takes,
    and the record names) on every variant with the book's reader at N = 273
    (:func:`~fovea_book.eval.fitting.read_variants`, after
    :func:`~fovea_book.eval.fitting.start_fit` and
    :func:`~fovea_book.eval.fitting.variant_sets`), then calls ``fit(table)`` for
    ``(curve, chosen, head, objective)``: the curve (a frame whose ``attrs["resize"]`` holds
    ``resize``'s mean per variant), the chosen row, the record's leading fields (the rule,
    the choice, the grid) and the objective's words. Writes the record: ``head``, then the
    fields every such fit shares (budget, scales, objective, curve with NaN as null,
    ``resize``'s and every method's mean per variant, provenance); prints the curve, the
    means and the choice. Returns 0."""
    from fovea_book.eval.cascade import Method
    from fovea_book.eval.fitting import (MIN_RATIO, SCALES, fit_provenance, read_variants,
                                             start_fit, variant_sets, write_fit_record)

    args, record, pages, t0 = start_fit(module, description, out_default, argv,
                                        receipts=RECEIPTS, forms=FORMS, synthetic=SYNTHETIC,
                                        localiser=callable(methods))
    loc = "learned"
    if getattr(args, "localiser", None) is not None:
        from fovea_book.eval.unseen import WeightsLocaliser

        loc = WeightsLocaliser(args.localiser)
    sets = variant_sets(pages, glance_variants)
    table = read_variants(sets, [Method("resize", "resize", scorer="none", query_aware=False),
                                 *(methods(loc) if callable(methods) else methods)],
                          args.workers)
    curve, chosen, head, objective = fit(table)
    means = table.groupby(["variant", "allocator"]).anls.mean().unstack()
    if callable(methods):
        head = dict(head, localiser=loc if loc == "learned" else loc.weights)
    out = dict(**head, budget=BUDGET, scales=list(SCALES), min_ratio=MIN_RATIO,
               objective=objective,
               curve=curve.astype(object).where(curve.notna(), None).to_dict("list"),
               resize_by_variant=curve.attrs["resize"],
               anls_by_variant={v: means.loc[v].to_dict() for v in means.index},
               **fit_provenance(record, sets, t0))
    path = write_fit_record(out, args.out)
    print(curve.round(3).to_string(index=False))
    print(means.round(3).to_string())
    print(f"chosen: {chosen}; wrote {path} ({out['seconds']:.0f} s)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Fit the rule (see the module docstring) and write the record."""
    from fovea_core.cascade.allocator import CONFIDENCE_TOP

    def fit(table: pd.DataFrame):
        curve = glance_curve(table, GLANCE_SHARES)
        chosen = choose_rule(curve)
        head = dict(
            rule=f"glance first (a gist of round(share * N) tokens) when map_confidence (the "
                 f"default gist's map's mass on its top {CONFIDENCE_TOP:g} of cells) < "
                 "threshold",
            chosen=chosen, glance_share=chosen["share"],
            glance_below=chosen["threshold"], variants=list(VARIANTS),
            shares=list(GLANCE_SHARES), thresholds=list(THRESHOLDS))
        return curve, chosen, head, (
            "feasible: every variant's mean ANLS (rapidocr, over documents) >= resize's; "
            "among those the highest mean ANLS over all pages (ties to the smaller "
            "threshold, then share); none feasible: the highest worst margin")

    return fit_on_variants("glance_rule", __doc__, default_record_path(), argv, glance_methods,
                           fit)


if __name__ == "__main__":
    raise SystemExit(main())
