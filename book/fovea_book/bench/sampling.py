"""Benchmark: foveated patch sampling (``python -m fovea_book.bench sampling [--quick]``).

**CPU** (one 1024 x 1024 RGB float32 image, N = 273 tokens of 16 x 16 from the V1 allocator,
all paths interleaved round by round, :func:`~fovea_book.bench.common.time_rounds`):

* ``copy_floor``: a float32 copy of the image (touching every pixel once): the floor;
* ``e2e_kernel``: :func:`fovea_book.kernels.sample_image`: one pass of the g++ build
  (``sample_image_onepass_cpu``) that blurs each image row once, builds only the levels the
  tokens read row by row (deeper levels from the rows just written) with ``cv2.pyrDown``'s
  arithmetic, and gathers the tokens from them;
* ``e2e_two_step``: the same result (bit for bit, ``onepass_equals_two_step``) the two-step
  way (``sample_image(..., onepass=False)``): ``cv2.pyrDown`` builds the levels packed in
  place (level 0 is the image itself), then one fused gather pass; its two halves,
  ``pyramid_cv2_needed_levels`` and ``gather_kernel``, are timed too;
* ``grid_sample_one_call``: one ``F.grid_sample`` call gathering all 273 patches from
  level 0: what the torch path is measured against;
* ``sample_torch``: :func:`fovea_book.reference_samplers.sample_mip` (what the kernels
  compute) on the packed mip atlas of :func:`fovea_core.pyramid.build_pyramid` (one
  ``grid_sample`` call); ``sample_area``: the default area filter (summed-area table of the
  base image, the book's reading of every token); ``sample_reference``
  (the exact arithmetic) and ``loop`` (one ``grid_sample`` per token, the seeds' sampler);
* log-polar LUT remap (256 x 256 from the whole image): ``cv2.remap`` on the HWC image,
  :func:`fovea_book.reference_samplers.remap` (exact float weights) and ``remap_fast`` (one
  ``grid_sample`` call) on the same memory, the g++ kernel.

**GPU** (when the CUDA backend is available), batch 1 and 64: the gather kernel (driver
and pycuda bindings), ``K.device_pyramid`` and the end-to-end path, the torch path, one
``grid_sample`` call and ``grid_sample`` / ``torchvision.ops.roi_align`` level by level;
device-event timing; achieved bandwidth for the fewest bytes the gather must move (each
patch written once, each of its samples read once) as a fraction of a device-to-device copy
measured in the same run and of the datasheet bandwidth.

Writes ``_build/benchmarks/sampling.json`` (``--gpu-only``: ``sampling_gpu.json``);
``--record`` replaces the committed record under ``data/benchmarks/`` when the new one
measured no less and the machine was not loaded (:class:`~fovea_book.bench.common.Run`).
``--gpu-only`` on a machine without a CUDA GPU exits non-zero at once, writing nothing.
CPU comparisons are the minimum and median of per-round ratios
(:func:`~fovea_book.bench.common.ratio`); GPU ones are ratios of medians of device-event
times (the GPU is not shared; its paths are timed one after the other).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from fovea_book import kernels as K
from fovea_book.kernels import _layout, _workspace  # build_pyramid_cv2's buffer
from fovea_core.allocators.cortical import v1_cortical
from fovea_book.bench.common import (BenchError, Run, add_output_args, int_at_least, ratio,
                                     time_it, time_rounds)
from fovea_core.pyramid import Pyramid, build_pyramid, default_num_levels
from fovea_book.reference_samplers import (remap, remap_fast, remap_reference, sample_mip,
                                           sample_reference)
from fovea_core.sample import sample
from fovea_core.tokens import TokenSet

SIZE = 1024
BUDGET = 273
PATCH = 16
SOURCES = ("book/fovea_book/bench/sampling.py", "fovea_core/kernels", "fovea_core/sample.py",
           "book/fovea_book/kernels.py", "book/fovea_book/reference_samplers.py", "cuda",
           "fovea_core/allocators/cortical.py")
#: the speed targets (set on 2026-11-22; the copy-floor ratio of the fastest rounds: 2026-11-25)
TARGETS = {"cpu_e2e_ms": 2.0, "cpu_e2e_over_copy_moonshot": 1.5,
           "cpu_e2e_over_copy_minima_issue22": 2.0,
           "torch_over_grid_sample": 1.5, "remap_torch_over_cv2": 2.0,
           "gpu_bandwidth_fraction": 0.5, "gpu_bandwidth_fraction_moonshot": 0.7}
#: datasheet memory bandwidth (bytes/s) by device name fragment
DATASHEET_BW = {"H100 80GB HBM3": 3.35e12, "H100 PCIe": 2.0e12, "H200": 4.8e12,
                "A100-SXM4-80GB": 2.04e12, "A100-SXM4-40GB": 1.56e12}


def test_image(size: int = SIZE) -> np.ndarray:
    """A natural RGB image (scikit-image astronaut) resized to ``size``: float32 HWC in [0,1]."""
    from skimage import data

    img = cv2.resize(data.astronaut(), (size, size), interpolation=cv2.INTER_CUBIC)
    return (img.astype(np.float32) / 255.0).clip(0, 1)


def v1_tokens(batch: int, size: int = SIZE, seed: int = 0) -> TokenSet:
    """V1-allocator tokens for ``batch`` fixations (first one at (0.45, 0.4)), on the CPU."""
    nl = default_num_levels(size, size, PATCH)
    shapes = Pyramid(tuple(torch.zeros(1, 1, -(-size // 2**m), -(-size // 2**m))
                           .expand(batch, -1, -1, -1) for m in range(nl)))
    fix = torch.rand(batch, 2, generator=torch.Generator().manual_seed(seed)) * 0.6 + 0.2
    fix[0] = torch.tensor([0.45, 0.4])
    scores = torch.zeros(batch, *shapes.grid_shape(PATCH))
    return v1_cortical(shapes, scores, BUDGET, fixation=fix)


def loop_sample(pyramid: Pyramid, tokens: TokenSet) -> torch.Tensor:
    """Baseline: one ``grid_sample`` call per token (the per-token Python loop)."""
    b, n = tokens.levels.shape
    p = tokens.patch
    h, w = tokens.image_size
    k = torch.arange(p, dtype=torch.float32) - (p - 1) / 2
    out = []
    for bi in range(b):
        for ni in range(n):
            lvl = int(tokens.levels[bi, ni])
            img = pyramid.levels[lvl][bi:bi + 1]
            hl, wl = img.shape[-2:]
            s = 2.0 ** lvl
            xs = (tokens.centers[bi, ni, 0] * w + k * s) / s
            ys = (tokens.centers[bi, ni, 1] * h + k * s) / s
            grid = torch.stack(torch.meshgrid(2 * ys / hl - 1, 2 * xs / wl - 1, indexing="ij")
                               [::-1], -1)[None]
            out.append(F.grid_sample(img, grid, mode="bilinear", padding_mode="border",
                                     align_corners=False)[0])
    return torch.stack(out).reshape(b, n, -1, p, p)


def one_call_grid(tokens: TokenSet) -> torch.Tensor:
    """The grid of one ``grid_sample`` call reading every token's ``p x p`` samples from
    level 0 (spacing one level-0 pixel): ``[B, N*p, p, 2]``."""
    b, n = tokens.levels.shape
    p = tokens.patch
    h, w = tokens.image_size
    k = torch.arange(p, dtype=torch.float32, device=tokens.device) - (p - 1) / 2
    xs = tokens.centers[..., 0:1] * w + k
    ys = tokens.centers[..., 1:2] * h + k
    gx = (2 * xs / w - 1)[:, :, None, :].expand(-1, -1, p, -1)
    gy = (2 * ys / h - 1)[:, :, :, None].expand(-1, -1, -1, p)
    return torch.stack([gx, gy], -1).reshape(b, n * p, p, 2)


def grid_sample_by_level(pyramid: Pyramid, tokens: TokenSet) -> torch.Tensor:
    """Torch users' batched alternative: ``grid_sample`` once per level on all tokens,
    keeping each token's own (integer) level (``[B, N, C, p, p]``)."""
    b, n = tokens.levels.shape
    p = tokens.patch
    h, w = tokens.image_size
    k = torch.arange(p, dtype=torch.float32, device=tokens.device) - (p - 1) / 2
    out = None
    for lvl, img in enumerate(pyramid.levels):
        sel = tokens.levels == lvl
        hl, wl = img.shape[-2:]
        xs = tokens.centers[..., 0:1] * w / 2**lvl + k                    # [B, N, p]
        ys = tokens.centers[..., 1:2] * h / 2**lvl + k
        gx = (2 * xs / wl - 1)[:, :, None, :].expand(-1, -1, p, -1)
        gy = (2 * ys / hl - 1)[:, :, :, None].expand(-1, -1, -1, p)
        grid = torch.stack([gx, gy], -1).reshape(b, n * p, p, 2)
        vals = F.grid_sample(img, grid, mode="bilinear", padding_mode="border",
                             align_corners=False)                         # [B, C, N*p, p]
        vals = vals.reshape(b, -1, n, p, p).permute(0, 2, 1, 3, 4)
        out = vals * sel[..., None, None, None] if out is None else torch.where(
            sel[..., None, None, None], vals, out)
    return out


