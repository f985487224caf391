"""Benchmarks: ``python -m fovea_core.bench <name> [args]`` runs ``fovea_core.bench.<name>``.

Every benchmark writes ``data/benchmarks/<name>.json`` with the hardware, the library
versions, medians and min/max over repeats, and ratios measured within the same run.
"""
