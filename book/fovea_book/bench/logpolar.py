"""Benchmark: log-polar resampling on the CPU, torch vs OpenCV vs the g++ kernel, same run.

``python -m fovea_book.bench logpolar [--repeats N] [--quick] [--record]`` writes
``_build/benchmarks/logpolar.json`` (``--record``: the committed
``data/benchmarks/logpolar.json``, through the rule of :class:`~fovea_book.bench.common.Run`).

Workload: a 1024 x 1024 RGB float32 image, centre (512, 512), max radius 512, two output
sizes: 256 x 256 (angles x log-radius bins; 65,536 samples = 256 tokens of 16 x 16) and
208 x 336 (69,888 samples = exactly N = 273 tokens of 16 x 16 pixels). Paths timed:

* ``lut``: building the forward LUT (``fovea_book.logpolar.logpolar_lut``);
* ``torch_remap``: ``fovea_book.reference_samplers.remap`` with the precomputed LUT ([1, 3, H, W]);
* ``torch_grid_sample``: ``F.grid_sample(align_corners=True)`` with the same LUT rescaled to
  [-1, 1] (a reference for the torch sampler);
* ``opencv_remap``: ``cv2.remap`` with precomputed float maps on the [H, W, 3] image;
* ``opencv_remap_planes``: the same on the three contiguous [H, W] planes of the CHW tensor
  (what ``backend="opencv"`` does, no HWC copy);
* ``opencv_warppolar``: ``cv2.warpPolar(..., WARP_POLAR_LOG)`` (builds its maps every call);
* ``to_logpolar_auto`` / ``to_logpolar_torch``: the public entry point end to end;
* ``kernel_cpu``: ``fovea_book.kernels.remap(image, lut, backend="cpu")`` when importable;
* ``batch8_*``: 8 centres on the same image, torch in one call vs the OpenCV plane loop.

All paths of one output size are timed in interleaved rounds
(:func:`~fovea_book.bench.common.time_rounds`); a ratio such as ``torch_remap /
opencv_remap_planes`` is reported as the minimum and median of the per-round ratios (with a
bootstrap CI) and the ratio of medians (:func:`~fovea_book.bench.common.ratio`); the batch of
8 centres likewise. The issue's target: the torch path within 1.5x of OpenCV, or OpenCV as
the CPU default.
"""

from __future__ import annotations

import argparse
import numpy as np
import torch
import torch.nn.functional as F

from fovea_book.bench.common import Run, add_output_args, int_at_least, ratio, time_rounds
from fovea_book.logpolar import _remap_opencv, logpolar_lut, to_logpolar

SIZE = 1024
CENTER = (512.0, 512.0)
RADIUS = 512.0
OUT_SIZES = {"256x256": (256, 256), "208x336_N273": (208, 336)}


