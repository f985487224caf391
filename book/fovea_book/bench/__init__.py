"""Benchmarks: ``python -m fovea_book.bench <name> [args]`` runs ``fovea_book.bench.<name>``.

Every benchmark writes ``_build/benchmarks/<name>.json`` with the hardware, the library
versions, the arguments, the load average before and after the run, medians and min/max
over repeats, and ratios measured within the same run (minimum and median of per-round
ratios). Only ``--record`` replaces the committed ``data/benchmarks/<name>.json``, and it
refuses a loaded machine or a record that measured less (:mod:`fovea_book.bench.common`).
"""
