"""Benchmark: foveated patch sampling (``python -m fovea_core.bench sampling [--quick]``).

CPU, one 1024 x 1024 RGB image, N = 273 tokens from the V1 allocator, pyramid build plus
patch gather, measured in one run for:

* ``loop``: a per-token Python loop (one ``F.grid_sample`` call per token on its level), the
  way the seed documents' sampler reads patches; reconstructed here as the baseline (the seed
  source itself is not part of this repository);
* ``torch``: the vectorised torch reference (:func:`fovea_core.pyramid.build_pyramid` +
  :func:`fovea_core.sample.sample`);
* ``kernel_cpu``: ``cv2.pyrDown`` straight into the packed buffer
  (:func:`fovea_core.kernels.build_packed_pyramid`) + the g++ build of the CUDA source.

Also the log-polar LUT remap (torch reference, g++ kernel, ``cv2.remap``) and the V1 layout
(torch, g++). On a GPU (CUDA backend available): a batch of 64 images, gather by the CUDA
kernel vs torch ``grid_sample`` level by level and ``torchvision.ops.roi_align`` (if it
imports), with the kernel's achieved bandwidth for the bytes it must move, as a fraction of
a device-to-device copy measured in the same run.

Writes ``data/benchmarks/sampling.json``.
"""

from __future__ import annotations

import dataclasses

import argparse
import math

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from fovea_core import kernels as K
from fovea_core.allocators.cortical import plan_v1, v1_cortical
from fovea_core.bench.common import time_it, write_result
from fovea_core.pyramid import Pyramid, build_pyramid
from fovea_core.sample import remap, sample
from fovea_core.tokens import TokenSet

SIZE = 1024
BUDGET = 273
PATCH = 16


def test_image(size: int = SIZE) -> np.ndarray:
    """A natural RGB image (scikit-image astronaut) resized to ``size``: float32 HWC in [0,1]."""
    from skimage import data

    img = cv2.resize(data.astronaut(), (size, size), interpolation=cv2.INTER_CUBIC)
    return (img.astype(np.float32) / 255.0).clip(0, 1)


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


