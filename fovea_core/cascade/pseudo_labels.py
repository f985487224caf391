"""Pseudo-labels: where the answers lie on a page nobody annotated, read from the page itself.

A collection of a user's own pages has no answer boxes. This module reads each page once at
full resolution with the OCR the core already has
(:func:`~fovea_core.importance.query.read_page` at ``coarse_level=0``, cached in memory and
on disk by a SHA-1 of the page's bytes) and derives, for the question families the book
asks, where the answer lies and how sure it is (:class:`PseudoLabel`):

* ``"company"`` -- the name at the head of a receipt: one of the first
  :data:`HEAD_LINES` lines read, scored by its rank from the top, a company word
  (:data:`COMPANY_RE`: "SDN BHD", "ENTERPRISE", "GMBH", ...), a large type and mostly
  letters; lines that say what they are (:data:`NOT_COMPANY_RE`: "TAX INVOICE", "TEL", an
  address) are marked down;
* ``"date"`` -- a date (:data:`~fovea_core.cascade.reading.DATE_RE`), matched as the
  read-then-look cascade matches "What is the date?"
  (:func:`~fovea_core.cascade.reading.match_lines`: beside a "DATE" key it scores 1), and
  surer when every date on the page agrees;
* ``"total"`` -- an amount (:data:`~fovea_core.cascade.reading.AMOUNT_RE`) on the row of a
  total key ("TOTAL", and :data:`TOTAL_WORDS`: "SUMME", "JUMLAH", ...;
  :func:`~fovea_core.cascade.reading.match_lines` again), surer when it is the largest such
  (not a tax or a subtotal; of two within :data:`ROUNDING`, the later) and printed more
  than once; the cash handed over, on the line below, is on no total row;
* ``"form"`` -- the value of a form's key (a short line part ending in ``":"``, "NAME:"):
  after the colon on the key's own line, else the line read where
  :data:`~fovea_core.cascade.reading.DEFAULT_GEOMETRY` (fitted on the training pages'
  key-answer pairs) puts the most answers relative to the key, beside or below it.

The confidence is a score in ``[0, 1]`` that orders labels, not a probability; a label is
kept when it reaches its family's threshold in :data:`KEEP`. The thresholds were chosen on
the labelled *training* pages only (``sroie-train``, ``funsd-train``) by ``python -m
fovea_book.eval.pseudo_labels --record`` (the lowest threshold from which the labels kept
hit a true answer box at least 90 % of the time there; record
``data/models/pseudo_labels.json``). A page that reads nothing a family needs gets no
label of it (not an error); the families are read independently, at most one label per
receipt family and one per form key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fovea_core.cascade.reading import (AMOUNT_RE, DATE_RE, DEFAULT_GEOMETRY, MATCH_MIN_CONF,
                                        AnswerGeometry, Match, char_span, match_lines)
from fovea_core.importance.text import TextRead

__all__ = ["FAMILIES", "QUESTIONS", "FORM_QUESTION", "KEEP", "AFTER_COLON", "ROUNDING",
           "HEAD_LINES", "TOTAL_WORDS",
           "COMPANY_RE", "NOT_COMPANY_RE", "PseudoLabel", "read_full_page", "labels_from_read",
           "page_labels"]

#: the question families labelled, in the order a page's labels are returned
FAMILIES = ("company", "date", "total", "form")
#: the book's wording of each receipt family's question (``fovea_book.eval.sroie.QUESTIONS``)
QUESTIONS = {"company": "What is the company?", "date": "What is the date?",
             "total": "What is the total?"}
#: the book's default wording of a form's question (``FORM_WORDINGS["default"]``)
FORM_QUESTION = "What is the {key}?"
#: the lowest confidence kept per family, chosen on the labelled training pages by ``python
#: -m fovea_book.eval.pseudo_labels --record`` (record ``data/models/pseudo_labels.json``):
#: the lowest threshold from which every threshold keeping 20 labels or more hits a true
#: answer 90 % of the time. On the 216 ``sroie-train`` receipts every company and date
#: label already does (0.0 keeps all); a total needs 0.85 (the amount on a total row that
#: is the largest such and printed twice); on the 110 ``funsd-train`` forms a form value
#: needs 0.75, which keeps few (a value beside a key where the fitted geometry is densest)
KEEP = {"company": 0.0, "date": 0.0, "total": 0.85, "form": 0.75}
#: the confidence of a form's value read after its key's colon on the key's own line (by a
#: key that looks like a label); on the training forms these hit the linked answer less
#: often than a value beside the key where the fitted geometry is densest
AFTER_COLON = 0.7
#: amounts on total rows within this share of the largest are one total (before and after
#: a rounding); the last printed of them is the one paid
ROUNDING = 0.01
#: how many lines from the top of the page may hold the company's name
HEAD_LINES = 6
#: words a receipt prints beside its total besides "TOTAL" (German, Malay, ...)
TOTAL_WORDS = ("summe", "gesamt", "jumlah", "betrag", "payable")
#: words that end or make a business's name
COMPANY_RE = re.compile(
    r"\b(?:SDN|BHD|S/B|ENTERPRISES?|TRADING|PLT|LTD|LIMITED|INC|GMBH|LLC|CORP|COMPANY|CO\."
    r"|RESTAURANTS?|RESTORAN|STORES?|MART|MARKET|SUPERMARKET|HARDWARE|STATIONERY|BOOKS?"
    r"|CAFE|BAKERY|PHARMACY|HOLDINGS|INDUSTRIES|SERVICES|KEDAI|PASARAYA|HOTEL)\b",
    re.IGNORECASE)
#: what a head line that is not the company's name says (a document type, a contact, an
#: address word, a registration)
NOT_COMPANY_RE = re.compile(
    r"INVOICE|RECEIPT|\bTEL\b|\bFAX\b|GST|\bREG\b|\bNO[.:]|JALAN|\bJLN\b|\bLOT\b|TAMAN|@|WWW"
    r"|HTTP|DATE|CASHIER|TABLE|WELCOME|THANK", re.IGNORECASE)


@dataclass(frozen=True)
class PseudoLabel:
    """One answer found on a page without annotation.

    Attributes:
        family: one of :data:`FAMILIES`.
        question: the question as the book words it ("What is the total?", "What is the
            DATE?" for a form's key "DATE:").
        box: ``(x0, y0, x1, y1)`` page pixels of the answer.
        confidence: in ``[0, 1]``; orders labels (compare with :data:`KEEP`).
        evidence: what it rests on, in words ("amount beside 'TOTAL' ...").
        answer: the text read in ``box`` (the answer as the full-resolution reading gives
            it: the date or amount itself, a form's value, the company's line).
    """

    family: str
    question: str
    box: tuple[float, float, float, float]
    confidence: float
    evidence: str
    answer: str = ""


def read_full_page(image) -> tuple[TextRead, tuple[int, int]]:
    """``(lines, (H, W))``: every line the core's OCR reads on one page at full resolution
    (boxes in page pixels, any recognition confidence), through the query scorer's caches
    (:func:`~fovea_core.importance.query.read_page` at ``coarse_level=0``), and the page's
    size. Tests replace this function to read what they choose.

    Raises:
        ValueError: a batch of several pages, or what ``read_page`` raises for a bad image.
    """
    from fovea_core.importance.query import read_page

    page = read_page(image, coarse_level=0, min_conf=0.0)
    if len(page.reads) != 1:
        raise ValueError(f"image must be one page, got a batch of {len(page.reads)}")
    return page.reads[0], page.size


def _check(read: TextRead, image_size, families) -> tuple[tuple[int, int], tuple[str, ...]]:
    if not isinstance(read, TextRead):
        raise TypeError(f"read must be a TextRead, got {type(read).__name__}")
    k = len(read.texts)
    if np.asarray(read.boxes).reshape(-1, 4).shape[0] != k or np.asarray(read.conf).size != k:
        raise ValueError(f"read must have one box [4] and one confidence per text, got "
                         f"{np.shape(read.boxes)} boxes, {np.size(read.conf)} confidences and "
                         f"{k} texts")
    if (not isinstance(image_size, (tuple, list)) or len(image_size) != 2
            or not all(isinstance(v, (int, np.integer)) and v > 0 for v in image_size)):
        raise ValueError(f"image_size must be (H, W), two positive ints, got {image_size!r}")
    fams = (families,) if isinstance(families, str) else tuple(families)
    bad = [f for f in fams if f not in FAMILIES]
    if bad or not fams:
        raise ValueError(f"families must be a non-empty selection of {FAMILIES}, got {families!r}")
    return (int(image_size[0]), int(image_size[1])), fams


def _pattern_text(m: Match, rx: re.Pattern, box: np.ndarray) -> str:
    """The string of pattern ``rx`` in ``m``'s line whose span is ``m.span``."""
    for hit in rx.finditer(m.text):
        if np.allclose(char_span(box, m.text, hit.start(), hit.end()), m.span):
            return hit.group()
    return ""


def _company(read: TextRead, boxes: np.ndarray, ok: np.ndarray) -> list[PseudoLabel]:
    """The head line that most looks like a business's name (module docstring)."""
    idx = np.flatnonzero(ok)
    if not idx.size:
        return []
    heights = boxes[idx, 3] - boxes[idx, 1]
    head = idx[np.lexsort((boxes[idx, 0], boxes[idx, 1]))][:HEAD_LINES]          # [L] top first
    texts = [read.texts[i] for i in head]
    letters = np.array([sum(c.isalpha() for c in t) for t in texts], np.float64)
    chars = np.array([max(sum(not c.isspace() for c in t), 1) for t in texts], np.float64)
    word = np.array([bool(COMPANY_RE.search(t)) for t in texts])
    other = np.array([bool(NOT_COMPANY_RE.search(t)) for t in texts])
    tall = np.clip((boxes[head, 3] - boxes[head, 1]) / np.median(heights) - 1.0, 0.0, 1.0)
    rank = np.arange(len(head))
    score = (0.4 * 0.8 ** rank + 0.35 * word + 0.15 * tall + 0.1 * (letters / chars >= 0.8)
             - 0.5 * other - 0.5 * (letters < 3))
    best = int(np.argmax(score))
    conf = float(np.clip(score[best], 0.0, 1.0))
    why = (f"line {best + 1} from the top" + (", a company word" if word[best] else "")
           + (f", type {1 + tall[best]:.1f}x the median" if tall[best] > 0 else ""))
    return [PseudoLabel("company", QUESTIONS["company"], tuple(map(float, boxes[head[best]])),
                        conf, why, texts[best].strip())]


def _date(read: TextRead, size: tuple[int, int], boxes: np.ndarray) -> list[PseudoLabel]:
    """The date the cascade's matching ranks first, surer when the page's dates agree."""
    ms = match_lines(QUESTIONS["date"], read, size)
    found = [m for m in ms if m.kind == "pattern"]
    if not found:
        return []
    keyed = any(m.kind == "key" for m in ms)
    printed = [_pattern_text(m, DATE_RE, boxes[m.line]) for m in found]
    values = [re.sub(r"\W", "", v.lower()) for v in printed]
    score = np.array([m.score for m in found]) * (1.0 if keyed else 0.5)
    agree = np.array([values.count(v) / len(values) for v in values])
    top = np.array([m.span[1] for m in found]) <= min(m.span[1] for m in found)
    conf = 0.6 * score + 0.25 * agree + 0.15 * top
    best = int(np.argmax(conf))
    why = ("beside a 'DATE' key" if keyed and score[best] >= 1.0 else "a date pattern") + \
        f", {agree[best]:.0%} of the page's dates agree"
    return [PseudoLabel("date", QUESTIONS["date"], found[best].span,
                        float(np.clip(conf[best], 0, 1)), why, printed[best].strip())]


def _total(read: TextRead, size: tuple[int, int], boxes: np.ndarray) -> list[PseudoLabel]:
    """The amount on a total key's row, surer when the largest such and printed twice."""
    ms = match_lines(QUESTIONS["total"].rstrip("?") + " " + " ".join(TOTAL_WORDS) + "?",
                     read, size)
    found = [m for m in ms if m.kind == "pattern"]
    if not found:
        return []
    text = [_pattern_text(m, AMOUNT_RE, boxes[m.line]) for m in found]
    value = np.array([int(re.sub(r"\D", "", t) or 0) / 100 for t in text])            # [A]
    amount = np.array([m.span for m in found], np.float64)                           # [A, 4]
    key = np.array([m.span for m in ms if m.kind != "pattern"], np.float64).reshape(-1, 4)
    # on a key's row: its vertical centre within half the key's height of the key's, and
    # right of the key's start (the geometry's rects also reach the lines below, where a
    # receipt prints the cash handed over)
    cy, ky = (amount[:, 1] + amount[:, 3]) / 2, (key[:, 1] + key[:, 3]) / 2
    kh = key[:, 3] - key[:, 1]
    row = ((np.abs(cy[:, None] - ky[None]) <= 0.5 * kh[None])
           & (amount[:, None, 0] >= key[None, :, 0])).any(1)                         # [A]
    beside = np.array([m.score for m in found]) * row                   # [A] in {0} U [0.25, 1]
    near = beside >= 0.6
    # the largest such amount (not a tax or a subtotal), up to a rounding (the last printed
    # of those within ROUNDING of it: "TOTAL 80.91 ... ROUNDED TOTAL 80.90")
    top = near & (value >= (1.0 - ROUNDING) * (value[near].max() if near.any() else np.inf))
    largest = top & (cy >= (cy[top].max() if top.any() else np.inf))
    twice = (value[:, None] == value[None, :]).sum(1) >= 2
    conf = 0.5 * beside + 0.3 * largest + 0.2 * twice
    best = int(np.argmax(conf))
    why = ((f"amount on a total key's row ('{found[best].text}')" if near[best] else
            "an amount") + (", the largest such" if largest[best] else "")
           + (", printed twice" if twice[best] else ""))
    return [PseudoLabel("total", QUESTIONS["total"], found[best].span,
                        float(np.clip(conf[best], 0, 1)), why, text[best].strip())]


_KEY = re.compile(r"^\s*([A-Za-z][^:]{0,38}?)\s*:\s*(.*)$")


def _cover(boxes: np.ndarray, regions: np.ndarray) -> np.ndarray:
    """``[K, R]``: the share of each box ``[K, 4]`` inside each region ``[R, 4]``."""
    ix = np.clip(np.minimum(boxes[:, None, 2], regions[None, :, 2])
                 - np.maximum(boxes[:, None, 0], regions[None, :, 0]), 0, None)
    iy = np.clip(np.minimum(boxes[:, None, 3], regions[None, :, 3])
                 - np.maximum(boxes[:, None, 1], regions[None, :, 1]), 0, None)
    area = np.maximum((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]), 1e-9)
    return ix * iy / area[:, None]


