"""The pooled bridge: a TokenSet into a Qwen2-VL / Qwen2.5-VL / Qwen3-VL model at the
embedding level (chapter 15's checks, the TTFT benchmark, the tests).

Works on any model of the three families (``...ForConditionalGeneration``): a pretrained
checkpoint, or the random-weight models of :mod:`fovea_book.qwen_models`. The user's path
into a model is :class:`fovea_core.vlm.processor.FoveatedProcessor` (tokens as pixels);
this one runs the vision tower on the full grid and pools it under each token.

Pipeline (all batched, fixed shape ``[B, S]`` with ``S = text_before + N + text_after``)::

    images [B,3,H,W] --pixel_values--> Qwen patches --vision tower (full grid)-->
        merged embeddings [B, Hm*Wm, D]  (+ Qwen3-VL deepstack levels)
    TokenSet --footprint_weights / mrope_positions--> pooled visual tokens [B, N, D],
        position_ids [3, B, S]
    [text_before | visual | text_after] --language model (inputs_embeds, position_ids)--> logits

With every merged cell selected in raster order (:func:`full_grid_tokens`) this reproduces
the unmodified model call
``model(input_ids, pixel_values=..., image_grid_thw=..., mm_token_type_ids=...)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fovea_core.tokens import TokenSet
from fovea_core.vlm.positions import (QWEN_MERGE, _check_grid, merged_cell_px, merged_cells,
                                      mrope_positions)
from fovea_core.vlm.qwen import family_of, pixel_values

__all__ = ["LMInputs", "VisualFeatures", "encode_images", "footprint_weights",
           "foveated_inputs", "full_grid_tokens", "lm_logits"]


def footprint_weights(tokens: TokenSet, grid_hw: tuple[int, int]) -> torch.Tensor:
    """Averaging weights from merged cells to tokens, ``[B, N, Hm * Wm]`` float32 (rows sum to 1).

    Token ``n`` averages the merged cells whose centres lie strictly inside its footprint
    (a ``footprint x footprint`` base-pixel square around its centre, see
    ``TokenSet.boxes``) together with the cell under its centre (so a token smaller than a
    merged cell still sees that cell). A token that is exactly one merged cell, centred on
    it, gets a one-hot row: pooling is then *selection*, bit for bit. This is what a coarse
    token "sees": the mean of the merged embeddings under its footprint.
    """
    hm, wm = _check_grid(grid_hw)
    h, w = tokens.image_size
    cy = (torch.arange(hm, dtype=torch.float32, device=tokens.device) + 0.5) / hm
    cx = (torch.arange(wm, dtype=torch.float32, device=tokens.device) + 0.5) / wm
    half = tokens.footprint()[..., None] / 2                                 # [B,N,1] px
    inside_y = ((cy * h - tokens.centers_px()[..., 1:2]).abs() < half)      # [B,N,Hm]
    inside_x = ((cx * w - tokens.centers_px()[..., 0:1]).abs() < half)      # [B,N,Wm]
    wgt = (inside_y[..., :, None] & inside_x[..., None, :]).flatten(2).float()
    rc = merged_cells(tokens, grid_hw)
    wgt.scatter_(2, (rc[..., 0] * wm + rc[..., 1])[..., None], 1.0)
    return wgt / wgt.sum(-1, keepdim=True)


def full_grid_tokens(grid_hw: tuple[int, int], batch: int = 1, family: str = "qwen2-vl") -> TokenSet:
    """All ``Hm * Wm`` merged cells in raster order as a TokenSet (footprint = one merged cell).

    The image size is ``(Hm * f, Wm * f)`` with ``f = merged_cell_px(family)``; useful as the
    "select everything" reference.
    """
    hm, wm = _check_grid(grid_hw)
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    f = merged_cell_px(family)
    rows, cols = torch.meshgrid(torch.arange(hm), torch.arange(wm), indexing="ij")
    return TokenSet.from_grid(rows.reshape(1, -1).expand(batch, -1),
                              cols.reshape(1, -1).expand(batch, -1), 0,
                              image_size=(hm * f, wm * f), patch=f)


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


