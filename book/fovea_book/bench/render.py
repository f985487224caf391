"""Benchmark: the block painter (``fovea_book.reference_samplers.render_blocks``) on one
1024 x 1024 page per allocator (``python -m fovea_book.bench render [--rounds N]``): the C++
painter (CPU default) against the torch painter it replaces, interleaved rounds, background
from the pyramid. Target (set on 2026-11-22): <= 50 ms per 1024^2 page. ``torch/cpp`` is the
minimum and median of the per-round ratios (:func:`~fovea_book.bench.common.ratio`). Writes
``_build/benchmarks/render.json`` (``--record``: the committed ``data/benchmarks/render.json``,
through the rule of :class:`~fovea_book.bench.common.Run`).
"""

from __future__ import annotations

import argparse

import torch

import fovea_core.sample as S
from fovea_book.reference_samplers import render_blocks
from fovea_book.bench.common import Run, add_output_args, int_at_least, ratio, time_rounds
from fovea_book.bench.sampling import test_image
from fovea_core.pyramid import build_pyramid

TARGET_MS = 50.0
ALLOCATORS = ("v1_cortical", "topk", "resize", "uniform", "pyramid", "logpolar",
              "foveated_pyramid", "lod_dag")


def main(argv: list[str] | None = None) -> int:
    from fovea_core.methods import allocate

    ap = argparse.ArgumentParser(prog="python -m fovea_book.bench render")
    ap.add_argument("--rounds", type=int_at_least(1), default=10,
                    help="interleaved rounds per allocator (>= 1)")
    add_output_args(ap)
    args = ap.parse_args(argv)
    run = Run("render", args)
    torch.set_num_threads(1)
    img = test_image()
    pyr = build_pyramid(img)
    scores = torch.rand(1, *pyr.grid_shape(16), generator=torch.Generator().manual_seed(0))
    out = {}
    for name in ALLOCATORS:
        ts = allocate(name, pyr, scores, 273)
        pat = S.sample(pyr, ts)

        def torch_painter(ts=ts, pat=pat):
            return render_blocks(ts, pat, background=pyr, fast=False)
        same = bool(torch.equal(render_blocks(ts, pat, background=pyr), torch_painter()))
        t = time_rounds({"cpp": lambda ts=ts, pat=pat: render_blocks(ts, pat, background=pyr),
                         "torch": torch_painter}, rounds=args.rounds, warmup=1)
        out[name] = {"timings": t, "torch/cpp": ratio(t, "torch", "cpp"), "same_pixels": same,
                     "meets_50ms": t["cpp"]["median_ms"] <= TARGET_MS}
        print(f"{name:18s} C++ {t['cpp']['median_ms']:7.1f} ms  torch {t['torch']['median_ms']:8.1f}"
              f" ms  same pixels: {same}")
    run.write({"setup": {"image": "astronaut 1024x1024", "budget": 273,
                                      "background": "the pyramid's coarsest level",
                                      "target_ms": TARGET_MS,
                                      "machine": "2-core machine shared with other jobs"},
                            "allocators": out},
                 sources=("book/fovea_book/bench/render.py",
                          "book/fovea_book/reference_samplers.py", "cuda"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
