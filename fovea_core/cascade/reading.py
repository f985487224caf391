"""The read-then-look cascade: two fixations with reading in between, all inside N tokens.

The one-fixation cascade (:func:`~fovea_core.cascade.allocator.cascade`) decides where to
look from the gist alone and never reads: it cannot tell which of the lines it found
answers the question (chapter 14.7). A reader does better by reading first: it fixates
where the answer probably is, reads what it sees there ("TOTAL", a date, the item the
question names) and looks again where the answer lies *relative to* what it read. This
module spends the N tokens that way, registered as the allocator ``"cascade_read"``:

1. **fixation 1** (:func:`first_fixation`) -- the one-fixation cascade's gist and first
   fovea at about ``first_share * N`` tokens (:data:`FIRST_SHARE`, :func:`split_budget`),
   or under the glance rule a glance at the whole page (:func:`glance_images`);
2. **reading** (:func:`read_fixation`) -- the view those tokens make (:func:`first_view`)
   is read by the core's OCR (:func:`read_view`) and the question matched to the lines
   (:func:`match_lines`: a key such as "DATE" or "TOTAL", a pattern such as a date or an
   amount, or another word of the question); the best matches become a map
   (:func:`read_map`) with the mass where the answer lies relative to each
   (:class:`AnswerGeometry`);
3. **the second map** (:func:`second_map`) -- that map, or the localiser's when nothing
   matched (:attr:`Reading.path`, :attr:`Reading.reason`);
4. **fixation 2** (:func:`second_fixation`) -- the rest of N on that map, less what
   fixation 1 already read at that scale (:func:`~fovea_core.cascade.core.discount_seen`,
   the one rule the processor's two fixations follow too).

``TokenSet.stage`` is 0 for the gist, 1 for the first fovea (its core and surround) and
:data:`~fovea_core.cascade.core.STAGE_SECOND` = 2 for the second fixation; the token counts
add up to exactly N and no two tokens share level and centre.

**Cost.** Every pixel the method looks at is carried by its own tokens (the reading reads
fixation 1's view, the localiser the gist), so the cost model (:mod:`fovea_core.cost`)
labels it **budgeted**. The reading's work is not free: in the real-model design it is the
VLM's own prefill and decode of fixation 1's tokens, which the book costs separately; here
it is an OCR, timed per image (:attr:`Reading.ocr_ms`).

**Fitted on training pages.** :data:`DEFAULT_GEOMETRY` (where the answer lies relative to
a key that was read) and :data:`FIRST_SHARE` (fixation 1's share of N) are read from
``fovea_core/weights/cascade_read.json`` (:func:`load_fitted`), which ``python -m
fovea_book.eval.reading_fit`` writes: the geometry from the key-answer pairs of the
training pages (FUNSD's question-to-answer links; on the SROIE receipts, the key the
question names nearest to the field's printed value), summarised by that module's
``fit_geometry``; the share by the reading score of the training pages the localiser never
saw. Nothing was fitted on an evaluated page. :data:`PRIOR_GEOMETRY` and
:data:`PRIOR_FIRST_SHARE` are the hand-set values they replace (the fit's baseline). The
match weights, ``presence_floor`` and ``pattern_pad`` remain documented priors.

The idea is the reading loop of eye-movement research (fixate, read, plan the next saccade
from what was read [Rayner 1998, "Eye movements in reading and information processing"]) and
the key-value structure of forms and receipts (a label, its value beside or below it; FUNSD's
question-answer links [Jaume et al. 2019]).
"""

from __future__ import annotations

import json
import math
import re
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from fovea_core.allocators.grid import resize_grid
from fovea_core.allocators.base import DEFAULT_BUDGET
from fovea_core.allocators.registry import allocate_parts, check_fixation, register
from fovea_core.cascade.allocator import (SURROUND, CascadeParts, check_cascade_budget,
                                          check_cascade_options, check_gist, choose_level,
                                          gist_budget_for, localiser_map, map_confidence,
                                          reads_nothing_else, run_cascade, text_size_map)
from fovea_core.cascade.core import (LEGIBLE_PX, STAGE_SECOND, Gist, combine, discount_seen,
                                     fitting_level, fovea_grid, gist, held_cells, is_number,
                                     one_image, place_fovea)
from fovea_core.importance.text import TextRead
from fovea_core.pyramid import Pyramid
from fovea_core.tokens import TokenSet

__all__ = ["NAME", "GLANCE_NAME", "GLANCE_BELOW", "GLANCE_SHARE", "cascade_glance",
           "STAGE_SECOND", "FIRST_SHARE", "PRIOR_FIRST_SHARE", "Rect", "AnswerGeometry",
           "PRIOR_GEOMETRY", "DEFAULT_GEOMETRY", "geometry_from_dict",
           "fitted_path", "load_fitted", "FITTED",
           "KEY_WORDS", "STOP_WORDS", "DATE_CUES", "AMOUNT_CUES", "DATE_RE", "AMOUNT_RE",
           "Cues", "question_cues", "Match", "char_span", "match_lines", "read_map",
           "first_view",
           "read_view", "Reading", "ReadingParts", "split_budget", "first_fixation",
           "read_fixation", "second_map", "second_fixation", "glance_images", "reading_parts",
           "cascade_read"]

#: the registered name of the read-then-look cascade
NAME = "cascade_read"
#: the hand-set share of N spent by fixation 1 (gist + first fovea; the rest is fixation
#: 2's): half to find and read, half to look again. The fit's baseline; the default,
#: :data:`FIRST_SHARE`, is fitted (:func:`load_fitted`)
PRIOR_FIRST_SHARE = 0.5


# ----------------------------------------------------------------------------- geometry
@dataclass(frozen=True)
class Rect:
    """Where an answer may lie relative to a matched word, in units of the word's line
    height ``h`` (the OCR box's height).

    Attributes:
        anchor: ``"right"`` (``x`` measured from the word's right end) or ``"left"`` (from
            its left end).
        x0, x1: horizontal extent from the anchor, in ``h`` (``math.inf``: to the page's
            edge).
        y0, y1: vertical extent from the top of the word's line box, in ``h`` (``0..1``:
            the line itself; ``1..2``: the line below).
        weight: the mass per unit of covered cell area.
    """

    anchor: str
    x0: float
    x1: float
    y0: float
    y1: float
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.anchor not in ("left", "right"):
            raise ValueError(f"Rect.anchor must be 'left' or 'right', got {self.anchor!r}")
        if not (self.x0 < self.x1 and self.y0 < self.y1) or math.isnan(self.x0 + self.y0):
            raise ValueError(f"Rect needs x0 < x1 and y0 < y1, got {self}")
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"Rect.weight must be finite and > 0, got {self.weight!r}")

    def box(self, word: Sequence[float], line_h: float) -> tuple[float, float, float, float]:
        """``(x0, y0, x1, y1)`` in base pixels for a word box ``(x0, y0, x1, y1)`` whose line
        is ``line_h`` high (unclipped; infinite ends stay infinite)."""
        ax = word[2] if self.anchor == "right" else word[0]
        return (ax + self.x0 * line_h, word[1] + self.y0 * line_h,
                ax + self.x1 * line_h, word[1] + self.y1 * line_h)


