"""Evaluate allocators the way the sweep does, rendering only what the reader reads.

:func:`fovea_core.eval.sweep.evaluate_document` renders the whole reconstruction of a page
for every (method, question) and the reader then crops the answer's line boxes from it. On
the SROIE receipts scanned at 600 dpi (4961 x 7016 px) one render costs tens of seconds, and
a query-aware method renders once per question. :func:`render_window` paints only a window
of the reconstruction, with the same rule as :func:`fovea_core.sample.render` (the finest
covering token wins, ties to the lowest index, nearest-neighbour samples, the coarsest
pyramid level bilinearly upsampled where no token lies); :func:`read_answer` renders the
reader's crop windows (:func:`fovea_core.eval.reader.crop_box` geometry) and reads them.
``tests/test_cascade_evaluate.py`` checks that the windows equal the crops of the full
render and that the rows equal :func:`~fovea_core.eval.sweep.run_sweep`'s.

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
import torch

from fovea_core.eval.documents import Document
from fovea_core.eval.metrics import anls, exact_match, strata_coverage
from fovea_core.eval.reader import Reader, _Cache, to_uint8
from fovea_core.paths import project_root
from fovea_core.pyramid import Pyramid, build_pyramid
from fovea_core.sample import sample
from fovea_core.tokens import LEVEL_QUANTUM, TokenSet

__all__ = ["render_window", "crop_window", "tokens_over", "subset", "read_answer", "Method",
           "evaluate", "kept_difference"]

_KEY_TOKEN_BITS = 20


def _background_window(top: torch.Tensor, size: tuple[int, int], window: tuple[int, int, int, int]
                       ) -> torch.Tensor:
    """Rows ``y0:y1``, columns ``x0:x1`` of ``F.interpolate(top, size, "bilinear",
    align_corners=False)`` ``[B, C, y1-y0, x1-x0]``, computed only there (same source
    coordinates ``(i + .5) in / out - .5`` clamped at 0, same weights; equal up to float
    rounding)."""
    y0, y1, x0, x1 = window
    hb, wb = top.shape[-2:]
    h, w = size

    def axis(i0: int, i1: int, n_in: int, n_out: int):
        scale = n_in / n_out
        src = ((torch.arange(i0, i1, dtype=torch.float32) + 0.5) * scale - 0.5).clamp(min=0)
        lo = src.floor().long().clamp(max=n_in - 1)
        hi = (lo + 1).clamp(max=n_in - 1)
        lam = (src - lo.float()).clamp(0, 1)
        return lo, hi, lam

    ylo, yhi, ly = axis(y0, y1, hb, h)
    xlo, xhi, lx = axis(x0, x1, wb, w)
    rows = top[:, :, ylo] * (1 - ly)[:, None] + top[:, :, yhi] * ly[:, None]     # [B,C,h',wb]
    return rows[..., xlo] * (1 - lx) + rows[..., xhi] * lx


def render_window(tokens: TokenSet, patches: torch.Tensor, window: tuple[int, int, int, int],
                  background: Pyramid) -> torch.Tensor:
    """The window ``(y0, y1, x0, x1)`` (base pixels) of
    ``render(tokens, patches, background=background)`` at the page's size:
    ``[B, C, y1 - y0, x1 - x0]``.

    The same painting rule as :func:`fovea_core.sample.render`, evaluated only on the
    window's pixels: each token's footprint is intersected with the window, every (token,
    pixel) pair of the intersection is enumerated (``repeat_interleave``), the finest level
    (then the lowest token index) wins per pixel (``scatter_reduce(amin)``), and the winner's
    sample is the one whose sub-square holds the pixel centre. Work ``O(window area x
    overlapping footprints)`` instead of ``O(page area)``.
    """
    b, n, c, p, _ = patches.shape
    h, w = tokens.image_size
    y0, y1, x0, x1 = (int(v) for v in window)
    if not (0 <= y0 < y1 <= h and 0 <= x0 < x1 <= w):
        raise ValueError(f"window must lie in the page {h}x{w}, got {window}")
    hw, ww = y1 - y0, x1 - x0
    out = _background_window(background.levels[-1].to(patches.dtype), (h, w), window)
    step = torch.exp2(tokens.levels).flatten()                            # [B*N]
    half = p * step / 2
    cx, cy = tokens.centers[..., 0].flatten() * w, tokens.centers[..., 1].flatten() * h
    tx0, ty0 = cx - half, cy - half
    # covered page pixels (as in render, output scale 1), intersected with the window
    j0 = torch.ceil(tx0 * 1.0 - 0.5).clamp(0, w).long().clamp(x0, x1)
    j1 = torch.ceil((cx + half) * 1.0 - 0.5).clamp(0, w).long().clamp(x0, x1)
    i0 = torch.ceil(ty0 * 1.0 - 0.5).clamp(0, h).long().clamp(y0, y1)
    i1 = torch.ceil((cy + half) * 1.0 - 0.5).clamp(0, h).long().clamp(y0, y1)
    nx = (j1 - j0).clamp(min=0)
    cnt = nx * (i1 - i0).clamp(min=0)
    img = torch.arange(b).repeat_interleave(n)
    start = (img * hw + (i0 - y0)) * ww + (j0 - x0)
    lq = torch.round(tokens.levels.flatten() * LEVEL_QUANTUM).long()
    tkey = lq * 2**_KEY_TOKEN_BITS + torch.arange(n).repeat(b)
    owner = torch.repeat_interleave(torch.arange(b * n), cnt)
    sel = lambda t: t.index_select(0, owner)                            # noqa: E731
    off = torch.arange(owner.numel()) - sel(torch.cumsum(cnt, 0) - cnt)
    rowlen = sel(nx.clamp(min=1))
    r = torch.div(off, rowlen, rounding_mode="floor")
    pix = sel(start) + r * ww + (off - r * rowlen)
    best = torch.full((b * hw * ww,), torch.iinfo(torch.int64).max, dtype=torch.int64)
    best.scatter_reduce_(0, pix, sel(tkey), reduce="amin", include_self=True)
    hit = (best != torch.iinfo(torch.int64).max).nonzero().squeeze(1)
    win = best.index_select(0, hit) % 2**_KEY_TOKEN_BITS
    pb = torch.div(hit, hw * ww, rounding_mode="floor")
    rem = hit - pb * (hw * ww)
    prow = torch.div(rem, ww, rounding_mode="floor") + y0
    pcol = rem - (prow - y0) * ww + x0
    flat = pb * n + win
    stp = step.index_select(0, flat)
    kx = torch.floor(((pcol.float() + 0.5) / 1.0 - tx0.index_select(0, flat)) / stp)
    ky = torch.floor(((prow.float() + 0.5) / 1.0 - ty0.index_select(0, flat)) / stp)
    src = (flat * p + ky.long().clamp(0, p - 1)) * p + kx.long().clamp(0, p - 1)
    vals = patches.permute(0, 1, 3, 4, 2).reshape(-1, c).index_select(0, src)
    flat_out = out.permute(0, 2, 3, 1).reshape(-1, c).clone()
    flat_out.index_copy_(0, hit, vals.to(flat_out.dtype))
    return flat_out.reshape(b, hw, ww, c).permute(0, 3, 1, 2).contiguous()


def crop_window(box: tuple[int, int, int, int], size: tuple[int, int], margin: float,
                min_margin: int = 3) -> tuple[int, int, int, int]:
    """``(y0, y1, x0, x1)`` of :func:`fovea_core.eval.reader.crop_box`'s crop of ``box``."""
    h, w = size
    bx0, by0, bx1, by1 = (int(v) for v in box)
    m = max(min_margin, int(round(margin * (by1 - by0))))
    return max(0, by0 - m), min(h, by1 + m), max(0, bx0 - m), min(w, bx1 + m)


