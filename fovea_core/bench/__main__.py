"""Dispatch ``python -m fovea_core.bench <name> [args...]`` to ``fovea_core.bench.<name>.main``."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import fovea_core.bench as _pkg


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(_pkg.__path__)
                  if m.name not in {"common", "__main__"})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in {"-h", "--help"} or argv[0] not in available():
        print("usage: python -m fovea_core.bench NAME [args]\nbenchmarks: " + ", ".join(available()))
        return 0 if argv and argv[0] in {"-h", "--help"} else 2
    module = importlib.import_module(f"fovea_core.bench.{argv[0]}")
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