@dataclass(frozen=True)
class AnswerGeometry:
    """Where the answer lies relative to a key (or a word of the question) that was read.

    Attributes:
        rects: the :class:`Rect` s; a match's mass is the sum of their weighted coverage.
        presence_floor: inside a rect, a cell under text the reader detected (any line,
            legible or not) keeps full mass and a cell under no detected text this share of
            it (fixation 1 saw a mark there but could not read it: where a value is printed).
        pattern_pad: a pattern match (the answer itself: a date, an amount) covers its own
            span, padded by this many line heights on each side horizontally and a quarter of
            it vertically (so that the fovea holds the whole string).

    The default is :data:`DEFAULT_GEOMETRY` (fitted rects, prior floor and pad).
    """

    rects: tuple[Rect, ...]
    presence_floor: float = 0.5
    pattern_pad: float = 0.5

    def __post_init__(self) -> None:
        if not self.rects or not all(isinstance(r, Rect) for r in self.rects):
            raise ValueError("AnswerGeometry.rects must be a non-empty tuple of Rect")
        if not 0.0 <= self.presence_floor <= 1.0:
            raise ValueError(f"AnswerGeometry.presence_floor must be in [0, 1], got "
                             f"{self.presence_floor!r}")
        if not (math.isfinite(self.pattern_pad) and self.pattern_pad >= 0):
            raise ValueError(f"AnswerGeometry.pattern_pad must be finite and >= 0, got "
                             f"{self.pattern_pad!r}")


#: the hand-set geometry: the value to the key's right along its row (to the page's edge:
#: receipts right-align their amounts) and, at half the weight, on the line just below,
#: starting half a line height left of the key and 16 line heights wide (a form's field
#: under its label). A prior from the layouts of receipts, invoices and forms, not fitted;
#: the fit's baseline. The default, :data:`DEFAULT_GEOMETRY`, is fitted (:func:`load_fitted`)
PRIOR_GEOMETRY = AnswerGeometry((
    Rect("right", 0.0, math.inf, -0.1, 1.1, 1.0),
    Rect("left", -0.5, 16.0, 1.0, 2.2, 0.5),
))


def geometry_from_dict(d: Mapping) -> AnswerGeometry:
    """The :class:`AnswerGeometry` of a fit record's ``geometry`` (written by
    :func:`fovea_book.eval.reading_fit.geometry_to_dict`; ``ValueError`` naming what is
    wrong)."""
    try:
        rects = tuple(Rect(str(a), float(x0), float(x1), float(y0), float(y1), float(w))
                      for a, x0, x1, y0, y1, w in d["rects"])
        return AnswerGeometry(rects, presence_floor=float(d["presence_floor"]),
                              pattern_pad=float(d["pattern_pad"]))
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"not an answer geometry record ({err!r}): needs rects [[anchor, x0, "
                         f"x1, y0, y1, weight], ...], presence_floor and pattern_pad") from err


def fitted_path() -> Path:
    """``fovea_core/weights/cascade_read.json``: the fitted defaults, shipped in the package
    (``FileNotFoundError`` when this installation lacks it)."""
    from fovea_core.paths import resource

    return resource("weights", f"{NAME}.json")


def load_fitted(path: str | Path | None = None) -> tuple[AnswerGeometry, float]:
    """``(geometry, first_share)`` of the fit's record (default :func:`fitted_path`).

    Raises:
        FileNotFoundError: no record; ValueError: a record without a valid ``geometry`` or a
            ``first_share`` in (0, 1).
    """
    p = fitted_path() if path is None else Path(path)
    record = json.loads(p.read_text())
    share = record.get("first_share")
    if not is_number(share) or not 0.0 < float(share) < 1.0:
        raise ValueError(f"{p}: first_share must be a number in (0, 1), got {share!r}")
    return geometry_from_dict(record.get("geometry") or {}), float(share)


# the fitted defaults (module docstring, "Fitted on training pages"); FIRST_SHARE is not the
# processor's untuned GROUNDING_FIRST_SHARE (fovea_core.vlm.processor)
try:
    DEFAULT_GEOMETRY, FIRST_SHARE = load_fitted()
    FITTED = True
except FileNotFoundError:        # only before the first fit: say so, and use the priors
    warnings.warn(f"fovea_core/weights/{NAME}.json is missing: {NAME} uses its hand-set "
                  "priors (run `python -m fovea_book.eval.reading_fit`)", stacklevel=1)
    DEFAULT_GEOMETRY, FIRST_SHARE, FITTED = PRIOR_GEOMETRY, PRIOR_FIRST_SHARE, False


# ----------------------------------------------------------------------------- the question
#: words a question names a key by (labels printed on receipts, invoices and forms); a
#: question word among them that is read on the page is a *key* match, any other content
#: word a *word* match
KEY_WORDS = frozenset(
    "date time total subtotal amount tax gst vat cash change tel phone fax invoice bill "
    "receipt cashier qty quantity price balance due rounding discount name address email "
    "no number ref reference order account".split())
#: question words that name nothing on the page (interrogatives, articles, verbs of asking,
#: layout words the query scorer's spatial prior reads)
STOP_WORDS = frozenset(
    "what whats which who whom whose when where why how is are was were be been being the a an "
    "of in on at to for from by with and or this that these those it its does do did doing "
    "give read find tell me name named shown show shows printed written listed displayed "
    "appear appears say says said value entry entered filled given contain contains there "
    "here page document form field receipt paper article top bottom header footer left right "
    "middle centre center upper lower above below title body row rows column columns item "
    "items table much many all together overall any".split())
#: question words that ask for a date
DATE_CUES = frozenset("date dated when day published issued year month".split())
#: question words that ask for an amount of money
AMOUNT_CUES = frozenset(
    "total subtotal amount cost costs price much sum paid pay charged spent balance due tax "
    "come comes".split())
_MONTH = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?"
#: a date: numeric (``12/03/2019``, ``2019-03-12``, ``12.03.19``) or with a month name
#: (``12 MAR 2019``, ``March 12, 2019``)
DATE_RE = re.compile(
    r"(?<![\d])(?:\d{1,2}[/.\-]\d{1,2}[/.\-]\d{2,4}|\d{4}[/.\-]\d{1,2}[/.\-]\d{1,2}"
    rf"|\d{{1,2}}\s*{_MONTH}\s*,?\s*\d{{2,4}}|{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{2,4}})"
    r"(?![\d])", re.IGNORECASE)