def tokens_over(tokens: TokenSet, windows: Sequence[tuple[int, int, int, int]]) -> torch.Tensor:
    """``[N]`` bool: tokens of image 0 whose footprint meets one of the ``(y0, y1, x0, x1)``
    windows (only those can paint a window's pixels)."""
    b = tokens.boxes()[0]                                                  # [N, 4]
    w = torch.as_tensor(windows, dtype=b.dtype).reshape(-1, 4)             # [K, 4]
    meet = ((b[:, None, 0] < w[None, :, 3]) & (b[:, None, 2] > w[None, :, 2])
            & (b[:, None, 1] < w[None, :, 1]) & (b[:, None, 3] > w[None, :, 0]))
    return meet.any(1)


def subset(tokens: TokenSet, keep: torch.Tensor) -> TokenSet:
    """The tokens of image 0 where ``keep`` (order kept, so render's tie rule -- the lowest
    index wins -- picks the same token)."""
    return TokenSet(tokens.centers[:1, keep], tokens.levels[:1, keep], tokens.scores[:1, keep],
                    tokens.fixations[:1], tokens.image_size, tokens.patch,
                    None if tokens.stage is None else tokens.stage[:1, keep])


def read_answer(reader: Reader, pyramid: Pyramid, tokens: TokenSet,
                patches: torch.Tensor | None, boxes: Sequence[tuple[int, int, int, int]]) -> str:
    """What :meth:`Reader.read` returns on the reconstruction for an answer's ``boxes``,
    rendering only the crops it reads. ``patches``: the sampled patches of all tokens, or
    ``None`` to sample only the tokens that meet the crops (what a crop needs)."""
    wins = [crop_window(bx, tokens.image_size, reader.margin) for bx in boxes]
    wins = [w for w in wins if w[1] > w[0] and w[3] > w[2]]
    if patches is None and wins:
        keep = tokens_over(tokens, wins)
        if not bool(keep.any()):
            keep[0] = True                                  # background only; one dummy token
        tokens = subset(tokens, keep)
        patches = sample(pyramid, tokens)
    texts = []
    for win in wins:                                        # one line crop per box
        crop = render_window(tokens, patches, win, pyramid)[0].permute(1, 2, 0)
        texts.append(reader.read_crop(to_uint8(crop.clamp(0, 1).numpy())))
    return " ".join(t for t in texts if t)


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


