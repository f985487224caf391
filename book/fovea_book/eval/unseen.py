"""Chapter 14.8's pages unlike the training pages: what breaks the map, and what was tried.

* :func:`factor_pages` / :func:`factor_summary`: the photograph factors of
  :mod:`fovea_book.eval.photo`, one at a time, on ``sroie-train`` pages the localiser never
  trained on (its record's held-out fifth and pages added since), scored by the map's cell
  AUC and the answer's share inside the fovea (no OCR);
* :class:`WeightsLocaliser`: the learned localiser with other weights (trained with a
  collection left out, :data:`LOCO_WEIGHTS`, or with other augmentation);
* :func:`token_anchors`: the papers' published values the chapter shows beside its own;
* :func:`rule_figure`: the fit of the page-size rule (:mod:`fovea_book.eval.tried.resize_rule`)
  from its record;
* :func:`unseen_targets`: the targets set for these pages and for reading before looking,
  each with its verdict from the 95 % CI.

Nothing here reads a dev page to choose anything: the factors and the rule use training
pages only; the dev sets are evaluated by the chapter with the same evaluator as every
other row.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd

from fovea_book.eval.document_types import Document
from fovea_book.eval.fitting import weights_record

__all__ = ["FACTOR_PAGES", "FACTOR_LOCALISERS", "RUNTIME_BAR_S", "factor_pages",
           "factor_summary", "rule_figure", "learning_table", "learning_figure", "field_kept",
           "ttft_target", "unseen_targets", "PHOTO_WEIGHTS", "photo_localiser", "LEARNING_SETS",
           "LOCO_WEIGHTS", "WeightsLocaliser", "TOKEN_ANCHORS_CSV", "token_anchors",
           "PART_WEIGHTS", "FREE_WEIGHTS", "MapScores", "choose_candidate", "map_auc",
           "versus_resize", "versus_resize_glue", "text_height_ratio", "read_sets"]

#: unseen ``sroie-train`` pages the factor table reads, per profile (``None``: all)
FACTOR_PAGES = {"smoke": 2, "default": 12, "full": None}
#: the localisers the factor table compares: ``{label: LOCALISERS name}``
FACTOR_LOCALISERS = {"learned": "learned", "learned, on the sheet": "learned_paper"}
#: the chapter's default build time, alone on the machine, when the targets were set (s): the
#: bar of "no slower than today" (a target's bar, not a result of this build)
RUNTIME_BAR_S = 1195.0


#: the localiser trained with photograph-like augmentation on every real training page
#: (``python -m fovea_book.train --photo --out data/models/gist_localiser_photo.pt``; its
#: record beside it): a candidate the chapter evaluates, not the committed default
PHOTO_WEIGHTS = "data/models/gist_localiser_photo.pt"
#: the localisers trained with one real collection left out (``python -m fovea_book.train
#: --real funsd-train --out data/models/gist_localiser_no_sroie.pt`` and ``--real sroie-train
#: --out data/models/gist_localiser_no_funsd.pt``): ``{left-out dataset: weights}``. Each is
#: reported on the dev set of the collection it never saw, the way a user meets a new one
LOCO_WEIGHTS = {"sroie": "data/models/gist_localiser_no_sroie.pt",
                "funsd": "data/models/gist_localiser_no_funsd.pt"}


#: localisers trained with pages shown in part (``--part 0.5``: a band of 35-70 % of the
#: page's rows, so the text is taller against the frame), without and with photograph-like
#: augmentation; chapter 98 (appendix) chooses one on training pages (:func:`choose_candidate`)
PART_WEIGHTS = {"part-trained": "data/models/gist_localiser_part.pt",
                "photo + part trained": "data/models/gist_localiser_photo_part.pt"}
#: localisers whose network never sees where on the page a pixel lies (``--no-position``:
#: the position and aspect channels zeroed, so no layout prior can be learned), without and
#: with photograph-like augmentation; chapter 98 (appendix) chooses one on training pages
#: (:func:`choose_candidate`)
FREE_WEIGHTS = {"position-free": "data/models/gist_localiser_noposition.pt",
                "photo + position-free": "data/models/gist_localiser_photo_noposition.pt"}


@functools.lru_cache(maxsize=8)
def _net(weights: str):
    from fovea_book.paths import project_root
    from fovea_core.cascade.learned import LearnedLocaliser

    return LearnedLocaliser(str(project_root() / weights))


def photo_localiser(g, query: str | None):
    """The cascade's localiser with the photo-trained weights (:data:`PHOTO_WEIGHTS`, SHA-256
    checked against their record): ``(gist, query) -> [B, Gh, Gw]``. A module-level function,
    so evaluations on a process pool pickle it and cache its rows by name."""
    return _net(PHOTO_WEIGHTS)(g, query)


@dataclass(frozen=True)
class WeightsLocaliser:
    """The cascade's learned localiser with other weights: ``weights`` is a path relative to
    the project root (the ``.pt`` file; its JSON record beside it, whose SHA-256 the weights
    are checked against when loaded). Picklable for a process pool; its ``repr`` names the
    weights and their SHA-256, so an evaluation's row cache keys on both
    (:func:`~fovea_book.eval.evaluator.evaluate`)."""

    weights: str

    def __post_init__(self) -> None:
        weights_record(self.weights)                      # refuses weights without a record

    def record(self) -> dict:
        """The weights' training record (the JSON beside them, read once per process)."""
        return weights_record(self.weights)

    def __repr__(self) -> str:
        return f"WeightsLocaliser({self.weights!r}, sha256={self.record()['sha256'][:16]!r})"

    def __call__(self, g, query: str | None):
        """``(gist, query) -> [B, Gh, Gw]``, as :class:`~fovea_core.cascade.learned.LearnedLocaliser`."""
        return _net(self.weights)(g, query)


