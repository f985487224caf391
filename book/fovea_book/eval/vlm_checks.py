"""The invariants of the foveated M-RoPE bridge (chapter 15), on a tiny random Qwen-VL.

:func:`mrope_invariants` builds a tiny model of a family and checks, with every merged
token kept, that our ids equal ``get_rope_index``'s and our logits the unmodified model's;
with a random subset kept, that each kept token has the full image's id; and that moving one
token's position changes the logits from that token on only (causal attention).
``tests/test_vlm.py`` checks the same invariants on fixed cases; this is the chapter's
table (tested in ``tests/test_vlm_checks.py``).
"""

from __future__ import annotations

import torch

from fovea_core.tokens import TokenSet
from fovea_core.vlm.positions import merged_cell_px
from fovea_book.qwen_models import build_qwen, reference_forward
from fovea_book.qwen_pooled import encode_images, foveated_inputs, full_grid_tokens, lm_logits

#: the text around the image in the check: 3 tokens before, 4 after
TEXT_BEFORE, TEXT_AFTER = torch.tensor([5, 6, 7]), torch.tensor([8, 9, 10, 11])


def random_cells(n_cells: int, k: int, generator: torch.Generator, batch: int = 2
                 ) -> torch.Tensor:
    """``[batch, k]`` distinct cell indices in ``[0, n_cells)`` per image (a random subset
    of the merged grid, raster-numbered)."""
    if not 0 < k <= n_cells:
        raise ValueError(f"k must be in (0, n_cells={n_cells}], got {k}")
    return torch.stack([torch.randperm(n_cells, generator=generator)[:k] for _ in range(batch)])


def mrope_invariants(family: str, *, seed: int = 0, grid: tuple[int, int] = (6, 5),
                     kept: int = 11, moved_token: int = 10) -> dict:
    """One row of chapter 15's invariants table for ``family`` (a batch of two random
    images of ``grid`` merged cells, text around them).

    Returns:
        ``{"family", "seq len S", "ids == get_rope_index", "max |logits - reference|",
        "subset ids == full ids at kept", "moved: max |dlogits| before / from token"}``;
        the last is ``(before, after)``: the largest logit change before and from the
        sequence position ``moved_token`` when that token's ids move by 2 (image 2 only).
    """
    gh, gw = grid
    n_cells = gh * gw
    if not 0 < moved_token < len(TEXT_BEFORE) + n_cells + len(TEXT_AFTER):
        raise ValueError(f"moved_token must be inside the sequence, got {moved_token}")
    model = build_qwen(f"{family}-tiny", seed=seed)
    f = merged_cell_px(family)
    images = torch.rand(2, 3, gh * f, gw * f, generator=torch.Generator().manual_seed(seed))
    ref_logits, ref_ids = reference_forward(model, images, TEXT_BEFORE, TEXT_AFTER)
    feats = encode_images(model, images)
    full = foveated_inputs(model, feats, full_grid_tokens(feats.grid_hw, 2, family),
                           TEXT_BEFORE, TEXT_AFTER)
    logits = lm_logits(model, full)
    cells = random_cells(n_cells, kept, torch.Generator().manual_seed(seed))
    sub = foveated_inputs(model, feats, TokenSet.from_grid(cells // gw, cells % gw, 0,
                          image_size=(gh * f, gw * f), patch=f), TEXT_BEFORE, TEXT_AFTER)
    nb, na = len(TEXT_BEFORE), len(TEXT_AFTER)
    keep = torch.cat([torch.arange(nb).expand(2, nb), cells.sort(1).values + nb,
                      nb + n_cells + torch.arange(na).expand(2, na)], 1)
    moved_ids = full.position_ids.clone()
    moved_ids[1:, 0, moved_token] += 2
    moved = lm_logits(model, type(full)(full.inputs_embeds, moved_ids, full.visual_mask,
                                        full.deepstack))
    return {"family": family, "seq len S": full.position_ids.shape[-1],
            "ids == get_rope_index": torch.equal(full.position_ids, ref_ids),
            "max |logits - reference|": float((logits - ref_logits).abs().max()),
            "subset ids == full ids at kept": torch.equal(
                sub.position_ids, torch.gather(ref_ids, 2, keep.expand(3, -1, -1))),
            "moved: max |dlogits| before / from token": (
                float((moved - logits)[0, :moved_token].abs().max()),
                float((moved - logits)[0, moved_token:].abs().max()))}