def _paths(image: torch.Tensor, out_size: tuple[int, int]) -> dict:
    import cv2

    hwc = np.ascontiguousarray(image[0].permute(1, 2, 0).numpy())
    lut = logpolar_lut(CENTER, out_size, RADIUS)
    mx, my = lut[0, ..., 0].numpy(), lut[0, ..., 1].numpy()
    h, w = image.shape[-2:]
    grid = torch.stack([lut[..., 0] * 2 / (w - 1) - 1, lut[..., 1] * 2 / (h - 1) - 1], -1)
    from fovea_book.reference_samplers import remap

    paths = {
        "lut": lambda: logpolar_lut(CENTER, out_size, RADIUS),
        "torch_remap": lambda: remap(image, lut),
        "torch_grid_sample": lambda: F.grid_sample(image, grid, mode="bilinear",
                                                   padding_mode="zeros", align_corners=True),
        "opencv_remap": lambda: cv2.remap(hwc, mx, my, cv2.INTER_LINEAR,
                                          borderMode=cv2.BORDER_CONSTANT, borderValue=0),
        "opencv_remap_planes": lambda: _remap_opencv(image, lut),
        "opencv_warppolar": lambda: cv2.warpPolar(
            hwc, out_size[::-1], CENTER, RADIUS,
            cv2.WARP_POLAR_LOG | cv2.INTER_LINEAR | cv2.WARP_FILL_OUTLIERS),
        "to_logpolar_auto": lambda: to_logpolar(image, CENTER, RADIUS, out_size),
        "to_logpolar_torch": lambda: to_logpolar(image, CENTER, RADIUS, out_size,
                                                 backend="torch"),
    }
    try:
        from fovea_book.kernels import remap as kernel_remap
        kernel_remap(image, lut, backend="cpu")
        paths["kernel_cpu"] = lambda: kernel_remap(image, lut, backend="cpu")
        kernel_note = "fovea_book.kernels.remap(backend='cpu') timed"
    except Exception as exc:  # noqa: BLE001 - any failure means "not available here"
        kernel_note = f"g++ kernel not timed: {type(exc).__name__}: {exc}"
    # Correctness of what is timed: every path against cv2.warpPolar.
    ref = paths["opencv_warppolar"]()
    outs = {"torch_remap": paths["torch_remap"]()[0].permute(1, 2, 0).numpy(),
            "torch_grid_sample": paths["torch_grid_sample"]()[0].permute(1, 2, 0).numpy(),
            "opencv_remap_planes": paths["opencv_remap_planes"]()[0].permute(1, 2, 0).numpy()}
    if "kernel_cpu" in paths:
        outs["kernel_cpu"] = paths["kernel_cpu"]()[0].permute(1, 2, 0).numpy()
    max_err = {k: float(np.abs(v - ref).max()) for k, v in outs.items()}
    return {"paths": paths, "max_abs_err_vs_warppolar": max_err, "kernel_note": kernel_note}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fovea_book.bench logpolar")
    ap.add_argument("--repeats", type=int_at_least(1), default=30,
                    help="interleaved rounds per output size (>= 1)")
    ap.add_argument("--quick", action="store_true", help="5 rounds, one output size")
    add_output_args(ap)
    args = ap.parse_args(argv)
    run = Run("logpolar", args)
    repeats = 5 if args.quick else args.repeats
    image = torch.rand(1, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(0))
    results = {}
    sizes = dict(list(OUT_SIZES.items())[:1]) if args.quick else OUT_SIZES
    pairs = [("torch_remap", "opencv_remap_planes"), ("torch_grid_sample", "opencv_remap_planes"),
             ("torch_remap", "opencv_warppolar"), ("to_logpolar_auto", "opencv_warppolar"),
             ("kernel_cpu", "opencv_remap_planes")]
    for name, out_size in sizes.items():
        setup = _paths(image, out_size)
        timings = time_rounds(setup["paths"], rounds=repeats, warmup=1)
        ratios = {f"{a}/{b}": ratio(timings, a, b) for a, b in pairs if a in timings}
        results[name] = {"out_size_hw": list(out_size), "timings": timings, "ratios": ratios,
                         "max_abs_err_vs_warppolar": setup["max_abs_err_vs_warppolar"],
                         "kernel": setup["kernel_note"]}
        print(name, {k: round(v["median_ms"], 3) for k, v in timings.items()})
        print("  ratios (min, median of rounds)",
              {k: (round(v["min_of_round_ratios"], 2), round(v["median_of_round_ratios"], 2))
               for k, v in ratios.items()})
    # A batch of 8 centres on one image: one torch call vs the per-image OpenCV loop.
    rng = np.random.default_rng(0)
    centres = torch.from_numpy(rng.uniform(256, 768, (8, 2)))
    batch = time_rounds({b: lambda b=b: to_logpolar(image, centres, RADIUS / 2, (256, 256),
                                                    backend=b) for b in ("torch", "opencv")},
                        rounds=max(1, min(repeats, 5)), warmup=1)
    results["batch8_256x256"] = {"timings": batch,
                                 "ratio_torch/opencv": ratio(batch, "torch", "opencv")}
    print("batch8", {k: round(v["median_ms"], 3) for k, v in batch.items()})
    run.write({
        "workload": {"image": [1, 3, SIZE, SIZE], "dtype": "float32", "center": CENTER,
                     "max_radius": RADIUS, "out_sizes_hw": sizes},
        "default_backend": "opencv for one float32 CPU image (cv2.remap on planes), torch "
                           "(fovea_book.reference_samplers.remap) for batches / other devices",
        "timing": "interleaved rounds per output size; ratios: minimum and median of "
                  "per-round ratios (bootstrap 95% CI of the median) and ratio of medians",
        "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
