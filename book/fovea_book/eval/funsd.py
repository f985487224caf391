"""The FUNSD forms as question/answer documents.

Directory layout (read at run time, never copied into the project)::

    <root>/images/NAME.png        8-bit grayscale scan (about 760 x 1000 px)
    <root>/annotations/NAME.json  {"form": [{"id", "box": [x0, y0, x1, y1], "text", "label",
                                             "words": [{"box", "text"}], "linking": [[a, b]]}]}

Every link between a ``question`` entity and an ``answer`` entity is one question (a link
may be listed on either entity, or on both, in either order; each pair is asked once):
"What is the {key}?", ``key`` the question entity's text without its trailing colon
(``"DATE:"`` -> "What is the DATE?"). ``wording="train"`` / ``"heldout"`` phrase it with
the key-agnostic templates of :data:`fovea_book.eval.documents.FORM_WORDINGS` (e.g. "What
does the form say for DATE?"); the answers and boxes do not change with the wording. A
question's ``field`` is its key, ``qid`` is ``"q{question id}-a{answer id}"``. A question
entity linked to several answers (a table's column header) gives several questions with one
text, each with its own answer and box; links between other labels (header -> question,
question -> question) are not questions and are not counted as skips.

The accepted answer is the answer entity's text (whitespace collapsed), plus the words read
line by line when that differs. The answer's words are grouped into printed lines by their
boxes (:func:`answer_lines`: neighbouring words whose vertical extents overlap by half a
word height share a line, which survives a skewed scan): one box per line (the union of its
words' boxes, clipped to the entity box), read separately as SROIE's multi-line addresses
are. Boxes are ``(x0, y0, x1, y1)`` with exclusive ends (FUNSD's ``x1, y1`` + 1), clipped
to the page.

Bad input (one rule each, never a silent drop):

* raises :class:`~fovea_book.paths.DatasetNotFound`: the folder, or its ``images/`` or
  ``annotations/``, is missing;
* raises :class:`FileNotFoundError` naming the file: an annotation without its image;
* raises :class:`ValueError` naming the file: an unreadable image, a JSON file that does not
  parse (corrupt or truncated), a form that is not ``{"form": [...]}``, an entity without an
  ``id`` or ``label``, two entities with one id; and ``limit`` that is not a non-negative int;
* skipped, counted and printed once per load (file and entity id named; also appended to
  ``skipped``): an answer without a usable box (absent, not four numbers, empty, or off the
  page), an answer without text, a question whose text is empty once the colon is removed,
  a link that is not a pair of ids, a link to an id that no entity has. Images without an
  annotation are not forms; they are counted in the same message.

Reference: Jaume, Ekenel & Thiran, "FUNSD: A Dataset for Form Understanding in Noisy
Scanned Documents", ICDAR-OST 2019.
"""

from __future__ import annotations

import json
import math
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from fovea_book.eval.documents import FORM_FIELD, Box, Document, Question, phrase, reword
from fovea_book.paths import DatasetNotFound, dataset_path

__all__ = ["Skip", "SKIP_REASONS", "form_key", "answer_lines", "entity_box", "read_form",
           "parse_form", "load_form", "load_funsd", "reworded", "skip_message", "unambiguous"]

#: why an entity or link is skipped (the keys of :attr:`Skip.reason`), in the words printed
SKIP_REASONS = {
    "answer_no_box": "answers without a usable box",
    "answer_no_text": "answers without text",
    "question_no_text": "questions without text",
    "bad_link": "links that are not a pair of ids",
    "missing_id": "links to a missing id",
}
#: the most skipped items named per reason in the printed message (all are in ``skipped``)
SHOW_SKIPS = 12


@dataclass(frozen=True)
class Skip:
    """One skipped entity or link.

    Attributes:
        file: the annotation file's name (``NAME.json``).
        entity: the id concerned (the answer, the question, or the missing id of a link;
            for a malformed link, the entity that lists it).
        reason: a key of :data:`SKIP_REASONS`.
    """

    file: str
    entity: object
    reason: str


