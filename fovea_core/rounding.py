"""Apportionment: integer counts proportional to weights that sum exactly to a total.

The definition of Hamilton's largest-remainder method, used by the biology code
(:func:`fovea_book.biology.cortex.band_budget`, numpy), so that "how a token budget is
split" is defined in one place. The allocators run its torch twin
(:func:`fovea_core.allocators.base.largest_remainder`: the same float64 steps in the same
order, on the scores' device without host syncs); ``tests/test_allocators_device.py``
holds the two to identical quotas. numpy only (light to import).
"""

from __future__ import annotations

import numpy as np

__all__ = ["largest_remainder"]


def largest_remainder(weights, total, *, minimum: int = 0, capacity=None) -> np.ndarray:
    """Integer quotas ``[..., G]`` proportional to ``weights`` that sum to ``total`` per row.

    Each of the ``G`` groups first gets ``minimum``; the remaining ``total - minimum * G``
    (clipped at 0) is split in proportion to ``max(weights, 0)`` by Hamilton's
    largest-remainder method: every group gets the floor of its exact quota, and the units
    still missing go to the largest fractional remainders (float64), ties to the lower group
    index. A row whose weights sum to zero is split equally. With ``capacity``
    (broadcastable to the weights) the quotas are clipped to it afterwards, so the sum can
    then fall short (callers fill the rest).

    Args:
        weights: ``[..., G]`` finite real weights (negative values count as 0), ``G >= 1``.
        total: non-negative integer total, a scalar or one per row (shape ``weights.shape[:-1]``).
        minimum: integer floor given to every group before the proportional split.
        capacity: optional per-group upper bound, broadcastable to ``weights``.

    Returns:
        int64 array of the weights' shape; each row sums to ``max(total, minimum * G)``
        unless ``capacity`` clips it.

    Raises:
        ValueError: naming ``weights`` (empty, NaN/inf), ``total`` (negative or not an
            integer) or ``minimum`` (negative).
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim == 0 or w.shape[-1] == 0:
        raise ValueError(f"weights must have a non-empty last axis [..., G], got shape {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValueError("weights must be finite (no NaN/inf)")
    t = np.asarray(total, dtype=np.float64)
    if not np.all(np.isfinite(t)) or np.any(t < 0) or np.any(t != np.floor(t)):
        raise ValueError(f"total must be a non-negative integer (per row), got {total!r}")
    if int(minimum) != minimum or minimum < 0:
        raise ValueError(f"minimum must be a non-negative integer, got {minimum!r}")
    g = w.shape[-1]
    rest = np.maximum(np.broadcast_to(t, w.shape[:-1]) - minimum * g, 0.0)
    w = np.maximum(w, 0.0)
    wsum = w.sum(axis=-1, keepdims=True)
    share = np.where(wsum > 0, w / np.where(wsum > 0, wsum, 1.0), 1.0 / g)
    quota = share * rest[..., None]
    base = np.floor(quota)
    left = np.rint(rest - base.sum(axis=-1)).astype(np.int64)            # 0 <= left < G
    order = np.argsort(-(quota - base), axis=-1, kind="stable")        # largest remainder first
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(g), order.shape), axis=-1)
    q = base.astype(np.int64) + (rank < left[..., None]) + int(minimum)
    return q if capacity is None else np.minimum(q, np.asarray(capacity, dtype=np.int64))
