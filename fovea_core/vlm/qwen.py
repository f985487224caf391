"""Bridge from a ``TokenSet`` into real ``transformers`` Qwen2-VL / Qwen2.5-VL / Qwen3-VL models.

Works on any model of the three families (``...ForConditionalGeneration``): a pretrained
checkpoint, or the random-weight models the book checks it on (built from configs, nothing
downloaded: ``fovea_book.qwen_models``).

Pipeline (all batched, fixed shape ``[B, S]`` with ``S = text_before + N + text_after``)::

    images [B,3,H,W] --pixel_values--> Qwen patches --vision tower (full grid)-->
        merged embeddings [B, Hm*Wm, D]  (+ Qwen3-VL deepstack levels)
    TokenSet --footprint_weights / mrope_positions--> pooled visual tokens [B, N, D],
        position_ids [3, B, S]
    [text_before | visual | text_after] --language model (inputs_embeds, position_ids)--> logits

With every merged cell selected in raster order this reproduces the unmodified model call
``model(input_ids, pixel_values=..., image_grid_thw=..., mm_token_type_ids=...)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fovea_core.tokens import TokenSet
from fovea_core.vlm.positions import (QWEN_MERGE, QWEN_PATCH, footprint_weights,
                                      merged_grid_shape, mrope_positions)

# Pixel normalisation of the Qwen processors: OPENAI CLIP for Qwen2/2.5-VL, 0.5/0.5 for Qwen3-VL.
_CLIP_MEAN, _CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
PIXEL_NORM = {"qwen2-vl": (_CLIP_MEAN, _CLIP_STD), "qwen2.5-vl": (_CLIP_MEAN, _CLIP_STD),
              "qwen3-vl": ((0.5,) * 3, (0.5,) * 3)}


def family_of(config_or_model) -> str:
    """``"qwen2-vl"``, ``"qwen2.5-vl"`` or ``"qwen3-vl"`` from a config or model."""
    cfg = getattr(config_or_model, "config", config_or_model)
    fam = {"qwen2_vl": "qwen2-vl", "qwen2_5_vl": "qwen2.5-vl", "qwen3_vl": "qwen3-vl"}
    if cfg.model_type not in fam:
        raise ValueError(f"not a Qwen-VL config: model_type={cfg.model_type!r}")
    return fam[cfg.model_type]


# ----------------------------------------------------------------------------- vision side
def pixel_values(images: torch.Tensor, family: str,
                 grid_hw: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen's flattened patch input for a batch of equally sized images.

    Args:
        images: ``[B, 3, H, W]`` float in ``[0, 1]``.
        family: Qwen-VL family (``QWEN_PATCH``).
        grid_hw: merged grid ``(Hm, Wm)``; default ``merged_grid_shape((H, W), family)``.

    Returns:
        ``pixel_values [B * Hm*Wm*4, 3 * 2 * p * p]`` in the layout of
        ``Qwen2VLImageProcessorPil.patchify`` (2 x 2 merge blocks contiguous, the still image
        repeated over ``temporal_patch_size = 2``) and ``image_grid_thw [B, 3]`` in patches.
        The image is resized (bilinear, antialiased) to ``(Hm * 2p, Wm * 2p)`` and normalised
        with ``PIXEL_NORM[family]``.
    """
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be [B, 3, H, W], got {tuple(images.shape)}")
    b, c, h, w = images.shape
    hm, wm = grid_hw if grid_hw is not None else merged_grid_shape((h, w), family)
    p, m, t = QWEN_PATCH[family], QWEN_MERGE, 2
    x = images.float()
    if (h, w) != (hm * m * p, wm * m * p):
        x = F.interpolate(x, size=(hm * m * p, wm * m * p), mode="bilinear",
                          align_corners=False, antialias=True)
    mean, std = (x.new_tensor(v).view(1, 3, 1, 1) for v in PIXEL_NORM[family])
    x = (x - mean) / std
    x = x.reshape(b, c, hm, m, p, wm, m, p).permute(0, 2, 5, 3, 6, 1, 4, 7)  # B,hm,wm,m,m,C,p,p
    x = x[..., None, :, :].expand(*x.shape[:6], t, p, p)
    pv = x.reshape(b * hm * wm * m * m, c * t * p * p)
    thw = torch.tensor([[1, hm * m, wm * m]] * b, dtype=torch.long, device=images.device)
    return pv, thw


@dataclass(frozen=True)
class VisualFeatures:
    """Merged visual tokens of the full grid.

    Attributes:
        embeds: ``[B, Hm*Wm, D]`` raster order of the merged grid.
        deepstack: Qwen3-VL only: one ``[B, Hm*Wm, D]`` per deepstack level, else ``()``.
        grid_hw: ``(Hm, Wm)``.
    """

    embeds: torch.Tensor
    deepstack: tuple[torch.Tensor, ...]
    grid_hw: tuple[int, int]


