"""The layout of a pyramid's levels above level 0 in one flat buffer (the kernels' packed
pyramids: :func:`~fovea_core.kernels.ops.device_pyramid`, and the book's CPU pyramids,
``fovea_book.kernels.build_pyramid_cv2``)."""

from __future__ import annotations

import torch


def _layout_lists(batch: int, channels: int, h: int, w: int, num_levels: int, first: int = 0
                  ) -> tuple[list[int], list[tuple[int, int]], int]:
    """:func:`_layout` as plain Python (no tensors made: for a hot path that needs only the
    total)."""
    sizes, offsets, off = [], [], 0
    for m in range(num_levels):
        if m >= first:
            sizes.append((h, w))
            offsets.append(off)
            off += batch * h * w * channels
        h, w = (h + 1) // 2, (w + 1) // 2
    return offsets, sizes, off


def _layout(batch: int, channels: int, h: int, w: int, num_levels: int, first: int = 0
            ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Sizes of levels ``first..num_levels-1`` and their offsets in one flat buffer."""
    offsets, sizes, off = _layout_lists(batch, channels, h, w, num_levels, first)
    return (torch.tensor(offsets, dtype=torch.int64), torch.tensor(sizes, dtype=torch.int32),
            off)