def grid_sample_by_level(pyramid: Pyramid, tokens: TokenSet) -> torch.Tensor:
    """Torch users' batched alternative: ``grid_sample`` once per level on all tokens,
    keeping each token's own level (``[B, N, C, p, p]``)."""
    b, n = tokens.levels.shape
    p = tokens.patch
    h, w = tokens.image_size
    k = torch.arange(p, dtype=torch.float32, device=tokens.device) - (p - 1) / 2
    out = None
    for lvl, img in enumerate(pyramid.levels):
        sel = tokens.levels == lvl
        if not bool(sel.any()):
            continue
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
    """Kernel vs torch reference on ``n_cases`` random pyramids and token sets (edge tokens
    included): a DataFrame with one row per case and the max abs error of each kernel."""
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
        lv = torch.randint(0, pyr.num_levels, (b, n), generator=g)
        ts = TokenSet(centers, lv, torch.zeros(b, n), torch.full((b, 1, 2), 0.5), (h, w), patch)
        tri = dataclasses.replace(ts, levels=torch.rand(b, n, generator=g) * (pyr.num_levels - 1))
        lut = torch.rand(b, 64, 48, 2, generator=g) * torch.tensor([w + 4.0, h + 4.0]) - 2
        fix = torch.rand(b, 2, generator=g).double()
        budget = min(BUDGET, (h // patch) * (w // patch))
        cen, lev = K.v1_layout(fix, (h, w), budget, num_levels=pyr.num_levels, patch=patch,
                               backend=backend)
        ref = v1_cortical(pyr, torch.zeros(b, *pyr.grid_shape(patch)), budget, fixation=fix,
                          patch=patch)
        out = K.gather_patches(pyr, ts, backend=backend).cpu()
        rows.append({
            "B": b, "C": c, "H": h, "W": w, "N": n, "p": patch, "levels": pyr.num_levels,
            "gather": float((out - sample(pyr, ts)).abs().max()),
            "trilinear": float((K.gather_patches(pyr, tri, backend=backend).cpu()
                                - sample(pyr, tri)).abs().max()),
            "remap": float((K.remap(pyr.base, lut, backend=backend).cpu()
                            - remap(pyr.base, lut)).abs().max()),
            "torch_vs_grid_sample": float((sample(pyr, ts) - grid_sample_by_level(pyr, ts))
                                          .abs().max()),
            "v1_identical": bool(torch.equal(cen, ref.centers) and torch.equal(lev, ref.levels)),
        })
    return pd.DataFrame(rows)


def _ratio(a: dict, b: dict) -> float:
    return a["median_ms"] / b["median_ms"]


def cpu_section(repeats: int) -> dict:
    img = test_image()
    pyr = build_pyramid(img)
    scores = torch.zeros(1, *pyr.grid_shape(PATCH))
    tokens = v1_cortical(pyr, scores, BUDGET, fixation=(0.45, 0.4))
    packed = K.build_packed_pyramid(img, pyr.num_levels)
    checks = {
        "kernel_vs_torch_max_abs": float((K.gather_patches(packed, tokens, backend="cpu")
                                          - sample(pyr, tokens)).abs().max()),
        "loop_vs_torch_max_abs": float((loop_sample(pyr, tokens) - sample(pyr, tokens))
                                       .abs().max()),
        "cv2_pyramid_vs_torch_max_abs": float((packed.data - K.pack_pyramid(pyr).data)
                                              .abs().max()),
    }
    slow = max(3, repeats // 4)
    t = {
        "pyramid_torch": time_it(lambda: build_pyramid(img), slow, 1),
        "pyramid_cv2_packed": time_it(lambda: K.build_packed_pyramid(img, pyr.num_levels),
                                      repeats, 3),
        "gather_loop": time_it(lambda: loop_sample(pyr, tokens), slow, 1),
        "gather_torch": time_it(lambda: sample(pyr, tokens), repeats, 2),
        "gather_kernel_cpu": time_it(lambda: K.gather_patches(packed, tokens, backend="cpu"),
                                     repeats, 3),
        "total_loop": time_it(lambda: loop_sample(build_pyramid(img), tokens), slow, 1),
        "total_torch": time_it(lambda: sample(build_pyramid(img), tokens), slow, 1),
        "total_kernel_cpu": time_it(lambda: K.gather_patches(
            K.build_packed_pyramid(img, pyr.num_levels), tokens, backend="cpu"), repeats, 3),
    }
    # log-polar LUT remap: 256 x 256 output over the whole image
    ho = wo = 256
    rho = torch.exp(torch.linspace(0, math.log(SIZE / 2), ho))[:, None]
    th = torch.linspace(0, 2 * math.pi, wo + 1)[:-1][None]
    lut = torch.stack([SIZE / 2 + rho * torch.cos(th), SIZE / 2 + rho * torch.sin(th)], -1)[None]
    base = pyr.base.contiguous()               # NCHW for the torch and kernel remaps
    mx, my = lut[0, ..., 0].numpy(), lut[0, ..., 1].numpy()
    t["remap_torch"] = time_it(lambda: remap(base, lut), repeats, 2)
    t["remap_kernel_cpu"] = time_it(lambda: K.remap(base, lut, backend="cpu"), repeats, 2)
    t["remap_cv2"] = time_it(lambda: cv2.remap(img, mx, my, cv2.INTER_LINEAR,
                                               borderMode=cv2.BORDER_CONSTANT), repeats, 2)
    checks["remap_kernel_vs_torch_max_abs"] = float(
        (K.remap(base, lut, backend="cpu") - remap(base, lut)).abs().max())
    # V1 layout for a batch of 16 fixations
    fix = torch.rand(16, 2, generator=torch.Generator().manual_seed(0)).double()
    t["v1_layout_torch_b16"] = time_it(lambda: v1_cortical(
        Pyramid(tuple(l.expand(16, -1, -1, -1) for l in pyr.levels)),
        scores.expand(16, -1, -1), BUDGET, fixation=fix), slow, 1)
    t["v1_layout_kernel_cpu_b16"] = time_it(lambda: K.v1_layout(
        fix, (SIZE, SIZE), BUDGET, num_levels=pyr.num_levels, backend="cpu"), repeats, 2)
    plan = plan_v1(fix, (SIZE, SIZE), BUDGET, num_levels=pyr.num_levels)
    ratios = {
        "loop_over_kernel_total": _ratio(t["total_loop"], t["total_kernel_cpu"]),
        "torch_over_kernel_total": _ratio(t["total_torch"], t["total_kernel_cpu"]),
        "loop_over_kernel_gather": _ratio(t["gather_loop"], t["gather_kernel_cpu"]),
        "torch_over_kernel_gather": _ratio(t["gather_torch"], t["gather_kernel_cpu"]),
        "remap_torch_over_kernel": _ratio(t["remap_torch"], t["remap_kernel_cpu"]),
        "remap_cv2_over_kernel": _ratio(t["remap_cv2"], t["remap_kernel_cpu"]),
    }
    targets = {
        "total_kernel_cpu_median_ms_le_5": t["total_kernel_cpu"]["median_ms"] <= 5.0,
        "loop_over_kernel_total_ge_20": ratios["loop_over_kernel_total"] >= 20.0,
    }
    levels = torch.bincount(tokens.levels[0], minlength=pyr.num_levels).tolist()
    return {"setup": {"image": f"skimage astronaut resized to {SIZE}x{SIZE}, float32 RGB",
                      "budget": BUDGET, "patch": PATCH, "num_levels": pyr.num_levels,
                      "tokens_per_level": levels, "allocator": "v1_cortical fixation (0.45,0.4)",
                      "remap_output": [ho, wo], "v1_rays_b16": plan.rays.tolist()},
            "timings": t, "ratios": ratios, "targets_met": targets, "parity": checks}


def gpu_section(repeats: int, batch: int) -> dict:
    dev = torch.device("cuda")
    sync = torch.cuda.synchronize
    img = torch.from_numpy(test_image()).permute(2, 0, 1)[None].expand(batch, -1, -1, -1)
    img = img.contiguous().to(dev)                            # the batch lives on the GPU
    pyr = build_pyramid(img)
    scores = torch.zeros(batch, *pyr.grid_shape(PATCH))
    fix = torch.rand(batch, 2, generator=torch.Generator().manual_seed(0))
    shapes = Pyramid(tuple(torch.zeros(1, 1, *l.shape[-2:]).expand(batch, -1, -1, -1)
                           for l in pyr.levels))                  # geometry only, on the CPU
    tokens = v1_cortical(shapes, scores, BUDGET, fixation=fix).to(dev)
    packed = K.pack_pyramid(pyr)
    out_k = K.gather_patches(packed, tokens, backend="cuda")
    ref = grid_sample_by_level(pyr, tokens)
    res: dict = {"setup": {"batch": batch, "device": torch.cuda.get_device_name(0)},
                 "parity": {"cuda_vs_grid_sample_max_abs": float((out_k - ref).abs().max())}}
    t = {
        "gather_kernel_cuda": time_it(lambda: K.gather_patches(packed, tokens, backend="cuda"),
                                      repeats, 5, sync),
        "gather_grid_sample_by_level": time_it(lambda: grid_sample_by_level(pyr, tokens),
                                               repeats, 5, sync),
        "pyramid_torch_cuda": time_it(lambda: build_pyramid(img), repeats, 2, sync),
    }
    try:
        from torchvision.ops import roi_align

        def roi() -> torch.Tensor:
            out = torch.empty_like(out_k)
            boxes = tokens.boxes()
            for lvl, lv in enumerate(pyr.levels):
                bi, ni = (tokens.levels == lvl).nonzero(as_tuple=True)
                if bi.numel():
                    rois = torch.cat([bi[:, None].float(), boxes[bi, ni]], 1)
                    out[bi, ni] = roi_align(lv, rois, PATCH, spatial_scale=2.0**-lvl,
                                            sampling_ratio=1, aligned=True)
            return out
        res["parity"]["roi_align_vs_kernel_max_abs"] = float((roi() - out_k).abs().max())
        t["gather_roi_align_by_level"] = time_it(roi, repeats, 5, sync)
    except Exception as exc:  # noqa: BLE001  (torchvision missing or broken)
        res["roi_align"] = f"not measured: {type(exc).__name__}: {exc}"
    # bandwidth: bytes the gather must move = patches written + level pixels read once
    c = pyr.channels
    written = out_k.numel() * 4
    read = batch * BUDGET * c * (PATCH + 1) ** 2 * 4
    big = torch.empty(256 * 2**20 // 4, device=dev)
    copy = time_it(lambda: big.clone(), repeats, 3, sync)
    copy_bw = 2 * big.numel() * 4 / (copy["median_ms"] / 1e3)
    kern_bw = (written + read) / (t["gather_kernel_cuda"]["median_ms"] / 1e3)
    t["device_copy_256MiB"] = copy
    res.update(timings=t, bandwidth={
        "bytes_required": written + read, "kernel_GBps": kern_bw / 1e9,
        "device_copy_GBps": copy_bw / 1e9, "fraction_of_copy_bandwidth": kern_bw / copy_bw},
        ratios={"grid_sample_over_kernel": _ratio(t["gather_grid_sample_by_level"],
                                                   t["gather_kernel_cuda"])})
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fovea_core.bench sampling")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--gpu-batch", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="few repeats (smoke check)")
    args = ap.parse_args(argv)
    repeats = 5 if args.quick else args.repeats
    payload: dict = {"backends": K.backend_status(), "cpu": cpu_section(repeats)}
    if "cuda" in K.available_backends() and torch.cuda.is_available():
        payload["gpu"] = gpu_section(repeats, args.gpu_batch)
    else:
        payload["gpu"] = {"measured": False,
                          "reason": K.backend_status()["cuda"] or "torch has no CUDA"}
    write_result("sampling", payload)
    cpu = payload["cpu"]
    for name, v in cpu["timings"].items():
        print(f"{name:28s} median {v['median_ms']:9.3f} ms  (min {v['min_ms']:.3f}, "
              f"max {v['max_ms']:.3f}, n={v['repeats']})")
    print("ratios:", {k: round(v, 1) for k, v in cpu["ratios"].items()})
    print("targets:", cpu["targets_met"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
