"""The sweep runner on a tiny sweep: ceiling, negative control, backends, resume, CIs."""

import hashlib
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from fovea_book.eval.documents import synthetic_documents
from fovea_book.eval.metrics import anls, exact_match
from fovea_book.eval.reader import Reader
from fovea_book.eval.sweep import TIMING_COLUMNS, compare, run_sweep, summarize
from fovea_core.tokens import TokenSet

DOC = synthetic_documents(1, seed=21)[0]
CALLS: list[dict] = []


def flat_scorer(image, *, query=None, patch=16):
    CALLS.append(dict(kind="score", shape=tuple(image.shape), query=query))
    h, w = image.shape[-2:]
    return torch.ones(1, -(-h // patch), -(-w // patch))


def grid_at_level(level):
    """An allocator spending the budget on the level-``level`` grid, row-major."""
    def alloc(pyramid, scores, budget, *, seed=0, query=None):
        CALLS.append(dict(kind="alloc", budget=budget, query=query, nargs=2))
        gh, gw = pyramid.grid_shape(16, level)
        idx = torch.arange(budget) % (gh * gw)
        return TokenSet.from_grid(idx[None] // gw, idx[None] % gw, level,
                                  image_size=pyramid.image_size)
    return alloc


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    return Reader(cache_dir=tmp_path_factory.mktemp("ocr"))


@pytest.fixture(scope="module")
def table(reader):
    allocs = [("level0", grid_at_level(0)), ("level3", grid_at_level(3))]
    return run_sweep(allocs, [64, 4096], {"syn": [DOC]}, scorer=flat_scorer, reader=reader,
                     progress=False)


def test_rows_and_ceiling(table, reader):
    nq = len(DOC.questions)
    assert len(table) == nq * (1 + 2 * 2)
    full = table[table.allocator == "full"].set_index("qid")
    assert (full.budget == 4096).all()
    # the ceiling is the reader on the full-resolution page, recomputed here independently
    for q in DOC.questions:
        pred = reader.read(DOC.image, q.boxes)
        assert full.loc[q.qid, "pred"] == pred
        assert full.loc[q.qid, "anls"] == anls(pred, q.answers)
        assert full.loc[q.qid, "em"] == exact_match(pred, q.answers)
    # every row carries the ceiling of its own question
    ceil = table.qid.map(full.anls)
    assert (table.ceiling_anls == ceil).all() and (table.ceiling_em == table.qid.map(full.em)).all()
    full = table[table.allocator == "full"]
    # every level-0 patch: the reconstruction is the page, so the reader scores the ceiling
    l0 = table[(table.allocator == "level0") & (table.budget == 4096)].set_index("qid")
    assert (l0.anls == full.set_index("qid").anls.loc[l0.index]).all()
    assert (l0.strata_cov == 1.0).all() and (l0.answer_level == 0).all()


def test_negative_control_coarse_tokens_lose_small_text(table):
    # 64 level-3 tokens (128 px each) tile the page at 1/8 resolution: small text is gone
    coarse = table[(table.allocator == "level3") & (table.budget == 64)]
    assert (coarse.answer_level == 3).all() and (coarse.strata_cov == 1.0).all()
    assert coarse.anls.mean() < 0.5 * coarse.ceiling_anls.mean()
    # 64 level-0 tokens cover only the top rows: answers below are not read
    top = table[(table.allocator == "level0") & (table.budget == 64)]
    assert top[top.field == "citation"].anls.iloc[0] == 0.0
    assert top[top.field == "citation"].answer_level.isna().all()


def _digest(x) -> str:
    return hashlib.sha1(np.ascontiguousarray(torch.as_tensor(x).float().numpy()).tobytes()).hexdigest()


def _recorders(log: list):
    """A scorer and an allocator that record everything they receive (pixels and scores as
    digests, every keyword)."""
    def scorer(image, **kw):
        log.append(("score", _digest(image), sorted(kw.items())))
        h, w = image.shape[-2:]
        return torch.ones(1, -(-h // 16), -(-w // 16))

    def alloc(pyramid, scores, budget, **kw):
        log.append(("alloc", [_digest(lv) for lv in pyramid.levels], _digest(scores), budget,
                    sorted(kw.items())))
        gh, gw = pyramid.grid_shape(16, 0)
        idx = torch.arange(budget) % (gh * gw)
        return TokenSet.from_grid(idx[None] // gw, idx[None] % gw, 0, image_size=pyramid.image_size)
    return scorer, alloc


def test_allocators_never_see_answers(reader):
    """Information flow, not a string check: the same page with other answers and other
    answer boxes gives the scorer and the allocator exactly the same inputs."""
    other = replace(DOC, questions=tuple(
        replace(q, answers=tuple(f"#{a[::-1]}#" for a in q.answers),
                boxes=tuple((x0 + 3, y0 + 2, x1 + 3, y1 + 2) for x0, y0, x1, y1 in q.boxes))
        for q in DOC.questions))
    logs = []
    for doc in (DOC, other):
        log: list = []
        scorer, alloc = _recorders(log)
        run_sweep([("rec", alloc)], [64], {"syn": [doc]}, scorer=scorer, query_aware=True,
                  reader=reader, progress=False, cache_dir=None)
        logs.append(log)
    assert logs[0] == logs[1]
    # query-aware: each question is scored and allocated once, with the question as query
    queries = [dict(c[-1])["query"] for c in logs[0]]
    assert sorted(queries) == sorted([q.question for q in DOC.questions] * 2)


def test_dask_backend_matches_inprocess(reader, tmp_path):
    docs = synthetic_documents(2, seed=40)
    kw = dict(scorer=flat_scorer, progress=False, cache_dir=None)
    allocs = [("level0", grid_at_level(0)), ("level2", grid_at_level(2))]
    a = run_sweep(allocs, [64, 256], {"syn": docs}, reader=reader, **kw)
    # a fresh cache, so the OCR really runs in dask's worker threads
    cold = Reader(cache_dir=tmp_path / "cold")
    b = run_sweep(allocs, [64, 256], {"syn": docs}, backend="dask", scheduler="threads",
                  reader=cold, **kw)
    assert cold.cache.misses > 0 and cold.cache.hits < cold.cache.misses
    cols = [c for c in a.columns if c not in TIMING_COLUMNS]
    pd.testing.assert_frame_equal(a[cols], b[cols])


def _registered_sweep(reader, **kw):
    """Registered allocators and scorer (picklable, so every backend can run them)."""
    docs = synthetic_documents(2, seed=41)
    return run_sweep(["resize", "topk"], [64], {"syn": docs}, scorer="center_bias",
                     reader=reader, progress=False, cache_dir=None, **kw)


def test_process_backend_matches_inprocess(reader):
    a = _registered_sweep(reader)
    b = _registered_sweep(reader, backend="processes", workers=2)
    cols = [c for c in a.columns if c not in TIMING_COLUMNS]
    pd.testing.assert_frame_equal(a[cols], b[cols])


@pytest.mark.slow
def test_distributed_cluster_matches_inprocess(reader):
    distributed = pytest.importorskip("distributed", reason="dask.distributed not installed")
    a = _registered_sweep(reader)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        b = _registered_sweep(reader, backend="dask", scheduler=client)
        ran_on = client.run(lambda: __import__("os").getpid())
    assert len(set(ran_on.values())) == 2                      # two worker processes
    cols = [c for c in a.columns if c not in TIMING_COLUMNS]
    pd.testing.assert_frame_equal(a[cols], b[cols])


@pytest.mark.slow
def test_ray_backend_matches_inprocess(reader):
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install ray)")
    a = _registered_sweep(reader)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        b = _registered_sweep(reader, backend="ray")
    finally:
        ray.shutdown()
    cols = [c for c in a.columns if c not in TIMING_COLUMNS]
    pd.testing.assert_frame_equal(a[cols], b[cols])


def test_cost_columns_count_what_the_scorer_and_allocator_read(reader):
    docs = synthetic_documents(1, seed=42)
    t = run_sweep(["topk", "resize", "atlas"], [64], {"syn": docs}, scorer="query_saliency",
                  query_aware=True, reader=reader, progress=False, cache_dir=None)
    from fovea_core.importance import scorer_cost

    h, w = docs[0].size
    want = scorer_cost("query_saliency", (h, w)).tokens             # 512 x 512 OCR + thumb
    r = t[t.allocator == "topk"].iloc[0]
    assert r.scorer_tokens == want and r.alloc_read_tokens == 0
    assert r.total_tokens == 64 + want and bool(r.unbudgeted)
    z = t[t.allocator == "resize"].iloc[0]                          # ignores the map: no charge
    assert z.scorer_tokens == 0 and z.total_tokens == 64 and not bool(z.unbudgeted)
    a = t[t.allocator == "atlas"].iloc[0]
    assert a.alloc_read_tokens == 256                               # SLIC on 256 x 256
    assert a.total_tokens == 64 + want + 256
    f = t[t.allocator == "full"].iloc[0]
    assert f.total_tokens == 64 * 64 and not bool(f.unbudgeted)
    # side compute, not budgeted: saliency reads a 64 x 64 thumbnail (16 tokens) outside the
    # 64 tokens; it says where, not what (the evaluation protocol, "Same currency")
    t2 = run_sweep(["topk"], [64], {"syn": docs}, reader=reader, progress=False,
                   cache_dir=None)
    r2 = t2[t2.allocator == "topk"].iloc[0]
    assert r2.scorer_tokens == 16 and not bool(r2.unbudgeted) and bool(r2.side_compute)


def test_cells_are_cached_and_shared_between_sweeps(reader, tmp_path):
    kw = dict(scorer=flat_scorer, reader=reader, progress=False, out=tmp_path,
              cache_dir=tmp_path / "cells")
    first = run_sweep([("level0", grid_at_level(0))], [4096], {"syn": [DOC]}, **kw)
    assert (tmp_path / "results.csv").exists()
    # one file per source fingerprint, as documented (rows-<fingerprint[:12]>.sqlite)
    from fovea_book.eval.evaluator import cell_cache_path, code_fingerprint

    written = sorted(p.name for p in (tmp_path / "cells").glob("*.sqlite"))
    assert written == [cell_cache_path(tmp_path / "cells").name] == \
        [f"rows-{code_fingerprint()[:12]}.sqlite"]
    CALLS.clear()
    again = run_sweep([("level0", grid_at_level(0))], [4096], {"syn": [DOC]}, **kw)
    assert CALLS == []                                   # nothing recomputed
    cols = [c for c in first.columns if c not in TIMING_COLUMNS]
    pd.testing.assert_frame_equal(first[cols], again[cols], check_dtype=False)
    amount = again[(again.field == "amount") & (again.allocator == "level0")].pred.iloc[0]
    assert isinstance(amount, str) and amount.count(".") == 1  # "56.18" stays a string
    # a sweep with one more budget computes only the new cell
    both = run_sweep([("level0", grid_at_level(0))], [100, 4096], {"syn": [DOC]}, **kw)
    assert [c["budget"] for c in CALLS if c["kind"] == "alloc"] == [100]
    pd.testing.assert_frame_equal(both[both.budget == 4096][cols].reset_index(drop=True),
                                  first[first.budget == 4096][cols].reset_index(drop=True),
                                  check_dtype=False)
    # resume=False recomputes every cell
    CALLS.clear()
    run_sweep([("level0", grid_at_level(0))], [4096], {"syn": [DOC]}, resume=False, **kw)
    assert [c["budget"] for c in CALLS if c["kind"] == "alloc"] == [4096]


def test_cache_key_changes_with_the_document_the_libraries_and_the_method(monkeypatch):
    from fovea_book.eval import evaluator as E

    topk = E.Method("topk", "topk", scorer="saliency", query_aware=False)
    ctx = E._context("syn", DOC, Reader(cache_dir=None), 0, 16, 8, "cpu")
    key = E.cell_key(ctx, topk, 64)
    other = synthetic_documents(1, seed=22)[0]
    ctx2 = E._context("syn", other, Reader(cache_dir=None), 0, 16, 8, "cpu")
    assert E.cell_key(ctx2, topk, 64) != key
    monkeypatch.setattr(E, "library_versions", lambda: {"torch": "0.0"})
    ctx3 = E._context("syn", DOC, Reader(cache_dir=None), 0, 16, 8, "cpu")
    assert E.cell_key(ctx3, topk, 64) != key
    assert E.cell_key(ctx, topk, 100) != key
    # every field of the method enters the key, the hooks by name
    for change in (dict(label="t2"), dict(params={"x": 1}), dict(scorer="center_bias"),
                   dict(query_aware=True), dict(key="v2"), dict(columns=_extra_columns),
                   dict(allocate=E.allocate_with_scores)):
        assert E.cell_key(ctx, replace(topk, **change), 64) != key, change
    assert E.cell_key(ctx, replace(topk), 64) == key


def _extra_columns(state, method, question, tokens, parts):
    return {"n_tokens": int(tokens.budget)}


def test_summarize(table):
    s = summarize(table, n_boot=200)
    assert {"anls", "anls_lo", "anls_hi", "kept", "kept_lo", "kept_hi", "em",
            "anls_per_100_tokens", "n_docs"} <= set(s.columns)
    assert (s.anls_lo <= s.anls + 1e-12).all() and (s.anls <= s.anls_hi + 1e-12).all()
    full = s[s.allocator == "full"].iloc[0]
    assert full.kept == pytest.approx(1.0) and full.n_docs == 1
    assert full.anls_per_100_tokens == pytest.approx(100 * full.anls / 4096)


def test_bad_arguments(reader):
    with pytest.raises(ValueError, match="backend"):
        run_sweep(["topk"], [64], {"syn": [DOC]}, backend="spark", reader=reader)
    with pytest.raises(ValueError, match="budget"):
        run_sweep([("l0", grid_at_level(0))], [5000], {"syn": [DOC]}, scorer=flat_scorer,
                  reader=reader, progress=False, cache_dir=None)
    with pytest.raises(ValueError, match="allocator"):
        run_sweep([42], [64], {"syn": [DOC]}, reader=reader)
    with pytest.raises(ValueError, match="scorer"):
        run_sweep(["topk"], [64], {"syn": [DOC]}, scorer="nope", reader=reader)
    with pytest.raises(ValueError, match="budgets"):
        run_sweep(["topk"], [64.5], {"syn": [DOC]}, reader=reader)


def test_compare_paired_difference(table):
    d = compare(table, "level0", "level3")
    assert set(d.budget) == {64, 4096} and (d.n_docs == 1).all()
    per = table.groupby(["allocator", "budget"]).anls.mean()
    row = d[d.budget == 4096].iloc[0]
    assert row["diff"] == pytest.approx(per["level0", 4096] - per["level3", 4096])
    assert row.diff_lo == row["diff"] == row.diff_hi          # one document: no spread
    f = compare(table, "level0", "full")                      # full: its single budget
    assert f[f.budget == 4096]["diff"].iloc[0] == pytest.approx(0.0)
    with pytest.raises(ValueError, match="allocator"):
        compare(table, "nope", "full")


def test_code_fingerprint_follows_the_library_not_the_build_tool(tmp_path):
    from fovea_book.eval.evaluator import code_fingerprint

    for d in ("fovea_core", "fovea_book/build", "fovea_book/eval"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "fovea_core" / "a.py").write_text("x = 1\n")
    (tmp_path / "fovea_book" / "eval" / "b.py").write_text("z = 1\n")
    (tmp_path / "fovea_book" / "build" / "tool.py").write_text("y = 1\n")
    before = code_fingerprint.__wrapped__(tmp_path)
    (tmp_path / "fovea_book" / "build" / "tool.py").write_text("y = 2\n")
    assert code_fingerprint.__wrapped__(tmp_path) == before          # the build tool: no
    (tmp_path / "fovea_core" / "a.py").write_text("x = 2\n")
    after_core = code_fingerprint.__wrapped__(tmp_path)
    assert after_core != before                                      # the method: yes
    (tmp_path / "fovea_book" / "eval" / "b.py").write_text("z = 2\n")
    assert code_fingerprint.__wrapped__(tmp_path) != after_core      # the harness: yes


def test_score_maps_are_cached_exactly(tmp_path, monkeypatch):
    """A score map is computed once per (page, scorer, question) and read back bit for bit;
    another question, page or scorer is another entry; no cache (or a callable) computes."""
    from fovea_book.eval import evaluator as S
    from fovea_core.cache import SqliteCache

    cache = SqliteCache(tmp_path / "rows.sqlite")
    img = torch.from_numpy(DOC.image).permute(2, 0, 1)[None].float() / 255
    calls = []
    score = S._score

    def counted(scorer, image, query, patch, page=None):
        calls.append((scorer, query))
        return score(scorer, image, query, patch, page)

    monkeypatch.setattr(S, "_score", counted)
    a = S.cached_score(cache, "doc1", "saliency", img, None, 16)
    b = S.cached_score(cache, "doc1", "saliency", img, None, 16)
    assert torch.equal(a, b) and a.dtype == b.dtype and len(calls) == 1
    S.cached_score(cache, "doc2", "saliency", img, None, 16)
    S.cached_score(cache, "doc1", "center_bias", img, None, 16)
    S.cached_score(cache, "doc1", "saliency", img, "what is the total?", 16)
    assert len(calls) == 4
    S.cached_score(cache, "doc1", "saliency", img, None, 16, refresh=True)
    S.cached_score(None, "doc1", "saliency", img, None, 16)
    assert len(calls) == 6
    # what the cache returns is the named scorer's map
    torch.testing.assert_close(score("saliency", img, None, 16), a, rtol=0, atol=0)


def test_page_scorers_share_the_page_parts_exactly(monkeypatch, tmp_path):
    """With a per-page dict, the query scorers' maps of a page's questions reuse one OCR read
    and one saliency map (each computed once) and equal ``score(...)`` bit for bit; through
    ``cached_score``, the page's saliency map is the one a query-agnostic sweep cached."""
    import fovea_core.importance as imp
    from fovea_core import build_pyramid
    from fovea_book.eval import evaluator as S
    from fovea_core.cache import SqliteCache

    doc = synthetic_documents(1, seed=3)[0]
    image = build_pyramid(doc.image).base
    questions = [q.question for q in doc.questions[:3]]
    want = {(s, q): imp.score(s, image, query=q) for s in imp.PAGE_PARTS for q in questions}
    calls = []
    saliency, read_page = imp.SCORERS["saliency"], imp.read_page
    monkeypatch.setitem(imp.SCORERS, "saliency",
                        lambda *a, **k: calls.append("saliency") or saliency(*a, **k))
    monkeypatch.setattr(imp.query, "read_page",         # where score_page looks it up
                        lambda *a, **k: calls.append("ocr") or read_page(*a, **k))
    page: dict = {}
    for (s, q), w in want.items():
        assert torch.equal(S._score(s, image, q, 16, page), w)
    assert sorted(calls) == ["ocr", "saliency"]
    # a cached saliency map (a query-agnostic sweep's) is what the page's questions reuse
    cache, calls[:] = SqliteCache(tmp_path / "rows.sqlite"), []
    sal = S.cached_score(cache, "doc", "saliency", image, None, 16)
    page = {}
    for q in questions:
        got = S.cached_score(cache, "doc", "query_saliency", image, q, 16, page=page)
        assert torch.equal(got, want[("query_saliency", q)])
    assert calls == ["saliency", "ocr"] and torch.equal(page["saliency"], sal)