#: an amount: digits with two decimals, thousands optionally grouped (``3,215.99``,
#: ``RM 12.50``, ``12,50``)
AMOUNT_RE = re.compile(r"(?<![\d.,])(?:rm|\$|€|£|usd|myr)?\s?\d{1,3}(?:[,.\s]?\d{3})*[.,]\d{2}"
                       r"(?![.,]?\d)", re.IGNORECASE)
_TOKEN = re.compile(r"[A-Za-z0-9]+")


@dataclass(frozen=True)
class Cues:
    """What to look for on the page for one question (:func:`question_cues`).

    Attributes:
        keys: the question's words that are keys (:data:`KEY_WORDS`), lower case.
        words: its other content words (3 letters or more, not in :data:`STOP_WORDS`).
        patterns: ``"date"`` and / or ``"amount"``, the answer patterns the question implies
            (:data:`DATE_CUES`, :data:`AMOUNT_CUES`).
    """

    keys: tuple[str, ...]
    words: tuple[str, ...]
    patterns: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.keys or self.words or self.patterns)


def question_cues(question: str | None) -> Cues:
    """The keys, words and patterns of ``question`` (lower-case alphabetic words, each once,
    in order; ``None`` or an empty question: no cue)."""
    if not question:
        return Cues((), (), ())
    words = list(dict.fromkeys(re.findall(r"[a-z]+", question.lower())))
    keys = tuple(w for w in words if w in KEY_WORDS)
    rest = tuple(w for w in words if w not in KEY_WORDS and w not in STOP_WORDS and len(w) >= 3)
    pats = tuple(p for p, cues in (("date", DATE_CUES), ("amount", AMOUNT_CUES))
                 if any(w in cues for w in words))
    return Cues(keys, rest, pats)


def _same_word(cue: str, token: str) -> bool:
    """A read token spells the cue: equal ignoring case, or one a prefix of the other when
    both have 4 letters or more (``cite`` / ``Cites``), or one substitution, insertion or
    deletion apart when the cue has 5 letters or more (an OCR slip: ``TOTAI``)."""
    t = token.lower()
    if t == cue:
        return True
    if min(len(t), len(cue)) >= 4 and (t.startswith(cue) or cue.startswith(t)):
        return True
    if len(cue) < 5 or abs(len(t) - len(cue)) > 1:
        return False
    if len(t) == len(cue):
        return sum(a != b for a, b in zip(t, cue)) == 1
    short, long_ = (t, cue) if len(t) < len(cue) else (cue, t)
    return any(long_[:i] + long_[i + 1:] == short for i in range(len(long_)))


# ----------------------------------------------------------------------------- matching
#: mass of a match by kind: a key the question names, a pattern it implies, another word
MATCH_WEIGHTS = {"key": 1.0, "pattern": 1.0, "word": 0.75}
#: a key or word in running text (not the first word of its line, not followed by ``:``)
#: counts this share of a label's
RUNNING_TEXT = 0.5
#: with a key or word matched, a pattern match keeps this share of its weight outside the
#: key's answer region (and all of it inside)
PATTERN_ALONE = 0.25
#: lines recognised below this confidence show where text is but are not matched
MATCH_MIN_CONF = 0.5
#: on the read path, the localiser's map joins the read map at this share of its mass (where
#: the read map holds fewer cells than fixation 2 has tokens, the rest follow the localiser)
LOCALISER_SHARE = 0.05
#: the map fixation 2 follows gets this share of its own mass blurred by a Gaussian of
#: ``SPREAD_SIGMA`` level-0 cells: it orders only the cells the map leaves at zero (those
#: nearest to the mass first), e.g. when fixation 1 already read all of it
SPREAD_SHARE, SPREAD_SIGMA = 1e-3, 4.0
#: matches kept for the map: at most this many, each above ``KEEP`` times the best score (a
#: word in running text, :data:`RUNNING_TEXT`, does not stand beside a label) and scoring
#: at least ``MIN_SCORE`` (a question word in running text, 0.375, never leads alone)
MAX_MATCHES, KEEP, MIN_SCORE = 4, 0.6, 0.5


@dataclass(frozen=True)
class Match:
    """One read line that matches the question.

    Attributes:
        kind: ``"key"``, ``"pattern"`` or ``"word"``.
        cue: what matched (the question's word, or ``"date"`` / ``"amount"``).
        line: index of the line in the read.
        text: the line's text.
        span: ``(x0, y0, x1, y1)`` base pixels of the matched characters (their share of
            the line's box, characters taken as equally wide).
        score: the match's weight (:data:`MATCH_WEIGHTS`, times :data:`RUNNING_TEXT` or the
            pattern's share inside a key's region).
        regions: ``((x0, y0, x1, y1, weight), ...)``, where the answer lies (clipped to the
            page).
    """

    kind: str
    cue: str
    line: int
    text: str
    span: tuple[float, float, float, float]
    score: float
    regions: tuple[tuple[float, float, float, float, float], ...] = field(default=())


def char_span(box: Sequence[float], text: str, a: int, b: int
              ) -> tuple[float, float, float, float]:
    """The box of characters ``a:b`` of a line ``text`` read in ``box`` (x0, y0, x1, y1)."""
    n = max(len(text), 1)
    x0, y0, x1, y1 = (float(v) for v in box)
    return (x0 + (x1 - x0) * a / n, y0, x0 + (x1 - x0) * b / n, y1)


def _clip(r: tuple[float, float, float, float], size: tuple[int, int]
          ) -> tuple[float, float, float, float] | None:
    h, w = size
    x0, y0 = max(r[0], 0.0), max(r[1], 0.0)
    x1, y1 = min(r[2], float(w)), min(r[3], float(h))
    return (x0, y0, x1, y1) if x1 > x0 and y1 > y0 else None


def _overlap(a: Sequence[float], b: Sequence[float]) -> float:
    """Area of ``a`` inside ``b``, as a share of ``a``'s area."""
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    area = max((a[2] - a[0]) * (a[3] - a[1]), 1e-9)
    return ix * iy / area


