"""Layers point down, and the layers are the folders (DESIGN.md, "Layers point down").

The import graph of ``fovea_core`` (the method) and ``fovea_book`` (the book's machinery,
``book/fovea_book``) is built from the source with ``ast`` (nothing is imported), and
checked for two things:

* **no cycle**: no module reaches itself through imports;
* **no upward import**: no module imports a module of a higher layer (:data:`LAYERS`). The
  layer of a module of ``fovea_core`` is the layer of its top-level folder (or top-level
  module): no module of a folder sits in another layer than its folder. All of
  ``fovea_book`` sits above all of ``fovea_core``: the method never imports the book.

What counts as an import (decided here, for both checks):

* every ``import`` / ``from ... import`` statement anywhere in a module: at module level,
  inside functions, inside ``try`` blocks and ``if TYPE_CHECKING`` alike (a function-level
  import is still a dependency; deferring it only hides a cycle until the call);
* relative imports, resolved against the importing module's package;
* ``importlib.import_module("...")`` with a literal name; and no module of ``fovea_core``
  calls ``importlib.import_module`` or ``__import__`` at all (a computed name cannot be
  checked: :func:`test_the_method_imports_nothing_by_computed_name`);
* the **package ``__init__`` files Python runs** on the way: importing
  ``fovea_core.allocators.base`` executes ``fovea_core/allocators/__init__.py`` first, so
  it is an import of ``fovea_core.allocators`` too, unless that package encloses the
  importing module (an enclosing package is always initialised before its modules). An
  explicit ``from fovea_core.pkg import name`` of a non-module name is an import of
  ``fovea_core.pkg``'s ``__init__`` in every case.

:func:`test_the_check_fails_on_the_old_bad_imports` runs the check on a scratch copy with
the imports of the old code put back.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "fovea_core"
BOOK = "fovea_book"
REPO = Path(__file__).resolve().parents[1]
#: where each package's source is in the repository
ROOTS = {PACKAGE: REPO / PACKAGE, BOOK: REPO / "book" / BOOK}
REPO_ROOT = ROOTS[PACKAGE]

#: The layer of every top-level folder or module of ``fovea_core`` (by its name; ``""`` is
#: the package's own ``__init__``). A module may import its own layer and the layers below
#: (the cycle check keeps same-layer imports one-way). Decided from DESIGN.md ("tokens /
#: pyramid at the bottom; sample, kernels and logpolar on them; importance and allocators
#: above; the cascade, the VLM bridge and foveate on top of the method"). A new top-level
#: folder or module must be placed here.
LAYERS: dict[str, int] = {
    # 0: the data every layer shares
    "cache": 0, "paths": 0, "progress": 0, "tokens": 0, "pyramid": 0,
    # 1: reading pixels (reference sampler, kernels), drawing tokens
    "sample": 1, "kernels": 1, "draw": 1,
    # 2: deciding: importance scorers and the allocators (one registry of methods)
    "importance": 2, "allocators": 2,
    # 3: the budgeted cascade, built from allocators and scorers; it registers its methods
    "cascade": 3,
    # 4: every method by name (allocators + cascade) and the cost model that reads it
    "methods": 4, "cost": 4,
    # 5: the one-call entry point
    "foveation": 5,
    # 6: what a user runs on top: the VLM processor (foveates), the command, the facade, the
    # adaptation to a folder of pages (reads pages with load_image, as foveate does)
    "vlm": 6, "__main__": 6, "": 6, "adaptation": 6,
}
#: the layer of every module of the book's package: above all of the method
BOOK_LAYER = 10


# ----------------------------------------------------------------------------- the graph
def _modules(roots: dict[str, Path]) -> dict[str, tuple[Path, bool]]:
    """``{dotted name: (file, is_package)}`` for every ``.py`` file of each package."""
    out = {}
    for package, root in roots.items():
        out.update(_package_modules(package, root))
    return out


def _package_modules(package: str, root: Path) -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
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


def import_graph(roots: dict[str, Path] = ROOTS) -> dict[str, dict[str, int]]:
    """``{importer: {imported: first line}}`` over the modules of both packages at ``roots``
    (both dotted names in full; see the module docstring for what counts)."""
    known = _modules(roots)
    graph: dict[str, dict[str, int]] = {m: {} for m in known}
    for module, (path, is_pkg) in known.items():
        enclosing = set(_ancestors(module))
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            for target in _imported_names(node, module, is_pkg, known):
                if target.split(".")[0] not in roots:
                    continue
                while target not in known and "." in target:   # a name inside a module
                    target = target.rpartition(".")[0]
                # the module itself, and the package __init__ files run on the way to it
                for t in [target] + [a for a in _ancestors(target) if a not in enclosing]:
                    if t != module:
                        graph[module].setdefault(t, node.lineno)
    return graph


def layer_of(name: str) -> int:
    """The layer of a module (dotted name in full): :data:`BOOK_LAYER` for the book's
    package, else the layer of its top-level folder or module in :data:`LAYERS`
    (``KeyError`` if it has none)."""
    package, _, rel = name.partition(".")
    if package == BOOK:
        return BOOK_LAYER
    return LAYERS[rel.partition(".")[0]]


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    """``"a (layer) -> b (layer), line n"`` for every import of a higher layer."""
    return [f"{a} ({layer_of(a)}) -> {b} ({layer_of(b)}), line {ln}"
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
    g = import_graph(ROOTS)
    assert sum(m.startswith(PACKAGE + ".") for m in g) > 40, f"found only {len(g)} modules"
    assert sum(m.startswith(BOOK + ".") for m in g) > 30, f"found only {len(g)} modules"
    return g


def test_every_module_has_a_layer(graph):
    missing = []
    for m in graph:
        try:
            layer_of(m)
        except KeyError:
            missing.append(m)
    assert not missing, f"place these modules' folders in LAYERS: {missing}"


def test_no_upward_import(graph):
    bad = upward_imports(graph)
    assert not bad, "imports of a higher layer (DESIGN.md: layers point down):\n" + \
        "\n".join(bad)


def test_the_method_never_imports_the_book(graph):
    bad = [f"{a} -> {b}" for a, out in graph.items() if a.startswith(PACKAGE)
           for b in out if b.split(".")[0] == BOOK]
    assert not bad, "\n".join(bad)


def test_no_import_cycle(graph):
    cycles = import_cycles(graph)
    assert not cycles, "\n".join(_describe(c, graph) for c in cycles)


def test_the_kernel_layer_imports_only_tokens_and_pyramid(graph):
    """The kernels depend on nothing above ``tokens`` and ``pyramid`` (and ``paths``, where
    the CUDA sources are)."""
    allowed = {f"{PACKAGE}.{m}" for m in ("paths", "tokens", "pyramid")}
    for m, out in graph.items():
        if m == f"{PACKAGE}.kernels" or m.startswith(f"{PACKAGE}.kernels."):
            outside = {b for b in out if not b.startswith(f"{PACKAGE}.kernels")} - allowed
            assert not outside, f"{m} imports {sorted(outside)}"


def test_the_method_imports_nothing_by_computed_name():
    """No plug-in loading in ``fovea_core``: no ``importlib.import_module`` or
    ``__import__`` call, whose target the graph could not see."""
    found = []
    for name, (path, _) in _package_modules(PACKAGE, REPO_ROOT).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if called in ("import_module", "__import__"):
                    found.append(f"{name}, line {node.lineno}")
    assert not found, found


# ----------------------------------------------------------------------------- the checker
def _scratch_copy(tmp_path: Path) -> dict[str, Path]:
    """The ``.py`` files of both packages copied under ``tmp_path``."""
    roots = {}
    for package, root in ROOTS.items():
        dst = roots[package] = tmp_path / package
        for src in root.rglob("*.py"):
            out = dst / src.relative_to(root)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(src.read_bytes())
    return roots


def _new_violations(roots: dict[str, Path], before: tuple[set, list]) -> tuple[set, list]:
    """Upward imports and cycles at ``roots`` that the clean tree (``before``) lacks."""
    g = import_graph(roots)
    ups = set(upward_imports(g)) - before[0]
    return ups, [c for c in import_cycles(g) if c not in before[1]]


def _with_line(roots: dict[str, Path], rel: str, text: str,
               before: tuple[set, list]) -> tuple[set, list]:
    """The new violations once ``text`` is appended to ``fovea_core/rel`` (then restored)."""
    path = roots[PACKAGE] / rel
    clean = path.read_text()
    path.write_text(clean + "\n\n" + text + "\n")
    try:
        return _new_violations(roots, before)
    finally:
        path.write_text(clean)


def test_the_check_fails_on_the_old_bad_imports(tmp_path):
    """The old code's imports, put back one at a time into a scratch copy, each fail a check:
    the pyramid importing the kernels (inside a function), the kernels importing the V1
    allocator (inside a function), the cascade's algorithm importing the book's evaluation
    metric, ``foveate`` taking its costs from the book's evaluator,
    and a relative import that goes up a layer."""
    g = import_graph(ROOTS)
    before = set(upward_imports(g)), import_cycles(g)
    roots = _scratch_copy(tmp_path)
    assert _new_violations(roots, before) == (set(), [])               # a copy changes nothing

    ups, cycles = _with_line(roots, "pyramid.py", "def _fast():\n"
                             "    from fovea_core import kernels\n    return kernels", before)
    assert any(u.startswith("fovea_core.pyramid (0) -> fovea_core.kernels (1)") for u in ups)
    assert any({"fovea_core.pyramid", "fovea_core.kernels.ops"} <= set(c)
               for c in cycles)                                        # ops registers into it

    ups, cycles = _with_line(roots, "kernels/ops.py", "def _plan(*a):\n"
                             "    from fovea_core.allocators.cortical import plan_v1\n"
                             "    return plan_v1(*a)", before)
    assert any(u.startswith("fovea_core.kernels.ops (1) -> fovea_core.allocators.cortical (2)")
               for u in ups)
    assert any(u.startswith("fovea_core.kernels.ops (1) -> fovea_core.allocators (2)")
               for u in ups)                                          # its __init__ runs too
    assert any({"fovea_core.kernels.ops", "fovea_core.allocators"} <= set(c)
               for c in cycles)                                       # through the package

    ups, _ = _with_line(roots, "cascade/allocator.py", "def _raster(t):\n"
                        "    from fovea_book.eval.localisation import coverage_raster\n"
                        "    return coverage_raster(t)", before)
    assert any(u.startswith("fovea_core.cascade.allocator (3) -> fovea_book.eval.localisation "
                            "(10)") for u in ups)

    ups, _ = _with_line(roots, "foveation.py", "def _c():\n"
                        "    from fovea_book.eval.evaluator import side_compute\n"
                        "    return side_compute", before)
    assert any(u.startswith("fovea_core.foveation (5) -> fovea_book.eval.evaluator (10)")
               for u in ups)

    ups, _ = _with_line(roots, "cascade/raster.py", "from ..methods import INFO  # noqa", before)
    assert any(u.startswith("fovea_core.cascade.raster (3) -> fovea_core.methods (4)")
               for u in ups)                               # a relative import up a layer
    assert _new_violations(roots, before) == (set(), [])               # restored: clean again


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
