"""Position ids for a ``TokenSet`` inside a VLM: Qwen-VL M-RoPE ``(t, h, w)`` and 2-D RoPE.

Qwen2-VL / Qwen2.5-VL / Qwen3-VL (Wang et al. 2024, sec. 2.1 "Multimodal Rotary Position
Embedding"; Bai et al. 2025) resize an image to multiples of ``patch * merge`` pixels (14 * 2
= 28 px for Qwen2/2.5-VL, 16 * 2 = 32 px for Qwen3-VL), run a ViT on ``patch``-pixel
patches and merge every 2 x 2 patches into one language-model token. The LM sees a
``Hm x Wm`` grid of *merged* tokens; the merged token in row ``i``, column ``j`` of an image
that starts at sequence position ``s`` gets the M-RoPE ids

    t = s,    h = s + i,    w = s + j,

and the text after the image continues at ``s + max(Hm, Wm)`` (one past the largest id
of the full grid), exactly as ``Qwen2VLModel.get_rope_index`` in ``transformers`` does.
Qwen3-VL uses the same ids; only the split of the rotary frequencies over (t, h, w) differs
(interleaved instead of contiguous sections), which is the model's business, not ours.

The rule for foveated tokens (documented here once, used everywhere):

* **Position.** A token gets the ids of the merged cell under its footprint's *centre*
  (normalised centres make this independent of the resize: ``i = floor(y * Hm)``,
  ``j = floor(x * Wm)``). A fine token and a coarse (higher mip level, or peripheral)
  token centred on the same cell therefore share a position; their scale tells them apart.
* **Scale.** ``log2(footprint / merged-cell side)``: 0 for a token that covers exactly one
  merged cell, +1 for one covering 2 x 2 cells, ... It is returned as an optional extra
  channel (``MRopePositions.scale``); Qwen's M-RoPE has no slot for it, so a model that
  wants it must add it itself (e.g. a learned scale embedding).
* **Text.** Text before the image counts 0, 1, ...; text after continues from
  ``s + max(Hm, Wm)`` whatever subset of the image was kept, so the text ids of a
  foveated sequence equal those of the full-image sequence.
* **Order.** By default tokens are laid out in raster order of their cells (the order
  Qwen-VL was trained with; ties keep the TokenSet order). ``order="given"`` keeps the
  TokenSet order.

For a generic ViT, ``rope2d_angles`` gives axial 2-D RoPE angles (Heo et al. 2024, "Rotary
position embedding for vision transformer", RoPE-Axial, eq. 10-11) at the token centre in
base-patch units, so a coarse token sits at its continuous centre.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fovea_core.tokens import TokenSet

#: ViT patch side in pixels per Qwen-VL family; every family merges 2 x 2 patches.
QWEN_PATCH = {"qwen2-vl": 14, "qwen2.5-vl": 14, "qwen3-vl": 16}
QWEN_MERGE = 2


def _check_family(family: str) -> None:
    if family not in QWEN_PATCH:
        raise ValueError(f"family must be one of {sorted(QWEN_PATCH)}, got {family!r}")


def merged_cell_px(family: str = "qwen2-vl") -> int:
    """Side in pixels of one merged LM token: ``patch * 2`` (28 for Qwen2/2.5-VL, 32 for Qwen3-VL)."""
    _check_family(family)
    return QWEN_PATCH[family] * QWEN_MERGE


def merged_grid_shape(image_size: tuple[int, int], family: str = "qwen2-vl", *,
                      min_pixels: int | None = None,
                      max_pixels: int | None = None) -> tuple[int, int]:
    """Merged-token grid ``(Hm, Wm)`` of an image of ``image_size = (H, W)`` pixels.

    Implements Qwen's ``smart_resize`` (transformers ``image_processing_qwen2_vl``): each side
    is rounded to the nearest multiple of ``f = merged_cell_px(family)`` (at least ``f``);
    if ``min_pixels`` / ``max_pixels`` are given, the area is rescaled into that range with
    the aspect ratio kept. Without them (the default here) the image keeps its size up to
    the rounding, so a 448 x 448 image has a 16 x 16 grid for Qwen2-VL.
    """
    f = merged_cell_px(family)
    h, w = int(image_size[0]), int(image_size[1])
    if h < 1 or w < 1:
        raise ValueError(f"image_size must be positive (H, W), got {image_size}")
    hb, wb = max(f, round(h / f) * f), max(f, round(w / f) * f)
    if max_pixels is not None and hb * wb > max_pixels:
        beta = math.sqrt(h * w / max_pixels)
        hb, wb = max(f, math.floor(h / beta / f) * f), max(f, math.floor(w / beta / f) * f)
    elif min_pixels is not None and hb * wb < min_pixels:
        beta = math.sqrt(min_pixels / (h * w))
        hb, wb = math.ceil(h * beta / f) * f, math.ceil(w * beta / f) * f
    return hb // f, wb // f


def _check_grid(grid_hw: tuple[int, int]) -> tuple[int, int]:
    hm, wm = int(grid_hw[0]), int(grid_hw[1])
    if hm < 1 or wm < 1:
        raise ValueError(f"grid_hw must be a positive (Hm, Wm), got {grid_hw}")
    return hm, wm


def merged_cells(tokens: TokenSet, grid_hw: tuple[int, int]) -> torch.Tensor:
    """Merged cell ``(row, col)`` under each token's centre, ``[B, N, 2]`` int64."""
    hm, wm = _check_grid(grid_hw)
    col = (tokens.centers[..., 0] * wm).floor().long().clamp(0, wm - 1)
    row = (tokens.centers[..., 1] * hm).floor().long().clamp(0, hm - 1)
    return torch.stack([row, col], dim=-1)


