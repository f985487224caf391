"""Token footprints on a raster: the one rule for "which page pixels does a token cover".

Below both the cascade's algorithm (:func:`fovea_core.cascade.allocator.covered_share`, the
surround's "mass the core left uncovered") and its evaluation
(:func:`fovea_book.eval.localisation.fovea_share`); imports nothing of the cascade.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fovea_core.tokens import TokenSet

__all__ = ["coverage_raster"]


def coverage_raster(tokens: TokenSet, *, stages: Sequence[int] | None = (1, 2),
                    step: int = 4) -> torch.Tensor:
    """``[B, ceil(H/step), ceil(W/step)]`` bool: raster pixels (``step`` base px) whose centre
    lies inside the footprint of a token of ``stages`` (``None``: all tokens).

    One difference array per image (four scatter-adds, two cumulative sums; no loop over
    tokens). Tokens of other stages are moved off the raster.
    """
    h, w = tokens.image_size
    rh, rw = -(-h // step), -(-w // step)
    b = tokens.batch_size
    box = tokens.boxes()                                                     # [B, N, 4]
    # raster pixel i covers centre (i + .5) step: inside iff x0 <= (i + .5) step < x1
    x0 = torch.ceil(box[..., 0] / step - 0.5).clamp(0, rw).long()
    x1 = torch.ceil(box[..., 2] / step - 0.5).clamp(0, rw).long()
    y0 = torch.ceil(box[..., 1] / step - 0.5).clamp(0, rh).long()
    y1 = torch.ceil(box[..., 3] / step - 0.5).clamp(0, rh).long()
    if stages is not None:
        if tokens.stage is None:
            raise ValueError("coverage_raster: tokens carry no stage labels")
        keep = torch.isin(tokens.stage, torch.as_tensor(list(stages)))
        x1 = torch.where(keep, x1, x0)                                       # empty footprint
    diff = torch.zeros(b, (rh + 1) * (rw + 1), dtype=torch.long)
    one = torch.ones_like(x0)
    for ys, xs, sign in ((y0, x0, 1), (y0, x1, -1), (y1, x0, -1), (y1, x1, 1)):
        diff.scatter_add_(1, ys * (rw + 1) + xs, sign * one)
    return diff.view(b, rh + 1, rw + 1).cumsum(1).cumsum(2)[:, :rh, :rw] > 0
