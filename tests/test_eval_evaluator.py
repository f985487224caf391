"""The one per-document evaluator: its hooks, its per-page state, its cache files and its
process pool (issue 21, items 2 and 4)."""

from __future__ import annotations

import json
import os
from concurrent.futures.process import BrokenProcessPool

import pytest
import torch

from fovea_book.eval import evaluator as E
from fovea_book.eval.documents import make_document
from fovea_core.cache import SqliteCache
from fovea_book.eval.reader import Reader
from fovea_core.tokens import TokenSet

DOC = make_document(61, layout="receipt")
HOOK_CALLS: list[tuple] = []


def _count_columns(state, method, question, tokens, parts):
    """A columns hook: what it was given, as columns."""
    HOOK_CALLS.append((method.label, question.qid, tokens.device.type))
    return {"n_tokens": int(tokens.budget), "parts_shape": list(parts.shape),
            "pyramid_levels": state.pyramid.num_levels}


def _first_row_grid(state, method, query, budget, seed):
    """An allocate hook: the first ``budget`` level-0 cells, row-major; parts: the query."""
    HOOK_CALLS.append(("allocate", query, budget, seed))
    gh, gw = state.pyramid.grid_shape(state.patch, 0)
    idx = torch.arange(budget)
    return TokenSet.from_grid(idx[None] // gw, idx[None] % gw, 0,
                              image_size=state.pyramid.image_size), query


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    return Reader(cache_dir=tmp_path_factory.mktemp("ocr"))