#: published values on spending fewer visual tokens on documents (each paper's abstract, quoted)
TOKEN_ANCHORS_CSV = "data/papers/token_anchors.csv"


def token_anchors() -> pd.DataFrame:
    """The papers' published values of :data:`TOKEN_ANCHORS_CSV` (see its header): a
    DataFrame indexed by ``quantity`` with columns ``value, unit, status, source, model,
    location``; ``source`` is a key of ``book/references.bib``. Raises ``ValueError`` for a
    row that is not ``published`` (the chapter shows only values read in the source)."""
    from fovea_book.paths import project_root

    t = pd.read_csv(project_root() / TOKEN_ANCHORS_CSV, comment="#").set_index("quantity")
    bad = t.index[t.status != "published"].tolist()
    if bad:
        raise ValueError(f"{TOKEN_ANCHORS_CSV}: rows not read in their source: {bad}")
    return t


def factor_pages(profile: str, *, data_dir=None) -> tuple[list[Document], str]:
    """``(pages, message)``: the first :data:`FACTOR_PAGES` ``[profile]`` ``sroie-train``
    receipts (by id) that no localiser here trained on (the committed one's unseen pages in
    the fifth every run holds out, ``crc32(id) % real_valid_mod == 0``), or ``([], why)``
    when the folder is missing."""
    import zlib

    from fovea_book.eval.fitting import localiser_record, unseen_pages
    from fovea_book.paths import DatasetNotFound
    from fovea_book.train import TrainConfig

    if profile not in FACTOR_PAGES:
        raise ValueError(f"profile must be one of {sorted(FACTOR_PAGES)}, got {profile!r}")
    try:
        docs = unseen_pages(localiser_record(), "sroie-train", data_dir=data_dir)
    except DatasetNotFound as err:
        return [], f"photograph factors skipped: {err}"
    # the fifth every training run here holds out (real_valid_mod), so that a candidate
    # trained on pages added since is compared on pages none of them saw
    held = [d for d in docs if zlib.crc32(d.doc_id.encode()) % TrainConfig.real_valid_mod == 0]
    unseen = held[:FACTOR_PAGES[profile]]
    return unseen, (f"{len(unseen)} sroie-train receipts no localiser here trained on "
                    f"({sum(len(d.questions) for d in unseen)} questions)")


class MapScores(NamedTuple):
    """:func:`map_auc`'s result: ``by_field`` (mean cell AUC per dataset and field, and
    localiser), ``family`` (each localiser minus the reference, paired over documents,
    Holm) and ``rows`` (one per dataset, localiser and question:
    :func:`~fovea_book.eval.photo.factor_table`'s columns, ``map_confidence`` among them)."""

    by_field: pd.DataFrame
    family: pd.DataFrame
    rows: pd.DataFrame


