"""The read-then-look cascade (:mod:`fovea_core.cascade.reading`, registered ``"cascade_read"``).

One synthetic page of 768 px (:func:`fovea_book.eval.documents.make_document`) is read once
by the OCR (the read is cached by the view's hash, in memory and on disk); every other test
reads hand-made lines or a reader replaced by the test. The localiser of the page tests is
a map on the table's "Total" label (the question's key is then legible in fixation 1's view
by construction), so what is tested is the reading and the second look, not the localiser.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from fovea_core import build_pyramid
from fovea_core.cascade import reading
from fovea_core.cascade.allocator import cascade_parts
from fovea_core.cascade.core import covered_share
from fovea_core.cascade.localisers import answer_mass
from fovea_core.cascade.reading import (DEFAULT_GEOMETRY, NAME, PRIOR_FIRST_SHARE,
                                        PRIOR_GEOMETRY, STAGE_SECOND, AnswerGeometry, Rect,
                                        best_matches, match_lines, question_cues, read_map,
                                        reading_parts, split_budget)
from fovea_core.importance.text import TextRead
from fovea_core.tokens import TokenSet

N = 273
QUESTION = "What is the total in the table?"
#: the hand-set geometry and first share, which the page tests are written against
PRIOR_KW = dict(geometry=PRIOR_GEOMETRY, first_share=PRIOR_FIRST_SHARE)


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def page():
    """``(document, pyramid, label localiser, answer boxes)`` of one 768 px paper page."""
    from fovea_book.eval.documents import make_document
    from fovea_core.foveation import load_image

    doc = make_document(0, width=768, height=768)
    label = next(e for e in doc.elements if e.text == "Total")
    q = next(q for q in doc.questions if q.field == "total")
    assert q.question == QUESTION
    pyr = build_pyramid(load_image(doc.image))         # as foveate() builds it

    def at_label(g, query):                             # the key, where fixation 1 reads
        return answer_mass([label.box], g.image_size)[None]

    return doc, pyr, at_label, q.boxes


@pytest.fixture(scope="module")
def run(page):
    """The page read once (the only OCR call of this file; cached by the view's hash), with
    the hand-set geometry and share (:data:`PRIOR_KW`: the mechanics under a geometry the
    test knows; the fitted defaults are tested in ``tests/test_reading_fit.py``)."""
    _, pyr, at_label, _ = page
    return reading_parts(pyr, N, query=QUESTION, localiser=at_label, **PRIOR_KW)


def _share(tokens: TokenSet, stages, boxes) -> float:
    """Share of the answer boxes' area under the footprints of the tokens of ``stages``."""
    sel = torch.isin(tokens.stage[0], torch.tensor(stages))
    sub = TokenSet(tokens.centers[:, sel], tokens.levels[:, sel], tokens.scores[:, sel],
                   tokens.fixations, tokens.image_size, tokens.patch)
    ans = answer_mass(boxes, tokens.image_size, tokens.patch)
    cov = covered_share(sub, tuple(ans.shape), tokens.patch)[0]
    return float((cov * ans).sum() / ans.sum())


def _lines(*rows) -> TextRead:
    """A hand-made read: ``(text, (x0, y0, x1, y1)[, conf])`` per line."""
    texts = tuple(r[0] for r in rows)
    boxes = np.array([r[1] for r in rows], np.float32).reshape(-1, 4)
    conf = np.array([r[2] if len(r) > 2 else 0.99 for r in rows], np.float32)
    return TextRead(boxes, texts, conf)


def _no_ocr(view):
    raise AssertionError("the OCR should not run here")


# ----------------------------------------------------------------------------- the page
def test_exactly_n_distinct_tokens_in_three_labelled_stages(run):
    t = run.tokens
    assert t.budget == N and t.batch_size == 1 and bool(t.is_distinct()[0])
    n_first, n_second = split_budget(N, run.gist.budget, PRIOR_FIRST_SHARE)
    counts = {s: int((t.stage[0] == s).sum()) for s in (0, 1, STAGE_SECOND)}
    assert counts == {0: run.gist.budget, 1: n_first, STAGE_SECOND: n_second}
    assert sum(counts.values()) == N and n_first >= 1 and n_second >= 1
    # fixation 2 is read at its recorded level; fixation 1's tokens are the cascade's own
    assert torch.allclose(t.levels[0][t.stage[0] == STAGE_SECOND], run.levels[0])
    assert torch.equal(t.centers[:, :run.gist.budget + n_first], run.first.tokens.centers)
    assert t.fixations.shape == (1, 2, 2)                 # one fixation per look
    assert run.side is None


def test_the_key_read_in_fixation_one_sends_fixation_two_to_the_answer(page, run):
    _, pyr, at_label, boxes = page
    r = run.readings[0]
    assert run.paths == ("read",) and r.reason == ""
    assert r.matches and r.matches[0].kind == "key" and r.matches[0].cue == "total"
    assert r.ocr_ms > 0 and r.view_pixels == 768 * 768 and r.first_tokens == N - (
        run.tokens.stage[0] == STAGE_SECOND).sum()
    first, second = _share(run.tokens, [1], boxes), _share(run.tokens, [STAGE_SECOND], boxes)
    one = cascade_parts(pyr, N, query=QUESTION, localiser=at_label)       # one fixation
    alone = _share(one.tokens, [1], boxes)
    assert second >= 0.9, (first, second, alone)
    assert second > first + 0.5 and second > alone + 0.5, (first, second, alone)
    # the read map's mass lies to the key's right, on its row
    m = run.read_maps[0]
    key = r.matches[0].span
    rows = torch.nonzero(m.sum(1) == m.sum(1).max()).flatten() * 16
    assert float(key[1]) - 16 <= float(rows[0]) <= float(key[3])
    cols = (m.sum(0) * (torch.arange(m.shape[1]) * 16 + 8)).sum() / m.sum()
    assert float(cols) > key[2]


def test_foveate_runs_it_and_labels_it_budgeted(page, run):
    from fovea_core.foveation import foveate, uses_question

    doc, _, at_label, _ = page
    assert uses_question(NAME)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f = foveate(doc.image, QUESTION, budget=N, method=NAME, localiser=at_label,
                    **PRIOR_KW)
    assert f.cost.label == "budgeted"
    assert f.cost.alloc_read_tokens == 0 and f.cost.total_tokens == N and f.cost.side_ms == 0
    assert torch.equal(f.tokens.centers, run.tokens.centers)      # the same run (cached read)
    assert torch.equal(f.tokens.stage, run.tokens.stage)


# ----------------------------------------------------------------------------- fallback
def _second_centre(t: TokenSet) -> tuple[float, float]:
    """Mean centre (base pixels) of the second fixation's tokens."""
    xy = t.centers_px()[0][t.stage[0] == STAGE_SECOND].mean(0)
    return float(xy[0]), float(xy[1])


def _centre(localiser, pyr) -> tuple[float, float]:
    """Mass centre (base pixels) of a localiser's map on the page."""
    from fovea_core.cascade.core import gist

    m = localiser(gist(pyr, 64), None)[0]
    ys = (torch.arange(m.shape[0]) + 0.5) * 16
    xs = (torch.arange(m.shape[1]) + 0.5) * 16
    return float((m.sum(0) * xs).sum() / m.sum()), float((m.sum(1) * ys).sum() / m.sum())


def test_nothing_read_falls_back_to_the_localiser_and_says_so(page, run, monkeypatch):
    _, pyr, at_label, _ = page
    empty = TextRead(np.zeros((0, 4), np.float32), (), np.zeros(0, np.float32))
    monkeypatch.setattr(reading, "read_view", lambda view: empty)
    p = reading_parts(pyr, N, query=QUESTION, localiser=at_label)
    assert p.paths == ("localiser",) and p.readings[0].reason == "nothing read"
    assert p.readings[0].matches == () and float(p.read_maps.abs().sum()) == 0
    t = p.tokens
    assert t.budget == N and bool(t.is_distinct()[0])
    assert set(t.stage[0].tolist()) == {0, 1, STAGE_SECOND}
    # fixation 2 follows the localiser's map: around the label it points at (fixation 1
    # read the label itself), where the read path goes to the label's right
    lx, ly = (page_label_centre := _centre(at_label, pyr))
    cx, cy = _second_centre(t)
    assert abs(cx - lx) < 60 and abs(cy - ly) < 60, ((cx, cy), page_label_centre)
    assert _second_centre(run.tokens)[0] > lx + 150
    # a read that matches nothing: the same fallback, another reason
    other = _lines(("Annals of Token Allocation", (108, 24, 273, 47)))
    monkeypatch.setattr(reading, "read_view", lambda view: other)
    q = reading_parts(pyr, N, query=QUESTION, localiser=at_label)
    assert q.paths == ("localiser",) and q.readings[0].reason == "no match"
    assert torch.equal(q.tokens.centers, t.centers)
    # no question: no reading at all
    monkeypatch.setattr(reading, "read_view", _no_ocr)
    r = reading_parts(pyr, N, query=None, localiser=at_label)
    assert r.paths == ("localiser",) and r.readings[0].reason == "no question"
    assert r.readings[0].ocr_ms == 0 and r.readings[0].view_pixels == 0
    # a question with nothing to look for (no key, word or pattern): not read either
    r = reading_parts(pyr, N, query="What is the title?", localiser=at_label)
    assert r.paths == ("localiser",) and r.readings[0].reason == "no cue"
    assert torch.equal(r.tokens.centers, t.centers)


# ----------------------------------------------------------------------------- match rules
def test_cues_of_a_question():
    c = question_cues("What is the total amount for Sensors?")
    assert c.keys == ("total", "amount") and c.words == ("sensors",)
    assert c.patterns == ("amount",)
    assert question_cues("When was this issue published?").patterns == ("date",)
    assert not question_cues("Who is the first author?").patterns
    assert not question_cues(None) and not question_cues("")


def test_a_key_on_its_line_and_the_amount_to_its_right():
    size = (400, 300)
    read = _lines(("SUB-TOTAL", (10, 100, 80, 112)), ("11.00", (240, 100, 280, 112)),
                  ("TOTAL:", (10, 120, 60, 132)), ("12.50", (240, 120, 280, 132)),
                  ("CASH 20.00", (10, 160, 280, 172)))
    # the fitted geometry ranks the same two first
    fitted = best_matches(match_lines("What is the total?", read, size))
    assert [(k.kind, k.line) for k in fitted[:2]] == [("key", 2), ("pattern", 3)]
    m = match_lines("What is the total?", read, size, geometry=PRIOR_GEOMETRY)
    kept = best_matches(m)
    # the TOTAL label and the amount on its row lead; SUB-TOTAL's "TOTAL" is not a label
    assert (kept[0].kind, kept[0].line) == ("key", 2) and kept[0].score == 1.0
    assert (kept[1].kind, kept[1].cue, kept[1].line) == ("pattern", "amount", 3)
    assert kept[1].score == pytest.approx(1.0)
    # the amount beside SUB-TOTAL comes next (its key is in running text: half the weight)
    half = reading.PATTERN_ALONE + (1 - reading.PATTERN_ALONE) * reading.RUNNING_TEXT
    assert [(k.line, round(k.score, 6)) for k in kept[2:]] == [(1, half)]
    sub = next(x for x in m if x.line == 0)
    assert sub.kind == "key" and sub.score == pytest.approx(reading.RUNNING_TEXT)
    cash = next(x for x in m if x.line == 4)
    assert cash.kind == "pattern" and cash.score == pytest.approx(reading.PATTERN_ALONE)
    # the map: mass on the key's row to its right and on the amount, none far above
    mp = read_map(kept, read, size, patch=16, geometry=PRIOR_GEOMETRY)
    assert mp.shape == (25, 19)
    assert float(mp[7, 15]) > float(mp[7, 10]) > 0          # row of y = 120: the amount's
    assert float(mp[7, :3].sum()) == 0                       # cell stands out; the key and
    assert float(mp[:5].sum()) == 0                          # what lies left of it, above: 0


def test_a_key_inside_a_line_points_at_the_rest_of_the_line():
    read = _lines(("DATE:12/03/2019 10:15", (10, 40, 230, 52)))
    m = best_matches(match_lines("What is the date?", read, (300, 240)))
    assert [x.kind for x in m] == ["key", "pattern"]
    key, pat = m
    assert key.span[2] < pat.span[0] + 1                       # the date lies right of DATE
    assert pat.text[int(round((pat.span[0] - 10) / 220 * len(pat.text))):].startswith("12/03")


@pytest.mark.parametrize("text", ["12/03/2019", "2019-03-12", "12.03.19", "12 MAR 2019",
                                  "March 12, 2019", "July 8, 2004"])
def test_a_date_pattern(text):
    read = _lines(("INV NO: 4411", (10, 10, 120, 22)), (text, (10, 40, 130, 52)))
    m = best_matches(match_lines("When was this issued?", read, (200, 200)))
    assert [(x.kind, x.cue, x.line) for x in m] == [("pattern", "date", 1)]
    assert m[0].regions and m[0].regions[0][0] < 10 + 1e-6 + DEFAULT_GEOMETRY.pattern_pad * 12


@pytest.mark.parametrize("text,hit", [("3,215.99", True), ("RM 12.50", True), ("12,50", True),
                                      ("12.03.2019", False), ("2004", False), ("Qty 12", False)])
def test_an_amount_pattern(text, hit):
    read = _lines((text, (10, 40, 130, 52)))
    m = match_lines("How much does it cost?", read, (200, 200))
    assert bool(m) == hit and all(x.kind == "pattern" and x.cue == "amount" for x in m)


def test_a_word_of_the_question_and_an_ocr_slip():
    read = _lines(("Item", (10, 10, 40, 22)), ("Sensors", (10, 40, 70, 52)),
                  ("Lenses", (10, 60, 70, 72)), ("216.81", (200, 40, 250, 52)),
                  ("99.10", (200, 60, 250, 72)))
    m = best_matches(match_lines("What is the price of Sensors?", read, (100, 300)))
    assert (m[0].kind, m[0].cue, m[0].line) == ("pattern", "amount", 3)   # on Sensors' row
    assert any((x.kind, x.cue, x.line) == ("word", "sensors", 1) for x in m)
    assert all(x.line not in (2, 4) for x in m)
    slip = match_lines("What is the total?", _lines(("TOTAI", (10, 10, 60, 22))), (50, 100))
    assert [(x.kind, x.cue) for x in slip] == [("key", "total")]
    faint = match_lines("What is the total?", _lines(("TOTAL", (10, 10, 60, 22), 0.3)), (50, 100))
    assert faint == []                                        # below MATCH_MIN_CONF


def test_no_match_gives_no_map():
    read = _lines(("TOTAL", (10, 10, 60, 22)), ("12.50", (200, 10, 250, 22)))
    assert match_lines("Who is the first author?", read, (100, 300)) == []
    assert match_lines(None, read, (100, 300)) == []
    assert float(read_map([], read, (100, 300)).sum()) == 0
    # a question word in running text is matched but does not lead a second look alone
    prose = _lines(("the first results of the study", (10, 40, 250, 52)))
    m = match_lines("Who is the first author?", prose, (100, 300))
    assert [(x.kind, x.cue) for x in m] == [("word", "first")] and best_matches(m) == []


def test_the_geometry_is_a_parameter():
    read = _lines(("TOTAL", (10, 100, 60, 112)))
    below = AnswerGeometry((Rect("left", 0.0, 10.0, 1.0, 2.0),), presence_floor=1.0)
    m = best_matches(match_lines("What is the total?", read, (300, 300), geometry=below))
    (x0, y0, x1, y1, w), = m[0].regions
    assert (x0, y0, x1, y1, w) == pytest.approx((10, 112, 130, 124, 1.0))
    mp = read_map(m, read, (300, 300), geometry=below)
    assert float(mp[7].sum()) > 0 and float(mp[6].sum()) == 0 and float(mp[:, 9:].sum()) == 0
    with pytest.raises(ValueError, match="anchor"):
        Rect("above", 0, 1, 0, 1)
    with pytest.raises(ValueError, match="presence_floor"):
        AnswerGeometry((Rect("left", 0, 1, 0, 1),), presence_floor=2.0)


# ----------------------------------------------------------------------------- small pages
@pytest.fixture(scope="module")
def small():
    g = torch.Generator().manual_seed(0)
    img = torch.rand(2, 3, 128, 160, generator=g) * 0.2 + 0.8
    img[:, :, 40:50, 20:140] = 0.1                             # a line of "text"
    return build_pyramid(img)


def test_a_batch_is_read_page_by_page(small, monkeypatch):
    """A batch of two pages equals each page run alone (images loop; tokens do not)."""
    line = _lines(("TOTAL", (20, 40, 50, 50)), ("9.90", (120, 40, 140, 50)))
    monkeypatch.setattr(reading, "read_view", lambda view: line)
    kw = dict(query="What is the total?", localiser="uniform")
    both = reading_parts(small, 48, **kw)
    assert both.paths == ("read", "read") and both.tokens.batch_size == 2
    for i in range(2):
        one = reading_parts(build_pyramid(small.base[i:i + 1]), 48, **kw)
        assert torch.allclose(both.tokens[i].centers, one.tokens.centers)
        assert torch.equal(both.tokens[i].levels, one.tokens.levels)
        assert bool(one.tokens.is_distinct()[0])


def test_the_smallest_budget_reads_the_gist_alone(small, monkeypatch):
    monkeypatch.setattr(reading, "read_view", _no_ocr)
    one = build_pyramid(small.base[:1])
    low = reading_parts(one, 5, localiser="uniform")        # gist of 4 + one token
    assert low.tokens.budget == 5 and bool(low.tokens.is_distinct()[0])
    assert sorted(low.tokens.stage[0].tolist()) == [0, 0, 0, 0, STAGE_SECOND]
    assert split_budget(5, 4, 0.5) == (0, 1) and split_budget(20, 4, 0.5) == (6, 10)
    assert split_budget(20, 4, 0.01) == (1, 15) and split_budget(20, 4, 0.99) == (15, 1)


def test_a_glance_whose_gist_grid_falls_short_of_its_budget_still_reads(monkeypatch):
    """A large gist (a glance at most of N) whose grid holds fewer cells than its budget:
    fixation 1 still gets more than the nominal gist budget (the cascade counts the gist at
    it), and the tokens are exactly N, all distinct."""
    from fovea_core.allocators.grid import resize_grid

    monkeypatch.setattr(reading, "read_view", _no_ocr)
    img = torch.rand(1, 3, 348, 348, generator=torch.Generator().manual_seed(1)) * 0.2 + 0.8
    pyr = build_pyramid(img)
    r, c, _ = resize_grid((348, 348), 177, 16)
    assert r * c < 177                                       # the case: 13 x 13 = 169 cells
    out = reading_parts(pyr, 273, gist_budget=177, first_share=0.65, localiser="uniform")
    assert out.tokens.budget == 273 and bool(out.tokens.is_distinct()[0])
    assert int((out.tokens.stage[0] != STAGE_SECOND).sum()) >= 178


def _sure_or_flat(g, query):
    """A localiser sure of one cell on a dark page (mean below 0.7) and flat on a light one."""
    gh, gw = (math.ceil(s / 16) for s in g.image_size)
    dark = g.image.mean(dim=(1, 2, 3)) < 0.7                          # [B]
    one = torch.zeros(gh, gw)
    one[2, 3] = 1.0
    return torch.where(dark[:, None, None], one, torch.ones(gh, gw))


def test_the_glance_rule_glances_where_the_map_is_unsure(small, monkeypatch):
    """``glance_below``: a sure map keeps the gist and a first fovea (the plain call's
    tokens); an unsure one spends fixation 1 on a glance (a gist of ``round(glance_share *
    N)``); a mixed batch gives each image what it gets alone; exactly N tokens each."""
    line = _lines(("TOTAL", (20, 40, 50, 50)), ("9.90", (120, 40, 140, 50)))
    monkeypatch.setattr(reading, "read_view", lambda view: line)
    dark = small.base.clone()
    dark[1, :, 60:128] = 0.1                                      # page 1 is dark: a sure map
    pyr = build_pyramid(dark)
    one = [build_pyramid(dark[i:i + 1]) for i in range(2)]
    kw = dict(query="What is the total?", localiser=_sure_or_flat)
    rule = dict(kw, glance_below=0.5, glance_share=0.6)
    light, sure = (reading_parts(p, 48, **rule) for p in one)
    assert torch.equal(sure.tokens.centers, reading_parts(one[1], 48, **kw).tokens.centers)
    glance = reading_parts(one[0], 48, **dict(kw, gist_budget=29))
    assert torch.equal(light.tokens.centers, glance.tokens.centers)
    assert light.gist.budget > sure.gist.budget
    assert int((light.tokens.stage[0] == 0).sum()) == glance.gist.budget
    never = reading_parts(one[0], 48, **dict(rule, glance_below=0.0))
    assert torch.equal(never.tokens.centers, reading_parts(one[0], 48, **kw).tokens.centers)
    both = reading_parts(pyr, 48, **rule)
    assert both.first is None and both.tokens.budget == 48
    for i, alone in enumerate((light, sure)):
        assert torch.equal(both.tokens[i].centers, alone.tokens.centers)
        assert bool(both.tokens.is_distinct()[i])
    assert both.paths == ("read", "read")


def test_the_glance_rule_checks_its_arguments(small):
    one = build_pyramid(small.base[:1])
    for bad in (-0.1, 1.5, "0.5", None, float("nan")):
        with pytest.raises(ValueError, match="glance_below"):
            reading_parts(one, 48, localiser="uniform", glance_below=bad, glance_share=0.6)
    for bad in (0.0, 1.0, None, "0.5", float("nan")):
        with pytest.raises(ValueError, match="glance_share"):
            reading_parts(one, 48, localiser="uniform", glance_below=0.5, glance_share=bad)
    # a glance no finer than the gist (0.05 * 48 tokens) is no glance: the gist path
    tiny = reading_parts(one, 48, localiser="uniform", glance_below=1.0, glance_share=0.05)
    never = reading_parts(one, 48, localiser="uniform", glance_below=0.0, glance_share=0.6)
    assert torch.equal(tiny.tokens.centers, never.tokens.centers)


def test_bad_arguments_name_the_argument(small):
    one = build_pyramid(small.base[:1])
    for bad in (0, 1, 1.5, -0.2, float("nan"), "0.5", True):
        with pytest.raises(ValueError, match="first_share"):
            reading_parts(one, 48, first_share=bad, localiser="uniform")
    for budget in (4, 3, 0, 10_000):                         # no token after the gist of 4
        with pytest.raises(ValueError, match="budget"):
            reading_parts(one, budget, localiser="uniform")
    with pytest.raises(ValueError, match="budget.*two fixations"):
        split_budget(4, 4, 0.5)
    with pytest.raises(ValueError, match="side"):
        reading_parts(one, 48, localiser="uniform", side="text")


# ----------------------------------------------------------------------------- registry
def test_it_is_registered_listed_and_budgeted(small):
    from fovea_core.cost import alloc_read_tokens, side_compute, uses_scores
    from fovea_core.foveation import method_names
    from fovea_core.methods import ALLOCATORS, INFO, allocate

    assert NAME == "cascade_read" and NAME in ALLOCATORS and NAME in method_names()
    info = INFO[NAME]
    assert info["family"] == "cascade" and info["kind"] == "fixed"
    assert not uses_scores(NAME) and not side_compute(NAME)
    assert alloc_read_tokens(NAME, small) == 0 and info["reads"](small) == 0
    t = allocate(NAME, small, None, 40, localiser="uniform")  # no question: no reading
    assert t.budget == 40 and bool(t.is_distinct().all())
    assert set(t.stage.unique().tolist()) == {0, 1, STAGE_SECOND}
    assert reading.FIRST_SHARE == reading.load_fitted()[1]       # the fitted share


@pytest.mark.parametrize("size", [(128, 128), (96, 160), (200, 136)])
def test_the_allocator_contract_from_the_smallest_to_the_largest_budget(size):
    """As ``tests/test_allocators.py`` holds every method: exactly N distinct tokens in the
    page, the same for any score map and on a second run, at the cascade's smallest budget
    (its gist plus one token), a middle one and every level-0 cell (no question; the
    localiser is the gist's ink, a map with structure that loads no network)."""
    from fovea_core.cascade.allocator import budget_range
    from fovea_core.cascade.core import gist_to_grid
    from fovea_core.methods import allocate

    def ink(g, query):
        return gist_to_grid(1 - g.image.mean(1), g, mode="mean")

    g = torch.Generator().manual_seed(size[0])
    pyr = build_pyramid(torch.rand(2, 3, *size, generator=g))
    lo, hi = budget_range(size, num_levels=pyr.num_levels)
    gh, gw = pyr.grid_shape(16, 0)
    for n in (lo, (lo + hi) // 2, hi):
        t = allocate(NAME, pyr, torch.rand(2, gh, gw, generator=g), n, localiser=ink)
        assert t.budget == n and bool(t.is_distinct().all()), n
        assert bool((t.levels >= 0).all()) and float(t.levels.max()) <= pyr.num_levels - 1
        again = allocate(NAME, pyr, torch.rand(2, gh, gw, generator=g), n, localiser=ink)
        assert torch.equal(t.centers, again.centers) and torch.equal(t.levels, again.levels)


def test_foveate_accepts_the_read_cascades_own_options_and_only_for_it():
    from fovea_core.foveation import _accepted_options

    assert {"first_share", "geometry", "glance_below", "glance_share"} <= set(
        _accepted_options("cascade_read"))
    assert not {"first_share", "geometry"} & set(_accepted_options("cascade"))
    # the one-fixation cascade's switches to resize are its own; the rest is shared
    one_look = {"resize_within", "resize_below", "resize_legible"}
    assert not one_look & set(_accepted_options("cascade_read"))
    assert set(_accepted_options("cascade")) - one_look < set(_accepted_options("cascade_read"))


def test_a_glance_is_rendered_once_for_the_questions_of_a_page(small, monkeypatch):
    """The view of fixation 1 is kept on the pyramid: a glance (the same tokens for every
    question) is rendered once per page, and the view it gives is the one a fresh render
    gives; other tokens or another pyramid render again."""
    from fovea_core import sample

    renders = []
    real = sample.render
    monkeypatch.setattr(sample, "render", lambda *a, **k: renders.append(1) or real(*a, **k))
    monkeypatch.setattr(reading, "read_view", lambda view: _lines())
    one = build_pyramid(small.base[:1])
    rule = dict(localiser="uniform", glance_below=1.0, glance_share=0.6)
    a = reading_parts(one, 48, query="What is the total?", **rule)
    n = len(renders)
    b = reading_parts(one, 48, query="What is the date?", **rule)
    assert len(renders) == n                                   # the same glance: no render
    assert torch.equal(a.first.tokens.centers, b.first.tokens.centers)
    tok = a.first.tokens
    kept = reading.first_view(one, tok)
    assert len(renders) == n
    fresh = reading.first_view(build_pyramid(small.base[:1]), tok)      # another pyramid
    assert len(renders) == n + 1 and torch.equal(kept, fresh)
    other = reading.first_view(one, reading_parts(one, 48, query="What is the total?",
                                                  localiser="uniform").first.tokens)
    assert len(renders) > n + 1 and other.shape == kept.shape


# ----------------------------------------------------------------------------- the default
def test_cascade_glance_is_the_read_cascade_under_the_fitted_glance_rule(page, monkeypatch):
    """``foveate``'s default: ``cascade_read`` with ``glance_below``/``glance_share`` the
    package's pair (an override reaches it), exactly N tokens, the second look stage 2."""
    from fovea_core.foveation import DEFAULT_METHOD
    from fovea_core.methods import allocate

    doc, pyr, loc, _ = page
    monkeypatch.setattr(reading, "read_view", lambda view: _lines())
    assert DEFAULT_METHOD == reading.GLANCE_NAME == "cascade_glance"
    got = allocate("cascade_glance", pyr, None, N, query=QUESTION)
    want = reading_parts(pyr, N, query=QUESTION, localiser="learned",
                         glance_below=reading.GLANCE_BELOW, glance_share=reading.GLANCE_SHARE)
    assert got.budget == N and torch.equal(got.centers, want.tokens.centers)
    assert torch.equal(got.levels, want.tokens.levels)
    assert int((got.stage[0] == 0).sum()) > 0.8 * N and STAGE_SECOND in got.stage[0].tolist()
    other = allocate("cascade_glance", pyr, None, N, query=QUESTION, glance_share=0.6)
    assert int((other.stage[0] == 0).sum()) < int((got.stage[0] == 0).sum())


@pytest.mark.parametrize("budget", [5, 12, 40])
def test_the_glance_rule_runs_at_every_budget_of_the_cascades_range(small, budget, monkeypatch):
    """A budget too small for a glance finer than the gist (5: the glance would be the
    gist's 4 tokens) takes the gist path; one whose glance would leave no second look (12:
    round(0.9 * 12) = 11) glances at N - 2; exactly N tokens either way."""
    from fovea_core.cascade.allocator import budget_range, gist_budget_for

    monkeypatch.setattr(reading, "read_view", lambda view: _lines())
    one = build_pyramid(small.base[:1])
    lo, hi = budget_range(one.image_size)
    assert lo <= budget <= hi
    kw = dict(localiser="uniform", glance_below=1.0, glance_share=0.9)
    got = reading_parts(one, budget, query="What is the total?", **kw)
    assert got.tokens.budget == budget and bool(got.tokens.is_distinct()[0])
    gist_n = int((got.tokens.stage[0] == 0).sum())
    if budget == 5:                                        # no glance: the default gist
        assert gist_n <= gist_budget_for(budget)
    else:                                                  # a glance of at most N - 2
        assert gist_budget_for(budget) < gist_n <= budget - 2


# ----------------------------------------------------------------------------- one rule, one check
def test_a_default_foveate_call_checks_its_budget_once(monkeypatch):
    """``check_budget`` (the one budget check) runs once in a default ``foveate`` call, a
    question included: ``foveate`` checks the budget for the page, and the cascade it runs
    (``cascade_glance``: the glance rule, fixation 1's cascade, the read and the second
    look) takes it as checked."""
    import sys

    from fovea_core.allocators import base
    from fovea_core.foveation import foveate

    calls = []
    real = base.check_budget

    def counted(*a, **k):
        calls.append(a[0] if a else k.get("budget"))
        return real(*a, **k)

    for mod in list(sys.modules.values()):        # every module that holds the name
        if getattr(mod, "__name__", "").startswith("fovea_core") and \
                getattr(mod, "check_budget", None) is real:
            monkeypatch.setattr(mod, "check_budget", counted)
    monkeypatch.setattr(reading, "read_view", lambda view: _lines(
        ("TOTAL", (20, 40, 50, 50)), ("9.90", (120, 40, 140, 50))))
    img = torch.rand(1, 3, 256, 320, generator=torch.Generator().manual_seed(3)) * 0.2 + 0.8
    img[:, :, 40:50, 20:140] = 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f = foveate(img, "What is the total?", budget=200)
    assert f.method == "cascade_glance" and f.tokens.budget == 200
    assert calls == [200]
    calls.clear()                                  # and once in a direct call of the cascade
    reading_parts(build_pyramid(img), 200, query="What is the total?", localiser="uniform",
                  glance_below=0.5, glance_share=0.9)
    assert calls == [200]


def test_one_rule_discounts_what_fixation_one_read():
    """``discount_seen``: the cells under earlier tokens at most ``LEVEL_TOLERANCE`` coarser
    than the later level keep ``weight`` of their mass (default ``SEEN_WEIGHT``, none); the
    processor's second-fixation map applies the same rule, to the same cells."""
    from fovea_core.cascade.core import (LEVEL_TOLERANCE, SEEN_WEIGHT, discount_seen,
                                         place_fovea)
    from fovea_core.vlm.processor import SecondFixationMap

    size = (128, 128)
    fine = place_fovea(torch.ones(1, 8, 8), 4, image_size=size, level=1.0)      # 4 cells
    coarse = TokenSet(torch.tensor([[[0.9, 0.9]]]), torch.tensor([[2.0]]), torch.ones(1, 1),
                      fine.fixations, size, 16, torch.ones(1, 1, dtype=torch.long))
    seen = TokenSet(torch.cat([fine.centers, coarse.centers], 1),
                    torch.cat([fine.levels, coarse.levels], 1),
                    torch.cat([fine.scores, coarse.scores], 1), fine.fixations, size, 16,
                    torch.cat([fine.stage, coarse.stage], 1))
    m = torch.ones(1, 8, 8)
    cov_fine = covered_share(fine, (8, 8))
    out = discount_seen(m, seen, 1.0)                      # the coarse token is not "read"
    assert SEEN_WEIGHT == 0.0 and torch.equal(out, m * (1 - cov_fine))
    assert float(out.sum()) == 64 - 16
    out2 = discount_seen(m, seen, 2.0 - LEVEL_TOLERANCE)   # now it counts as read too
    assert float(out2.sum()) < float(out.sum())
    half = discount_seen(m, seen, 1.0, weight=0.5)
    assert torch.allclose(half, m * (1 - 0.5 * cov_fine))
    assert discount_seen(m, seen, 1.0, weight=1.0) is m

    class G:                                               # what SecondFixationMap reads of a gist
        image_size, patch = size, 16
        tokens = fine

    loc = SecondFixationMap(None, lambda g, q: torch.ones(1, 8, 8), seen=seen)
    assert torch.equal(loc(G(), None), out)                # its level: the seen tokens' finest
