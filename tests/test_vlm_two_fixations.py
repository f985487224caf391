"""Mechanics of ``FoveatedProcessor.two_fixations`` (look with the cascade, ask the model for
the answer's box, look there; answer on the tokens of both looks) with the random-weight
Qwen-VL models of ``fovea_book.qwen_models``, for every family the installed transformers has.

Random weights: the model's grounding reply is noise, so these tests check mechanics only
(token counts, positions, logits, the box parser, the fallback, and where a given box sends
fixation 2). Whether two fixations answer better than one cannot be measured here: that
needs a pretrained checkpoint and the book's evaluation.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from fovea_core.foveation import FoveateWarning, foveate
from fovea_core.vlm.processor import (GROUNDING_COORDS, GROUNDING_PROMPTS, SUPPORTED_PROCESSORS,
                                      FoveatedProcessor, GroundingBox, SecondFixationMap,
                                      parse_grounding_box)
from fovea_book.qwen_models import build_qwen, has_family
from test_vlm_processor import _page

FAMILIES = [f for f in SUPPORTED_PROCESSORS if has_family(f)]
QUESTION = "What is the total?"
GRID, N = 12, 64                        # a 12 x 12 merged grid, N = 64: N1 = N2 = 32
#: a box over the page's lower right, as shares of (x1, y1, x2, y2)
BOX = (0.55, 0.55, 0.95, 0.95)


@pytest.fixture(scope="module", params=FAMILIES)
def setup(request):
    family = request.param
    model = build_qwen(f"{family}-tiny", seed=0)
    fp = FoveatedProcessor.from_model(model)
    return family, model, fp, _page(GRID, GRID, fp.cell_px, seed=1)


@pytest.fixture(scope="module")
def garbage(setup):
    """One real run per family: the random model's reply, kept with its logits."""
    family, model, fp, page = setup
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FoveateWarning)
        return fp.two_fixations(model, page, QUESTION, budget=N, max_new_tokens=6,
                                generate_kwargs={"output_logits": True,
                                                 "return_dict_in_generate": True})


def _replying(fp, text: str):
    """A stand-in for ``model.generate`` that replies ``text`` (through the tokenizer)."""
    def generate(**kw):
        reply = fp.processor.tokenizer(text, return_tensors="pt")["input_ids"]
        return torch.cat([kw["input_ids"], reply], 1)
    return generate


def _box_reply(family: str, side: int) -> tuple[str, tuple[float, ...]]:
    """A reply in the family's convention placing :data:`BOX` on a page of ``side`` px, and
    the box in pixels."""
    px = tuple(v * side for v in BOX)
    if GROUNDING_COORDS[family] == "absolute":
        return '```json [{"bbox_2d": [%d, %d, %d, %d], "label": "total"}] ```' % px, \
            tuple(float(int(v)) for v in px)
    k = tuple(round(v * 1000) for v in BOX)
    return "<|box_start|>(%d,%d),(%d,%d)<|box_end|>" % k, tuple(v * side / 1000 for v in k)


def _inside(tokens, box, pad: float = 0.0) -> torch.Tensor:
    c = tokens.centers_px()[0]
    x1, y1, x2, y2 = box
    return ((c[:, 0] >= x1 - pad) & (c[:, 0] <= x2 + pad) & (c[:, 1] >= y1 - pad)
            & (c[:, 1] <= y2 + pad))


def _image_positions(inputs, image_token_id: int) -> list[tuple[int, int, int]]:
    """The (t, h, w) ids of the image tokens, relative to the image's start, sorted."""
    is_img = inputs["input_ids"][0] == image_token_id
    s = int(is_img.nonzero()[0])
    pos = inputs["position_ids"][:, 0, is_img] - s
    return sorted(map(tuple, pos.T.tolist()))


