"""The statistics every experiment chapter uses to turn measurements into words.

The rules are the book's evaluation protocol (``shared/PROTOCOL.md``):

* the unit of resampling is the **document** (questions on one page are not independent);
* 95 % percentile-bootstrap CIs [Efron & Tibshirani 1993] with 2,000 resamples on every
  reported difference, paired when the methods share documents;
* **no verdict word below** :data:`MIN_DOCS` documents: :func:`verdict` returns
  ``"too few documents (n = K)"`` instead;
* a **family** of comparisons against one baseline is corrected with Holm's step-down
  procedure [Holm 1979] on paired sign-flip (randomisation) p-values
  [Fisher 1935; Good 2005] (:func:`paired_family`);
* a "best" method or parameter is **selected on one half** of the documents and reported
  on the other (:func:`split_halves`, a fixed split by document id).

:func:`verdict` is the one function that chooses a verdict word in this package; the
ledger (:mod:`fovea_core.eval.ledger`) and every chapter call it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from fovea_core.eval.metrics import bootstrap_ci

__all__ = ["MIN_DOCS", "N_BOOT", "ALPHA", "too_few", "verdict", "split_halves", "holm",
           "sign_flip_pvalue", "paired_diffs", "paired_family", "ci_text"]

#: fewest documents behind any verdict word (PROTOCOL.md)
MIN_DOCS = 20
#: bootstrap resamples of every CI
N_BOOT = 2000
#: family-wise error rate of the Holm procedure
ALPHA = 0.05


def too_few(n_docs: int, min_docs: int = MIN_DOCS) -> str | None:
    """``"too few documents (n = K)"`` when ``n_docs < min_docs``, else ``None``."""
    return f"too few documents (n = {int(n_docs)})" if int(n_docs) < min_docs else None


def verdict(lo: float, hi: float, n_docs: int, *, p: float | None = None,
            alpha: float = ALPHA, min_docs: int = MIN_DOCS, better: str = "better",
            worse: str = "worse", same: str = "no detectable difference") -> str:
    """The verdict word for a paired difference ``a - b`` with 95 % CI ``[lo, hi]``.

    * fewer than ``min_docs`` documents: ``"too few documents (n = K)"``;
    * otherwise ``better`` when the whole CI lies above 0, ``worse`` when below, ``same``
      when it contains 0 or is not finite;
    * with ``p`` (a Holm-adjusted p-value of the same difference), a difference is only
      called ``better``/``worse`` when also ``p < alpha``: the family's error rate holds.
    """
    few = too_few(n_docs, min_docs)
    if few:
        return few
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return same
    if lo > hi:
        raise ValueError(f"lo must be <= hi, got [{lo}, {hi}]")
    if p is not None and not (p < alpha):
        return same
    return better if lo > 0 else worse if hi < 0 else same


def split_halves(doc_ids: Iterable[str]) -> tuple[list[str], list[str]]:
    """A fixed split of documents into a *select* half and a *report* half.

    Document ``d`` goes to *select* when ``crc32(d)`` is even: the split depends only on the
    id (never on the results, the order or which other documents are present), so a
    choice made on *select* is tested on documents it never saw. Returns sorted id lists.
    """
    ids = sorted(set(str(d) for d in doc_ids))
    sel = [d for d in ids if zlib.crc32(d.encode()) % 2 == 0]
    rep = [d for d in ids if zlib.crc32(d.encode()) % 2 == 1]
    return sel, rep


def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values [Holm 1979]: ``p_(i) * (m - i + 1)``, made monotone
    and capped at 1 (NaN stays NaN and does not count in ``m``)."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full_like(p, np.nan)
    ok = np.isfinite(p)
    m = int(ok.sum())
    if m == 0:
        return out
    idx = np.flatnonzero(ok)[np.argsort(p[ok], kind="stable")]
    adj = np.minimum(1.0, np.maximum.accumulate(p[idx] * (m - np.arange(m))))
    out[idx] = adj
    return out


def sign_flip_pvalue(diffs: Sequence[float], *, n_perm: int = 10_000, seed: int = 0) -> float:
    """Two-sided paired randomisation p-value of ``mean(diffs) = 0``.

    Under the null the sign of each document's difference is exchangeable, so the mean is
    recomputed with random signs ``n_perm`` times; ``p = (1 + #{|mean*| >= |mean|}) /
    (1 + n_perm)`` (never 0). NaN with no document.
    """
    d = np.asarray(diffs, dtype=float)
    d = d[np.isfinite(d)]
    if len(d) == 0:
        return float("nan")
    obs = abs(d.mean())
    rng = np.random.default_rng(seed)
    signs = rng.integers(0, 2, size=(n_perm, len(d))) * 2 - 1
    null = np.abs((signs * d).mean(axis=1))
    return float((1 + np.sum(null >= obs - 1e-12)) / (1 + n_perm))


def paired_diffs(table: pd.DataFrame, a: str, b: str, *, metric: str = "anls",
                 budget: int | None = None, docs: Iterable[str] | None = None) -> pd.DataFrame:
    """Per-document paired differences ``a - b`` of ``metric`` (questions averaged within a
    document first): columns ``dataset, budget, doc_id, diff``.

    ``b == "full"`` compares with the full-resolution row at its own budget; ``budget``
    keeps one budget of ``a``; ``docs`` restricts to those document ids.
    """
    have = set(table["allocator"])
    for name in (a, b):
        if name not in have:
            raise ValueError(f"allocator {name!r} is not in the table; have {sorted(have)}")
    t = table if docs is None else table[table["doc_id"].isin(set(docs))]
    per = t.groupby(["dataset", "allocator", "budget", "doc_id"])[metric].mean().reset_index()
    pa = per[per.allocator == a].drop(columns="allocator")
    pb = per[per.allocator == b].drop(columns="allocator")
    if budget is not None:
        pa = pa[pa.budget == budget]
        if b != "full":
            pb = pb[pb.budget == budget]
    on = ["dataset", "doc_id"] + ([] if b == "full" else ["budget"])
    if b == "full":
        pb = pb.drop(columns="budget")
    m = pa.merge(pb, on=on, suffixes=("_a", "_b"))
    return m.assign(diff=m[f"{metric}_a"] - m[f"{metric}_b"])[
        ["dataset", "budget", "doc_id", "diff"]]


def ci_text(est: float, lo: float, hi: float, *, scale: float = 100.0, digits: int = 1) -> str:
    """``"+3.1 [0.5, 5.6]"``: a signed estimate and its CI, multiplied by ``scale``."""
    f = f"{{:.{digits}f}}"
    return f"{est * scale:+.{digits}f} [{f.format(lo * scale)}, {f.format(hi * scale)}]"


def paired_family(table: pd.DataFrame, methods: Sequence[str], baseline: str,
                  budget: int | None = None, *, metric: str = "anls",
                  docs: Iterable[str] | None = None, seed: int = 0, n_boot: int = N_BOOT,
                  alpha: float = ALPHA, min_docs: int = MIN_DOCS, correct: bool = True,
                  better: str = "better", worse: str = "worse",
                  same: str = "no detectable difference") -> pd.DataFrame:
    """Every ``method - baseline`` paired difference at ``budget``, per dataset, as a family.

    For each dataset and method: the mean per-document difference with its 95 % paired
    percentile-bootstrap CI (``n_boot`` resamples over documents), the sign-flip p-value,
    and the Holm-adjusted p-value over the whole family (all methods x datasets of this
    call; ``correct=False`` skips the correction and the caller must label the family
    exploratory). ``verdict`` comes from :func:`verdict` (``too few documents`` below
    ``min_docs``). Methods absent from the table are skipped; ``docs`` restricts the
    documents (e.g. the report half of :func:`split_halves`).

    Returns columns ``dataset, method, baseline, budget, diff, diff_lo, diff_hi, n_docs, p,
    p_holm, verdict, text`` (``text``: :func:`ci_text` in points).
    """
    have = set(table["allocator"])
    if baseline not in have:
        raise ValueError(f"baseline {baseline!r} is not in the table; have {sorted(have)}")
    rows = []
    docs = None if docs is None else list(docs)
    for m in dict.fromkeys(methods):
        if m not in have or m == baseline:
            continue
        d = paired_diffs(table, m, baseline, metric=metric, budget=budget, docs=docs)
        for (ds, bud), g in d.groupby(["dataset", "budget"], sort=True):
            v = g["diff"].to_numpy()
            est, lo, hi = bootstrap_ci(v, n_boot=n_boot, seed=seed)
            rows.append(dict(dataset=ds, method=m, baseline=baseline, budget=bud, diff=est,
                             diff_lo=lo, diff_hi=hi, n_docs=len(v),
                             p=sign_flip_pvalue(v, seed=seed)))
    if not rows:
        raise ValueError(f"none of {list(methods)} is in the table besides {baseline!r}")
    out = pd.DataFrame(rows)
    out["p_holm"] = holm(out["p"].to_numpy()) if correct else out["p"]
    out["verdict"] = [verdict(r.diff_lo, r.diff_hi, r.n_docs, p=r.p_holm, alpha=alpha,
                              min_docs=min_docs, better=better, worse=worse, same=same)
                      for r in out.itertuples()]
    out["text"] = [ci_text(r.diff, r.diff_lo, r.diff_hi) for r in out.itertuples()]
    return out
