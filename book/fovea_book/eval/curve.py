"""The resize curve and the token-saving factor (the evaluation protocol (``book/protocol.md``), "The resize curve").

One budget hides the trade-off. :func:`resize_curve` reads every document with ``resize`` at
several budgets N (up to the full page: a page whose level-0 grid holds no more than N
patches is read at full resolution, which is what ``resize`` gives it there), and
:func:`saving_table` answers the practitioner's question for each method at its N: how many
tokens does ``resize`` need to read as well? (``N* / N``, with a paired bootstrap CI over
documents, :func:`fovea_book.eval.stats.saving_factor`.) :func:`compute_view` puts the same
curve on a compute axis: the prefill FLOPs of a 2B-class VLM at N visual tokens
(:func:`fovea_book.eval.stats.prefill_flops`) plus a method's side compute.

The unit of every curve point is a document's mean ANLS over its questions (the document is
the unit of resampling), so the curve and a method are compared in the same unit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from fovea_book.eval.documents import Document

__all__ = ["CURVE_BUDGETS", "book_curve_budgets", "compute_view", "curve_kept", "doc_means",
           "full_grid", "resize_curve", "saving_table"]

#: the budgets of the book's resize curve (the protocol's list; the full page closes it)
CURVE_BUDGETS = (273, 400, 576, 1024, 1600, 2304)


def book_curve_budgets(profile: str) -> list[int]:
    """The chapters' curve budgets for ``profile`` (smoke: two points), the same in every
    chapter so that chapter 17 reads chapter 14.5's cached cells."""
    from fovea_book.profiles import choose

    return list(choose(profile, smoke=(273, 576), default=CURVE_BUDGETS, full=CURVE_BUDGETS))