# ----------------------------------------------------------------------------- counts, positions
def test_exact_token_counts_and_positions(setup, garbage):
    family, model, fp, page = setup
    res = garbage
    c = res.counts
    assert (c.first, c.second, c.total) == (N // 2, N - N // 2, N)
    assert c.first + c.second == c.total == res.inputs.foveation.budget
    assert res.first.budget == c.first and res.second.budget == c.second
    img = fp.image_token_id
    assert int((res.inputs["input_ids"] == img).sum()) == N
    assert int((res.first_inputs["input_ids"] == img).sum()) == c.first
    assert res.inputs["pixel_values"].shape[0] == 4 * N
    assert int((res.inputs["image_grid_thw"].prod(-1) // 4).sum()) == N
    s2 = res.inputs["input_ids"].shape[1]
    assert res.inputs["position_ids"].shape == (3, 1, s2)
    assert res.inputs["position_ids"].dtype == torch.int64
    assert c.prefill_image_tokens == c.first + N
    assert c.prefill_tokens == res.first_inputs["input_ids"].shape[1] + s2
    new = res.output.sequences.shape[1] - res.first_inputs["input_ids"].shape[1]
    assert c.reply_tokens == new >= 1
    # stages: fixation 1's gist (0) and fovea (1), fixation 2 (2), and fixation 2 has no gist
    st = res.inputs.foveation.tokens.stage[0]
    assert int((st == 2).sum()) == c.second and int((st == 0).sum()) >= 1
    assert bool((res.second.tokens.stage != 0).all())

    # the single-fixation path on the same TokenSet gives the same inputs, bit for bit
    single = fp.encode(res.inputs.foveation, QUESTION)
    for k in ("input_ids", "attention_mask", "mm_token_type_ids", "pixel_values",
              "image_grid_thw", "position_ids"):
        assert torch.equal(single[k], res.inputs[k]), k
    # each fixation keeps the ids it has in a prompt of its own (relative to the image start)
    alone = (_image_positions(fp.encode(res.first, QUESTION), img)
             + _image_positions(fp.encode(res.second, QUESTION), img))
    assert _image_positions(res.inputs, img) == sorted(alone)
    # and, independently of mrope_positions: (0, row, col) of the cell under each centre
    c = res.inputs.foveation.tokens.centers[0]
    cells = torch.stack([torch.zeros(N), (c[:, 1] * GRID).floor(), (c[:, 0] * GRID).floor()], 1)
    assert _image_positions(res.inputs, img) == sorted(map(tuple, cells.long().tolist()))
    assert _image_positions(res.first_inputs, img) == _image_positions(
        fp.encode(res.first, QUESTION), img)
    # the text after the image continues at s + max(Hm, Wm), as for the whole page
    ids = res.inputs["input_ids"][0]
    s = int((ids == img).nonzero()[0])
    after = res.inputs["position_ids"][:, 0, s + N:]
    assert torch.equal(after, (s + GRID + torch.arange(after.shape[1])).expand(3, -1))


def test_first_step_logits_are_the_plain_forward(setup, garbage):
    family, model, fp, page = setup
    res = garbage
    with torch.no_grad():
        last = model(**res.first_inputs).logits[:, -1]
        model.model.rope_deltas = None
        answer_last = model(**res.inputs).logits[:, -1]
        model.model.rope_deltas = None
        plain = dict(res.inputs, position_ids=torch.arange(
            res.inputs["input_ids"].shape[1]).expand(3, 1, -1))
        answer_plain = model(**plain).logits[:, -1]
        model.model.rope_deltas = None
    torch.testing.assert_close(res.output.logits[0], last, rtol=1e-5, atol=1e-5)
    out = model.generate(**res.inputs, max_new_tokens=1, do_sample=False, output_logits=True,
                         return_dict_in_generate=True)
    model.model.rope_deltas = None
    torch.testing.assert_close(out.logits[0], answer_last, rtol=1e-5, atol=1e-5)
    assert not torch.equal(answer_last, answer_plain)         # the positions reach the model


# ----------------------------------------------------------------------------- the parser
H, W = 300, 400
PARSE_TABLE = [
    # reply, coords, box (pixels) or None, reason, form
    ('{"bbox_2d": [10, 20, 110, 220]}', "absolute", (10, 20, 110, 220), None, "bbox_2d"),
    ('```json\n[\n  {"bbox_2d": [10, 20, 110, 220], "label": "9.00"}\n]\n```', "absolute",
     (10, 20, 110, 220), None, "bbox_2d"),
    ("The total is here: [10, 20, 110, 220].", "absolute", (10, 20, 110, 220), None, "list"),
    ("[10.5, 20.25, 1.1e2, 220]", "absolute", (10.5, 20.25, 110, 220), None, "list"),
    ("(10,20),(110,220)", "absolute", (10, 20, 110, 220), None, "corner pairs"),
    ("<|object_ref_start|>total<|object_ref_end|><|box_start|>(10,20),(110,220)<|box_end|>",
     "absolute", (10, 20, 110, 220), None, "box tokens"),
    ("<|box_start|>(100,100),(500,500)<|box_end|><|im_end|>", "relative-1000",
     (40, 30, 200, 150), None, "box tokens"),
    ('{"bbox_2d": [250, 500, 750, 1000]}', "relative-1000", (100, 150, 300, 300), None,
     "bbox_2d"),
    ("[110, 220, 10, 20]", "absolute", (10, 20, 110, 220), None, "list"),      # reversed
    ("(110,20),(10,220)", "absolute", (10, 20, 110, 220), None, "corner pairs"),
    ("[-50, 250, 100, 400]", "absolute", (0, 250, 100, 300), None, "list"),    # clipped
    ("[500, 310, 600, 400] then [10, 20, 30, 40]", "absolute", (10, 20, 30, 40), None, "list"),
    ("x7#Q]]{(bbox", "absolute", None, "no box in the reply", None),           # garbage
    ("", "absolute", None, "no box in the reply", None),
    (None, "absolute", None, "no box in the reply", None),
    ("[1, 2, 3]", "absolute", None, "no box in the reply", None),
    ('{"bbox_2d": [NaN, 20, 110, 220]}', "absolute", None, "not finite", "bbox_2d"),
    ("[10, 20, inf, 220]", "absolute", None, "not finite", "list"),
    ("[10, 20, 10, 220]", "absolute", None, "degenerate", "list"),
    ("[10, 20, 10.5, 220]", "absolute", None, "degenerate", "list"),
    ("[500, 310, 600, 400]", "absolute", None, "outside the page", "list"),    # out of page
    ("<|box_start|>(1100,100),(1500,500)<|box_end|>", "relative-1000", None,
     "outside the page", "box tokens"),
]


@pytest.mark.parametrize("reply,coords,box,reason,form", PARSE_TABLE,
                         ids=[f"{i}" for i in range(len(PARSE_TABLE))])
def test_parse_grounding_box(reply, coords, box, reason, form):
    got = parse_grounding_box(reply, (H, W), coords)
    assert isinstance(got, GroundingBox)
    assert got.reason == reason and got.form == form
    if box is None:
        assert got.box is None
    else:
        assert got.box == pytest.approx(box)
        x1, y1, x2, y2 = got.box
        assert 0 <= x1 < x2 <= W and 0 <= y1 < y2 <= H


def test_parse_grounding_box_refuses_an_unknown_convention():
    with pytest.raises(ValueError, match="coords"):
        parse_grounding_box("[1, 2, 3, 4]", (H, W), "relative-1")


# ----------------------------------------------------------------------------- the two paths
def test_a_garbage_reply_falls_back_to_the_cascades_own_localiser(setup, garbage, monkeypatch):
    family, model, fp, page = setup
    res = garbage
    new = res.output.sequences[0, res.first_inputs["input_ids"].shape[1]:]
    assert res.reply == fp.processor.tokenizer.decode(new, skip_special_tokens=False)
    assert parse_grounding_box(res.reply, res.first.tokens.image_size,
                               GROUNDING_COORDS[family]).box is None
    assert res.path == "fallback" and res.box is None
    assert res.fallback_reason == res.grounding.reason and res.fallback_reason is not None
    loc = res.second.options["localiser"]
    assert isinstance(loc, SecondFixationMap) and loc.box is None and loc.fallback == "learned"
    # with the map undiscounted, fixation 2 is the plain cascade's fovea on fixation 1's gist
    monkeypatch.setattr(model, "generate", lambda **kw: res.output.sequences)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FoveateWarning)
        raw = fp.two_fixations(model, page, QUESTION, budget=N, seen_weight=1.0)
        g1 = int((res.first.tokens.stage == 0).sum())
        plain = foveate(fp.resized_page(page), QUESTION, budget=N - N // 2 + g1,
                        method="cascade", patch=fp.cell_px, gist_budget=g1)
    fovea = plain.tokens.stage[0] != 0
    assert raw.path == "fallback"
    assert torch.equal(raw.second.tokens.centers, plain.tokens.centers[:, fovea])
    assert torch.equal(raw.second.tokens.levels, plain.tokens.levels[:, fovea])
    assert torch.equal(raw.second.patches, plain.patches[:, fovea])
    assert torch.equal(raw.first.tokens.centers, res.first.tokens.centers)
    # the default discount moves fixation 2 off what fixation 1 already read finely
    assert res.counts.repeated < raw.counts.repeated


def test_a_box_in_the_reply_sends_fixation_2_there(setup, garbage, monkeypatch):
    family, model, fp, page = setup
    side = GRID * fp.cell_px
    reply, want = _box_reply(family, side)
    monkeypatch.setattr(model, "generate", _replying(fp, reply))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FoveateWarning)
        res = fp.two_fixations(model, page, QUESTION, budget=N)
    assert res.path == "box" and res.fallback_reason is None
    assert res.reply == reply                             # the character tokenizer round-trips
    assert res.box == pytest.approx(want)
    assert res.second.options["localiser"].box == pytest.approx(want)
    # fixation 1 does not depend on the reply; the answer still holds exactly N image tokens
    assert torch.equal(res.first.tokens.centers, garbage.first.tokens.centers)
    assert int((res.inputs["input_ids"] == fp.image_token_id).sum()) == N
    t2 = res.second.tokens
    finest = t2.levels[0] <= t2.levels[0].min() + 0.25
    # every fine token is on the box or within the cascade's context window of it (a cell
    # borrows priority from 1 row, 2 columns around: cascade(context=(1, 2)))
    x1, y1, x2, y2 = res.box
    c, side = t2.centers_px()[0][finest], t2.footprint()[0][finest]
    assert bool(((c[:, 0] > x1 - 2.5 * side) & (c[:, 0] < x2 + 2.5 * side)
                 & (c[:, 1] > y1 - 1.5 * side) & (c[:, 1] < y2 + 1.5 * side)).all())
    assert float(_inside(t2, res.box)[finest].float().mean()) >= 0.75
    share = float(_inside(t2, res.box, pad=fp.cell_px).float().mean())
    before = float(_inside(garbage.second.tokens, res.box, pad=fp.cell_px).float().mean())
    box_area = (BOX[2] - BOX[0]) * (BOX[3] - BOX[1])
    assert share >= 0.6 > 2 * box_area and share >= before + 0.2, (share, before)


# ----------------------------------------------------------------------------- prompts, errors
TEMPLATE = ("{% for m in messages %}<|u|>{% for c in m['content'] %}{% if c['type'] == 'image' %}"
            "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}"
            "{% endfor %}{% endfor %}{% if add_generation_prompt %}<|a|>{% endif %}")


def test_prompts_and_the_chat_template(setup, garbage, monkeypatch):
    family, model, fp, page = setup
    tok = fp.processor.tokenizer
    monkeypatch.setattr(model, "generate", _replying(fp, "no box"))
    warnings.simplefilter("ignore", FoveateWarning)       # restored by pytest after the test
    # default: no template on the offline processor, the image first, then the prompt
    assert tok.decode(garbage.first_inputs["input_ids"][0], skip_special_tokens=True) \
        == GROUNDING_PROMPTS[family].replace("{question}", QUESTION)
    assert tok.decode(garbage.inputs["input_ids"][0], skip_special_tokens=True) == QUESTION
    res = fp.two_fixations(model, page, QUESTION, budget=N, grounding_prompt="Where? {question}",
                           answer_prompt="Q: {question} A:")
    assert tok.decode(res.first_inputs["input_ids"][0], skip_special_tokens=True) \
        .endswith("Where? " + QUESTION)
    assert tok.decode(res.inputs["input_ids"][0], skip_special_tokens=True) \
        .endswith(f"Q: {QUESTION} A:")
    assert res.path == "fallback" and res.fallback_reason == "no box in the reply"
    with pytest.raises(ValueError, match="no chat template"):
        fp.two_fixations(model, page, QUESTION, budget=N, chat=True)
    monkeypatch.setattr(fp.processor, "chat_template", TEMPLATE, raising=False)
    res = fp.two_fixations(model, page, QUESTION, budget=N, answer_prompt="{question}")
    full = tok.decode(res.inputs["input_ids"][0], skip_special_tokens=False)
    assert full.startswith("<|u|><|vision_start|>") and full.endswith(QUESTION + "<|a|>")
    assert int((res.inputs["input_ids"] == fp.image_token_id).sum()) == N
    assert fp._chat("Q", False) == "Q" and fp._chat("Q", None).startswith("<|u|>")


@pytest.mark.parametrize("kw,match", [
    (dict(budget=1), "budget must be an int"),
    (dict(budget=GRID * GRID + 1), r"budget must be in \[\d+, 144\] on this page"),
    (dict(budget=2), r"budget must be in \[\d+, 144\] on this page .*fixation 1, N1 = "
                     r"round\(0\.5 N\) tokens, is a cascade, which needs \d+ to 144"),
    (dict(method="cascade_glance"),
     r"registered cascade of one fixation .*'cascade_glance' reads the page"),
    (dict(method="cascade_read"), r"registered cascade of one fixation"),
    (dict(question="What\ud800?"), r"question must be valid Unicode text"),
    (dict(first_budget=0), "first_budget"),
    (dict(first_budget=N), "first_budget"),
    (dict(method="resize"), "registered cascade"),
    (dict(seen_weight=-0.1), "seen_weight"),
    (dict(seen_weight=1.5), "seen_weight"),
    (dict(patch=16), "patch is fixed"),
    (dict(question=""), "question"),
])
def test_bad_arguments_raise_before_the_model_runs(setup, kw, match, monkeypatch):
    family, model, fp, page = setup

    def refuse(**_):
        raise AssertionError("generate ran")
    monkeypatch.setattr(model, "generate", refuse)
    args = {"budget": N, "question": QUESTION} | kw
    question = args.pop("question")
    with pytest.raises(ValueError, match=match):
        fp.two_fixations(model, page, question, **args)


def test_the_budget_range_in_the_message_is_the_one_that_runs(setup, monkeypatch):
    """The smallest N the message gives runs (fixation 1 at round(N / 2) inside the
    cascade's range); one less is refused, before the model runs, with that range."""
    import re

    family, model, fp, page = setup
    with pytest.raises(ValueError) as info:
        fp.two_fixations(model, page, QUESTION, budget=2)
    low = int(re.search(r"budget must be in \[(\d+), 144\]", str(info.value)).group(1))
    monkeypatch.setattr(model, "generate", _replying(fp, "no box"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FoveateWarning)
        res = fp.two_fixations(model, page, QUESTION, budget=low, max_new_tokens=2)
        assert res.counts.total == low
        with pytest.raises(ValueError, match=rf"budget must be in \[{low}, 144\]"):
            fp.two_fixations(model, page, QUESTION, budget=low - 1)


def test_a_model_that_is_not_one_is_refused_before_fixation_1(setup, monkeypatch):
    family, model, fp, page = setup
    monkeypatch.setattr(fp, "_foveate", lambda *a, **k: pytest.fail("fixation 1 ran"))
    for bad in (None, "qwen2-vl-tiny", object()):
        with pytest.raises(TypeError, match=r"^model must be a Qwen-VL "
                                            rf"\.\.\.ForConditionalGeneration .*\({family}\)"):
            fp.two_fixations(bad, page, QUESTION, budget=N)


@pytest.mark.skipif(len(FAMILIES) < 2, reason="needs two Qwen-VL families in transformers")
def test_a_model_of_another_family_is_refused(setup, monkeypatch):
    """A Qwen2.5-VL model with a Qwen2-VL processor: another patch size and another box
    convention, so its boxes would be read in the wrong coordinates."""
    family, model, fp, page = setup
    other = next(f for f in FAMILIES if f != family)
    wrong = build_qwen(f"{other}-tiny")
    monkeypatch.setattr(wrong, "generate", lambda **_: pytest.fail("generate ran"))
    with pytest.raises(ValueError, match=rf"^model: a {re.escape(other)} model with a "
                                         rf"{re.escape(family)} processor"):
        fp.two_fixations(wrong, page, QUESTION, budget=N)