def map_auc(sets: Mapping[str, Sequence[Document]], localisers: Mapping, *,
            reference: str = "learned", budget: int = 273, seed: int = 0) -> MapScores:
    """How well each localiser's map ranks the answer's cells on pages as they are, read by
    nobody (no OCR: :func:`~fovea_book.eval.photo.factor_table` with the page as stored).

    ``sets``: ``{dataset: documents}``; ``localisers``: ``{label: localiser}`` (a
    :data:`~fovea_core.cascade.localisers.LOCALISERS` name or a callable), ``reference``
    among them. Returns a :class:`MapScores`: the mean cell AUC per dataset and field
    (rows) and localiser (columns), plus an ``"all"`` field per dataset (the questions'
    mean); each other localiser minus ``reference`` in cell AUC, paired over documents
    (a document's questions averaged first), one Holm family over localisers and datasets
    (:func:`~fovea_book.eval.stats.paired_family`'s columns; ``text`` in AUC points x 100);
    and the rows (each map's confidence among their columns).
    """
    from fovea_book.eval.photo import FACTORS, factor_table
    from fovea_book.eval.stats import paired_family

    if reference not in localisers:
        raise ValueError(f"map_auc: reference {reference!r} is not one of {list(localisers)}")
    parts = [factor_table(docs, localisers, factors={"as stored": FACTORS["as stored"]},
                          budget=budget, seed=seed).assign(dataset=ds)
             for ds, docs in sets.items() if docs]
    if not parts:
        raise ValueError("map_auc: no document in sets")
    t = pd.concat(parts, ignore_index=True)
    by = t.groupby(["dataset", "field", "localiser"]).cell_auc.mean().unstack("localiser")
    every = t.groupby(["dataset", "localiser"]).cell_auc.mean().unstack("localiser")
    every.index = pd.MultiIndex.from_product([every.index, ["all"]], names=["dataset", "field"])
    by_field = pd.concat([by, every]).sort_index()[list(localisers)]
    rows = t.rename(columns={"localiser": "allocator"}).assign(budget=budget)
    others = [k for k in localisers if k != reference]
    family = (paired_family(rows, others, reference, metric="cell_auc", seed=seed)
              if others else pd.DataFrame())
    return MapScores(by_field, family, t)


def text_height_ratio(docs: Sequence[Document], gist_budget: int, localiser=None) -> np.ndarray:
    """``[Q]`` per question: the answer's text height the learned localiser expects from the
    gist (``text_px``, base pixels; the level the fovea reads at follows from it) over the
    answer's true height (its boxes' median, base pixels). Below 1: the fovea reads finer,
    and so covers less of the page, than the text needs. ``localiser``: a
    :class:`~fovea_core.cascade.learned.LearnedLocaliser` (default: the committed weights)."""
    from fovea_book.train import gist_of
    from fovea_core.cascade.learned import LearnedLocaliser

    loc = LearnedLocaliser() if localiser is None else localiser
    out = []
    for d in docs:                                          # a few dozen pages
        g = gist_of(d, gist_budget)
        for q in d.questions:
            true = float(np.median([b[3] - b[1] for b in q.boxes]))
            out.append(float(loc.text_px(g, q.question)[0]) / true)
    return np.asarray(out, dtype=float)


def read_sets(sets: Mapping[str, Sequence[Document]], methods, n_ref: int,
              readers: Mapping[str, object], *, seed: int = 0) -> dict[str, pd.DataFrame]:
    """Every set of ``sets`` (``{dataset: documents}``, empty ones skipped) read with
    ``methods`` by each reader of ``readers`` (``{name: Reader}``), one evaluation per set:
    ``{reader name: rows of every set}``. ``methods``: a list of
    :class:`~fovea_book.eval.evaluator.Method`, or ``methods(dataset, reader name) -> list``
    where they differ. WildReceipt's rows are rescored with spaces removed
    (:func:`~fovea_book.eval.wildreceipt.rescore_without_spaces`: its transcriptions drop
    them). A reader with no set to read gives no entry."""
    from fovea_book.eval.cascade import evaluate
    from fovea_book.eval.wildreceipt import rescore_without_spaces

    out = {}
    for rd, reader in readers.items():
        parts = []
        for ds, docs in sets.items():
            if not docs:
                continue
            ms = methods(ds, rd) if callable(methods) else methods
            t = evaluate({ds: docs}, ms, n_ref, reader=reader, seed=seed, workers=None)
            parts.append(rescore_without_spaces(t, docs) if ds == "wildreceipt" else t)
        if parts:
            out[rd] = pd.concat(parts, ignore_index=True)
    return out


