"""Fit the read-then-look cascade's defaults on training pages: where an answer lies
relative to the key that was read, and fixation 1's share of N.

:mod:`fovea_core.cascade.reading` reads its :data:`~fovea_core.cascade.reading.DEFAULT_GEOMETRY`
and :data:`~fovea_core.cascade.reading.FIRST_SHARE` from the record this module writes
(``fovea_core/weights/cascade_read.json``). Two steps, both on training pages only
(``../shared/PROTOCOL.md``; no dev page and no WildReceipt page is read):

1. **The answer geometry**, from key-answer pairs read off the training pages' own
   transcriptions with the cascade's own matcher
   (:func:`~fovea_core.cascade.reading.match_lines`, the page's transcription standing for
   what fixation 1 read):

   * FUNSD forms (:func:`form_pairs`): each question-to-answer link; the key is the match of
     the question on the linked question entity (the words the matcher anchors on), the
     answer is the linked answer's box;
   * SROIE receipts (:func:`receipt_pairs`): each field whose question names a key (the
     date, the total); the key is the key match nearest to the field's printed value (the
     line the dataset matched to the field), the answer is that value (its characters, when
     the key shares its line).

   :func:`fit_geometry` turns the pairs into a histogram of
   where the answers lie (in the key's line heights, from its right end for answers on its
   line, from its left end for the others); its densest bins are the geometry's rects.
2. **The first share**: the read-then-look cascade with the fitted geometry at each of
   :data:`SHARES` (and, as the baseline, with the hand-set priors) reads the training pages
   the localiser never trained on (:func:`~fovea_book.eval.fitting.unseen_training_pages`:
   receipts, forms and synthetic validation pages), with the book's reader (rapidocr). The
   share with the highest mean over the three sets of their mean ANLS is chosen; ties go to
   the smaller share. The geometry's pairs come from the other training pages, so the share
   is chosen on pages the geometry never saw.

``python -m fovea_book.eval.reading_fit [--out PATH] [--data-dir DIR]`` runs both and writes
the record: the geometry and its summary, the pairs' provenance, the share curve (with the
one-fixation cascade's and the priors' ANLS on the same pages), the pages, the commit and
versions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from fovea_book.eval.document_types import Document

if TYPE_CHECKING:
    from fovea_core.cascade.reading import AnswerGeometry
    from fovea_core.importance.text import TextRead

__all__ = ["PAIR_CLASSES", "X_EDGES", "Y_EDGES", "pair_offsets", "fit_geometry",
           "SHARES", "RECEIPTS", "FORMS", "SYNTHETIC", "transcription", "receipt_pairs",
           "form_pairs", "training_pairs", "share_curve", "choose_share", "default_record_path",
           "read_fit_record", "fit_table", "fit_line", "geometry_to_dict", "main"]

# ----------------------------------------------------------------------------- the geometry
#: the two frames a key-answer pair is measured in, by the vertical centre ``c`` of the
#: answer's box in the key's line heights from the top of the key's line: ``"row"``
#: (``0 <= c <= 1``: on the key's line, measured from the key's right end) and ``"off"``
#: (above or below it, measured from the key's left end), with each frame's anchor
PAIR_CLASSES = {"row": "right", "off": "left"}
#: the geometry histogram's bins, in the key's line heights: ``x`` from the frame's anchor,
#: ``y`` from the top of the key's line (per frame)
X_EDGES = tuple(float(v) for v in np.arange(-8.0, 40.0 + 1e-9, 2.0))
Y_EDGES = {"row": tuple(float(v) for v in np.arange(-0.5, 1.5 + 1e-9, 0.5)),
           "off": tuple(float(v) for v in np.arange(-4.0, 10.0 + 1e-9, 1.0))}


def pair_offsets(anchors: np.ndarray, answers: np.ndarray) -> np.ndarray:
    """``[P, 6]`` float64: where each answer lies relative to its key, in the key's line
    heights.

    Args:
        anchors: ``[P, 4]`` the matched key's span ``(x0, y0, x1, y1)`` (:attr:`~fovea_core.cascade.reading.Match.span`:
            its height is the line's, the unit).
        answers: ``[P, 4]`` the answer's box ``(x0, y0, x1, y1)``, same pixels.

    Returns:
        Columns ``(xr0, xr1, xl0, xl1, y0, y1)``: the answer's left and right edges from the
        key's right end, then from its left end, and its top and bottom from the top of the
        key's line, each divided by the key's line height.

    Raises:
        ValueError: shapes that are not ``[P, 4]`` alike, or a key of zero height.
    """
    a = np.asarray(anchors, np.float64)
    b = np.asarray(answers, np.float64)
    if a.ndim != 2 or a.shape[1:] != (4,) or a.shape != b.shape:
        raise ValueError(f"anchors and answers must both be [P, 4], got {a.shape} and {b.shape}")
    h = a[:, 3] - a[:, 1]
    if (h <= 0).any():
        raise ValueError(f"{int((h <= 0).sum())} key span(s) with zero or negative height")
    x = b[:, [0, 2]]
    return np.column_stack([(x - a[:, 2:3]) / h[:, None], (x - a[:, 0:1]) / h[:, None],
                            (b[:, [1, 3]] - a[:, 1:2]) / h[:, None]])


def _bin_overlap(lo: np.ndarray, hi: np.ndarray, edges: Sequence[float]) -> np.ndarray:
    """``[P, B]``: length of each interval ``[lo, hi]`` ``[P]`` inside each bin of ``edges``."""
    e = np.asarray(edges, np.float64)
    return np.clip(np.minimum(hi[:, None], e[None, 1:]) - np.maximum(lo[:, None], e[None, :-1]),
                   0.0, None)


def fit_geometry(offsets: np.ndarray, *, mass: float = 0.9, presence_floor: float = 0.5,
                 pattern_pad: float = 0.5) -> tuple["AnswerGeometry", dict]:
    """The :class:`~fovea_core.cascade.reading.AnswerGeometry` of key-answer pairs
    (:func:`pair_offsets`): a histogram of where the answers lie.

    Each pair is measured in its frame of :data:`PAIR_CLASSES` (its answer's vertical
    centre on the key's line: from the key's right end; else from its left end) and spreads
    a unit mass evenly over its answer's box; the mass falling in each bin of
    :data:`X_EDGES` x :data:`Y_EDGES` over all pairs, divided by the bin's area, is the
    bin's density (answers per squared line height). The densest bins holding ``mass`` of
    the mass inside the bins become the rects, each weighted by its density over the
    largest (so a cell's mass in :func:`~fovea_core.cascade.reading.read_map` is proportional to how often answers lie
    there). ``presence_floor`` and ``pattern_pad`` are passed through (not fitted here).

    Returns:
        ``(geometry, summary)``; ``summary`` gives ``pairs``, per frame its ``pairs`` and
        ``share``, ``outside`` (the share of the mass beyond the bins) and ``kept`` (of the
        mass inside them, the share the rects hold) and ``rects`` (how many).

    Raises:
        ValueError: ``offsets`` not ``[P, 6]`` with ``P >= 1`` finite rows, an answer of no
            width or height, or ``mass`` outside ``(0, 1]``.
    """
    from fovea_core.cascade.reading import AnswerGeometry, Rect

    o = np.asarray(offsets, np.float64)
    if o.ndim != 2 or o.shape[1] != 6 or o.shape[0] < 1 or not np.isfinite(o).all():
        raise ValueError(f"offsets must be [P, 6] finite with P >= 1, got {o.shape}")
    if ((o[:, 1] <= o[:, 0]) | (o[:, 5] <= o[:, 4])).any():
        raise ValueError("every answer box needs a positive width and height")
    if not 0.0 < mass <= 1.0:
        raise ValueError(f"mass must be in (0, 1], got {mass!r}")
    centre = o[:, 4:6].mean(1)
    in_row = (centre >= 0) & (centre <= 1)
    cols: dict[str, list] = {k: [] for k in ("anchor", "x0", "x1", "y0", "y1", "mass", "density")}
    summary: dict = {"pairs": int(len(o)), "classes": {}}
    for name, anchor in PAIR_CLASSES.items():
        sel = o[in_row if name == "row" else ~in_row]
        summary["classes"][name] = {"pairs": int(len(sel)), "share": len(sel) / len(o)}
        if not len(sel):
            continue
        x = sel[:, 0:2] if anchor == "right" else sel[:, 2:4]
        ox = _bin_overlap(x[:, 0], x[:, 1], X_EDGES) / (x[:, 1] - x[:, 0])[:, None]
        oy = _bin_overlap(sel[:, 4], sel[:, 5], Y_EDGES[name]) / (sel[:, 5] - sel[:, 4])[:, None]
        m = np.einsum("px,py->yx", ox, oy) / len(o)                          # [By, Bx]
        ye, xe = np.asarray(Y_EDGES[name]), np.asarray(X_EDGES)
        i, j = np.nonzero(m > 0)                                             # bins with mass
        for k, v in (("anchor", np.full(len(i), anchor)), ("x0", xe[j]), ("x1", xe[j + 1]),
                     ("y0", ye[i]), ("y1", ye[i + 1]), ("mass", m[i, j]),
                     ("density", m[i, j] / (np.diff(ye)[i] * np.diff(xe)[j]))):
            cols[k].append(v)
    b = {k: np.concatenate(v) for k, v in cols.items()}
    order = np.argsort(-b["density"], kind="stable")                         # densest first
    inside = float(b["mass"].sum())
    cum = np.cumsum(b["mass"][order])
    keep = order[:int(np.searchsorted(cum, mass * inside - 1e-12)) + 1]
    weight = b["density"][keep] / b["density"][keep[0]]
    geometry = AnswerGeometry(tuple(
        Rect(str(b["anchor"][k]), float(b["x0"][k]), float(b["x1"][k]), float(b["y0"][k]),
             float(b["y1"][k]), float(w)) for k, w in zip(keep, weight)),
        presence_floor=presence_floor, pattern_pad=pattern_pad)
    summary.update(outside=1.0 - inside, kept=float(b["mass"][keep].sum() / inside),
                   rects=len(keep), mass=mass,
                   x_edges=list(X_EDGES), y_edges={k: list(v) for k, v in Y_EDGES.items()})
    return geometry, summary


#: fixation 1's shares of N the fit compares
SHARES = (0.35, 0.5, 0.65)
#: training pages the share is chosen on (the localiser's unseen receipts, first by crc32 of
#: their id; forms; synthetic validation pages)
RECEIPTS, FORMS, SYNTHETIC = 40, 12, 12


def transcription(boxes: Sequence[Sequence[float]], texts: Sequence[str]) -> TextRead:
    """A :class:`~fovea_core.importance.text.TextRead` of a page's ground-truth lines (boxes
    ``(x0, y0, x1, y1)`` px, confidence 1): what a perfect reading of fixation 1 returns."""
    from fovea_core.importance.text import TextRead

    b = np.asarray(boxes, np.float32).reshape(-1, 4)
    return TextRead(b, tuple(str(t) for t in texts), np.ones(len(b), np.float32))


def _value_span(box: Sequence[float], text: str, values: Sequence[str]
                ) -> tuple[float, float, float, float] | None:
    """The box of the first of ``values`` found in the line ``text`` read in ``box`` (case
    ignored; characters taken as equally wide), else ``None``."""
    from fovea_core.cascade.reading import char_span

    low = text.lower()
    for v in values:
        i = low.find(v.lower().strip()) if v.strip() else -1
        if i >= 0:
            return char_span(box, text, i, i + len(v.strip()))
    return None


def receipt_pairs(doc: Document, lines: Sequence[tuple[Sequence[float], str]]
                  ) -> tuple[list[tuple], dict[str, int]]:
    """Key-answer pairs of one SROIE receipt: ``([(key span, answer box), ...], counts)``.

    ``lines``: the receipt's box lines (:func:`~fovea_book.eval.sroie.parse_box_file`). For
    each question that names a key (:func:`~fovea_core.cascade.reading.question_cues`), the
    key matches (kind ``"key"``) of the question on the transcription; the one nearest to
    the answer's first line (vertical distance of centres, then horizontal) is the pair's
    key. The answer is its line's box, or, when the key is on that line, the characters of
    the value in it. ``counts``: ``pairs``, ``no_key_cue``, ``no_key_read``,
    ``value_not_in_line``."""
    from fovea_core.cascade.reading import match_lines, question_cues

    read = transcription([b for b, _ in lines], [t for _, t in lines])
    boxes = np.asarray(read.boxes, np.float64)
    pairs: list[tuple] = []
    counts = dict(pairs=0, no_key_cue=0, no_key_read=0, value_not_in_line=0)
    for q in doc.questions:
        if not question_cues(q.question).keys:
            counts["no_key_cue"] += 1
            continue
        keys = [m for m in match_lines(q.question, read, doc.size) if m.kind == "key"]
        if not keys:
            counts["no_key_read"] += 1
            continue
        ans = np.asarray(q.boxes[0], np.float64)
        cy, cx = (ans[1] + ans[3]) / 2, (ans[0] + ans[2]) / 2
        key = min(keys, key=lambda m: (abs((m.span[1] + m.span[3]) / 2 - cy),
                                       abs((m.span[0] + m.span[2]) / 2 - cx)))
        answer = tuple(ans)
        if np.allclose(boxes[key.line], ans):            # the key shares the value's line
            answer = _value_span(ans, key.text, q.answers)
            if answer is None:
                counts["value_not_in_line"] += 1
                continue
        pairs.append((tuple(key.span), tuple(map(float, answer))))
        counts["pairs"] += 1
    return pairs, counts


def form_pairs(doc: Document, entities: Sequence[Mapping]) -> tuple[list[tuple], dict[str, int]]:
    """Key-answer pairs of one FUNSD form: ``([(key span, answer box), ...], counts)``.

    ``entities``: the form's annotation (its ``form`` list). Every entity with text and a
    box is a line of the transcription. For each question (one per question-to-answer link,
    ``qid`` ``"q{question id}-a{answer id}"``), the best match of the question on the linked
    question entity's line (kind ``"key"`` or ``"word"``) is the key, the answer's box (all
    its lines) the answer. ``counts``: ``pairs``, ``no_cue_read`` (the matcher finds no key
    or word of the question on its own label, e.g. "TO:")."""
    from fovea_book.eval.funsd import entity_box
    from fovea_core.cascade.reading import match_lines

    rows = [(e["id"], entity_box(e.get("box"), doc.size),
             " ".join(str(e.get("text", "")).split())) for e in entities]
    rows = [r for r in rows if r[1] is not None and r[2]]
    index = {str(r[0]): i for i, r in enumerate(rows)}
    read = transcription([r[1] for r in rows], [r[2] for r in rows])
    pairs: list[tuple] = []
    counts = dict(pairs=0, no_cue_read=0)
    for q in doc.questions:
        line = index.get(q.qid[1:].split("-a")[0])
        hits = [m for m in match_lines(q.question, read, doc.size)
                if m.kind in ("key", "word") and m.line == line]
        if not hits:
            counts["no_cue_read"] += 1
            continue
        pairs.append((tuple(hits[0].span), tuple(map(float, q.union_box))))
        counts["pairs"] += 1
    return pairs, counts


def training_pairs(exclude: set[str], *, data_dir=None) -> tuple[np.ndarray, dict]:
    """``(offsets [P, 6], provenance)``: the key-answer pairs of every ``sroie-train`` and
    ``funsd-train`` page (default wording) whose id is not in ``exclude``
    (:func:`pair_offsets`). ``provenance``: per set its pages
    and the counts of :func:`receipt_pairs` / :func:`form_pairs`. A missing folder raises
    :class:`~fovea_book.paths.DatasetNotFound`."""
    from fovea_book.eval.funsd import load_funsd, read_form
    from fovea_book.eval.sroie import load_sroie, parse_box_file
    from fovea_book.paths import dataset_path

    quiet = dict(log=lambda _: None)
    out: list[tuple] = []
    prov: dict = {}
    root = dataset_path("sroie-train", data_dir)
    docs = [d for d in load_sroie(root, **quiet) if d.doc_id not in exclude]
    total: dict[str, int] = {}
    for d in docs:
        p, c = receipt_pairs(d, parse_box_file(root / "box" / f"{d.doc_id[5:]}.csv"))
        out += p
        total = {k: total.get(k, 0) + v for k, v in c.items()}
    prov["sroie-train"] = dict(pages=len(docs), **total)
    root = dataset_path("funsd-train", data_dir)
    docs = [d for d in load_funsd(root, **quiet) if d.doc_id not in exclude]
    total = {}
    for d in docs:
        p, c = form_pairs(d, read_form(root / "annotations" / f"{d.doc_id[5:]}.json"))
        out += p
        total = {k: total.get(k, 0) + v for k, v in c.items()}
    prov["funsd-train"] = dict(pages=len(docs), **total)
    if not out:
        raise ValueError("no key-answer pair on the training pages")
    a = np.array([p[0] for p in out])
    b = np.array([p[1] for p in out])
    return pair_offsets(a, b), prov


def share_curve(table: pd.DataFrame, labels: Mapping[str, float]) -> pd.DataFrame:
    """Per method of ``labels`` (``{label: share}``) the mean ANLS of each set (documents
    averaged first) and ``score``, the mean over the sets; one row per label, in order."""
    per_doc = table.groupby(["dataset", "allocator", "doc_id"]).anls.mean()
    per_set = per_doc.groupby(["allocator", "dataset"]).mean().unstack()
    missing = set(labels) - set(per_set.index)
    if missing:
        raise ValueError(f"table has no rows of {sorted(missing)}")
    out = per_set.loc[list(labels)]
    out.insert(0, "share", [labels[k] for k in out.index])
    out["score"] = out.drop(columns="share").mean(axis=1)
    return out.rename_axis("label").reset_index()


def choose_share(curve: pd.DataFrame, *, tol: float = 1e-9) -> float:
    """The share of ``curve`` (:func:`share_curve`) with the highest score; ties (within
    ``tol``) go to the smaller share."""
    from fovea_book.eval.fitting import smallest_best

    if curve.empty:
        raise ValueError("empty curve: no share to choose")
    return smallest_best(curve.share, curve.score, tol=tol)


def default_record_path() -> Path:
    """``fovea_core/weights/cascade_read.json`` of the repository (the package's copy)."""
    from fovea_book.paths import project_root

    return project_root() / "fovea_core" / "weights" / "cascade_read.json"


#: the sets of the share's fit, as :func:`fit_table` names its columns
SET_NAMES = {"sroie-train": "receipts", "funsd-train": "forms", "synthetic": "synthetic"}


def fit_table(record: Mapping) -> pd.DataFrame:
    """The share's fit as a table: one row per method read on the fit's pages (each fitted
    share, the priors, the one-fixation cascade), its share of N (``NaN`` for one fixation)
    and the mean ANLS per set (:data:`SET_NAMES`) and over the sets (``mean``), and
    ``chosen`` (the row of the record's share)."""
    rows = pd.concat([pd.DataFrame(record["curve"]), pd.DataFrame(record["reference"])],
                     ignore_index=True)
    one = rows.label == "cascade | learned"
    rows.loc[one, "share"] = np.nan
    rows = rows.rename(columns={**SET_NAMES, "score": "mean"})
    rows["chosen"] = rows.label.str.startswith("read | fitted") & \
        np.isclose(rows.share, record["first_share"])
    return rows[["label", "share", *SET_NAMES.values(), "mean", "chosen"]]


def fit_line(record: Mapping) -> str:
    """One sentence on the fit's training pages: the chosen share's mean ANLS against the
    priors' and the one-fixation cascade's (points of mean ANLS, no CI: a tuning number)."""
    t = fit_table(record)
    chosen = float(t[t.chosen]["mean"].iloc[0])
    prior = float(t[t.label.str.startswith("read | prior")]["mean"].iloc[0])
    one = float(t[t.label == "cascade | learned"]["mean"].iloc[0])

    def cmp(a: float, b: float) -> str:
        d = 100 * (a - b)
        if abs(d) < 0.05:
            return "the same as"
        return f"{abs(d):.1f} points {'above' if d > 0 else 'below'}"

    return (f"on these training pages the fitted defaults read {cmp(chosen, prior)} the "
            f"hand-set priors and {cmp(chosen, one)} the one-fixation cascade (mean ANLS "
            f"over the three sets, {100 * chosen:.1f} against {100 * prior:.1f} and "
            f"{100 * one:.1f}; tuning numbers, no CI)")


def read_fit_record(path: str | Path | None = None) -> dict:
    """The fit's record (default: the one ``fovea_core`` runs on,
    :func:`~fovea_core.cascade.reading.fitted_path`; ``FileNotFoundError`` naming the command
    that writes it)."""
    from fovea_core.cascade.reading import fitted_path

    p = fitted_path() if path is None else Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no record of the read-then-look fit; run "
                                "`python -m fovea_book.eval.reading_fit`")
    return json.loads(p.read_text())


