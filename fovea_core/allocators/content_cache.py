"""Per-page cache of what content allocators compute from pixels (``atlas``' superpixels,
``frequency``'s steerable-band energies).

That content cost does not depend on the budget, so a budget sweep over the same page pays it
once: the value is kept under a key made of a BLAKE2 digest of the exact pixels read and the
parameters. The cache is bounded (least recently used entries go first) and per process.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

MAX_ENTRIES = 512
_CACHE: OrderedDict[tuple, Any] = OrderedDict()
STATS = {"hits": 0, "misses": 0}


def page_key(pixels: np.ndarray, *params: object) -> tuple:
    """Key of one page's pixels (any array; dtype and shape included) and parameters."""
    arr = np.ascontiguousarray(pixels)
    digest = hashlib.blake2b(arr.tobytes(), digest_size=16).hexdigest()
    return (digest, arr.dtype.str, arr.shape, *params)


def cached(key: tuple, compute: Callable[[], Any]) -> Any:
    """``compute()`` once per ``key`` (LRU, :data:`MAX_ENTRIES` entries)."""
    if key in _CACHE:
        STATS["hits"] += 1
        _CACHE.move_to_end(key)
        return _CACHE[key]
    STATS["misses"] += 1
    value = compute()
    _CACHE[key] = value
    while len(_CACHE) > MAX_ENTRIES:
        _CACHE.popitem(last=False)
    return value


def clear() -> None:
    """Forget every page (e.g. to time the content cost itself)."""
    _CACHE.clear()
    STATS.update(hits=0, misses=0)