def match_lines(question: str | None, read: TextRead, image_size: tuple[int, int], *,
                geometry: AnswerGeometry = DEFAULT_GEOMETRY,
                min_conf: float = MATCH_MIN_CONF) -> list[Match]:
    """Match ``question`` to the lines of ``read`` (boxes in base pixels of a page of
    ``image_size``); return every match, best first.

    Rules (:func:`question_cues` gives the cues):

    * **key / word** -- a token of a line spells one of the question's keys (kind
      ``"key"``) or other content words (``"word"``; :func:`_same_word`: case, a shared
      prefix of 4+ letters, one OCR slip in 5+ letters). Several cues in one line add up
      and the last matched token anchors it. A label (the line's first word, or followed by
      ``:``) scores its kind's weight, a word in running text :data:`RUNNING_TEXT` of it.
      The answer lies relative to the matched token (``geometry.rects``).
    * **pattern** -- a date (:data:`DATE_RE`) or an amount (:data:`AMOUNT_RE`) where the
      question implies one. The answer is the match itself (its span, padded by
      ``geometry.pattern_pad``). When a key or word matched too, a pattern scores
      :data:`PATTERN_ALONE` of its weight plus the rest times the share of its span inside
      a key's answer region (the union of its rects, whatever their weights; the key giving
      the largest share times its score over the best key's): the amount on the TOTAL line
      beats the other amounts, and the one on a SUB-TOTAL line (a key in running text) comes
      next.

    Lines below ``min_conf`` are not matched. Ties keep the reading order. A loop over the
    lines of one page (tens), never over tokens.
    """
    cues = question_cues(question)
    h_img, w_img = image_size
    if not cues or len(read.texts) == 0:
        return []
    boxes = np.asarray(read.boxes, np.float64).reshape(-1, 4)
    conf = np.asarray(read.conf, np.float64).reshape(-1)
    labels: list[Match] = []
    patterns: list[tuple[str, int, str, tuple]] = []
    for i, text in enumerate(read.texts):                   # the lines of one page
        if conf[i] < min_conf:
            continue
        box = boxes[i]
        line_h = float(box[3] - box[1])
        toks = list(_TOKEN.finditer(text))
        alpha = [t for t in toks if t.group().isalpha()]
        score, last, kinds = 0.0, None, []
        for kind, group in (("key", cues.keys), ("word", cues.words)):
            for cue in group:
                hit = next((t for t in alpha if _same_word(cue, t.group())), None)
                if hit is None:
                    continue
                label = (hit is alpha[0]) or text[hit.end():hit.end() + 2].lstrip().startswith(":")
                score += MATCH_WEIGHTS[kind] * (1.0 if label else RUNNING_TEXT)
                kinds.append((kind, cue))
                if last is None or hit.end() > last.end():
                    last = hit
        if last is not None:
            span = char_span(box, text, last.start(), last.end())
            regions = []
            for r in geometry.rects:
                c = _clip(r.box(span, line_h), (h_img, w_img))
                if c is not None:
                    regions.append((*c, r.weight))
            kind = "key" if any(k == "key" for k, _ in kinds) else "word"
            labels.append(Match(kind, "+".join(c for _, c in kinds), i, text, span, score,
                                tuple(regions)))
        for pat, rx in (("date", DATE_RE), ("amount", AMOUNT_RE)):
            if pat not in cues.patterns:
                continue
            for m in rx.finditer(text):
                sp = char_span(box, text, m.start(), m.end())
                pad = geometry.pattern_pad * line_h
                region = _clip((sp[0] - pad, sp[1] - 0.25 * pad, sp[2] + pad, sp[3] + 0.25 * pad),
                               (h_img, w_img))
                patterns.append((pat, i, text, sp, region))
    out = list(labels)
    top = max((m.score for m in labels), default=1.0)
    for pat, i, text, sp, region in patterns:
        score = MATCH_WEIGHTS["pattern"]
        if labels:
            # the share of the span inside each key's answer region (its rects' union: the
            # rects of one geometry do not overlap within a frame), times that key's score
            # over the best key's; the rects' weights shape the map, not this share
            inside = max((min(sum(_overlap(sp, r[:4]) for r in m.regions), 1.0) * m.score / top
                          for m in labels), default=0.0)
            score *= PATTERN_ALONE + (1.0 - PATTERN_ALONE) * inside
        regs = () if region is None else ((*region, 1.0),)
        out.append(Match("pattern", pat, i, text, sp, score, regs))
    order = sorted(range(len(out)), key=lambda k: (-out[k].score, k))
    return [out[k] for k in order]


def best_matches(matches: Sequence[Match], *, keep: float = KEEP,
                 max_matches: int = MAX_MATCHES, min_score: float = MIN_SCORE) -> list[Match]:
    """The matches a map is built from: the best ones (``matches`` best first), at most
    ``max_matches``, each scoring more than ``keep`` times the best and at least
    ``min_score``."""
    if not matches:
        return []
    top = matches[0].score
    return [m for m in matches[:max_matches] if m.score > keep * top and m.score >= min_score
            and m.score > 0]


def read_map(matches: Sequence[Match], read: TextRead, image_size: tuple[int, int], *,
             patch: int = 16, geometry: AnswerGeometry = DEFAULT_GEOMETRY) -> torch.Tensor:
    """``[Gh, Gw]`` float32: where the answer lies, from the kept ``matches``.

    Each match adds ``score * weight * coverage`` of each of its regions (the share of each
    level-0 cell the region covers, :func:`~fovea_core.importance.query.box_coverage`); a key
    or word match's regions are multiplied by ``presence_floor + (1 - presence_floor) *
    presence``, ``presence`` the share of the cell under any line the reader detected (of
    any confidence). Zero everywhere when nothing matched.
    """
    from fovea_core.importance.query import box_coverage

    h, w = image_size
    gh, gw = math.ceil(h / patch), math.ceil(w / patch)
    out = torch.zeros(gh, gw)
    if not matches:
        return out
    det = torch.as_tensor(np.asarray(read.boxes, np.float32).reshape(-1, 4))
    presence = (box_coverage(det, (h, w), patch).amax(0) if det.shape[0]
                else torch.zeros(gh, gw)).clamp(max=1.0)
    lift = geometry.presence_floor + (1.0 - geometry.presence_floor) * presence
    for m in matches:                                       # a handful of matches
        if not m.regions:
            continue
        reg = torch.tensor([r[:4] for r in m.regions], dtype=torch.float32)
        wts = torch.tensor([r[4] for r in m.regions], dtype=torch.float32)
        cov = (box_coverage(reg, (h, w), patch) * wts[:, None, None]).sum(0)
        out += m.score * (cov if m.kind == "pattern" else cov * lift)
    return out


# ----------------------------------------------------------------------------- reading
def view_scale(tokens: TokenSet) -> int:
    """The octave ``k`` at which :func:`first_view` renders ``tokens``: the finest token's
    level rounded down (``floor(min level)``, at least 0), so that the view holds every
    pixel a token carries and no more: a page read at level 2.4 is rendered at a quarter of
    its size, a fovea at level 0.3 at full size."""
    return max(0, int(math.floor(float(tokens.levels.min()))))


