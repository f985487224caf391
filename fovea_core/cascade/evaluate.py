"""Evaluate the cascade's variants the way the sweep does, with its localisation metrics.

The rows are :func:`fovea_core.eval.sweep.run_sweep`'s (read with the same crop-only
:func:`fovea_core.eval.reader.read_answer`; ``tests/test_cascade_evaluate.py`` checks that
the rows are equal), computed once per page for what a page's questions share: the gist,
the size map, the detector maps and the gist's saliency.

:func:`evaluate` returns rows with the sweep's columns (so :func:`~fovea_core.eval.sweep.
summarize` and :func:`~fovea_core.eval.stats.paired_family` take them), plus the cascade's
localisation metrics (``fovea_share``, ``cell_auc``, ``fovea_level``) for cascade methods,
and caches each (document, method, budget, scorer) cell in SQLite
(``data/cache/cascade/cells-<code>.sqlite``, keyed by the document's content hash, the
method and the ``fovea_core`` source fingerprint).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from fovea_core.eval.documents import Document
from fovea_core.eval.metrics import anls, exact_match, strata_coverage
from fovea_core.eval.reader import Reader, _Cache, read_answer
from fovea_core.paths import project_root
from fovea_core.pyramid import Pyramid, build_pyramid

__all__ = ["BOOK_LOCALISERS", "Method", "book_methods", "cascade_method", "evaluate",
           "kept_difference", "real_set_methods", "unbudgeted_method"]

# ----------------------------------------------------------------------------- evaluation
@dataclass(frozen=True)
class Method:
    """One row label of the evaluation: an allocator (registry name or callable), its
    parameters, the scorer whose map it receives and whether it gets the question.

    ``key`` identifies the method in the cell cache: it must change whenever what the
    method does changes (the label and parameters enter it, callables by their ``repr``;
    a callable with state needs a ``key`` or a stable ``repr`` that names it).
    ``cascade=True``: the method is :func:`~fovea_core.cascade.allocator.cascade_parts`
    with ``params`` (``localiser=``, ``gist_budget=``, ...; ``allocator`` should then be
    ``"cascade"``, whose declared read cost is used), and the localisation metrics are
    recorded.
    """

    label: str
    allocator: str | Callable
    params: dict = field(default_factory=dict)
    scorer: str = "none"
    query_aware: bool = True
    key: str = ""
    cascade: bool = False                      # also record the localisation metrics


def cascade_method(label: str, localiser: str | Callable, *, gist_budget: int | None = None,
                   **params) -> Method:
    """The cascade with ``localiser`` (a :data:`~fovea_core.cascade.localisers.LOCALISERS`
    name or a localiser object such as the oracle) as a method: one allocation per question,
    except ``"learned_prior"``, which ignores the question and allocates once per page.
    ``gist_budget`` defaults to :data:`~fovea_core.cascade.allocator.DEFAULT_GIST`."""
    from fovea_core.cascade.allocator import DEFAULT_GIST

    return Method(label, "cascade", dict(localiser=localiser, gist_budget=gist_budget or
                                         DEFAULT_GIST, **params),
                  cascade=True, query_aware=localiser != "learned_prior")


def unbudgeted_method(allocator: str) -> Method:
    """``allocator`` with the ``query_saliency`` map (OCR of the half-resolution page, outside
    the budget), labelled ``"<allocator> | query_saliency"``."""
    return Method(f"{allocator} | query_saliency", allocator, scorer="query_saliency",
                  query_aware=True)


#: the budgeted cascades chapter 17 ranks, as chapter 14.5 labels them: ``{label: localiser}``
BOOK_LOCALISERS = {"cascade | learned": "learned",
                   "cascade | query scorer on the gist": "gist_query"}


def book_methods() -> list[Method]:
    """Chapter 14.5's rows that chapter 17 ranks beside the query-agnostic allocators: the
    cascade with each of :data:`BOOK_LOCALISERS` and top-K / the v2 pyramid with
    ``query_saliency`` (unbudgeted). Both chapters build them here, so their cells have the
    same cache keys and chapter 17 re-reads what chapter 14.5 computed."""
    return ([cascade_method(k, v) for k, v in BOOK_LOCALISERS.items()]
            + [unbudgeted_method(a) for a in ("topk", "pyramid")])


def real_set_methods(oracle, *, gist_budget: int | None = None) -> list[Method]:
    """The rows every real set is read with (chapters 14.5 and 17, the same cache keys):
    ``resize`` (the baseline), ``resize_nonblank`` (the training-free document peer), the
    learned cascade (``"cascade | learned"``, budgeted) and the cascade told the answer's
    boxes (``"cascade | oracle"``, the named upper bound of localisation; never a method)."""
    return [Method("resize", "resize", scorer="none", query_aware=False),
            Method("resize_nonblank", "resize_nonblank", scorer="none", query_aware=False),
            cascade_method("cascade | learned", "learned", gist_budget=gist_budget),
            cascade_method("cascade | oracle", oracle, gist_budget=gist_budget)]


def _fingerprint(doc: Document) -> str:
    from fovea_core.eval.sweep import document_fingerprint

    return document_fingerprint(doc)


def _cell_key(doc_hash: str, m: Method, budget: int, reader: Reader, seed: int,
              code: str) -> str:
    alloc = m.allocator if isinstance(m.allocator, str) else \
        f"{getattr(m.allocator, '__module__', '')}.{getattr(m.allocator, '__qualname__', '')}"
    cfg = dict(v=1, d=doc_hash, l=m.label, a=alloc, p=m.params, s=m.scorer, q=m.query_aware,
               k=m.key, b=int(budget), r=reader.id, seed=seed, code=code)
    return hashlib.sha1(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()


def default_cache_path() -> Path:
    from fovea_core.eval.sweep import _code_fingerprint

    return project_root() / "data" / "cache" / "cascade" / f"cells-{_code_fingerprint()[:12]}.sqlite"


def _alloc_tokens(m: Method, pyramid: Pyramid) -> float:
    from fovea_core.eval.sweep import alloc_read_tokens

    return alloc_read_tokens(m.allocator, pyramid)


def _evaluate_doc(doc: Document, dataset: str, methods: Sequence[Method], budget: int,
                  reader: Reader, seed: int, patch: int, cache: _Cache | None, code: str,
                  score_cache: _Cache | None = None) -> list[dict]:
    from fovea_core.allocators import allocate
    from fovea_core.eval.sweep import _uses_scores, cached_score, scorer_tokens

    h, w = doc.size
    dh = _fingerprint(doc)
    state: dict = {}

    def pyramid() -> Pyramid:
        if "pyr" not in state:
            state["pyr"] = build_pyramid(doc.image, patch=patch)
        return state["pyr"]

    base = dict(dataset=dataset, doc_id=doc.doc_id, height=h, width=w)
    ceil_key = _cell_key(dh, Method("full", "full"), 0, reader, seed, code)
    text = None if cache is None else cache.get(ceil_key)
    if text is None:
        gh, gw = -(-h // patch), -(-w // patch)
        ceiling = []
        for q in doc.questions:
            pred = reader.read(doc.image, q.boxes)
            ceiling.append(dict(base, qid=q.qid, field=q.field, size_px=q.size_px,
                                allocator="full", budget=gh * gw, pred=pred,
                                anls=anls(pred, q.answers), em=exact_match(pred, q.answers),
                                scorer="none", query_aware=False, strata_cov=1.0,
                                empty_disc_px=0.0, alloc_ms=0.0, scorer_tokens=0.0,
                                alloc_read_tokens=0.0, total_tokens=float(gh * gw),
                                unbudgeted=False))
        if cache is not None:
            cache.put(ceil_key, json.dumps(ceiling, default=float))
    else:
        ceiling = json.loads(text)
    rows = list(ceiling)
    doc_seed = (seed * 1_000_003 + zlib.crc32(doc.doc_id.encode())) % 2**31
    for m in methods:
        key = _cell_key(dh, m, budget, reader, seed, code)
        text = None if cache is None else cache.get(key)
        if text is not None:
            rows += json.loads(text)
            continue
        pyr = pyramid()
        s_tok = scorer_tokens(m.scorer, (h, w)) if _uses_scores(m.allocator) else 0.0
        a_tok = _alloc_tokens(m, pyr)
        extra = s_tok + a_tok
        out = []
        groups = ([(q.question, [q]) for q in doc.questions] if m.query_aware
                  else [(None, list(doc.questions))])
        for query, qs in groups:
            sk = (m.scorer, query)
            if sk not in state and not m.cascade:       # the cascade ignores the scores
                # the sweep's score cache (shared with the other chapters); ``state`` keeps
                # what a page's questions share (its saliency)
                state[sk] = cached_score(score_cache, dh, m.scorer, pyr.base, query, patch,
                                         page=state)
            t0 = time.perf_counter()
            if m.cascade:
                from fovea_core.cascade.allocator import cascade_parts, gist_budget_for
                from fovea_core.cascade.core import gist

                gb = m.params.get("gist_budget") or gist_budget_for(budget)
                if ("gist", gb) not in state:
                    state[("gist", gb)] = gist(pyr, gb, patch=patch)
                parts = cascade_parts(pyr, budget, query=query, patch=patch,
                                      gist_obj=state[("gist", gb)], **m.params)
                tokens, loc = parts.tokens, parts.scores
            else:
                fn = m.allocator
                tokens = (allocate(fn, pyr, state[sk], budget, seed=doc_seed, query=query,
                                   **m.params) if isinstance(fn, str) else
                          fn(pyr, state[sk], budget, seed=doc_seed, query=query, **m.params))
                loc = None
            alloc_ms = (time.perf_counter() - t0) * 1e3
            if tokens.budget != budget:
                raise ValueError(f"{m.label}: {tokens.budget} tokens for budget {budget}")
            cov = float(strata_coverage(tokens, 8)[0])
            disc = float("nan")             # (the sweep's largest empty disc: not used here)
            for q in qs:
                pred = read_answer(reader, pyr, tokens, None, q.boxes)
                row = dict(base, qid=q.qid, field=q.field, size_px=q.size_px, allocator=m.label,
                           budget=budget, pred=pred, anls=anls(pred, q.answers),
                           em=exact_match(pred, q.answers), scorer=m.scorer,
                           query_aware=m.query_aware, strata_cov=cov, empty_disc_px=disc,
                           alloc_ms=alloc_ms, scorer_tokens=s_tok, alloc_read_tokens=a_tok,
                           total_tokens=budget + extra,
                           unbudgeted=bool(extra > budget) if math.isfinite(extra) else None)
                if loc is not None:
                    from fovea_core.cascade.metrics import localisation_row

                    row.update(localisation_row(tokens, loc, q.boxes, patch=patch))
                out.append(row)
        if cache is not None:
            cache.put(key, json.dumps(out, default=float))
        rows += out
    ceil = {r["qid"]: (r["anls"], r["em"]) for r in ceiling}
    for r in rows:
        r["ceiling_anls"], r["ceiling_em"] = ceil[r["qid"]]
        r["empty_disc_frac"] = r["empty_disc_px"] / min(h, w)
    return rows


def _evaluate_job(job: tuple) -> list[dict]:
    """One document's rows (module-level, so a process pool can pickle it)."""
    doc, name, methods, budget, reader, seed, patch, cache_path, code, score_path = job
    cache = None if cache_path is None else _Cache(Path(cache_path))
    # one connection when the scores share the cells' file (a cache_path given by the caller)
    scores = cache if score_path == cache_path else _Cache(Path(score_path))
    return _evaluate_doc(doc, name, methods, budget, reader, seed, patch, cache, code, scores)