def parity_cases(n_cases: int, seed: int = 0, backend: str = "cpu"):
    """Kernels vs torch references on ``n_cases`` random pyramids and token sets (edge
    tokens included): a DataFrame with one row per case. ``gather`` / ``trilinear`` /
    ``remap``: max abs difference kernel - exact reference (0 = bit for bit); ``fused``:
    the same for :func:`~fovea_book.kernels.gather_tokens` (trilinear tokens, written as 2 x
    2 blocks, twice along T, on its own NHWC4 pyramid) and ``fused_bf16_exact``: its
    bfloat16 output equals the reference rounded to bfloat16;
    ``torch_vs_reference``: the fast torch path :func:`sample` against the exact one;
    ``reference_vs_grid_sample``: the convention against an independent implementation."""
    import pandas as pd

    g = torch.Generator().manual_seed(seed)
    rows = []
    for case in range(n_cases):
        b = int(torch.randint(1, 4, (1,), generator=g))
        c = int(torch.randint(1, 5, (1,), generator=g))
        h, w = (int(v) for v in torch.randint(32, 257, (2,), generator=g))
        n, patch = int(torch.randint(6, 300, (1,), generator=g)), [14, 16][case % 2]
        pyr = build_pyramid(torch.rand(b, c, h, w, generator=g), patch=patch)
        centers = torch.rand(b, n, 2, generator=g)
        centers[:, :4] = torch.tensor([[0.0, 0.0], [1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
        lv = torch.randint(0, pyr.num_levels, (b, n), generator=g).float()
        ts = TokenSet(centers, lv, torch.zeros(b, n), torch.full((b, 1, 2), 0.5), (h, w), patch)
        tri = dataclasses.replace(ts, levels=torch.rand(b, n, generator=g) * (pyr.num_levels - 1))
        lut = torch.rand(b, 64, 48, 2, generator=g) * torch.tensor([w + 4.0, h + 4.0]) - 2
        fix = torch.rand(b, 2, generator=g).double()
        budget = min(BUDGET, (h // patch) * (w // patch))
        cen, lev = K.v1_allocate(fix, (h, w), budget, num_levels=pyr.num_levels, patch=patch,
                                 backend=backend)
        ref = v1_cortical(pyr, torch.zeros(b, *pyr.grid_shape(patch)), budget, fixation=fix,
                          patch=patch)
        exact = sample_reference(pyr, ts)
        pyr4 = K.nhwc4_pyramid(pyr.base, pyr.num_levels, backend=backend)
        ref4 = sample_reference(Pyramid(tuple(lv[:, :c] for lv in pyr4.levels)), tri)
        ref4 = (ref4.reshape(b, n, c, 2, patch // 2, 2, patch // 2).permute(0, 1, 3, 5, 2, 4, 6)
                .reshape(b, n, 4, c, 1, patch // 2, patch // 2))       # the 2 x 2 block layout
        fused = {dt: K.gather_tokens(pyr4, tri, channels=c, temporal=2, merge=2, dtype=dt,
                                     backend=backend).cpu()
                 for dt in (torch.float32, torch.bfloat16)}
        rows.append({
            "B": b, "C": c, "H": h, "W": w, "N": n, "p": patch, "levels": pyr.num_levels,
            "gather": float((K.gather_patches(pyr, ts, backend=backend).cpu() - exact)
                            .abs().max()),
            "trilinear": float((K.gather_patches(pyr, tri, backend=backend).cpu()
                                - sample_reference(pyr, tri)).abs().max()),
            "remap": float((K.remap(pyr.base, lut, backend=backend).cpu()
                            - remap_reference(pyr.base, lut)).abs().max()),
            "fused": float((fused[torch.float32] - ref4).abs().max()),
            "fused_bf16_exact": bool(torch.equal(fused[torch.bfloat16],
                                                 ref4.to(torch.bfloat16).expand_as(
                                                     fused[torch.bfloat16]))),
            "torch_vs_reference": float((sample_mip(pyr, tri) - sample_reference(pyr, tri))
                                        .abs().max()),
            "reference_vs_grid_sample": float((exact - grid_sample_by_level(pyr, ts))
                                              .abs().max()),
            "v1_identical": bool(torch.equal(cen, ref.centers) and torch.equal(lev, ref.levels)),
        })
    return pd.DataFrame(rows)


def _logpolar_lut(size: int, out: int = 256) -> torch.Tensor:
    rho = torch.exp(torch.linspace(0, math.log(size / 2), out))[:, None]
    th = torch.linspace(0, 2 * math.pi, out + 1)[:-1][None]
    return torch.stack([size / 2 + rho * torch.cos(th), size / 2 + rho * torch.sin(th)], -1)[None]


def cpu_section(rounds: int) -> dict:
    torch.set_num_threads(1)                 # per-image work; the machine's 2 cores are shared
    cv2.setNumThreads(1)                     # likewise (a busy machine makes threads wait)
    img = test_image()
    tokens = v1_tokens(1)
    nl_all = default_num_levels(SIZE, SIZE, PATCH)
    nl = K.levels_needed(tokens, nl_all)
    pyr = build_pyramid(img)                 # the torch path's packed atlas
    ws = _workspace(4 * _layout(1, 3, SIZE, SIZE, nl, first=1)[2])
    pyr_cv2 = K.build_pyramid_cv2(img, nl)
    base_hwc = torch.from_numpy(img).permute(2, 0, 1)[None]   # the image's own memory
    grid = one_call_grid(tokens)
    lut = _logpolar_lut(SIZE)
    mx, my = lut[0, ..., 0].numpy(), lut[0, ..., 1].numpy()
    exact = sample_reference(pyr, tokens)
    parity = {
        "kernel_vs_reference_max_abs": float((K.sample_image(img, tokens)
                                              - sample_reference(pyr_cv2, tokens)).abs().max()),
        "onepass_equals_two_step": bool(torch.equal(K.sample_image(img, tokens),
                                                    K.sample_image(img, tokens, onepass=False))),
        "kernel_e2e_vs_torch_pyramid_max_abs": float((K.sample_image(img, tokens) - exact)
                                                     .abs().max()),
        "torch_vs_reference_max_abs": float((sample_mip(pyr, tokens) - exact)
                                            .abs().max()),
        "loop_vs_reference_max_abs": float((loop_sample(pyr, tokens) - exact).abs().max()),
        "remap_torch_vs_reference_max_abs": float((remap(base_hwc, lut)
                                                   - remap_reference(base_hwc, lut)).abs().max()),
        "remap_fast_vs_reference_max_abs": float((remap_fast(base_hwc, lut)
                                                  - remap_reference(base_hwc, lut)).abs().max()),
        "remap_kernel_vs_reference_max_abs": float((K.remap(base_hwc, lut, backend="cpu")
                                                    - remap_reference(base_hwc, lut)).abs().max()),
    }
    fns = {
        "copy_floor": lambda: img.copy(),
        "e2e_kernel": lambda: K.sample_image(img, tokens),
        "e2e_two_step": lambda: K.sample_image(img, tokens, onepass=False),
        "pyramid_cv2_needed_levels": lambda: K.build_pyramid_cv2(img, nl, _buffer=ws),
        "gather_kernel": lambda: K.gather_patches(pyr_cv2, tokens, backend="cpu"),
        "grid_sample_one_call": lambda: F.grid_sample(base_hwc, grid, mode="bilinear",
                                                      padding_mode="border",
                                                      align_corners=False),
        "sample_torch": lambda: sample_mip(pyr, tokens),
        "sample_area": lambda: sample(pyr, tokens),
        "remap_cv2": lambda: cv2.remap(img, mx, my, cv2.INTER_LINEAR,
                                       borderMode=cv2.BORDER_CONSTANT),
        "remap_torch": lambda: remap(base_hwc, lut),
        "remap_torch_grid_sample": lambda: remap_fast(base_hwc, lut),
        "remap_kernel": lambda: K.remap(base_hwc, lut, backend="cpu"),
    }
    t = time_rounds(fns, rounds=rounds, warmup=3)
    slow = {
        "pyramid_torch_all_levels": lambda: build_pyramid(img),
        "e2e_torch": lambda: sample_mip(build_pyramid(img), tokens),
        "sample_reference": lambda: sample_reference(pyr, tokens),
        "loop": lambda: loop_sample(pyr, tokens),
    }
    ts = time_rounds({"copy_floor": fns["copy_floor"], "e2e_kernel": fns["e2e_kernel"], **slow},
                     rounds=max(5, rounds // 4))
    ratios = {
        "e2e_kernel/copy_floor": ratio(t, "e2e_kernel", "copy_floor"),
        "e2e_two_step/copy_floor": ratio(t, "e2e_two_step", "copy_floor"),
        "e2e_two_step/e2e_kernel": ratio(t, "e2e_two_step", "e2e_kernel"),
        "pyramid_cv2_needed_levels/copy_floor": ratio(t, "pyramid_cv2_needed_levels",
                                                      "copy_floor"),
        "gather_kernel/copy_floor": ratio(t, "gather_kernel", "copy_floor"),
        "sample_torch/grid_sample_one_call": ratio(t, "sample_torch", "grid_sample_one_call"),
        "sample_area/grid_sample_one_call": ratio(t, "sample_area", "grid_sample_one_call"),
        "remap_torch/remap_cv2": ratio(t, "remap_torch", "remap_cv2"),
        "remap_torch_grid_sample/remap_cv2": ratio(t, "remap_torch_grid_sample", "remap_cv2"),
        "remap_kernel/remap_cv2": ratio(t, "remap_kernel", "remap_cv2"),
        "gather_kernel/grid_sample_one_call": ratio(t, "gather_kernel", "grid_sample_one_call"),
        "loop/e2e_kernel": ratio(ts, "loop", "e2e_kernel"),
        "e2e_torch/copy_floor": ratio(ts, "e2e_torch", "copy_floor"),
    }
    e2e = t["e2e_kernel"]["median_ms"]
    r_copy = ratios["e2e_kernel/copy_floor"]["median_of_round_ratios"]
    r_copy_min = ratios["e2e_kernel/copy_floor"]["ratio_of_minima"]
    r_torch = ratios["sample_torch/grid_sample_one_call"]["median_of_round_ratios"]
    r_remap = ratios["remap_torch/remap_cv2"]["median_of_round_ratios"]
    targets = {
        "e2e_kernel_le_2ms": {"target": TARGETS["cpu_e2e_ms"], "measured": e2e,
                              "met": e2e <= TARGETS["cpu_e2e_ms"]},
        "e2e_over_copy_le_1.5_moonshot": {"target": TARGETS["cpu_e2e_over_copy_moonshot"],
                                          "measured": r_copy,
                                          "met": r_copy <= TARGETS["cpu_e2e_over_copy_moonshot"]},
        "e2e_over_copy_minima_le_2": {
            "target": TARGETS["cpu_e2e_over_copy_minima_issue22"], "measured": r_copy_min,
            "met": r_copy_min <= TARGETS["cpu_e2e_over_copy_minima_issue22"]},
        "torch_over_grid_sample_le_1.5": {"target": TARGETS["torch_over_grid_sample"],
                                          "measured": r_torch,
                                          "met": r_torch <= TARGETS["torch_over_grid_sample"]},
        "remap_torch_over_cv2_le_2": {"target": TARGETS["remap_torch_over_cv2"],
                                      "measured": r_remap,
                                      "met": r_remap <= TARGETS["remap_torch_over_cv2"]},
    }
    counts = torch.bincount(tokens.levels[0].long(), minlength=nl_all).tolist()
    return {"setup": {"image": f"skimage astronaut resized to {SIZE}x{SIZE}, float32 HWC RGB",
                      "budget": BUDGET, "patch": PATCH, "allocator": "v1_cortical, fixation "
                      "(0.45, 0.4)", "tokens_per_level": counts, "levels_built": nl,
                      "levels_available": nl_all, "pyramid_engine": "cv2.pyrDown (OpenCV "
                      f"{cv2.__version__}, {cv2.getNumThreads()} threads)",
                      "e2e_kernel_path": "one pass: sample_image_onepass_cpu (g++ build, "
                      "cv2.pyrDown's float arithmetic, one thread); e2e_two_step: cv2.pyrDown "
                      "levels + gather_patches (sample_image(..., onepass=False))",
                      "torch_threads": torch.get_num_threads(), "remap_output": [256, 256],
                      "timing": "interleaved rounds (time_rounds); ratios: minimum and "
                                "median of per-round ratios (bootstrap 95% CI of the median "
                                "over rounds) and the ratio of medians; the slow paths in "
                                "their own rounds beside copy_floor and e2e_kernel",
                      "machine": "2-core CI machine shared with other developers' jobs: "
                                 "wall times are noisy, ratios within a round less so"},
            "timings": {**t, **{k: v for k, v in ts.items()
                                if k not in ("copy_floor", "e2e_kernel")},
                        "copy_floor_slow_rounds": ts["copy_floor"],
                        "e2e_kernel_slow_rounds": ts["e2e_kernel"],
                        # the names of the earlier record (read by the results chapter)
                        "total_kernel_cpu": t["e2e_kernel"], "gather_kernel_cpu": t["gather_kernel"]},
            "ratios": ratios, "targets": targets, "parity": parity}


# ----------------------------------------------------------------------------- GPU
def _event_ms(fn, iters: int = 20, reps: int = 7) -> dict:
    """Device time per call from CUDA events around ``iters`` back-to-back calls (launches
    pipelined), median over ``reps``; and one synchronised call's wall latency."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        per.append(a.elapsed_time(b) / iters)
    lat = time_it(fn, repeats=reps, warmup=1, sync=torch.cuda.synchronize)
    return {"median_ms": statistics.median(per), "min_ms": min(per), "max_ms": max(per),
            "iters": iters, "reps": reps, "sync_latency_ms": lat["median_ms"]}


def _graph_ms(fn, iters: int = 20, reps: int = 7) -> dict:
    """Device time per call of ``fn`` captured ``iters`` times in one CUDA graph (no launch
    overhead), median over ``reps`` replays."""
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(iters):
                fn()
        r = _event_ms(g.replay, iters=1, reps=reps)
        return {"median_ms": r["median_ms"] / iters, "min_ms": r["min_ms"] / iters,
                "max_ms": r["max_ms"] / iters, "calls_per_replay": iters, "reps": reps}
    except Exception as exc:  # noqa: BLE001  (capture unsupported for a binding)
        return {"error": f"{type(exc).__name__}: {exc}"}


def gpu_section(batch: int) -> dict:
    dev = torch.device("cuda")
    base = torch.from_numpy(test_image()).permute(2, 0, 1)[None].to(dev)
    noise = torch.rand(batch, 3, SIZE, SIZE, device=dev, generator=torch.Generator(dev)
                       .manual_seed(batch)) * 0.02
    x = (base + noise).clamp(0, 1).contiguous()               # [B, 3, H, W] on the GPU
    tokens = v1_tokens(batch).to(dev)
    nl = default_num_levels(SIZE, SIZE, PATCH)
    dpyr = K.device_pyramid(x)
    x_cl = x.contiguous(memory_format=torch.channels_last)     # the same images, NHWC memory
    dpyr_cl = K.device_pyramid(x_cl)
    apyr = build_pyramid(x)                                    # the torch path's atlas (NHWC)
    grid = one_call_grid(tokens)
    out = torch.empty(batch, BUDGET, 3, PATCH, PATCH, device=dev)
    pyr4 = K.nhwc4_pyramid(x)                                  # RGB0 channels last: the fused
    out_bf16 = torch.empty(batch, BUDGET, 1, 3, 1, PATCH, PATCH, device=dev, dtype=torch.bfloat16)
    ref = sample_reference(dpyr, tokens)
    res: dict = {"batch": batch, "parity": {
        "kernel_vs_reference_equal": bool(torch.equal(K.gather_patches(dpyr, tokens), ref)),
        "torch_vs_reference_max_abs": float((sample(apyr, tokens) - ref).abs().max()),
        "e2e_vs_reference_max_abs": float((K.sample_image(x, tokens) - ref).abs().max()),
        "fused_vs_reference_equal": bool(torch.equal(
            K.gather_tokens(pyr4, tokens, channels=3)[:, :, 0, :, 0], ref)),
        "fused_bf16_vs_reference_equal": bool(torch.equal(
            K.gather_tokens(pyr4, tokens, channels=3, dtype=torch.bfloat16)[:, :, 0, :, 0],
            ref.to(torch.bfloat16))),
    }}
    fns = {
        "gather_kernel_driver": lambda: K.gather_patches(dpyr, tokens, out=out),
        "gather_kernel_nhwc": lambda: K.gather_patches(dpyr_cl, tokens, out=out),
        "gather_kernel_atlas": lambda: K.gather_patches(apyr, tokens, out=out),
        "gather_kernel_fused": lambda: K.gather_tokens(pyr4, tokens, channels=3,
                                                       out=out.view(batch, BUDGET, 1, 3, 1,
                                                                    PATCH, PATCH)),
        "gather_kernel_fused_bf16": lambda: K.gather_tokens(pyr4, tokens, channels=3,
                                                            dtype=torch.bfloat16, out=out_bf16),
        "pyramid_kernel_nhwc4": lambda: K.nhwc4_pyramid(x),
        "e2e_kernel_nhwc": lambda: K.sample_image(x_cl, tokens),
        "pyramid_kernel": lambda: K.device_pyramid(x),
        "e2e_kernel": lambda: K.sample_image(x, tokens),
        "sample_torch": lambda: sample_mip(apyr, tokens),
        "pyramid_torch_atlas": lambda: build_pyramid(x),
        "grid_sample_one_call": lambda: F.grid_sample(x, grid, mode="bilinear",
                                                      padding_mode="border",
                                                      align_corners=False),
        "grid_sample_by_level": lambda: grid_sample_by_level(dpyr, tokens),
        "copy_floor": lambda: x.clone(),
    }
    if K.backend_status()["pycuda"] is None:
        fns["gather_kernel_pycuda"] = lambda: K.gather_patches(dpyr, tokens, out=out,
                                                               binding="pycuda")
        res["parity"]["pycuda_equal"] = bool(torch.equal(
            K.gather_patches(dpyr, tokens, binding="pycuda"), ref))
    else:
        res["pycuda"] = f"not measured: {K.backend_status()['pycuda']}"
    try:
        from torchvision.ops import roi_align

        boxes = tokens.boxes()

        def roi() -> torch.Tensor:
            o = torch.empty_like(out)
            for lvl, lv in enumerate(dpyr.levels):
                bi, ni = (tokens.levels == lvl).nonzero(as_tuple=True)
                if bi.numel():
                    rois = torch.cat([bi[:, None].float(), boxes[bi, ni]], 1)
                    o[bi, ni] = roi_align(lv, rois, PATCH, spatial_scale=2.0**-lvl,
                                          sampling_ratio=1, aligned=True)
            return o
        res["parity"]["roi_align_vs_reference_max_abs"] = float((roi() - ref).abs().max())
        fns["roi_align_by_level"] = roi
    except Exception as exc:  # noqa: BLE001  (torchvision missing or broken)
        res["roi_align"] = f"not measured: {type(exc).__name__}: {exc}"
    t = {k: _event_ms(f) for k, f in fns.items()}
    t["gather_kernel_graph"] = _graph_ms(fns["gather_kernel_driver"])
    t["gather_kernel_nhwc_graph"] = _graph_ms(fns["gather_kernel_nhwc"])
    t["gather_kernel_fused_graph"] = _graph_ms(fns["gather_kernel_fused"])
    t["gather_kernel_fused_bf16_graph"] = _graph_ms(fns["gather_kernel_fused_bf16"])
    t["grid_sample_one_call_graph"] = _graph_ms(fns["grid_sample_one_call"])
    res["parity"]["nhwc_equal"] = bool(torch.equal(K.gather_patches(dpyr_cl, tokens), ref))
    # bandwidth: the fewest bytes the gather must move: every patch written once and every
    # one of its samples read once (p*p*C floats each way per token; bf16 output: half the
    # written bytes). The fused path reads 4 channels (RGB0), which this count does not credit.
    written = out.numel() * 4
    need = 2 * written
    need_of = {"gather_kernel_fused_bf16": written + written // 2,
               "gather_kernel_fused_bf16_graph": written + written // 2}
    big = torch.empty(512 * 2**20 // 4, device=dev)
    copy = _event_ms(lambda: big.clone(), iters=5)
    copy_bw = 2 * big.numel() * 4 / (copy["median_ms"] / 1e3)
    name = torch.cuda.get_device_name(0)
    sheet = next((v for k, v in DATASHEET_BW.items() if k in name), None)
    bw = {}
    for key in ("gather_kernel_driver", "gather_kernel_graph", "gather_kernel_pycuda",
                "gather_kernel_nhwc", "gather_kernel_nhwc_graph", "gather_kernel_atlas",
                "gather_kernel_fused", "gather_kernel_fused_graph", "gather_kernel_fused_bf16",
                "gather_kernel_fused_bf16_graph",
                "grid_sample_one_call", "grid_sample_one_call_graph", "sample_torch"):
        if key in t and "median_ms" in t[key]:
            gbs = need_of.get(key, need) / (t[key]["median_ms"] / 1e3)
            bw[key] = {"GBps": gbs / 1e9, "fraction_of_copy": gbs / copy_bw,
                       "fraction_of_datasheet": gbs / sheet if sheet else None}
    res.update(timings=t, copy_512MiB=copy, bandwidth={
        "bytes_min": need, "bytes_min_bf16_out": need_of["gather_kernel_fused_bf16"],
        "bytes_note": "patches written once + every sample read once "
        "(2 * B * N * C * p * p * 4; bf16 output: 1.5 * B * N * C * p * p * 4)",
        "device_copy_GBps": copy_bw / 1e9,
        "datasheet_GBps": sheet / 1e9 if sheet else None, "paths": bw},
        ratios={k: t[k]["median_ms"] / t["gather_kernel_driver"]["median_ms"]
                for k in t if k != "gather_kernel_driver" and "median_ms" in t[k]},
        torch_over_grid_sample=t["sample_torch"]["median_ms"]
        / t["grid_sample_one_call"]["median_ms"])
    return res


def allocator_devices(batch: int = 2, size: int = 512) -> dict:
    """Where each registered fixed-budget allocator runs with CUDA inputs (a probe for the GPU
    path, not a timing): ``{name: {"outputs": ..., "sync_free": ...}}``.

    ``outputs``: the device of every tensor of the TokenSet returned for CUDA scores with the
    default fixation: ``"cuda"`` when all are there, else ``"field=device, ..."``, or
    ``"error: ..."``. ``sync_free``: the same call with an explicit fixation on the GPU,
    after a warm-up, under ``torch.cuda.set_sync_debug_mode("error")``: ``True``, or the
    error of its first host sync. ``full`` is called with its one budget (``None``).
    """
    from fovea_core.methods import ALLOCATORS, INFO, allocate

    x = torch.rand(batch, 3, size, size, device="cuda")
    pyr = build_pyramid(x)
    scores = torch.rand(batch, *pyr.grid_shape(PATCH), device="cuda")
    fixations = {1: torch.rand(batch, 2, device="cuda"), 2: torch.rand(batch, 2, 2, device="cuda")}
    out = {}
    for name in ALLOCATORS:
        if INFO[name]["kind"] != "fixed":
            continue
        budget = None if name == "full" else 64
        rec: dict = {}
        try:
            ts = allocate(name, pyr, scores, budget)
            devs = {f: getattr(ts, f).device.type
                    for f in ("centers", "levels", "scores", "fixations")}
            rec["outputs"] = ("cuda" if set(devs.values()) == {"cuda"}
                              else ", ".join(f"{k}={v}" for k, v in devs.items()))
        except Exception as exc:  # noqa: BLE001  (recorded, not raised: a probe)
            rec["outputs"] = f"error: {type(exc).__name__}: {str(exc)[:120]}"
        fix = fixations[2 if name == "multi_fixation" else 1]
        try:
            allocate(name, pyr, scores, budget, fixation=fix)          # warm-up: caches
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                allocate(name, pyr, scores, budget, fixation=fix)
            finally:
                torch.cuda.set_sync_debug_mode(0)
            torch.cuda.synchronize()
            rec["sync_free"] = True
        except Exception as exc:  # noqa: BLE001
            rec["sync_free"] = f"error: {type(exc).__name__}: {str(exc)[:120]}"
        out[name] = rec
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fovea_book.bench sampling")
    ap.add_argument("--rounds", type=int_at_least(1), default=60,
                    help="interleaved CPU rounds (>= 1; the slow paths get max(5, rounds/4))")
    ap.add_argument("--gpu-batches", type=int_at_least(1), nargs="+", default=[1, 64],
                    help="GPU batch sizes (each >= 1)")
    ap.add_argument("--gpu-only", action="store_true", help="skip the CPU section "
                    "(writes sampling_gpu.json); exits 1 without a CUDA GPU")
    ap.add_argument("--quick", action="store_true", help="5 rounds (smoke check)")
    add_output_args(ap)
    args = ap.parse_args(argv)
    cuda = K.backend_status()["cuda"]            # None: the CUDA backend is available
    if args.gpu_only and cuda is not None:
        raise BenchError(f"--gpu-only: no usable CUDA GPU here ({cuda}); nothing measured "
                         "or written")
    run = Run("sampling_gpu" if args.gpu_only else "sampling", args)
    rounds = 5 if args.quick else args.rounds
    payload: dict = {"backends": K.backend_status(), "targets_issue13": TARGETS}
    if not args.gpu_only:
        payload["cpu"] = cpu_section(rounds)
    if cuda is None:
        payload["gpu"] = {f"B{b}": gpu_section(b) for b in args.gpu_batches}
        payload["gpu_allocator_devices"] = allocator_devices()
    else:
        payload["gpu"] = {"measured": False, "reason": cuda}
    if "cpu" in payload:
        cpu = payload["cpu"]
        for name, v in cpu["timings"].items():
            print(f"{name:34s} median {v['median_ms']:9.3f} ms  (min {v['min_ms']:.3f}, "
                  f"cpu {v['cpu_median_ms']:.3f}, n={v['repeats']})")
        print("ratios (min, median of rounds):",
              {k: (round(v["min_of_round_ratios"], 2), round(v["median_of_round_ratios"], 2))
               for k, v in cpu["ratios"].items()})
        print("targets:", {k: (round(v["measured"], 3), v["met"])
                           for k, v in cpu["targets"].items()})
    if "gpu_allocator_devices" in payload:
        print("allocators on the GPU:", payload["gpu_allocator_devices"])
    if cuda is None:
        for b, r in payload["gpu"].items():
            print(b, {k: round(v["median_ms"], 4) for k, v in r["timings"].items()
                      if isinstance(v, dict) and "median_ms" in v})
            print(b, "bandwidth", {k: round(v["fraction_of_datasheet"] or v["fraction_of_copy"], 3)
                                   for k, v in r["bandwidth"]["paths"].items()})
    run.write(payload, SOURCES)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