def first_view(pyramid: Pyramid, tokens: TokenSet) -> torch.Tensor:
    """``[B, C, ceil(H / 2**k), ceil(W / 2**k)]`` in ``[0, 1]``: what ``tokens`` show,
    rendered from their own patches (:func:`~fovea_core.sample.render`, smooth painter) over
    each image's mean token colour (never the pyramid's coarse level: nothing outside the
    tokens), at the scale the tokens carry (``k`` = :func:`view_scale`: the pixels a model
    reading these tokens sees, not a full-resolution canvas of a large photograph).

    The last view is kept on the pyramid (as :mod:`fovea_core.sample` keeps its tables):
    the same tokens on the same pyramid are not rendered again. That happens when fixation
    1 does not depend on the question (a localiser that does not read it, or a glance whose
    gist grid holds its whole budget); with the learned localiser a glance's leftover
    tokens (a gist grid holds a few cells fewer than its budget) go to a first fovea placed
    for the question, so each question renders its own view. Do not write into the returned
    tensor."""
    from fovea_core.sample import render, sample

    last = pyramid.__dict__.get("_first_view")
    if last is not None and _same_tokens(last[0], tokens):
        return last[1]
    h, w = tokens.image_size
    k = 2**view_scale(tokens)
    view = render(tokens, sample(pyramid, tokens), (-(-h // k), -(-w // k)),
                  background=None).clamp(0, 1)
    pyramid.__dict__["_first_view"] = (tokens, view)
    return view


def _same_tokens(a: TokenSet, b: TokenSet) -> bool:
    """Whether ``a`` and ``b`` place the same tokens (centres, levels, page, patch): what a
    render reads of them."""
    return (a.image_size == b.image_size and a.patch == b.patch
            and a.centers.shape == b.centers.shape and a.centers.device == b.centers.device
            and bool(torch.equal(a.centers, b.centers)) and bool(torch.equal(a.levels, b.levels)))


def read_view(view: torch.Tensor) -> TextRead:
    """OCR of one rendered view ``[1, C, h, w]``: every line detected and recognised, boxes
    in the view's pixels (:func:`read_fixation` scales them to the page's), of any confidence
    (:data:`MATCH_MIN_CONF` applies when matching). Through
    :func:`~fovea_core.importance.query.read_page` at ``coarse_level=0``, whose caches
    (memory and disk, :func:`fovea_core.paths.cache_dir`) key the read by a SHA-1 of the
    view's bytes. Tests replace this function to read what they choose."""
    from fovea_core.importance.query import read_page

    return read_page(view, coarse_level=0, min_conf=0.0).reads[0]


def _in_page_pixels(lines: TextRead, view_size, size: tuple[int, int]) -> TextRead:
    """``lines`` read on a view of ``view_size`` ``(h, w)``, with boxes in the page's pixels
    (``size``; the same object when the view is the page's size)."""
    (vh, vw), (h, w) = (int(v) for v in view_size), size
    if (vh, vw) == (h, w):
        return lines
    scale = np.float32([w / vw, h / vh, w / vw, h / vh])
    return TextRead(np.asarray(lines.boxes, np.float32).reshape(-1, 4) * scale, lines.texts,
                    lines.conf)


@dataclass(frozen=True)
class Reading:
    """What fixation 1's view gave one image.

    Attributes:
        path: ``"read"`` (fixation 2 followed the read map) or ``"localiser"`` (it followed
            the localiser's map: nothing matched).
        reason: why, for the localiser path: ``"no question"``, ``"no cue"`` (the question
            names no key, word or pattern to look for, e.g. "What is the title?"; the view
            is then not read), ``"nothing read"``, ``"no match"``; ``""`` on the read path.
        lines: the OCR's :class:`~fovea_core.importance.text.TextRead` (base pixels; empty
            when the view was not read).
        matches: the kept :class:`Match` es, best first.
        ocr_ms: wall milliseconds of the OCR of the view (near 0 on a cache hit; 0 when
            not read; the render of the view is not counted; module docstring, "Cost").
        view_pixels: pixels of the view read (its ``h * w``, at the scale of fixation 1's
            finest token, :func:`view_scale`; 0 when not read).
        first_tokens: tokens of fixation 1 (gist + first fovea).
    """

    path: str
    reason: str
    lines: TextRead
    matches: tuple[Match, ...]
    ocr_ms: float
    view_pixels: int
    first_tokens: int


class ReadingParts(NamedTuple):
    """Every intermediate of one read-then-look call (its first fields are
    :class:`~fovea_core.cascade.allocator.CascadeParts`' own).

    Attributes:
        tokens: the TokenSet (stages 0 gist, 1 first fovea, :data:`STAGE_SECOND` second).
        gist: the page's gist.
        scores: ``[B, Gh, Gw]`` the map fixation 2 followed (read map or localiser's, less
            what fixation 1 read at that scale).
        levels: ``[B]`` the second fixation's level.
        side: ``None`` (nothing is read outside N).
        first: fixation 1's :class:`~fovea_core.cascade.allocator.CascadeParts` (its
            ``scores``: the localiser's map); ``None`` for a batch whose images took
            different paths under ``glance_below`` (their fixations 1 differ in size).
        read_maps: ``[B, Gh, Gw]`` the maps built from the matches (zero where none).
        readings: one :class:`Reading` per image.
    """

    tokens: TokenSet
    gist: Gist
    scores: torch.Tensor
    levels: torch.Tensor
    side: None
    first: CascadeParts | None
    read_maps: torch.Tensor
    readings: tuple[Reading, ...]

    @property
    def paths(self) -> tuple[str, ...]:
        """Per image, ``"read"`` or ``"localiser"``."""
        return tuple(r.path for r in self.readings)



# ----------------------------------------------------------------------------- budget
def split_budget(budget: int, gist_tokens: int, first_share: float,
                 gist_budget: int | None = None) -> tuple[int, int]:
    """``(first fovea, second fixation)`` token counts for ``budget`` tokens of which the
    gist uses ``gist_tokens``: fixation 1 (gist + first fovea) gets ``round(first_share *
    budget)`` tokens, clipped so that both foveae get at least one. A budget that leaves
    a single token after the gist gives it to fixation 2 (fixation 1 is then the gist
    alone, read as it is); one that leaves none raises ``ValueError`` naming ``budget``.

    ``gist_budget``: the gist's nominal budget, when its grid holds fewer cells
    (``gist_tokens``); fixation 1, a cascade whose gist counts at that budget, then spends
    at least ``gist_budget + 1`` tokens (the grid's leftover cells go to its first fovea),
    and a budget that leaves fixation 2 nothing after that raises ``ValueError``."""
    rest = budget - gist_tokens
    if rest < 1:
        raise ValueError(f"{NAME}: budget = {budget} is too small for two fixations: the gist "
                         f"uses {gist_tokens} tokens and leaves none for the second fixation")
    if rest == 1:
        return 0, 1
    first = int(round(first_share * budget)) - gist_tokens
    first = min(max(first, 1), rest - 1)
    short = 0 if gist_budget is None else gist_budget + 1 - (gist_tokens + first)
    if short > 0:
        if rest - first - short < 1:
            raise ValueError(f"{NAME}: budget = {budget} leaves no second fixation after a "
                             f"gist of gist_budget={gist_budget} and one first-fovea token")
        first += short
    return first, rest - first


def _check_args(first_share, geometry, side, fovea) -> float:
    if not is_number(first_share) or not 0.0 < float(first_share) < 1.0:
        raise ValueError(f"{NAME}: first_share must be a number in (0, 1) (the share of N "
                         f"fixation 1 spends), got {first_share!r}")
    if not isinstance(geometry, AnswerGeometry):
        raise ValueError(f"{NAME}: geometry must be an AnswerGeometry, got "
                         f"{type(geometry).__name__}")
    if side is not None:
        raise ValueError(f"{NAME}: side must be None (the read-then-look cascade reads "
                         f"nothing outside N), got {side!r}")
    if fovea != "core":
        raise ValueError(f"{NAME}: fovea must be 'core' (fixation 2 is placed on the read "
                         f"map), got {fovea!r}")
    return float(first_share)


def _check_glance(below, share) -> tuple[float, float]:
    """``(glance_below, glance_share)`` as floats (``ValueError`` naming the one out of range)."""
    if not is_number(below) or not 0.0 <= float(below) <= 1.0:
        raise ValueError(f"{NAME}: glance_below must be a number in [0, 1] (a map confidence, "
                         f"map_confidence; 0: never glance), got {below!r}")
    if not is_number(share) or not 0.0 < float(share) < 1.0:
        raise ValueError(f"{NAME}: glance_share must be a number in (0, 1) (the glance's share "
                         f"of N), got {share!r}")
    return float(below), float(share)


def _unit(m: torch.Tensor) -> torch.Tensor:
    """``m`` divided by its sum (a map with no mass stays zero)."""
    return m / m.sum().clamp(min=1e-12)


def _spread(m: torch.Tensor, sigma: float) -> torch.Tensor:
    """``m`` ``[1, Gh, Gw]`` blurred by a Gaussian of ``sigma`` cells (separable, truncated
    at 3 sigma, zero beyond the page)."""
    r = max(1, int(math.ceil(3 * sigma)))
    k = torch.exp(-0.5 * (torch.arange(-r, r + 1, dtype=torch.float32) / sigma) ** 2)
    k = k / k.sum()
    x = torch.nn.functional.conv2d(m[:, None].float(), k.view(1, 1, -1, 1), padding=(r, 0))
    x = torch.nn.functional.conv2d(x, k.view(1, 1, 1, -1), padding=(0, r))
    return x[:, 0]


# ----------------------------------------------------------------------------- the steps
def first_fixation(pyramid: Pyramid, g: Gist, n_first: int, *, query: str | None,
                   localiser: str | Callable, level: float | str, legible_px: float,
                   surround: float, context: tuple[int, int], context_weight: float,
                   patch: int) -> CascadeParts:
    """Step 1: the gist ``g`` and a first fovea of ``n_first`` tokens, the one-fixation
    cascade's stages (:func:`~fovea_core.cascade.allocator.run_cascade`); with
    ``n_first = 0`` the gist alone, beside the localiser's map as the cascade reads it
    (:func:`~fovea_core.cascade.allocator.localiser_map`)."""
    if n_first:
        return run_cascade(pyramid, g, g.budget + n_first, query=query, localiser=localiser,
                           level=level, legible_px=legible_px, surround=surround,
                           context=context, context_weight=context_weight, patch=patch)
    loc = localiser_map(pyramid, g, query, localiser, patch=patch)
    return CascadeParts(g.tokens, g, loc, torch.full((pyramid.batch_size,), g.level))


def read_fixation(pyramid: Pyramid, first: TokenSet, query: str | None, *,
                  geometry: AnswerGeometry, patch: int) -> tuple[tuple[Reading, ...],
                                                                 torch.Tensor]:
    """Step 2, the reading: per image, the OCR of the view ``first``'s tokens make
    (:func:`first_view`, :func:`read_view`; not read when the question has no cue), the
    kept matches (:func:`match_lines`, :func:`best_matches`) and their map
    (:func:`read_map`). Returns one :class:`Reading` per image (its path ``"read"`` where
    the map has mass) and the read maps ``[B, Gh, Gw]`` (zero where nothing matched). A
    loop over the images of the batch, never over tokens."""
    size = tuple(pyramid.image_size)
    cues = question_cues(query)
    views = first_view(pyramid, first) if cues else None
    readings, maps = [], []
    for b in range(pyramid.batch_size):                   # each page read on its own
        lines = TextRead(np.zeros((0, 4), np.float32), (), np.zeros(0, np.float32))
        ms, pixels, kept = 0.0, 0, []
        if not cues:                # nothing to match: the view is not read at all
            reason = "no question" if not query else "no cue"
        else:
            t0 = time.perf_counter()
            lines = _in_page_pixels(read_view(views[b:b + 1]), views.shape[-2:], size)
            ms = (time.perf_counter() - t0) * 1e3
            pixels = int(views.shape[-2] * views.shape[-1])
            kept = best_matches(match_lines(query, lines, size, geometry=geometry))
            reason = "" if kept else ("nothing read" if len(lines.texts) == 0 else "no match")
        rm = read_map(kept, lines, size, patch=patch, geometry=geometry)[None]
        path = "read" if kept and float(rm.sum()) > 0 else "localiser"
        readings.append(Reading(path, reason or ("" if path == "read" else "no match"), lines,
                                tuple(kept), ms, pixels, first.budget))
        maps.append(rm)
    return tuple(readings), torch.cat(maps)


def second_map(read: torch.Tensor, localiser: torch.Tensor) -> torch.Tensor:
    """Step 3: the map fixation 2 follows (``[1, Gh, Gw]``): the read map ``read`` with
    :data:`LOCALISER_SHARE` of the ``localiser``'s (a hedge where the reading's map has
    fewer cells than fixation 2 has tokens), or the localiser's alone when nothing was
    read; plus :data:`SPREAD_SHARE` of itself blurred (:data:`SPREAD_SIGMA`), so that
    cells with no mass are ranked by their nearness to the mass, not row-major from the
    page's corner, once the mass fixation 1 did not read is spent."""
    m = (_unit(read) + LOCALISER_SHARE * _unit(localiser) if float(read.sum()) > 0
         else _unit(localiser))
    return m + SPREAD_SHARE * _unit(_spread(m, SPREAD_SIGMA))


def _second_level(g: Gist, m: torch.Tensor, heights: torch.Tensor, n: int, first: TokenSet,
                  image_size, patch, legible_px: float) -> tuple[float, torch.Tensor]:
    """Fixation 2's level (:func:`choose_level` on its map ``m`` ``[1, Gh, Gw]`` with this
    image's text heights ``heights`` ``[1, Gh, Gw]``, at most half an octave finer than the
    gist, fine enough for ``n`` tokens besides the cells fixation 1 holds there) and those
    cells (:func:`~fovea_core.cascade.core.held_cells`)."""
    lv = float(choose_level(g, m, legible_px=legible_px, size_map=heights)[0])
    lv = min(lv, max(g.level - 0.5, 0.0))
    for _ in range(4):                          # the held cells shrink the grid; settle
        lv = fitting_level(lv, image_size, n, patch)
        dup = held_cells(first, lv, image_size, patch)
        need = n + int(dup.sum())
        nr, nc, _ = fovea_grid(image_size, lv, patch)
        if nr * nc >= need:
            return lv, dup
        n = need
    raise ValueError(f"{NAME}: the page has no grid with room for {n} second-fixation tokens")


def second_fixation(g: Gist, m: torch.Tensor, heights: torch.Tensor, n_second: int,
                    first: TokenSet, *, legible_px: float, context: tuple[int, int],
                    context_weight: float, patch: int) -> tuple[TokenSet, float, torch.Tensor]:
    """Step 4: ``n_second`` tokens (stage :data:`STAGE_SECOND`) on the map ``m``
    ``[1, Gh, Gw]`` of one image whose fixation 1 placed ``first`` ``[1, K]``, at the level
    :func:`_second_level` chooses, the cells fixation 1 already read at least as finely
    discounted (:func:`~fovea_core.cascade.core.discount_seen`, the one rule) and the
    cells it holds at that level excluded. Returns ``(tokens, level, discounted map)``."""
    size = first.image_size
    lv, held = _second_level(g, m, heights, n_second, first, size, patch, legible_px)
    m = discount_seen(m, first, lv, patch=patch)
    second = place_fovea(m, n_second, image_size=size, level=lv, patch=patch,
                         context=context, context_weight=context_weight,
                         exclude=held[None], stage=STAGE_SECOND)
    return second, lv, m


def _read_then_look(pyramid: Pyramid, budget: int, g: Gist, gist_budget: int, *,
                    query: str | None, first_share: float, localiser: str | Callable,
                    level: float | str, legible_px: float, surround: float,
                    context: tuple[int, int], context_weight: float, patch: int,
                    geometry: AnswerGeometry) -> ReadingParts:
    """The four steps on checked arguments, for a batch whose images take one path (gist
    ``g`` at ``gist_budget``, or a glance)."""
    n_first, n_second = split_budget(budget, g.budget, first_share, gist_budget=gist_budget)
    first = first_fixation(pyramid, g, n_first, query=query, localiser=localiser, level=level,
                           legible_px=legible_px, surround=surround, context=context,
                           context_weight=context_weight, patch=patch)
    readings, read_maps = read_fixation(pyramid, first.tokens, query, geometry=geometry,
                                        patch=patch)
    heights = text_size_map(g)                            # [B, Gh, Gw], the gist's estimate
    parts, maps, levels = [], [], []
    for b in range(pyramid.batch_size):                   # each page looked at on its own
        one = first.tokens[b]
        m = second_map(read_maps[b:b + 1], first.scores[b:b + 1])
        second, lv, m = second_fixation(g, m, heights[b:b + 1], n_second, one,
                                        legible_px=legible_px, context=context,
                                        context_weight=context_weight, patch=patch)
        fix = torch.cat([one.fixations[:, :1], second.fixations[:, :1]], 1)
        parts.append(combine([one, second], fixation=fix))
        maps.append(m)
        levels.append(lv)
    tokens = TokenSet.cat(parts) if len(parts) > 1 else parts[0]
    return ReadingParts(tokens, g, torch.cat(maps), torch.tensor(levels), None, first,
                        read_maps, readings)


def reading_parts(pyramid: Pyramid, budget: int, *, query: str | None = None,
                  first_share: float = FIRST_SHARE, gist_budget: int | None = None,
                  localiser: str | Callable = "learned", level: float | str = "auto",
                  legible_px: float = LEGIBLE_PX, surround: float = SURROUND,
                  context: tuple[int, int] = (1, 2), context_weight: float = 0.5,
                  patch: int = 16, geometry: AnswerGeometry = DEFAULT_GEOMETRY,
                  gist_obj: Gist | None = None, side: str | None = None,
                  fovea: str = "core", glance_below: float | None = None,
                  glance_share: float | None = None) -> ReadingParts:
    """Run the read-then-look cascade and return every intermediate (see :func:`cascade_read`).

    Checks its arguments once, decides each image's fixation 1 (a gist, or under the glance
    rule a glance: :func:`glance_images`), then runs the steps :func:`first_fixation`,
    :func:`read_fixation`, :func:`second_map` and :func:`second_fixation`. A batch is run
    image by image after fixation 1 (each page is read and looked at again on its own: a
    loop over images, never over tokens); a batch whose images take both paths under the
    glance rule runs image by image (its ``first`` is then ``None``).
    """
    first_share = _check_args(first_share, geometry, side, fovea)
    glance = None if glance_below is None and glance_share is None \
        else _check_glance(glance_below, glance_share)
    budget = int(check_cascade_budget(budget, pyramid.image_size, patch=patch,
                                      num_levels=pyramid.num_levels, gist_budget=gist_budget,
                                      name=NAME))
    gist_budget = check_cascade_options(
        query=query, gist_budget=gist_budget, budget=budget, level=level,
        legible_px=legible_px, surround=surround, context=context,
        context_weight=context_weight, name=NAME)
    gist_budget = gist_budget_for(budget) if gist_budget is None else gist_budget
    if gist_obj is not None:
        check_gist(pyramid, gist_obj, gist_budget, patch)
    kw = dict(query=query, first_share=first_share, localiser=localiser, level=level,
              legible_px=legible_px, surround=surround, context=context,
              context_weight=context_weight, patch=patch, geometry=geometry)
    if glance is None:
        g = gist_obj if gist_obj is not None else gist(pyramid, gist_budget, patch=patch)
        return _read_then_look(pyramid, budget, g, gist_budget, **kw)
    size_of, g, unsure = glance_images(pyramid, budget, gist_budget, *glance, gist_obj=gist_obj,
                                       localiser=localiser, query=query, patch=patch)
    if not bool(unsure.any()) or bool(unsure.all()):       # one path for the whole batch
        gb = size_of if bool(unsure.any()) else gist_budget
        g1 = g if not bool(unsure.any()) else gist(pyramid, size_of, patch=patch)
        return _read_then_look(pyramid, budget, g1, gb, **kw)
    parts = []
    for b in range(pyramid.batch_size):            # a mixed batch: each image on its own path
        one = one_image(pyramid, b)
        gb = size_of if bool(unsure[b]) else gist_budget
        parts.append(_read_then_look(one, budget, gist(one, gb, patch=patch), gb, **kw))
    cat = lambda name: torch.cat([getattr(p, name) for p in parts])         # noqa: E731
    return ReadingParts(TokenSet.cat([p.tokens for p in parts]), g, cat("scores"),
                        cat("levels"), None, None, cat("read_maps"),
                        tuple(r for p in parts for r in p.readings))


def glance_images(pyramid: Pyramid, budget: int, gist_budget: int, below: float,
                  share: float, *, gist_obj: Gist | None, localiser: str | Callable,
                  query: str | None, patch: int) -> tuple[int, Gist | None, torch.Tensor]:
    """The glance rule (``cascade_read``'s ``glance_below`` and ``glance_share``): which
    images spend fixation 1 on a glance, a gist of ``round(share * budget)`` tokens (the
    whole page at that share of N; at most ``budget - 2``, which leaves a first-fovea token
    and a second look) instead of the gist at ``gist_budget`` and a first fovea.

    An image glances when its localiser map on the gist has
    :func:`~fovea_core.cascade.allocator.map_confidence` below ``below``; ``below = 1``
    glances on every page (a map's confidence is at most 1) without the gate's gist and
    localiser call. At a budget too small for a glance finer than the gist, no image
    glances. The glance is finer than the gist it replaces, so the gate's map was computed
    from pixels the tokens carry.

    Returns ``(glance tokens, the gist at gist_budget or None when not computed,
    unsure [B] bool)``."""
    if gist_obj is not None:
        cells = gist_obj.budget
    else:                                       # the gist's cells, without sampling it
        rows, cols, _ = resize_grid(tuple(pyramid.image_size), gist_budget, patch)
        cells = rows * cols
    glance = min(int(round(share * budget)), budget - 2)
    b = pyramid.batch_size
    if glance <= cells:                         # too small for a glance: the gist path
        g = gist_obj if gist_obj is not None else gist(pyramid, gist_budget, patch=patch)
        return glance, g, torch.zeros(b, dtype=torch.bool)
    if below >= 1.0:                            # every page glances: no gate to decide
        return glance, gist_obj, torch.ones(b, dtype=torch.bool)
    g = gist_obj if gist_obj is not None else gist(pyramid, gist_budget, patch=patch)
    loc = localiser_map(pyramid, g, query, localiser, patch=patch)
    return glance, g, map_confidence(loc) < below


@register(NAME, family="cascade", version="cascade", content=True, learned=True,
          reads=reads_nothing_else, uses_scores=False, side_compute=False,
          runner=reading_parts, localiser="learned")
def cascade_read(pyramid: Pyramid, scores=None, budget: int = DEFAULT_BUDGET, *,
                 query: str | None = None,
                 first_share: float = FIRST_SHARE, fixation=None, seed: int = 0,
                 patch: int = 16, **kw) -> TokenSet:
    """The read-then-look cascade: fixate, read, look again (the module's four steps);
    exactly ``budget`` tokens.

    Fixation 1 spends ``round(first_share * budget)`` tokens (:func:`split_budget`; default
    :data:`FIRST_SHARE`) on the gist (``gist_budget``, default
    :func:`~fovea_core.cascade.allocator.gist_budget_for` of the whole ``budget``) and a
    first fovea from the ``localiser`` (the learned one); ``geometry`` (default
    :data:`DEFAULT_GEOMETRY`) places the answer relative to what was read
    (:func:`read_map`). ``query`` is the question (``None``: no reading, fixation 2
    continues on the localiser's map). ``glance_below`` (a map confidence in [0, 1], default
    ``None``: never) with ``glance_share`` (in (0, 1)): the glance rule
    (:func:`glance_images`; ``python -m fovea_book.eval.glance_rule`` fits the two on
    photograph-like training pages). The cascade's own keywords (``gist_budget``,
    ``localiser``, ``level``, ``legible_px``, ``surround``, ``context``,
    ``context_weight``) shape fixation 1 as they shape
    :func:`~fovea_core.cascade.allocator.cascade`; ``scores``, ``fixation`` and ``seed``
    are ignored (held to the shared rules). ``TokenSet.stage``: 0 gist, 1 first fovea,
    :data:`STAGE_SECOND` second fixation. Every pixel read is carried by the tokens:
    budgeted. :func:`reading_parts` returns the intermediates (the path taken per image,
    the lines read, the matches, the reading's milliseconds).

    Raises:
        ValueError: naming the argument: ``first_share`` outside (0, 1), a ``budget``
            outside the cascade's range for the page (it needs the gist plus at least one
            token for the second fixation), and the cascade's own checks.
    """
    check_fixation(pyramid, fixation)
    return reading_parts(pyramid, budget, query=query, first_share=first_share, patch=patch,
                         **kw).tokens


# ----------------------------------------------------------------------------- the default
#: ``foveate``'s default, ``"cascade_glance"``: this cascade under the glance rule fitted for
#: the committed localiser on photograph-like training pages (``python -m
#: fovea_book.eval.glance_rule``, record ``data/models/glance_rule.json``; objective set
#: before the fit: every variant at least ``resize``'s mean ANLS, else the rule whose worst
#: variant loses least). No rule met the bar there; the one that lost least glances at
#: 0.9 N on every page (no map's confidence reached 1), reads the glance and spends the
#: last tenth where the reading points. Chapter 14.8 measures it on the photographs,
#: chapter 14.5 on the receipts and the forms.
GLANCE_NAME = "cascade_glance"
GLANCE_BELOW = 1.0
GLANCE_SHARE = 0.9


@register(GLANCE_NAME, family="cascade", version="cascade", content=True, learned=True,
          reads=reads_nothing_else, uses_scores=False, side_compute=False,
          runner=reading_parts, localiser="learned", glance_below=GLANCE_BELOW,
          glance_share=GLANCE_SHARE)
def cascade_glance(pyramid: Pyramid, scores: torch.Tensor | None, budget: int, *,
                   fixation=None, query: str | None = None, seed: int = 0, patch: int = 16,
                   **kw) -> TokenSet:
    """A glance at 0.9 N, read, then look where the reading points (``foveate``'s default):
    :func:`cascade_read` with ``glance_below=``:data:`GLANCE_BELOW` and
    ``glance_share=``:data:`GLANCE_SHARE` (both overridable; fitted on photograph-like
    training pages for the committed localiser).

    The glance (:func:`glance_images`) is the whole page at ``round(0.9 * budget)`` tokens;
    every token counts toward N and the reading reads only the glance's tokens (*budgeted*).
    With ``query=None`` nothing is read and the last tokens follow the localiser's map.
    Returns the tokens ``[B, N]``; raises what :func:`cascade_read` raises.
    """
    return allocate_parts(GLANCE_NAME, pyramid, scores, budget, fixation=fixation,
                          query=query, seed=seed, patch=patch, **kw).tokens