def choose_candidate(summary: pd.DataFrame, candidates: Sequence[str]) -> str:
    """The candidate localiser (a column of :func:`factor_summary`'s ``cell_auc``) whose map
    ranks the answer's cells best on average over the factors: the highest mean cell AUC
    over the rows (factors), ties to the first in ``candidates``. Training pages only."""
    if not candidates:
        raise ValueError("choose_candidate: no candidate given")
    auc = summary["cell_auc"]
    missing = [c for c in candidates if c not in auc.columns]
    if missing:
        raise KeyError(f"choose_candidate: no factor rows for {missing}")
    means = auc[list(candidates)].mean()
    return str(means.idxmax())


def versus_resize(table: pd.DataFrame, label: str, keys: Mapping[str, str], n_ref: int, *,
                  reference: str = "cascade | learned", seed: int = 0,
                  family: pd.DataFrame | None = None) -> dict[str, str]:
    """Glue texts for one method ``label`` of an evaluation ``table`` on each dataset of
    ``keys`` (``{dataset: key}``): ``kept_<row>_<key>`` for ``resize``, ``reference`` and
    ``label`` (rows ``resize``, ``learned``, ``new``; "95 % CI" texts), ``res_<key>`` (minus
    ``resize``, Holm over the datasets: ``family``, the rows of
    :func:`~fovea_book.eval.realsets.real_family` of ``[label]`` where the caller has them,
    else computed here), ``bar_<key>`` (the carry-over target's verdict,
    :func:`~fovea_book.eval.wildreceipt.carry_over_verdict`) and ``ref_<key>`` (minus
    ``reference``, Holm over the datasets). A dataset without rows gives "not measured"."""
    from fovea_book.eval.realsets import kept_table, real_family, variant_family
    from fovea_book.eval.wildreceipt import carry_over_verdict

    na = "not measured (no data)"
    rows = {"resize": "resize", reference: "learned", label: "new"}
    kept = kept_table(table, list(rows), seed=seed).set_index(["dataset", "method"])
    res = (real_family(table, [label], n_ref, seed=seed) if family is None
           else family).set_index("dataset")
    ref = variant_family(table, [(label, reference)], n_ref, seed=seed).set_index("dataset")
    out = {}
    for ds, dk in keys.items():
        for m, mk in rows.items():
            k = kept.loc[(ds, m)] if (ds, m) in kept.index else None
            out[f"kept_{mk}_{dk}"] = (na if k is None else
                                      f"{100 * k.kept:.0f} % [{100 * k.lo:.0f}, {100 * k.hi:.0f}]")
        r = res.loc[ds] if ds in res.index else None
        out[f"res_{dk}"] = na if r is None else f"{r['verdict']} ({r['text']} points)"
        out[f"bar_{dk}"] = na if r is None else (
            f"**{carry_over_verdict(100 * r['diff'], 100 * r['diff_lo'], int(r['n_docs']))}**")
        r = ref.loc[ds] if ds in ref.index else None
        out[f"ref_{dk}"] = na if r is None else f"{r['verdict']} ({r['text']} points)"
    return out


def versus_resize_glue(tables: Mapping[str, pd.DataFrame], label: str, keys: Mapping[str, str],
                       n_ref: int, *, seed: int = 0, reference: str = "cascade | learned",
                       readers: Sequence[str] = ("rapidocr", "tesseract"),
                       families: Mapping[str, pd.DataFrame] | None = None) -> dict[str, str]:
    """:func:`versus_resize`'s texts of ``label`` (``ref``: minus ``reference``) for every reader
    of ``readers``, named for a chapter's glue (the chapter prefixes each name with its
    section's, which its glue check reads): ``{f"{name}_{key}_{reader}": text}`` for
    ``name`` in ``kept_new``, ``res``, ``bar``, ``ref`` and every ``key`` of ``keys``; a
    reader without a table in ``tables`` (``{reader: rows}``), or a dataset without rows,
    gives "not measured (no data)". ``families`` (``{reader: rows of real_family of
    [label]}``) passes on the minus-``resize`` family a caller already has, as
    :func:`versus_resize`'s ``family``."""
    out = {}
    families = families or {}
    for rd in readers:
        words = (versus_resize(tables[rd], label, keys, n_ref, reference=reference, seed=seed,
                               family=families.get(rd)) if rd in tables else {})
        for dk in keys.values():
            for name in ("kept_new", "res", "bar", "ref"):
                out[f"{name}_{dk}_{rd}"] = words.get(f"{name}_{dk}", "not measured (no data)")
    return out


