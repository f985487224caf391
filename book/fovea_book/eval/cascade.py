"""Evaluate the cascade's variants the way the sweep does, with its localisation metrics.

The rows are computed by the one per-document evaluator,
:func:`fovea_book.eval.evaluator.evaluate_document`, which
:func:`fovea_book.eval.sweep.run_sweep` uses too, so they carry every column of the
sweep's rows (``tests/test_cascade_evaluate.py`` checks that they are equal, column by
column), with what a page's questions share computed once per page (the pyramid, the score
maps, the gist).

A cascade method is a :class:`Method` with ``cascade=True``: its allocate hook
(:func:`cascade_allocate`) runs :func:`~fovea_core.cascade.allocator.cascade_parts` with the
page's gist (kept in the page state), and its columns hook (:func:`cascade_columns`) adds the
localisation metrics ``fovea_share``, ``core_share``, ``cell_auc`` and ``fovea_level``
(:func:`~fovea_book.eval.localisation.localisation_row`) to each of its rows. Cells are cached
in the evaluator's cell cache (``data/cache/sweep/rows-<fingerprint[:12]>.sqlite``, shared
with the sweep; :func:`~fovea_book.eval.evaluator.cell_key`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from fovea_book.eval.documents import Document, Question
from fovea_book.eval.evaluator import Method as EvalMethod
from fovea_book.eval.evaluator import PageState, cell_cache_path, evaluate_documents
from fovea_book.eval.reader import Reader
from fovea_core.tokens import TokenSet

__all__ = ["BOOK_LOCALISERS", "TEXT_SIDE_LABEL", "FOVEA_VARIANTS", "REGION_PAIRS",
           "SACCADE_PAIRS", "ChapterSettings", "Method", "fovea_pairs", "fovea_methods",
           "region_methods", "text_side_method", "book_methods", "cascade_allocate",
           "cascade_columns", "cascade_method", "chapter_settings", "evaluate",
           "gist_choice", "gist_choice_line", "gist_split_methods", "gist_split_rows",
           "gist_split_summary", "kept_difference", "localisation_table", "real_set_methods",
           "unbudgeted_method"]


# ----------------------------------------------------------------------------- the hooks
def cascade_allocate(state: PageState, method: EvalMethod, query: str | None, budget: int,
                     seed: int) -> tuple[TokenSet, Any]:
    """The cascade's allocate hook: :func:`~fovea_core.cascade.allocator.cascade_parts` of
    the page with ``method.params`` and the page's gist at the method's gist budget (default
    :func:`~fovea_core.cascade.allocator.gist_budget_for` ``(budget)``), computed once per
    page and gist budget in ``state.gists``. Returns ``(tokens, CascadeParts)``; the cascade
    reads no score map and no seed."""
    from fovea_core.cascade.allocator import cascade_parts, gist_budget_for
    from fovea_core.cascade.core import gist

    gb = method.params.get("gist_budget") or gist_budget_for(budget)
    if gb not in state.gists:
        state.gists[gb] = gist(state.pyramid, gb, patch=state.patch)
    parts = cascade_parts(state.pyramid, budget, query=query, patch=state.patch,
                          gist_obj=state.gists[gb], **method.params)
    return parts.tokens, parts


def cascade_columns(state: PageState, method: EvalMethod, question: Question,
                    tokens: TokenSet, parts: Any) -> dict:
    """The cascade's columns hook: ``fovea_share``, ``core_share``, ``cell_auc`` and
    ``fovea_level`` of the question's answer boxes
    (:func:`~fovea_book.eval.localisation.localisation_row`, with the localiser's map
    ``parts.scores`` ``[1, Gh, Gw]``), the map's ``map_confidence``
    (:func:`~fovea_core.cascade.allocator.map_confidence`), the page's
    ``page_legibility`` at the question's budget
    (:func:`~fovea_core.cascade.allocator.page_legibility`), and the page's side compute
    (``parts.side``, :class:`~fovea_core.cascade.side.SideCost`): ``side_flops``,
    ``side_ms`` and ``side_px`` (all 0 for a budgeted cascade, which reads nothing outside
    N)."""
    from fovea_book.eval.localisation import localisation_row
    from fovea_core.cascade.allocator import map_confidence, page_legibility

    side = parts.side
    return dict(localisation_row(tokens, parts.scores, question.boxes, patch=state.patch),
                map_confidence=float(map_confidence(parts.scores[:1])[0]),
                page_legibility=float(page_legibility(parts.gist, tokens.budget,
                                                      patch=state.patch)[0]),
                side_flops=0.0 if side is None else float(side.flops),
                side_ms=0.0 if side is None else float(side.cpu_ms),
                side_px=0 if side is None else int(side.pixels))


# ----------------------------------------------------------------------------- methods
@dataclass(frozen=True)
class Method(EvalMethod):
    """One row label of the evaluation (:class:`fovea_book.eval.evaluator.Method`: label,
    allocator, params, scorer, query_aware, key and the two hooks), plus ``cascade``.

    ``cascade=True``: the method is :func:`~fovea_core.cascade.allocator.cascade_parts`
    with ``params`` (``localiser=``, ``gist_budget=``, ...; ``allocator`` should then be
    ``"cascade"``, whose declared read cost is used): the hooks become
    :func:`cascade_allocate` and :func:`cascade_columns` (unless given), and the
    localisation metrics are recorded. To add columns to a cascade's rows, pass
    ``columns=ChainColumns(cascade_columns, more)``
    (:class:`~fovea_book.eval.evaluator.ChainColumns`).
    """

    cascade: bool = False                      # also record the localisation metrics

    def __post_init__(self) -> None:
        if self.cascade:
            if self.allocate is None:
                object.__setattr__(self, "allocate", cascade_allocate)
            if self.columns is None:
                object.__setattr__(self, "columns", cascade_columns)


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


#: label of the learned cascade with the text detector as side compute
TEXT_SIDE_LABEL = "cascade | learned + text detector"


def text_side_method(label: str = TEXT_SIDE_LABEL, *, gist_budget: int | None = None,
                     **params) -> Method:
    """The learned cascade with the text detector as side compute (the registered
    ``cascade_text``: :mod:`fovea_core.cascade.side`), costed beside its N tokens.
    ``params``: more keywords of :func:`~fovea_core.cascade.allocator.cascade_parts` (e.g.
    ``fovea="regions"``)."""
    from fovea_core.cascade.allocator import DEFAULT_GIST

    return Method(label, "cascade_text", dict(localiser="learned", side="text",
                                              gist_budget=gist_budget or DEFAULT_GIST,
                                              **params),
                  cascade=True, query_aware=True)


#: the fovea variants chapter 14.5 compares with the one-level fovea (``fovea=`` of
#: :func:`~fovea_core.cascade.allocator.cascade`): ``{fovea: what its labels add}``
FOVEA_VARIANTS = {"regions": "level per region", "saccade": "second look"}


def fovea_pairs(fovea: str) -> list[tuple[str, str]]:
    """``[(variant label, reference label)]`` of the two cascades of :func:`real_set_methods`
    with ``fovea`` (a key of :data:`FOVEA_VARIANTS`) and the one-level method each changes."""
    if fovea not in FOVEA_VARIANTS:
        raise ValueError(f"fovea_pairs: fovea must be one of {list(FOVEA_VARIANTS)}, got "
                         f"{fovea!r}")
    return [(f"{ref}, {FOVEA_VARIANTS[fovea]}", ref)
            for ref in ("cascade | learned", TEXT_SIDE_LABEL)]


def fovea_methods(fovea: str, *, gist_budget: int | None = None) -> list[Method]:
    """The two cascades of :func:`real_set_methods` with ``fovea`` instead of one core level
    and a surround, labelled as in :func:`fovea_pairs`: the learned cascade (budgeted) and
    the cascade with the text detector (side compute). ``"regions"``: a level per region
    (:func:`~fovea_core.cascade.core.foveate_regions`), from the gist's text-size estimate
    or the detector's measured heights; ``"saccade"``: the coarse look first, then the core
    on the cells where it showed ink (:func:`~fovea_core.cascade.core.look_ink`)."""
    (learned, _), (text, _) = fovea_pairs(fovea)
    return [cascade_method(learned, "learned", gist_budget=gist_budget, fovea=fovea),
            text_side_method(text, gist_budget=gist_budget, fovea=fovea)]


#: the level-per-region variants and the one-level method each changes
REGION_PAIRS = fovea_pairs("regions")
#: the second-look variants and the one-level method each changes
SACCADE_PAIRS = fovea_pairs("saccade")


def region_methods(*, gist_budget: int | None = None) -> list[Method]:
    """:func:`fovea_methods` with a level per region (labels: :data:`REGION_PAIRS`)."""
    return fovea_methods("regions", gist_budget=gist_budget)


def real_set_methods(oracle, *, gist_budget: int | None = None) -> list[Method]:
    """The rows every real set is read with (chapters 14.5 and 17, the same cache keys):
    ``resize`` (the baseline), ``resize_nonblank`` (the training-free document peer; its
    blank test is side compute), the learned cascade (``"cascade | learned"``, budgeted),
    the same with the text detector (:data:`TEXT_SIDE_LABEL`, side compute) and the cascade
    told the answer's boxes (``"cascade | oracle"``, the named upper bound of localisation;
    never a method)."""
    return [Method("resize", "resize", scorer="none", query_aware=False),
            Method("resize_nonblank", "resize_nonblank", scorer="none", query_aware=False),
            cascade_method("cascade | learned", "learned", gist_budget=gist_budget),
            text_side_method(gist_budget=gist_budget),
            cascade_method("cascade | oracle", oracle, gist_budget=gist_budget)]


def default_cache_path() -> Path:
    """The cell cache :func:`evaluate` uses by default (the sweep's:
    :func:`~fovea_book.eval.evaluator.cell_cache_path`)."""
    return cell_cache_path()


def evaluate(datasets: Mapping[str, Sequence[Document]], methods: Sequence[Method],
             budget: int = 273, *, reader: Reader | None = None, seed: int = 0,
             patch: int = 16, cache_path: str | Path | None = "default",
             workers: int | None = 1, progress: bool = False) -> pd.DataFrame:
    """Rows (one per document x question x method, plus the ``full`` ceiling) with every
    column of :func:`~fovea_book.eval.sweep.run_sweep`
    (:data:`~fovea_book.eval.evaluator.ROW_COLUMNS`); cascade methods add ``fovea_share``,
    ``core_share``, ``cell_auc`` and ``fovea_level`` (NaN in the other rows). Cells and
    score maps are cached in one file: ``cache_path`` (``"default"``:
    :func:`default_cache_path`, the sweep's cache, so chapters share them; ``None``: no
    cache).

    ``workers``: 1 (default) evaluates in this process; ``None`` (the CPU count) or more
    spreads the documents over :func:`~fovea_book.eval.evaluator.process_pool` (methods and
    localisers must then pickle: registry names, module-level callables, the oracle).
    """
    if workers is not None and (isinstance(workers, bool) or int(workers) < 1):
        raise ValueError(f"workers must be None or an int >= 1, got {workers!r}")
    path = default_cache_path() if cache_path == "default" else cache_path
    return evaluate_documents(datasets, list(methods), [int(budget)], workers=workers,
                              cache_path=path, progress=progress, reader=reader or Reader(),
                              seed=seed, patch=patch)


def kept_difference(table: pd.DataFrame, a: str, b: str, *, docs=None, n_boot: int = 2000,
                    seed: int = 0) -> dict:
    """Paired difference of *kept* (sum of ANLS / sum of the ceiling's ANLS over documents)
    between methods ``a`` and ``b``: ``{"diff", "lo", "hi", "n_docs", "a", "b"}``, a
    percentile-bootstrap CI over documents (questions averaged within a document first,
    the ratio recomputed on each resample with the documents paired)."""
    from fovea_book.eval.metrics import bootstrap_ci

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


# ----------------------------------------------------------------------------- chapter 14.5
class ChapterSettings(NamedTuple):
    """What chapter 14.5 evaluates in a profile (:func:`chapter_settings`)."""

    gist_budgets: list[int]        # the G values of the budget-split curve
    sizes: tuple[int, int]         # (synthetic pages, SROIE receipts)
    n_invoices: int                # pages of the held-out invoice layout
    qa_candidates: list[str]       # query-agnostic allocators the "best" is chosen from


def chapter_settings(profile: str, *, gist_default: int, gist_budgets=None, sizes=None,
                     n_invoices: int | None = None, qa_candidates=None) -> ChapterSettings:
    """Chapter 14.5's parameters for ``profile`` (``smoke``, ``default`` or ``full``), each
    given value kept (``None``: the profile's).

    ``gist_budgets`` always holds ``gist_default`` (added and sorted when missing). (The
    resize curve's budgets are :func:`~fovea_book.eval.curve.book_curve_budgets`, shared
    with chapter 17; the curve module reads this one, so they are not chosen here.)
    """
    from fovea_book.profiles import choose

    gb = list(gist_budgets or choose(profile, smoke=[48, gist_default],
                                     default=[32, gist_default, 128],
                                     full=[32, 48, gist_default, 96, 128]))
    if gist_default not in gb:
        gb = sorted(gb + [gist_default])
    return ChapterSettings(
        gist_budgets=gb,
        sizes=tuple(sizes or choose(profile, smoke=(2, 1), default=(40, 40), full=(200, 40))),
        n_invoices=(n_invoices if n_invoices is not None
                    else choose(profile, smoke=1, default=24, full=60)),
        qa_candidates=list(qa_candidates or choose(
            profile, smoke=["topk"], default=["topk", "pyramid"],
            full=["topk", "pyramid", "stratified", "frequency", "foveated_pyramid"])))


def localisation_table(table: pd.DataFrame) -> pd.DataFrame:
    """Where each cascade's fovea landed, per dataset: the means over questions of
    ``fovea_share`` (the answer's area inside the fovea), ``cell_auc`` (the map's ROC AUC
    over the level-0 cells), ``core_level`` (the fovea's core level, ``fovea_level``) and
    ``anls``, and ``questions``, for every allocator of ``table`` whose label starts with
    ``"cascade"``. Columns ``dataset, allocator, fovea_share, cell_auc, core_level, anls,
    questions``."""
    need = {"dataset", "allocator", "fovea_share", "cell_auc", "fovea_level", "anls"}
    missing = need - set(table.columns)
    if missing:
        raise ValueError(f"table lacks the column(s) {sorted(missing)} (rows of evaluate "
                         "with cascade methods)")
    rows = table[table.allocator.str.startswith("cascade")]
    return (rows.groupby(["dataset", "allocator"])
            .agg(fovea_share=("fovea_share", "mean"), cell_auc=("cell_auc", "mean"),
                 core_level=("fovea_level", "mean"), anls=("anls", "mean"),
                 questions=("anls", "size")).reset_index())


#: label prefix of the budget-split rows of each localiser (``prefix + str(G)``)
GIST_SPLIT_PREFIX = {"learned": "cascade | learned | G=", "oracle": "cascade | oracle | G="}


def gist_split_methods(gist_budgets: Sequence[int], oracle, *, gist_default: int
                       ) -> list[Method]:
    """The budget-split curve's methods: the learned cascade, then the oracle cascade, at
    every gist budget G of ``gist_budgets`` except ``gist_default`` (whose rows the chapter
    already has), labelled ``"cascade | learned | G=32"`` etc."""
    return [cascade_method(GIST_SPLIT_PREFIX[name] + str(g), loc, gist_budget=g)
            for name, loc in (("learned", "learned"), ("oracle", oracle))
            for g in gist_budgets if g != gist_default]


def gist_split_rows(curve: pd.DataFrame, table: pd.DataFrame, gist_default: int
                    ) -> pd.DataFrame:
    """The budget-split curve's rows: ``curve`` (the :func:`gist_split_methods`' rows,
    without its ``full`` rows) and ``table``'s ``resize``, ``full`` and the two cascades at
    ``gist_default``, relabelled ``"cascade | learned | G=<gist_default>"`` (and oracle)."""
    ref = {"cascade | learned": GIST_SPLIT_PREFIX["learned"] + str(gist_default),
           "cascade | oracle": GIST_SPLIT_PREFIX["oracle"] + str(gist_default)}
    base = table[table.allocator.isin([*ref, "resize", "full"])]
    base = base.assign(allocator=base.allocator.replace(ref))
    return pd.concat([curve[curve.allocator != "full"], base], ignore_index=True)


def gist_split_summary(rows: pd.DataFrame, *, seed: int = 0) -> pd.DataFrame:
    """:func:`~fovea_book.eval.sweep.summarize` of :func:`gist_split_rows` with two more
    columns: ``G`` (the gist budget, float; NaN for ``resize`` and ``full``) and
    ``localiser`` (``learned`` or ``oracle``)."""
    from fovea_book.eval.sweep import summarize

    cs = summarize(rows, seed=seed)
    cs["G"] = cs.allocator.str.extract(r"G=(\d+)$", expand=False).astype(float)
    cs["localiser"] = cs.allocator.str.extract(r"\| (\w+) \|", expand=False)
    return cs


def gist_choice(rows: pd.DataFrame, budget: int, *, baseline: str = "resize",
                seed: int = 0) -> pd.DataFrame:
    """The learned cascade's gist budget G chosen on the *select* half of each dataset
    (:func:`~fovea_book.eval.experiments.choose_on_select_half` among the
    ``"cascade | learned | G=..."`` labels of ``rows``, in sorted label order: a tie goes
    to the first; a dataset with no select-half document takes the first) and tested
    against ``baseline`` on the *report* half (:func:`~fovea_book.eval.stats.report_or_all`),
    Holm over the datasets.

    Columns ``dataset, best, G, n_select, n_report, diff, lo, hi, p`` (paired ANLS
    difference), ``kept, kept_resize, kept_diff, kept_lo, kept_hi`` (:func:`kept_difference`),
    ``p_holm, verdict``.
    """
    from fovea_book.eval.experiments import choose_on_select_half
    from fovea_book.eval.stats import holm, paired_family, report_or_all, split_halves, verdict

    cands = sorted(a for a in rows.allocator.unique()
                   if a.startswith(GIST_SPLIT_PREFIX["learned"]))
    if not cands:
        raise ValueError(f"rows hold no {GIST_SPLIT_PREFIX['learned']!r}... label: pass "
                         "gist_split_rows")
    chosen = choose_on_select_half(rows, cands, budget).set_index("dataset").best
    out = []
    for ds, t in rows.groupby("dataset"):
        sel, _ = split_halves(t.doc_id.unique())
        best = chosen.get(ds, cands[0])
        rep = report_or_all(t.doc_id.unique())
        r = paired_family(t, [best], baseline, budget, docs=rep, seed=seed,
                          correct=False).iloc[0]
        k = kept_difference(t, best, baseline, docs=rep, seed=seed)
        out.append(dict(dataset=ds, best=best, G=int(best.rsplit("=", 1)[1]),
                        n_select=len(sel), n_report=int(r.n_docs), diff=r["diff"],
                        lo=r.diff_lo, hi=r.diff_hi, p=r.p, kept=k["a"], kept_resize=k["b"],
                        kept_diff=k["diff"], kept_lo=k["lo"], kept_hi=k["hi"]))
    g = pd.DataFrame(out)
    g["p_holm"] = holm(g["p"].to_numpy())
    g["verdict"] = [verdict(r.lo, r.hi, r.n_report, p=r.p_holm) for r in g.itertuples()]
    return g


def gist_choice_line(row) -> str:
    """One row of :func:`gist_choice` as the chapter's sentence: ``"better compared with
    `resize` (+3.1 [0.5, 5.6] ANLS points; kept 62 % vs 40 %, n = 20 report documents)"``."""
    from fovea_book.eval.stats import ci_text

    return (f"{row.verdict} compared with `resize` ({ci_text(row['diff'], row.lo, row.hi)} "
            f"ANLS points; kept {100 * row.kept:.0f} % vs {100 * row.kept_resize:.0f} %, "
            f"n = {row.n_report} report documents)")