def _form(read: TextRead, boxes: np.ndarray, ok: np.ndarray,
          geometry: AnswerGeometry) -> list[PseudoLabel]:
    """Each key's value: after its colon, else the line where answers to keys lie most."""
    keys = [(i, _KEY.match(read.texts[i])) for i in np.flatnonzero(ok)]
    keys = [(i, m) for i, m in keys if m and sum(c.isalpha() for c in m.group(1)) >= 2
            and len(m.group(1).split()) <= 5]
    if not keys:
        return []
    rects = geometry.rects
    ax = np.array([r.anchor == "right" for r in rects])
    rx = np.array([[r.x0, r.y0, r.x1, r.y1] for r in rects], np.float64)        # [R, 4] in h
    wts = np.array([r.weight for r in rects], np.float64)
    free = ok.copy()
    free[[i for i, _ in keys]] = False              # a key is never another key's value
    out = []
    for i, m in keys:                               # the keys of one page (tens)
        text, key = read.texts[i], " ".join(m.group(1).split())
        q = FORM_QUESTION.format(key=key)
        # a label looks like one: a capital first, no digits, a few words (not running text)
        like = float(np.clip(1.0 - 0.4 * any(c.isdigit() for c in key) - 0.3 * (
            key[0].islower() or "," in key) - 0.1 * max(len(key.split()) - 2, 0), 0.0, 1.0))
        value = m.group(2).strip()
        if value:                                    # "DATE: 12/10/98" read as one line
            if sum(c.isalnum() for c in value) < 2:  # a stray mark, not a value
                continue
            box = char_span(boxes[i], text, m.start(2), len(text.rstrip()))
            out.append(PseudoLabel("form", q, box, AFTER_COLON * like,
                                   f"after '{key}:' on its line", value))
            continue
        span = np.array(char_span(boxes[i], text, m.start(1), m.end(1)))
        h = max(span[3] - span[1], 1.0)
        origin = np.where(ax, span[2], span[0])                                  # [R]
        reg = np.stack([origin + rx[:, 0] * h, span[1] + rx[:, 1] * h,
                        origin + rx[:, 2] * h, span[1] + rx[:, 3] * h], 1)       # [R, 4]
        s = np.where(free, _cover(boxes, reg) @ wts, 0.0)                          # [K]
        if s.max() <= 0:
            continue
        j, second = int(np.argmax(s)), float(np.sort(s)[-2]) if s.size > 1 else 0.0
        conf = (0.7 * s[j] + 0.3 * (1.0 - second / s[j])) * like
        where = "beside" if boxes[j, 1] < span[3] - 0.5 * h else "below"
        out.append(PseudoLabel("form", q, tuple(map(float, boxes[j])), float(np.clip(conf, 0, 1)),
                               f"line {where} '{key}:' (geometry density {s[j]:.2f})",
                               read.texts[j].strip()))
    return out


