"""Shared set-up of the experiment chapters (notebooks 08-11): data, an ablation, verdicts.

* :func:`load_datasets` -- the synthetic pages and the SROIE receipts of chapter 07 (same
  seeds, same order, so the reader's crop cache is shared between chapters), optionally the
  FUNSD dev forms (``n_forms``), with a clear message instead of an error when a dataset
  folder is missing;
* :func:`foveal_ratio_pyramid` -- the v2.5 ablation "foveal ratio": a foveated pyramid
  whose share of full-resolution (level-0) tokens is a parameter instead of a consequence
  of the budget (an allocator: it lives in :mod:`fovea_book.eval.foveal_ratio` and is
  re-exported here);
* :func:`footprint_coverage` -- fraction of the image under at least one token footprint
  (the "context" a token set keeps);
* :func:`paired_vs` -- a family of paired differences against one baseline with their
  verdicts (:mod:`fovea_book.eval.stats` holds the one verdict rule and the protocol's
  statistics; :func:`verdict` and :func:`ci_text` are re-exported from there);
* the chapter kit: :func:`book_datasets`, :func:`chapter_sweep`, :func:`family_text` /
  :func:`family_line` (verdict sentences), :func:`select_then_report`,
  :func:`choose_on_select_half` + :func:`report_half` (choose a variant on the select half
  of an exploratory ablation, test it on the report half of all documents;
  :func:`chosen_line` says it in a sentence), :func:`relabel` (sweep labels -> a chapter's
  names) and :func:`equivalence_family` ("does A at N_a read as much as B at N_b?", two
  one-sided tests with a margin);
* the chapters' sentences, each from one table: :func:`baselines_family` /
  :func:`baselines_line` (a variant minus the variants it should beat), :func:`cost_line`
  (total tokens and the budgeted label), :func:`equivalence_line`, :func:`selected_line`,
  :func:`conditions_line` (one comparison under several conditions), and chapter 17's
  :func:`kept_ci_text`, :func:`verdict_counts_line` and :func:`best_line`.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from fovea_book.eval.foveal_ratio import foveal_ratio_pyramid  # noqa: F401 (re-export)
from fovea_book.eval.documents import Document, synthetic_documents
from fovea_book.eval.stats import ci_text, paired_family, verdict
from fovea_book.paths import DatasetNotFound, dataset_path, project_root
from fovea_core.tokens import TokenSet

__all__ = ["BOOK_DOCS", "N_REF", "book_datasets", "chapter_sweep", "family_text",
           "family_line", "select_then_report", "choose_on_select_half", "chosen_line",
           "relabel", "report_half",
           "equivalence_family", "load_datasets", "foveal_ratio_pyramid", "footprint_coverage", "verdict",
           "ci_table", "paired_vs", "predicted_vs_measured",
           "ci_text", "SYNTHETIC_SEED", "baselines_family", "baselines_line", "cost_line",
           "equivalence_line", "selected_line", "kept_ci_text", "verdict_counts_line",
           "best_line", "conditions_line"]

#: seed offset of the synthetic pages used by every experiment chapter (chapter 07's)
SYNTHETIC_SEED = 1000
#: documents per dataset in each profile, ``(synthetic pages, SROIE receipts)``: the
#: published (default) book evaluates all 40 dev receipts and 60 synthetic pages, so every
#: verdict rests on at least ``stats.MIN_DOCS`` = 20 documents per dataset (the evaluation protocol, ``book/protocol.md``)
BOOK_DOCS = {"smoke": (3, 2), "default": (60, 40), "full": (200, 40)}
#: the reference budget the seeds' numbers refer to
N_REF = 273


def book_datasets(profile: str, *, data_dir=None, seed: int = 0, wording: str = "default",
                  sizes: tuple[int, int] | None = None
                  ) -> tuple[dict[str, list[Document]], str]:
    """The evaluation documents of the experiment chapters for ``profile``
    (:data:`BOOK_DOCS`; ``sizes`` overrides), with the message of :func:`load_datasets`
    (the FUNSD forms of the real-document chapters: :func:`fovea_book.eval.realsets.book_forms`).

    Every chapter draws the same pages and receipts in the same order, so the sweep's cell
    cache and the reader's crop cache are shared across the book.
    """
    from fovea_book.profiles import PROFILES

    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    n_syn, n_rec = sizes if sizes is not None else BOOK_DOCS[profile]
    return load_datasets(n_syn, n_rec, data_dir=data_dir, seed=seed, wording=wording)


def load_datasets(n_synthetic: int, n_receipts: int, *, data_dir=None, seed: int = 0,
                  wording: str = "default", cache_dir: str | Path | None = "default",
                  n_forms: int = 0) -> tuple[dict[str, list[Document]], str]:
    """``({"synthetic": pages, "sroie": receipts, "funsd": forms}, message)`` for an
    experiment chapter.

    Pages are ``synthetic_documents(n_synthetic, seed=SYNTHETIC_SEED + seed)``; receipts are
    the first ``n_receipts`` of ``dataset_path("sroie-dev", data_dir)`` (sorted by id);
    forms the first ``n_forms`` of ``dataset_path("funsd-dev", data_dir)``
    (:func:`fovea_book.eval.funsd.load_funsd`, sorted by name; default 0: no forms, as
    before this keyword existed). ``wording`` phrases the questions (``"default"``, or a
    held-out set of templates; see :mod:`fovea_book.eval.documents`); the pages and answers
    do not change with it. When a folder is missing
    (:class:`~fovea_book.paths.DatasetNotFound`) or its count is 0 the ``"sroie"`` /
    ``"funsd"`` key is absent and ``message`` says why, so a notebook prints it and carries
    on with the other sets; what the forms' loader skipped (entities, links) is in
    ``message`` too.

    Every experiment chapter loads the same sets (about 10 s: drawing the pages' text,
    matching the receipts' fields to their boxes), so the result is kept in
    ``cache_dir`` (``"default"``: ``data/cache/datasets``; ``None``: no cache), the pages as
    lossless PNG (40 MB for the default profile instead of 0.8 GB of raw pixels; ~3 s to
    read back), keyed by the arguments, the ``fovea_core`` source and the receipts' and
    forms' files (names, sizes, mtimes): a read-back is the same documents, byte for byte.
    """
    if n_synthetic < 1:
        raise ValueError(f"n_synthetic must be >= 1, got {n_synthetic}")
    if n_receipts < 0:
        raise ValueError(f"n_receipts must be >= 0, got {n_receipts}")
    if isinstance(n_forms, bool) or not isinstance(n_forms, int) or n_forms < 0:
        raise ValueError(f"n_forms must be an int >= 0, got {n_forms!r}")
    if cache_dir is None:
        return _load_datasets(n_synthetic, n_receipts, data_dir, seed, wording, n_forms)
    from fovea_book.eval.evaluator import code_fingerprint

    root = project_root() / "data" / "cache" / "datasets" if cache_dir == "default" \
        else Path(cache_dir)
    spec = dict(v=1, n=[n_synthetic, n_receipts], seed=seed, wording=wording,
                code=code_fingerprint(), files=_receipt_files(data_dir) if n_receipts else None)
    if n_forms:                                 # absent when 0: the keys of before n_forms
        spec.update(forms=n_forms, funsd_files=_dataset_files("funsd-dev", data_dir))
    key = hashlib.sha1(json.dumps(spec).encode()).hexdigest()
    path = root / f"{key[:20]}.pkl"
    if path.exists():
        with open(path, "rb") as f:
            packed, msg = pickle.load(f)
        return {k: [_unpack(d) for d in v] for k, v in packed.items()}, msg
    datasets, msg = _load_datasets(n_synthetic, n_receipts, data_dir, seed, wording, n_forms)
    root.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(({k: [_pack(d) for d in v] for k, v in datasets.items()}, msg), f,
                    protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)                       # a reader never sees a half-written file
    return datasets, msg


def _receipt_files(data_dir) -> list | str:
    """``[(relative path, size, mtime_ns)]`` of the SROIE dev folder, or why it is missing."""
    return _dataset_files("sroie-dev", data_dir)


def _dataset_files(name: str, data_dir) -> list | str:
    """``[(relative path, size, mtime_ns)]`` of dataset ``name``, or why it is missing."""
    try:
        base = dataset_path(name, data_dir)
    except DatasetNotFound as err:
        return f"missing: {err}"
    return sorted((p.relative_to(base).as_posix(), st.st_size, st.st_mtime_ns)
                  for p in base.rglob("*") if p.is_file() and (st := p.stat()))


def _pack(doc: Document) -> Document:
    """The document with its ``[H, W, 3]`` uint8 page as PNG bytes (channels as they are)."""
    import cv2

    ok, png = cv2.imencode(".png", doc.image, [cv2.IMWRITE_PNG_COMPRESSION, 1])
    if not ok:
        raise ValueError(f"cannot encode the page of {doc.doc_id} as PNG")
    return replace(doc, image=png.tobytes())


def _unpack(doc: Document) -> Document:
    import cv2

    return replace(doc, image=cv2.imdecode(np.frombuffer(doc.image, np.uint8),
                                           cv2.IMREAD_UNCHANGED))


def _load_datasets(n_synthetic: int, n_receipts: int, data_dir, seed: int,
                   wording: str, n_forms: int = 0) -> tuple[dict[str, list[Document]], str]:
    from fovea_book.eval.sroie import load_sroie

    kw = {} if wording == "default" else {"wording": wording}
    datasets = {"synthetic": synthetic_documents(n_synthetic, seed=SYNTHETIC_SEED + seed, **kw)}
    if n_receipts == 0:
        msg = "SROIE skipped: n_receipts = 0 in this profile."
    else:
        try:
            receipts = load_sroie(dataset_path("sroie-dev", data_dir), limit=n_receipts, **kw)
        except DatasetNotFound as err:
            receipts, msg = [], (f"SROIE skipped (dataset not found): "
                                 f"{str(err).rstrip('.')}. The real-data rows below are "
                                 "absent; the synthetic results stand alone.")
        else:
            msg = f"SROIE: {len(receipts)} receipts loaded."
        if receipts:
            datasets["sroie"] = receipts
    if n_forms == 0:
        return datasets, msg
    return datasets, f"{msg} {_load_forms(datasets, n_forms, data_dir, wording)}"


def _load_forms(datasets: dict, n_forms: int, data_dir, wording: str) -> str:
    """Add the first ``n_forms`` FUNSD dev forms to ``datasets["funsd"]``; the message
    (how many forms and questions, what the loader skipped, or why there are none)."""
    from fovea_book.eval.funsd import load_funsd

    notes: list[str] = []
    try:
        forms = load_funsd("funsd-dev", data_dir=data_dir, limit=n_forms, wording=wording,
                           log=notes.append)
    except DatasetNotFound as err:
        return (f"FUNSD skipped (dataset not found): {str(err).rstrip('.')}. The form rows "
                "below are absent.")
    if forms:
        datasets["funsd"] = forms
    n_q = sum(len(d.questions) for d in forms)
    return " ".join([f"FUNSD: {len(forms)} forms, {n_q} questions loaded.", *notes])


def footprint_coverage(tokens: TokenSet, resolution: int = 128) -> torch.Tensor:
    """Fraction ``[B]`` of the image covered by at least one token footprint.

    Evaluated at the centres of a ``resolution x resolution`` grid of sample points
    (``resolution`` >= 1; 128 resolves a 1024 px page to 8 px, finer than any footprint),
    as one broadcast comparison ``[B, N, P]`` of points against :meth:`TokenSet.boxes`.
    """
    if not (isinstance(resolution, int) and resolution >= 1):
        raise ValueError(f"resolution must be an int >= 1, got {resolution!r}")
    h, w = tokens.image_size
    t = (torch.arange(resolution, dtype=torch.float32) + 0.5) / resolution
    ys, xs = torch.meshgrid(t * h, t * w, indexing="ij")
    px, py = xs.reshape(1, 1, -1), ys.reshape(1, 1, -1)                     # [1, 1, P]
    b = tokens.boxes().float()[..., None]                                    # [B, N, 4, 1]
    inside = (b[:, :, 0] <= px) & (px < b[:, :, 2]) & (b[:, :, 1] <= py) & (py < b[:, :, 3])
    return inside.any(1).float().mean(1)


def ci_table(summary, budgets, metric: str = "kept"):
    """Pivot of :func:`~fovea_book.eval.sweep.summarize`'s table: rows ``(dataset,
    allocator)``, columns the budgets (as text) plus ``"all"`` for the full-resolution
    row, cells ``"est [lo, hi]"`` of ``metric`` (two decimals)."""
    cell = summary.apply(lambda r: f"{r[metric]:.2f} [{r[metric + '_lo']:.2f}, "
                                   f"{r[metric + '_hi']:.2f}]", axis=1)
    n = summary.budget.where(summary.allocator != "full", "all").astype(str)
    view = summary.assign(N=n, cell=cell)
    return view.pivot(index=["dataset", "allocator"], columns="N", values="cell").reindex(
        columns=[str(b) for b in budgets] + ["all"]).fillna("")


def paired_vs(table, methods, baseline: str, budget: int, *, metric: str = "anls",
              seed: int = 0, docs=None, correct: bool = True):
    """Paired differences ``method - baseline`` of ``metric`` at ``budget`` for every dataset,
    as one family: :func:`fovea_book.eval.stats.paired_family` (bootstrap CIs over documents,
    Holm-corrected sign-flip p-values, verdicts only from >= ``MIN_DOCS`` documents).
    Columns ``dataset, method, budget, diff, diff_lo, diff_hi, n_docs, p_holm, text,
    verdict``. Methods absent from the table are skipped."""
    out = paired_family(table, methods, baseline, budget, metric=metric, seed=seed, docs=docs,
                        correct=correct)
    return out[["dataset", "method", "budget", "diff", "diff_lo", "diff_hi", "n_docs", "p_holm",
                "text", "verdict"]]


def predicted_vs_measured(summary, predicted: dict, budget: int):
    """Seed predictions beside measurements: one row per method in ``predicted``
    (``{method: number or None}``; ``None`` = the seeds give no number), the prediction
    labelled as such, and per dataset the measured ANLS % ``[95 % CI]`` at ``budget``
    (the ``full`` row at its own budget); ``"n/a"`` where the method was not run."""
    import pandas as pd

    ref = summary[(summary.budget == budget) | (summary.allocator == "full")]
    rows = []
    for name, pred in predicted.items():
        r = {"method": name, "predicted DocVQA acc. % (seed, not measured)":
             "none given" if pred is None else f"{pred:.1f}"}
        for ds in sorted(summary.dataset.unique()):
            m = ref[(ref.dataset == ds) & (ref.allocator == name)]
            r[f"{ds}: measured ANLS % [95% CI]"] = (
                f"{100 * m.anls.iloc[0]:.1f} [{100 * m.anls_lo.iloc[0]:.1f}, "
                f"{100 * m.anls_hi.iloc[0]:.1f}]" if len(m) else "n/a")
        rows.append(r)
    return pd.DataFrame(rows).set_index("method")


# ----------------------------------------------------------------------------- chapter kit
def chapter_sweep(allocators, datasets, *, budgets=(N_REF,), scorer: str = "saliency",
                  query_aware: bool = False, reader=None, backend: str = "processes",
                  workers: int | None = None, seed: int = 0, progress: bool = False):
    """``(table, summary)`` of :func:`~fovea_book.eval.sweep.run_sweep` with the book's
    shared cell cache and the process backend (both cores), then
    :func:`~fovea_book.eval.sweep.summarize`. A chapter's sweep costs only the cells no
    earlier chapter computed."""
    from fovea_book.eval.reader import Reader
    from fovea_book.eval.sweep import run_sweep, summarize

    table = run_sweep(list(allocators), list(budgets), datasets, scorer=scorer,
                      query_aware=query_aware, reader=reader or Reader(), backend=backend,
                      workers=workers, seed=seed, progress=progress)
    return table, summarize(table, seed=seed)


def family_text(fam, *, unit: str = "ANLS points") -> dict:
    """``{(dataset, method): "better (+3.1 [0.5, 5.6] ANLS points, n = 40)"}`` for every row
    of a :func:`~fovea_book.eval.stats.paired_family` table: the verdict word first (it
    already says "too few documents" when it must), then the paired difference and its
    95 % CI, and the number of documents."""
    return {(r.dataset, r.method): f"{r.verdict} ({r.text} {unit}, n = {int(r.n_docs)})"
            for r in fam.itertuples()}


def select_then_report(table, candidates, baseline: str, budget: int, *,
                       metric: str = "anls", seed: int = 0):
    """Choose the best of ``candidates`` on the *select* half of the documents and test it
    against ``baseline`` on the *report* half (:func:`~fovea_book.eval.stats.split_halves`),
    per dataset.

    Returns a DataFrame per dataset: ``dataset, best, select_mean, n_select`` and the
    report-half paired difference of ``best - baseline`` (``diff, diff_lo, diff_hi, n_docs,
    p, verdict, text``; one comparison per dataset, so the family is the datasets: Holm
    over them). The choice is :func:`choose_on_select_half`'s (its tie rule: the candidate
    listed first).
    """
    import pandas as pd

    from fovea_book.eval.stats import holm_verdicts, split_halves

    chosen = choose_on_select_half(table, candidates, budget, metric=metric)
    rows = []
    for r in chosen.itertuples():
        t = table[table.dataset == r.dataset]
        _, rep = split_halves(t["doc_id"].unique())
        fam = paired_family(t, [r.best], baseline, budget, metric=metric, docs=rep, seed=seed,
                            correct=False)
        f = fam.iloc[0]
        rows.append(dict(dataset=r.dataset, best=r.best, select_mean=r.select_mean,
                         n_select=r.n_select,
                         **{k: f[k] for k in ("diff", "diff_lo", "diff_hi", "n_docs", "p")}))
    # (a dataset whose select half is empty, e.g. 2 documents, has no row; the columns stay)
    out = pd.DataFrame(rows, columns=["dataset", "best", "select_mean", "n_select", "diff",
                                      "diff_lo", "diff_hi", "n_docs", "p"])
    out = holm_verdicts(out)
    out["text"] = [ci_text(r.diff, r.diff_lo, r.diff_hi) for r in out.itertuples()]
    return out


def area_resize_rows(datasets, budget: int = N_REF, *, reader=None, patch: int = 16):
    """The reader on a *direct* resize of each page, as sweep-shaped rows
    (``allocator="cv2_area_resize"``): the page scaled by ``2**-level`` of
    :func:`~fovea_core.allocators.grid.resize_grid` with ``cv2.resize(INTER_AREA)`` (what an
    image processor does), blown back up bicubically (``INTER_CUBIC``: a continuous
    reconstruction, no blocks), read at the answer boxes. Paired with the ``resize`` rows
    of a sweep it checks that the TokenSet baseline (area sampler + smooth painter of
    :mod:`fovea_core.sample`) sees what a plain resize sees."""
    import cv2
    import pandas as pd

    from fovea_core.allocators.grid import resize_grid
    from fovea_book.eval.metrics import anls
    from fovea_book.eval.reader import Reader

    reader = reader or Reader()
    rows = []
    for name, docs in datasets.items():
        for doc in docs:
            h, w = doc.size
            _, _, level = resize_grid((h, w), budget, patch)
            s = 2.0 ** -level
            small = cv2.resize(doc.image, (max(1, round(w * s)), max(1, round(h * s))),
                               interpolation=cv2.INTER_AREA)
            up = cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)
            for q in doc.questions:
                pred = reader.read(up, q.boxes)
                rows.append(dict(dataset=name, doc_id=doc.doc_id, qid=q.qid, field=q.field,
                                 allocator="cv2_area_resize", budget=int(budget), pred=pred,
                                 anls=anls(pred, q.answers)))
    return pd.DataFrame(rows)


def family_line(fam, dataset: str, *, unit: str = "ANLS points",
                missing: str = "not measured (no SROIE data)") -> str:
    """One dataset's rows of a :func:`~fovea_book.eval.stats.paired_family` table as one
    markdown sentence: ``"`a` better (+3.1 [0.5, 5.6] ANLS points, n = 40); `b` ..."``
    (:func:`family_text` per row, in the table's order); ``missing`` when the dataset has
    no row."""
    words = family_text(fam, unit=unit)
    rows = [r for r in fam.itertuples() if r.dataset == dataset]
    if not rows:
        return missing
    return "; ".join(f"`{r.method}` {words[(r.dataset, r.method)]}" for r in rows)


def choose_on_select_half(table, candidates, budget: int, *, metric: str = "anls"):
    """Per dataset, the candidate with the highest mean ``metric`` at ``budget`` on the
    *select* half (:func:`~fovea_book.eval.stats.split_halves`) of the documents it ran on.

    This is the library's one choose-on-the-select-half rule: :func:`select_then_report`
    chooses with it, and chapters that choose a variant call it rather than write their
    own. The choice is then tested on the *report* half only (:func:`report_half` of all
    documents, ``paired_family(..., docs=report_ids)``), so the test never sees a document
    the choice was made on.

    Parameters
    ----------
    table : DataFrame
        Sweep rows with at least ``dataset, doc_id, allocator, budget`` and ``metric``
        (one row per question). The halves are split over *all* of a dataset's document
        ids in ``table``; only rows of ``candidates`` at ``budget`` on the select half count.
    candidates : sequence of str
        Allocator labels, in order of preference: duplicates are dropped, labels that did
        not run are ignored (a NaN column).
    budget : int
        The ``budget`` whose rows are compared.
    metric : str
        The column averaged (default ``"anls"``).

    Notes
    -----
    Questions are averaged within a document first (the resampling unit), then over the
    select-half documents a candidate ran on; NaN values of ``metric`` are skipped, and a
    candidate with no finite mean is never chosen. The highest mean wins; **a tie (exactly
    equal means) goes to the candidate listed first in ``candidates``** (never to the
    alphabetical first). A dataset with no select-half row of any candidate (e.g. a
    2-document profile whose select half is empty) has no row: callers that need a choice
    for every dataset fall back explicitly.

    Returns
    -------
    DataFrame
        ``dataset, best, select_mean, n_select`` (documents of the select half the
        candidates ran on) plus one column per candidate (its select-half mean; NaN where
        it did not run), one row per dataset in sorted order.
    """
    import pandas as pd

    from fovea_book.eval.stats import split_halves

    if isinstance(candidates, str):
        raise TypeError(f"candidates must be a sequence of allocator labels, got the string "
                        f"{candidates!r} (write [{candidates!r}])")
    cands = list(dict.fromkeys(str(c) for c in candidates))
    if not cands:
        raise ValueError("candidates is empty: name at least one allocator to choose from")
    missing = {"dataset", "doc_id", "allocator", "budget", metric} - set(table.columns)
    if missing:
        raise ValueError(f"table lacks the column(s) {sorted(missing)} that "
                         f"choose_on_select_half reads (metric={metric!r})")
    rows = []
    for ds, t in table.groupby("dataset", sort=True):
        sel, _ = split_halves(t["doc_id"].unique())
        at = t[(t.budget == budget) & t.allocator.isin(cands) & t.doc_id.isin(sel)]
        per = (at.groupby(["allocator", "doc_id"])[metric].mean()
               .groupby("allocator").mean().reindex(cands))     # in the candidates' order
        ok = np.isfinite(per.to_numpy(dtype=float))
        if not ok.any():
            continue
        # first maximum in the candidates' order: a tie goes to the one listed first
        best = per[ok].index[int(np.argmax(per[ok].to_numpy(dtype=float)))]
        rows.append(dict(dataset=ds, best=str(best), select_mean=float(per[best]),
                         n_select=int(at.doc_id.nunique()),
                         **per.to_dict()))
    return pd.DataFrame(rows, columns=["dataset", "best", "select_mean", "n_select", *cands])


def chosen_line(chosen, dataset: str, report=None, *, measured: bool = True, note: str = "",
                baseline: str = "resize", unit: str = "ANLS points", what: str = "ablation",
                result: str | None = None,
                missing: str = "not measured (no SROIE data)") -> str:
    """One markdown sentence on the variant :func:`choose_on_select_half` chose for
    ``dataset`` and its test on the report half, as the experiment chapters glue it:
    ``"`best` (note; chosen on 12 documents); on the 20 report-half documents, minus
    `resize`: **verdict** (+1.2 [-0.3, 2.7] ANLS points)"``.

    Args:
        chosen: the DataFrame of :func:`choose_on_select_half` (``dataset, best,
            n_select``; may be empty).
        dataset: the dataset the sentence is about.
        report: the report-half test, a :func:`~fovea_book.eval.stats.paired_family`
            table (``dataset, n_docs, verdict, text``) with at most one row per dataset
            (the chosen variant against ``baseline``); ``None`` or no row for ``dataset``:
            "not tested (no report-half document)".
        measured: ``False`` when the dataset was not run at all (its data is missing):
            the sentence is ``missing``.
        note: words put before "chosen on" inside the parentheses (e.g. the default
            value of the chosen parameter: ``"`atlas` = 24"``).
        baseline, unit: named in the sentence.
        what: what the select half lacked when nothing was chosen: "not chosen (no
            ``what`` document in the select half)".
        result: the caller's own words on the report-half test, written after ``": "``
            instead of ``report``'s verdict (e.g. an equivalence claim).
        missing: the sentence for a dataset that was not measured.
    """
    if not measured:
        return missing
    row = chosen[chosen["dataset"] == dataset] if len(chosen) else chosen
    if len(row) == 0:
        return f"not chosen (no {what} document in the select half)"
    if len(row) > 1:
        raise ValueError(f"chosen has {len(row)} rows for dataset {dataset!r}; expected at "
                         "most one (the output of choose_on_select_half)")
    c = row.iloc[0]
    inner = f"{note}; " if note else ""
    head = f"`{c['best']}` ({inner}chosen on {int(c['n_select'])} documents)"
    if result is not None:
        return f"{head}: {result}"
    rep = (report[report["dataset"] == dataset]
           if report is not None and len(report) else report)
    if rep is None or len(rep) == 0:
        return head + "; not tested (no report-half document)"
    if len(rep) > 1:
        raise ValueError(f"report has {len(rep)} rows for dataset {dataset!r}; expected at "
                         "most one (the chosen variant against the baseline)")
    r = rep.iloc[0]
    return (f"{head}; on the {int(r['n_docs'])} report-half documents, minus `{baseline}`: "
            f"**{r['verdict']}** ({r['text']} {unit})")


def relabel(table, labels: Mapping[str, str], *, column: str = "allocator"):
    """``table`` with its ``column`` renamed by ``labels`` (a copy; labels that match no
    key are kept), e.g. a sweep's spec labels (``"pyramid_level_budget64"``) to the names a
    chapter's text uses.

    A key matches a label exactly; failing that, a key with a glob wildcard (``*``, ``?``,
    ``[...]``; :func:`fnmatch.fnmatchcase`) matches a label it fits, the first such key in
    ``labels``' order winning. So ``{"pseudo_logpolar_centres*": "pseudo_logpolar",
    "pseudo_logpolar": "pseudo_logpolar_init"}`` names a sweep label that carries trained
    parameters without spelling them out.
    """
    from fnmatch import fnmatchcase

    if column not in table.columns:
        raise ValueError(f"relabel: table has no column {column!r} (columns: "
                         f"{list(table.columns)})")
    patterns = [(k, v) for k, v in labels.items() if any(ch in k for ch in "*?[")]

    def new(label: str) -> str:
        if label in labels:
            return labels[label]
        return next((v for k, v in patterns if fnmatchcase(str(label), k)), label)

    names = {a: new(a) for a in table[column].unique()}      # once per distinct label
    return table.assign(**{column: table[column].map(names)})


def report_half(datasets: dict) -> dict:
    """``{dataset: documents in the report half}`` (:func:`~fovea_book.eval.stats.split_halves`
    by document id), in their original order."""
    from fovea_book.eval.stats import split_halves

    out = {}
    for name, docs in datasets.items():
        _, rep = split_halves([d.doc_id for d in docs])
        keep = set(rep)
        out[name] = [d for d in docs if d.doc_id in keep]
    return out


def _one_sided_sign_flip(d, *, n_perm: int = 10_000, seed: int = 0) -> float:
    """One-sided paired randomisation p-value of ``H0: mean(d) <= 0`` against ``mean > 0``:
    ``(1 + #{mean(s * d) >= mean(d)}) / (1 + n_perm)`` over random signs ``s``."""
    import numpy as np

    d = np.asarray(d, dtype=float)
    d = d[np.isfinite(d)]
    if len(d) == 0:
        return float("nan")
    rng = np.random.default_rng(seed)
    signs = rng.integers(0, 2, size=(n_perm, len(d))) * 2 - 1
    null = (signs * d).mean(axis=1)                                       # [n_perm]
    return float((1 + np.sum(null >= d.mean() - 1e-12)) / (1 + n_perm))


def equivalence_family(table, pairs, margin: float, *, metric: str = "anls", seed: int = 0,
                       correct: bool = True, equivalent: str = "equivalent",
                       above: str = "above", below: str = "below",
                       inconclusive: str = "inconclusive"):
    """Does method ``a`` at budget ``n_a`` read as much as ``b`` at ``n_b``, within
    ``+-margin``? One family of equivalence tests.

    ``pairs``: ``[(a, n_a, b, n_b), ...]``. Per pair and dataset, the per-document paired
    difference ``d = metric(a @ n_a) - metric(b @ n_b)`` (questions averaged within a
    document; documents where both ran), its mean with a 95 % percentile-bootstrap CI
    (:data:`~fovea_book.eval.stats.N_BOOT` resamples), and two tests:

    * **equivalence**, two one-sided tests [Schuirmann 1987]: ``H0: mean(d) <= -margin``
      and ``H0: mean(d) >= margin``, each a one-sided sign-flip randomisation test of
      ``d + margin`` / ``margin - d``; ``p_tost`` is the larger p;
    * **difference**, the two-sided sign-flip p of ``mean(d) = 0`` (as in
      :func:`~fovea_book.eval.stats.paired_family`).

    Both p-values are Holm-corrected over the family (all pairs x datasets; ``correct=False``
    labels it exploratory). The ``verdict``: :func:`~fovea_book.eval.stats.too_few` below
    ``MIN_DOCS`` documents; ``equivalent`` when the Holm-adjusted ``p_tost < 0.05``;
    otherwise :func:`~fovea_book.eval.stats.verdict` of the difference (``above`` /
    ``below`` / ``inconclusive``), so "below" means a detectable shortfall and
    "inconclusive" neither equivalence nor a difference at this sample size.

    Returns columns ``dataset, a, n_a, b, n_b, diff, diff_lo, diff_hi, n_docs, p_tost,
    p_tost_holm, p_diff_holm, verdict, text``.
    """
    import pandas as pd

    from fovea_book.eval.metrics import bootstrap_ci
    from fovea_book.eval.stats import ALPHA, N_BOOT, holm, sign_flip_pvalue, too_few

    if not margin > 0:
        raise ValueError(f"margin must be > 0, got {margin!r}")
    per = table.groupby(["dataset", "allocator", "budget", "doc_id"])[metric].mean()
    rows = []
    for a, n_a, b, n_b in pairs:
        for ds in sorted(table["dataset"].unique()):
            try:
                pa, pb = per.loc[(ds, a, int(n_a))], per.loc[(ds, b, int(n_b))]
            except KeyError:
                continue
            d = (pa - pb).dropna().to_numpy()
            if len(d) == 0:
                continue
            est, lo, hi = bootstrap_ci(d, n_boot=N_BOOT, seed=seed)
            p_tost = max(_one_sided_sign_flip(d + margin, seed=seed),
                         _one_sided_sign_flip(margin - d, seed=seed))
            rows.append(dict(dataset=ds, a=a, n_a=int(n_a), b=b, n_b=int(n_b), diff=est,
                             diff_lo=lo, diff_hi=hi, n_docs=len(d), p_tost=p_tost,
                             p_diff=sign_flip_pvalue(d, seed=seed)))
    if not rows:
        raise ValueError(f"none of the pairs {list(pairs)} is in the table")
    out = pd.DataFrame(rows)
    out["p_tost_holm"] = holm(out.p_tost.to_numpy()) if correct else out.p_tost
    out["p_diff_holm"] = holm(out.p_diff.to_numpy()) if correct else out.p_diff
    words = []
    for r in out.itertuples():
        few = too_few(r.n_docs)
        words.append(few or (equivalent if r.p_tost_holm < ALPHA else
                             verdict(r.diff_lo, r.diff_hi, r.n_docs, p=r.p_diff_holm,
                                     better=above, worse=below, same=inconclusive)))
    out["verdict"] = words
    out["text"] = [ci_text(r.diff, r.diff_lo, r.diff_hi) for r in out.itertuples()]
    return out.drop(columns="p_diff")


# ----------------------------------------------------------------------------- sentences
# The chapters' glued sentences, each from one table (the notebooks call these instead of
# defining their own copies).

MISSING_SROIE = "not measured (no SROIE data)"


def baselines_family(table, method: str, baselines, budget: int, *, seed: int = 0):
    """``method`` minus each of ``baselines`` at ``budget``, one Holm family (the seeds'
    question of chapters 09 and 10: a variant against the variants it should beat).

    Each comparison is a :func:`~fovea_book.eval.stats.paired_family` row (uncorrected);
    ``p_holm`` is then Holm-corrected over all of them (baselines x datasets) and the
    ``verdict`` recomputed with it (:func:`~fovea_book.eval.stats.verdict`).
    """
    from fovea_book.eval.stats import pairs_family

    baselines = list(baselines)
    if not baselines:
        raise ValueError("baselines must name at least one method")
    return pairs_family(table, [(method, b) for b in baselines], budget, seed=seed)


def baselines_line(fam, dataset: str, *, unit: str = "ANLS points",
                   missing: str = MISSING_SROIE) -> str:
    """One dataset's rows of :func:`baselines_family` as one markdown sentence:
    ``"minus `topk`: **better** (+3.1 [0.5, 5.6] ANLS points, n = 40); minus ..."``;
    ``missing`` when the dataset has no row."""
    rows = fam[fam["dataset"] == dataset]
    if rows.empty:
        return missing
    return "; ".join(f"minus `{r.baseline}`: **{r.verdict}** ({r.text} {unit}, "
                     f"n = {r.n_docs})" for r in rows.itertuples())


def cost_line(summary, method: str, dataset: str, budget: int, *,
              missing: str = MISSING_SROIE) -> str:
    """``"412 tokens in all (median; unbudgeted: ...)"``: ``method``'s total tokens at
    ``budget`` on ``dataset`` (a :func:`~fovea_book.eval.sweep.summarize` row: the tokens
    it allocates plus the equivalent tokens of what it reads outside the budget) and
    whether that makes it unbudgeted; ``missing`` when the summary has no such row."""
    at = summary[(summary["allocator"] == method) & (summary["budget"] == budget)]
    at = at.set_index("dataset")
    if dataset not in at.index:
        return missing
    r = at.loc[dataset]
    label = ("unbudgeted: what it reads outside the budget exceeds N" if r.unbudgeted
             else "budgeted: what it reads outside the budget is less than N")
    return f"{int(r.total_tokens)} tokens in all (median; {label})"


def equivalence_line(eq, dataset: str, *, label: str | None = None,
                     unit: str = "ANLS points", missing: str = MISSING_SROIE) -> str:
    """One dataset's rows of :func:`equivalence_family` as one markdown sentence:
    ``"`logpolar` @ 150 minus `resize` @ 273: **equivalent ...** (+0.4 [-1.2, 2.0] ANLS
    points, n = 40); ..."`` (``label`` replaces the method's name, e.g. when every row has
    the same ``a``); ``missing`` when the dataset has no row."""
    rows = eq[eq["dataset"] == dataset]
    if rows.empty:
        return missing
    return "; ".join(f"{label or f'`{r.a}`'} @ {r.n_a} minus `{r.b}` @ {r.n_b}: "
                     f"**{r.verdict}** ({r.text} {unit}, n = {r.n_docs})"
                     for r in rows.itertuples())


def selected_line(sel, dataset: str, *, baseline: str = "resize", unit: str = "ANLS points",
                  missing: str = "not measured (no data, or too few documents to split "
                                 "in halves)") -> str:
    """One dataset's row of :func:`select_then_report` as a markdown sentence: ``"`topk`
    (chosen on 20 documents), which on the other 20 is **better** compared with `resize`
    (+3.1 [0.5, 5.6] ANLS points)"``; ``missing`` when the dataset has no row."""
    sv = sel.set_index("dataset")
    if dataset not in sv.index:
        return missing
    r = sv.loc[dataset]
    return (f"`{r.best}` (chosen on {r.n_select} documents), which on the other "
            f"{r.n_docs} is **{r.verdict}** compared with `{baseline}` ({r.text} {unit})")


def kept_ci_text(kept, dataset: str, method: str) -> str:
    """``"81 % [74, 87]"``: the kept fraction of ``method`` on ``dataset`` with its 95 % CI,
    from a summary indexed by ``(dataset, allocator)`` with ``kept, kept_lo, kept_hi``
    (:func:`~fovea_book.eval.sweep.summarize` at one budget)."""
    if (dataset, method) not in kept.index:
        raise KeyError(f"kept has no row ({dataset!r}, {method!r})")
    r = kept.loc[(dataset, method)]
    return f"{100 * r.kept:.0f} % [{100 * r.kept_lo:.0f}, {100 * r.kept_hi:.0f}]"


def verdict_counts_line(counts, dataset: str, *,
                        missing: str = "not measured (no data)") -> str:
    """``"3 better, 5 no detectable difference"``: how many methods got each verdict on
    ``dataset`` (``counts``: datasets x verdict words, e.g.
    ``fam.groupby("dataset").verdict.value_counts().unstack(fill_value=0)``), zero counts
    left out; ``missing`` when the dataset has no row."""
    if dataset not in counts.index:
        return missing
    return ", ".join(f"{int(v)} {k}" for k, v in counts.loc[dataset].items() if v)


def best_line(best, group: str, dataset: str, *, baseline: str = "resize",
              missing: str = "not measured") -> str:
    """One markdown sentence on the method chosen for ``group`` on ``dataset``: ``"`topk`
    (290 tokens in all; 81 % kept), **better** compared with `resize` on the report half
    (+3.1 [0.5, 5.6] points, n = 20)"``. ``best``: :func:`select_then_report` rows with a
    ``group`` label and the chosen method's ``total_tokens`` and ``kept``; ``missing`` when
    it has no row for (group, dataset)."""
    r = best[(best["group"] == group) & (best["dataset"] == dataset)]
    if r.empty:
        return missing
    r = r.iloc[0]
    return (f"`{r.best}` ({r.total_tokens:.0f} tokens in all; {100 * r.kept:.0f} % kept), "
            f"**{r.verdict}** compared with `{baseline}` on the report half ({r.text} points, "
            f"n = {r.n_docs})")


def conditions_line(fam, dataset: str, conditions, *, column: str, lead: str,
                    unit: str = "points", missing: str = MISSING_SROIE) -> str:
    """One dataset's paired comparison under each of ``conditions`` (the values of
    ``column`` in ``fam``, a :func:`~fovea_book.eval.stats.paired_family` table with that
    extra column) as one markdown sentence: ``"with the default wording the prior **helps**
    (+3.1 [0.5, 5.6] points, n = 40); with the heldout wording ..."`` (``lead`` formatted
    with the condition); ``missing`` when the dataset has no row."""
    t = fam.set_index(["dataset", column])
    if dataset not in t.index.get_level_values(0):
        return missing
    return "; ".join(f"{lead.format(c)} **{t.loc[(dataset, c), 'verdict']}** "
                     f"({t.loc[(dataset, c), 'text']} {unit}, "
                     f"n = {t.loc[(dataset, c), 'n_docs']})" for c in conditions)
