"""The sweep runner: allocators x budgets x datasets -> one tidy table, with bootstrap CIs.

For every document the pipeline of the book runs once per (allocator, budget)::

    page --build_pyramid--> Pyramid --score(scorer[, question])--> [1, Gh, Gw]
         --allocate(name, budget)--> TokenSet --sample/render--> reconstruction
         --Reader on each answer's line boxes--> string --ANLS / EM--> row

plus one ``allocator="full"`` row per question (the full-resolution page: the reader's
ceiling). Allocators and scorers see only the page and, when ``query_aware``, the question
text; the answer boxes are used by the reader alone.

:func:`run_sweep` returns one row per document x question x allocator x budget;
:func:`summarize` averages questions within a document, then bootstraps over documents
(the resampling unit, since questions on one page are not independent).

Backends: ``"inprocess"`` (default, a loop with a progress bar), ``"dask"`` (a
``dask.bag`` over documents computed by dask's local scheduler, or any scheduler you pass,
e.g. a ``distributed.Client``'s ``get``), ``"ray"`` (the same bag on Ray's dask scheduler,
``ray.util.dask.ray_dask_get``; needs ``ray``). Rows are written per document under
``out/parts/`` so an interrupted sweep resumes where it stopped (parts are keyed by the
configuration and a fingerprint of the ``fovea_core`` sources, so stale rows are never
reused after a code change).
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from fovea_core.eval.documents import Document
from fovea_core.eval.metrics import (anls, bootstrap_ci, exact_match, largest_empty_disc,
                                     strata_coverage)
from fovea_core.eval.reader import Reader
from fovea_core.pyramid import build_pyramid
from fovea_core.tokens import TokenSet

AllocatorSpec = str | tuple[str, dict] | tuple[str, Callable]
BACKENDS = ("inprocess", "dask", "ray")
#: columns that differ between identical runs (wall-clock measurements)
TIMING_COLUMNS = ("alloc_ms", "render_ms", "peak_mem_mb")
#: read back as strings when resuming (an OCR result "9.00" must not become 9.0)
_TEXT_COLUMNS = ("dataset", "doc_id", "qid", "field", "allocator", "pred", "scorer")


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


def _allocate(fn: Callable | str, pyramid, scores, budget: int, **kw) -> TokenSet:
    if callable(fn):
        return fn(pyramid, scores, budget, **kw)
    from fovea_core.allocators import allocate

    return allocate(fn, pyramid, scores, budget, **kw)


def _score(scorer: str | Callable, image: torch.Tensor, query: str | None,
           patch: int) -> torch.Tensor:
    if callable(scorer):
        return scorer(image, query=query, patch=patch)
    from fovea_core.importance import score

    return score(scorer, image, query=query, patch=patch)


def reconstruct(pyramid, tokens: TokenSet) -> np.ndarray:
    """What the model sees: :func:`fovea_core.sample.render` of the sampled patches over the
    pyramid's coarsest level, as ``[H, W, 3]`` float in [0, 1]."""
    from fovea_core.sample import render, sample

    out = render(tokens, sample(pyramid, tokens), background=pyramid)
    return out[0].permute(1, 2, 0).clamp(0, 1).cpu().numpy()


def _answer_level(tokens: TokenSet, box: tuple[int, int, int, int]) -> float:
    """Finest level among tokens whose footprint contains the answer box centre (NaN: none)."""
    b = tokens.boxes()[0]  # [N, 4]
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    inside = (b[:, 0] <= cx) & (cx < b[:, 2]) & (b[:, 1] <= cy) & (cy < b[:, 3])
    return float(tokens.levels[0][inside].min()) if inside.any() else float("nan")


