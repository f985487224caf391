"""The WildReceipt dev receipts (``wildreceipt-dev``) as question/answer documents.

WildReceipt [Sun, Kuang, Yue, Lin & Zhang, "Spatial Dual-Modality Graph Reasoning for Key
Information Extraction", arXiv:2103.14470, 2021] holds phone photographs of receipts from
many shops and countries. The book's ``wildreceipt-dev`` is 59 of them (the test split,
every 8th line of ``test.txt``) and is **for reporting only**: never fit or tune on it.

Directory layout (the same as ``sroie-dev``; read at run time, never copied)::

    <root>/img/NNN.jpg    receipt photograph
    <root>/box/NNN.csv    x1,y1,x2,y2,x3,y3,x4,y4,TEXT   (split on the first 8 commas only)
    <root>/key/NNN.json   {"company", "date", "total"}, each only where the receipt has it
    <root>/ann/NNN.json   optional: the original annotation, every box with its class
                          index into <root>/class_list.txt (Store_name_value, Date_value, ...)

The box files are read by :func:`fovea_book.eval.sroie.parse_box_file` and the questions
are SROIE's (:data:`fovea_book.eval.sroie.QUESTIONS`; ``wording`` phrases them as SROIE
receipts, so a held-out wording is the same template for both sets). There is no address.

**Transcriptions drop spaces** ("KOREANRESTAURANT"), and so do the key values. A reader
prints spaces, so the evaluator's ANLS (:func:`fovea_book.eval.metrics.anls`, which lower-
cases and collapses whitespace but keeps one space) would charge ``"korean restaurant"``
one edit against ``"koreanrestaurant"``. Compare with spaces removed: score
``anls(normalise_answer(pred), [normalise_answer(a) for a in q.answers])``
(:func:`anls_without_spaces`, :func:`exact_match_without_spaces`), or rescore a table of
evaluator rows with :func:`rescore_without_spaces`.

Answer boxes. WildReceipt's boxes are text segments, not always whole lines, and a value
can be printed more than once (a total repeated as the amount paid, a subtotal equal to
the total). A field's boxes are found from the box file by its text, with spaces removed
and upper-cased (:func:`squash`), in this order (:func:`match_segments`):

1. *one box that spells it*: the boxes whose text equals the value. Among several, the
   first box the annotation labels with the field's class (``Store_name_value``,
   ``Date_value``, ``Total_value``; from ``ann/`` when it is there and its boxes are the box
   file's rows), else the first in file order: the key file took the first labelled box.
2. *segments that spell it together*: a run of 2-``max_boxes`` consecutive boxes, each of
   whose text is a substring of the value, whose texts concatenate to exactly the value.
3. *a box that contains it*: the shortest box whose text contains the value ("DATE:
   12/30/2016"), ties broken as in 1.
4. *a near miss*: :func:`fovea_book.eval.sroie.match_field` (runs of 1-6 consecutive boxes
   within normalised edit distance ``max_nl`` on alphanumerics), for a key that differs
   from the printed text by a character.

Why not gather *every* box whose text is a substring of the value or the reverse: on this
set that rule gives 1-18 boxes per answer, because short segments ("1", a quantity; "2",
"$") are substrings of dates and amounts and a repeated total brings its copies from other
rows; the reader would then read the whole scatter. Pieces count only as a consecutive run
that spells the value exactly (rule 2).

Orientation. The photographs are read in their stored pixel frame
(``cv2.IMREAD_IGNORE_ORIENTATION``; a plain ``cv2.imread`` would rotate by the EXIF
``Orientation`` tag): the annotation's ``width``/``height`` are the stored size for every
receipt, and of the 59 only two JPEGs carry EXIF at all, both with ``Orientation = 1``
(no rotation), so the stored and the displayed frames agree. A receipt whose ``ann/``
states another size than the stored image raises ``ValueError``. Boxes are clipped to the
page (a few rows reach the last pixel row, which the exclusive end would pass by one).

Bad input (one rule each, never a silent drop):

* raises :class:`~fovea_book.paths.DatasetNotFound`: the folder, or its ``img/``, ``box/``
  or ``key/``, is missing;
* raises :class:`ValueError` naming the file: an unreadable image, a key or annotation JSON
  that does not parse or is not an object, an annotation size that is not the image's;
  and ``limit`` that is not a non-negative int, ``max_nl`` outside ``[0, 1]``;
* a field the key file lacks: no question (``date`` on 8 receipts, ``total`` on 4);
* a field whose value matches no box: no question, appended to ``unmatched``;
* skipped, counted and printed once per load (files named; also appended to ``skipped``):
  a key without its image or box file, a receipt left with no question.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from fovea_book.eval.documents import Box, Document, Question, reword
from fovea_book.eval.metrics import anls, exact_match
from fovea_book.eval.sroie import QUESTIONS, load_receipt_folder, match_field, parse_box_file
from fovea_book.paths import DatasetNotFound, dataset_path

__all__ = ["DATASET", "FIELDS", "FIELD_LABELS", "anls_without_spaces",
           "exact_match_without_spaces", "load_wildreceipt", "load_wildreceipt_receipt",
           "match_segments", "normalise_answer", "rescore_without_spaces", "reworded",
           "squash"]

DATASET = "wildreceipt-dev"
FIELDS = ("company", "date", "total")
#: the annotation class whose first box each key field was taken from
FIELD_LABELS = {"company": "Store_name_value", "date": "Date_value", "total": "Total_value"}
#: the prefix of ``Document.doc_id`` (``wildreceipt000``) and the ``Document.source``
SOURCE = "wildreceipt"


# ------------------------------------------------------------------------------ answers
def normalise_answer(text: str) -> str:
    """``text`` lower-cased with every whitespace character removed ("Korean Restaurant"
    -> ``"koreanrestaurant"``): the comparison WildReceipt's space-free transcriptions need.
    Idempotent, and a fixed point of :func:`fovea_book.eval.metrics.normalize_answer`, so
    ANLS of normalised strings is ANLS with spaces ignored."""
    return "".join(str(text).lower().split())


def anls_without_spaces(pred: str, answers: str | Sequence[str], tau: float = 0.5) -> float:
    """:func:`~fovea_book.eval.metrics.anls` of ``pred`` against ``answers`` with spaces
    removed from both (:func:`normalise_answer`); a float in ``[0, 1]``."""
    answers = [answers] if isinstance(answers, str) else list(answers)
    return anls(normalise_answer(pred), [normalise_answer(a) for a in answers], tau)


def exact_match_without_spaces(pred: str, answers: str | Sequence[str]) -> float:
    """1.0 if ``pred`` equals an answer once both are :func:`normalise_answer` ed, else 0.0."""
    answers = [answers] if isinstance(answers, str) else list(answers)
    return exact_match(normalise_answer(pred), [normalise_answer(a) for a in answers])


def rescore_without_spaces(table, docs: Sequence[Document]):
    """A copy of an evaluator table (a ``pandas.DataFrame`` of rows with ``doc_id``, ``qid``
    and ``pred``) with ``anls`` and ``em`` recomputed with spaces ignored against the
    answers of ``docs``; ``ceiling_anls`` / ``ceiling_em`` (when present) are taken from the
    rescored ``allocator == "full"`` rows of the same question.

    Raises:
        KeyError: a row's ``(doc_id, qid)`` is not a question of ``docs``.
    """
    answers = {(d.doc_id, q.qid): q.answers for d in docs for q in d.questions}
    out = table.copy()
    keys = list(zip(out["doc_id"], out["qid"]))
    missing = sorted({k for k in keys if k not in answers})
    if missing:
        raise KeyError(f"rows of questions not in docs: {missing[:5]}")
    out["anls"] = [anls_without_spaces(p, answers[k]) for p, k in zip(out["pred"], keys)]
    out["em"] = [exact_match_without_spaces(p, answers[k]) for p, k in zip(out["pred"], keys)]
    if {"ceiling_anls", "ceiling_em", "allocator"} <= set(out.columns):
        full = out[out["allocator"] == "full"]
        ceil = {(d, q): (a, e) for d, q, a, e in zip(full["doc_id"], full["qid"],
                                                      full["anls"], full["em"])}
        if ceil:
            out["ceiling_anls"] = [ceil[k][0] if k in ceil else c
                                   for k, c in zip(keys, out["ceiling_anls"])]
            out["ceiling_em"] = [ceil[k][1] if k in ceil else c
                                 for k, c in zip(keys, out["ceiling_em"])]
    return out


# ------------------------------------------------------------------------------ boxes
def squash(text: str) -> str:
    """``text`` upper-cased with all whitespace removed: the form in which box texts and key
    values are compared (WildReceipt's transcriptions have no spaces)."""
    return "".join(str(text).upper().split())


def match_segments(value: str, rows: Sequence[tuple[Box, str]],
                   labels: Sequence[str | None] | None = None, field_label: str | None = None,
                   *, max_boxes: int = 6, max_nl: float = 0.25) -> list[int] | None:
    """Indices into ``rows`` of the box(es) that print ``value``, or ``None``.

    Args:
        value: the key field's text.
        rows: ``((x0, y0, x1, y1), text)`` per box, in file order
            (:func:`fovea_book.eval.sroie.parse_box_file`).
        labels: the annotation class name of each row (same length as ``rows``), or
            ``None``; only breaks ties between boxes that print the same text.
        field_label: the class that marks the field's box (:data:`FIELD_LABELS`).
        max_boxes: the longest run of segments that may spell the value together (>= 2).
        max_nl: the normalised edit distance of the near-miss rule, in ``[0, 1]``.

    Rules, in order (the first that finds something wins; see the module docstring): one
    box that spells the value, a consecutive run of segments that spells it, the shortest
    box that contains it, :func:`fovea_book.eval.sroie.match_field`.

    Raises:
        ValueError: ``labels`` is not as long as ``rows``, ``max_boxes`` < 2, or ``max_nl``
            is invalid.
    """
    match_field("", [], max_nl=max_nl)                     # checks max_nl
    if isinstance(max_boxes, bool) or not isinstance(max_boxes, (int, np.integer)) \
            or max_boxes < 2:
        raise ValueError(f"max_boxes must be an int >= 2, got {max_boxes!r}")
    if labels is not None and len(labels) != len(rows):
        raise ValueError(f"labels has {len(labels)} entries for {len(rows)} rows")
    target = squash(value)
    if not target or not rows:
        return None
    keys = [squash(t) for _, t in rows]

    def pick(cands: list[int]) -> int:                    # the field's labelled box, else first
        if labels is not None and field_label is not None:
            own = [i for i in cands if labels[i] == field_label]
            if own:
                return own[0]
        return cands[0]

    same = [i for i, k in enumerate(keys) if k == target]
    if same:
        return [pick(same)]
    for i in range(len(keys)):                             # segments that spell it together
        run = ""
        for j in range(i, min(i + max_boxes, len(keys))):
            if not keys[j] or keys[j] not in target:
                break
            run += keys[j]
            if not target.startswith(run):
                break
            if run == target and j > i:
                return list(range(i, j + 1))
    inside = [i for i, k in enumerate(keys) if target in k]
    if inside:
        shortest = min(len(keys[i]) for i in inside)
        return [pick([i for i in inside if len(keys[i]) == shortest])]
    return match_field(value, list(rows), max_nl=max_nl)


# ------------------------------------------------------------------------------ loading
def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"WildReceipt {what} file {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"WildReceipt {what} file {path} must hold a JSON object, got a "  # noqa: TRY004
                         f"{type(data).__name__}")
    return data