def token_scale(tokens: TokenSet, grid_hw: tuple[int, int]) -> torch.Tensor:
    """``log2(footprint / merged-cell side)`` per token, ``[B, N]`` float32.

    The merged-cell side in base pixels is ``sqrt((H / Hm) * (W / Wm))`` (the two agree
    unless the resize changed the aspect ratio).
    """
    hm, wm = _check_grid(grid_hw)
    h, w = tokens.image_size
    cell = math.sqrt((h / hm) * (w / wm))
    return torch.log2(tokens.footprint() / cell)


@dataclass(frozen=True)
class MRopePositions:
    """M-RoPE ids of a ``[text_before | N visual tokens | text_after]`` sequence.

    Attributes:
        position_ids: ``[3, B, S]`` int64 ``(t, h, w)``, ``S = text_before + N + text_after``.
        image_mask: ``[B, S]`` bool, True at visual tokens.
        scale: ``[B, S]`` float32 extra channel (``token_scale``; 0 at text).
        order: ``[B, N]`` int64, the TokenSet index placed at each visual slot.
        cells: ``[B, N, 2]`` int64 merged ``(row, col)`` of each visual slot (in sequence order).
        grid_hw: the merged grid ``(Hm, Wm)``.
    """

    position_ids: torch.Tensor
    image_mask: torch.Tensor
    scale: torch.Tensor
    order: torch.Tensor
    cells: torch.Tensor
    grid_hw: tuple[int, int]


def mrope_positions(tokens: TokenSet, grid_hw: tuple[int, int], *, text_before: int = 0,
                    text_after: int = 0, order: str = "raster") -> MRopePositions:
    """M-RoPE ``(t, h, w)`` ids for ``text_before`` text tokens, the N visual tokens and
    ``text_after`` text tokens.

    Rule (module docstring; Wang et al. 2024 sec. 2.1): with ``s = text_before``, text
    before the image has ids ``0 .. s-1`` on all three axes; visual token on merged cell
    ``(i, j)`` has ``(s, s + i, s + j)``; text after has ``s + max(Hm, Wm) + k``. For all
    ``Hm * Wm`` cells in raster order this equals ``get_rope_index`` of transformers.

    Args:
        tokens: TokenSet ``[B, N]``; positions use its normalised centres.
        grid_hw: merged grid ``(Hm, Wm)`` (``merged_grid_shape``).
        text_before, text_after: text lengths (>= 0), equal for the whole batch.
        order: ``"raster"`` (sort by cell, stable) or ``"given"`` (TokenSet order).
    """
    hm, wm = _check_grid(grid_hw)
    if text_before < 0 or text_after < 0:
        raise ValueError(f"text_before and text_after must be >= 0, got {text_before}, {text_after}")
    if order not in ("raster", "given"):
        raise ValueError(f"order must be 'raster' or 'given', got {order!r}")
    b, n = tokens.batch_size, tokens.budget
    dev = tokens.device
    rc = merged_cells(tokens, grid_hw)
    if order == "raster":
        perm = torch.argsort(rc[..., 0] * wm + rc[..., 1], dim=1, stable=True)
    else:
        perm = torch.arange(n, device=dev).expand(b, n)
    rc = torch.gather(rc, 1, perm[..., None].expand(b, n, 2))
    s = text_before
    vis = torch.stack([torch.full((b, n), s, device=dev, dtype=torch.long),
                       s + rc[..., 0], s + rc[..., 1]])                      # [3,B,N]
    before = torch.arange(s, device=dev).expand(3, b, s)
    after = (s + max(hm, wm) + torch.arange(text_after, device=dev)).expand(3, b, text_after)
    pos = torch.cat([before, vis, after], dim=2)
    mask = torch.zeros(b, s + n + text_after, dtype=torch.bool, device=dev)
    mask[:, s:s + n] = True
    scale = torch.zeros(b, s + n + text_after, device=dev)
    scale[:, s:s + n] = torch.gather(token_scale(tokens, grid_hw), 1, perm)
    return MRopePositions(pos, mask, scale, perm, rc, (hm, wm))


def rope2d_angles(tokens: TokenSet, dim: int, *, theta: float = 100.0) -> torch.Tensor:
    """Axial 2-D RoPE angles ``[B, N, dim // 2]`` for a generic ViT (Heo et al. 2024, eq. 10-11).

    Position ``(px, py)`` = token centre in base-patch units minus 1/2, so the level-0 cell
    ``(i, j)`` sits at ``(j, i)`` like a ViT's integer grid and a coarse token at its
    continuous centre. The first ``dim // 4`` angles rotate with ``px``, the rest with
    ``py``, frequencies ``theta ** (-4k / dim)``, ``k = 0 .. dim/4 - 1``. Query/key pair
    ``m`` of a head of size ``dim`` is rotated by angle ``[..., m]``.

    Args:
        tokens: TokenSet ``[B, N]``.
        dim: attention head size, a positive multiple of 4.
        theta: RoPE base (100 in Heo et al.).
    """
    if dim < 4 or dim % 4:
        raise ValueError(f"dim must be a positive multiple of 4, got {dim}")
    if theta <= 1:
        raise ValueError(f"theta must be > 1, got {theta}")
    inv = theta ** (-torch.arange(0, dim // 4, device=tokens.device, dtype=torch.float32) * 4 / dim)
    p = tokens.centers_px() / tokens.patch - 0.5                            # [B,N,2] (x, y)
    return torch.cat([p[..., 0:1] * inv, p[..., 1:2] * inv], dim=-1)
