"""The SROIE receipts (ICDAR 2019, task 3) as question/answer documents.

Directory layout (read at run time, never copied into the project)::

    <root>/img/NNN.jpg    receipt scan
    <root>/box/NNN.csv    x1,y1,x2,y2,x3,y3,x4,y4,TEXT   (split on the first 8 commas only)
    <root>/key/NNN.json   {"company", "date", "address", "total"}

Each key field becomes a question ("What is the company?", ...; ``wording="heldout"``
phrases it with templates no model of this project was trained on, e.g. "Which shop
printed this?", see :data:`fovea_book.eval.documents.WORDINGS`). Its answer box is found
by matching the field to the box lines: a run of 1-6 consecutive lines whose concatenated
text is closest to the field (normalised: upper case, alphanumerics only) by normalised
edit distance; the field is kept if that distance is at most ``max_nl``, else the line
that contains it (a date printed after ``DATE:``), else the field is dropped. A multi-line
answer (an address) keeps one box per line, read separately. Accepted answers are the key
value and the matched lines' transcription (the reader can only read what is printed).

Bad input (one rule each, never a silent drop):

* raises :class:`~fovea_book.paths.DatasetNotFound`: the folder, or its ``img/``, ``box/``
  or ``key/``, is missing;
* raises :class:`ValueError` naming the file: an unreadable image, a key JSON that does not
  parse (corrupt or truncated) or is not an object ``{"company": ..., ...}``; and ``limit``
  that is not a non-negative int, ``max_nl`` outside ``[0, 1]``;
* skipped, counted and printed once per load (files named; also appended to ``skipped``):
  a key without its image or box file, a receipt none of whose fields matches a box line
  (e.g. garbage box rows), so that it has no question.

Reference: Huang et al., "ICDAR2019 Competition on Scanned Receipt OCR and Information
Extraction", ICDAR 2019.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fovea_book.eval.documents import Box, Document, Question, reword
from fovea_book.eval.metrics import levenshtein
from fovea_book.paths import DatasetNotFound, dataset_path

__all__ = ["FIELDS", "QUESTIONS", "SHOW_SKIPS", "parse_box_file", "match_field", "load_receipt",
           "reworded", "load_sroie"]

FIELDS = ("company", "date", "address", "total")
#: the most skipped receipts named per reason in the printed message (all are in ``skipped``)
SHOW_SKIPS = 12
QUESTIONS = {"company": "What is the company?", "date": "What is the date?",
             "address": "What is the address?", "total": "What is the total?"}


def parse_box_file(path: str | Path) -> list[tuple[Box, str]]:
    """Rows of a SROIE box file as ``((x0, y0, x1, y1), text)``; the quadrilateral's
    axis-aligned bounding box (exclusive ends), text split off after the 8th comma."""
    rows = []
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.strip().split(",", 8)
        if len(parts) < 9:
            continue
        try:
            q = np.asarray([int(float(v)) for v in parts[:8]]).reshape(4, 2)
        except ValueError:
            continue
        rows.append(((int(q[:, 0].min()), int(q[:, 1].min()), int(q[:, 0].max()) + 1,
                      int(q[:, 1].max()) + 1), parts[8].strip()))
    return rows


def _key(text: str) -> str:
    return re.sub(r"[^0-9A-Z]", "", text.upper())


def match_field(value: str, lines: list[tuple[Box, str]], *, max_lines: int = 6,
                max_nl: float = 0.25) -> list[int] | None:
    """Indices of the run of consecutive box lines that best spells ``value``, or ``None``.

    Among equally good runs the one whose line (or a line on the same row, e.g. a
    ``TOTAL`` label) mentions ``total`` wins for amounts, else the last one (receipts print
    the total near the bottom, after subtotals).

    Raises:
        ValueError: ``max_nl`` is not a number in ``[0, 1]`` (a normalised edit distance)
            or ``max_lines`` is not an int >= 1.
    """
    if isinstance(max_nl, bool) or not isinstance(max_nl, (int, float, np.integer, np.floating)) \
            or not (math.isfinite(max_nl) and 0.0 <= max_nl <= 1.0):
        raise ValueError(f"max_nl must be a number in [0, 1] (a normalised edit distance), got "
                         f"{max_nl!r}")
    if isinstance(max_lines, bool) or not isinstance(max_lines, (int, np.integer)) \
            or max_lines < 1:
        raise ValueError(f"max_lines must be an int >= 1, got {max_lines!r}")
    target = _key(value)
    if not target or not lines:
        return None
    keys = [_key(t) for _, t in lines]
    best: tuple[tuple[float, int, int], list[int]] | None = None
    for i in range(len(lines)):  # O(lines x max_lines) string comparisons per field
        for k in range(1, min(max_lines, len(lines) - i) + 1):
            cand = "".join(keys[i:i + k])
            if len(cand) - len(target) > max_nl * len(cand):
                break  # longer runs only get worse: NL >= length difference / length
            if len(target) - len(cand) > max_nl * len(target):
                continue
            nl = levenshtein(cand, target) / max(len(cand), len(target))
            rank = (round(nl, 9), -_row_says_total(i, lines), -i)
            if best is None or rank < best[0]:
                best = (rank, list(range(i, i + k)))
    if best is not None and best[0][0] <= max_nl:
        return best[1]
    # a short field printed inside a longer line ("DATE: 25/12/2018 10:30"): that line
    inside = [(-_row_says_total(i, lines), -i) for i, k in enumerate(keys) if target in k]
    return [-min(inside)[1]] if inside else None


def _row_says_total(i: int, lines: list[tuple[Box, str]]) -> int:
    """1 if line ``i`` or a line overlapping it vertically contains 'TOTAL' (not SUB-)."""
    y0, y1 = lines[i][0][1], lines[i][0][3]
    for box, text in lines:
        t = text.upper()
        if min(y1, box[3]) - max(y0, box[1]) > 0.5 * (y1 - y0) and "TOTAL" in t \
                and "SUB" not in t:
            return 1
    return 0


def load_receipt(root: str | Path, stem: str, *, max_nl: float = 0.25,
                 wording: str = "default") -> Document:
    """One receipt as a :class:`Document` (fields without a matching box line are skipped).

    ``wording``: ``"default"`` (:data:`QUESTIONS`), ``"train"`` or ``"heldout"`` (a template
    of that pool per field, drawn from the receipt's id; :func:`~fovea_book.eval.documents.
    reword`). Answers and boxes do not depend on it."""
    import cv2

    root = Path(root)
    bgr = cv2.imread(str(root / "img" / f"{stem}.jpg"), cv2.IMREAD_COLOR)
    if bgr is None:
        raise ValueError(f"cannot read image {root / 'img' / f'{stem}.jpg'}")
    image = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)          # the same bytes as bgr[..., ::-1], 30x faster
    lines = parse_box_file(root / "box" / f"{stem}.csv")
    key_file = root / "key" / f"{stem}.json"
    try:
        keys = json.loads(key_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"SROIE key file {key_file} is not valid JSON: {exc}") from exc
    if not isinstance(keys, dict):
        raise ValueError(f"SROIE key file {key_file} must hold a JSON object with the fields "
                         f"{list(FIELDS)}, got a {type(keys).__name__}")
    questions = []
    for name in FIELDS:
        value = str(keys.get(name, "")).strip()
        idx = match_field(value, lines, max_nl=max_nl) if value else None
        if idx is None:
            continue
        printed = " ".join(lines[i][1] for i in idx)
        answers = (value,) if printed == value else (value, printed)
        questions.append(Question(name, QUESTIONS[name], answers,
                                  tuple(lines[i][0] for i in idx), name))
    seed = int(stem) if stem.isdigit() else zlib.crc32(stem.encode())
    return Document(f"sroie{stem}", image, reword(questions, wording, seed, "sroie"), (),
                    "sroie")


def reworded(doc: Document, wording: str) -> Document:
    """A loaded receipt with its questions phrased in ``wording`` (the same questions as
    ``load_receipt(..., wording=wording)``, without reading the files again)."""
    from dataclasses import replace

    stem = doc.doc_id.removeprefix("sroie")
    seed = int(stem) if stem.isdigit() else zlib.crc32(stem.encode())
    plain = tuple(replace(q, question=QUESTIONS[q.field]) for q in doc.questions)
    return replace(doc, questions=reword(plain, wording, seed, "sroie"))


def load_sroie(root: str | Path | None = None, *, limit: int | None = None,
               max_nl: float = 0.25, wording: str = "default",
               skipped: list[tuple[str, str]] | None = None,
               log: Callable[[str], object] = print) -> list[Document]:
    """The receipts under ``root`` (default: ``dataset_path("sroie-dev")``), sorted by id;
    questions phrased in ``wording`` (:func:`load_receipt`).

    Args:
        root: a folder with ``img/``, ``box/`` and ``key/``.
        limit: the first ``limit`` receipts with a key file (a non-negative int; skipped
            ones count) or ``None`` for all.
        max_nl: the largest normalised edit distance of a matched field, in ``[0, 1]``.
        wording: ``"default"``, ``"train"`` or ``"heldout"``.
        skipped: a list to which ``(file, reason)`` is appended for every skipped receipt
            (``reason``: ``"no image"``, ``"no box file"`` or ``"no question"``).
        log: called once with a one-line summary when something was skipped (default
            ``print``).

    Raises:
        DatasetNotFound: the folder (or its ``img/``, ``box/``, ``key/``) is missing, with a
            how-to-fix message.
        ValueError: ``limit`` or ``max_nl`` is invalid, or a key file is unreadable (named).
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, np.integer))
                              or limit < 0):
        raise ValueError(f"limit must be a non-negative int or None, got {limit!r}")
    match_field("", [], max_nl=max_nl)                      # checks max_nl before any I/O
    root = dataset_path("sroie-dev") if root is None else Path(root).expanduser()
    return load_receipt_folder(
        root, lambda r, stem: load_receipt(r, stem, max_nl=max_nl, wording=wording),
        limit=limit, skipped=skipped, log=log)


def load_receipt_folder(root: Path, load_one: Callable[[Path, str], Document], *,
                        limit: int | None = None,
                        skipped: list[tuple[str, str]] | None = None,
                        log: Callable[[str], object] = print,
                        collection: str = "SROIE") -> list[Document]:
    """The receipts of a folder laid out as SROIE's (``img/NNN.jpg``, ``box/NNN.csv``,
    ``key/NNN.json``), each read by ``load_one(root, stem)``, sorted by stem (the first
    ``limit``); a receipt without an image, a box file or a question is skipped, appended
    to ``skipped`` and named in one ``log`` line (``collection``: the dataset's name in
    messages). Shared by :func:`load_sroie` and the WildReceipt loader.

    Raises:
        DatasetNotFound: ``img/``, ``box/`` or ``key/`` is missing.
    """
    for sub in ("img", "box", "key"):
        if not (root / sub).is_dir():
            raise DatasetNotFound(f"{collection} folder {root} has no {sub}/; expected img/, "
                                  "box/, key/ (set FOVEA_DATA or pass data_dir)")
    skips: list[tuple[str, str]] = []
    docs = []
    for stem in sorted(p.stem for p in (root / "key").glob("*.json"))[:limit]:
        if not (root / "img" / f"{stem}.jpg").exists():
            skips.append((f"img/{stem}.jpg", "no image"))
        elif not (root / "box" / f"{stem}.csv").exists():
            skips.append((f"box/{stem}.csv", "no box file"))
        else:
            doc = load_one(root, stem)
            if doc.questions:
                docs.append(doc)
            else:
                skips.append((f"box/{stem}.csv", "no question"))
    if skipped is not None:
        skipped.extend(skips)
    if skips:
        log(_skip_message(root.name, docs, skips, collection))
    return docs


def _skip_message(name: str, docs: list[Document], skips: list[tuple[str, str]],
                  collection: str = "SROIE") -> str:
    """One line: what a load kept and what it skipped, by reason, naming the files."""
    words = {"no image": "receipts without an image", "no box file": "receipts without a box "
             "file", "no question": "receipts whose box rows match no field (no question)"}
    parts = []
    for reason, text in words.items():
        files = [f for f, r in skips if r == reason]
        if files:
            more = f" and {len(files) - SHOW_SKIPS} more" if len(files) > SHOW_SKIPS else ""
            parts.append(f"{len(files)} {text} ({', '.join(files[:SHOW_SKIPS])}{more})")
    n_q = sum(len(d.questions) for d in docs)
    return (f"{collection} {name}: {len(docs)} receipts, {n_q} questions; skipped "
            + "; ".join(parts) + ".")
