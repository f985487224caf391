"""When should the one-fixation cascade spend its budget like ``resize``? A rule fitted on
photograph-like training pages, with the objective "never below ``resize``".

The confidence rule (:mod:`fovea_book.eval.confidence_rule`) sends an image to ``resize``
when its localiser's map is unsure; fitted for the best mean, it still lost to ``resize`` on
pages lying on a table, where the map is sure and wrong. This rule adds a second reason
to spend like ``resize``: **the page's text is large enough for a resize to read**. A fovea
pays where text is too small for the resize's view; where the resize already reads it, the
fovea's tokens only take resolution from the rest of the page.
:func:`~fovea_core.cascade.allocator.page_legibility` measures it from the gist (the learned
size head's median text height over the page, read at ``resize``'s level at N, in octaves
from ``legible_px``). An image is given ``resize``'s tokens when

    map_confidence < resize_below   or   page_legibility >= -resize_legible

(:func:`~fovea_core.cascade.allocator.cascade_parts`' two options). Both read only the
gist, inside N: the rule keeps the cascade *budgeted*, at the cascade's cost (milliseconds;
no reading step).

**Fitted on training pages only** (``../shared/PROTOCOL.md``): the pages and variants of
the glance rule (:func:`~fovea_book.eval.glance_rule.glance_variants`: as scanned, on a
table, photographed, half of the page; at the page-size rule's scales as JPEG), read by
``resize`` and the learned cascade with the book's reader (rapidocr). No dev page and no
WildReceipt page is read.

**The objective, set before the fit** (the glance rule's, chapter 14.5's carry-over
target): a pair ``(resize_below, resize_legible)`` is *feasible* when on every variant its
mean ANLS (over documents) is at least ``resize``'s. Among the feasible pairs the one with
the highest mean ANLS over all pages is chosen (ties to the fewer questions resized); when
none is feasible, the pair whose worst variant loses least (the record says so).

``python -m fovea_book.eval.tried.safe_rule [--out PATH] [--data-dir DIR]`` runs the fit and
writes the record (default ``data/models/safe_rule.json``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["CONFIDENCES", "LEGIBLES", "BASE", "safe_curve", "choose_safe", "safe_fit_table",
           "switch_summary", "switch_sentence", "default_record_path", "read_record", "main"]

#: candidate ``resize_below`` thresholds on the map's confidence (0: never)
CONFIDENCES = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95)
#: candidate ``resize_legible`` values, octaves below ``legible_px`` (``None``: never)
LEGIBLES = (None, 0.0, 0.5, 1.0, 1.25, 1.5, 1.75, 2.0)
#: the cascade the rule switches (its rows carry the map's confidence and the legibility)
BASE = "cascade | learned"


def safe_curve(table: pd.DataFrame, confidences: Sequence[float] = CONFIDENCES,
               legibles: Sequence[float | None] = LEGIBLES, *, base: str = BASE,
               resize: str = "resize") -> pd.DataFrame:
    """The rule's mean ANLS at each ``(resize_below, resize_legible)`` pair, overall and per
    variant.

    ``table``: evaluator rows (``dataset``, ``doc_id``, ``qid``, ``allocator``, ``anls``,
    ``variant``; ``base``'s rows with ``map_confidence`` and ``page_legibility``) holding
    ``resize`` and ``base``. A question is read by ``resize`` when its map's confidence is
    below ``resize_below`` or its page's legibility is at least ``-resize_legible``
    (``None``: never), else by ``base``. One row per pair: ``resize_below``,
    ``resize_legible`` (NaN for ``None``), ``resized`` (the share of questions sent to
    ``resize``) and the columns of :func:`~fovea_book.eval.glance_rule.rule_scores`, with
    ``worst`` and ``feasible`` (:func:`~fovea_book.eval.glance_rule.finish_curve`)."""
    from fovea_book.eval.glance_rule import question_table, score_rules

    both = question_table(table, [resize, base], base, ["map_confidence", "page_legibility"])
    c = both.map_confidence.to_numpy()                                       # [Q]
    leg = both.page_legibility.to_numpy()                                    # [Q]
    pairs = [(float(b), lg) for b in confidences for lg in legibles]
    never = np.zeros(len(c), dtype=bool)
    switch = np.stack([(c < b) | (never if lg is None else leg >= -float(lg))
                       for b, lg in pairs])                                  # [R, Q]
    anls = np.where(switch, both[resize].to_numpy()[None], both[base].to_numpy()[None])
    rules = [dict(resize_below=b, resize_legible=np.nan if lg is None else float(lg),
                  resized=float(sw.mean())) for (b, lg), sw in zip(pairs, switch)]
    return score_rules(rules, anls, both, resize)


def choose_safe(curve: pd.DataFrame, *, tol: float = 1e-9) -> dict:
    """The pair :func:`safe_curve`'s rows choose (the module's objective; ties to the fewer
    questions resized, then the smaller ``resize_below``). Returns the chosen row as a dict
    (``resize_legible`` ``None``: never)."""
    from fovea_book.eval.glance_rule import choose_rule

    best = choose_rule(curve.fillna({"resize_legible": -np.inf}), tol=tol,
                       order=("resized", "resize_below", "resize_legible"))
    if not np.isfinite(best["resize_legible"]):
        best["resize_legible"] = None
    return best


def safe_fit_table(record: Mapping) -> tuple[pd.DataFrame, str]:
    """The fit's record as ``(table, sentence)``: the rows of the chosen ``resize_below``
    and of the chosen ``resize_legible`` (mean ANLS and each variant's margin over
    ``resize``, in points; the share of questions resized, %), the chosen row marked; and
    one sentence saying what was chosen and whether it meets the objective on these training
    pages (tuning numbers, no CI)."""
    from fovea_book.eval.glance_rule import margin_table

    c = pd.DataFrame(record["curve"])
    ch = record["chosen"]
    leg = np.nan if ch["resize_legible"] is None else ch["resize_legible"]
    same_leg = c.resize_legible.isna() if np.isnan(leg) else np.isclose(c.resize_legible, leg)
    same_below = np.isclose(c.resize_below, ch["resize_below"])
    near = c[same_leg | same_below]
    t = margin_table(near, ["resize_below", "resize_legible"], "resized", "resized (%)",
                     record["variants"], (same_leg & same_below)[near.index])
    t["resize_legible"] = t.resize_legible.map(lambda x: "never" if pd.isna(x) else f"{x:g}")
    worst = min(record["variants"], key=lambda v: ch[f"margin_{v}"])
    legible = ("never for legibility" if ch["resize_legible"] is None else
               f"when the page's text is at most {ch['resize_legible']:g} "
               f"octave{'' if ch['resize_legible'] == 1 else 's'} below legible in "
               "resize's view")
    verdict = ("every variant reads at least as well as `resize`" if ch["feasible"] else
               "no pair tried reads at least as well as `resize` on every variant; this one "
               "loses least")
    sentence = (f"The fit chose to spend like `resize` when the map's confidence is below "
                f"{ch['resize_below']:g} or {legible} ({100 * ch['resized']:.0f} % of the "
                f"questions): {verdict} (worst: {worst}, {100 * ch[f'margin_{worst}']:+.1f} "
                f"points; mean ANLS {100 * ch['anls']:.1f}; tuning numbers on training pages, "
                "no CI)")
    return t, sentence


def switch_summary(table: pd.DataFrame, label: str, *, resize_below: float,
                   resize_legible: float | None, resize: str = "resize") -> pd.DataFrame:
    """Why the rule did what it did on each dataset of an evaluation ``table`` (rows of
    ``resize`` and of the rule's cascade ``label``, whose rows carry ``map_confidence`` and
    ``page_legibility``; ``ceiling_anls`` the full page's reading). One row per dataset:
    ``n_questions``; the share of questions sent to ``resize`` (``resized``), for an unsure
    map (``unsure``) and for a legible page (``legible``; both can hold); the legibility's
    median and quartiles (``legibility_q25``, ``_q50``, ``_q75``, octaves); and on the
    questions the rule kept on the cascade, the share of the full page's reading each
    method keeps there (``kept_rule``, ``kept_resize``; sums over those questions, NaN
    where none was kept)."""
    keys = ["dataset", "doc_id", "qid"]
    rule = table[table.allocator == label].set_index(keys)
    if rule.empty:
        raise ValueError(f"table has no rows of {label!r}")
    res = table[table.allocator == resize].set_index(keys).anls.rename("resize_anls")
    q = rule[["anls", "ceiling_anls", "map_confidence", "page_legibility"]].join(res, how="inner")
    q["unsure"] = q.map_confidence < resize_below
    q["legible"] = (q.page_legibility >= -resize_legible) if resize_legible is not None \
        else False
    q["resized"] = q.unsure | q.legible
    kept = q[~q.resized].groupby(level="dataset")[["anls", "resize_anls", "ceiling_anls"]].sum()
    out = q.groupby(level="dataset").agg(
        n_questions=("anls", "size"), resized=("resized", "mean"), unsure=("unsure", "mean"),
        legible=("legible", "mean"),
        legibility_q25=("page_legibility", lambda x: x.quantile(0.25)),
        legibility_q50=("page_legibility", "median"),
        legibility_q75=("page_legibility", lambda x: x.quantile(0.75)))
    ceil = kept.ceiling_anls.where(kept.ceiling_anls > 0)
    out["kept_rule"] = (kept.anls / ceil).reindex(out.index)
    out["kept_resize"] = (kept.resize_anls / ceil).reindex(out.index)
    return out


def switch_sentence(row: Mapping, resize_legible: float | None) -> str:
    """One sentence from a row of :func:`switch_summary`: what share of the questions the
    rule sent to ``resize`` and why, where the page's legibility lay against the fitted
    ``-resize_legible``, and how the questions it kept on the cascade read."""
    out = (f"{100 * row['resized']:.0f} % of the {int(row['n_questions'])} questions go to "
           f"`resize` ({100 * row['unsure']:.0f} % for an unsure map, "
           f"{100 * row['legible']:.0f} % for a legible page); their pages' legibility has "
           f"quartiles {row['legibility_q25']:+.2f}, {row['legibility_q50']:+.2f}, "
           f"{row['legibility_q75']:+.2f} octaves over the questions")
    if resize_legible is not None:
        out += f" against the fitted {-resize_legible:+.2f}"
    if pd.isna(row["kept_rule"]):
        return out + "; no question stays on the cascade"
    return (out + f"; on the questions that stay on the cascade it keeps "
                  f"{100 * row['kept_rule']:.0f} % of the full page's reading where `resize` "
                  f"keeps {100 * row['kept_resize']:.0f} %")


def default_record_path() -> Path:
    """``data/models/safe_rule.json`` of the repository."""
    from fovea_book.eval.fitting import models_record_path

    return models_record_path("tried.safe_rule")


def read_record(path: str | Path | None = None) -> dict:
    """The fit's record (:func:`main` writes it)."""
    from fovea_book.eval.fitting import read_models_record

    return read_models_record("tried.safe_rule", path)


def main(argv: Sequence[str] | None = None) -> int:
    """Fit the rule (see the module docstring) and write the record."""
    from fovea_book.eval.cascade import cascade_method
    from fovea_book.eval.glance_rule import fit_on_variants
    from fovea_core.cascade.allocator import CONFIDENCE_TOP, LEGIBLE_PX

    def fit(table: pd.DataFrame):
        curve = safe_curve(table)
        chosen = choose_safe(curve)
        head = dict(
            rule=f"spend the budget like resize when map_confidence (the map's mass on its "
                 f"top {CONFIDENCE_TOP:g} of cells) < resize_below, or when page_legibility "
                 f"(the gist's median text height read at resize's level, octaves from "
                 f"{LEGIBLE_PX:g} px) >= -resize_legible",
            chosen=chosen, resize_below=chosen["resize_below"],
            resize_legible=chosen["resize_legible"], variants=sorted(curve.attrs["resize"]),
            confidences=list(CONFIDENCES), legibles=list(LEGIBLES))
        return curve, chosen, head, (
            "feasible: every variant's mean ANLS (rapidocr, over documents) >= resize's; "
            "among those the highest mean ANLS over all pages (ties to the fewer questions "
            "resized); none feasible: the highest worst margin")

    return fit_on_variants("tried.safe_rule", __doc__, default_record_path(), argv,
                           [cascade_method(BASE, "learned")], fit)


if __name__ == "__main__":
    raise SystemExit(main())
