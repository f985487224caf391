"""Layers point down (DESIGN.md, "Layers point down"; issue 21 item 1).

The import graph of ``fovea_core`` is built from the source with ``ast`` (nothing is
imported), and checked for two things:

* **no cycle**: no module reaches itself through imports;
* **no upward import**: no module imports a module of a higher layer (:data:`LAYERS`).

What counts as an import (decided here, for both checks):

* every ``import`` / ``from ... import`` statement anywhere in a module: at module level,
  inside functions, inside ``try`` blocks and ``if TYPE_CHECKING`` alike (a function-level
  import is still a dependency; deferring it only hides a cycle until the call);
* relative imports, resolved against the importing module's package;
* ``importlib.import_module("fovea_core....")`` with a literal name (a computed name, as
  ``bench/__main__`` builds from its command line, cannot be seen and is not counted);
* the **package ``__init__`` files Python runs** on the way: importing
  ``fovea_core.allocators.base`` executes ``fovea_core/allocators/__init__.py`` first, so
  it is an import of ``fovea_core.allocators`` too, unless that package encloses the
  importing module (an enclosing package is always initialised before its modules). An
  explicit ``from fovea_core.pkg import name`` of a non-module name is an import of
  ``fovea_core.pkg``'s ``__init__`` in every case.

The scan reads ``$FOVEA_LAYERS_ROOT`` (a copy of ``fovea_core``) when set, this repository's
``fovea_core`` otherwise; :func:`test_the_check_fails_on_the_old_bad_imports` runs it on a
scratch copy with the imports of the old code put back.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

PACKAGE = "fovea_core"
REPO_ROOT = Path(__file__).resolve().parents[1] / PACKAGE
SCAN_ROOT = Path(os.environ.get("FOVEA_LAYERS_ROOT", REPO_ROOT))

#: The layer of every module, by dotted name relative to ``fovea_core`` ("" = the package's
#: own ``__init__``); the longest matching prefix wins, so a new module inherits its
#: package's layer and a new top-level module must be placed here. A module may import its
#: own layer and the layers below (the cycle check keeps same-layer imports one-way).
#: The root ``""`` holds the package ``__init__`` only (a prefix of nothing).
#: Decided from DESIGN.md ("tokens/pyramid at the bottom; sample, kernels and logpolar on
#: them; importance and allocators above; eval, cascade evaluation, bench and book on top")
#: and from what the code imports:
LAYERS: dict[str, float] = {
    # 0: the data every layer shares; the root facade re-exports from this layer only
    "": 0, "cache": 0, "paths": 0, "profiles": 0, "rounding": 0, "tokens": 0, "pyramid": 0,
    # 1: reading pixels (reference sampler, kernels, log-polar remap), token density, and the
    # biology the allocators take their constants from (biology imports paths, rounding)
    "sample": 1, "kernels": 1, "logpolar": 1, "density": 1, "biology": 1,
    # 2: deciding: importance scorers and the allocators (one registry of methods)
    "importance": 2, "allocators": 2,
    # 3: the budgeted cascade, an allocator built from allocators and scorers, in sub-layers:
    # the footprint raster < the stages (core) < localisers and the learned network < the
    # chaining allocator (and the package __init__, which re-exports all of them)
    "cascade": 3.3, "cascade.raster": 3.0, "cascade.core": 3.1, "cascade.learned": 3.2,
    "cascade.localisers": 3.2, "cascade.allocator": 3.3,
    # 4: evaluating and showing: datasets, readers, sweeps, the cascade's evaluation, the
    # training commands (they read the datasets of eval), benchmarks, the VLM bridge, figures
    "eval": 4, "cascade.metrics": 4, "cascade.evaluate": 4, "cascade.train": 4,
    "importance.fit_fixation": 4, "bench": 4, "vlm": 4, "plotting": 4,
    # 5: what a user runs: the book (runs notebooks, which use everything), the one-call
    # entry point and its command line (issue 24)
    "book": 5, "foveate": 5, "__main__": 5, "vlm.processor": 5,
}

#: Known violations still in the code, each an edge (importer, imported) of the graph with
#: the file to change. They are left out of both checks; the last test fails as soon as one
#: is gone, so that it is removed from here too. Add nothing to this table.
PENDING: dict[tuple[str, str], str] = {
}


# ----------------------------------------------------------------------------- the graph
def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """``{dotted name: (file, is_package)}`` for every ``.py`` file under ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [PACKAGE, *path.relative_to(root).with_suffix("").parts]
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imported_names(node: ast.AST, module: str, is_pkg: bool, known: dict) -> list[str]:
    """The dotted names one AST node imports (a module, or a package's ``__init__``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:                                   # relative: from its own package
            pkg = module.split(".") if is_pkg else module.split(".")[:-1]
            pkg = pkg[:len(pkg) - node.level + 1]
            base = ".".join(pkg + ([base] if base else []))
        # `from pkg import sub` imports the module pkg.sub; `from pkg import name`, pkg itself
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                for a in node.names]
    if isinstance(node, ast.Call):                       # importlib.import_module("literal")
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
        if name == "import_module" and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            return [node.args[0].value]
    return []


def import_graph(root: Path = SCAN_ROOT) -> dict[str, dict[str, int]]:
    """``{importer: {imported: first line}}`` over the modules of ``fovea_core`` at ``root``
    (both dotted names in full; see the module docstring for what counts)."""
    known = _modules(root)
    graph: dict[str, dict[str, int]] = {m: {} for m in known}
    for module, (path, is_pkg) in known.items():
        enclosing = set(_ancestors(module))
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            for target in _imported_names(node, module, is_pkg, known):
                if target.split(".")[0] != PACKAGE:
                    continue
                while target not in known and "." in target:   # a name inside a module
                    target = target.rpartition(".")[0]
                # the module itself, and the package __init__ files run on the way to it
                for t in [target] + [a for a in _ancestors(target) if a not in enclosing]:
                    if t != module:
                        graph[module].setdefault(t, node.lineno)
    return graph


def _short(name: str) -> str:
    return name[len(PACKAGE) + 1:] if name != PACKAGE else ""


def layer_of(name: str) -> float:
    """The layer of a module (dotted name in full): its longest prefix in :data:`LAYERS`
    (``""`` is the root ``__init__`` alone, never a prefix). ``KeyError`` if none."""
    rel = _short(name)
    if not rel:
        return LAYERS[""]
    while rel:
        if rel in LAYERS:
            return LAYERS[rel]
        rel = rel.rpartition(".")[0]
    raise KeyError(name)


def _without_pending(graph: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return {a: {b: ln for b, ln in out.items() if (_short(a), _short(b)) not in PENDING}
            for a, out in graph.items()}


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    """``"a (layer) -> b (layer), line n"`` for every import of a higher layer."""
    return [f"{a} ({layer_of(a):g}) -> {b} ({layer_of(b):g}), line {ln}"
            for a, out in sorted(graph.items()) for b, ln in sorted(out.items())
            if layer_of(b) > layer_of(a)]


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, {})))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def _describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    inside = set(cycle)
    edges = [f"  {a} -> {b} (line {ln})" for a in cycle for b, ln in sorted(graph[a].items())
             if b in inside]
    return "cycle among " + ", ".join(cycle) + ":\n" + "\n".join(edges)


# ----------------------------------------------------------------------------- the checks
@pytest.fixture(scope="module")
def graph() -> dict[str, dict[str, int]]:
    g = import_graph(SCAN_ROOT)
    assert len(g) > 50, f"found only {len(g)} modules under {SCAN_ROOT}"
    return g


def test_every_module_has_a_layer(graph):
    missing = []
    for m in graph:
        try:
            layer_of(m)
        except KeyError:
            missing.append(m)
    assert not missing, f"place these modules in LAYERS: {missing}"


def test_no_upward_import(graph):
    bad = upward_imports(_without_pending(graph))
    assert not bad, "imports of a higher layer (DESIGN.md: layers point down):\n" + \
        "\n".join(bad)


def test_no_import_cycle(graph):
    g = _without_pending(graph)
    cycles = import_cycles(g)
    assert not cycles, "\n".join(_describe(c, g) for c in cycles)


def test_the_kernel_layer_imports_only_tokens_and_pyramid(graph):
    """Issue 21: the kernels depend on nothing above ``tokens`` and ``pyramid`` (and
    ``paths``, where the CUDA sources are)."""
    allowed = {f"{PACKAGE}.{m}" for m in ("paths", "tokens", "pyramid")}
    for m, out in graph.items():
        if m == f"{PACKAGE}.kernels" or m.startswith(f"{PACKAGE}.kernels."):
            outside = {b for b in out if not b.startswith(f"{PACKAGE}.kernels")} - allowed
            assert not outside, f"{m} imports {sorted(outside)}"


def test_pending_violations_are_still_there(graph):
    """Each PENDING entry names an edge that exists; once fixed, delete it from PENDING."""
    edges = {(_short(a), _short(b)) for a, out in graph.items() for b in out}
    gone = [e for e in PENDING if e not in edges]
    assert not gone, f"fixed, so remove from PENDING: {gone}"
    for a, b in PENDING:                                 # and each is a real violation
        full_a, full_b = f"{PACKAGE}.{a}", f"{PACKAGE}.{b}"
        assert layer_of(full_b) > layer_of(full_a), (a, b)


# ----------------------------------------------------------------------------- the checker
def _scratch_copy(tmp_path: Path) -> Path:
    """The ``.py`` files of ``fovea_core`` copied under ``tmp_path``."""
    dst = tmp_path / PACKAGE
    for src in REPO_ROOT.rglob("*.py"):
        out = dst / src.relative_to(REPO_ROOT)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(src.read_bytes())
    return dst


def _new_violations(root: Path, before: tuple[set, list]) -> tuple[set, list]:
    """Upward imports and cycles at ``root`` that the clean tree (``before``) lacks."""
    g = _without_pending(import_graph(root))
    ups = set(upward_imports(g)) - before[0]
    return ups, [c for c in import_cycles(g) if c not in before[1]]


def _with_line(root: Path, rel: str, text: str, before: tuple[set, list]) -> tuple[set, list]:
    """The new violations once ``text`` is appended to ``root/rel`` (then restored)."""
    path = root / rel
    clean = path.read_text()
    path.write_text(clean + "\n\n" + text + "\n")
    try:
        return _new_violations(root, before)
    finally:
        path.write_text(clean)


def test_the_check_fails_on_the_old_bad_imports(tmp_path):
    """The old code's imports, put back one at a time into a scratch copy, each fail a check:
    the pyramid importing the kernels (inside a function), the kernels importing the V1
    allocator (inside a function), the cascade's algorithm importing its evaluation
    metric, and a relative import that goes up a sub-layer."""
    g = _without_pending(import_graph(REPO_ROOT))
    before = set(upward_imports(g)), import_cycles(g)
    root = _scratch_copy(tmp_path)
    assert _new_violations(root, before) == (set(), [])               # a copy changes nothing

    ups, cycles = _with_line(root, "pyramid.py", "def _fast():\n"
                             "    from fovea_core import kernels\n    return kernels", before)
    assert any(u.startswith("fovea_core.pyramid (0) -> fovea_core.kernels (1)") for u in ups)
    assert any({"fovea_core.pyramid", "fovea_core.kernels.ops"} <= set(c)
               for c in cycles)                                        # ops registers into it

    ups, cycles = _with_line(root, "kernels/ops.py", "def _plan(*a):\n"
                             "    from fovea_core.allocators.cortical import plan_v1\n"
                             "    return plan_v1(*a)", before)
    assert any(u.startswith("fovea_core.kernels.ops (1) -> fovea_core.allocators.cortical (2)")
               for u in ups)
    assert any(u.startswith("fovea_core.kernels.ops (1) -> fovea_core.allocators (2)")
               for u in ups)                                          # its __init__ runs too
    assert any({"fovea_core.kernels.ops", "fovea_core.allocators.cortical"} <= set(c)
               for c in cycles)

    ups, _ = _with_line(root, "cascade/allocator.py", "def _raster(t):\n"
                        "    from fovea_core.cascade.metrics import coverage_raster\n"
                        "    return coverage_raster(t)", before)
    assert any(u.startswith("fovea_core.cascade.allocator (3.3) -> fovea_core.cascade.metrics (4)")
               for u in ups)

    ups, _ = _with_line(root, "cascade/raster.py", "from .core import Gist  # noqa", before)
    assert any(u.startswith("fovea_core.cascade.raster (3) -> fovea_core.cascade.core (3.1)")
               for u in ups)
    assert _new_violations(root, before) == (set(), [])               # restored: clean again


# ----------------------------------------------------------------------------- the hook
def test_the_pyramid_takes_its_device_step_from_the_kernel_layer():
    """The pyramid (layer 0) never imports the kernels: they register their CUDA
    ``pyr_down`` step with it when imported, and build_pyramid uses a registered step."""
    import torch

    from fovea_core import kernels, pyramid

    assert pyramid._PYR_DOWN_STEPS["cuda"].__module__ == kernels.ops.__name__
    calls = []

    def step(src, dst):                               # a stand-in "device" step on the CPU
        calls.append(tuple(dst.shape))
        pyramid.pyr_down(src, out=dst)
        return True

    x = torch.rand(1, 5, 40, 36)                          # 5 channels: not cv2's path
    ref = pyramid.build_pyramid(x, num_levels=3)
    pyramid.register_pyr_down("cpu", step)
    try:
        got = pyramid.build_pyramid(x, num_levels=3)
    finally:
        pyramid.register_pyr_down("cpu", None)
    assert calls == [(1, 5, 20, 18), (1, 5, 10, 9)]
    assert all(torch.equal(a, b) for a, b in zip(got.levels, ref.levels))
    assert "cpu" not in pyramid._PYR_DOWN_STEPS
    pyramid.register_pyr_down("cpu", lambda s, d: False)  # declined: the torch step runs
    try:
        got = pyramid.build_pyramid(x, num_levels=3)
    finally:
        pyramid.register_pyr_down("cpu", None)
    assert all(torch.equal(a, b) for a, b in zip(got.levels, ref.levels))
    with pytest.raises(ValueError, match="device_type"):
        pyramid.register_pyr_down("gpu0", step)
    with pytest.raises(ValueError, match="step must be callable"):
        pyramid.register_pyr_down("cpu", 3)
