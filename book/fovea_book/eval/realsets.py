"""The real documents of the book's thesis test, shared by chapters 14.5 and 17.

The receipts (SROIE dev), the forms (FUNSD dev, the questions asked once on their form) and
the forms asked with held-out wordings, each read with
:func:`~fovea_book.eval.cascade.real_set_methods`. Both chapters call these functions with
the same methods, so chapter 17 reads chapter 14.5's cached cells instead of computing a
second copy through other code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from fovea_book.eval.documents import Document
from fovea_book.eval.evaluator import cost_label

__all__ = ["DATASET_KEYS", "METHOD_KEYS", "TARGET_CASCADES", "book_forms", "both_readers",
           "cascade_targets", "cost_labels", "kept_lines", "kept_table", "real_family",
           "side_costs", "side_lines", "variant_family", "variant_words"]

#: short glue keys of the datasets and methods the chapters report
DATASET_KEYS = {"synthetic": "syn", "sroie": "rec", "funsd": "form",
                "funsd (held-out wording)": "formho"}
METHOD_KEYS = {"resize": "resize", "resize_nonblank": "nb", "cascade | learned": "learned",
               "cascade | learned + text detector": "text", "cascade | oracle": "oracle"}
#: FUNSD dev forms per profile
BOOK_FORMS = {"smoke": 1, "default": 37, "full": 37}


def book_forms(profile: str, *, data_dir=None, seed: int = 0, limit: int | None = None
               ) -> tuple[dict[str, list[Document]], str]:
    """``({"funsd": forms, "funsd (held-out wording)": same forms reworded}, message)``.

    The first ``limit`` (default :data:`BOOK_FORMS` ``[profile]``) FUNSD dev forms, each
    keeping the questions whose key is asked once on it (:func:`~fovea_book.eval.funsd.
    unambiguous`); forms left with no question are dropped. A missing folder gives ``({},
    message)``, so a chapter prints the message and carries on.
    """
    from fovea_book.eval.funsd import load_funsd, reworded, unambiguous
    from fovea_book.paths import DatasetNotFound

    if profile not in BOOK_FORMS:
        raise ValueError(f"profile must be one of {sorted(BOOK_FORMS)}, got {profile!r}")
    try:
        raw = load_funsd("funsd-dev", data_dir=data_dir,
                         limit=BOOK_FORMS[profile] if limit is None else limit)
    except DatasetNotFound as err:
        return {}, f"FUNSD forms skipped: {err}"
    forms = [f for f in map(unambiguous, raw) if f.questions]
    msg = (f"{len(forms)} FUNSD dev forms, {sum(len(f.questions) for f in forms)} questions "
           f"whose key is asked once on the form (of {sum(len(f.questions) for f in raw)} "
           "linked question -> answer pairs)")
    if not forms:
        return {}, msg
    return {"funsd": forms,
            "funsd (held-out wording)": [reworded(f, "heldout", seed) for f in forms]}, msg


def kept_table(table: pd.DataFrame, methods: Sequence[str], *, seed: int = 0) -> pd.DataFrame:
    """Kept (the share of the full page's reading) of each method on each dataset of an
    evaluation ``table``: ``dataset, method, n_docs, kept, lo, hi`` (95 % percentile bootstrap
    over documents, :func:`~fovea_book.eval.cascade.kept_difference` against ``full``)."""
    from fovea_book.eval.cascade import kept_difference

    rows = []
    for ds, t in table.groupby("dataset"):
        for m in methods:
            if m not in set(t.allocator):
                continue
            k = kept_difference(t, m, "full", seed=seed)
            rows.append(dict(dataset=ds, method=m, n_docs=k["n_docs"], kept=1 + k["diff"],
                             lo=1 + k["lo"], hi=1 + k["hi"]))
    return pd.DataFrame(rows, columns=["dataset", "method", "n_docs", "kept", "lo", "hi"])


def real_family(table: pd.DataFrame, methods: Sequence[str], budget: int, *,
                baseline: str = "resize", seed: int = 0) -> pd.DataFrame:
    """Every method minus ``baseline`` on every dataset of ``table``, paired over documents,
    with Holm-adjusted p-values over the whole family (``p_holm``) and the verdict word they
    allow (:func:`~fovea_book.eval.stats.verdict`)."""
    from fovea_book.eval.stats import holm_verdicts, paired_family

    return holm_verdicts(paired_family(table, list(methods), baseline, budget, seed=seed,
                                       correct=False))


def variant_family(table: pd.DataFrame, pairs: Sequence[tuple[str, str]], budget: int, *,
                   seed: int = 0) -> pd.DataFrame:
    """Each ``variant - reference`` of ``pairs`` on every dataset of ``table`` (an ablation:
    one change against the method it changes), paired over documents, with Holm-adjusted
    p-values over all pairs and datasets together (``p_holm``) and the verdict word they
    allow. Columns of :func:`~fovea_book.eval.stats.paired_family` (``baseline`` is the
    pair's reference): :func:`~fovea_book.eval.stats.pairs_family`."""
    from fovea_book.eval.stats import pairs_family

    return pairs_family(table, pairs, budget, seed=seed)


def variant_words(table: pd.DataFrame, fam: pd.DataFrame, *, seed: int = 0
                  ) -> dict[tuple[str, str], str]:
    """``{(dataset, variant): sentence}`` for each row of a :func:`variant_family`: the
    variant's kept share with its 95 % CI (:func:`kept_table` of ``table``) and its
    difference from its reference, in points, with the verdict word."""
    kept = kept_table(table, list(dict.fromkeys(fam.method)), seed=seed).set_index(
        ["dataset", "method"])
    out = {}
    for r in fam.itertuples():
        k = kept.loc[(r.dataset, r.method)]
        out[(r.dataset, r.method)] = (
            f"{100 * k.kept:.0f} % [{100 * k.lo:.0f}, {100 * k.hi:.0f}]; minus "
            f"`{r.baseline}`: {r.text} points, **{r.verdict}**")
    return out


def cost_labels(table: pd.DataFrame) -> dict[str, str]:
    """``{method: label}`` of the evaluation protocol (``book/protocol.md``) from an evaluation ``table``'s rows, by
    :func:`~fovea_book.eval.evaluator.cost_label` on each method's flags over its rows
    (the dearest label any page gave it, :func:`fovea_core.cost.method_cost`):
    ``"unbudgeted"`` (on some page it recognised text or read more than N's worth outside
    N), ``"side compute"`` (its reads outside N only say where: ``side_compute`` on a row),
    else ``"budgeted"``; ``full`` is left out (the ceiling). A missing flag column counts as
    False."""
    t = table[table.allocator != "full"]
    flags = pd.DataFrame({c: (t[c] if c in t else pd.Series(False, index=t.index))
                          .astype(object).where(lambda v: v.notna(), False).astype(bool)
                          for c in ("side_compute", "unbudgeted")}).groupby(t.allocator).any()
    return dict(zip(flags.index, cost_label(flags.side_compute, flags.unbudgeted).tolist()))


def side_costs(table: pd.DataFrame, budget: int, *, seed: int = 0,
               config: str = "qwen2-vl-2b") -> pd.DataFrame:
    """The side compute of every side-compute method of ``table``, per dataset, per page.

    A page's side cost is the same for each of its questions (one detector run per page), so
    each page counts once: ``side_ms`` (the rows' ``side_ms``, a method's own measurement of
    its side run; for a method without one, ``resize_nonblank``, its whole allocation time
    ``alloc_ms``, which is its blank test and a resample), ``side_flops`` (NaN where the
    method does not count them) and ``side_tokens`` (the pixels it and its scorer read
    outside N as 16 x 16 token equivalents, ``alloc_read_tokens + scorer_tokens``). Columns: ``dataset, method, n_docs,
    ms, ms_lo, ms_hi`` (mean over pages, 95 % percentile bootstrap over pages), ``flops``,
    ``flops_share, share_lo, share_hi`` (of the prefill of a 2B-class VLM at ``budget``
    visual tokens, :func:`~fovea_book.eval.stats.prefill_flops`), ``tokens`` (median).
    """
    from fovea_book.eval.metrics import bootstrap_ci
    from fovea_book.eval.stats import prefill_flops

    labels = cost_labels(table)
    prefill = float(prefill_flops(int(budget), config=config))
    rows = []
    cols = ["dataset", "method", "n_docs", "ms", "ms_lo", "ms_hi", "flops", "flops_share",
            "share_lo", "share_hi", "tokens"]
    for (ds, m), t in table[table.allocator.map(labels.get) == "side compute"].groupby(
            ["dataset", "allocator"]):
        page = t.groupby("doc_id").first()
        own = "side_ms" in page and page["side_ms"].notna().all()
        ms = (page["side_ms"] if own else page["alloc_ms"]).to_numpy(float)
        fl = (page["side_flops"] if "side_flops" in page else
              pd.Series(float("nan"), index=page.index)).to_numpy(float)
        m_ms, lo, hi = bootstrap_ci(ms, seed=seed)
        if np.isfinite(fl).all():
            sh, slo, shi = bootstrap_ci(fl / prefill, seed=seed)
        else:
            sh = slo = shi = float("nan")
        rows.append(dict(dataset=ds, method=m, n_docs=len(page), ms=m_ms, ms_lo=lo, ms_hi=hi,
                         flops=float(np.mean(fl)), flops_share=sh, share_lo=slo, share_hi=shi,
                         tokens=float((page["alloc_read_tokens"] + (
                             page["scorer_tokens"] if "scorer_tokens" in page else 0.0)
                         ).median())))
    return pd.DataFrame(rows, columns=cols)


def kept_lines(kept: pd.DataFrame, words: Mapping[tuple[str, str], str], *,
               baseline: str = "resize", missing: str = "not compared"
               ) -> dict[tuple[str, str], str]:
    """``{(dataset, method): "62 % [55, 70]; minus `resize`: better (...)"}`` for each row of
    a :func:`kept_table`: the kept share with its 95 % CI and, for every method but
    ``baseline``, its sentence in ``words`` (:func:`~fovea_book.eval.experiments.
    family_text` of a :func:`real_family`; ``missing`` where it has none)."""
    out = {}
    for r in kept.itertuples():
        vs = ("" if r.method == baseline else
              f"; minus `{baseline}`: {words.get((r.dataset, r.method), missing)}")
        out[(r.dataset, r.method)] = (f"{100 * r.kept:.0f} % [{100 * r.lo:.0f}, "
                                      f"{100 * r.hi:.0f}]{vs}")
    return out


def side_lines(side: pd.DataFrame) -> dict[tuple[str, str], str]:
    """``{(dataset, method): "46 ms [40, 52] a page, 4.6 GFLOPs, 0.57 % of the prefill, 768
    tokens' worth of pixels (n = 37 pages)"}`` for each row of :func:`side_costs` (``FLOPs
    not counted`` where the method does not count them)."""
    out = {}
    for r in side.itertuples():
        fl = ("FLOPs not counted" if not np.isfinite(r.flops) else
              f"{r.flops / 1e9:.1f} GFLOPs, {100 * r.flops_share:.2f} % of the prefill")
        out[(r.dataset, r.method)] = (
            f"{r.ms:.0f} ms [{r.ms_lo:.0f}, {r.ms_hi:.0f}] a page, {fl}, "
            f"{r.tokens:.0f} tokens' worth of pixels (n = {r.n_docs} pages)")
    return out


def both_readers(first: str, second: str) -> str:
    """One target verdict from two readers' (:func:`~fovea_book.eval.stats.target_verdict`
    words): the shared word when they agree, ``"not met"`` when either is not met, else
    ``"undecided"``."""
    if first == second:
        return first
    return "not met" if "not met" in (first, second) else "undecided"


#: the two cascades every issue-20 target is measured for (neither chosen after the fact):
#: ``{label: how the targets name it}``
TARGET_CASCADES = {"cascade | learned": "the learned cascade",
                   "cascade | learned + text detector":
                       "the cascade + text detector (side compute)"}


def cascade_targets(real: pd.DataFrame, kept: pd.DataFrame, saving: pd.DataFrame,
                    side: pd.DataFrame, synthetic: pd.DataFrame, *,
                    second: Mapping[tuple[str, str], Mapping] | None = None,
                    second_missing: str | None = None, seed: int = 0,
                    cascades: Mapping[str, str] = TARGET_CASCADES,
                    side_method: str = "cascade | learned + text detector") -> pd.DataFrame:
    """The cascade chapter's targets at N (set on 2026-11-24), for each of ``cascades``, as rows of
    :func:`~fovea_book.eval.stats.target_row` (``target, measured, verdict``).

    In order: kept >= 70 % (moonshot 90 %) of the full page on FUNSD dev and >= 90 % (95 %)
    on SROIE dev (``kept``, a :func:`kept_table`); on FUNSD >= ``resize`` + 40 points of kept;
    on SROIE better than ``resize`` (kept CI above 0) under both readers (``second``:
    ``{(dataset, method): {"diff_t", "lo_t", "hi_t", "n_docs"}}`` of the second reader,
    combined by :func:`both_readers`; without it the verdict is ``undecided (second reader:
    <second_missing>)``); the localisation gap on SROIE (oracle minus the cascade) <= 5
    points; the token-saving factor >= 3x (moonshot 6x) on the receipts and the forms
    (``saving``, :func:`~fovea_book.eval.curve.saving_table`); the text detector's side
    compute (``side_method``) <= 5 % of the prefill FLOPs and <= 100 ms a page (``side``,
    :func:`side_costs`);
    and the learned cascade keeps >= 80 % on the synthetic pages (``synthetic``'s
    ``"synthetic"`` rows). Differences of kept are :func:`~fovea_book.eval.cascade.
    kept_difference` over ``real``'s rows (an evaluation of the real sets); a real set
    absent from ``real`` has no target.
    """
    from fovea_book.eval.cascade import kept_difference
    from fovea_book.eval.stats import target_row, target_verdict

    sets = set(real.dataset)
    k_of = lambda ds, a, b: kept_difference(real[real.dataset == ds], a, b, seed=seed)  # noqa: E731
    kr = kept.set_index(["dataset", "method"])
    second = second or {}
    rows = []
    for ds, name, bar, moon in (("funsd", "FUNSD dev", 0.70, 0.90),
                                ("sroie", "SROIE dev", 0.90, 0.95)):
        if ds not in sets:
            continue
        for m, who in cascades.items():
            r = kr.loc[(ds, m)]
            for b, label in ((bar, ""), (moon, " (moonshot)")):
                rows.append(target_row(f"{name}: {who} keeps >= {100 * b:.0f} % of the "
                                       f"full page{label}", r.kept, r.lo, r.hi, b, r.n_docs))
    if "funsd" in sets:
        for m, who in cascades.items():
            d = k_of("funsd", m, "resize")
            rows.append(target_row(f"FUNSD dev: {who} >= resize + 40 points", d["diff"],
                                   d["lo"], d["hi"], 0.40, d["n_docs"], unit=" points"))
    if "sroie" in sets:
        for m, who in cascades.items():
            d = k_of("sroie", m, "resize")
            row = target_row(f"SROIE dev: {who} better than resize (CI above 0) under both "
                             "readers", d["diff"], d["lo"], d["hi"], 0.0, d["n_docs"],
                             unit=" points")
            if ("sroie", m) in second:                       # the second reader must agree
                b = second[("sroie", m)]
                row["measured"] += f"; tesseract {b['diff_t']} points"
                row["verdict"] = both_readers(row["verdict"], target_verdict(
                    b["lo_t"], b["hi_t"], 0.0, b["n_docs"]))
            else:
                row["verdict"] = f"undecided (second reader: {second_missing})"
            rows.append(row)
        for m, who in cascades.items():
            d = k_of("sroie", "cascade | oracle", m)
            rows.append(target_row(f"SROIE dev: localisation gap of {who} (oracle minus it) "
                                   "<= 5 points", d["diff"], d["lo"], d["hi"], 0.05,
                                   d["n_docs"], at_most=True, unit=" points"))
    sv = saving.set_index(["dataset", "method"])
    for ds, name in (("sroie", "receipts"), ("funsd", "forms")):
        for m, who in cascades.items():
            if (ds, m) not in sv.index:
                continue
            r = sv.loc[(ds, m)]
            for b, label in ((3.0, ""), (6.0, " (moonshot)")):
                row = target_row(f"{who}: token-saving factor >= {b:.0f}x on the {name}{label}",
                                 r.factor, r.lo, r.hi, b, r.n_docs, scale=1, unit="x", digits=1)
                rows.append({**row, "measured": f"{r.text} (n = {r.n_docs})"})
    sr = side[side.method == side_method].set_index("dataset")
    for ds, name in (("sroie", "receipts"), ("funsd", "forms")):
        if ds not in sr.index:
            continue
        r = sr.loc[ds]
        rows.append(target_row(f"side compute (text detector) <= 5 % of the prefill FLOPs, "
                               f"{name}", r.flops_share, r.share_lo, r.share_hi, 0.05,
                               r.n_docs, at_most=True, digits=2))
        rows.append(target_row(f"side compute (text detector) <= 100 ms of one core a page, "
                               f"{name}", r.ms, r.ms_lo, r.ms_hi, 100.0, r.n_docs,
                               at_most=True, scale=1, unit=" ms"))
    s = kept_difference(synthetic[synthetic.dataset == "synthetic"], "cascade | learned",
                        "full", seed=seed)
    rows.append(target_row("synthetic pages: the learned cascade keeps >= 80 %", 1 + s["diff"],
                           1 + s["lo"], 1 + s["hi"], 0.80, s["n_docs"]))
    return pd.DataFrame(rows)
