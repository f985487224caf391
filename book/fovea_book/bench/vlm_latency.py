"""LM prefill latency and peak memory vs number of visual tokens.

``python -m fovea_book.bench vlm_latency [--quick] [--no-gpu] [--threads N]`` times the *language-model
prefill* of random-weight Qwen-VL configs (real ``transformers`` classes) for
``n`` visual tokens plus a fixed text prompt (``TEXT_BEFORE + TEXT_AFTER`` tokens), with
M-RoPE position ids of ``n`` cells of a 64 x 64 merged grid (a 1792 px image for Qwen2-VL).
The vision tower is not timed: it runs on the full grid either way in this pipeline.

Per point it records the median / min / max wall time and every repeat, the FLOPs from the config
(``lm_prefill_flops``, causal), and the peak memory: on the CPU the peak resident-set
increase during one prefill (the first, after ``malloc_trim``), sampled from ``/proc``
every millisecond; on a GPU ``torch.cuda.max_memory_allocated`` minus the memory before
the call. The headline is the
measured speedup ``t(4096) / t(273)`` (ratio of medians, with a 95 % percentile bootstrap CI
over the repeats of both points, 2,000 resamples) against the FLOP-ratio bound
``FLOPs(4096 + text) / FLOPs(273 + text)`` of the same model, both from this run. On a GPU
each point also reports its achieved FLOP rate as a fraction of a bf16 matrix product
measured in the same run (``mfu``: how close the prefill runs to the FLOP bound).

The points are timed one after another; for a shared machine the headline pair (273 and
4096 tokens) is then timed again in interleaved rounds (``paired``) and the speedup reported
as the minimum and median of the per-round ratios (``speedup_per_round``,
:func:`~fovea_book.bench.common.round_ratios`).

Writes ``_build/benchmarks/<--name>.json`` (``--record``: the committed
``data/benchmarks/<--name>.json``, through the rule of :class:`~fovea_book.bench.common.Run`).
``--no-cpu`` without a GPU to measure exits 1 at once, writing nothing.

CPU: ``qwen2-vl-tiny`` and ``qwen2-vl-mid`` in float32 (``--cpu-batches``, default 1). GPU
(when ``torch.cuda`` is available): ``qwen2-vl-2b`` and ``qwen2.5-vl-7b`` language models in
bfloat16 at batches ``--gpu-batches`` (default 1, 8, 32: at batch 1 a few hundred tokens
are launch-bound, so the speed targets judge the speedup / FLOP-ratio at batch >= 8), eager and
(``--cuda-graph``) as CUDA-graph replays. ``--pipeline`` adds the foveated path on the GPU
stage by stage (:func:`pipeline`: pyramid, allocation, the fused gather into
``pixel_values``, prefill; N = 273, batch 8), each stage's share of the whole.

Run time on an idle 2-core CPU is estimated at about a minute (the mid model's 4096-token
prefill, ~340 GFLOP, dominates; single-thread throughput measured here ~65 GFLOP/s). On a
heavily shared machine two OpenMP threads can stall each other: ``--threads 1`` then gives
steadier numbers.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import os
import threading
import time

import torch

from fovea_book.bench.common import (BenchError, Run, add_output_args, int_at_least,
                                     record_name, round_ratios, time_rounds, timed_calls)
from fovea_core.tokens import TokenSet
from fovea_core.vlm.positions import mrope_positions
from fovea_book.qwen_models import (MODEL_NAMES, build_qwen, lm_parameter_count,
                                     lm_prefill_flops, qwen_config)

TEXT_BEFORE, TEXT_AFTER = 8, 24
GRID = (64, 64)
TOKENS = (64, 128, 273, 512, 576, 1024, 2048, 4096)
#: batches of the GPU runs (the speed targets: where a prefill is compute-bound, batch >= 8)
GPU_BATCHES = (1, 8, 32)
#: the headline comparison, also timed in interleaved rounds
PAIR = (273, 4096)
QUICK_TOKENS = (64, 273, 1024, 4096)


def _positions(n: int, batch: int, device: str, seed: int = 0) -> torch.Tensor:
    """M-RoPE ids [3, B, S] for ``n`` random distinct cells of the 64 x 64 merged grid."""
    g = torch.Generator().manual_seed(seed)
    cells = torch.stack([torch.randperm(GRID[0] * GRID[1], generator=g)[:n] for _ in range(batch)])
    toks = TokenSet.from_grid(cells // GRID[1], cells % GRID[1], 0,
                              image_size=(GRID[0] * 28, GRID[1] * 28), patch=28)
    return mrope_positions(toks, GRID, text_before=TEXT_BEFORE, text_after=TEXT_AFTER).position_ids


def _malloc_trim() -> None:
    """Return freed heap pages to the OS (glibc) so that an RSS increase shows new memory."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _cpu_peak_mb(fn, interval_s: float = 0.001) -> float:
    """Peak RSS increase (MiB) during one ``fn()``, sampled from ``/proc`` every ``interval_s``.

    A background thread reads the resident set size while ``fn`` runs; the result is the
    largest sample minus the size before the call (allocations that live shorter than the
    sampling interval can be missed; freed memory that the allocator keeps is not counted).
    """
    base, peak, done = _rss_bytes(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _rss_bytes())
            time.sleep(interval_s)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        fn()
    finally:
        done.set()
        th.join()
    return max(0, max(peak[0], _rss_bytes()) - base) / 2**20


