"""One registry of every method (:mod:`fovea_core.methods`): the allocators, and the cascade's
methods, which register themselves when :mod:`fovea_core.cascade` is imported (a higher
layer than the allocators; nothing is loaded behind the caller's back)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CASCADES = {"cascade", "cascade_gist_query", "cascade_prior", "cascade_text"}


def test_methods_lists_the_allocators_and_the_cascades():
    from fovea_core.methods import ALLOCATORS, INFO

    assert CASCADES <= set(ALLOCATORS)
    assert {INFO[n]["family"] for n in CASCADES} == {"cascade"}
    assert {"resize", "topk", "foveated_pyramid", "logpolar"} <= set(ALLOCATORS)
    assert list(ALLOCATORS) == list(INFO)


def test_the_allocators_alone_do_not_load_the_cascade_and_say_where_it_is():
    """In a fresh interpreter, ``fovea_core.allocators`` registers only its own methods; asking
    it for a cascade names :mod:`fovea_core.methods`."""
    code = ("import sys\n"
            "from fovea_core.allocators import ALLOCATORS, allocate\n"
            "assert 'fovea_core.cascade' not in sys.modules\n"
            "assert 'cascade' not in ALLOCATORS and 'resize' in ALLOCATORS\n"
            "try:\n    allocate('cascade', None, None, 8)\n"
            "except ValueError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "unknown allocator 'cascade'" in out.stdout
    assert "fovea_core.methods" in out.stdout


def test_an_unknown_method_is_a_clear_error():
    from fovea_core.methods import allocate

    with pytest.raises(ValueError, match="unknown allocator 'nope'"):
        allocate("nope", None, None, 8)