def _peak_memory(fn: Callable[[], object], device: torch.device) -> float:
    """Peak accelerator memory (MiB) of ``fn()`` on CUDA; NaN on the CPU, where torch does
    not expose a per-call peak (measure it in a benchmark instead)."""
    if device.type != "cuda":
        return float("nan")
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def evaluate_document(doc: Document, dataset: str, allocators: Sequence[AllocatorSpec],
                      budgets: Sequence[int], *, scorer: str | Callable = "saliency",
                      query_aware: bool = False, reader: Reader | None = None, seed: int = 0,
                      patch: int = 16, strata: int = 8, device: str = "cpu") -> list[dict]:
    """All rows of one document (see :func:`run_sweep` for the columns)."""
    reader = reader or Reader()
    dev = torch.device(device)
    pyr = build_pyramid(doc.image, patch=patch).to(dev)
    h, w = doc.size
    gh, gw = pyr.grid_shape(patch, 0)
    doc_seed = (seed * 1_000_003 + zlib.crc32(doc.doc_id.encode())) % 2**31
    base = dict(dataset=dataset, doc_id=doc.doc_id, height=h, width=w,
                scorer=scorer if isinstance(scorer, str) else getattr(scorer, "__name__", "fn"),
                query_aware=bool(query_aware))
    rows: list[dict] = []
    ceiling: dict[str, tuple[float, float]] = {}
    for q in doc.questions:  # the ceiling: the reader on the full-resolution page
        pred = reader.read(doc.image, q.boxes)
        ceiling[q.qid] = (anls(pred, q.answers), exact_match(pred, q.answers))
        rows.append(dict(base, qid=q.qid, field=q.field, size_px=q.size_px, allocator="full",
                         budget=gh * gw, pred=pred, anls=ceiling[q.qid][0],
                         em=ceiling[q.qid][1], strata_cov=1.0, empty_disc_px=0.0,
                         answer_level=0.0, alloc_ms=0.0, render_ms=0.0, peak_mem_mb=0.0))
    # one score map per page (query-agnostic) or per question (query-aware)
    groups = ([(q.question, [q]) for q in doc.questions] if query_aware
              else [(None, list(doc.questions))])
    for query, qs in groups:
        scores = _score(scorer, pyr.base, query, patch).to(dev)
        for spec in allocators:
            label, fn, params = _spec(spec)
            for budget in budgets:
                if not 1 <= budget <= gh * gw:
                    raise ValueError(f"budget must be in [1, {gh * gw}] for {doc.doc_id} "
                                     f"({h}x{w}), got {budget}")
                call = lambda: _allocate(fn, pyr, scores, int(budget), seed=doc_seed,  # noqa: E731
                                         query=query, **params)
                t0 = time.perf_counter()
                tokens = call()
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                alloc_ms = (time.perf_counter() - t0) * 1e3
                if tokens.budget != budget:
                    raise ValueError(f"allocator {label!r} returned {tokens.budget} tokens "
                                     f"for budget {budget}")
                t0 = time.perf_counter()
                recon = reconstruct(pyr, tokens)
                render_ms = (time.perf_counter() - t0) * 1e3
                tok = tokens.to("cpu")
                cov = float(strata_coverage(tok, strata)[0])
                disc = float(largest_empty_disc(tok)[0])
                mem = _peak_memory(call, dev)
                for q in qs:
                    pred = reader.read(recon, q.boxes)
                    rows.append(dict(base, qid=q.qid, field=q.field, size_px=q.size_px,
                                     allocator=label, budget=int(budget), pred=pred,
                                     anls=anls(pred, q.answers), em=exact_match(pred, q.answers),
                                     strata_cov=cov, empty_disc_px=disc,
                                     answer_level=_answer_level(tok, q.union_box),
                                     alloc_ms=alloc_ms, render_ms=render_ms, peak_mem_mb=mem))
    for r in rows:
        r["ceiling_anls"], r["ceiling_em"] = ceiling[r["qid"]]
        r["empty_disc_frac"] = r["empty_disc_px"] / min(h, w)
    return rows