@torch.no_grad()
def encode_images(model: torch.nn.Module, images: torch.Tensor,
                  grid_hw: tuple[int, int] | None = None) -> VisualFeatures:
    """Run the model's vision tower on the full merged grid of every image (``[B,3,H,W]``)."""
    family = family_of(model)
    pv, thw = pixel_values(images, family, grid_hw)
    hm, wm = int(thw[0, 1]) // QWEN_MERGE, int(thw[0, 2]) // QWEN_MERGE
    out = model.model.get_image_features(pv, thw, return_dict=True)
    emb = torch.stack(out.pooler_output)                                    # [B, Hm*Wm, D]
    deep = tuple(torch.stack(f) for f in getattr(out, "deepstack_features", None) or ())
    return VisualFeatures(emb, deep, (hm, wm))


# ----------------------------------------------------------------------------- language side
@dataclass(frozen=True)
class LMInputs:
    """Fixed-shape language-model input.

    Attributes:
        inputs_embeds: ``[B, S, D]``.
        position_ids: ``[3, B, S]`` M-RoPE ids (``mrope_positions``).
        visual_mask: ``[B, S]`` bool.
        deepstack: Qwen3-VL: per level ``[B * N, D]`` (row-major over ``visual_mask``), else ``()``.
    """

    inputs_embeds: torch.Tensor
    position_ids: torch.Tensor
    visual_mask: torch.Tensor
    deepstack: tuple[torch.Tensor, ...] = ()


def _ids(ids: torch.Tensor | None, b: int) -> torch.Tensor:
    if ids is None:
        return torch.zeros(b, 0, dtype=torch.long)
    ids = torch.as_tensor(ids, dtype=torch.long)
    return ids.expand(b, -1) if ids.ndim == 1 else ids


def foveated_inputs(model: torch.nn.Module, feats: VisualFeatures, tokens: TokenSet,
                    text_before: torch.Tensor | None = None,
                    text_after: torch.Tensor | None = None, *, order: str = "raster") -> LMInputs:
    """Language-model inputs for ``[text_before | N tokens of tokens | text_after]``.

    Each token's embedding is the mean of the merged embeddings under its footprint
    (``footprint_weights``; plain selection for a token that is one merged cell), its ids
    follow ``mrope_positions``. Text ids are ``[T]`` or ``[B, T]`` int64.
    """
    b, n = tokens.batch_size, tokens.budget
    if feats.embeds.shape[0] != b:
        raise ValueError(f"tokens has batch {b} but feats has {feats.embeds.shape[0]}")
    tb, ta = _ids(text_before, b).to(feats.embeds.device), _ids(text_after, b).to(feats.embeds.device)
    pos = mrope_positions(tokens, feats.grid_hw, text_before=tb.shape[1], text_after=ta.shape[1],
                          order=order)
    wgt = footprint_weights(tokens, feats.grid_hw)
    wgt = torch.gather(wgt, 1, pos.order[..., None].expand_as(wgt)).to(feats.embeds)
    emb = model.get_input_embeddings()
    vis = torch.bmm(wgt, feats.embeds)                                      # [B, N, D]
    x = torch.cat([emb(tb), vis.to(emb.weight.dtype), emb(ta)], dim=1)
    deep = tuple(torch.bmm(wgt, d).reshape(b * n, -1).to(emb.weight.dtype) for d in feats.deepstack)
    return LMInputs(x, pos.position_ids.to(x.device), pos.image_mask.to(x.device), deep)


@torch.no_grad()
def lm_logits(model: torch.nn.Module, inputs: LMInputs, *, logits_to_keep: int = 0,
              use_cache: bool = False) -> torch.Tensor:
    """Run the language model with ``inputs_embeds`` and explicit ``position_ids`` ([3, B, S]).

    Returns logits ``[B, S, V]`` (or the last ``logits_to_keep`` positions).
    """
    lm = model.model.language_model
    kw = {}
    if inputs.deepstack:
        kw = {"visual_pos_masks": inputs.visual_mask,
              "deepstack_visual_embeds": list(inputs.deepstack)}
    hidden = lm(inputs_embeds=inputs.inputs_embeds, position_ids=inputs.position_ids,
                use_cache=use_cache, **kw).last_hidden_state
    if logits_to_keep:
        hidden = hidden[:, -logits_to_keep:]
    return model.lm_head(hidden)


__all__ = ["LMInputs", "PIXEL_NORM", "VisualFeatures", "encode_images", "family_of",
           "foveated_inputs", "lm_logits", "pixel_values"]