def factor_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Mean cell AUC and answer share inside the fovea per factor (rows, in the table's
    order) and localiser (column level), over the questions of :func:`~fovea_book.eval.
    photo.factor_table`; ``pages`` is the number of pages the factor kept."""
    order = list(dict.fromkeys(table.factor))
    m = table.groupby(["factor", "localiser"], sort=False)[["cell_auc", "fovea_share"]].mean()
    out = m.unstack("localiser").reindex(order)
    out[("pages", "")] = table.groupby("factor").doc_id.nunique().reindex(order)
    return out


def rule_figure(record: Mapping):
    """The page-size rule's fit (:mod:`fovea_book.eval.tried.resize_rule`'s record): mean ANLS of
    the rule against its threshold (multiples of N, 0 = never resize) on each training set
    and all together, the chosen threshold marked."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    for name, curve in record["by_set"].items():
        c = pd.DataFrame(curve)
        ax.plot(c.threshold, c.anls, marker=".", lw=1, label=f"{name} ({int(c.n_docs[0])} pages)")
    c = pd.DataFrame(record["curve"])
    ax.plot(c.threshold, c.anls, color="k", lw=2, label=f"all ({int(c.n_docs[0])})")
    ax.axvline(record["resize_within"], color="k", ls=":", lw=1)
    ax.set_xscale("symlog", linthresh=1.5)
    ax.set_xlabel("resize the page when its grid holds <= this many times N cells")
    ax.set_ylabel("mean ANLS of the rule")
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig


def learning_table(record: Mapping) -> pd.DataFrame:
    """The localiser's learning curve (``python -m fovea_book.learning_curve``'s record) as
    rows ``label, photo, real_pages, set, hit_mass, top1, questions``: one per training run
    and held-out set (``sroie/heldout``, ``sroie/heldout:date`` for a field, ...), plus the
    committed weights as ``label = "committed"`` (``real_pages`` NaN). Validation numbers on
    training pages never trained on: tuning numbers, not results."""
    rows = []
    for p in record["points"]:
        n = sum(p["real_pages"].values())
        for name, v in p["validation"].items():
            rows.append(dict(label=p["label"], photo=bool(p["photo"]), real_pages=n, set=name,
                             hit_mass=v["hit_mass"], top1=v["top1"], questions=v["questions"]))
            for f, fv in v.get("fields", {}).items():
                rows.append(dict(label=p["label"], photo=bool(p["photo"]), real_pages=n,
                                 set=f"{name}:{f}", hit_mass=fv["hit_mass"], top1=fv["top1"],
                                 questions=fv["questions"]))
    for name, v in record.get("reference", {}).get("validation", {}).items():
        rows.append(dict(label="committed", photo=False, real_pages=float("nan"), set=name,
                         hit_mass=v["hit_mass"], top1=v["top1"], questions=v["questions"]))
        for f, fv in v.get("fields", {}).items():
            rows.append(dict(label="committed", photo=False, real_pages=float("nan"),
                             set=f"{name}:{f}", hit_mass=fv["hit_mass"], top1=fv["top1"],
                             questions=fv["questions"]))
    return pd.DataFrame(rows)


LEARNING_SETS = {"sroie/heldout": "receipts", "sroie+photo/heldout": "receipts, photo-like",
                 "sroie/heldout:date": "receipts, date", "funsd/heldout": "forms"}