def labels_from_read(read: TextRead, image_size: tuple[int, int], *,
                     families: Sequence[str] | str = FAMILIES,
                     keep: Mapping[str, float] | None = KEEP,
                     geometry: AnswerGeometry = DEFAULT_GEOMETRY) -> list[PseudoLabel]:
    """The pseudo-labels of a page already read (``read``: boxes in page pixels).

    Args:
        read: the OCR's lines (:class:`~fovea_core.importance.text.TextRead`; lines below
            :data:`~fovea_core.cascade.reading.MATCH_MIN_CONF` are not used).
        image_size: the page's ``(H, W)``.
        families: which of :data:`FAMILIES` to label (a receipt has no form keys to speak
            of; a form no total).
        keep: the lowest confidence kept per family (default :data:`KEEP`); ``None`` keeps
            every label (at most one per receipt family, one per form key).
        geometry: where a form's value lies relative to its key.

    Returns:
        :class:`PseudoLabel` s in the order of ``families``, each family's best first.

    Raises:
        TypeError / ValueError: ``read`` not a consistent ``TextRead``, ``image_size`` not two
            positive ints, an unknown family, or ``keep`` without a threshold in ``[0, 1]``
            for a family asked for.
    """
    size, fams = _check(read, image_size, families)
    if keep is not None:
        bad = {f: keep.get(f) for f in fams if not (isinstance(keep.get(f), (int, float))
                                                     and 0.0 <= keep.get(f) <= 1.0)}
        if bad:
            raise ValueError(f"keep must give each family a threshold in [0, 1], got {bad}")
    boxes = np.asarray(read.boxes, np.float64).reshape(-1, 4)
    ok = np.asarray(read.conf, np.float64).reshape(-1) >= MATCH_MIN_CONF
    out: list[PseudoLabel] = []
    for fam in fams:
        labels = (_company(read, boxes, ok) if fam == "company" else
                  _date(read, size, boxes) if fam == "date" else
                  _total(read, size, boxes) if fam == "total" else
                  _form(read, boxes, ok, geometry))
        labels.sort(key=lambda p: -p.confidence)
        out += [p for p in labels if keep is None or p.confidence >= keep[fam]]
    return out


def page_labels(image, *, families: Sequence[str] | str = FAMILIES,
                keep: Mapping[str, float] | None = KEEP) -> list[PseudoLabel]:
    """Read one page at full resolution (:func:`read_full_page`, cached) and return its
    pseudo-labels (:func:`labels_from_read`).

    Args:
        image: one page, anything :func:`~fovea_core.importance.base.prepare` accepts
            (``[H, W, 3]`` uint8, ``[1, C, H, W]`` float, a one-page pyramid).
        families, keep: as :func:`labels_from_read`.
    """
    read, size = read_full_page(image)
    return labels_from_read(read, size, families=families, keep=keep)
