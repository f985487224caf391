"""The allocator registry: ``ALLOCATORS[name]`` -> callable, plus per-method metadata.

Every registered allocator has the signature::

    fn(pyramid, scores, budget, *, fixation=None, query=None, seed=0, patch=16, **params)
        -> TokenSet            # exactly ``budget`` distinct tokens per image

except the two wrappers whose output shape differs (``INFO[name]["kind"]``):
``"multi"`` (``multi_fixation`` with ``mode="per_fixation"`` returns ``k * budget`` tokens)
and ``"buckets"`` (``adaptive_budget`` returns a list of per-bucket results).
"""

from __future__ import annotations

from collections.abc import Callable

ALLOCATORS: dict[str, Callable] = {}
INFO: dict[str, dict] = {}


def register(name: str, *, family: str, version: str = "", kind: str = "fixed",
             coverage: str | None = None, content: bool = False, learned: bool = False,
             reads: Callable | None = None, **defaults) -> Callable[[Callable], Callable]:
    """Decorator adding ``fn`` (optionally with fixed keyword ``defaults``) as ``name``.

    Metadata: ``family`` (module), ``version`` (Homunculus variant, e.g. ``"v1"``),
    ``kind`` (``"fixed"`` = exactly ``budget`` tokens), ``coverage`` (the guarantee the
    method promises, e.g. ``"stratum"``, ``"logpolar_bin"``; ``None`` = none), ``content``
    (reads image pixels from the pyramid), ``learned`` (has trained parameters),
    ``reads`` (for a ``content`` method: ``reads(pyramid) -> pixels`` it looks at, its cost
    outside the token budget; see :func:`allocator_reads`).
    """
    if content and reads is None:
        raise ValueError(f"allocator {name!r} reads pixels (content=True): declare reads=")
    def deco(fn: Callable) -> Callable:
        if name in ALLOCATORS:
            raise ValueError(f"allocator {name!r} is already registered")
        if defaults:
            def bound(pyramid, scores, budget=None, **kw):
                return fn(pyramid, scores, budget, **{**defaults, **kw})
            bound.__name__ = name
            bound.__doc__ = f"``{fn.__name__}`` with {defaults}.\n\n" + (fn.__doc__ or "")
            ALLOCATORS[name] = bound
        else:
            ALLOCATORS[name] = fn
        INFO[name] = dict(family=family, version=version, kind=kind, coverage=coverage,
                          content=content, learned=learned, params=defaults, reads=reads)
        return fn
    return deco


def allocate(name: str, pyramid, scores, budget=None, **kwargs):
    """Run the allocator registered as ``name`` (see :data:`ALLOCATORS`)."""
    if name not in ALLOCATORS:
        raise ValueError(f"unknown allocator {name!r}; registered: {sorted(ALLOCATORS)}")
    return ALLOCATORS[name](pyramid, scores, budget, **kwargs)


def allocator_reads(name: str, pyramid) -> int:
    """Pixels allocator ``name`` looks at on ``pyramid`` besides the scores (0 for methods that
    read only the score map; the declared ``reads`` of the content methods)."""
    if name not in INFO:
        raise ValueError(f"unknown allocator {name!r}; registered: {sorted(INFO)}")
    reads = INFO[name]["reads"]
    return 0 if reads is None else int(reads(pyramid))
