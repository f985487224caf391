"""The real documents of the book's thesis test, shared by chapters 14.5 and 17.

The receipts (SROIE dev), the forms (FUNSD dev, the questions asked once on their form) and
the forms asked with held-out wordings, each read with
:func:`~fovea_core.cascade.evaluate.real_set_methods`. Both chapters call these functions with
the same methods, so chapter 17 reads chapter 14.5's cached cells instead of computing a
second copy through other code.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from fovea_core.eval.documents import Document
from fovea_core.eval.evaluator import cost_label

__all__ = ["DATASET_KEYS", "METHOD_KEYS", "book_forms", "cost_labels", "kept_table",
           "real_family", "side_costs", "variant_family", "variant_words"]

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
    keeping the questions whose key is asked once on it (:func:`~fovea_core.eval.funsd.
    unambiguous`); forms left with no question are dropped. A missing folder gives ``({},
    message)``, so a chapter prints the message and carries on.
    """
    from fovea_core.eval.funsd import load_funsd, reworded, unambiguous
    from fovea_core.paths import DatasetNotFound

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
    over documents, :func:`~fovea_core.cascade.evaluate.kept_difference` against ``full``)."""
    from fovea_core.cascade.evaluate import kept_difference

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
    allow (:func:`~fovea_core.eval.stats.verdict`)."""
    from fovea_core.eval.stats import holm, paired_family, verdict

    fam = paired_family(table, list(methods), baseline, budget, seed=seed, correct=False)
    if len(fam):
        fam["p_holm"] = holm(fam["p"].to_numpy())
        fam["verdict"] = [verdict(r.diff_lo, r.diff_hi, r.n_docs, p=r.p_holm)
                          for r in fam.itertuples()]
    return fam


def variant_family(table: pd.DataFrame, pairs: Sequence[tuple[str, str]], budget: int, *,
                   seed: int = 0) -> pd.DataFrame:
    """Each ``variant - reference`` of ``pairs`` on every dataset of ``table`` (an ablation:
    one change against the method it changes), paired over documents, with Holm-adjusted
    p-values over all pairs and datasets together (``p_holm``) and the verdict word they
    allow. Columns of :func:`~fovea_core.eval.stats.paired_family` (``baseline`` is the
    pair's reference)."""
    from fovea_core.eval.stats import holm, paired_family, verdict

    fam = pd.concat([paired_family(table, [v], ref, budget, seed=seed, correct=False)
                     for v, ref in pairs], ignore_index=True)
    if len(fam):
        fam["p_holm"] = holm(fam["p"].to_numpy())
        fam["verdict"] = [verdict(r.diff_lo, r.diff_hi, r.n_docs, p=r.p_holm)
                          for r in fam.itertuples()]
    return fam


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
    """``{method: label}`` of ``shared/PROTOCOL.md`` from an evaluation ``table``'s rows, by
    :func:`~fovea_core.eval.evaluator.cost_label` on each method's flags over its rows:
    ``"side compute"`` (its reads outside N only say where: ``side_compute`` on a row),
    ``"unbudgeted"`` (it read more than N's worth outside N on some page), else
    ``"budgeted"``; ``full`` is left out (the ceiling). A missing flag column counts as
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
    method does not count them) and ``side_tokens`` (the pixels it read outside N as
    16 x 16 token equivalents, ``alloc_read_tokens``). Columns: ``dataset, method, n_docs,
    ms, ms_lo, ms_hi`` (mean over pages, 95 % percentile bootstrap over pages), ``flops``,
    ``flops_share, share_lo, share_hi`` (of the prefill of a 2B-class VLM at ``budget``
    visual tokens, :func:`~fovea_core.eval.stats.prefill_flops`), ``tokens`` (median).
    """
    from fovea_core.eval.metrics import bootstrap_ci
    from fovea_core.eval.stats import prefill_flops

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
                         tokens=float(page["alloc_read_tokens"].median())))
    return pd.DataFrame(rows, columns=cols)