def learning_figure(table: pd.DataFrame, sets: Mapping[str, str] = LEARNING_SETS):
    """Held-out hit mass (the map's mass on the answer) against the real training pages of
    each run (:func:`learning_table`): photo-augmented runs as lines, the run without the
    augmentation as open markers, the committed weights as dotted lines."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for i, (name, label) in enumerate(sets.items()):
        c = f"C{i}"
        t = table[table.set == name]
        ph = t[t.photo & t.real_pages.notna()].sort_values("real_pages")
        ax.plot(ph.real_pages, ph.hit_mass, marker="o", color=c, label=label)
        plain = t[~t.photo & t.real_pages.notna()]
        ax.scatter(plain.real_pages, plain.hit_mass, facecolors="none", edgecolors=c, s=60)
        ref = t[t.label == "committed"]
        if len(ref):
            ax.axhline(float(ref.hit_mass.iloc[0]), color=c, ls=":", lw=1)
    ax.set_xlabel("real training pages (sroie-train + funsd-train)")
    ax.set_ylabel("held-out hit mass")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def field_kept(table: pd.DataFrame, method: str, *, seed: int = 0) -> pd.DataFrame:
    """Kept per question field of ``method`` (rows of one dataset): ``field, n_docs, kept,
    lo, hi`` (:func:`~fovea_book.eval.realsets.kept_table` of the field's rows, 95 % CI
    over the documents that ask it)."""
    from fovea_book.eval.realsets import kept_table

    rows = []
    for f, t in table.groupby("field"):
        k = kept_table(t, [method], seed=seed)
        if len(k):
            rows.append(dict(field=f, **k.iloc[0][["n_docs", "kept", "lo", "hi"]].to_dict()))
    return pd.DataFrame(rows, columns=["field", "n_docs", "kept", "lo", "hi"])


def ttft_target(record: Mapping | None, saving: pd.DataFrame, method: str, budget: int
                ) -> tuple[dict | None, str]:
    """``(ttft, sentence)``: the end-to-end time-to-first-token speedup at equal reading on
    the receipts, for :func:`unseen_targets`, and a sentence for the text.

    ``record``: the ``ttft`` benchmark's JSON (:func:`~fovea_book.bench.common.load_result`;
    ``None``: not measured). ``saving``: :func:`~fovea_book.eval.curve.saving_table` rows;
    the row of ``("sroie", method)`` gives the token count at which ``resize`` reads as well
    as ``method`` at ``budget`` (``factor * budget``, with its CI), and
    :func:`~fovea_book.bench.ttft.ttft_speedup` the speedup there; the CI is the speedup at
    the factor's CI ends (the timing's own spread is in the record). A count outside the
    benchmark's measured range is clipped to it, and the sentence says so."""
    if record is None:
        return None, "not measured (no benchmark record `data/benchmarks/ttft.json`)"
    from fovea_book.bench.common import staleness
    from fovea_book.bench.ttft import resize_token_range, ttft_speedup

    row = saving[(saving.dataset == "sroie") & (saving.method == method)]
    if row.empty or not np.isfinite(float(row.factor.iloc[0])):
        return None, "not measured (no finite saving factor on the receipts)"
    r = row.iloc[0]
    lo_n, hi_n = (float(n) for n in resize_token_range(record))
    want = [float(v) * budget for v in (r.factor, r.lo, r.hi)]
    clipped = any(not lo_n <= n <= hi_n for n in want if np.isfinite(n))
    at = [min(max(n if np.isfinite(n) else hi_n, lo_n), hi_n) for n in want]
    best, lo, hi = (ttft_speedup(record, n) for n in at)
    g = best["groups"]
    hw = record.get("hardware", {})
    sentence = (
        f"on {hw.get('cpu', 'this CPU')} ({_threads(hw.get('torch_threads'))}; "
        f"{staleness(record)['label']}), the default cascade at N = {budget} reaches the first "
        f"token in {best['foveated_ms'] / 1000:.1f} s and `resize` at the {want[0]:.0f} tokens "
        f"where it reads as well on the receipts in {best['resize_ms'] / 1000:.1f} s "
        f"({best['speedup']:.1f}x); front end (page to tokens, side compute included) "
        f"{g['front_end']['foveated_ms'] / 1000:.2f} s against "
        f"{g['front_end']['resize_ms'] / 1000:.2f} s, vision tower "
        f"{g['vision']['foveated_ms'] / 1000:.1f} s against {g['vision']['resize_ms'] / 1000:.1f} s, "
        f"prefill {g['prefill']['foveated_ms'] / 1000:.1f} s against "
        f"{g['prefill']['resize_ms'] / 1000:.1f} s"
        + (f" (token counts clipped to the benchmark's measured {lo_n:.0f}-{hi_n:.0f})"
           if clipped else ""))
    return dict(speedup=best["speedup"], lo=lo["speedup"], hi=hi["speedup"],
                n_docs=int(r.n_docs)), sentence


def _threads(n) -> str:
    return f"{n} thread" + ("" if n == 1 else "s") if n is not None else "threads unknown"


