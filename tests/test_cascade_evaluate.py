"""The cascade chapter's evaluation renders only the reader's crops: the crops must be the
full render's, and the rows the sweep's."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from fovea_core import build_pyramid
from fovea_core.methods import allocate
from fovea_core.cascade import cascade
from fovea_book.eval.cascade import Method, evaluate
from fovea_core.cascade.localisers import uniform
from fovea_book.eval.documents import make_document
from fovea_book.eval.reader import (
    Reader,
    crop_box,
    crop_window,
    read_answer,
    to_uint8,
)
from fovea_core.importance import score
from fovea_core.sample import render, sample


def _tokens(name: str, pyr, n: int = 273):
    s = score("saliency", pyr.base)
    return allocate(name, pyr, s, n)


@pytest.mark.parametrize("name", ["resize", "topk", "pyramid", "cascade"])
def test_window_equals_the_crop_of_the_full_render(name):
    doc = make_document(21, layout="receipt")
    pyr = build_pyramid(doc.image)
    if name == "cascade":
        tok = cascade(pyr, None, 273, localiser=uniform, level=0.7)
    else:
        tok = _tokens(name, pyr)
    patches = sample(pyr, tok)
    full = render(tok, patches, background=pyr)
    h, w = doc.size
    rng = np.random.default_rng(0)
    wins = [(0, h, 0, w)] + [tuple(int(v) for v in (y, y + rng.integers(5, 90),
                                                   x, x + rng.integers(5, 300)))
                             for y, x in zip(rng.integers(0, h - 90, 6), rng.integers(0, w - 300, 6))]
    for y0, y1, x0, x1 in wins:
        win = render(tok, patches, background=pyr, window=(y0, y1, x0, x1))
        ref = full[:, :, y0:y1, x0:x1]
        assert win.shape == ref.shape
        assert torch.allclose(win, ref, atol=2e-6), (y0, y1, x0, x1)
        a = to_uint8(win[0].permute(1, 2, 0).numpy())
        b = to_uint8(ref[0].permute(1, 2, 0).numpy())
        assert (np.abs(a.astype(int) - b.astype(int)) <= 1).all() and (a == b).mean() > 0.999


def test_crop_window_is_the_readers_crop():
    img = np.arange(200 * 300 * 3, dtype=np.uint8).reshape(200, 300, 3)
    for box in [(10, 10, 50, 30), (0, 0, 300, 200), (250, 180, 299, 199)]:
        y0, y1, x0, x1 = crop_window(box, (200, 300), 0.3)
        assert np.array_equal(img[y0:y1, x0:x1], crop_box(img, box, 0.3))


def test_read_answer_reads_what_the_reader_reads_on_the_full_render():
    doc = make_document(8)
    pyr = build_pyramid(doc.image)
    tok = _tokens("resize", pyr)
    patches = sample(pyr, tok)
    full = render(tok, patches, background=pyr)[0].permute(1, 2, 0).clamp(0, 1).numpy()
    reader = Reader(cache_dir=None)
    for q in doc.questions[:3]:
        assert read_answer(reader, pyr, tok, patches, q.boxes) == reader.read(full, q.boxes)


#: the cascade's localisation columns, added by its columns hook (not in the sweep's rows)
SIDE_COSTS = ("side_flops", "side_ms", "side_px")
LOCALISATION = ("fovea_share", "core_share", "cell_auc", "fovea_level", "map_confidence",
                "page_legibility")


def _every_column_equal(a: pd.DataFrame, b: pd.DataFrame, *, skip: tuple = ()) -> None:
    """The two tables have the same columns and equal rows in every column but the timings
    (:data:`~fovea_book.eval.sweep.TIMING_COLUMNS`) and ``skip``, named here."""
    from fovea_book.eval.sweep import TIMING_COLUMNS

    assert list(a.columns) == list(b.columns)
    cols = [c for c in a.columns if c not in TIMING_COLUMNS + tuple(skip)]
    assert len(cols) >= 24, cols
    pd.testing.assert_frame_equal(a[cols].reset_index(drop=True), b[cols].reset_index(drop=True))


@pytest.mark.parametrize("query_aware", [False, True])
def test_rows_match_the_sweep_in_every_column(tmp_path, query_aware):
    """The two entry points give the same rows on the same documents: every column but the
    timings, query-agnostic and query-aware, a random allocator included (its seed)."""
    from fovea_book.eval.evaluator import ROW_COLUMNS
    from fovea_book.eval.sweep import run_sweep

    docs = {"synthetic": [make_document(31)], "receipts": [make_document(52, layout="receipt")]}
    reader = Reader(cache_dir=tmp_path / "reader")
    names = ["resize", "topk", "random"]
    ours = evaluate(docs, [Method(a, a, scorer="center_bias", query_aware=query_aware)
                           for a in names],
                    160, reader=reader, seed=3, cache_path=tmp_path / "cells.sqlite")
    theirs = run_sweep(names, [160], docs, scorer="center_bias", query_aware=query_aware,
                       reader=reader, seed=3, cache_dir=None, progress=False)
    assert list(ours.columns) == list(ROW_COLUMNS)          # no cascade method: no extras
    assert set(ours.allocator) == {"full", *names} and len(ours) == 4 * 11
    _every_column_equal(ours, theirs)
    # a second call is served from the cell cache: the same rows, timings included
    again = evaluate(docs, [Method(a, a, scorer="center_bias", query_aware=query_aware)
                            for a in names],
                     160, reader=Reader(cache_dir=None), seed=3,
                     cache_path=tmp_path / "cells.sqlite")
    pd.testing.assert_frame_equal(again, ours)


def test_cascade_hook_rows_match_the_registered_cascade_in_the_sweep(tmp_path):
    """A cascade method (its allocate and columns hooks) gives the rows of the registered
    ``cascade`` allocator in the sweep, in every column but the timings and the label, plus
    the localisation columns."""
    from fovea_book.eval.sweep import run_sweep

    docs = {"synthetic": [make_document(33)]}
    reader = Reader(cache_dir=tmp_path / "reader")
    ours = evaluate(docs, [Method("cascade_localiseruniform", "cascade",
                                  dict(localiser="uniform"), scorer="none", cascade=True)],
                    273, reader=reader, cache_path=None)
    theirs = run_sweep([("cascade", {"localiser": "uniform"})], [273], docs, scorer="none",
                       query_aware=True, reader=reader, cache_dir=None, progress=False)
    extra = list(LOCALISATION) + list(SIDE_COSTS)
    assert list(ours.columns[-len(extra):]) == extra
    r = ours[ours.allocator != "full"]
    assert r[list(LOCALISATION)].notna().all().all()
    assert (r[list(SIDE_COSTS)] == 0).all().all()          # a budgeted cascade: no side cost
    assert ours[ours.allocator == "full"][extra].isna().all().all()
    _every_column_equal(ours.drop(columns=extra), theirs)


def test_cascade_rows_carry_localisation(tmp_path):
    from fovea_book.eval.localisation import OracleLocaliser

    doc = make_document(41)
    m = Method("cascade_oracle", "cascade", dict(localiser=OracleLocaliser([doc]), level=0.5),
               cascade=True)
    rows = evaluate({"synthetic": [doc]}, [m], 273, reader=Reader(cache_dir=tmp_path),
                    cache_path=tmp_path / "c.sqlite")
    r = rows[rows.allocator == "cascade_oracle"]
    assert len(r) == len(doc.questions)
    assert (r.fovea_share > 0.99).all() and (r.cell_auc > 0.95).all()
    assert (r.total_tokens == 273).all() and not r.unbudgeted.any()
    assert (r.anls >= r.ceiling_anls - 0.05).mean() > 0.8


def test_evaluation_over_processes_matches_one_process(tmp_path):
    from fovea_book.eval.localisation import OracleLocaliser
    from fovea_book.eval.sweep import TIMING_COLUMNS

    docs = [make_document(51), make_document(52, layout="receipt")]
    methods = [Method("resize", "resize", scorer="none", query_aware=False),
               Method("topk", "topk", scorer="saliency", query_aware=False),
               Method("oracle", "cascade", dict(localiser=OracleLocaliser(docs)), cascade=True)]
    reader = Reader(cache_dir=None)
    one = evaluate({"synthetic": docs}, methods, 273, reader=reader, cache_path=None)
    two = evaluate({"synthetic": docs}, methods, 273, reader=reader, cache_path=None,
                   workers=2)
    cols = [c for c in one.columns if c not in TIMING_COLUMNS + ("alloc_ms",)]
    pd.testing.assert_frame_equal(one[cols], two[cols])
    with pytest.raises(ValueError, match="workers"):
        evaluate({"synthetic": docs}, methods, 273, reader=reader, cache_path=None, workers=0)


def test_book_methods_are_the_cascade_chapter_rows():
    """Chapter 17 ranks chapter 14.5's rows through ``book_methods``: the same labels,
    parameters and flags as the chapter builds with ``cascade_method`` (hence the same
    cached cells), the gist defaulting to ``DEFAULT_GIST``, the prior-only localiser
    allocating once per page."""
    from fovea_core.cascade.allocator import DEFAULT_GIST
    from fovea_book.eval.cascade import (BOOK_LOCALISERS, book_methods, cascade_allocate,
                                             cascade_columns, cascade_method,
                                             unbudgeted_method)

    methods = book_methods()
    assert [m.label for m in methods] == list(BOOK_LOCALISERS) + [
        "topk | query_saliency", "pyramid | query_saliency"]
    for m, (label, loc) in zip(methods, BOOK_LOCALISERS.items()):
        # written out field by field (not rebuilt with cascade_method)
        want = Method(label, "cascade", {"localiser": loc, "gist_budget": DEFAULT_GIST},
                      scorer="none", query_aware=True, cascade=True)
        assert m == want and m.identity() == want.identity()
        assert (m.allocate, m.columns) == (cascade_allocate, cascade_columns)
    assert not cascade_method("p", "learned_prior").query_aware
    assert cascade_method("g", "learned", gist_budget=32).params["gist_budget"] == 32
    q = unbudgeted_method("topk")
    assert (q.label, q.allocator, q.params, q.scorer, q.query_aware, q.cascade,
            q.allocate, q.columns) == ("topk | query_saliency", "topk", {},
                                       "query_saliency", True, False, None, None)


# ----------------------------------------------------------------------------- chapter 14.5
def test_chapter_settings_follow_the_profile_and_keep_given_values():
    from fovea_book.eval.cascade import chapter_settings

    s = chapter_settings("smoke", gist_default=64)
    assert s.gist_budgets == [48, 64] and s.sizes == (2, 1) and s.n_invoices == 1
    assert s.qa_candidates == ["topk"]
    d = chapter_settings("default", gist_default=40)
    assert d.gist_budgets == [32, 40, 128] and d.sizes == (40, 40) and d.n_invoices == 24
    f = chapter_settings("full", gist_default=64)
    assert f.gist_budgets == [32, 48, 64, 96, 128] and f.sizes == (200, 40)
    assert f.qa_candidates[-1] == "foveated_pyramid" and f.n_invoices == 60
    # given values are kept; the default G is added (sorted) to a given list without it
    g = chapter_settings("smoke", gist_default=64, gist_budgets=[128, 32], sizes=[5, 0],
                         n_invoices=0, qa_candidates=["pyramid"])
    assert g.gist_budgets == [32, 64, 128] and g.sizes == (5, 0) and g.n_invoices == 0
    assert g.qa_candidates == ["pyramid"]
    with pytest.raises(ValueError, match="profile"):
        chapter_settings("huge", gist_default=64)


def test_localisation_table_means_each_cascades_columns():
    from fovea_book.eval.cascade import localisation_table

    t = pd.DataFrame(dict(dataset=["a", "a", "a", "b", "a", "a"],
                          allocator=["cascade | x", "cascade | x", "resize", "cascade | x",
                                     "cascade | y", "cascade | x"],
                          fovea_share=[0.2, 0.4, np.nan, 1.0, 0.5, 0.9],
                          cell_auc=[0.6, 0.8, np.nan, 0.9, 0.7, 1.0],
                          fovea_level=[1.0, 2.0, np.nan, 0.5, 1.5, 6.0],
                          anls=[0.1, 0.3, 0.9, 1.0, 0.5, 0.5]))
    lt = localisation_table(t).set_index(["dataset", "allocator"])
    assert list(lt.index) == [("a", "cascade | x"), ("a", "cascade | y"), ("b", "cascade | x")]
    r = lt.loc[("a", "cascade | x")]                     # means over its three questions
    assert (r.fovea_share, r.cell_auc, r.core_level, r.anls, r.questions) == pytest.approx(
        (0.5, 0.8, 3.0, 0.3, 3))
    with pytest.raises(ValueError, match="fovea_level"):
        localisation_table(t.drop(columns="fovea_level"))


def _split_rows(n_docs: int = 60, anls=None) -> pd.DataFrame:
    """Sweep-shaped rows of the budget-split curve: each method reads every page equally."""
    anls = anls or {"full": 1.0, "resize": 0.3, "cascade | learned | G=32": 0.5,
                    "cascade | learned | G=64": 0.7, "cascade | oracle | G=32": 0.8,
                    "cascade | oracle | G=64": 0.9}
    rows = [dict(dataset="syn", doc_id=f"d{d}", qid="q", budget=273, allocator=m, anls=a,
                 em=a, ceiling_anls=1.0, strata_cov=np.nan, empty_disc_frac=np.nan,
                 alloc_ms=1.0)
            for d in range(n_docs) for m, a in anls.items()]
    return pd.DataFrame(rows)


def test_gist_split_methods_and_rows_label_each_gist_budget():
    from fovea_book.eval.localisation import OracleLocaliser
    from fovea_book.eval.cascade import gist_split_methods, gist_split_rows

    oracle = OracleLocaliser([make_document(41)])
    ms = gist_split_methods([32, 64, 128], oracle, gist_default=64)
    assert [m.label for m in ms] == ["cascade | learned | G=32", "cascade | learned | G=128",
                                     "cascade | oracle | G=32", "cascade | oracle | G=128"]
    assert [m.params["gist_budget"] for m in ms] == [32, 128, 32, 128]
    assert ms[0].params["localiser"] == "learned" and ms[2].params["localiser"] is oracle
    table = pd.DataFrame(dict(allocator=["cascade | learned", "cascade | oracle", "resize",
                                         "full", "topk"], anls=[1, 2, 3, 4, 5]))
    curve = pd.DataFrame(dict(allocator=["cascade | learned | G=32", "full"], anls=[6, 7]))
    rows = gist_split_rows(curve, table, 64)
    assert list(rows.allocator) == ["cascade | learned | G=32", "cascade | learned | G=64",
                                    "cascade | oracle | G=64", "resize", "full"]
    assert list(rows.anls) == [6, 1, 2, 3, 4]          # the curve's own full row is dropped


def test_gist_split_summary_reads_g_and_the_localiser():
    from fovea_book.eval.cascade import gist_split_summary

    cs = gist_split_summary(_split_rows(24)).set_index("allocator")
    assert cs.loc["cascade | oracle | G=32", "G"] == 32
    assert cs.loc["cascade | oracle | G=32", "localiser"] == "oracle"
    assert cs.loc["cascade | learned | G=64", "localiser"] == "learned"
    assert np.isnan(cs.loc["resize", "G"]) and cs.loc["cascade | learned | G=64", "kept"] == \
        pytest.approx(0.7)


def test_gist_choice_chooses_on_the_select_half_and_reports_on_the_other():
    from fovea_book.eval.cascade import gist_choice, gist_choice_line
    from fovea_book.eval.stats import split_halves

    rows = _split_rows()
    g = gist_choice(rows, 273)
    r = g.iloc[0]
    sel, rep = split_halves(rows.doc_id.unique())
    assert len(g) == 1 and r.best == "cascade | learned | G=64" and r.G == 64
    assert (r.n_select, r.n_report) == (len(sel), len(rep))
    assert r["diff"] == pytest.approx(0.4) and r.kept == pytest.approx(0.7)
    assert r.kept_resize == pytest.approx(0.3) and r.verdict == "better"
    assert gist_choice_line(r) == ("better compared with `resize` (+40.0 [40.0, 40.0] ANLS "
                                   f"points; kept 70 % vs 30 %, n = {len(rep)} report "
                                   "documents)")
    # a tie goes to the first label in sorted order
    tie = _split_rows(anls={"full": 1.0, "resize": 0.3, "cascade | learned | G=64": 0.6,
                            "cascade | learned | G=32": 0.6})
    assert gist_choice(tie, 273).best.iloc[0] == "cascade | learned | G=32"
    # a page set with no select-half page takes the first label (tested on its report half)
    few = gist_choice(rows[rows.doc_id.isin(rep[:3])], 273).iloc[0]
    assert few.best == "cascade | learned | G=32" and (few.n_select, few.n_report) == (0, 3)
    # one with no report-half page is tested on all its pages
    alone = gist_choice(rows[rows.doc_id.isin(sel[:4])], 273).iloc[0]
    assert alone.best == "cascade | learned | G=64" and alone.n_report == 4
    with pytest.raises(ValueError, match="gist_split_rows"):
        gist_choice(rows[~rows.allocator.str.startswith("cascade")], 273)
