"""The allocator registry: ``ALLOCATORS[name]`` -> callable, plus per-method metadata.

Every registered allocator has the signature::

    fn(pyramid, scores, budget, *, fixation=None, query=None, seed=0, patch=16, **params)
        -> TokenSet            # exactly ``budget`` distinct tokens per image

except the two wrappers whose output shape differs (``INFO[name]["kind"]``):
``"multi"`` (``multi_fixation`` with ``mode="per_fixation"`` returns ``k * budget`` tokens)
and ``"buckets"`` (``adaptive_budget`` returns a list of per-bucket results).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

#: name -> allocator (callable), in the order of registration
ALLOCATORS: dict[str, Callable] = {}
#: name -> metadata (see :func:`register`)
INFO: dict[str, dict] = {}


def _signature_defaults(fn: Callable) -> dict:
    return {k: p.default for k, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty}


def register(name: str, *, family: str, version: str = "", kind: str = "fixed",
             coverage: str | None = None, content: bool = False, learned: bool = False,
             reads: Callable | None = None, uses_scores: bool = True,
             side_compute: bool = False, **defaults) -> Callable[[Callable], Callable]:
    """Decorator adding ``fn`` (optionally with fixed keyword ``defaults``) as ``name``.

    Metadata: ``family`` (module), ``version`` (Homunculus variant, e.g. ``"v1"``),
    ``kind`` (``"fixed"`` = exactly ``budget`` tokens), ``coverage`` (the guarantee the
    method promises, e.g. ``"stratum"``, ``"logpolar_bin"``; ``None`` = none), ``content``
    (reads image pixels from the pyramid), ``learned`` (has trained parameters),
    ``reads`` (for a ``content`` method: ``reads(pyramid) -> pixels`` it looks at, its cost
    outside the token budget; see :func:`allocator_reads`), ``uses_scores`` (``False``: the
    tokens' centres and levels do not depend on the score map, so a sweep does not charge
    the scorer's reads to this method; ``tests/test_allocators.py`` holds it to that),
    ``side_compute`` (what ``reads`` declares is *side compute* in the evaluation protocol's (``book/protocol.md``)
    labels: a look outside N that says where text or ink is and never what it says, costed
    in FLOPs, milliseconds and pixels beside N, not as unbudgeted reading).

    A keyword bound here with a value that differs from ``fn``'s own default makes ``name``
    a *variant* (e.g. ``"stratified_8x8"`` = ``stratified`` with ``strata=8``): that value
    is part of the name, recorded in ``INFO[name]["fixed"]``, and passing a different value
    through :func:`allocate` raises ``ValueError`` naming the parameter instead of silently
    running another method under the variant's name. A keyword bound to ``fn``'s own
    default is documentation only (``INFO[name]["params"]``) and may be overridden.
    """
    if side_compute and reads is None:
        raise ValueError(f"allocator {name!r} declares side compute: declare reads= (its pixels)")
    if content and reads is None:
        raise ValueError(f"allocator {name!r} reads pixels (content=True): declare reads=")
    def deco(fn: Callable) -> Callable:
        if name in ALLOCATORS:
            raise ValueError(f"allocator {name!r} is already registered")
        own = _signature_defaults(fn)
        fixed = {k: v for k, v in defaults.items() if k not in own or own[k] != v}
        if defaults:
            def bound(pyramid, scores, budget=None, **kw):
                for key, val in fixed.items():
                    if key in kw and kw[key] != val:
                        raise ValueError(
                            f"{name}: parameter {key!r} is fixed to {val!r} by this registered "
                            f"variant, got {key}={kw[key]!r}; call {fn.__name__!r} (or register "
                            f"another name) to use a different {key}")
                return fn(pyramid, scores, budget, **{**defaults, **kw})
            bound.__name__ = name
            bound.__doc__ = f"``{fn.__name__}`` with {defaults}.\n\n" + (fn.__doc__ or "")
            ALLOCATORS[name] = bound
        else:
            ALLOCATORS[name] = fn
        INFO[name] = dict(family=family, version=version, kind=kind, coverage=coverage,
                          content=content, learned=learned, params=defaults, fixed=fixed,
                          reads=reads, uses_scores=uses_scores, side_compute=side_compute)
        return fn
    return deco


def allocate(name: str, pyramid, scores, budget=None, **kwargs):
    """Run the allocator registered as ``name`` (see :data:`ALLOCATORS`).

    ``scores`` may be ``None`` for an allocator registered with ``uses_scores=False`` (its
    tokens do not depend on the map): a zero map ``[B, Gh, Gw]`` of the pyramid's patch
    grid, on the pyramid's device, stands in for it, so the shared checks still run. The
    cascade takes ``None`` itself (its budget is not capped by the grid). Any other allocator raises
    ``ValueError`` naming ``scores`` (:func:`~fovea_core.allocators.base.check_inputs`).
    """
    if name not in ALLOCATORS:
        raise ValueError(f"unknown allocator {name!r}; registered: {sorted(ALLOCATORS)}"
                         + _CASCADE_NOTE)
    info = INFO[name]
    if scores is None and not info["uses_scores"] and info["family"] != "cascade":
        import torch

        from fovea_core.pyramid import Pyramid

        patch = kwargs.get("patch", 16)
        if isinstance(pyramid, Pyramid) and isinstance(patch, int) and not isinstance(
                patch, bool) and patch >= 1:
            scores = torch.zeros(pyramid.batch_size, *pyramid.grid_shape(patch, 0),
                                 device=pyramid.base.device)      # where the image is
    return ALLOCATORS[name](pyramid, scores, budget, **kwargs)


def allocator_reads(name: str, pyramid) -> int:
    """Pixels allocator ``name`` looks at on ``pyramid`` besides the scores (0 for methods that
    read only the score map; the declared ``reads`` of the content methods)."""
    if name not in INFO:
        raise ValueError(f"unknown allocator {name!r}; registered: {sorted(INFO)}"
                         + _CASCADE_NOTE)
    reads = INFO[name]["reads"]
    return 0 if reads is None else int(reads(pyramid))


#: the hint of an unknown-name error: the cascade's methods join the table when
#: :mod:`fovea_core.cascade` is imported (a higher layer; :mod:`fovea_core.methods` imports both)
_CASCADE_NOTE = ("; the budgeted cascade's methods (cascade, cascade_text, ...) are registered "
                 "when fovea_core.cascade is imported: use fovea_core.methods.allocate")