def unseen_targets(*, carry: Mapping[tuple[str, str], Mapping],
                   sroie_gain: Mapping[tuple[str, str], Mapping],
                   kept: Mapping[tuple[str, str], Mapping],
                   fields: pd.DataFrame | None,
                   forms_gain: Mapping | None,
                   saving: pd.DataFrame,
                   read_vs_one: Mapping | None,
                   saving_read: pd.DataFrame | None = None,
                   runtime_s: float | None, runtime_bar_s: float,
                   runtime_computed: int | None = None,
                   ttft: Mapping | None) -> pd.DataFrame:
    """The targets for pages unlike the training pages and for reading before looking (set
    before any of these measurements), as rows ``target, measured, verdict``
    (:func:`~fovea_book.eval.stats.target_row`; both readers combined by
    :func:`~fovea_book.eval.realsets.both_readers` where two were measured).

    Arguments (differences and shares as fractions; each a mapping with ``diff``/``kept``,
    ``lo``, ``hi``, ``n_docs``):

    * ``carry``: ``{(method label, reader): cascade - resize on wildreceipt-dev}``; the
      target is :data:`~fovea_book.eval.wildreceipt.CARRY_OVER_TARGET` (at least 0, the
      CI's lower bound above -2 points);
    * ``sroie_gain``: ``{(method label, reader): cascade - resize on SROIE dev}``, >= +10;
    * ``kept``: ``{(dataset, reader): kept of the default cascade}`` for ``"sroie"``
      (>= 97 %, moonshot 99 %) and ``"funsd"`` (>= 80 %, moonshot 90 %);
    * ``fields``: :func:`field_kept` of the default cascade on the receipts, every field
      >= 90 % (the verdict of the worst);
    * ``forms_gain``: cascade - resize on FUNSD dev, >= +50 points;
    * ``saving``: :func:`~fovea_book.eval.curve.saving_table` rows (``dataset``, ``method``,
      ``factor``, ``lo``, ``hi``, ``n_docs``) of the default cascade: >= 4x on the receipts
      (moonshot 6x), >= 3x on the forms (moonshot 5x);
    * ``saving_read``: the same rows for the read-then-look cascade (both fixations are
      inside its N, so every token is counted), the same bars (``None``: no rows);
    * ``read_vs_one``: ``cascade_read`` minus the one-fixation cascade on FUNSD dev with its
      Holm verdict (``verdict``): met when the family calls it better;
    * ``runtime_s``: the chapter's build time so far, at most ``runtime_bar_s``, judged only
      when the build computed its evaluation cells: ``runtime_computed``, the entries (rows,
      score maps and allocations) this build stored in the row cache; 0 (every cell read
      from the cache) gives "not measured", since such a build times the cache, not the
      chapter (``None``: not counted, judged as timed);
    * ``ttft``: ``{"speedup", "lo", "hi", "n_docs"}``: time to first token, resize at the
      token count that reads as well over the cascade at N, >= 2x (moonshot 3x).

    A missing input gives its rows the verdict ``"not measured (<why>)"``.
    """
    from fovea_book.eval.realsets import both_readers
    from fovea_book.eval.stats import target_row, target_verdict
    from fovea_book.eval.wildreceipt import CARRY_OVER_TARGET, carry_over_verdict

    rows: list[dict] = []

    def missing(target: str, why: str) -> None:
        rows.append(dict(target=target, measured="-", verdict=f"not measured ({why})"))

    def by_reader(name: str, results: Mapping[str, dict], verdicts: Mapping[str, str]) -> None:
        if not results:
            missing(name, "no data")
            return
        measured = "; ".join(f"{rd} {r['measured']}" for rd, r in results.items())
        words = list(verdicts.values())
        v = words[0] if len(words) == 1 else both_readers(words[0], words[1])
        rows.append(dict(target=name, measured=measured, verdict=v))

    labels = list(dict.fromkeys(m for m, _ in carry))
    for m in labels:
        res, ver = {}, {}
        for (mm, rd), d in carry.items():
            if mm != m:
                continue
            res[rd] = target_row("", d["diff"], d["lo"], d["hi"], 0.0, d["n_docs"],
                                 unit=" points", digits=1)
            ver[rd] = carry_over_verdict(100 * d["diff"], 100 * d["lo"], int(d["n_docs"]))
        by_reader(f"WildReceipt dev: {m} - resize >= {CARRY_OVER_TARGET[0]:.0f} points, CI "
                  f"lower bound above {CARRY_OVER_TARGET[1]:.0f} (both readers)", res, ver)
    for m in list(dict.fromkeys(m for m, _ in sroie_gain)):
        res = {rd: target_row("", d["diff"], d["lo"], d["hi"], 0.10, d["n_docs"],
                              unit=" points", digits=1)
               for (mm, rd), d in sroie_gain.items() if mm == m}
        by_reader(f"SROIE dev: {m} - resize >= +10 points (both readers)", res,
                  {rd: r["verdict"] for rd, r in res.items()})
    for ds, name, bar, moon in (("sroie", "receipts (SROIE dev)", 0.97, 0.99),
                                ("funsd", "forms (FUNSD dev)", 0.80, 0.90)):
        for b, tag in ((bar, ""), (moon, " (moonshot)")):
            res = {rd: target_row("", d["kept"], d["lo"], d["hi"], b, d["n_docs"])
                   for (dd, rd), d in kept.items() if dd == ds}
            by_reader(f"{name}: the default cascade keeps >= {100 * b:.0f} %{tag}", res,
                      {rd: r["verdict"] for rd, r in res.items()})
    if fields is None or fields.empty:
        missing("receipts: every field >= 90 %", "no data")
    else:
        ver = [target_verdict(r.lo, r.hi, 0.90, r.n_docs) for r in fields.itertuples()]
        v = ("not met" if "not met" in ver else "met" if all(x == "met" for x in ver)
             else "undecided" if all(x in ("met", "undecided") for x in ver) else ver[0])
        worst = fields.sort_values("kept").iloc[0]
        rows.append(dict(target="receipts (SROIE dev): every field >= 90 % (rapidocr)",
                         measured=", ".join(f"{r.field} {100 * r.kept:.0f} % [{100 * r.lo:.0f}, "
                                            f"{100 * r.hi:.0f}]" for r in fields.itertuples())
                         + f" (lowest: {worst.field})", verdict=v))
    if forms_gain is None:
        missing("forms (FUNSD dev): >= resize + 50 points", "no data")
    else:
        d = forms_gain
        rows.append(target_row("forms (FUNSD dev): the default cascade >= resize + 50 points "
                               "(rapidocr)", d["diff"], d["lo"], d["hi"], 0.50, d["n_docs"],
                               unit=" points"))
    for who, sav in (("the default cascade", saving),
                     ("read, then look (both fixations)", saving_read)):
        if sav is None:
            continue
        sv = sav.set_index("dataset") if len(sav) else sav
        for ds, name, bar, moon in (("sroie", "receipts", 4.0, 6.0),
                                    ("funsd", "forms", 3.0, 5.0)):
            for b, tag in ((bar, ""), (moon, " (moonshot)")):
                target = f"{who}: token-saving factor >= {b:.0f}x on the {name}{tag} (rapidocr)"
                if ds not in getattr(sv, "index", []):
                    missing(target, "no data")
                    continue
                r = sv.loc[ds]
                rows.append(target_row(target, r.factor, r.lo, r.hi, b, r.n_docs, scale=1,
                                       unit="x", digits=1))
    if read_vs_one is None:
        missing("forms: read-then-look better than one fixation (paired, Holm)", "no data")
    else:
        d = read_vs_one
        v = d["verdict"]
        rows.append(dict(target="forms (FUNSD dev): read-then-look better than one fixation "
                         "(paired, Holm over the sets)",
                         measured=f"{100 * d['diff']:+.1f} points [{100 * d['lo']:+.1f}, "
                                  f"{100 * d['hi']:+.1f}] (n = {int(d['n_docs'])})",
                         verdict="met" if v == "better" else
                         v if v.startswith("too few") else "not met"))
    if runtime_s is None:
        missing(f"chapter 14.8 builds in <= {runtime_bar_s:.0f} s", "no timing")
    elif runtime_computed == 0:
        missing(f"chapter 14.8 builds in <= {runtime_bar_s:.0f} s", "every evaluation cell "
                f"came from the row cache; this build took {runtime_s:.0f} s")
    else:
        cells = ("" if runtime_computed is None else
                 f", {runtime_computed} row-cache entries computed")
        rows.append(dict(target=f"chapter 14.8 builds in <= {runtime_bar_s:.0f} s (one run on "
                         "a shared 2-core machine; no CI)", measured=f"{runtime_s:.0f} s{cells}",
                         verdict="met" if runtime_s <= runtime_bar_s else "not met"))
    if ttft is None:
        for b, tag in ((2.0, ""), (3.0, " (moonshot)")):
            missing(f"time to first token at equal reading >= {b:.0f}x{tag}", "no benchmark")
    else:
        for b, tag in ((2.0, ""), (3.0, " (moonshot)")):
            rows.append(target_row(f"time to first token at equal reading, receipts: resize "
                                   f"over the default cascade >= {b:.0f}x{tag}",
                                   ttft["speedup"], ttft["lo"], ttft["hi"], b, ttft["n_docs"],
                                   scale=1, unit="x", digits=1))
    return pd.DataFrame(rows, columns=["target", "measured", "verdict"])