def geometry_to_dict(g: AnswerGeometry) -> dict:
    """``g`` as the record's JSON-able ``geometry``
    (:func:`fovea_core.cascade.reading.geometry_from_dict` reads it back)."""
    return dict(rects=[[r.anchor, r.x0, r.x1, r.y0, r.y1, r.weight] for r in g.rects],
                presence_floor=g.presence_floor, pattern_pad=g.pattern_pad)


def main(argv: Sequence[str] | None = None) -> int:
    """Fit the geometry and the share (see the module docstring) and write the record."""
    from fovea_book.eval.cascade import Method, cascade_method, evaluate
    from fovea_book.eval.reader import Reader
    from fovea_book.eval.fitting import fit_provenance, start_fit, write_fit_record
    from fovea_core.cascade.allocator import DEFAULT_GIST
    from fovea_core.cascade.reading import PRIOR_FIRST_SHARE, PRIOR_GEOMETRY

    args, record, sets, t0 = start_fit("reading_fit", __doc__, default_record_path(), argv,
                                       receipts=RECEIPTS, forms=FORMS, synthetic=SYNTHETIC)
    held = {d.doc_id for docs in sets.values() for d in docs}
    offsets, provenance = training_pairs(held, data_dir=args.data_dir)
    geometry, summary = fit_geometry(offsets)
    print(f"{summary['pairs']} pairs: " + ", ".join(
        f"{k} {v['share']:.0%}" for k, v in summary["classes"].items()), flush=True)
    for r in geometry.rects:
        print(f"  {r}", flush=True)
    common = dict(gist_budget=DEFAULT_GIST)
    labels = {f"read | prior geometry, share {PRIOR_FIRST_SHARE:g}": PRIOR_FIRST_SHARE}
    methods = [Method(next(iter(labels)), "cascade_read",
                      dict(common, first_share=PRIOR_FIRST_SHARE, geometry=PRIOR_GEOMETRY),
                      query_aware=True)]
    for s in SHARES:
        label = f"read | fitted geometry, share {s:g}"
        labels[label] = s
        methods.append(Method(label, "cascade_read", dict(common, first_share=s,
                                                           geometry=geometry), query_aware=True))
    methods.append(cascade_method("cascade | learned", "learned"))
    table = evaluate(sets, methods, 273, reader=Reader(), workers=args.workers, progress=True)
    fitted = {k: v for k, v in labels.items() if k.startswith("read | fitted")}
    curve = share_curve(table, fitted)
    chosen = choose_share(curve)
    reference = share_curve(table, {next(iter(labels)): PRIOR_FIRST_SHARE,
                                    "cascade | learned": 1.0})
    out = dict(
        first_share=chosen, geometry=geometry_to_dict(geometry), geometry_summary=summary,
        pairs=provenance, budget=273, shares=list(SHARES),
        objective="mean over the sets (receipts, forms, synthetic) of their mean ANLS "
                  "(rapidocr, questions in the training wording); ties to the smaller share",
        curve=curve.to_dict("list"), reference=reference.to_dict("list"),
        prior=dict(geometry=geometry_to_dict(PRIOR_GEOMETRY), first_share=PRIOR_FIRST_SHARE),
        **fit_provenance(record, sets, t0))
    path = write_fit_record(out, args.out)
    print(pd.concat([curve, reference]).to_string(index=False))
    print(f"first_share = {chosen:g} (wrote {path}, {out['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
