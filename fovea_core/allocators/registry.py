"""The method registry: one table written by one decorator (:func:`register`):
``ALLOCATORS[name]`` -> callable, ``INFO[name]`` -> its metadata, options and runner.

Every registered allocator has the signature::

    fn(pyramid, scores, budget, *, fixation=None, query=None, seed=0, patch=16, **params)
        -> TokenSet            # exactly ``budget`` distinct tokens per image

(a method with stages, registered with ``runner=``, also returns every intermediate through
:func:`allocate_parts`), except the two wrappers whose output shape differs
(``INFO[name]["kind"]``): ``"multi"`` (``multi_fixation`` with ``mode="per_fixation"`` returns
``k * budget`` tokens) and ``"buckets"`` (``adaptive_budget`` returns a list of per-bucket
results).
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
             side_compute: bool = False, runner: Callable | None = None,
             **defaults) -> Callable[[Callable], Callable]:
    """Decorator adding ``fn`` (optionally with keyword ``defaults``) as ``name``: the one
    place a method enters :data:`ALLOCATORS` and :data:`INFO`.

    Metadata: ``family`` (module), ``version`` (Homunculus variant, e.g. ``"v1"``), ``kind``
    (``"fixed"`` = exactly ``budget`` tokens), ``coverage`` (the guarantee the method promises,
    e.g. ``"stratum"``, ``"logpolar_bin"``; ``None`` = none), ``content`` (reads image pixels
    from the pyramid), ``learned`` (has trained parameters), ``reads`` (for a ``content``
    method: ``reads(pyramid) -> pixels`` it looks at, its cost outside the token budget; see
    :func:`allocator_reads`), ``uses_scores`` (``False``: the tokens' centres and levels do not
    depend on the score map, so a sweep does not charge the scorer's reads to this method;
    ``tests/test_allocators.py`` holds it to that), ``side_compute`` (what ``reads`` declares
    is *side compute* in the evaluation protocol's (``book/protocol.md``) labels: a look
    outside N that says where text or ink is and never what it says, costed in FLOPs,
    milliseconds and pixels beside N, not as unbudgeted reading).

    A keyword bound here with a value that differs from ``fn``'s own default makes ``name``
    a *variant* (e.g. ``"stratified_8x8"`` = ``stratified`` with ``strata=8``): that value
    is part of the name, recorded in ``INFO[name]["fixed"]``, and passing a different value
    through :func:`allocate` raises ``ValueError`` naming the parameter instead of silently
    running another method under the variant's name. A keyword bound to ``fn``'s own
    default is documentation only (``INFO[name]["params"]``) and may be overridden.

    ``runner`` (a method with stages, the cascade's): ``runner(pyramid, budget, *, query,
    patch, **options)`` returns every intermediate (``.tokens`` among them), which
    :func:`allocate_parts` returns; ``defaults`` are then options a call may override (none
    is fixed), and ``fn`` only documents the method. ``INFO[name]`` holds the metadata, ``fn``,
    ``runner``, ``params`` (every bound keyword) and ``fixed``.
    """
    if side_compute and reads is None:
        raise ValueError(f"allocator {name!r} declares side compute: declare reads= (its pixels)")
    if content and reads is None:
        raise ValueError(f"allocator {name!r} reads pixels (content=True): declare reads=")
    def deco(fn: Callable) -> Callable:
        if name in ALLOCATORS:
            raise ValueError(f"allocator {name!r} is already registered")
        own = _signature_defaults(fn)
        fixed = {} if runner is not None else {
            k: v for k, v in defaults.items() if k not in own or own[k] != v}
        if runner is not None:
            def staged(pyramid, scores, budget=None, **kw):
                return allocate_parts(name, pyramid, scores, budget, **kw).tokens
            staged.__name__, staged.__doc__ = name, fn.__doc__
            ALLOCATORS[name] = staged
        elif defaults:
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
                          reads=reads, uses_scores=uses_scores, side_compute=side_compute,
                          fn=fn, runner=runner)
        return fn
    return deco


def _entry(name: str) -> dict:
    """``INFO[name]``; an unknown name raises ``ValueError`` listing the registered ones."""
    if name not in INFO:
        raise ValueError(f"unknown allocator {name!r}; registered: {sorted(INFO)}"
                         + _CASCADE_NOTE)
    return INFO[name]


def allocate(name: str, pyramid, scores, budget=None, **kwargs):
    """Run the allocator registered as ``name`` (see :data:`ALLOCATORS`).

    ``scores`` may be ``None`` for an allocator registered with ``uses_scores=False`` (its
    tokens do not depend on the map): a zero map ``[B, Gh, Gw]`` of the pyramid's patch
    grid, on the pyramid's device, stands in for it, so the shared checks still run. The
    methods with stages (the cascade's) take ``None`` themselves (their budget is not capped by
    the grid). Any other allocator raises
    ``ValueError`` naming ``scores`` (:func:`~fovea_core.allocators.base.check_inputs`).
    """
    info = _entry(name)
    if scores is None and not info["uses_scores"] and info["runner"] is None:
        import torch

        from fovea_core.pyramid import Pyramid

        patch = kwargs.get("patch", 16)
        if isinstance(pyramid, Pyramid) and isinstance(patch, int) and not isinstance(
                patch, bool) and patch >= 1:
            scores = torch.zeros(pyramid.batch_size, *pyramid.grid_shape(patch, 0),
                                 device=pyramid.base.device)      # where the image is
    return ALLOCATORS[name](pyramid, scores, budget, **kwargs)


def allocate_parts(name: str, pyramid, scores, budget=None, *, fixation=None,
                   query: str | None = None, seed: int = 0, patch: int = 16, **kwargs):
    """:func:`allocate` for a method registered with a ``runner`` (e.g. ``"cascade_text"``),
    returning every intermediate, its side cost included, from the run that made the tokens;
    ``INFO[name]["params"]`` are the defaults of ``kwargs``. ``scores`` (``[B, Gh, Gw]`` or
    ``None``), ``fixation`` and ``seed`` are held to the shared rules and otherwise ignored.
    Raises ``ValueError`` for a ``name`` without a runner (listing those with one) and what
    the shared checks and the runner raise."""
    info = _entry(name)
    if info["runner"] is None:
        staged = [n for n, i in INFO.items() if i["runner"] is not None]
        raise ValueError(f"{name!r} is not a method with stages; those are: "
                         f"{', '.join(staged)}")
    if scores is not None:              # ignored, but held to the shared rules like any map
        from fovea_core.allocators.base import check_inputs

        _, budget = check_inputs(pyramid, scores, budget, patch=patch, name=info["family"])
    check_fixation(pyramid, fixation)
    return info["runner"](pyramid, budget, query=query, patch=patch,
                          **{**info["params"], **kwargs})


def check_fixation(pyramid, fixation) -> None:
    """A given ``fixation`` that the method ignores (it fixates its own map's peak) is still
    held to the shared rule (:func:`~fovea_core.allocators.base.resolve_fixation`: finite,
    in [0, 1]); ``None`` passes."""
    if fixation is not None:
        import torch

        from fovea_core.allocators.base import resolve_fixation
        from fovea_core.pyramid import Pyramid

        resolve_fixation(fixation, torch.zeros(pyramid.batch_size if isinstance(
            pyramid, Pyramid) else 1, 1, 1))


def allocator_reads(name: str, pyramid) -> int:
    """Pixels allocator ``name`` looks at on ``pyramid`` besides the scores (0 for methods that
    read only the score map; the declared ``reads`` of the content methods)."""
    reads = _entry(name)["reads"]
    return 0 if reads is None else int(reads(pyramid))


#: the hint of an unknown-name error: the cascade's methods join the table when
#: :mod:`fovea_core.cascade` is imported (a higher layer; :mod:`fovea_core.methods` imports both)
_CASCADE_NOTE = ("; the budgeted cascade's methods (cascade, cascade_text, ...) are registered "
                 "when fovea_core.cascade is imported: use fovea_core.methods.allocate")