def evaluate(datasets: Mapping[str, Sequence[Document]], methods: Sequence[Method],
             budget: int = 273, *, reader: Reader | None = None, seed: int = 0,
             patch: int = 16, cache_path: str | Path | None = "default",
             workers: int | None = 1, progress: bool = False) -> pd.DataFrame:
    """Rows (one per document x question x method, plus the ``full`` ceiling) with the
    columns of :func:`~fovea_core.eval.sweep.run_sweep` that :func:`~fovea_core.eval.sweep.
    summarize` and :mod:`fovea_core.eval.stats` use; cascade methods add ``fovea_share``,
    ``cell_auc`` and ``fovea_level``. Cells are cached (see the module docstring); score
    maps go through the sweep's score cache (:func:`~fovea_core.eval.sweep.cached_score`)
    when ``cache_path`` is ``"default"``, so chapters share them.

    ``workers``: 1 (default) evaluates in this process; ``None`` (the CPU count) or more
    spreads the documents over :func:`~fovea_core.eval.sweep.process_pool` (methods and
    localisers must then pickle: registry names, module-level callables, the oracle).
    """
    from fovea_core.eval.sweep import _code_fingerprint, default_cache_dir, map_processes

    reader = reader or Reader()
    code = _code_fingerprint()
    path = default_cache_path() if cache_path == "default" else cache_path
    score_path = (default_cache_dir() / "rows.sqlite" if cache_path == "default" else path)
    labels = [m.label for m in methods]
    if len(set(labels)) != len(labels) or "full" in labels:
        raise ValueError(f"method labels must be unique and not 'full', got {labels}")
    if workers is not None and (isinstance(workers, bool) or int(workers) < 1):
        raise ValueError(f"workers must be None or an int >= 1, got {workers!r}")
    jobs = [(doc, name, list(methods), int(budget), reader, seed, patch,
             None if path is None else str(path), code,
             None if score_path is None else str(score_path))
            for name, docs in datasets.items() for doc in docs]
    if workers == 1:
        from tqdm.auto import tqdm

        parts = [_evaluate_job(j) for j in tqdm(jobs, desc="documents", disable=not progress)]
    else:
        parts = map_processes(_evaluate_job, jobs, workers, progress)
    df = pd.DataFrame([r for rows in parts for r in rows])
    df["pred"] = df["pred"].fillna("").astype(str)
    return df.sort_values(["dataset", "doc_id", "allocator", "qid"], kind="stable"
                          ).reset_index(drop=True)


