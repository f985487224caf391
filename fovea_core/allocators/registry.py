"""The allocator registry: ``ALLOCATORS[name]`` -> callable, plus per-method metadata.

Every registered allocator has the signature::

    fn(pyramid, scores, budget, *, fixation=None, query=None, seed=0, patch=16, **params)
        -> TokenSet            # exactly ``budget`` distinct tokens per image

except the two wrappers whose output shape differs (``INFO[name]["kind"]``):
``"multi"`` (``multi_fixation`` with ``mode="per_fixation"`` returns ``k * budget`` tokens)
and ``"buckets"`` (``adaptive_budget`` returns a list of per-bucket results).
"""

from __future__ import annotations

import importlib
import inspect
import sys
import threading
from collections.abc import Callable, Iterator, MutableMapping

#: The plug-in point: modules of a *higher* layer that register allocators into this one
#: registry when imported (``tests/test_layers.py``: layers point down, so this layer never
#: imports them). They are imported the first time the registry is read (a lookup, ``in``,
#: an iteration, :func:`allocate`), never when ``fovea_core.allocators`` is imported, so
#: ``from fovea_core.allocators import ALLOCATORS, allocate`` still lists and runs every
#: method, the budgeted cascade's (``"cascade"``, ``"cascade_gist_query"``,
#: ``"cascade_prior"``, ``"cascade_text"``) included, in the order of registration (this
#: layer's methods first). Add one with :func:`add_plugin`. A plug-in whose import fails is
#: left out; :func:`allocate` names it and its error when asked for a name it lacks.
PLUGINS: list[str] = ["fovea_core.cascade.allocator"]

_plugin_lock = threading.RLock()
_plugins_loaded: set[str] = set()
_plugin_errors: dict[str, str] = {}


def add_plugin(module: str) -> None:
    """Register ``module`` (a dotted name) as a plug-in: imported the next time the registry
    is read, so that its ``register(...)`` calls run (see :data:`PLUGINS`)."""
    if not isinstance(module, str) or not module:
        raise ValueError(f"module must be a dotted module name, got {module!r}")
    with _plugin_lock:
        if module not in PLUGINS:
            PLUGINS.append(module)


def load_plugins() -> None:
    """Import the :data:`PLUGINS` not imported yet (each once; a failed import is recorded
    in ``plugin_errors()`` and not retried). Reading the registry calls this; a read made
    while a plug-in is being imported (its own ``register`` calls) does not recurse."""
    if len(_plugins_loaded) + len(_plugin_errors) >= len(PLUGINS):
        return
    with _plugin_lock:
        for module in list(PLUGINS):
            if module in _plugins_loaded or module in _plugin_errors:
                continue
            _plugins_loaded.add(module)           # before the import: no recursion
            if module in sys.modules:             # imported, or being imported (the
                continue                          # registry read from inside its import)
            try:
                importlib.import_module(module)
            except ImportError as err:            # e.g. an optional dependency is missing
                _plugins_loaded.discard(module)
                _plugin_errors[module] = f"{type(err).__name__}: {err}"


def plugin_errors() -> dict[str, str]:
    """``{plug-in module: its import error}`` for the plug-ins that could not be imported."""
    return dict(_plugin_errors)


class _Registry(MutableMapping):
    """A ``dict``-like table (name -> value) that imports the :data:`PLUGINS` before it is
    read, so that their methods are in it. Writes (``register``) never trigger a load."""

    def __init__(self) -> None:
        self._data: dict = {}

    def __getitem__(self, key):
        load_plugins()
        return self._data[key]

    def __setitem__(self, key, value) -> None:
        self._data[key] = value

    def __delitem__(self, key) -> None:
        del self._data[key]

    def __iter__(self) -> Iterator:
        load_plugins()
        return iter(list(self._data))

    def __len__(self) -> int:
        load_plugins()
        return len(self._data)

    def __contains__(self, key) -> bool:
        load_plugins()
        return key in self._data

    def __repr__(self) -> str:
        load_plugins()
        return repr(self._data)


#: name -> allocator (callable), in the order of registration
ALLOCATORS: MutableMapping[str, Callable] = _Registry()
#: name -> metadata (see :func:`register`)
INFO: MutableMapping[str, dict] = _Registry()


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
    ``side_compute`` (what ``reads`` declares is *side compute* in ``shared/PROTOCOL.md``'s
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
        if name in ALLOCATORS._data:              # no plug-in load: may run inside one
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
                         + _plugin_note())
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
                         + _plugin_note())
    reads = INFO[name]["reads"]
    return 0 if reads is None else int(reads(pyramid))


def _plugin_note() -> str:
    """The plug-ins that failed to import, for an unknown-name error ("" if none)."""
    return "".join(f"; plug-in {m} was not loaded ({e})" for m, e in _plugin_errors.items())
