"""The sweep runner: allocators x budgets x datasets -> one tidy table, with bootstrap CIs.

For every document the pipeline of the book runs once per (allocator, budget)::

    page --build_pyramid--> Pyramid --score(scorer[, question])--> [1, Gh, Gw]
         --allocate(name, budget)--> TokenSet --sample/render--> the reader's crops
         --Reader on each answer's line boxes--> string --ANLS / EM--> row

Only the crops the reader reads are rendered (:func:`fovea_book.eval.reader.read_answer`,
the same pixels as cropping the full :func:`fovea_core.sample.render`, tested), so a cell
costs the allocation and the OCR, not a page-sized render per question.

plus one ``allocator="full"`` row per question (the full-resolution page: the reader's
ceiling). Allocators and scorers see only the page and, when ``query_aware``, the question
text; the answer boxes are used by the reader alone.

The rows are computed by the one per-document evaluator,
:func:`fovea_book.eval.evaluator.evaluate_document` (each allocator spec becomes a
:class:`~fovea_book.eval.evaluator.Method`), which the cascade chapter's
:func:`fovea_book.eval.cascade.evaluate` uses too: the same columns, cell keys and
cache file.

**Cost in tokens** (the evaluation protocol (``book/protocol.md``)): every row carries ``scorer_tokens`` (what the
scorer read, :func:`fovea_core.importance.scorer_cost`), ``alloc_read_tokens`` (what a
content allocator read, :func:`fovea_core.allocators.registry.allocator_reads`),
``total_tokens = budget + scorer_tokens + alloc_read_tokens`` and the two flags of its
label, ``side_compute`` and ``unbudgeted``, by the one rule
(:func:`fovea_core.cost.method_cost`, which ``foveate`` uses too): a scorer's or
allocator's look outside N is side compute, unbudgeted when it recognises text or exceeds
the budget. A callable without a declared ``reads`` gives NaN costs (unbudgeted).

:func:`run_sweep` returns one row per document x question x allocator x budget;
:func:`summarize` averages questions within a document, then bootstraps over documents
(the resampling unit, since questions on one page are not independent).

**One cache for the whole book.** The rows of every (document, method, budget) *cell* are
stored in one SQLite file per ``fovea_core`` source fingerprint
(``data/cache/sweep/rows-<fingerprint[:12]>.sqlite``,
:func:`~fovea_book.eval.evaluator.cell_cache_path`), keyed by
:func:`~fovea_book.eval.evaluator.cell_key`: the document's content hash, the method (label,
allocator, parameters, scorer, query-awareness, hooks) and budget, the reader, the seed,
patch and strata, the device, the source fingerprint and the versions of the libraries that
produce the numbers. Chapters that evaluate the same cell share it, an interrupted sweep
resumes cell by cell, and a change of code, data or library never reuses a stale row;
:func:`~fovea_book.eval.evaluator.evict_stale_caches` deletes the files of older code.

Backends: ``"inprocess"`` (default, a loop with a progress bar), ``"processes"`` (one
document per task on a ``ProcessPoolExecutor``, ``workers`` processes, one torch thread
each; the evaluator's dispatch), ``"dask"`` (a ``dask.bag`` over documents on dask's local
scheduler, or any scheduler you pass, e.g. a ``dask.distributed.Client`` connected to a
cluster), ``"ray"`` (the same bag on Ray's dask scheduler, ``ray.util.dask.ray_dask_get``;
needs ``ray``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from fovea_book.eval.documents import Document
from fovea_book.eval.evaluator import (  # noqa: F401  (re-exported: their old home)
    TIMING_COLUMNS,
    Method,
    alloc_read_tokens,
    cached_score,
    cell_cache_path,
    code_fingerprint,
    default_cache_dir,
    document_fingerprint,
    document_job,
    document_jobs,
    evaluate_documents,
    library_versions,
    map_processes,
    process_pool,
    rows_frame,
    scorer_tokens,
    shutdown_pools,
    uses_scores,
)
from fovea_book.eval.evaluator import cost_label
from fovea_book.eval.metrics import bootstrap_ci
from fovea_book.eval.reader import Reader
from fovea_core.tokens import TokenSet

AllocatorSpec = str | tuple[str, dict] | tuple[str, Callable]
BACKENDS = ("inprocess", "processes", "dask", "ray")


def _spec(spec: AllocatorSpec) -> tuple[str, Callable | str, dict]:
    """``(label, allocator name or callable, params)`` of one allocator spec."""
    if isinstance(spec, str):
        return spec, spec, {}
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], str):
        if isinstance(spec[1], dict):
            label = spec[0] + "".join(f"_{k}{v}" for k, v in sorted(spec[1].items()))
            return label, spec[0], dict(spec[1])
        if callable(spec[1]):
            return spec[0], spec[1], {}
    raise ValueError("each allocator must be a name, (name, params dict) or "
                     f"(label, callable); got {spec!r}")


def sweep_methods(allocators: Sequence[AllocatorSpec], scorer: str | Callable = "saliency",
                  query_aware: bool = False) -> list[Method]:
    """The evaluator's :class:`~fovea_book.eval.evaluator.Method` of each allocator spec of
    :func:`run_sweep` (every one with ``scorer`` and ``query_aware``)."""
    out = []
    for spec in allocators:
        label, fn, params = _spec(spec)
        out.append(Method(label, fn, params, scorer=scorer, query_aware=bool(query_aware)))
    return out


def reconstruct(pyramid, tokens: TokenSet) -> np.ndarray:
    """What the model sees: :func:`fovea_core.sample.render` of the sampled patches over the
    pyramid's coarsest level, as ``[H, W, 3]`` float in [0, 1]."""
    from fovea_core.sample import render, sample

    out = render(tokens, sample(pyramid, tokens), background=pyramid)
    return out[0].permute(1, 2, 0).clamp(0, 1).cpu().numpy()


