"""End-to-end tests of fovea_core.vlm.processor.FoveatedProcessor with the random-weight Qwen-VL
models of fovea_book.qwen_models, for every family the installed transformers has.

The stock reference is the family's own ``transformers`` processor (``stock_processor``: the
PIL image processor and an offline character tokenizer with the tiny configs' token ids).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from fovea_core.foveation import DEFAULT_METHOD, FoveateWarning
from fovea_core.vlm.positions import merged_cell_px
from fovea_core.vlm.processor import (SUPPORTED_PROCESSORS, FoveatedProcessor, processor_family,
                                      stock_processor)
from fovea_book.qwen_models import build_qwen, has_family
from fovea_core.vlm.qwen import pixel_values

FAMILIES = [f for f in SUPPORTED_PROCESSORS if has_family(f)]
QUESTION = "What is the total?"
KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_grid_thw")


def _page(hm: int, wm: int, f: int, seed: int = 0,
          extra: tuple[int, int] = (0, 0)) -> np.ndarray:
    """A random 8-bit RGB page of (hm * f + extra[0]) x (wm * f + extra[1]) pixels."""
    rng = np.random.default_rng(seed)
    h, w = hm * f + extra[0], wm * f + extra[1]
    page = np.full((h, w, 3), 235, np.uint8)
    page[rng.random((h, w)) < 0.15] = 20                       # sparse dark "ink"
    page[h // 3:h // 3 + f // 2, w // 5:w // 2] = rng.integers(0, 255, (f // 2, w // 2 - w // 5, 3))
    return page


def _stock(fp: FoveatedProcessor, page: np.ndarray, text: str):
    prompt = f"<|vision_start|><|image_pad|><|vision_end|>{text}"
    return fp.processor(images=[page], text=[prompt], return_tensors="pt")


def _rope(model, inputs) -> torch.Tensor:
    pos, _ = model.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                        image_grid_thw=inputs["image_grid_thw"])
    model.model.rope_deltas = None
    return pos


@pytest.fixture(scope="module", params=FAMILIES)
def family_setup(request):
    family = request.param
    model = build_qwen(f"{family}-tiny", seed=0)
    return family, model, FoveatedProcessor.from_model(model)


# ----------------------------------------------------------------------------- every patch kept
@pytest.mark.parametrize("extra", [(0, 0), (9, -11)], ids=["grid-sized", "resized"])
def test_full_budget_equals_the_stock_processor_and_model(family_setup, extra):
    family, model, fp = family_setup
    f = merged_cell_px(family)
    page = _page(6, 5, f, extra=extra)                       # (9, -11): the processor resizes it
    ref = _stock(fp, page, QUESTION)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FoveateWarning)      # 'full' does not read the question
        inputs = fp(page, QUESTION, budget=None, method="full")
    assert tuple(ref["image_grid_thw"][0]) == (1, 12, 10)
    for k in KEYS:
        assert inputs[k].shape == ref[k].shape and inputs[k].dtype == ref[k].dtype, k
        assert torch.equal(inputs[k], ref[k]), k
    assert torch.equal(inputs["position_ids"], _rope(model, ref))
    with torch.no_grad():
        stock_logits = model(**ref).logits
        model.model.rope_deltas = None
        ours = model(**inputs).logits
        model.model.rope_deltas = None
    assert torch.equal(ours, stock_logits)
    # the same budget given as a number of tokens, through another method that keeps the grid
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FoveateWarning)
        again = fp(page, QUESTION, budget=30, method="resize")
    for k in KEYS:
        assert torch.equal(again[k], ref[k]), k


def test_another_image_processor_resizes_with_pil_to_the_same_grid(family_setup):
    """A non-PIL image processor (e.g. transformers' torchvision one, not installable here) is
    resized with PIL and its filter: same grid, pixels close to the PIL processor's."""
    import types

    family, model, fp = family_setup
    page = _page(6, 5, merged_cell_px(family), extra=(9, -11))
    ip = fp.processor.image_processor
    other = FoveatedProcessor(fp.processor)
    other.processor = types.SimpleNamespace(
        image_processor=types.SimpleNamespace(size=ip.size, do_resize=True, resample=ip.resample),
        tokenizer=fp.processor.tokenizer)
    ours, ref = other.resized_page(page), fp.resized_page(page)
    assert ours.shape == ref.shape == (1, 3, 6 * merged_cell_px(family), 5 * merged_cell_px(family))
    assert (ours - ref).abs().max() <= 1 / 255 + 1e-6


# ----------------------------------------------------------------------------- N = 273
def test_budget_273_holds_273_visual_tokens_at_their_cells_and_generates(family_setup):
    family, model, fp = family_setup
    f = merged_cell_px(family)
    inputs = fp(_page(18, 18, f, seed=1), QUESTION)          # defaults: foveate's, N = 273
    assert inputs.foveation.method == DEFAULT_METHOD          # the method foveate runs
    ids, pos = inputs["input_ids"], inputs["position_ids"]
    is_img = ids[0] == fp.image_token_id
    assert int(is_img.sum()) == 273 == inputs.foveation.budget
    assert inputs["pixel_values"].shape[0] == 4 * 273
    assert int((inputs["image_grid_thw"].prod(-1) // 4).sum()) == 273
    assert inputs.foveation.tokens.levels.max() > 0          # foveated: some coarse tokens
    s = int(is_img.nonzero()[0])
    assert torch.equal(inputs["mm_token_type_ids"][0].bool(), is_img)
    # independent check of the rule: (t, h, w) = (s, s + row, s + col) of the centre's cell
    c = inputs.foveation.tokens.centers[0]                     # [N, 2] (x, y) in [0, 1]
    cells = torch.stack([(c[:, 1] * 18).floor(), (c[:, 0] * 18).floor()], -1).long().clamp(0, 17)
    got = torch.stack([pos[1, 0, is_img] - s, pos[2, 0, is_img] - s], -1)
    assert (pos[0, 0, is_img] == s).all()
    assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, cells.tolist()))
    assert torch.equal(got[:, 0] * 18 + got[:, 1], (got[:, 0] * 18 + got[:, 1]).sort().values)
    # token k's 2 x 2 ViT patches are the k-th token in raster order of its cell
    order = torch.argsort(cells[:, 0] * 18 + cells[:, 1], stable=True)
    strip = inputs.foveation.patches[0, order].permute(1, 2, 0, 3).reshape(1, 3, f, 273 * f)
    assert torch.equal(inputs["pixel_values"], pixel_values(strip, family, grid_hw=(1, 273))[0])
    text_after = pos[:, 0, s + 273:]
    assert torch.equal(text_after, (s + 18 + torch.arange(text_after.shape[1])).expand(3, -1))
    # generate runs, and its first step uses these positions (same logits as the plain forward)
    out = model.generate(**inputs, max_new_tokens=2, do_sample=False, output_logits=True,
                         return_dict_in_generate=True)
    model.model.rope_deltas = None
    assert out.sequences.shape[1] in (ids.shape[1] + 1, ids.shape[1] + 2)
    assert torch.equal(out.sequences[:, :ids.shape[1]], ids)
    with torch.no_grad():
        last = model(**inputs).logits[:, -1]
        model.model.rope_deltas = None
        plain = dict(inputs, position_ids=torch.arange(ids.shape[1]).expand(3, 1, -1))
        last_plain = model(**plain).logits[:, -1]
        model.model.rope_deltas = None
    torch.testing.assert_close(out.logits[0], last, rtol=1e-5, atol=1e-5)
    assert not torch.equal(last, last_plain)                 # the positions reach the model


def test_templated_prompt_and_question_keyword(family_setup):
    family, model, fp = family_setup
    warnings.simplefilter("ignore", FoveateWarning)          # 'resize' does not read questions
    f = merged_cell_px(family)
    prompt = "Q: <|vision_start|><|image_pad|><|vision_end|> A:"
    inputs = fp(_page(4, 4, f), prompt, budget=5, method="resize")
    ids = inputs["input_ids"][0]
    assert int((ids == fp.image_token_id).sum()) == 5 and ids[0] != fp.image_token_id
    assert inputs.foveation.question is None                 # a templated prompt is no question
    assert fp(_page(4, 4, f), QUESTION, budget=5, method="resize").foveation.question == QUESTION
    plain = fp(_page(4, 4, f), QUESTION, budget=5, method="resize", question=None)
    assert plain.foveation.question is None
    assert model.generate(**inputs, max_new_tokens=1).shape[1] == ids.shape[0] + 1
    model.model.rope_deltas = None


# ----------------------------------------------------------------------------- bad input
def test_bad_input_raises_clear_errors(family_setup, tmp_path):
    family, model, fp = family_setup
    f = merged_cell_px(family)
    page = _page(4, 5, f)
    warnings.simplefilter("ignore", FoveateWarning)          # restored by pytest after the test
    with pytest.raises(ValueError, match=r"budget must be in \[1, 20\].*4x5 = 20 merged tokens"):
        fp(page, QUESTION, budget=21, method="resize")
    with pytest.raises(ValueError, match="budget"):
        fp(page, QUESTION, budget=0, method="resize")
    with pytest.raises(FileNotFoundError, match="image: no such file"):
        fp(tmp_path / "missing.png", QUESTION)
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not an image at all")
    with pytest.raises(ValueError, match="image: .*not a readable image"):
        fp(broken, QUESTION)
    with pytest.raises(ValueError, match="unknown method|method"):
        fp(page, QUESTION, method="no-such-method")
    with pytest.raises(ValueError, match="one page per call"):
        fp(page, "<|image_pad|> and <|image_pad|>")
    with pytest.raises(ValueError, match="patch is fixed"):
        fp(page, QUESTION, patch=16)


def test_unsupported_processors_and_models_are_named():
    from transformers import LlamaConfig

    for family in FAMILIES:                    # each processor is told apart (2 and 2.5 look alike)
        assert processor_family(stock_processor(build_qwen(f"{family}-tiny"))) == family
    tok = FoveatedProcessor.from_model(build_qwen(f"{FAMILIES[0]}-tiny")).processor.tokenizer
    for bad in (tok, object()):
        with pytest.raises(ValueError,
                           match="Qwen2VLProcessor.*Qwen2_5_VLProcessor.*Qwen3VLProcessor"):
            FoveatedProcessor(bad)
    with pytest.raises(ValueError, match="config_or_model.*supported: Qwen2VLProcessor"):
        FoveatedProcessor.from_model(LlamaConfig())


def test_a_models_name_is_refused_naming_the_argument():
    with pytest.raises(TypeError, match=r"^config_or_model must be a Qwen-VL config or model .*"
                                        r"got str 'qwen2-vl-tiny'.*AutoProcessor"):
        FoveatedProcessor.from_model("qwen2-vl-tiny")
    with pytest.raises(TypeError, match="config_or_model"):
        stock_processor(None)


def test_a_page_too_small_for_the_cascade_suggests_no_smaller_patch(family_setup):
    """A 5 x 5 page (resized by the processor to its smallest grid): the message must not
    suggest a smaller patch, which the processor fixes to the merged cell."""
    family, model, fp = family_setup
    with pytest.raises(ValueError) as info:
        fp(np.zeros((5, 5, 3), np.uint8), QUESTION, method="cascade")
    msg = str(info.value)
    assert "no budget fits" in msg and "smaller patch" not in msg
    assert "the patch is fixed to the merged cell): use a larger page, or a method that " \
           "fits any page, e.g. method='resize'" in msg


def test_a_lone_surrogate_in_the_prompt_names_it(family_setup):
    family, model, fp = family_setup
    page = _page(4, 5, merged_cell_px(family))
    with pytest.raises(ValueError, match=r"^text must be valid Unicode text: it holds a lone "
                                         r"surrogate"):
        fp(page, "What\ud800?", budget=8, method="resize")
