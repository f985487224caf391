"""Adaptive budgets against fixed ones at the same mean token count (chapter 14).

``adaptive_budget`` sends each page to a budget bucket by its edge density
(:func:`~fovea_core.allocators.wrappers.bucket_budgets`, the one bucket rule). To ask
whether adapting helps, the chapter compares adaptive top-K with fixed top-K and
``resize`` at the *same mean number of tokens* per page:

* :func:`page_complexity` -- each page's edge density and grid size;
* :func:`threshold_rules` -- the seeds' fixed thresholds and each dataset's complexity
  quartiles (computed from the pages alone, no answers);
* :func:`bucket_assignments` -- the budget each rule gives each page, and
  :func:`mean_budgets` the mean per rule and dataset;
* :func:`fixed_rows` -- the fixed-budget sweep rows those budgets need;
* :func:`adaptive_table` -- adaptive top-K rows (each page read at its own budget) beside
  the fixed allocations at the mean, one ``"dataset | rule"`` per comparison;
* :func:`adaptive_family` -- one Holm family of those comparisons, and
  :func:`adaptive_line` a sentence of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from fovea_book.eval.document_types import Document

__all__ = ["SEED_THRESHOLDS", "page_complexity", "threshold_rules", "bucket_assignments",
           "mean_budgets", "fixed_rows", "adaptive_table", "adaptive_family", "adaptive_line"]

#: the seeds' complexity thresholds between the four buckets
SEED_THRESHOLDS: tuple[float, ...] = (0.25, 0.5, 0.75)
_ROW_KEYS = ["dataset", "doc_id", "qid", "allocator", "budget"]


def page_complexity(datasets: Mapping[str, Sequence[Document]], patch: int = 16
                    ) -> pd.DataFrame:
    """``dataset, doc_id, complexity, cells``: one row per page (datasets, then pages, in
    order) with its :func:`~fovea_core.allocators.wrappers.image_complexity` (the float32
    value) and its number of base-grid patches ``Gh * Gw``.

    Pages differ in size, so each page's pyramid is built on its own (a loop over pages,
    none over patches).
    """
    from fovea_core.allocators.wrappers import image_complexity
    from fovea_core.pyramid import build_pyramid

    rows = []
    for ds, docs in datasets.items():
        for d in docs:
            p = build_pyramid(d.image)
            gh, gw = p.grid_shape(patch, 0)
            rows.append(dict(dataset=ds, doc_id=d.doc_id,
                             complexity=float(image_complexity(p, patch)[0]), cells=gh * gw))
    return pd.DataFrame(rows, columns=["dataset", "doc_id", "complexity", "cells"])


def threshold_rules(cx: pd.DataFrame, seed_thresholds: Sequence[float] = SEED_THRESHOLDS
                    ) -> dict[str, dict[str, tuple[float, ...]]]:
    """``{rule: {dataset: thresholds}}`` for ``"seed thresholds"`` (``seed_thresholds`` for
    every dataset) and ``"quartile thresholds"`` (each dataset's 25/50/75 % quantiles of
    ``cx.complexity``, :func:`page_complexity`'s table), datasets in ``cx``'s order."""
    if cx.empty:
        raise ValueError("threshold_rules: cx has no pages")
    datasets = list(dict.fromkeys(cx.dataset))
    return {"seed thresholds": {ds: tuple(seed_thresholds) for ds in datasets},
            "quartile thresholds": {ds: tuple(np.quantile(cx.complexity[cx.dataset == ds]
                                                          .to_list(), [0.25, 0.5, 0.75]))
                                    for ds in datasets}}


def bucket_assignments(cx: pd.DataFrame, rules: Mapping[str, Mapping[str, Sequence[float]]],
                       budget: int) -> pd.DataFrame:
    """``dataset, doc_id, rule, complexity, budget``: the budget ``adaptive_budget`` (nominal
    ``budget``) gives each page of ``cx`` under each rule's thresholds for its dataset, one
    row per page and rule (pages in ``cx``'s order, rules in ``rules``' order), computed for
    all pages of a dataset at once by
    :func:`~fovea_core.allocators.wrappers.bucket_budgets`."""
    from fovea_core.allocators.wrappers import bucket_budgets

    per_rule = []
    for r, th in rules.items():                                 # over the rules x datasets
        missing = sorted(set(cx.dataset) - set(th))
        if missing:
            raise ValueError(f"bucket_assignments: rule {r!r} has no thresholds for {missing}")
        b = np.zeros(len(cx), dtype=np.int64)
        for ds, t in th.items():
            m = (cx.dataset == ds).to_numpy()
            if m.any():
                b[m] = bucket_budgets(torch.tensor(cx.complexity[m].to_numpy()), budget,
                                      torch.tensor(cx.cells[m].to_numpy()),
                                      thresholds=tuple(t)).numpy()
        per_rule.append(pd.DataFrame(dict(dataset=cx.dataset.to_numpy(),
                                          doc_id=cx.doc_id.to_numpy(), rule=r,
                                          complexity=cx.complexity.to_numpy(), budget=b,
                                          _page=np.arange(len(cx)))))
    out = pd.concat(per_rule, ignore_index=True)
    rule_order = {r: i for i, r in enumerate(rules)}
    out = out.assign(_rule=out.rule.map(rule_order)).sort_values(["_page", "_rule"],
                                                                  kind="stable")
    return out.drop(columns=["_page", "_rule"]).reset_index(drop=True)


def mean_budgets(assign: pd.DataFrame) -> pd.Series:
    """The mean budget per ``(rule, dataset)`` of :func:`bucket_assignments`, rounded to
    whole tokens (int): the fixed budget each adaptive rule is compared at."""
    return assign.groupby(["rule", "dataset"]).budget.mean().round().astype(int)


def fixed_rows(assign: pd.DataFrame, means: pd.Series,
               datasets: Mapping[str, Sequence[Document]],
               sweep: Callable[..., tuple[pd.DataFrame, pd.DataFrame]]) -> pd.DataFrame:
    """The fixed-budget rows the comparison needs, ``full`` rows dropped, one row per
    ``dataset, doc_id, qid, allocator, budget``: ``topk`` at every budget a page was
    assigned (on those pages), and ``topk`` and ``resize`` at each mean budget (on every
    page of the dataset). ``sweep(allocators, docs, budgets=[b])`` runs one budget (e.g.
    :func:`~fovea_book.eval.experiments.chapter_sweep` with the chapter's reader and
    backend bound); budgets run in ascending order."""
    by_budget: dict = {}                    # budget -> {dataset: doc ids} of pages that need it
    for ds, doc_id, b in zip(assign.dataset, assign.doc_id, assign.budget):
        by_budget.setdefault(b, {}).setdefault(ds, set()).add(doc_id)
    for (_, ds), b in means.items():
        by_budget.setdefault(b, {}).setdefault(ds, set()).update(d.doc_id for d in datasets[ds])
    rows = []
    for b, need in sorted(by_budget.items()):                      # over the few budgets
        docs = {ds: [d for d in datasets[ds] if d.doc_id in ids] for ds, ids in need.items()}
        allocs = ["topk", "resize"] if any(b == m for m in means) else ["topk"]
        t, _ = sweep(allocs, docs, budgets=[b])
        rows.append(t[t.allocator != "full"])
    return pd.concat(rows, ignore_index=True).drop_duplicates(_ROW_KEYS)


def adaptive_table(assign: pd.DataFrame, fixed: pd.DataFrame, means: pd.Series
                   ) -> pd.DataFrame:
    """Per ``(rule, dataset)`` of ``means``, dataset ``"ds | rule"``: adaptive top-K
    (allocator ``"adaptive topk (rule)"``, each page's ``fixed`` top-K row at its assigned
    budget, labelled with the mean budget) and every fixed allocation at the mean budget
    (allocator ``"topk (rule)"``, ``"resize (rule)"``)."""
    parts = []
    for (rule, ds), mean_b in means.items():                       # over rules x datasets
        pick = assign[(assign.rule == rule) & (assign.dataset == ds)][["doc_id", "budget"]]
        ada = fixed[(fixed.allocator == "topk") & (fixed.dataset == ds)].merge(
            pick, on=["doc_id", "budget"])
        ada = ada.assign(allocator=f"adaptive topk ({rule})", budget=mean_b)
        same = fixed[(fixed.dataset == ds) & (fixed.budget == mean_b)]
        parts.append(pd.concat([ada, same.assign(allocator=same.allocator + f" ({rule})")])
                     .assign(dataset=f"{ds} | {rule}"))
    return pd.concat(parts, ignore_index=True)


def adaptive_family(table: pd.DataFrame, rules: Sequence[str],
                    bases: Sequence[str] = ("topk", "resize"), *, seed: int = 0
                    ) -> pd.DataFrame:
    """Adaptive top-K minus each fixed base at the same mean budget, per rule and dataset,
    as one family: :func:`~fovea_book.eval.stats.paired_family` rows of
    :func:`adaptive_table` (rules, then bases), ``p_holm`` by Holm over all of them and
    ``verdict`` from that adjusted p-value."""
    from fovea_book.eval.stats import pairs_family

    return pairs_family(table, [(f"adaptive topk ({rule})", f"{base} ({rule})")
                                for rule in rules for base in bases], seed=seed)


def adaptive_line(fam: pd.DataFrame, dataset: str, rule: str, *,
                  missing: str = "not measured (no SROIE data)") -> str:
    """The rows of :func:`adaptive_family` for ``dataset`` under ``rule`` as markdown:
    ``"minus fixed `topk` at 318 tokens: **better** (+3.1 [...] ANLS points, n = 40); ..."``;
    ``missing`` when there is none."""
    rows = fam[fam.dataset == f"{dataset} | {rule}"]
    if rows.empty:
        return missing
    return "; ".join(f"minus fixed `{r.baseline.split(' (')[0]}` at {r.budget} tokens: "
                     f"**{r.verdict}** ({r.text} ANLS points, n = {r.n_docs})"
                     for r in rows.itertuples())