def full_grid(doc: Document, patch: int = 16) -> int:
    """Patches of the document's full-resolution (level-0) grid: ``ceil(H/p) ceil(W/p)``."""
    h, w = doc.size
    return -(-h // patch) * -(-w // patch)


def doc_means(table: pd.DataFrame, label: str, metric: str = "anls") -> pd.Series:
    """Mean ``metric`` per ``(dataset, doc_id)`` of the rows of method ``label``."""
    t = table[table.allocator == label]
    if t.empty:
        raise ValueError(f"no rows of method {label!r} (methods: {sorted(table.allocator.unique())})")
    return t.groupby(["dataset", "doc_id"])[metric].mean()


def resize_curve(datasets: Mapping[str, Sequence[Document]],
                 budgets: Sequence[int] = CURVE_BUDGETS, *, reader=None, seed: int = 0,
                 patch: int = 16, workers: int | None = None, cache_path="default",
                 rescore: Callable[[pd.DataFrame], pd.DataFrame] | None = None) -> pd.DataFrame:
    """``resize`` at each budget on every document: one row per (dataset, doc_id, budget)
    with ``anls`` (the document's mean ANLS), ``ceiling`` (the full page's), ``full_tokens``
    (its level-0 grid) and ``at_full`` (``True`` where the grid holds no more than the budget,
    so the full-page reading is what ``resize`` shows, and no evaluation is needed).

    Cells go through :func:`fovea_book.eval.cascade.evaluate` with the chapters' own
    ``resize`` method, so the budget a chapter already evaluated is read from its cache.
    ``rescore`` (optional) maps each evaluated table to the one the curve is read from, the
    ``full`` rows included (e.g. the WildReceipt scoring with spaces ignored,
    :func:`fovea_book.eval.wildreceipt.rescore_without_spaces`), so the curve is scored as
    the methods it is compared with.
    """
    from fovea_book.eval.cascade import Method, evaluate

    budgets = sorted(int(b) for b in budgets)
    if not budgets or budgets[0] < 1 or len(set(budgets)) != len(budgets):
        raise ValueError(f"budgets must be distinct ints >= 1, got {budgets}")
    method = Method("resize", "resize", scorer="none", query_aware=False)
    ceil: dict[tuple[str, str], float] = {}
    parts = []
    for n in budgets:
        fit = {name: [d for d in docs if full_grid(d, patch) > n] for name, docs in datasets.items()}
        fit = {k: v for k, v in fit.items() if v}
        if fit:
            t = evaluate(fit, [method], n, reader=reader, seed=seed, patch=patch,
                         cache_path=cache_path, workers=workers)
            t = t if rescore is None else rescore(t)
            ceil.update(doc_means(t, "full").to_dict())
            parts.append(doc_means(t, "resize").rename("anls").reset_index().assign(budget=n))
    rows = []
    for name, docs in datasets.items():
        for d in docs:
            for n in budgets:
                if full_grid(d, patch) <= n:
                    rows.append(dict(dataset=name, doc_id=d.doc_id, budget=n, at_full=True))
    read = pd.concat(parts, ignore_index=True).assign(at_full=False) if parts else None
    out = pd.concat([x for x in (read, pd.DataFrame(rows)) if x is not None and len(x)],
                    ignore_index=True)
    missing = [k for k in out[["dataset", "doc_id"]].itertuples(index=False, name=None)
               if k not in ceil]
    if missing:                        # a page whose full grid is below every budget
        raise ValueError(f"documents whose full grid holds no more than the smallest budget "
                         f"{budgets[0]} (read them at full resolution): {sorted(set(missing))}")
    out["ceiling"] = [ceil[k] for k in out[["dataset", "doc_id"]].itertuples(index=False, name=None)]
    out.loc[out.at_full, "anls"] = out.loc[out.at_full, "ceiling"]
    sizes = {(k, d.doc_id): full_grid(d, patch) for k, docs in datasets.items() for d in docs}
    out["full_tokens"] = [sizes[k] for k in out[["dataset", "doc_id"]].itertuples(index=False,
                                                                               name=None)]
    return out.sort_values(["dataset", "doc_id", "budget"], kind="stable").reset_index(drop=True)


def curve_kept(curve: pd.DataFrame, *, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """The ``curve`` of :func:`resize_curve` as *kept* (the share of the full page's reading:
    sum of ANLS / sum of the ceiling's over documents, as
    :func:`~fovea_book.eval.cascade.kept_difference`) per dataset and budget, with a 95 %
    percentile bootstrap CI over documents (:func:`~fovea_book.eval.metrics.bootstrap_ci`,
    the ratio recomputed on each resample). Columns ``dataset, budget, kept, lo, hi,
    n_docs``, sorted by dataset (in the curve's order) and budget."""
    from fovea_book.eval.metrics import bootstrap_ci

    missing = {"dataset", "doc_id", "budget", "anls", "ceiling"} - set(curve.columns)
    if missing:
        raise ValueError(f"curve must have the columns of resize_curve; missing {sorted(missing)}")
    share = lambda x: x[..., 0].sum(-1) / np.maximum(x[..., 1].sum(-1), 1e-12)  # noqa: E731
    rows = [dict(dataset=ds, budget=int(n), n_docs=len(g), **dict(zip(
        ("kept", "lo", "hi"), bootstrap_ci(g[["anls", "ceiling"]].to_numpy(float),
                                           n_boot=n_boot, seed=seed, stat=share))))
            for (ds, n), g in curve.groupby(["dataset", "budget"], sort=False)]
    order = {d: i for i, d in enumerate(dict.fromkeys(curve.dataset))}
    out = pd.DataFrame(rows, columns=["dataset", "budget", "kept", "lo", "hi", "n_docs"])
    return out.sort_values(["dataset", "budget"], key=lambda c: c.map(order) if c.name ==
                           "dataset" else c, kind="stable").reset_index(drop=True)


def saving_table(curve: pd.DataFrame, table: pd.DataFrame, methods: Sequence[str],
                 budget: int, *, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Token-saving factor of each method of ``table`` (evaluated at ``budget``) against the
    ``curve`` of :func:`resize_curve`, per dataset: columns ``dataset, method, kept``
    (the method's mean ANLS over documents), ``factor, lo, hi`` (95 % percentile bootstrap
    over documents, paired with the curve), ``censored`` (``"above"``: the method reads
    better than ``resize`` at the curve's largest budget, the factor is at least ``bound``;
    ``"below"``: not better than ``resize`` at the smallest, at most ``bound``), ``bound``,
    ``text`` (``"3.2x [2.1, 4.8]"`` or ``">= 8.4x"``), ``n_docs``.

    A document enters when it has the method's rows and a complete curve.
    """
    from fovea_book.eval.stats import saving_factor

    budgets = sorted(curve.budget.unique())
    wide = curve.pivot_table(index=["dataset", "doc_id"], columns="budget", values="anls")
    wide = wide.dropna()
    rows = []
    for m in methods:
        mk = doc_means(table, m)
        for ds in sorted(set(wide.index.get_level_values(0)) & set(mk.index.get_level_values(0))):
            w = wide.loc[ds]
            ids = sorted(set(w.index) & set(mk.loc[ds].index))
            if not ids:
                continue
            f, lo, hi, d = saving_factor(budgets, w.loc[ids, budgets].to_numpy(), budget,
                                         mk.loc[ds].loc[ids].to_numpy(), n_boot=n_boot, seed=seed)
            rows.append(dict(dataset=ds, method=m, kept=d["target"], factor=f, lo=lo, hi=hi,
                             censored=d["censored"], bound=d["bound"], text=d["text"],
                             n_docs=d["n_docs"]))
    return pd.DataFrame(rows)


def compute_view(curve: pd.DataFrame, points: pd.DataFrame | None = None, *,
                 side_flops: Mapping[str, float] | None = None) -> pd.DataFrame:
    """The resize curve and methods on a compute axis: per dataset and budget (curve) or
    method (``points``: rows ``dataset, method, budget, kept``), the mean ANLS ``kept`` and
    ``flops`` = the 2B-class prefill at that many visual tokens
    (:func:`fovea_book.eval.stats.prefill_flops`) plus the method's ``side_flops`` (0 when
    not given)."""
    from fovea_book.eval.stats import prefill_flops

    c = curve.groupby(["dataset", "budget"]).anls.mean().rename("kept").reset_index()
    c["method"] = "resize"
    out = [c]
    if points is not None and len(points):
        out.append(points[["dataset", "method", "budget", "kept"]])
    df = pd.concat(out, ignore_index=True)
    side = side_flops or {}
    df["side_flops"] = [float(side.get(m, 0.0)) for m in df.method]
    df["flops"] = np.asarray(prefill_flops(df.budget.astype(int).tolist()), float) + df.side_flops
    return df
