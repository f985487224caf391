"""The statistics every experiment chapter uses to turn measurements into words.

The rules are the book's evaluation protocol (the evaluation protocol (``book/protocol.md``)):

* the unit of resampling is the **document** (questions on one page are not independent);
* 95 % percentile-bootstrap CIs [Efron & Tibshirani 1993] with 2,000 resamples on every
  reported difference, paired when the methods share documents;
* **no verdict word below** :data:`MIN_DOCS` documents: :func:`verdict` returns
  ``"too few documents (n = K)"`` instead;
* a **family** of comparisons against one baseline is corrected with Holm's step-down
  procedure [Holm 1979] on paired sign-flip (randomisation) p-values
  [Fisher 1935; Good 2005] (:func:`paired_family`);
* a "best" method or parameter is **selected on one half** of the documents and reported
  on the other (:func:`split_halves`, a fixed split by document id);
* the **token-saving factor** against the ``resize`` curve (:func:`saving_factor`): how many
  times the tokens ``resize`` needs to read as well as a method, with censored cases
  flagged; and the **compute view** (:func:`prefill_flops`, the VLM prefill at N tokens).

:func:`verdict` is the one function that chooses a verdict word in this package; the
ledger (:mod:`fovea_book.eval.ledger`) and every chapter call it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from fovea_book.eval.metrics import bootstrap_ci

__all__ = ["MIN_DOCS", "N_BOOT", "ALPHA", "too_few", "target_row", "target_verdict", "verdict", "split_halves", "holm",
           "sign_flip_pvalue", "paired_diffs", "paired_family", "holm_verdicts", "pairs_family",
           "ci_text", "report_or_all",
           "family_with_chosen", "curve_kept_at",
           "curve_budget_at", "saving_factor", "prefill_flops"]

#: fewest documents behind any verdict word (the evaluation protocol, ``book/protocol.md``)
MIN_DOCS = 20
#: bootstrap resamples of every CI
N_BOOT = 2000
#: family-wise error rate of the Holm procedure
ALPHA = 0.05


def too_few(n_docs: int, min_docs: int = MIN_DOCS) -> str | None:
    """``"too few documents (n = K)"`` when ``n_docs < min_docs``, else ``None``."""
    return f"too few documents (n = {int(n_docs)})" if int(n_docs) < min_docs else None


def target_verdict(lo: float, hi: float, bar: float, n_docs: int, *, at_most: bool = False,
                   min_docs: int = MIN_DOCS) -> str:
    """Whether a measured quantity with 95 % CI ``[lo, hi]`` meets a target ``bar``.

    ``"met"`` when the whole CI clears the bar (``lo >= bar``; with ``at_most``, a ceiling
    such as a gap of at most 5 points, ``hi <= bar``), ``"not met"`` when the whole CI misses
    it, ``"undecided"`` when the CI straddles it or is not finite at the needed end, and
    ``"too few documents (n = K)"`` below ``min_docs`` documents (the evaluation protocol (``book/protocol.md``)).
    """
    few = too_few(n_docs, min_docs)
    if few:
        return few
    if lo > hi:
        raise ValueError(f"lo must be <= hi, got [{lo}, {hi}]")
    ok, miss = (hi <= bar, lo > bar) if at_most else (lo >= bar, hi < bar)
    return "met" if ok else "not met" if miss else "undecided"


def target_row(target: str, est: float, lo: float, hi: float, bar: float, n_docs: int, *,
               at_most: bool = False, scale: float = 100.0, unit: str = " %",
               digits: int = 0) -> dict:
    """One row of a targets table: ``{"target", "measured", "verdict"}``, the measured text
    ``"81 % [74, 87] (n = 40)"`` (values times ``scale``, ``digits`` decimals; a NaN
    estimate, e.g. a censored factor, shows as ``n/a``) and :func:`target_verdict`."""
    fmt = lambda v: (f"{scale * v:.{digits}f}" if math.isfinite(v) else  # noqa: E731
                     "n/a" if math.isnan(v) else "inf" if v > 0 else "-inf")
    head = fmt(est) + (unit if math.isfinite(est) else "")
    measured = f"{head} [{fmt(lo)}, {fmt(hi)}] (n = {int(n_docs)})"
    return dict(target=target, measured=measured,
                verdict=target_verdict(lo, hi, bar, n_docs, at_most=at_most))


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


def holm_verdicts(fam: pd.DataFrame) -> pd.DataFrame:
    """Make ``fam`` (rows of :func:`paired_family` from several calls, each uncorrected) one
    family: ``p_holm`` by Holm over all its rows and ``verdict`` from it (:func:`verdict`).
    Returns ``fam``, changed in place."""
    fam["p_holm"] = holm(fam["p"].to_numpy())
    fam["verdict"] = [verdict(r.diff_lo, r.diff_hi, r.n_docs, p=r.p_holm)
                      for r in fam.itertuples()]
    return fam


def pairs_family(table: pd.DataFrame, pairs: Sequence[tuple[str, str]],
                 budget: int | None = None, *, seed: int = 0) -> pd.DataFrame:
    """Each ``method - reference`` of ``pairs`` on every dataset of ``table`` (e.g. an
    ablation: one change against the method it changes), paired over documents, as one
    Holm family (:func:`holm_verdicts`). Columns of :func:`paired_family` (``baseline`` is
    the pair's reference)."""
    fam = pd.concat([paired_family(table, [m], ref, budget, seed=seed, correct=False)
                     for m, ref in pairs], ignore_index=True)
    return holm_verdicts(fam)


def report_or_all(doc_ids: Iterable[str]) -> list[str]:
    """The *report* half of ``doc_ids`` (:func:`split_halves`), or all of them, in their
    order, when the report half is empty (a tiny profile): the documents a choice made on
    the *select* half is tested on."""
    ids = list(doc_ids)
    _, rep = split_halves(ids)
    return rep or ids


def family_with_chosen(table: pd.DataFrame, methods: Sequence[str],
                       chosen: Mapping[str, str], baseline: str, budget: int | None = None,
                       *, prefix: str = "chosen: ", seed: int = 0) -> pd.DataFrame:
    """One Holm family: every ``method - baseline`` on every dataset (all documents), plus,
    per dataset, the method ``chosen[dataset]`` (chosen on the select half) minus
    ``baseline`` on that dataset's report half only (:func:`report_or_all`), labelled
    ``prefix + chosen[dataset]``.

    Columns of :func:`paired_family`, with ``p_holm`` adjusted over all rows together and
    ``verdict`` from it; a dataset of ``chosen`` absent from ``table`` adds no row.
    """
    if isinstance(methods, str):
        raise TypeError(f"methods must be a sequence of labels, got the string {methods!r}")
    parts = [paired_family(table, list(methods), baseline, budget, seed=seed, correct=False)]
    for ds, a in chosen.items():
        t = table[table.dataset == ds]
        if t.empty:
            continue
        r = paired_family(t, [a], baseline, budget, docs=report_or_all(t.doc_id.unique()),
                          seed=seed, correct=False)
        parts.append(r.assign(method=prefix + a))
    return holm_verdicts(pd.concat(parts, ignore_index=True))


# ----------------------------------------------------------------------------- resize curve
def _check_curve(budgets, kept, name: str = "curve_kept") -> tuple[np.ndarray, np.ndarray]:
    n = np.asarray(budgets, dtype=float)
    if n.ndim != 1 or len(n) < 2:
        raise ValueError(f"curve_budgets must be a 1-D sequence of >= 2 budgets, got shape {n.shape}")
    if not (np.isfinite(n).all() and (n > 0).all() and (np.diff(n) > 0).all()):
        raise ValueError(f"curve_budgets must be finite, > 0 and strictly increasing, got {n.tolist()}")
    k = np.asarray(kept, dtype=float)
    if k.ndim not in (1, 2) or k.shape[-1] != len(n):
        raise ValueError(f"{name} must be [K] or [docs, K] with K = {len(n)} budgets, "
                         f"got shape {k.shape}")
    if not np.isfinite(k).all():
        raise ValueError(f"{name} must be finite (a NaN/inf in {int((~np.isfinite(k)).sum())} "
                         "entries); drop or fill those documents first")
    return n, k


def curve_kept_at(budgets: Sequence[float], kept, n: float | Sequence[float]) -> np.ndarray:
    """The curve's kept at budget(s) ``n``: piecewise-linear interpolation in ``log N``.

    Args:
        budgets: ``[K]`` strictly increasing budgets of the curve (e.g. ``resize`` at
            273 ... full).
        kept: ``[K]`` (a mean curve) or ``[D, K]`` (one curve per document).
        n: a budget or ``[M]`` budgets, each in ``[budgets[0], budgets[-1]]`` (the curve is
            not extrapolated).

    Returns:
        ``kept`` at ``n``: shape ``kept.shape[:-1] + n.shape``.
    """
    b, k = _check_curve(budgets, kept, "kept")
    x = np.asarray(n, dtype=float)
    if not np.isfinite(x).all() or (x < b[0]).any() or (x > b[-1]).any():
        raise ValueError(f"n must lie in the curve's range [{b[0]:g}, {b[-1]:g}], got {x.tolist()}")
    lx, lb = np.log(x), np.log(b)
    j = np.clip(np.searchsorted(lb, lx, side="right") - 1, 0, len(b) - 2)     # segment
    t = (lx - lb[j]) / (lb[j + 1] - lb[j])
    return k[..., j] + t * (k[..., j + 1] - k[..., j])


def curve_budget_at(budgets: Sequence[float], curve, target) -> tuple[np.ndarray, np.ndarray]:
    """The budget at which a curve first reaches ``target`` (inverse of :func:`curve_kept_at`).

    Args:
        budgets: ``[K]`` strictly increasing.
        curve: ``[R, K]`` curves (e.g. bootstrap replicates of the mean curve) or ``[K]``.
        target: ``[R]`` (or a scalar) kept to reach.

    Returns:
        ``(n_star [R], censored [R] int)``: the smallest ``N`` on the piecewise-linear (in
        ``log N``) curve with ``curve(N) >= target``; ``censored`` is ``0`` for an
        interpolated value, ``+1`` when the curve never reaches the target (``n_star``
        is then ``inf``: the budget needed is beyond ``budgets[-1]``), ``-1`` when the first
        point already reaches it (``n_star`` is ``budgets[0]``: the budget needed is at most
        that; the curve is not known below it). Vectorised over ``R``.
    """
    b = np.asarray(budgets, dtype=float)
    c = np.atleast_2d(np.asarray(curve, dtype=float))
    y = np.broadcast_to(np.asarray(target, dtype=float), c.shape[:1])
    ge = c >= y[:, None]                                                  # [R, K]
    reach = ge.any(1)
    k = np.where(reach, ge.argmax(1), 0)                                  # first point >= target
    km = np.maximum(k - 1, 0)
    r = np.arange(len(c))
    c0, c1 = c[r, km], c[r, k]
    t = np.where(c1 > c0, (y - c0) / np.where(c1 > c0, c1 - c0, 1.0), 1.0)
    lb = np.log(b)
    ln = lb[km] + t * (lb[k] - lb[km])
    cens = np.where(~reach, 1, np.where(k == 0, -1, 0))
    n_star = np.where(cens == 1, np.inf, np.where(cens == -1, b[0], np.exp(ln)))
    return n_star, cens


def saving_factor(curve_budgets: Sequence[float], curve_kept, method_budget: float,
                  method_kept, *, n_boot: int = N_BOOT, seed: int = 0, ci: float = 0.95
                  ) -> tuple[float, float, float, dict]:
    """Token-saving factor: ``N*`` / ``method_budget``, where ``N*`` is the budget at which the
    ``resize`` curve reads as well as the method (the evaluation protocol (``book/protocol.md``), "The resize curve").

    The curve is the mean kept over documents at each budget, interpolated piecewise-
    linearly in ``log N`` (:func:`curve_budget_at`: the first crossing of the method's mean
    kept); "resize needs ``factor`` x the tokens to read as well".

    Uncertainty: a **percentile** bootstrap [Efron & Tibshirani 1993] over documents,
    ``n_boot`` resamples, **paired**: each resample draws documents with replacement and
    uses the same documents for the curve and the method (row ``d`` of ``curve_kept`` and
    entry ``d`` of ``method_kept`` are the same page).

    Censoring is explicit, never a made-up number:

    * the method's mean kept is above every point of the curve (it beats the
      full-resolution end): ``factor`` is ``nan``, ``detail["censored"] = "above"`` and the
      factor is at least ``detail["bound"] = max_N / method_budget``;
    * the method's mean kept is at or below the curve's first point: ``factor`` is ``nan``,
      ``detail["censored"] = "below"``, the factor is at most ``min_N / method_budget``.

    Replicates are censored the same way; in the percentile CI an "above" replicate counts
    as ``+inf`` and a "below" one as ``0``, so a CI end that falls among them is reported as
    ``inf`` (resp. ``0.0``), a valid but open bound (``detail["boot_above"]`` /
    ``["boot_below"]``: the share of such replicates).

    Args:
        curve_budgets: ``[K]`` strictly increasing budgets (``K >= 2``), e.g. 273 ... full.
        curve_kept: ``[D, K]`` per-document kept (any score, e.g. share of the full-page
            reading) of ``resize`` at each budget.
        method_budget: the method's N (> 0).
        method_kept: ``[D]`` per-document kept of the method, same documents, same order.
        n_boot: bootstrap resamples (>= 100; the protocol's 2,000 by default).
        seed: seed of the resampling.
        ci: coverage in ``(0, 1)``.

    Returns:
        ``(factor, lo, hi, detail)``; ``detail``: ``n_star`` (``N*`` or ``nan``),
        ``censored`` (``None`` / ``"above"`` / ``"below"``), ``bound`` (the censoring bound
        of the factor, or ``None``), ``target`` (method's mean kept), ``curve`` (``[K]``
        mean curve), ``n_docs``, ``boot_above``, ``boot_below``, ``ci_method``
        (``"percentile"``), ``text`` (e.g. ``"3.2x [2.1, 4.8]"``, ``">= 8.4x"``).
    """
    b, k = _check_curve(curve_budgets, curve_kept)
    if k.ndim != 2:
        raise ValueError(f"curve_kept must be [docs, K], got shape {k.shape}")
    m = np.asarray(method_kept, dtype=float)
    if m.ndim != 1 or len(m) != len(k):
        raise ValueError(f"method_kept must be [docs] with docs = {len(k)} (the rows of "
                         f"curve_kept), got shape {m.shape}")
    if not np.isfinite(m).all():
        raise ValueError("method_kept must be finite (drop or fill those documents first)")
    if len(m) < 1:
        raise ValueError("saving_factor needs at least one document")
    nb = float(method_budget)
    if not (math.isfinite(nb) and nb > 0):
        raise ValueError(f"method_budget must be a finite number > 0, got {method_budget!r}")
    if not 0 < ci < 1:
        raise ValueError(f"ci must be in (0, 1), got {ci}")
    if isinstance(n_boot, bool) or int(n_boot) != n_boot or n_boot < 100:
        raise ValueError(f"n_boot must be an int >= 100, got {n_boot!r}")
    curve, target = k.mean(0), float(m.mean())
    n_star, cens = curve_budget_at(b, curve, target)
    n_star, cens = float(n_star[0]), int(cens[0])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(m), size=(int(n_boot), len(m)))             # [R, D], paired
    rn, rc = curve_budget_at(b, k[idx].mean(1), m[idx].mean(1))
    reps = np.where(rc == 1, np.inf, np.where(rc == -1, 0.0, rn / nb))
    # linear interpolation between order statistics, as bootstrap_ci; with "above"
    # replicates (+inf) the order statistic itself (no inf - inf)
    lo, hi = np.quantile(reps, [(1 - ci) / 2, (1 + ci) / 2],
                         method="linear" if np.isfinite(reps).all() else "inverted_cdf")
    censored = {0: None, 1: "above", -1: "below"}[cens]
    bound = None if cens == 0 else (b[-1] if cens == 1 else b[0]) / nb
    factor = n_star / nb if cens == 0 else float("nan")
    if cens == 0:
        text = f"{factor:.1f}x [{lo:.1f}, {hi:.1f}]"
    else:
        text = f"{'>=' if cens == 1 else '<='} {bound:.1f}x"
    detail = dict(n_star=n_star if cens == 0 else float("nan"), censored=censored, bound=bound,
                  target=target, curve=curve, n_docs=len(m),
                  boot_above=float((rc == 1).mean()), boot_below=float((rc == -1).mean()),
                  ci_method="percentile", text=text)
    return factor, float(lo), float(hi), detail


