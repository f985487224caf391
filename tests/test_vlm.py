"""Tests of fovea_core.vlm: M-RoPE position ids and the bridge into real transformers Qwen-VL models.

The models are tiny random-weight builds of the real ``transformers`` classes; the
invariants (ids and logits of the unmodified model when every merged token is kept) do not
depend on the weights.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fovea_core.tokens import TokenSet
from fovea_core.vlm.positions import (merged_cell_px, merged_cells, merged_grid_shape,
                                      mrope_positions, rope2d_angles, token_scale)
from fovea_book.qwen_models import (build_qwen, has_family, lm_parameter_count, lm_prefill_flops,
                                     qwen_config, reference_forward)
from fovea_book.qwen_pooled import (encode_images, footprint_weights, foveated_inputs,
                                    full_grid_tokens, lm_logits)
from fovea_core.vlm.qwen import PIXEL_NORM, family_of, pixel_values

FAMILIES = [f for f in ("qwen2-vl", "qwen2.5-vl", "qwen3-vl") if has_family(f)]
TEXT_BEFORE = torch.tensor([5, 6, 7])
TEXT_AFTER = torch.tensor([8, 9, 10, 11])


def _sharpen(model, factor: float = 10.0) -> None:
    """Scale the LM's q/k projections: at the 0.02 init scale attention is nearly uniform and a
    position change moves the logits by only ~1e-4; sharpened, the effect is far above float noise."""
    with torch.no_grad():
        for name, p in model.model.language_model.named_parameters():
            if "q_proj" in name or "k_proj" in name:
                p.mul_(factor)


@pytest.fixture(scope="module", params=FAMILIES)
def setup(request):
    """(model, images [2,3,H,W], reference logits, reference ids, features) for a 6 x 5 grid."""
    family = request.param
    model = build_qwen(f"{family}-tiny", seed=1)
    _sharpen(model)
    f = merged_cell_px(family)
    images = torch.rand(2, 3, 6 * f, 5 * f, generator=torch.Generator().manual_seed(0))
    logits, ids = reference_forward(model, images, TEXT_BEFORE, TEXT_AFTER)
    return model, images, logits, ids, encode_images(model, images)


# ----------------------------------------------------------------------------- invariants
def test_all_tokens_reproduce_get_rope_index_and_logits(setup):
    model, images, ref_logits, ref_ids, feats = setup
    assert feats.grid_hw == (6, 5)
    tokens = full_grid_tokens(feats.grid_hw, batch=2, family=family_of(model))
    inputs = foveated_inputs(model, feats, tokens, TEXT_BEFORE, TEXT_AFTER)
    assert inputs.position_ids.shape == ref_ids.shape == (3, 2, 3 + 30 + 4)
    assert torch.equal(inputs.position_ids, ref_ids)
    logits = lm_logits(model, inputs)
    assert logits.shape == ref_logits.shape
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)


def test_subset_ids_equal_full_ids_at_kept_positions(setup):
    model, images, _, ref_ids, feats = setup
    hm, wm = feats.grid_hw
    g = torch.Generator().manual_seed(3)
    cells = torch.stack([torch.randperm(hm * wm, generator=g)[:11] for _ in range(2)])
    f = merged_cell_px(family_of(model))
    tokens = TokenSet.from_grid(cells // wm, cells % wm, 0, image_size=(hm * f, wm * f), patch=f)
    inputs = foveated_inputs(model, feats, tokens, TEXT_BEFORE, TEXT_AFTER)
    kept = torch.sort(cells, dim=1).values + len(TEXT_BEFORE)       # raster order in the sequence
    seq = torch.cat([torch.arange(3).expand(2, 3), kept, 3 + hm * wm + torch.arange(4).expand(2, 4)], 1)
    expect = torch.gather(ref_ids, 2, seq.expand(3, -1, -1))
    assert torch.equal(inputs.position_ids, expect)
    assert lm_logits(model, inputs).shape == (2, 3 + 11 + 4, model.config.text_config.vocab_size)


def test_changing_a_token_position_changes_logits(setup):
    model, images, _, _, feats = setup
    tokens = full_grid_tokens(feats.grid_hw, batch=2, family=family_of(model))
    inputs = foveated_inputs(model, feats, tokens, TEXT_BEFORE, TEXT_AFTER)
    base = lm_logits(model, inputs)
    pos = inputs.position_ids.clone()
    pos[1:, 0, 3 + 7] += 2                                   # move token 7 of image 0 by 2 cells
    moved = lm_logits(model, type(inputs)(inputs.inputs_embeds, pos, inputs.visual_mask,
                                          inputs.deepstack))
    assert (moved[0, 3 + 7:] - base[0, 3 + 7:]).abs().max() > 1e-3
    torch.testing.assert_close(moved[0, :3 + 7], base[0, :3 + 7])  # causal: earlier tokens unchanged
    torch.testing.assert_close(moved[1], base[1])                  # other image unchanged


def test_batch_rows_are_independent(setup):
    model, images, _, _, feats = setup
    hm, wm = feats.grid_hw
    f = merged_cell_px(family_of(model))
    cells = torch.tensor([[0, 4, 9, 29], [3, 8, 10, 11]])
    tokens = TokenSet.from_grid(cells // wm, cells % wm, 0, image_size=(hm * f, wm * f), patch=f)
    both = lm_logits(model, foveated_inputs(model, feats, tokens, TEXT_BEFORE, TEXT_AFTER))
    one_feats = type(feats)(feats.embeds[1:], tuple(d[1:] for d in feats.deepstack), feats.grid_hw)
    one = lm_logits(model, foveated_inputs(model, one_feats, tokens[1], TEXT_BEFORE, TEXT_AFTER))
    torch.testing.assert_close(both[1:], one, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif("qwen3-vl" not in FAMILIES, reason="transformers has no Qwen3-VL")
def test_qwen3_deepstack_features_are_used():
    model = build_qwen("qwen3-vl-tiny", seed=2)
    images = torch.rand(1, 3, 4 * 32, 4 * 32, generator=torch.Generator().manual_seed(1))
    feats = encode_images(model, images)
    assert len(feats.deepstack) == 2
    inputs = foveated_inputs(model, feats, full_grid_tokens((4, 4), 1, "qwen3-vl"), TEXT_BEFORE)
    no_deep = type(inputs)(inputs.inputs_embeds, inputs.position_ids, inputs.visual_mask, ())
    assert not torch.allclose(lm_logits(model, inputs), lm_logits(model, no_deep), atol=1e-5)


# ----------------------------------------------------------------------------- pixels
@pytest.mark.parametrize("family", FAMILIES)
def test_pixel_values_match_the_processor_layout(family):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    p = merged_cell_px(family) // 2
    img = torch.rand(1, 3, 4 * p, 6 * p, generator=torch.Generator().manual_seed(2))
    pv, thw = pixel_values(img, family)
    mean, std = (torch.tensor(v).view(3, 1, 1) for v in PIXEL_NORM[family])
    ref, gh, gw = Qwen2VLImageProcessorPil().patchify(((img[0] - mean) / std).numpy(), p, 2, 2)
    assert thw.tolist() == [[1, gh, gw]] == [[1, 4, 6]]
    np.testing.assert_allclose(pv.numpy(), ref, rtol=1e-6, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(h=st.integers(56, 3000), w=st.integers(56, 3000), family=st.sampled_from(FAMILIES))
def test_merged_grid_shape_equals_smart_resize(h, w, family):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
    f = merged_cell_px(family)
    rh, rw = smart_resize(h, w, factor=f, min_pixels=f * f, max_pixels=10**9)
    assert merged_grid_shape((h, w), family) == (rh // f, rw // f)
    rh, rw = smart_resize(h, w, factor=f, min_pixels=56 * 56 * 4, max_pixels=512 * f * f)
    assert merged_grid_shape((h, w), family, min_pixels=56 * 56 * 4,
                             max_pixels=512 * f * f) == (rh // f, rw // f)


# ----------------------------------------------------------------------------- position rule
@settings(max_examples=25, deadline=None)
@given(hm=st.integers(1, 12), wm=st.integers(1, 12), tb=st.integers(0, 5), ta=st.integers(0, 5),
       seed=st.integers(0, 2**16))
def test_shuffled_subset_is_laid_out_in_raster_order(hm, wm, tb, ta, seed):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, hm * wm + 1, (1,), generator=g))
    cells = torch.randperm(hm * wm, generator=g)[:n][None]
    tokens = TokenSet.from_grid(cells // wm, cells % wm, 0, image_size=(hm * 28, wm * 28), patch=28)
    pos = mrope_positions(tokens, (hm, wm), text_before=tb, text_after=ta)
    full = mrope_positions(full_grid_tokens((hm, wm)), (hm, wm), text_before=tb, text_after=ta)
    sorted_cells = cells.sort(dim=1).values[0]
    keep = torch.cat([torch.arange(tb), tb + sorted_cells, tb + hm * wm + torch.arange(ta)])
    assert torch.equal(pos.position_ids, full.position_ids[:, :, keep])
    assert torch.equal(cells[0, pos.order[0]], sorted_cells)            # order is the sort
    assert pos.image_mask.sum() == n and (pos.scale == 0).all()
    # text after the image continues one past the largest id of the full grid
    if ta:
        vis_max = full.position_ids[:, 0, tb:tb + hm * wm].max()
        assert (pos.position_ids[:, 0, tb + n] == vis_max + 1).all()


def test_coarse_tokens_take_the_centre_cell_and_pool_their_footprint():
    # 8 x 8 merged grid of 28 px; level-1 tokens of patch 28 cover 2 x 2 merged cells
    tokens = TokenSet.from_grid(torch.tensor([[0, 1, 3]]), torch.tensor([[0, 2, 3]]), 1,
                                image_size=(224, 224), patch=28)
    # centres on cell corners: (28, 28), (140, 84), (196, 196) px -> floor picks the lower-right cell
    assert merged_cells(tokens, (8, 8)).tolist() == [[[1, 1], [3, 5], [7, 7]]]
    torch.testing.assert_close(token_scale(tokens, (8, 8)), torch.ones(1, 3))
    w = footprint_weights(tokens, (8, 8)).view(1, 3, 8, 8)
    torch.testing.assert_close(w.sum((-1, -2)), torch.ones(1, 3))
    assert (w[0, 0] > 0).sum() == 4 and torch.equal(w[0, 0, :2, :2], torch.full((2, 2), 0.25))
    assert (w[0, 2] > 0).sum() == 4 and w[0, 2, 6:, 6:].sum() == 1       # clipped corner block
    # a token smaller than a merged cell sees exactly the cell under its centre
    small = TokenSet(torch.tensor([[[0.3, 0.6]]]), torch.zeros(1, 1), torch.zeros(1, 1),
                     torch.full((1, 1, 2), 0.5), (224, 224), patch=8)
    ws = footprint_weights(small, (8, 8)).view(8, 8)
    assert ws[4, 2] == 1 and ws.sum() == 1
    # on-grid tokens: one-hot rows (pooling is selection)
    wf = footprint_weights(full_grid_tokens((3, 4)), (3, 4))
    assert torch.equal(wf[0], torch.eye(12))


def test_rope2d_angles_depend_on_displacement_only():
    g = torch.Generator().manual_seed(0)
    c = torch.rand(1, 20, 2, generator=g) * 0.8
    a = TokenSet(c, torch.zeros(1, 20), torch.zeros(1, 20), torch.full((1, 1, 2), .5), (320, 320))
    b = TokenSet(c + 0.1, torch.zeros(1, 20), torch.zeros(1, 20), torch.full((1, 1, 2), .5),
                 (320, 320))
    ang_a, ang_b = rope2d_angles(a, 32), rope2d_angles(b, 32)
    assert ang_a.shape == (1, 20, 16)
    rel = lambda x: x[:, :, None] - x[:, None, :]           # noqa: E731 (pairwise differences)
    torch.testing.assert_close(rel(ang_a), rel(ang_b), atol=1e-4, rtol=0)
    # the level-0 patch grid sits on integer positions (first frequency is 1)
    grid = TokenSet.from_grid(torch.tensor([[0, 3]]), torch.tensor([[2, 5]]), 0,
                              image_size=(160, 160), patch=16)
    ang = rope2d_angles(grid, 8)
    torch.testing.assert_close(ang[0, :, 0], torch.tensor([2.0, 5.0]))   # x, k = 0
    torch.testing.assert_close(ang[0, :, 2], torch.tensor([0.0, 3.0]))   # y, k = 0


def test_bad_input_names_the_argument():
    t = full_grid_tokens((2, 2))
    with pytest.raises(ValueError, match="family"):
        merged_cell_px("llava")
    with pytest.raises(ValueError, match="grid_hw"):
        mrope_positions(t, (0, 2))
    with pytest.raises(ValueError, match="order"):
        mrope_positions(t, (2, 2), order="zigzag")
    with pytest.raises(ValueError, match="text_before"):
        mrope_positions(t, (2, 2), text_before=-1)
    with pytest.raises(ValueError, match="dim"):
        rope2d_angles(t, 6)
    with pytest.raises(ValueError, match="name"):
        qwen_config("qwen9-vl")
    with pytest.raises(ValueError, match="images"):
        pixel_values(torch.rand(3, 28, 28), "qwen2-vl")


# ----------------------------------------------------------------------------- FLOPs
@pytest.mark.parametrize("name", ["qwen2-vl-tiny", "qwen3-vl-tiny", "qwen2-vl-mid"])
def test_flop_formula_counts_the_real_decoder_weights(name):
    if not has_family(name.split("-tiny")[0].split("-mid")[0]):
        pytest.skip("family not installed")
    cfg = qwen_config(name).text_config
    lm = build_qwen(name, text_only=True)
    matmul = sum(p.numel() for n, p in lm.layers.named_parameters()
                 if p.ndim == 2)                               # q,k,v,o,gate,up,down weights
    assert lm_parameter_count(cfg) == matmul
    fl = lm_prefill_flops(cfg, 100, logits_to_keep=1)
    assert fl["linear"] == 2 * 100 * matmul
    dense = lm_prefill_flops(cfg, 100, causal=False)
    assert dense["attention"] / fl["attention"] == pytest.approx(100 / 50.5)
    assert math.isclose(fl["total"], fl["linear"] + fl["attention"] + fl["head"])


def test_latency_benchmark_runs_and_compares_with_the_flop_bound():
    from fovea_book.bench import vlm_latency
    run = vlm_latency.run_model("qwen2-vl-tiny", (64, 273), "cpu", torch.float32, budget_s=0.01)
    assert [p["visual_tokens"] for p in run["points"]] == [64, 273]
    assert all(p["median_ms"] > 0 and p["peak_mem_mb"] >= 0 for p in run["points"])
    cfg = qwen_config("qwen2-vl-tiny").text_config
    fake = [{"visual_tokens": 273, "seq_len": 305, "median_ms": 2.0, "min_ms": 1.5, "max_ms": 3},
            {"visual_tokens": 4096, "seq_len": 4128, "median_ms": 30.0, "min_ms": 25, "max_ms": 40}]
    s = vlm_latency.summary(fake, cfg)
    bound = lm_prefill_flops(cfg, 4128)["total"] / lm_prefill_flops(cfg, 305)["total"]
    assert s["speedup_measured"] == 15.0 and s["flop_ratio_bound"] == pytest.approx(bound)
    assert s["speedup_over_bound"] == pytest.approx(15.0 / bound)
    assert s["speedup_range"] == [25 / 3, 40 / 1.5]
    assert s["speedup_measured_min_times"] == 25 / 1.5
    assert vlm_latency.summary(fake[:1], cfg) == {}


def test_latency_runs_at_a_batch_and_the_pipeline_times_its_four_stages():
    from fovea_book.bench import vlm_latency
    from fovea_book.bench.common import BenchError
    run = vlm_latency.run_model("qwen2-vl-tiny", (64, 273), "cpu", torch.float32,
                                budget_s=0.01, batch=3)
    assert run["batch"] == 3
    cfg = qwen_config("qwen2-vl-tiny").text_config
    assert run["points"][1]["flops"] == lm_prefill_flops(cfg, 305, batch=3)["total"]
    pipe = vlm_latency.pipeline("qwen2-vl-tiny", "cpu", torch.float32, budget=40, batch=2,
                                image_px=224, repeats=2)
    stages = ("pyramid", "allocate", "gather", "prefill")
    assert set(pipe["timings"]) == {*stages, "chain"}
    assert sum(pipe["shares"].values()) == pytest.approx(1.0)
    side = sum(pipe["timings"][k]["median_ms"] for k in stages[:3])
    assert pipe["side_over_prefill"] == pytest.approx(side / pipe["timings"]["prefill"]["median_ms"])
    assert pipe["met"] == (pipe["side_over_prefill"] <= vlm_latency.PIPELINE_TARGET)
    # the gathered pixels are the model's pixel_values rows: 4 ViT patches a merged token
    assert pipe["pixel_values_shape"] == [2 * 40 * 4, 3 * 2 * 14 * 14]
    with pytest.raises(BenchError, match="fewer than the budget"):
        vlm_latency.pipeline("qwen2-vl-tiny", "cpu", torch.float32, budget=65, batch=1,
                             image_px=224)
    with pytest.raises(SystemExit):
        vlm_latency.main(["--gpu-batches", "0"])
