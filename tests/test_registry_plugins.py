"""The registry's plug-in point (:data:`fovea_core.allocators.registry.PLUGINS`): the
cascade (layer 3) registers into the allocators' registry (layer 2) without that layer
importing it (issue 21 item 1), and ``from fovea_core.allocators import ALLOCATORS, INFO,
allocate`` still lists and runs every method, in the same order as before."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

CASCADE = ["cascade", "cascade_gist_query", "cascade_prior", "cascade_text"]


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_allocators_does_not_import_the_cascade_reading_them_does():
    got = _run("""
        import json, sys
        import fovea_core.allocators as A
        before = "fovea_core.cascade" in sys.modules
        names = list(A.ALLOCATORS)
        print(json.dumps({"before": before, "after": "fovea_core.cascade" in sys.modules,
                          "names": names, "info": list(A.INFO)}))
    """)
    assert got["before"] is False and got["after"] is True
    assert got["names"] == got["info"]
    # the cascade's methods come last, in their order of registration (as before)
    assert got["names"][-len(CASCADE):] == CASCADE
    assert "v1_cortical" in got["names"] and "topk" in got["names"]


@pytest.mark.parametrize("first", ["allocate", "contains", "info"])
def test_every_read_of_the_registry_loads_the_plug_ins(first):
    read = {"allocate": "A.allocate('cascade_gist_query', pyr, None, 40).centers.shape[1]",
            "contains": "'cascade' in A.ALLOCATORS",
            "info": "A.INFO['cascade_prior']['family']"}[first]
    got = _run(f"""
        import json, torch
        import fovea_core.allocators as A
        from fovea_core.pyramid import build_pyramid
        pyr = build_pyramid(torch.rand(1, 3, 256, 256))
        print(json.dumps({{"value": {read}}}))
    """)
    assert got["value"] == {"allocate": 40, "contains": True, "info": "cascade"}[first]


def test_the_order_is_the_same_when_the_cascade_is_imported_first():
    a = _run("""
        import json
        import fovea_core.cascade
        from fovea_core.allocators import ALLOCATORS
        print(json.dumps(list(ALLOCATORS)))
    """)
    b = _run("""
        import json
        from fovea_core.allocators import ALLOCATORS
        print(json.dumps(list(ALLOCATORS)))
    """)
    assert a == b


def test_a_plug_in_that_fails_to_import_is_named_in_the_error(monkeypatch):
    from fovea_core.allocators import registry

    monkeypatch.setattr(registry, "PLUGINS", list(registry.PLUGINS))
    monkeypatch.setattr(registry, "_plugin_errors", dict(registry._plugin_errors))
    registry.add_plugin("fovea_core.no_such_plugin_module")
    assert "fovea_core.no_such_plugin_module" in registry.PLUGINS
    with pytest.raises(ValueError, match="plug-in fovea_core.no_such_plugin_module was not "
                                         "loaded .ModuleNotFoundError"):
        registry.allocate("no_such_method", None, None, 4)
    assert "topk" in registry.ALLOCATORS                        # the rest still works
    with pytest.raises(ValueError, match="module"):
        registry.add_plugin("")


def test_the_plug_ins_are_the_higher_layers_the_layer_check_cannot_see():
    """The plug-in point is the one place the registry names a higher layer, by string
    (``tests/test_layers.py`` counts only literal imports): keep it to modules above the
    allocators' layer that register allocators, and out of the static import graph."""
    import importlib.util
    from pathlib import Path

    from fovea_core.allocators import registry

    spec = importlib.util.spec_from_file_location(
        "_layers", Path(__file__).with_name("test_layers.py"))
    layers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layers)
    graph, layer_of = layers.import_graph(layers.REPO_ROOT), layers.layer_of
    below = f"{layers.PACKAGE}.allocators"
    for module in registry.PLUGINS:
        assert layer_of(module) > layer_of(below), module
        assert all(module not in out for name, out in graph.items()
                   if name == below or name.startswith(below + "."))