def _scores(state: dict, scorer: str, pyr: Pyramid, query: str | None, patch: int
            ) -> torch.Tensor:
    """``score(scorer, page, query)``; ``query_saliency`` as its definition,
    ``normalise(0.8 query + 0.2 saliency)``, with the page's saliency computed once for all
    its questions (the same numbers as :func:`fovea_core.importance.score`)."""
    from fovea_core.importance import normalise, score

    if scorer == "query_saliency" and query:
        if ("saliency", None) not in state:
            state[("saliency", None)] = score("saliency", pyr.base, patch=patch)
        q = score("query", pyr.base, query=query, patch=patch)
        return normalise(0.8 * q + 0.2 * state[("saliency", None)])
    return score(scorer, pyr.base, query=query, patch=patch)


def _evaluate_doc(doc: Document, dataset: str, methods: Sequence[Method], budget: int,
                  reader: Reader, seed: int, patch: int, cache: _Cache | None, code: str
                  ) -> list[dict]:
    from fovea_core.allocators import allocate
    from fovea_core.eval.sweep import scorer_tokens
    from fovea_core.importance import score

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
        s_tok = scorer_tokens(m.scorer, (h, w))
        a_tok = _alloc_tokens(m, pyr)
        extra = s_tok + a_tok
        out = []
        groups = ([(q.question, [q]) for q in doc.questions] if m.query_aware
                  else [(None, list(doc.questions))])
        for query, qs in groups:
            sk = (m.scorer, query)
            if sk not in state and not m.cascade:       # the cascade ignores the scores
                state[sk] = _scores(state, m.scorer, pyr, query, patch)
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


def evaluate(datasets: Mapping[str, Sequence[Document]], methods: Sequence[Method],
             budget: int = 273, *, reader: Reader | None = None, seed: int = 0,
             patch: int = 16, cache_path: str | Path | None = "default",
             progress: bool = False) -> pd.DataFrame:
    """Rows (one per document x question x method, plus the ``full`` ceiling) with the
    columns of :func:`~fovea_core.eval.sweep.run_sweep` that :func:`~fovea_core.eval.sweep.
    summarize` and :mod:`fovea_core.eval.stats` use; cascade methods add ``fovea_share``,
    ``cell_auc`` and ``fovea_level``. Cells are cached (see the module docstring)."""
    from fovea_core.eval.sweep import _code_fingerprint

    reader = reader or Reader()
    code = _code_fingerprint()
    path = default_cache_path() if cache_path == "default" else cache_path
    cache = None if path is None else _Cache(Path(path))
    labels = [m.label for m in methods]
    if len(set(labels)) != len(labels) or "full" in labels:
        raise ValueError(f"method labels must be unique and not 'full', got {labels}")
    rows = []
    items = [(name, d) for name, docs in datasets.items() for d in docs]
    it = items
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(items, desc="documents")
    for name, doc in it:                                       # one document at a time
        rows += _evaluate_doc(doc, name, methods, int(budget), reader, seed, patch, cache, code)
    df = pd.DataFrame(rows)
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