def _labels(root: Path, stem: str, rows: list[tuple[Box, str]], size: tuple[int, int]
            ) -> list[str | None] | None:
    """The class name of each box row from ``ann/{stem}.json`` (``None`` when there is no
    annotation or class list, or its boxes are not the box file's rows); checks the
    annotation's image size against ``size = (H, W)``."""
    path = root / "ann" / f"{stem}.json"
    if not path.is_file():
        return None
    ann = _read_json(path, "annotation")
    h, w = size
    if ("width" in ann and int(ann["width"]) != w) or ("height" in ann and int(ann["height"]) != h):
        raise ValueError(f"WildReceipt annotation {path} is for a {ann.get('width')} x "
                         f"{ann.get('height')} image, but img/{stem}.jpg is {w} x {h} "
                         "(stored frame); the boxes would not fit the page")
    classes_file = root / "class_list.txt"
    if not classes_file.is_file():
        return None
    classes = [c.strip() for c in classes_file.read_text(encoding="utf-8").splitlines()]
    items = ann.get("annotations")
    if not isinstance(items, list) or len(items) != len(rows) \
            or any(not isinstance(a, dict) or squash(a.get("text", "")) != squash(t)
                   for a, (_, t) in zip(items, rows)):
        return None
    out = []
    for a in items:
        lab = a.get("label")
        ok = isinstance(lab, int) and not isinstance(lab, bool) and 0 <= lab < len(classes)
        out.append(classes[lab] if ok else None)
    return out


