"""Benchmark the importance scorers on one 1024 px page (``python -m fovea_book.bench importance``).

The page is a real SROIE receipt (first image of ``sroie-dev``) resized so its longer side
is 1024 px, or, when the dataset is absent, a synthetic 1024 x 768 invoice. Reports model
load time, then the median/min/max per call of every scorer, and for the query scorer:
``cold`` (OCR + embeddings recomputed: a new page) at coarse levels 0, 1, 2 and ``warm``
(same page, new question: OCR read from the cache, only the question is embedded), and the
cascade's side compute, the text detector of :mod:`fovea_core.cascade.side`, on one core
(on the page and on the first FUNSD dev form).
Writes ``_build/benchmarks/importance.json`` (``--record``: the committed
``data/benchmarks/importance.json``, through the rule of :class:`~fovea_book.bench.common.Run`).
No comparisons between paths (each scorer's time stands alone), so no per-round ratios.
"""

from __future__ import annotations

import argparse
import itertools
import time

import cv2
import numpy as np

from fovea_book.bench.common import Run, add_output_args, int_at_least, time_it
from fovea_book.paths import DatasetNotFound, dataset_path

QUESTIONS = ["What is the total?", "What is the date?", "Which company issued this receipt?",
             "What is the address?"]


def benchmark_page(side: int = 1024) -> tuple[np.ndarray, str]:
    """``([H, W, 3] uint8 RGB page with longer side ``side``, description)``."""
    try:
        path = sorted((dataset_path("sroie-dev") / "img").glob("*.jpg"))[0]
        img = cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)
        source = f"sroie-dev/{path.name}"
    except (DatasetNotFound, IndexError):
        img = np.full((1024, 768, 3), 255, np.uint8)
        for i, (text, y) in enumerate([("INVOICE", 80), ("Coffee beans 2kg   18.00", 400),
                                       ("Date 12/03/2019", 460), ("TOTAL 42.00", 950)]):
            cv2.putText(img, text, (60, y), cv2.FONT_HERSHEY_SIMPLEX, 1.0 + (i == 0), (0, 0, 0), 2)
        source = "synthetic invoice"
    scale = side / max(img.shape[:2])
    img = cv2.resize(img, (round(img.shape[1] * scale), round(img.shape[0] * scale)),
                     interpolation=cv2.INTER_AREA)
    return img, f"{source} resized to {img.shape[0]}x{img.shape[1]}"


def side_pages() -> list[tuple[str, np.ndarray]]:
    """The first FUNSD dev form at its own size (``[("form", page)]``; ``[]`` without the
    dataset): the page kind whose small text the cascade's text detector is for."""
    try:
        path = sorted((dataset_path("funsd-dev") / "images").glob("*.png"))[0]
    except (DatasetNotFound, IndexError):
        return []
    return [("form", cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fovea_book.bench importance")
    ap.add_argument("--repeats", type=int_at_least(1), default=5,
                    help="repeats of the cheap scorers (>= 1)")
    ap.add_argument("--side", type=int_at_least(64), default=1024,
                    help="the page's longer side in pixels (>= 64)")
    add_output_args(ap)
    args = ap.parse_args(argv)
    run = Run("importance", args)

    from fovea_core.importance import query_scores, score
    from fovea_core.importance.query import clear_caches, text_encoder
    from fovea_core.importance.text import ocr_engine

    page, source = benchmark_page(args.side)
    t0 = time.perf_counter()
    ocr_engine()._load_det_model()
    ocr_engine()._load_rec_model()
    t1 = time.perf_counter()
    text_encoder()
    t2 = time.perf_counter()
    result: dict = {"page": source, "page_shape": list(page.shape),
                    "load_s": {"rapidocr": t1 - t0, "minilm": t2 - t1}, "scorers": {}}
    # The combinations (saliency, text_saliency, query_saliency) cost the sum of their parts;
    # "query" is timed below per coarse level (level 1 is the registry default).
    for name in ("spectral_residual", "edge_density", "center_bias", "saliency", "text"):
        reps = max(2, args.repeats // 2) if name == "text" else args.repeats
        result["scorers"][name] = time_it(lambda name=name: score(name, page), repeats=reps,
                                          warmup=1)
        print(f"{name:18s} {result['scorers'][name]['median_ms']:9.1f} ms")
    # chapter 16's fixation predictor on an OSIE-sized 800 x 600 image, on one core
    # (its budget, set on 2026-11-24: <= 50 ms); its ONNX text detector takes torch's thread count
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    try:
        from fovea_core.importance.fixation import text_session

        text_session.cache_clear()                 # a session with one intra-op thread
        photo = cv2.resize(page, (800, 600), interpolation=cv2.INTER_AREA)
        result["fixation_800x600_one_core"] = time_it(lambda: score("fixation", photo),
                                                      repeats=args.repeats, warmup=1)
        result["fixation_800x600_one_core"]["target_ms"] = 50.0
    finally:
        torch.set_num_threads(threads)
        cv2.setNumThreads(threads)
    print(f"fixation 800x600 1 core {result['fixation_800x600_one_core']['median_ms']:7.1f} ms")
    # the cascade's side compute (its target: <= 100 ms of one core a page): the text detector
    # on the benchmark page and on a FUNSD form at their own sizes, nothing cached between calls
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    try:
        from fovea_core.cascade.side import detect_text
        from fovea_core.importance.fixation import text_session
        from fovea_core.pyramid import build_pyramid

        text_session.cache_clear()
        result["side_text_detector_one_core"] = {}
        for name, img in (("page", page), *side_pages()):
            pyr = build_pyramid(img)
            r = time_it(lambda pyr=pyr: detect_text(pyr), repeats=args.repeats, warmup=1)
            result["side_text_detector_one_core"][name] = {
                **r, "shape": list(img.shape), "target_ms": 100.0}
            print(f"side text detector {name:8s} {r['median_ms']:7.1f} ms")
    finally:
        torch.set_num_threads(threads)
        cv2.setNumThreads(threads)
    result["query_cold_by_coarse_level"], result["lines_read_by_coarse_level"] = {}, {}
    for level in (0, 1, 2):
        def cold(level=level):
            clear_caches()
            return query_scores(page, QUESTIONS[0], coarse_level=level)
        result["query_cold_by_coarse_level"][str(level)] = time_it(cold, repeats=2, warmup=0)
        print(f"query cold level {level} "
              f"{result['query_cold_by_coarse_level'][str(level)]['median_ms']:9.1f} ms")
        reads = query_scores(page, QUESTIONS[0], coarse_level=level, return_reads=True)[1]
        result["lines_read_by_coarse_level"][str(level)] = len(reads[0].texts)   # cached read
    query_scores(page, QUESTIONS[0])
    counter = itertools.count(1)

    def warm():                         # cached OCR, a question string never embedded before
        i = next(counter)
        return query_scores(page, f"{QUESTIONS[i % len(QUESTIONS)]} (variant {i})")
    result["query_warm_new_question"] = time_it(warm, repeats=3, warmup=0)
    print(f"query warm        {result['query_warm_new_question']['median_ms']:9.1f} ms")
    run.write(result)
    return 0