def form_key(text: str) -> str:
    """A question entity's text as the key of its question: whitespace collapsed, trailing
    colons removed (``"Suggested Solutions (s) :"`` -> ``"Suggested Solutions (s)"``)."""
    return " ".join(str(text).split()).rstrip(": ").strip()


def entity_box(value, size: tuple[int, int]) -> Box | None:
    """FUNSD's inclusive ``[x0, y0, x1, y1]`` as an exclusive-end :data:`Box` clipped to the
    page ``size = (H, W)``; ``None`` when it is not four finite numbers or is empty."""
    if not isinstance(value, (list, tuple)) or len(value) != 4:
        return None
    try:
        v = [float(x) for x in value]
    except (TypeError, ValueError):
        return None
    if not all(math.isfinite(x) for x in v):
        return None
    h, w = size
    x0, y0 = max(0, int(math.floor(v[0]))), max(0, int(math.floor(v[1])))
    x1, y1 = min(w, int(math.floor(v[2])) + 1), min(h, int(math.floor(v[3])) + 1)
    return (x0, y0, x1, y1) if x1 > x0 and y1 > y0 else None


def answer_lines(words, box: Box, size: tuple[int, int], *, min_overlap: float = 0.5,
                 max_gap: float = 2.0) -> list[tuple[Box, str]]:
    """The printed lines of an answer entity: ``[(line box, line text)]``, top to bottom.

    Two words are neighbours on a line when their vertical extents overlap by at least
    ``min_overlap`` x the smaller height and the horizontal gap between them is at most
    ``max_gap`` x the median word height; a line is a connected component of that relation
    (so a skewed scan, whose lines drift by more than the line pitch across the page, still
    gives one line per printed line, where the annotation's word order, not always the
    reading order, would not). Within a line the words are read left to right; lines are
    ordered as their first words are in ``words`` (the order of the entity's text).

    Args:
        words: the entity's ``words`` (``[{"box", "text"}]``); words without text or without
            a usable box are left out (their ink, if any, is still inside the entity box).
        box: the entity's box (exclusive ends); each line box is clipped to it.
        size: ``(H, W)`` of the page.
        min_overlap: in (0, 1].
        max_gap: >= 0.

    Returns:
        One entry per line; ``[(box, "")]`` (the entity box as one line) when no word is
        usable. Vectorised over words: the relation is a ``[K, K]`` comparison, the lines
        ``scipy.sparse.csgraph.connected_components``, the line boxes
        ``np.minimum/maximum.reduceat`` ``[L, 4]``.
    """
    from scipy.sparse.csgraph import connected_components

    if not 0 < min_overlap <= 1:
        raise ValueError(f"min_overlap must be in (0, 1], got {min_overlap}")
    if not max_gap >= 0:
        raise ValueError(f"max_gap must be >= 0, got {max_gap}")
    kept = [(b, " ".join(str(w.get("text", "")).split())) for w in (words or [])
            if isinstance(w, dict) for b in [entity_box(w.get("box"), size)]]
    kept = [(b, t) for b, t in kept if b is not None and t]
    if not kept:
        return [(box, "")]
    b = np.asarray([k[0] for k in kept], np.int64)                       # [K, 4]
    h = b[:, 3] - b[:, 1]                                                # [K]
    ov = np.minimum(b[:, None, 3], b[None, :, 3]) - np.maximum(b[:, None, 1], b[None, :, 1])
    gap = np.maximum(b[:, None, 0], b[None, :, 0]) - np.minimum(b[:, None, 2], b[None, :, 2])
    near = (ov >= min_overlap * np.minimum(h[:, None], h[None, :])) \
        & (gap <= max_gap * float(np.median(h)))                          # [K, K]
    _, comp = connected_components(near, directed=False)                 # [K] line ids
    first = np.full(comp.max() + 1, len(b))
    np.minimum.at(first, comp, np.arange(len(b)))                        # [L] first word
    line = np.argsort(np.argsort(first))[comp]                           # [K] line rank
    order = np.lexsort((b[:, 0], line))                                  # line, then x
    b, line = b[order], line[order]
    texts = [kept[i][1] for i in order]
    starts = np.flatnonzero(np.concatenate([[True], line[1:] != line[:-1]]))  # [L]
    lo = np.stack([np.minimum.reduceat(b[:, 0], starts), np.minimum.reduceat(b[:, 1], starts)], 1)
    hi = np.stack([np.maximum.reduceat(b[:, 2], starts), np.maximum.reduceat(b[:, 3], starts)], 1)
    lo = np.maximum(lo, np.asarray(box[:2]))                             # clip to the entity
    hi = np.minimum(hi, np.asarray(box[2:]))
    ends = np.append(starts[1:], len(texts))
    lines = []
    for (x0, y0), (x1, y1), s, e in zip(lo.tolist(), hi.tolist(), starts, ends):  # lines
        if x1 > x0 and y1 > y0:
            lines.append(((x0, y0, x1, y1), " ".join(texts[s:e])))
    return lines or [(box, "")]