def run_sweep(allocators: Sequence[AllocatorSpec], budgets: Sequence[int],
              datasets: Mapping[str, Sequence[Document]], *, scorer: str | Callable = "saliency",
              query_aware: bool = False, reader: Reader | None = None,
              out: str | Path | None = None, backend: str = "inprocess",
              scheduler: str | Callable | object | None = None, workers: int | None = None,
              cache_dir: str | Path | None = "default", resume: bool = True,
              progress: bool = True, seed: int = 0, patch: int = 16, strata: int = 8,
              device: str = "cpu") -> pd.DataFrame:
    """Run every allocator at every budget on every document; return the tidy table.

    Args:
        allocators: registry names (``"topk"``), ``(name, params)`` (``("stratified",
            {"strata": 8})``, labelled ``stratified_strata8``) or ``(label, callable)`` with
            the allocator signature ``fn(pyramid, scores, budget, *, seed, query, ...)``
            (optionally with an attribute ``reads(pyramid) -> pixels``).
        budgets: token budgets N, each in ``[1, Gh * Gw]`` of every page.
        datasets: ``{name: documents}``.
        scorer: a :data:`fovea_core.importance.SCORERS` name or ``fn(image, *, query, patch)``
            (optionally with an attribute ``reads(h, w) -> pixels``).
        query_aware: score per question (the scorer and the allocator get
            ``query=question``) instead of once per page.
        reader: the OCR :class:`~fovea_book.eval.reader.Reader` (default: rapidocr, cached).
        out: folder for ``results.csv`` (and ``results.parquet`` with pyarrow); ``None``:
            nothing written.
        backend: ``"inprocess"``, ``"processes"``, ``"dask"`` or ``"ray"``.
        scheduler: dask scheduler (``"threads"`` default, ``"processes"``, ``"sync"``, a ``get``
            callable, or a ``dask.distributed.Client``); ignored by the other backends.
        workers: processes of the ``"processes"`` backend (default: the CPU count).
        cache_dir: folder of the shared cell cache, whose file is
            ``rows-<fingerprint[:12]>.sqlite`` (``"default"``: :func:`default_cache_dir`;
            ``None``: no cache).
        resume: reuse cached cells (``False`` recomputes every cell and overwrites it).
        progress: show a progress bar.
        seed: base seed of the random allocators (each document gets its own stream).
        patch, strata: token patch size; strata per side for ``strata_cov``.
        device: torch device for pyramid, scores, allocation and rendering.

    Returns:
        One row per document x question x allocator x budget (+ one ``allocator="full"``
        row per question) with columns ``dataset, doc_id, qid, field, size_px, allocator,
        budget, pred, anls, em, ceiling_anls, ceiling_em, strata_cov, empty_disc_px,
        empty_disc_frac, answer_level, alloc_ms, render_ms, peak_mem_mb, scorer_tokens,
        alloc_read_tokens, total_tokens, unbudgeted, height, width, scorer, query_aware``,
        sorted by dataset, document, allocator, budget, question
        (:data:`~fovea_book.eval.evaluator.ROW_COLUMNS`). The ``full`` rows carry
        ``scorer="none"`` and ``query_aware=False`` (the reader read the page, no scorer).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if not allocators or not budgets:
        raise ValueError("allocators and budgets must be non-empty")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if not allocators or not budgets:
        raise ValueError("allocators and budgets must be non-empty")
    if any(isinstance(b, bool) or int(b) != b or int(b) < 1 for b in budgets):
        raise ValueError(f"budgets must be positive integers, got {list(budgets)}")
    if not isinstance(datasets, Mapping) or not datasets:
        raise ValueError("datasets must be a non-empty {name: documents} mapping")
    methods = sweep_methods(allocators, scorer, query_aware)
    if isinstance(scorer, str):
        scorer_tokens(scorer, (16, 16))                        # unknown names fail here
    reader = reader or Reader()
    if cache_dir == "default":
        cache_dir = default_cache_dir()
    cache_path = None if cache_dir is None else cell_cache_path(cache_dir)
    kw = dict(reader=reader, seed=seed, patch=patch, strata=strata, device=device)
    budgets = [int(b) for b in budgets]
    if backend == "processes" and (any(callable(m.allocator) for m in methods)
                                   or callable(scorer)):
        backend = "inprocess"          # callables defined in a notebook do not pickle
    if backend in ("inprocess", "processes"):
        df = evaluate_documents(datasets, methods, budgets,
                                workers=1 if backend == "inprocess" else workers,
                                cache_path=cache_path, refresh=not resume,
                                progress=progress, **kw)
    else:
        jobs = document_jobs(datasets, methods, budgets, kw, cache_path, not resume)
        df = rows_frame([r for rows in _run_dask(document_job, jobs, backend, scheduler,
                                                 progress) for r in rows])
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        df.to_csv(Path(out) / "results.csv", index=False)
        try:
            df.to_parquet(Path(out) / "results.parquet", index=False)
        except ImportError:
            pass  # parquet needs pyarrow or fastparquet; the CSV is the canonical copy
    return df


def _run_dask(task, jobs, backend: str, scheduler, progress: bool) -> list:
    """Map ``task`` over ``jobs`` with a ``dask.bag`` (one partition per document)."""
    import contextlib

    import dask.bag as db

    if backend == "ray":
        try:
            from ray.util.dask import ray_dask_get
        except ImportError as err:
            raise ImportError("backend='ray' needs ray (pip install 'ray[default]'); "
                              "backend='dask' runs without it") from err
        scheduler = ray_dask_get
    if not jobs:
        return []
    bag = db.from_sequence(jobs, npartitions=len(jobs)).map(task)
    distributed = hasattr(scheduler, "submit") and hasattr(scheduler, "get")
    if distributed:                     # a dask.distributed Client: run on its cluster
        return list(bag.compute(scheduler=scheduler.get))
    ctx = contextlib.nullcontext()
    if progress:
        from dask.diagnostics import ProgressBar

        ctx = ProgressBar()
    with ctx:
        return list(bag.compute(scheduler=scheduler or "threads"))


def summarize(df: pd.DataFrame, by: Sequence[str] = ("dataset", "allocator", "budget"), *,
              n_boot: int = 2000, ci: float = 0.95, seed: int = 0,
              docs: Sequence[str] | None = None) -> pd.DataFrame:
    """Mean metrics per group with percentile-bootstrap CIs over documents.

    Questions are first averaged within each document (the resampling unit). Columns:
    ``n_docs, n_questions``; ``anls, em`` with ``_lo/_hi``; ``kept`` = sum of ANLS / sum
    of ceiling ANLS (fraction of the reader's full-resolution score kept) with ``_lo/_hi``
    (ratio bootstrapped with documents paired); ``ceiling_anls``; medians over documents of
    ``scorer_tokens``, ``alloc_read_tokens`` and ``total_tokens`` (the cost in tokens:
    allocated + read outside the budget), ``unbudgeted`` (any document's row was:
    :func:`fovea_core.cost.method_cost`), ``side_compute`` (any document's row was);
    ``anls_per_100_tokens`` (ANLS per 100 of the *total* tokens); means of
    ``strata_cov, empty_disc_frac``; median ``alloc_ms``. The ``full`` rows of a dataset are
    pooled into one group whose budget is the median token count of its pages (pages of
    different sizes have different full grids). ``docs`` restricts the documents (e.g. the
    report half of :func:`fovea_book.eval.stats.split_halves`).
    """
    by = list(by)
    if docs is not None:
        df = df[df["doc_id"].isin(set(docs))]
    full = df["allocator"] == "full" if "allocator" in df else None
    if full is not None and "budget" in by and full.any():
        med = df.loc[full].groupby("dataset")["budget"].transform("median").round()
        df = df.copy()
        df.loc[full, "budget"] = med.astype(df["budget"].dtype)
    missing = [c for c in by + ["doc_id", "anls", "em", "ceiling_anls"] if c not in df]
    if missing:
        raise ValueError(f"df lacks columns {missing}; pass the table from run_sweep")
    df = df.copy()
    for c in ("scorer_tokens", "alloc_read_tokens", "total_tokens"):
        if c not in df:
            df[c] = df["budget"].astype(float) if c == "total_tokens" else 0.0
    if "unbudgeted" not in df:
        df["unbudgeted"] = False
    df["unbudgeted"] = df["unbudgeted"].map(lambda v: bool(v) if v is not None and v == v
                                            else False)
    if "side_compute" not in df:
        df["side_compute"] = False
    df["side_compute"] = df["side_compute"].map(lambda v: bool(v) if v is not None and v == v
                                                else False)
    per_doc = (df.groupby(by + ["doc_id"], sort=True)
               .agg(anls=("anls", "mean"), em=("em", "mean"), ceil=("ceiling_anls", "mean"),
                    n=("anls", "size"), strata_cov=("strata_cov", "mean"),
                    empty_disc_frac=("empty_disc_frac", "mean"), alloc_ms=("alloc_ms", "median"),
                    scorer_tokens=("scorer_tokens", "first"),
                    alloc_read_tokens=("alloc_read_tokens", "first"),
                    total_tokens=("total_tokens", "first"), unbudgeted=("unbudgeted", "any"),
                    side_compute=("side_compute", "any"))
               .reset_index())
    ratio = lambda a: a[..., 0].sum(-1) / np.maximum(a[..., 1].sum(-1), 1e-12)  # noqa: E731
    out = []
    for key, g in per_doc.groupby(by, sort=True):  # one group per table row
        row = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        row.update(n_docs=len(g), n_questions=int(g["n"].sum()))
        for m in ("anls", "em"):
            row[m], row[f"{m}_lo"], row[f"{m}_hi"] = bootstrap_ci(
                g[m].to_numpy(), n_boot=n_boot, ci=ci, seed=seed)
        row["kept"], row["kept_lo"], row["kept_hi"] = bootstrap_ci(
            g[["anls", "ceil"]].to_numpy(), n_boot=n_boot, ci=ci, seed=seed, stat=ratio)
        row["ceiling_anls"] = g["ceil"].mean()
        for c in ("scorer_tokens", "alloc_read_tokens", "total_tokens"):
            row[c] = float(g[c].median())
        row["unbudgeted"] = bool(g["unbudgeted"].any())
        row["side_compute"] = bool(g["side_compute"].any())
        if "budget" in row:
            row["anls_per_100_tokens"] = 100.0 * row["anls"] / float(row["total_tokens"])
        row["strata_cov"] = g["strata_cov"].mean()
        row["empty_disc_frac"] = g["empty_disc_frac"].mean()
        row["alloc_ms"] = g["alloc_ms"].median()
        out.append(row)
    return pd.DataFrame(out)


#: the baselines every ranked table starts with (the evaluation protocol, ``book/protocol.md``): the ceiling and the plain resize
BASELINES = ("full", "resize")


def ranked(summary: pd.DataFrame, budget: int, *, metric: str = "kept") -> pd.DataFrame:
    """One dataset's or several datasets' ranking at ``budget`` in the protocol's shape.

    Per dataset: ``full`` then ``resize`` first (the ceiling and what a VLM would otherwise
    do), then the other methods by ``metric`` (descending), each with its total tokens and a
    ``label``: ``"baseline"`` for the two baselines, else the summary row's
    :func:`~fovea_book.eval.evaluator.cost_label` of its flags (the one rule,
    :func:`fovea_core.cost.method_cost`): ``"unbudgeted"`` when what its scorer/allocator
    read outside N recognised text or exceeded the budget, else ``"side compute"`` when it
    read anything outside N, which only said where text is (costed beside N; never ranked
    as if it were budgeted: the ``rank`` column counts budgeted methods only), and ``""``
    for budgeted. Columns: ``dataset,
    rank, allocator, label, total_tokens, metric, metric_lo, metric_hi, n_docs``.
    """
    at = summary[(summary.budget == budget) | (summary.allocator == "full")]
    parts = []
    for ds, g in at.groupby("dataset", sort=True):
        g = g.copy()
        side = g["side_compute"] if "side_compute" in g else np.zeros(len(g), bool)
        cost = cost_label(side, g.unbudgeted)            # the one rule (budgeted shows as "")
        g["label"] = np.where(g.allocator.isin(BASELINES), "baseline",
                              np.where(cost == "budgeted", "", cost))
        head = g[g.allocator.isin(BASELINES)].set_index("allocator").reindex(
            [b for b in BASELINES if b in set(g.allocator)]).reset_index()
        rest = g[~g.allocator.isin(BASELINES)].sort_values(metric, ascending=False)
        rest = pd.concat([rest[rest.label == ""], rest[rest.label == "side compute"],
                          rest[rest.label == "unbudgeted"]])
        rank = np.where(rest.label == "", np.cumsum(rest.label == ""), 0)
        rest = rest.assign(rank=[str(int(r)) if r else "-" for r in rank])
        head = head.assign(rank="-")
        parts.append(pd.concat([head, rest]).assign(dataset=ds))
    out = pd.concat(parts, ignore_index=True)
    return out[["dataset", "rank", "allocator", "label", "total_tokens", metric,
                f"{metric}_lo", f"{metric}_hi", "n_docs"]]


def compare(df: pd.DataFrame, a: str, b: str, *, metric: str = "anls", n_boot: int = 2000,
            ci: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Paired difference ``a - b`` of ``metric`` per (dataset, budget), bootstrapped over
    the documents both allocators ran on.

    ``b`` may be ``"full"`` (its single budget is compared with every budget of ``a``).
    Returns columns ``dataset, budget, diff, diff_lo, diff_hi, n_docs``.
    """
    for name in (a, b):
        if name not in set(df["allocator"]):
            raise ValueError(f"allocator {name!r} is not in the table; "
                             f"have {sorted(set(df['allocator']))}")
    per = df.groupby(["dataset", "allocator", "budget", "doc_id"])[metric].mean().reset_index()
    pa = per[per.allocator == a]
    pb = per[per.allocator == b].drop(columns="allocator")
    on = ["dataset", "doc_id"] + ([] if b == "full" else ["budget"])
    if b == "full":
        pb = pb.drop(columns="budget")
    m = pa.merge(pb, on=on, suffixes=("_a", "_b"))
    rows = []
    for (ds, budget), g in m.groupby(["dataset", "budget"], sort=True):
        est, lo, hi = bootstrap_ci((g[f"{metric}_a"] - g[f"{metric}_b"]).to_numpy(),
                                   n_boot=n_boot, ci=ci, seed=seed)
        rows.append(dict(dataset=ds, budget=budget, diff=est, diff_lo=lo, diff_hi=hi,
                         n_docs=len(g)))
    return pd.DataFrame(rows)


def plot_budget_curves(summary: pd.DataFrame, metric: str = "kept", *, ax=None,
                       dataset: str | None = None, full: bool = True):
    """``metric`` (with its ``_lo/_hi`` CI band) against the budget, one line per allocator.

    ``summary`` is :func:`summarize`'s table; ``dataset`` selects one dataset (default: the
    only one). The ``full`` row, if present, is drawn as a horizontal line.
    """
    import matplotlib.pyplot as plt

    s = summary
    if dataset is None:
        if s["dataset"].nunique() != 1:
            raise ValueError(f"pass dataset= (one of {sorted(s['dataset'].unique())})")
        dataset = s["dataset"].iloc[0]
    s = s[s["dataset"] == dataset]
    ax = ax or plt.subplots(figsize=(5, 3.5))[1]
    for name, g in s[s["allocator"] != "full"].groupby("allocator", sort=True):
        g = g.sort_values("budget")
        line, = ax.plot(g["budget"], g[metric], marker="o", ms=3, label=name)
        if f"{metric}_lo" in g:
            ax.fill_between(g["budget"], g[f"{metric}_lo"], g[f"{metric}_hi"],
                            color=line.get_color(), alpha=0.15, lw=0)
    if full and (s["allocator"] == "full").any():
        f = s[s["allocator"] == "full"].iloc[0]
        ax.axhline(f[metric], color="k", ls="--", lw=1, label=f"full ({int(f['budget'])} tok)")
    ax.set_xlabel("token budget N")
    ax.set_ylabel(metric)
    ax.set_title(dataset)
    ax.grid(alpha=0.3)
    return ax