def test_columns_hook_adds_columns_to_every_row_of_its_method(reader):
    HOOK_CALLS.clear()
    m = E.Method("topk+", "topk", scorer="center_bias", query_aware=False,
                 columns=_count_columns)
    rows = E.evaluate_document(DOC, "syn", [m, E.Method("resize", "resize")], [64, 100],
                               reader=reader)
    df = E.rows_frame(rows)
    assert list(df.columns) == list(E.ROW_COLUMNS) + ["n_tokens", "parts_shape",
                                                      "pyramid_levels"]
    mine = df[df.allocator == "topk+"]
    assert len(mine) == 2 * len(DOC.questions)
    assert (mine.n_tokens == mine.budget).all()
    gh, gw = -(-DOC.size[0] // 16), -(-DOC.size[1] // 16)
    assert all(s == [1, gh, gw] for s in mine.parts_shape)     # parts: the score map
    assert df[df.allocator != "topk+"].n_tokens.isna().all()
    # once per question and budget, with the CPU copy of the tokens
    assert sorted(HOOK_CALLS) == sorted(("topk+", q.qid, "cpu") for q in DOC.questions
                                        for _ in range(2))


def test_allocate_hook_replaces_the_allocator_and_gets_query_budget_and_seed(reader):
    HOOK_CALLS.clear()
    m = E.Method("rows", "resize", query_aware=True, allocate=_first_row_grid)
    rows = E.rows_frame(E.evaluate_document(DOC, "syn", [m], [50], reader=reader, seed=5))
    allocs = [c for c in HOOK_CALLS if c[0] == "allocate"]
    assert sorted(c[1] for c in allocs) == sorted(q.question for q in DOC.questions)
    assert {c[2] for c in allocs} == {50} and len({c[3] for c in allocs}) == 1
    r = rows[rows.allocator == "rows"]
    assert (r.answer_level.dropna() == 0).all() and (r.budget == 50).all()
    # "resize" ignores the map: no scorer cost; the hook's tokens are the row's
    assert (r.scorer_tokens == 0).all() and (r.total_tokens == 50).all()


def _clashing(state, method, question, tokens, parts):
    return {"anls": 1.0}


def _short(state, method, query, budget, seed):
    out, parts = _first_row_grid(state, method, query, budget - 1, seed)
    return out, parts


def test_hooks_are_checked(reader):
    with pytest.raises(ValueError, match="columns hook returned \\['anls'\\]"):
        E.evaluate_document(DOC, "syn", [E.Method("c", "resize", columns=_clashing)], [64],
                            reader=reader)
    with pytest.raises(ValueError, match="returned 63 tokens for budget 64"):
        E.evaluate_document(DOC, "syn", [E.Method("s", "resize", allocate=_short)], [64],
                            reader=reader)
    with pytest.raises(ValueError, match="unique and not 'full'"):
        E.evaluate_document(DOC, "syn", [E.Method("full", "resize")], [64], reader=reader)
    with pytest.raises(ValueError, match="budget must be in"):
        E.evaluate_document(DOC, "syn", [E.Method("r", "resize")], [10**6], reader=reader)
    with pytest.raises(ValueError, match="workers"):
        E.evaluate_documents({"syn": [DOC]}, [E.Method("r", "resize")], [64], workers=0)


def test_page_state_builds_the_pyramid_once_and_each_score_map_once(monkeypatch, reader):
    """Every cell of a page shares one pyramid and one map per (scorer, question)."""
    built, scored = [], []
    real_build, real_score = E.build_pyramid, E._score
    monkeypatch.setattr(E, "build_pyramid",
                        lambda *a, **k: built.append(1) or real_build(*a, **k))
    monkeypatch.setattr(E, "_score",
                        lambda s, img, q, p, page=None: scored.append((s, q))
                        or real_score(s, img, q, p, page))
    methods = [E.Method(a, a, scorer="center_bias", query_aware=True)
               for a in ("topk", "random", "resize")]
    E.evaluate_document(DOC, "syn", methods, [64, 128], reader=reader)
    assert len(built) == 1
    assert sorted(scored) == sorted(("center_bias", q.question) for q in DOC.questions)


def test_cells_are_cached_in_the_fingerprinted_file_and_stale_files_are_evicted(tmp_path,
                                                                                reader):
    m = E.Method("r", "resize", scorer="none", query_aware=False)
    path = E.cell_cache_path(tmp_path)
    assert path.name == f"rows-{E.code_fingerprint()[:12]}.sqlite"
    first = E.evaluate_documents({"syn": [DOC]}, [m], [64], cache_path=path, reader=reader)
    cache = SqliteCache(path)
    ctx = E._context("syn", DOC, reader, 0, 16, 8, "cpu")
    assert cache.get(E.cell_key(ctx, m, 64)) is not None
    assert cache.get(E.cell_key(ctx, E._FULL, None)) is not None
    again = E.evaluate_documents({"syn": [DOC]}, [m], [64], cache_path=path,
                                 reader=Reader(cache_dir=None))
    assert again.equals(first)
    stale = [tmp_path / n for n in ("rows-0123456789ab.sqlite", "rows-0123456789ab.sqlite-wal",
                                    "rows.sqlite", "cells-abc.sqlite", "other.sqlite")]
    for f in stale:
        f.write_text("x")
    gone = E.evict_stale_caches(tmp_path)
    assert sorted(gone) == sorted(stale[:4])
    assert path.exists() and (tmp_path / "other.sqlite").exists()


def _query_columns(state, method, question, tokens, parts):
    """A columns hook for :func:`_first_row_grid`'s parts (the query), counting its calls."""
    HOOK_CALLS.append(("columns", question.qid))
    return {"asked": parts, "finest": float(tokens.levels.min())}


def test_a_second_reader_reuses_the_allocation_and_reads_it_as_if_allocated_again(tmp_path):
    """The allocation of a (method, budget, question) does not depend on the reader: with a
    cache, a second reader of the page reads the first one's tokens (no allocate or columns
    hook call) and gets the rows an uncached evaluation gives it, timings aside."""
    first, second = (Reader(cache_dir=tmp_path / "ocr", margin=m) for m in (0.3, 0.5))
    m = E.Method("rows", "resize", query_aware=True, allocate=_first_row_grid,
                 columns=_query_columns)
    cache = SqliteCache(tmp_path / "rows.sqlite")
    HOOK_CALLS.clear()
    E.evaluate_document(DOC, "syn", [m], [50], reader=first, cache=cache)
    n_q = len(DOC.questions)
    assert len(HOOK_CALLS) == 2 * n_q                     # one allocation, one columns call
    HOOK_CALLS.clear()
    reused = E.rows_frame(E.evaluate_document(DOC, "syn", [m], [50], reader=second,
                                              cache=cache))
    assert HOOK_CALLS == []
    fresh = E.rows_frame(E.evaluate_document(DOC, "syn", [m], [50], reader=second))
    assert len(HOOK_CALLS) == 2 * n_q
    timing = list(E.TIMING_COLUMNS)
    assert reused.drop(columns=timing).equals(fresh.drop(columns=timing))
    ctx_a, ctx_b = (E._context("syn", DOC, r, 0, 16, 8, "cpu") for r in (first, second))
    q, ids = DOC.questions[0].question, [DOC.questions[0].qid]
    key = E.allocation_key(ctx_a, m, 50, q, ids)
    assert key == E.allocation_key(ctx_b, m, 50, q, ids) and cache.get(key) is not None
    assert len({key, E.allocation_key(ctx_a, m, 51, q, ids),
                E.allocation_key(ctx_a, m, 50, None, ids), E.allocation_key(ctx_a, m, 50, q, []),
                E.allocation_key(E._context("syn", DOC, first, 1, 16, 8, "cpu"), m, 50, q, ids),
                E.allocation_key(ctx_a, E.Method("other", "resize", query_aware=True,
                                                 allocate=_first_row_grid), 50, q, ids)}) == 6


def test_two_questions_in_the_same_words_keep_their_own_rows(tmp_path, reader):
    """A page may ask the same words of two boxes (a form's repeated key): each question's
    record holds its own columns, so a cached evaluation gives the uncached rows."""
    from dataclasses import replace

    q0, q1 = DOC.questions[:2]
    doc = replace(DOC, questions=(q0, replace(q1, question=q0.question)))
    m = E.Method("rows", "resize", query_aware=True, allocate=_first_row_grid,
                 columns=_query_columns)
    cache = SqliteCache(tmp_path / "rows.sqlite")
    timing = list(E.TIMING_COLUMNS)
    cached = E.rows_frame(E.evaluate_document(doc, "syn", [m], [50], reader=reader, cache=cache))
    fresh = E.rows_frame(E.evaluate_document(doc, "syn", [m], [50], reader=reader))
    assert cached.drop(columns=timing).equals(fresh.drop(columns=timing))
    assert set(cached[cached.allocator == "rows"].qid) == {q0.qid, q1.qid}


def test_packed_tokens_come_back_bit_for_bit():
    t = TokenSet(torch.rand(2, 5, 2), torch.rand(2, 5) * 3, torch.randn(2, 5),
                 torch.rand(2, 3, 2), (97, 131), patch=14,
                 stage=torch.tensor([[0, 0, 1, 1, 2]] * 2))
    for stage in (t.stage, None):
        a = TokenSet(t.centers, t.levels, t.scores, t.fixations, t.image_size, t.patch, stage)
        b = E.unpack_tokens(json.loads(json.dumps(E.pack_tokens(a))))
        assert (b.image_size, b.patch) == (a.image_size, a.patch)
        for name in ("centers", "levels", "scores", "fixations"):
            x, y = getattr(a, name), getattr(b, name)
            assert x.dtype == y.dtype and torch.equal(x, y)
        assert (b.stage is None) if stage is None else torch.equal(b.stage, a.stage)


def test_the_pool_is_replaced_after_a_shutdown_and_after_a_break():
    """Only the executor's public behaviour: a shut-down pool refuses ``submit``
    (RuntimeError), a broken one raises BrokenProcessPool; both are replaced."""
    try:
        pool = E.process_pool(1)
        assert E.map_processes(abs, [-1, -2], 1, False) == [1, 2]
        assert E.process_pool(1) is pool                      # kept between calls
        pool.shutdown(wait=True)                              # shut down by its owner
        assert E.map_processes(abs, [-3], 1, False) == [3]
        assert E.process_pool(1) is not pool
        with pytest.raises(BrokenProcessPool):                # a worker dies mid-map
            E.map_processes(os._exit, [1], 1, False)
        assert E.map_processes(abs, [-4], 1, False) == [4]
    finally:
        E.shutdown_pools()
    with pytest.raises(ValueError, match="workers"):
        E.process_pool(0)


def _level_columns(state, method, question, tokens, parts):
    return {"finest": float(tokens.levels.min())}


def test_chain_columns_merges_hooks_and_enters_the_key_by_their_names(reader):
    chain = E.ChainColumns(_count_columns, _level_columns)
    m = E.Method("t", "topk", scorer="center_bias", query_aware=False, columns=chain)
    df = E.rows_frame(E.evaluate_document(DOC, "syn", [m], [64], reader=reader))
    assert list(df.columns[-4:]) == ["n_tokens", "parts_shape", "pyramid_levels", "finest"]
    assert (df[df.allocator == "t"].finest == 0).all()
    ctx = E._context("syn", DOC, reader, 0, 16, 8, "cpu")
    same = E.Method("t", "topk", scorer="center_bias", query_aware=False,
                    columns=E.ChainColumns(_count_columns, _level_columns))
    other = E.Method("t", "topk", scorer="center_bias", query_aware=False,
                     columns=E.ChainColumns(_count_columns))
    assert E.cell_key(ctx, same, 64) == E.cell_key(ctx, m, 64) != E.cell_key(ctx, other, 64)
    with pytest.raises(ValueError, match="earlier hook"):
        E.evaluate_document(DOC, "syn", [E.Method("d", "resize", columns=E.ChainColumns(
            _level_columns, _level_columns))], [64], reader=reader)