def read_form(path: Path) -> list[dict]:
    """The ``form`` list of an annotation file; :class:`ValueError` naming the file."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"FUNSD annotation {path} is not valid JSON (corrupt or truncated "
                         f"file?): {err}") from err
    form = data.get("form") if isinstance(data, dict) else None
    if not isinstance(form, list):
        raise ValueError(f"FUNSD annotation {path} has no \"form\" list of entities "
                         f"(got {type(data).__name__} with keys "
                         f"{sorted(data) if isinstance(data, dict) else '-'})")
    for i, e in enumerate(form):
        if not isinstance(e, dict) or "id" not in e or "label" not in e:
            raise ValueError(f"FUNSD annotation {path}: entity #{i} has no \"id\" or "
                             f"\"label\" (got {e!r:.80})")
    ids = Counter(_hashable(e["id"]) for e in form)
    dup = sorted(str(k) for k, n in ids.items() if n > 1)
    if dup:
        raise ValueError(f"FUNSD annotation {path}: entity id(s) {', '.join(dup)} used twice")
    return form


def _hashable(v):
    return v if isinstance(v, (int, str)) else repr(v)


def parse_form(path: str | Path, size: tuple[int, int]) -> tuple[list[Question], list[Skip]]:
    """The questions of one annotation file (default wording) and what was skipped.

    Args:
        path: ``annotations/NAME.json``.
        size: ``(H, W)`` of the form's image (boxes are clipped to it).

    Returns:
        ``(questions, skips)``: questions sorted by (question id, answer id); see the module
        docstring for the rules.
    """
    path = Path(path)
    form = read_form(path)
    ents = {_hashable(e["id"]): e for e in form}
    skips: list[Skip] = []
    pairs: set[tuple] = set()
    seen_links: set[tuple] = set()
    for e in form:                                            # entities and their links
        links = e.get("linking") or []
        for link in links if isinstance(links, list) else [links]:
            if not (isinstance(link, (list, tuple)) and len(link) == 2
                    and all(isinstance(v, (int, str)) and not isinstance(v, bool) for v in link)):
                skips.append(Skip(path.name, e["id"], "bad_link"))
                continue
            a, b = link
            if (a, b) in seen_links:
                continue
            seen_links.add((a, b))
            for v in (a, b):
                if v not in ents:
                    skips.append(Skip(path.name, v, "missing_id"))
            if a not in ents or b not in ents:
                continue
            labels = (ents[a]["label"], ents[b]["label"])
            if labels == ("question", "answer"):
                pairs.add((a, b))
            elif labels == ("answer", "question"):
                pairs.add((b, a))
    questions: list[Question] = []
    bad: set[tuple] = set()
    for qi, ai in sorted(pairs, key=lambda p: (str(type(p[0])), p[0], str(type(p[1])), p[1])):
        q, a = ents[qi], ents[ai]
        key = form_key(q.get("text", ""))
        text = " ".join(str(a.get("text", "")).split())
        box = entity_box(a.get("box"), size)
        reason, who = ("question_no_text", qi) if not key else \
            ("answer_no_box", ai) if box is None else \
            ("answer_no_text", ai) if not text else (None, None)
        if reason is not None:
            if (reason, who) not in bad:                      # once per entity
                bad.add((reason, who))
                skips.append(Skip(path.name, who, reason))
            continue
        lines = answer_lines(a.get("words"), box, size)
        printed = " ".join(t for _, t in lines if t)
        answers = (text,) if not printed or printed == text else (text, printed)
        questions.append(Question(f"q{qi}-a{ai}", phrase(FORM_FIELD, "default", 0, key=key),
                                  answers, tuple(b for b, _ in lines), key))
    return questions, skips


def _seed(stem: str, seed: int) -> int:
    return zlib.crc32(f"{seed}:{stem}".encode())


def load_form(root: str | Path, stem: str, *, wording: str = "default", seed: int = 0,
              skipped: list[Skip] | None = None) -> Document:
    """One form (``images/{stem}.png`` + ``annotations/{stem}.json``) as a :class:`Document`
    with an ``[H, W, 3]`` uint8 RGB page (the gray scan in three equal channels, as SROIE's
    pages are RGB), ``doc_id`` ``funsd{stem}``, ``source`` ``"funsd"``.

    ``wording`` and ``seed`` choose each question's template (:func:`~fovea_book.eval.
    documents.reword`); skipped entities and links are appended to ``skipped`` (not printed
    here: :func:`load_funsd` prints them once per load)."""
    import cv2

    root = Path(root)
    img_path, ann_path = root / "images" / f"{stem}.png", root / "annotations" / f"{stem}.json"
    if not img_path.is_file():
        raise FileNotFoundError(f"FUNSD form {stem}: image {img_path} is missing (its "
                                f"annotation {ann_path.name} has no image)")
    bgr = cv2.imread(str(img_path), cv2.IMREAD_COLOR)
    if bgr is None:
        raise ValueError(f"cannot read image {img_path} (corrupt or not an image)")
    image = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    questions, skips = parse_form(ann_path, image.shape[:2])
    if skipped is not None:
        skipped.extend(skips)
    return Document(f"funsd{stem}", image,
                    reword(questions, wording, _seed(stem, seed), "funsd"), (), "funsd")


def reworded(doc: Document, wording: str, seed: int = 0) -> Document:
    """A loaded form with its questions phrased in ``wording`` (the same questions as
    ``load_form(..., wording=wording, seed=seed)``, without reading the files again)."""
    stem = doc.doc_id.removeprefix("funsd")
    plain = tuple(replace(q, question=phrase(FORM_FIELD, "default", 0, key=q.field))
                  for q in doc.questions)
    return replace(doc, questions=reword(plain, wording, _seed(stem, seed), "funsd"))


def _resolve(root_or_name: str | Path | None, data_dir) -> Path:
    """A FUNSD folder from a path or a dataset name (``"funsd-dev"``, ``"funsd-train"``,
    under ``data_dir`` or :func:`~fovea_book.paths.data_dir`)."""
    if root_or_name is None:
        return dataset_path("funsd-dev", data_dir)
    path = Path(root_or_name).expanduser()
    if path.is_dir():
        return path
    if isinstance(root_or_name, str) and len(path.parts) == 1 and not path.suffix:
        return dataset_path(root_or_name, data_dir)
    raise DatasetNotFound(f"FUNSD folder {path} not found; pass a folder holding images/ and "
                          "annotations/, or a dataset name such as 'funsd-dev' (under "
                          "FOVEA_DATA or data_dir)")


def load_funsd(root_or_name: str | Path | None = None, *, wording: str = "default",
               seed: int = 0, limit: int | None = None, data_dir=None,
               skipped: list[Skip] | None = None,
               log: Callable[[str], object] = print) -> list[Document]:
    """The forms of a FUNSD folder, sorted by name, as :class:`Document` s.

    Args:
        root_or_name: a folder with ``images/`` and ``annotations/``, or a dataset name under
            the data root (``"funsd-dev"``, the book's; ``"funsd-train"``, for training and
            tuning only). Default ``"funsd-dev"``.
        wording: ``"default"`` ("What is the DATE?"), ``"train"`` or ``"heldout"``
            (:data:`~fovea_book.eval.documents.FORM_WORDINGS`); answers and boxes do not
            depend on it.
        seed: which template each question draws (with the form's name and the question's
            id); only matters for ``"train"`` / ``"heldout"``.
        limit: the first ``limit`` forms (a non-negative int) or ``None`` for all.
        data_dir: the data root for a dataset name (default ``FOVEA_DATA`` /
            ``data/external``).
        skipped: a list to which every :class:`Skip` is appended.
        log: called once with a one-line summary when something was skipped (default
            ``print``).

    Raises:
        DatasetNotFound: the folder (or its ``images/`` / ``annotations/``) is missing.
        FileNotFoundError: an annotation file has no image (the file is named).
        ValueError: ``limit`` or ``wording`` is invalid, or a file is unreadable (named).
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or limit < 0):
        raise ValueError(f"limit must be a non-negative int or None, got {limit!r}")
    from fovea_book.eval.wordings import check_wording

    check_wording(wording)
    root = _resolve(root_or_name, data_dir)
    for sub in ("images", "annotations"):
        if not (root / sub).is_dir():
            raise DatasetNotFound(f"FUNSD folder {root} has no {sub}/; expected images/ and "
                                  "annotations/ (set FOVEA_DATA or pass data_dir)")
    stems = sorted(p.stem for p in (root / "annotations").glob("*.json"))
    orphans = sorted({p.stem for p in (root / "images").glob("*.png")} - set(stems))
    skips: list[Skip] = []
    docs = [load_form(root, s, wording=wording, seed=seed, skipped=skips)
            for s in stems[:limit]]
    if skipped is not None:
        skipped.extend(skips)
    if skips or orphans:
        log(skip_message(root.name, docs, skips, orphans))
    return docs


def unambiguous(doc: Document) -> Document:
    """``doc`` with only the questions whose key is asked once on the form.

    A form may link one question to several answers (a table's column header "SCORE" above
    nine rows): each is a real question -> answer pair, but its question text cannot tell
    any localiser which of the boxes is meant, so a query-guided method is scored against a
    choice the question does not specify. The book's form results use the questions whose
    key (``Question.field``) is unique on their form; the others stay in the loader.
    """
    keys = [q.field for q in doc.questions]
    keep = tuple(q for q, k in zip(doc.questions, keys) if keys.count(k) == 1)
    return replace(doc, questions=keep)


def skip_message(name: str, docs: list[Document], skips: list[Skip],
                 orphans: list[str] = ()) -> str:
    """One line: what a load kept and what it skipped, by reason, naming ``file#id``."""
    n_q = sum(len(d.questions) for d in docs)
    parts = []
    for reason, words in SKIP_REASONS.items():
        items = [f"{s.file}#{s.entity}" for s in skips if s.reason == reason]
        if items:
            more = f" and {len(items) - SHOW_SKIPS} more" if len(items) > SHOW_SKIPS else ""
            parts.append(f"{len(items)} {words} ({', '.join(items[:SHOW_SKIPS])}{more})")
    if orphans:
        shown = ", ".join(f"{o}.png" for o in orphans[:SHOW_SKIPS])
        parts.append(f"{len(orphans)} images without an annotation, not loaded ({shown})")
    return (f"FUNSD {name}: {len(docs)} forms, {n_q} questions; skipped "
            + "; ".join(parts) + ".")
