"""The resize curve, the token-saving table and the compute view (fovea_book.eval.curve)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from fovea_book.eval import curve as C


def _doc(doc_id: str, h: int, w: int):
    return SimpleNamespace(doc_id=doc_id, size=(h, w), questions=())


def _fake_evaluate(calls):
    """evaluate() stand-in: a document's resize ANLS rises with log N (the page's grid
    caps it at the ceiling 0.9); 'full' rows carry the ceiling."""

    def evaluate(datasets, methods, budget, **kw):
        calls.append((budget, {k: [d.doc_id for d in v] for k, v in datasets.items()}))
        rows = []
        for name, docs in datasets.items():
            for d in docs:
                for q in range(2):
                    rows.append(dict(dataset=name, doc_id=d.doc_id, allocator="full", anls=0.9))
                    rows.append(dict(dataset=name, doc_id=d.doc_id, allocator="resize",
                                     anls=min(0.9, 0.2 * np.log2(budget / 136.5))))
        return pd.DataFrame(rows)

    return evaluate


def test_resize_curve_reads_what_fits_and_takes_the_full_page_beyond(monkeypatch):
    import fovea_book.eval.cascade as E

    calls = []
    monkeypatch.setattr(E, "evaluate", _fake_evaluate(calls))
    docs = {"a": [_doc("big", 1024, 1024), _doc("small", 400, 600)]}   # grids 4096 and 950
    cur = C.resize_curve(docs, [273, 576, 1024, 2304])
    assert len(cur) == 8 and set(cur.budget) == {273, 576, 1024, 2304}
    small = cur[cur.doc_id == "small"].set_index("budget")
    assert list(small.at_full) == [False, False, True, True]            # 950 < 1024
    assert (small.loc[[1024, 2304], "anls"] == 0.9).all()               # the full page
    assert small.full_tokens.iloc[0] == 25 * 38
    # only the documents whose grid exceeds N were evaluated at N
    assert [c for c in calls if c[0] == 1024][0][1] == {"a": ["big"]}
    big = cur[cur.doc_id == "big"].set_index("budget").anls
    assert np.allclose(big.to_numpy(), [0.2 * np.log2(n / 136.5) for n in (273, 576, 1024, 2304)])
    with pytest.raises(ValueError, match="budgets"):
        C.resize_curve(docs, [273, 273])


def _curve(kept: dict[int, float], docs: int = 30, noise: float = 0.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame([dict(dataset="d", doc_id=f"p{i}", budget=n, anls=k + noise * rng.normal())
                         for i in range(docs) for n, k in kept.items()])


def _table(label: str, kept: float, docs: int = 30):
    return pd.DataFrame([dict(dataset="d", doc_id=f"p{i}", allocator=label, anls=kept)
                         for i in range(docs)])


def test_saving_table_inverts_the_curve_and_censors_both_ends():
    # curve linear in log N: kept = log2(N / 273) / 4 -> N* = 273 * 2**(4 k)
    budgets = (273, 546, 1092, 2184, 4368)
    cur = _curve({n: np.log2(n / 273) / 4 for n in budgets})
    tab = pd.concat([_table("half", 0.5), _table("top", 2.0), _table("low", -1.0)])
    st = C.saving_table(cur, tab, ["half", "top", "low"], 273, n_boot=200).set_index("method")
    assert st.loc["half", "factor"] == pytest.approx(4.0)               # N* = 1092
    assert st.loc["half", "lo"] == pytest.approx(4.0) and st.loc["half", "hi"] == pytest.approx(4.0)
    assert st.loc["top", "censored"] == "above" and st.loc["top", "bound"] == pytest.approx(16.0)
    assert np.isnan(st.loc["top", "factor"]) and st.loc["top", "text"].startswith(">=")
    assert st.loc["low", "censored"] == "below" and st.loc["low", "text"].startswith("<=")
    assert (st.n_docs == 30).all()


def test_saving_table_ci_covers_the_truth_with_noise():
    budgets = (273, 546, 1092, 2184, 4368)
    cur = _curve({n: np.log2(n / 273) / 4 for n in budgets}, noise=0.05)
    st = C.saving_table(cur, _table("m", 0.5), ["m"], 273, n_boot=500)
    assert st.lo[0] < 4.0 < st.hi[0] and st.lo[0] < st.factor[0] < st.hi[0]


def test_compute_view_adds_side_compute_to_the_prefill():
    from fovea_book.eval.stats import prefill_flops

    cur = _curve({273: 0.2, 1024: 0.6}, docs=3)
    pts = pd.DataFrame([dict(dataset="d", method="m", budget=273, kept=0.5)])
    v = C.compute_view(cur, pts, side_flops={"m": 1e9}).set_index(["method", "budget"])
    assert v.loc[("resize", 1024), "flops"] == pytest.approx(float(prefill_flops(1024)))
    assert v.loc[("m", 273), "flops"] == pytest.approx(float(prefill_flops(273)) + 1e9)
    assert v.loc[("resize", 273), "kept"] == pytest.approx(0.2)


def test_doc_means_names_the_missing_method():
    with pytest.raises(ValueError, match="no rows of method 'x'"):
        C.doc_means(_table("m", 0.5), "x")


def test_resize_curve_reads_the_rescored_table(monkeypatch):
    import fovea_book.eval.cascade as E

    monkeypatch.setattr(E, "evaluate", _fake_evaluate([]))
    docs = {"a": [_doc("big", 1024, 1024), _doc("small", 400, 600)]}

    def halve(t):                                   # a rescoring of every row, full included
        return t.assign(anls=t.anls / 2)

    plain = C.resize_curve(docs, [273, 2304])
    half = C.resize_curve(docs, [273, 2304], rescore=halve)
    assert np.allclose(half.anls, plain.anls / 2) and np.allclose(half.ceiling, 0.45)
    # the full page (beyond its grid) is the rescored ceiling too
    assert half[half.at_full].anls.tolist() == pytest.approx([0.45])


def test_curve_kept_is_the_share_of_the_ceiling_with_a_document_ci():
    rows = [dict(dataset=ds, doc_id=f"p{i}", budget=n, anls=a * (i + 1), ceiling=c * (i + 1))
            for ds in ("z", "a") for i in range(20)
            for n, a, c in ((273, 0.3, 0.6), (1024, 0.5, 0.6))]
    k = C.curve_kept(pd.DataFrame(rows), n_boot=200)
    assert list(k.dataset) == ["z", "z", "a", "a"] and list(k.budget) == [273, 1024] * 2
    assert k.kept.tolist() == pytest.approx([0.5, 5 / 6] * 2)   # sum anls / sum ceiling
    # every document keeps the same share, so every resample does: a CI of width 0
    assert np.allclose(k.lo, k.kept) and np.allclose(k.hi, k.kept) and (k.n_docs == 20).all()
    odd = pd.DataFrame(rows).doc_id.str[1:].astype(int) % 2 == 1   # documents that differ
    noisy = pd.DataFrame(rows).assign(anls=lambda t: t.anls * np.where(odd, 0.5, 1.5))
    n = C.curve_kept(noisy, n_boot=500)
    assert (n.lo < n.kept).all() and (n.kept < n.hi).all()
    with pytest.raises(ValueError, match="ceiling"):
        C.curve_kept(pd.DataFrame(rows).drop(columns="ceiling"))
