"""Dispatch ``python -m fovea_book.bench <name> [args...]`` to ``fovea_book.bench.<name>.main``.

``python -m fovea_book.bench promote FILE...`` records finished record files (e.g. ones a
lent GPU machine wrote under its ``_build/benchmarks``) as the committed
``data/benchmarks/<benchmark>.json``, through the gate of ``--record``
(:func:`fovea_book.bench.common.promote`).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import fovea_book.bench as _pkg

USAGE = ("usage: python -m fovea_book.bench NAME [args] [--record]\n"
         "       python -m fovea_book.bench promote FILE.json [FILE.json ...]\n"
         "A benchmark writes _build/benchmarks/NAME.json; --record replaces the committed "
         "data/benchmarks/NAME.json\n(refused on a loaded machine or when the new record "
         "measured less than the old one).\nbenchmarks: ")


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(_pkg.__path__)
                  if m.name not in {"common", "__main__"})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "promote":
        from fovea_book.bench.common import BenchError, promote

        if len(argv) < 2 or any(a.startswith("-") for a in argv[1:]):
            raise BenchError("usage: python -m fovea_book.bench promote FILE.json [FILE.json ...]")
        for path in argv[1:]:
            promote(path)
        return 0
    if not argv or argv[0] in {"-h", "--help"} or argv[0] not in available():
        print(USAGE + ", ".join(available()))
        return 0 if argv and argv[0] in {"-h", "--help"} else 2
    module = importlib.import_module(f"fovea_book.bench.{argv[0]}")
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
