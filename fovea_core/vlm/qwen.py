"""What Qwen2-VL / Qwen2.5-VL / Qwen3-VL's image processors compute: the family of a model
(:func:`family_of`), the pixel normalisation (:data:`PIXEL_NORM`) and the flattened patch
input (:func:`pixel_values`). :class:`~fovea_core.vlm.processor.FoveatedProcessor` builds
on them; the book's embedding-level bridge and random-weight models are in
``fovea_book.qwen_pooled`` and ``fovea_book.qwen_models``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fovea_core.vlm.positions import QWEN_MERGE, QWEN_PATCH, merged_grid_shape

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


__all__ = ["PIXEL_NORM", "family_of", "pixel_values"]