def matmul_peak_tflops(device: str, dtype: torch.dtype, n: int = 8192, iters: int = 10) -> float:
    """Measured dense matrix-product rate (TFLOP/s) of ``n x n x n`` products on random data."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * iters / (time.perf_counter() - t0) / 1e12


def run_model(name: str, tokens: tuple[int, ...], device: str, dtype: torch.dtype,
              budget_s: float, batch: int = 1, peak_tflops: float | None = None,
              cuda_graph: bool = False) -> dict:
    """Time the LM prefill of ``name`` for each visual-token count in ``tokens``.

    ``cuda_graph`` (GPU): the prefill (without KV-cache bookkeeping) is captured once per
    token count in a CUDA graph and its replays are timed: the device time with the
    per-kernel launch overhead of eager PyTorch removed (what a serving stack's graphs get).
    """
    cfg = qwen_config(name).text_config
    lm = build_qwen(name, text_only=True, dtype=dtype, device=device)
    head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device == "cuda" else None
    points, fns, once_s = [], {}, {}
    for n in tokens:
        s = TEXT_BEFORE + n + TEXT_AFTER
        x = torch.randn(batch, s, cfg.hidden_size, device=device, dtype=dtype)
        pos = _positions(n, batch, "cpu").to(device)

        @torch.no_grad()
        def prefill(x=x, pos=pos):      # bound now: kept for the paired rounds below
            h = lm(inputs_embeds=x, position_ids=pos, use_cache=not cuda_graph).last_hidden_state
            return head(h[:, -1:])

        if cuda_graph:
            eager = prefill
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    eager()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                eager()
            prefill = graph.replay                                     # noqa: F811

        # first call = warm-up, also used for the memory peak (malloc_trim first on the CPU)
        t0 = time.perf_counter()
        if device == "cuda":
            sync()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            prefill()
            sync()
            peak_mb = (torch.cuda.max_memory_allocated() - before) / 2**20
        else:
            _malloc_trim()
            peak_mb = _cpu_peak_mb(prefill)
        once = time.perf_counter() - t0
        fns[n], once_s[n] = prefill, once
        repeats = int(max(5, min(30, budget_s / max(once, 1e-4))))
        times = timed_calls(prefill, repeats, sync)
        timing = {"median_ms": statistics.median(times), "min_ms": min(times),
                  "max_ms": max(times), "repeats": repeats, "times_ms": times}
        fl = lm_prefill_flops(cfg, s, batch=batch)
        points.append({"visual_tokens": n, "seq_len": s, **timing, "peak_mem_mb": peak_mb,
                       "flops": fl["total"], "flops_dense_attention":
                       lm_prefill_flops(cfg, s, batch=batch, causal=False)["total"],
                       "gflops_per_s": fl["total"] / timing["median_ms"] / 1e6,
                       "mfu": (fl["total"] / timing["median_ms"] / 1e9 / peak_tflops
                               if peak_tflops else None)})
        print(f"{name:16s} n={n:5d} S={s:5d} median {timing['median_ms']:9.2f} ms "
              f"({repeats} reps) peak {peak_mb if peak_mb is None else round(peak_mb, 1)} MiB")
    paired: dict = {}
    if PAIR[0] in fns and PAIR[1] in fns:   # the headline pair again, in interleaved rounds
        rounds = int(max(5, min(30, budget_s / max(once_s[PAIR[1]], 1e-4))))
        paired = time_rounds({str(n): fns[n] for n in PAIR}, rounds=rounds, warmup=0, sync=sync)
    del lm, head, fns
    return {"model": name, "device": device, "dtype": str(dtype).replace("torch.", ""),
            "batch": batch, "lm_params": lm_parameter_count(cfg),
            "config": {k: getattr(cfg, k) for k in ("hidden_size", "intermediate_size",
                       "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                       "vocab_size")},
            "attn_implementation": qwen_config(name).text_config._attn_implementation,
            "cuda_graph": cuda_graph,
            "matmul_peak_tflops": peak_tflops, "points": points, "paired": paired,
            **summary(points, cfg, paired=paired)}


#: the pipeline's setting (the speed targets): N merged tokens of a 2B-class model at batch 8, a
#: 896 px page (a 32 x 32 merged grid), an allocator that reads no pixels
PIPELINE = {"budget": 273, "batch": 8, "image_px": 896, "allocator": "foveated_pyramid"}
#: the speed target (2026-11-25): allocation + pyramid + gather at most this share of the prefill time
PIPELINE_TARGET = 0.05


def pipeline(name: str, device: str, dtype: torch.dtype, *, budget: int = PIPELINE["budget"],
             batch: int = PIPELINE["batch"], image_px: int = PIPELINE["image_px"],
             allocator: str = PIPELINE["allocator"], repeats: int = 20) -> dict:
    """The foveated path on one device, stage by stage: build the NHWC4 pyramid of a batch of
    pages, allocate N merged tokens from a score map (an allocator that reads no pixels),
    gather them into the model's ``pixel_values`` layout (:func:`fovea_core.kernels.
    gather_tokens`, ``merge=2, temporal=2``, in ``dtype``) and prefill the language model of
    ``name`` on N visual + the text tokens (random embeddings, as :func:`run_model`).

    The vision tower between gather and prefill is not timed (as in :func:`run_model`).
    Each stage is timed on its own (:func:`~fovea_book.bench.common.time_it`, synchronised on
    a GPU), then the four in a row. Returns the stage medians, their shares of the stages'
    sum, ``side_over_prefill`` = (pyramid + allocate + gather) / prefill against
    ``PIPELINE_TARGET``, and the device the allocator's tokens came back on (``"cpu"`` for a
    CUDA run means a host round trip inside the allocator).
    """
    from fovea_book import kernels as K
    from fovea_core.methods import allocate
    from fovea_book.bench.common import time_it
    from fovea_core.vlm.positions import merged_cell_px
    from fovea_core.vlm.qwen import family_of

    qcfg = qwen_config(name)
    cfg = qcfg.text_config
    cell = merged_cell_px(family_of(qcfg))
    grid = image_px // cell
    if grid * grid < budget:
        raise BenchError(f"pipeline: a {image_px} px page has {grid * grid} merged cells, "
                         f"fewer than the budget {budget}")
    sync = torch.cuda.synchronize if device == "cuda" else None
    gen = torch.Generator(device).manual_seed(0)
    images = torch.rand(batch, 3, image_px, image_px, device=device, generator=gen)
    scores = torch.rand(batch, grid, grid, device=device, generator=gen)
    lm = build_qwen(name, text_only=True, dtype=dtype, device=device)
    x = torch.randn(batch, TEXT_BEFORE + budget + TEXT_AFTER, cfg.hidden_size, device=device,
                    dtype=dtype, generator=gen)
    pos = _positions(budget, batch, "cpu").to(device)
    state: dict = {}

    def pyramid():
        state["pyr"] = K.nhwc4_pyramid(images, patch=cell)

    def allocate_():
        state["tokens"] = allocate(allocator, state["pyr"], scores, budget, patch=cell)

    def gather():
        state["pv"] = K.gather_tokens(state["pyr"], state["tokens"], channels=3, temporal=2,
                                      merge=2, dtype=dtype)

    @torch.no_grad()
    def prefill():
        state["h"] = lm(inputs_embeds=x, position_ids=pos).last_hidden_state

    stages = {"pyramid": pyramid, "allocate": allocate_, "gather": gather, "prefill": prefill}

    def chain():
        for stage in stages.values():
            stage()

    chain()
    t = {k: time_it(f, repeats=repeats, warmup=2, sync=sync) for k, f in stages.items()}
    t["chain"] = time_it(chain, repeats=repeats, warmup=1, sync=sync)
    total = sum(t[k]["median_ms"] for k in stages)
    side = sum(t[k]["median_ms"] for k in ("pyramid", "allocate", "gather"))
    side_over_prefill = side / t["prefill"]["median_ms"]
    del lm
    return {"model": name, "device": device, "dtype": str(dtype).replace("torch.", ""),
            "batch": batch, "budget": budget, "image_px": image_px, "allocator": allocator,
            "pixel_values_shape": list(state["pv"].reshape(-1, state["pv"][0, 0, 0].numel())
                                       .shape),
            "tokens_device": state["tokens"].centers.device.type, "timings": t,
            "shares": {k: t[k]["median_ms"] / total for k in stages},
            "side_over_prefill": side_over_prefill,
            # the same from the chain (a fresh pyramid each time: nothing cached between
            # stages), an estimate from two medians
            "chain_side_over_prefill": (t["chain"]["median_ms"] - t["prefill"]["median_ms"])
            / t["prefill"]["median_ms"],
            "target_side_over_prefill": PIPELINE_TARGET,
            "met": side_over_prefill <= PIPELINE_TARGET,
            "note": "vision tower not timed; shares are of the four stages' medians"}


def summary(points: list[dict], cfg, small: int = 273, large: int = 4096,
            paired: dict | None = None) -> dict:
    """Measured speedup t(large)/t(small) vs the FLOP-ratio bound, where both points exist.

    ``speedup_measured`` is the ratio of medians (the headline) and ``speedup_ci95`` its
    percentile bootstrap CI: both points' repeats resampled independently, 2,000 times.
    ``speedup_over_bound``: measured speedup / FLOP-ratio bound (1 = the prefill time
    scales exactly with its FLOPs). ``paired`` (:func:`~fovea_book.bench.common.time_rounds`
    of the two points, keys ``str(n)``) adds ``speedup_per_round``: the minimum and median
    of the per-round ratios t(large) / t(small).
    """
    by = {p["visual_tokens"]: p for p in points}
    if small not in by or large not in by:
        return {}
    s_small, s_large = by[small]["seq_len"], by[large]["seq_len"]
    bound = lm_prefill_flops(cfg, s_large)["total"] / lm_prefill_flops(cfg, s_small)["total"]
    dense = (lm_prefill_flops(cfg, s_large, causal=False)["total"]
             / lm_prefill_flops(cfg, s_small, causal=False)["total"])
    speed = by[large]["median_ms"] / by[small]["median_ms"]
    ci = [float("nan"), float("nan")]
    if "times_ms" in by[small] and "times_ms" in by[large]:
        import numpy as np

        a = np.asarray(by[large]["times_ms"])
        b = np.asarray(by[small]["times_ms"])
        rng = np.random.default_rng(0)
        boots = np.median(a[rng.integers(0, a.size, (2000, a.size))], 1) / np.median(
            b[rng.integers(0, b.size, (2000, b.size))], 1)
        ci = [float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))]
    per_round = {}
    if paired and str(small) in paired and str(large) in paired:
        per_round = {"speedup_per_round": round_ratios(paired[str(large)]["rounds_ms"],
                                                       paired[str(small)]["rounds_ms"])}
    return {"speedup_measured": speed, "speedup_ci95": ci, **per_round,
            "speedup_ci_method": "percentile bootstrap over repeats (2000 resamples)",
            "flop_ratio_bound": bound, "flop_ratio_bound_dense_attention": dense,
            "speedup_over_bound": speed / bound,
            # extremes of the repeats: a range, NOT a confidence interval (kept for readers
            # of older records; the interval to report is speedup_ci95)
            "speedup_measured_min_times": by[large]["min_ms"] / by[small]["min_ms"],
            "speedup_range": [by[large]["min_ms"] / by[small]["max_ms"],
                              by[large]["max_ms"] / by[small]["min_ms"]]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fovea_book.bench vlm_latency")
    ap.add_argument("--quick", action="store_true", help="tiny model, 4 points (a few seconds)")
    ap.add_argument("--no-gpu", action="store_true", help="skip the GPU part even if CUDA exists")
    ap.add_argument("--name", type=record_name, default="vlm_latency",
                    help="record name (<name>.json; letters, digits, '_', '.', '-')")
    ap.add_argument("--threads", type=int_at_least(1), default=None,
                    help="torch intra-op threads on the CPU (default: torch's choice)")
    ap.add_argument("--no-cpu", action="store_true",
                    help="skip the CPU models (exits 1 when there is no GPU to measure)")
    ap.add_argument("--gpu-models", nargs="+", default=["qwen2-vl-2b", "qwen2.5-vl-7b"],
                    choices=MODEL_NAMES, metavar="MODEL")
    ap.add_argument("--gpu-tokens", type=int_at_least(1), nargs="+", default=list(TOKENS),
                    help="visual-token counts (each >= 1, at most 64*64)")
    ap.add_argument("--cuda-graph", action="store_true",
                    help="on the GPU also time CUDA-graph replays of each prefill")
    ap.add_argument("--gpu-batches", type=int_at_least(1), nargs="+", default=list(GPU_BATCHES),
                    help="batch sizes of the GPU runs (each >= 1)")
    ap.add_argument("--cpu-batches", type=int_at_least(1), nargs="+", default=[1],
                    help="batch sizes of the CPU runs (each >= 1)")
    ap.add_argument("--pipeline", action="store_true",
                    help="on the GPU also time allocate + gather + prefill at N = 273, batch 8 "
                         "(each stage's share of the whole)")
    add_output_args(ap)
    args = ap.parse_args(argv)
    if too_many := [n for n in args.gpu_tokens if n > GRID[0] * GRID[1]]:
        ap.error(f"argument --gpu-tokens: at most {GRID[0] * GRID[1]} (the 64 x 64 grid), "
                 f"got {too_many}")
    gpu = torch.cuda.is_available() and not args.no_gpu
    if args.no_cpu and not args.quick and not gpu:
        why = "--no-gpu was given" if args.no_gpu else "no CUDA GPU here"
        raise BenchError(f"--no-cpu with nothing else to measure ({why}); nothing written")
    run = Run(args.name, args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    runs = []
    if args.quick:
        for b in args.cpu_batches:
            runs.append(run_model("qwen2-vl-tiny", QUICK_TOKENS, "cpu", torch.float32,
                                  budget_s=0.5, batch=b))
    elif not args.no_cpu:
        for b in args.cpu_batches:
            runs.append(run_model("qwen2-vl-tiny", TOKENS, "cpu", torch.float32, budget_s=1.5,
                                  batch=b))
            runs.append(run_model("qwen2-vl-mid", TOKENS, "cpu", torch.float32, budget_s=6.0,
                                  batch=b))
    gpu_note = "no CUDA device on this machine: GPU part skipped"
    pipe = None
    if gpu:
        gpu_note = torch.cuda.get_device_name(0)
        peak = matmul_peak_tflops("cuda", torch.bfloat16)
        for name in args.gpu_models:
            for b in args.gpu_batches:
                for graph in (False, True) if args.cuda_graph else (False,):
                    try:
                        runs.append(run_model(name, tuple(args.gpu_tokens), "cuda",
                                              torch.bfloat16, budget_s=2.0, batch=b,
                                              peak_tflops=peak, cuda_graph=graph))
                    except Exception as exc:  # noqa: BLE001  (capture / memory: recorded)
                        runs.append({"model": name, "batch": b, "cuda_graph": graph,
                                     "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
                    torch.cuda.empty_cache()
        if args.pipeline:
            pipe = pipeline(args.gpu_models[0], "cuda", torch.bfloat16)
    run.write({
        "description": "LM prefill (random weights, real transformers Qwen-VL classes) vs "
                       "number of visual tokens; text prompt of "
                       f"{TEXT_BEFORE}+{TEXT_AFTER} tokens; positions on a 64x64 merged grid",
        "flops_formula": "lm_prefill_flops (causal attention pairs S(S+1)/2, 2 FLOPs/MAC)",
        "cpu_memory": "peak RSS increase during one prefill, sampled every 1 ms from /proc/self/statm",
        "gpu": gpu_note, "text_tokens": TEXT_BEFORE + TEXT_AFTER,
        "transformers": __import__("transformers").__version__,
        "wall_s": time.perf_counter() - t0, "runs": runs,
        **({"pipeline": pipe} if pipe is not None else {})},
        sources=("book/fovea_book/bench/vlm_latency.py", "book/fovea_book/qwen_models.py",
                 "fovea_core/vlm")
        + (("fovea_core/kernels", "book/fovea_book/kernels.py", "cuda", "fovea_core/allocators")
           if pipe else ()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