def kept_difference(table: pd.DataFrame, a: str, b: str, *, docs=None, n_boot: int = 2000,
                    seed: int = 0) -> dict:
    """Paired difference of *kept* (sum of ANLS / sum of the ceiling's ANLS over documents)
    between methods ``a`` and ``b``: ``{"diff", "lo", "hi", "n_docs", "a", "b"}``, a
    percentile-bootstrap CI over documents (questions averaged within a document first,
    the ratio recomputed on each resample with the documents paired)."""
    from fovea_core.eval.metrics import bootstrap_ci

    t = table if docs is None else table[table.doc_id.isin(set(docs))]
    per = t[t.allocator.isin([a, b])].groupby(["allocator", "doc_id"]).agg(
        anls=("anls", "mean"), ceil=("ceiling_anls", "mean")).reset_index()
    pa = per[per.allocator == a].set_index("doc_id")
    pb = per[per.allocator == b].set_index("doc_id")
    ids = sorted(set(pa.index) & set(pb.index))
    arr = np.stack([pa.loc[ids, "anls"], pb.loc[ids, "anls"], pa.loc[ids, "ceil"]], 1)
    stat = lambda x: (x[..., 0].sum(-1) - x[..., 1].sum(-1)) / np.maximum(x[..., 2].sum(-1), 1e-12)  # noqa: E731
    est, lo, hi = bootstrap_ci(arr, n_boot=n_boot, seed=seed, stat=stat)
    ka = arr[:, 0].sum() / max(arr[:, 2].sum(), 1e-12)
    kb = arr[:, 1].sum() / max(arr[:, 2].sum(), 1e-12)
    return dict(diff=est, lo=lo, hi=hi, n_docs=len(ids), a=float(ka), b=float(kb))