# ----------------------------------------------------------------------------- compute view
def prefill_flops(n_visual: int | Sequence[int], n_text: int | None = None, *,
                  config: str = "qwen2-vl-2b", causal: bool = True) -> np.ndarray:
    """FLOPs of the language-model prefill of a VLM reading ``n_visual`` visual tokens.

    The compute axis of the resize curve (the evaluation protocol (``book/protocol.md``)): chapter 15's count, not a
    new one. It is :func:`fovea_book.qwen_models.lm_prefill_flops` (matmul FLOPs from the
    config, 1 multiply-add = 2 FLOPs, causal attention, LM head on the last position) of
    ``qwen_config(config).text_config`` at ``S = n_visual + n_text`` tokens; ``n_text``
    defaults to the prompt of :mod:`fovea_book.bench.vlm_latency` (``TEXT_BEFORE +
    TEXT_AFTER``), as chapter 15 counts it. The vision tower is not counted (chapter 15:
    it runs on the full grid either way in this pipeline). Side compute (a detector's FLOPs)
    is the caller's to add.

    Args:
        n_visual: a token count or a sequence of them (each an int >= 0).
        n_text: text tokens of the prompt (int >= 0); default as chapter 15.
        config: a name of :data:`fovea_book.qwen_models.MODEL_NAMES` (default the 2B-class
            ``"qwen2-vl-2b"``; needs ``transformers``).

    Returns:
        ``float64`` array shaped like ``n_visual``: total prefill FLOPs.
    """
    from fovea_book.bench.vlm_latency import TEXT_AFTER, TEXT_BEFORE
    from fovea_book.qwen_models import lm_prefill_flops, qwen_config

    n_text = TEXT_BEFORE + TEXT_AFTER if n_text is None else n_text
    if isinstance(n_text, bool) or int(n_text) != n_text or n_text < 0:
        raise ValueError(f"n_text must be an int >= 0, got {n_text!r}")
    nv = np.asarray(n_visual)
    if nv.dtype.kind not in "iuf" or not np.isfinite(nv).all() or (nv < 0).any() \
            or (nv != np.round(nv)).any():
        raise ValueError(f"n_visual must be whole token counts >= 0, got {n_visual!r}")
    tc = qwen_config(config).text_config
    flat = [lm_prefill_flops(tc, int(v) + int(n_text), causal=causal)["total"]
            for v in nv.ravel()]                                          # a few budgets
    return np.asarray(flat, dtype=float).reshape(nv.shape)