def _seed(stem: str) -> int:
    return int(stem) if stem.isdigit() else zlib.crc32(stem.encode())


def load_wildreceipt_receipt(root: str | Path, stem: str, *, max_nl: float = 0.25,
                             wording: str = "default", use_labels: bool = True,
                             unmatched: list[tuple[str, str, str]] | None = None) -> Document:
    """One receipt as a :class:`Document`: ``image`` ``[H, W, 3]`` uint8 RGB in the stored
    frame, ``doc_id`` ``wildreceipt{stem}``, ``source`` ``"wildreceipt"``, one
    :class:`Question` per key field that a box prints (qid and ``field`` = the field name,
    ``answers`` = the key value, and the boxes' concatenated text when that differs,
    ``boxes`` in page pixels, clipped to the page, in file order).

    ``wording``: ``"default"`` (SROIE's questions) or ``"train"`` / ``"heldout"`` (drawn per
    receipt as for SROIE). ``use_labels``: break ties between boxes of equal text with the
    annotation's classes (``ann/``); ``False`` takes the first. Fields present in the key
    but found in no box are appended to ``unmatched`` as ``(stem, field, value)``.

    Raises:
        ValueError: an unreadable image, key or annotation (named), or an annotation whose
            image size is not the stored image's.
    """
    import cv2

    root = Path(root)
    img_path = root / "img" / f"{stem}.jpg"
    bgr = cv2.imread(str(img_path), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    if bgr is None:
        raise ValueError(f"cannot read image {img_path} (corrupt or not an image)")
    image = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    h, w = image.shape[:2]
    rows = []
    for (x0, y0, x1, y1), text in parse_box_file(root / "box" / f"{stem}.csv"):
        box = (min(max(x0, 0), w), min(max(y0, 0), h), min(max(x1, 0), w), min(max(y1, 0), h))
        rows.append((box, text))
    labels = _labels(root, stem, rows, (h, w)) if use_labels else None
    keys = _read_json(root / "key" / f"{stem}.json", "key")
    usable = [i for i, (b, _) in enumerate(rows) if b[2] > b[0] and b[3] > b[1]]
    cand = [rows[i] for i in usable]                       # boxes left with an area on the page
    cand_labels = None if labels is None else [labels[i] for i in usable]
    questions = []
    for name in FIELDS:
        raw = keys.get(name)
        value = "" if raw is None else str(raw).strip()
        if not value:
            continue
        idx = match_segments(value, cand, cand_labels, FIELD_LABELS[name], max_nl=max_nl)
        if idx is None:
            if unmatched is not None:
                unmatched.append((stem, name, value))
            continue
        printed = "".join(cand[i][1] for i in idx)
        answers = (value,) if printed == value else (value, printed)
        questions.append(Question(name, QUESTIONS[name], answers,
                                  tuple(cand[i][0] for i in idx), name))
    return Document(f"{SOURCE}{stem}", image, reword(questions, wording, _seed(stem), "sroie"),
                    (), SOURCE)


def reworded(doc: Document, wording: str) -> Document:
    """A loaded receipt with its questions phrased in ``wording`` (the same questions as
    ``load_wildreceipt_receipt(..., wording=wording)``, without reading the files again)."""
    stem = doc.doc_id.removeprefix(SOURCE)
    plain = tuple(replace(q, question=QUESTIONS[q.field]) for q in doc.questions)
    return replace(doc, questions=reword(plain, wording, _seed(stem), "sroie"))


def load_wildreceipt(root: str | Path | None = None, *, data_dir: str | Path | None = None,
                     limit: int | None = None, max_nl: float = 0.25, wording: str = "default",
                     use_labels: bool = True, skipped: list[tuple[str, str]] | None = None,
                     unmatched: list[tuple[str, str, str]] | None = None,
                     log: Callable[[str], object] = print) -> list[Document]:
    """The WildReceipt receipts under ``root``, sorted by id (Sun et al. 2021,
    arXiv:2103.14470); see :func:`load_wildreceipt_receipt` for one receipt. Report only:
    never fit or tune on them. Score answers with spaces removed (:func:`normalise_answer`).

    Args:
        root: a folder with ``img/``, ``box/`` and ``key/`` (and optionally ``ann/``,
            ``class_list.txt``); default ``dataset_path("wildreceipt-dev", data_dir)``.
        data_dir: the data root when ``root`` is ``None`` (default ``FOVEA_DATA`` /
            ``data/external``).
        limit: the first ``limit`` receipts with a key file (a non-negative int; skipped
            ones count) or ``None`` for all.
        max_nl: the near-miss rule's largest normalised edit distance, in ``[0, 1]``.
        wording: ``"default"``, ``"train"`` or ``"heldout"``.
        use_labels: break ties between boxes of equal text with ``ann/``'s classes.
        skipped: a list to which ``(file, reason)`` is appended for every skipped receipt
            (``reason``: ``"no image"``, ``"no box file"`` or ``"no question"``).
        unmatched: a list to which ``(stem, field, value)`` is appended for every key field
            that no box prints (its question is dropped).
        log: called once with a one-line summary when something was skipped.

    Returns:
        ``list[Document]``; on ``wildreceipt-dev``: 59 receipts, 165 questions (company 59,
        date 51, total 55), every answer found in its box file.

    Raises:
        DatasetNotFound: the folder (or its ``img/``, ``box/``, ``key/``) is missing; the
            message names the folder and how to fix it.
        ValueError: ``limit`` or ``max_nl`` is invalid, or a file is unreadable (named).
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, np.integer))
                              or limit < 0):
        raise ValueError(f"limit must be a non-negative int or None, got {limit!r}")
    match_field("", [], max_nl=max_nl)                      # checks max_nl before any I/O
    root = dataset_path(DATASET, data_dir) if root is None else Path(root).expanduser()
    if not root.is_dir():
        raise DatasetNotFound(f"WildReceipt folder {root} not found; pass a folder holding "
                              f"img/, box/ and key/, or set FOVEA_DATA (or data_dir) to the "
                              f"folder that holds {DATASET}/")
    return load_receipt_folder(
        root, lambda r, stem: load_wildreceipt_receipt(r, stem, max_nl=max_nl, wording=wording,
                                                       use_labels=use_labels,
                                                       unmatched=unmatched),
        limit=limit, skipped=skipped, log=log, collection="WildReceipt")


# ------------------------------------------------------------------------------ the chapter
#: WildReceipt dev receipts per profile (report only: nothing is fitted or tuned on them)
BOOK_WILDRECEIPTS = {"smoke": 2, "default": 59, "full": 59}
#: the carry-over target (set on 2026-11-27, before measuring): the default cascade minus
#: ``resize`` at least 0 ANLS points, with the 95 % CI's lower bound above -2 points
CARRY_OVER_TARGET = (0.0, -2.0)


def book_wildreceipt(profile: str, *, data_dir=None, limit: int | None = None
                     ) -> tuple[list[Document], str]:
    """``(receipts, message)``: the ``wildreceipt-dev`` receipts of ``profile``
    (:data:`BOOK_WILDRECEIPTS`), or ``([], why)`` when the dataset is missing, so a chapter
    prints the message and carries on."""
    if profile not in BOOK_WILDRECEIPTS:
        raise ValueError(f"profile must be one of {sorted(BOOK_WILDRECEIPTS)}, got {profile!r}")
    try:
        docs = load_wildreceipt(data_dir=data_dir, log=lambda s: None,
                                limit=BOOK_WILDRECEIPTS[profile] if limit is None else limit)
    except DatasetNotFound as err:
        return [], f"WildReceipt receipts skipped: {err}"
    n_q = sum(len(d.questions) for d in docs)
    return docs, (f"{len(docs)} WildReceipt dev photographs, {n_q} questions (company, date, "
                  "total; report only)")


def native_grid(doc: Document, patch: int = 16) -> int:
    """Level-0 patches of a page at its native size: ``ceil(H / patch) * ceil(W / patch)``."""
    h, w = doc.image.shape[:2]
    return -(-h // patch) * -(-w // patch)


def answer_px_at_resize(doc: Document, budget: int, patch: int = 16) -> np.ndarray:
    """``[Q]`` the height (px) each question's answer has in ``resize``'s view of the page at
    ``budget`` tokens: the median height of its boxes divided by the resize scale
    (``2 ** level`` of :func:`~fovea_core.allocators.grid.resize_grid`). A property of the
    page, not of any method: where it is large, ``resize`` already shows the text large
    enough to read and a fovea has little to add."""
    from fovea_core.allocators.grid import resize_grid

    level = resize_grid(doc.image.shape[:2], budget, patch)[2]
    heights = [float(np.median([b[3] - b[1] for b in q.boxes])) for q in doc.questions]
    return np.asarray(heights, dtype=float) / 2.0 ** level


def carry_over_verdict(diff: float, lo: float, n_docs: int, *,
                       target: tuple[float, float] = CARRY_OVER_TARGET) -> str:
    """``"met"`` when the estimate of ``cascade - resize`` (ANLS points) is at least
    ``target[0]`` and its CI's lower bound above ``target[1]``, else ``"not met"`` (both are
    measured, so the verdict is never undecided); below the book's minimum of documents
    (:data:`~fovea_book.eval.stats.MIN_DOCS`), ``"too few documents (n = K)"``."""
    from fovea_book.eval.stats import MIN_DOCS

    if n_docs < MIN_DOCS:
        return f"too few documents (n = {n_docs})"
    return "met" if diff >= target[0] and lo > target[1] else "not met"


def kept_by_field(table, methods: Sequence[str]):
    """Kept (sum of ANLS over sum of the ceiling's ANLS) per question field and method, a
    ``pandas.DataFrame`` ``[field x method]`` (point estimates over all questions)."""
    t = table[table.allocator.isin(list(methods))]
    g = t.groupby(["field", "allocator"]).agg(anls=("anls", "sum"), ceil=("ceiling_anls", "sum"))
    kept = (g.anls / g.ceil.where(g.ceil > 0)).unstack("allocator")
    return kept.reindex(columns=[m for m in methods if m in kept.columns])