@functools.lru_cache(maxsize=1)
def _code_fingerprint() -> str:
    """SHA-1 of every ``fovea_core`` source file, taken once per process (the code this
    process imported): a code change invalidates resumed parts."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha1()
    for f in sorted(root.rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode() + f.read_bytes())
    return h.hexdigest()


def _config_hash(allocators, budgets, scorer, query_aware, reader: Reader, seed, patch,
                 strata) -> str:
    labels = [_spec(s)[0] + ("" if isinstance(_spec(s)[1], str) else
                             f"@{getattr(_spec(s)[1], '__qualname__', '')}") for s in allocators]
    params = [_spec(s)[2] for s in allocators]
    cfg = dict(a=labels, p=params, b=[int(b) for b in budgets],
               s=scorer if isinstance(scorer, str) else getattr(scorer, "__qualname__", "fn"),
               q=bool(query_aware), r=reader.id, seed=seed, patch=patch, strata=strata,
               code=_code_fingerprint())
    return hashlib.sha1(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:10]


def run_sweep(allocators: Sequence[AllocatorSpec], budgets: Sequence[int],
              datasets: Mapping[str, Sequence[Document]], *, scorer: str | Callable = "saliency",
              query_aware: bool = False, reader: Reader | None = None,
              out: str | Path | None = None, backend: str = "inprocess",
              scheduler: str | Callable | None = None, resume: bool = True,
              progress: bool = True, seed: int = 0, patch: int = 16, strata: int = 8,
              device: str = "cpu") -> pd.DataFrame:
    """Run every allocator at every budget on every document; return the tidy table.

    Args:
        allocators: registry names (``"topk"``), ``(name, params)`` (``("stratified",
            {"strata": 8})``, labelled ``stratified_strata8``) or ``(label, callable)`` with
            the allocator signature ``fn(pyramid, scores, budget, *, seed, query, ...)``.
        budgets: token budgets N, each in ``[1, Gh * Gw]`` of every page.
        datasets: ``{name: documents}``.
        scorer: a :data:`fovea_core.importance.SCORERS` name or ``fn(image, *, query, patch)``.
        query_aware: score per question (the scorer gets ``query=question``) instead of once
            per page.
        reader: the OCR :class:`~fovea_core.eval.reader.Reader` (default: rapidocr, cached).
        out: folder for ``parts/`` (per-document rows, for resuming) and ``results.csv``
            (and ``results.parquet`` when pyarrow is installed); ``None``: nothing written.
        backend: ``"inprocess"``, ``"dask"`` or ``"ray"``.
        scheduler: dask scheduler (``"threads"`` default, ``"processes"``, ``"sync"`` or a
            ``get`` callable); ignored in-process.
        resume: reuse ``out/parts`` rows written by an identical configuration.
        progress: show a progress bar (tqdm in-process, dask's ``ProgressBar`` otherwise).
        seed: base seed of the random allocators (each document gets its own stream).
        patch, strata: token patch size; strata per side for ``strata_cov``.
        device: torch device for pyramid, scores, allocation and rendering.

    Returns:
        One row per document x question x allocator x budget (+ one ``allocator="full"``
        row per question) with columns ``dataset, doc_id, qid, field, size_px, allocator,
        budget, pred, anls, em, ceiling_anls, ceiling_em, strata_cov, empty_disc_px,
        empty_disc_frac, answer_level, alloc_ms, render_ms, peak_mem_mb, height, width,
        scorer, query_aware``, sorted by dataset, document, allocator, budget, question.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if not allocators or not budgets:
        raise ValueError("allocators and budgets must be non-empty")
    if any(int(b) < 1 for b in budgets):
        raise ValueError(f"budgets must be positive integers, got {list(budgets)}")
    for s in allocators:
        _spec(s)
    reader = reader or Reader()
    tag = _config_hash(allocators, budgets, scorer, query_aware, reader, seed, patch, strata)
    parts = None if out is None else Path(out) / "parts"
    jobs, done = [], []
    for name, docs in datasets.items():
        for doc in docs:
            path = None if parts is None else parts / name / f"{doc.doc_id}-{tag}.csv"
            if resume and path is not None and path.exists():
                done.append(pd.read_csv(path, keep_default_na=False, na_values=[""],
                                        dtype={c: str for c in _TEXT_COLUMNS}))
            else:
                jobs.append((doc, name, path))
    kw = dict(scorer=scorer, query_aware=query_aware, reader=reader, seed=seed, patch=patch,
              strata=strata, device=device)

    def task(job) -> pd.DataFrame:
        doc, name, path = job
        df = pd.DataFrame(evaluate_document(doc, name, allocators, budgets, **kw))
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            df.to_csv(path.with_suffix(".tmp"), index=False)
            path.with_suffix(".tmp").replace(path)
        return df

    if backend == "inprocess":
        from tqdm.auto import tqdm

        new = [task(j) for j in tqdm(jobs, desc="documents", disable=not progress or not jobs)]
    else:
        new = _run_dask(task, jobs, backend, scheduler, progress)
    frames = [f for f in done + new if len(f)]
    if not frames:
        raise ValueError("no rows: the datasets hold no documents with questions")
    df = pd.concat(frames, ignore_index=True)
    df["pred"] = df["pred"].fillna("").astype(str)
    df = df.sort_values(["dataset", "doc_id", "allocator", "budget", "qid"], kind="stable")
    df = df.reset_index(drop=True)
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        df.to_csv(Path(out) / "results.csv", index=False)
        try:
            df.to_parquet(Path(out) / "results.parquet", index=False)
        except ImportError:
            pass  # parquet needs pyarrow or fastparquet; the CSV is the canonical copy
    return df


def _run_dask(task, jobs, backend: str, scheduler, progress: bool) -> list[pd.DataFrame]:
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
    ctx = contextlib.nullcontext()
    if progress:
        from dask.diagnostics import ProgressBar

        ctx = ProgressBar()
    with ctx:
        return list(bag.compute(scheduler=scheduler or "threads"))


def summarize(df: pd.DataFrame, by: Sequence[str] = ("dataset", "allocator", "budget"), *,
              n_boot: int = 2000, ci: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Mean metrics per group with percentile-bootstrap CIs over documents.

    Questions are first averaged within each document (the resampling unit). Columns:
    ``n_docs, n_questions``; ``anls, em`` with ``_lo/_hi``; ``kept`` = sum of ANLS / sum
    of ceiling ANLS (fraction of the reader's full-resolution score kept) with ``_lo/_hi``
    (ratio bootstrapped with documents paired); ``ceiling_anls``; ``anls_per_100_tokens``;
    means of ``strata_cov, empty_disc_frac``; median ``alloc_ms``. The ``full`` rows of a
    dataset are pooled into one group whose budget is the median token count of its pages
    (pages of different sizes have different full grids).
    """
    by = list(by)
    full = df["allocator"] == "full" if "allocator" in df else None
    if full is not None and "budget" in by and full.any():
        med = df.loc[full].groupby("dataset")["budget"].transform("median").round()
        df = df.copy()
        df.loc[full, "budget"] = med.astype(df["budget"].dtype)
    missing = [c for c in by + ["doc_id", "anls", "em", "ceiling_anls"] if c not in df]
    if missing:
        raise ValueError(f"df lacks columns {missing}; pass the table from run_sweep")
    per_doc = (df.groupby(by + ["doc_id"], sort=True)
               .agg(anls=("anls", "mean"), em=("em", "mean"), ceil=("ceiling_anls", "mean"),
                    n=("anls", "size"), strata_cov=("strata_cov", "mean"),
                    empty_disc_frac=("empty_disc_frac", "mean"), alloc_ms=("alloc_ms", "median"))
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
        if "budget" in row:
            row["anls_per_100_tokens"] = 100.0 * row["anls"] / float(row["budget"])
        row["strata_cov"] = g["strata_cov"].mean()
        row["empty_disc_frac"] = g["empty_disc_frac"].mean()
        row["alloc_ms"] = g["alloc_ms"].median()
        out.append(row)
    return pd.DataFrame(out)


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
