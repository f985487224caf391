"""The cascade's documentation names only what exists (an old version described a
``cascade.saccade`` that was absent, a ``STAGE_SACCADE`` never produced, a ``fovea_level``
never called).

Every Sphinx cross-reference (``:mod:``, ``:func:``, ``:class:``, ``:data:``, ``:meth:``,
``:attr:``) in the source of the modules below must resolve to an importable module or an
attribute, and a cascade's tokens carry only the stage labels the package exports."""

from __future__ import annotations

import importlib
import inspect
import re

import numpy as np
import pytest

#: modules whose docstrings this test reads (the cascade's layers, the processor that runs
#: it twice, the cost rule that labels it; the book modules that train and label for it)
MODULES = ["fovea_core.cascade", "fovea_core.cascade.core", "fovea_core.cascade.learned",
           "fovea_core.cascade.allocator", "fovea_core.cascade.reading",
           "fovea_core.cascade.side", "fovea_core.cascade.raster", "fovea_core.vlm.processor",
           "fovea_core.cost", "fovea_core.cache", "fovea_core.methods", "fovea_book.train",
           "fovea_core.cascade.pseudo_labels"]
_REF = re.compile(r":(?:mod|func|class|data|meth|attr|exc):`~?([\w.]+)`")


def _has(obj, attr: str) -> bool:
    """An attribute, or a field a dataclass declares (``Gist.image`` has no class default)."""
    return hasattr(obj, attr) or attr in getattr(obj, "__dataclass_fields__", {})


def _resolves(name: str, home) -> bool:
    """``name`` as Sphinx would look it up from module ``home``: dotted from the top
    (``fovea_core.x.y``), else relative to ``home`` (``foveate``, ``Gist.inside``)."""
    parts = name.split(".")
    if parts[0] not in ("fovea_core", "fovea_book"):
        # from the module, or (as Sphinx does inside a class's docstring) from one of its
        # classes: ``:meth:`get``` in SqliteCache's docstring is SqliteCache.get
        classes = [c for _, c in inspect.getmembers(home, inspect.isclass)
                   if c.__module__ == home.__name__]
        for start in (home, *classes):
            obj = start
            for p in parts:
                if not _has(obj, p):
                    break
                obj = getattr(obj, p, None)
            else:
                return True
        return False
    for cut in range(len(parts), 0, -1):              # longest importable module prefix
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for p in parts[cut:]:
            if not _has(obj, p):
                return False
            obj = getattr(obj, p, None)
        return True
    return False


def _refs(text: str) -> list[str]:
    return _REF.findall(text)


def test_the_reference_scan_sees_a_missing_module_and_a_missing_function():
    core = importlib.import_module("fovea_core.cascade.core")
    old = ("(d) optionally a second saccade (:mod:`fovea_core.cascade.saccade`); "
           ":data:`STAGE_SACCADE` = 2; :func:`fovea_level`; :func:`place_fovea`")
    ok = {r: _resolves(r, core) for r in _refs(old)}
    assert ok == {"fovea_core.cascade.saccade": False, "STAGE_SACCADE": False,
                  "fovea_level": False, "place_fovea": True}


@pytest.mark.parametrize("name", MODULES)
def test_every_cross_reference_resolves(name):
    mod = importlib.import_module(name)
    refs = _refs(inspect.getsource(mod))
    assert refs, f"{name}: no cross-reference found (the pattern is wrong)"
    missing = sorted({r for r in refs if not _resolves(r, mod)})
    assert not missing, f"{name} documents names that do not exist: {missing}"


def test_a_cascade_labels_its_tokens_with_the_exported_stages():
    import fovea_core.cascade as cascade_pkg
    from fovea_core import build_pyramid
    from fovea_core.cascade import STAGE_FOVEA, STAGE_GIST, cascade_parts
    from fovea_core.cascade.localisers import uniform

    stages = {v for k, v in vars(cascade_pkg).items() if k.startswith("STAGE_")}
    assert stages == {STAGE_GIST, STAGE_FOVEA}
    page = np.full((600, 500, 3), 255, np.uint8)
    page[100:120, 50:450] = 0
    t = cascade_parts(build_pyramid(page), 273, query="q", localiser=uniform).tokens
    assert set(t.stage.unique().tolist()) == stages
