"""What a page costs, over page sizes: from a file to N tokens, beside the model's own processor.

``python -m fovea_book.bench pages [--quick] [--rounds R] [--sizes MP ...] [--kinds photo scan]
[--formats jpeg png] [--methods M ...] [--threads T] [--data DIR] [--record]`` times, on one
CPU core, the path a user takes with a page file of their own:

* **tokens** (``tokens/<method>``): ``f = foveate(path, question, budget=N, method=m)``
  (:func:`fovea_core.foveation.foveate`, patch 16 px), then ``f.tokens`` and ``f.patches``
  are read; ``f.view`` (the reconstruction for readers) is never touched;
* **model inputs** (``inputs/<method>``): ``FoveatedProcessor(path, question, budget=N,
  method=m)`` (:class:`fovea_core.vlm.processor.FoveatedProcessor` of the random-weight
  ``qwen2-vl-tiny`` config, built as :func:`fovea_book.bench.ttft.processor_for` builds it:
  the stock resize to at least N and at most 1280 merged cells of 28 px, then foveate at the
  merged cell, then ``input_ids``, ``pixel_values``, ``image_grid_thw`` and M-RoPE
  ``position_ids``);
* **stock**: the ``transformers`` ``Qwen2VLImageProcessorPil`` on the same file (``PIL``
  open, then the processor's resize, rescale, normalise and patchify into ``pixel_values``),
  its ``min_pixels = max_pixels`` chosen so that it gives N merged tokens of 28 px, or the
  count nearest N that its ``smart_resize`` allows for the page's shape
  (:func:`stock_pixels`; the record keeps the count it gave: ``stock_tokens``);
* **decode**: ``PIL.Image.open(path).load()``, the page's pixels once at full size;
* **draft** (JPEG only): the same with ``Image.draft`` at the stock processor's output size:
  libjpeg decodes at 1/2, 1/4 or 1/8 scale, the least a page of that size needs.

The methods are ``resize``, ``cascade`` and ``foveate``'s default
(:data:`fovea_core.foveation.DEFAULT_METHOD`), N = 273 and the question
:data:`QUESTION` for every page.

**Pages** (:func:`plan_pages`): for each kind (:data:`KINDS`: phone photographs from
WildReceipt, flatbed scans from SROIE and FUNSD) and each size of ``--sizes`` (default
about 0.3, 1, 4, 12 and 20 megapixels), the real page whose pixel count is nearest the size
within a factor :data:`REAL_WITHIN` (``source: "real"``; a page already in the wanted format
first), else the smallest real page larger than the size resampled down to it
(``"downsampled"``, ``downsampled_from``), else the largest real page resampled up
(``"upsampled"``, ``upsampled_from``), with Lanczos, the aspect ratio kept; each written as
JPEG and as PNG. A JPEG is written with the quantisation tables and chroma subsampling of
the real JPEG it comes from (a page from a PNG: quality :data:`JPEG_QUALITY`); a PNG with
Pillow's defaults. Files go to a temporary folder (``$TMPDIR``), never into the repository,
and are removed at the end. Datasets are read from ``--data`` (default ``$FOVEA_DATA``,
:func:`fovea_book.paths.data_dir`); a missing one stops the run with the message of
:func:`fovea_book.paths.dataset_path`.

**Each call reads a new page.** The cascade and the default keep per-page results (gist
encodings, OCR reads, text sizes) keyed by the page's pixels, and the OCR keeps its reads on
disk. So every timed call gets its own file, the page with a small black-and-white bar code
in its top-left corner (:func:`mark`, twelve squares of ``max(8, long side / 256)`` px)
that is unique to the call (every page key differs), the OCR's disk cache is off
(``FOVEA_NO_DISK_CACHE=1`` for the run) and its memory of reads and string embeddings is
emptied before each call (:func:`fovea_core.importance.query.clear_caches`). What a process
loads once and keeps (the localiser's and the OCR's models, the sentence embedder) stays
loaded: that is **warm**. The first call of each path in the process, the one that loads
them, is reported apart (``first_call``); every page and path also gets one untimed warm-up
call (``warmup_ms``) before its timed rounds.

**Timing rule.** One thread (``--threads``, default 1: torch, OpenCV, and the OCR's ONNX
Runtime sessions, which take torch's thread count when they load). Per page, ``R`` rounds
(``--rounds``, default :data:`ROUNDS`), each running every path once, in turn
(:func:`~fovea_book.bench.common.time_rounds`); per path the median over rounds, and per
method and path the per-round ratios ``t(path) / t(stock)`` of the same round with their
median (:func:`~fovea_book.bench.common.ratio`, plus the list ``round_ratios``). The time
the default spends inside the OCR engine (``fovea_core.importance.query.read_text``) is
reported per round as ``ocr_ms``.

**Targets** (:func:`targets`, on the 12-MP JPEG of each kind, tokens path): ``resize`` at
most :data:`TARGETS` ``["resize"]`` x the stock processor, ``cascade`` at most
``TARGETS["cascade"]`` x, the default at most ``TARGETS["default_s"]`` s warm; and from 1
to 20 MP each path's time grows by no more than the decode's (:func:`growth`).

``--quick`` (one photograph of about 0.3 MP, JPEG, one round) takes seconds without the
cascades' first calls; the tests run it with ``--methods resize``. A full run on the
default pages is long on today's code (tens of seconds per call at 20 MP): run it on a quiet
machine.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import os
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fovea_book.bench.common import (BenchError, Run, add_output_args, int_at_least, ratio,
                                     time_rounds)

#: N, the tokens every path gives the model
BUDGET = 273
#: the question every method is asked (the methods that ignore it are not told twice)
QUESTION = "What is the total?"
#: the default page sizes, megapixels
SIZES_MP = (0.3, 1.0, 4.0, 12.0, 20.0)
#: page kinds: (dataset, image folder) pools, searched together
KINDS = {"photo": (("wildreceipt-dev", "img"), ("wildreceipt-unlabelled", "img")),
         "scan": (("sroie-dev", "img"), ("funsd-dev", "images"))}
FORMATS = ("jpeg", "png")
#: a real page counts as "about" a size when its pixel count is within this factor of it
REAL_WITHIN = 1.2
#: JPEG quality of a page whose source is not a JPEG (a FUNSD PNG)
JPEG_QUALITY = 90
ROUNDS = 3
QUICK = {"kinds": ["photo"], "sizes": [0.3], "formats": ["jpeg"], "rounds": 1}
#: the issue's targets, one core, the 12-MP JPEG: ratios to the stock processor, and the
#: default's warm seconds (moonshots beside them)
TARGETS = {"resize": 1.5, "cascade": 2.0, "default_s": 0.5}
MOONSHOTS = {"resize": 1.0, "default_s": 0.25}
#: the size at which :func:`targets` judges, megapixels
TARGET_MP = 12.0
#: (module, attribute, stage): the OCR engine call whose time is reported as ``ocr_ms``
OCR_PROBES = (("fovea_core.importance.query", "read_text", "ocr"),)
#: mark squares and bits
MARK_BITS = 12
#: what the record's timings cover (besides the common sources): the whole method
SOURCES = ("book/fovea_book/bench/pages.py", "fovea_core", "fovea_core/weights/gist_localiser.pt",
           "fovea_core/weights/cascade_read.json")
_EXT = {"jpeg": ".jpg", "png": ".png"}


# ----------------------------------------------------------------------------- pages
@dataclass
class PagePlan:
    """Where one benchmark page comes from and how it is made (:func:`plan_pages`)."""

    name: str                     # "photo-12mp-jpeg"
    kind: str
    format: str                   # "jpeg" | "png"
    target_mp: float
    source: str                   # "real" | "downsampled" | "upsampled"
    dataset: str
    file: Path
    source_hw: tuple[int, int]
    size_hw: tuple[int, int]      # the page's size (= source_hw for a real page)

    def info(self) -> dict:
        """The record's description of the page."""
        src = (f"{self.dataset}/{self.file.name} ({self.source_hw[0]}x{self.source_hw[1]}, "
               f"{self.source_hw[0] * self.source_hw[1] / 1e6:.2f} MP)")
        out = {"name": self.name, "kind": self.kind, "format": self.format,
               "target_mp": self.target_mp, "source": self.source, "dataset": self.dataset,
               "file": self.file.name, "size_hw": list(self.size_hw),
               "mp": self.size_hw[0] * self.size_hw[1] / 1e6,
               "source_format": _format_of(self.file)}
        if self.source != "real":
            out[f"{self.source}_from"] = src
        return out


def _format_of(path: Path) -> str:
    return "jpeg" if path.suffix.lower() in (".jpg", ".jpeg") else "png"


def _candidates(kind: str, root: str | Path | None) -> list[tuple[str, Path, int, int]]:
    """``(dataset, file, H, W)`` of every page of ``kind`` (headers only: nothing decoded)."""
    from PIL import Image

    from fovea_book.paths import DatasetNotFound, dataset_path

    out = []
    for name, sub in KINDS[kind]:
        try:
            folder = dataset_path(name, root) / sub
        except DatasetNotFound as err:
            raise BenchError(f"pages: {err}") from None
        if not folder.is_dir():
            raise BenchError(f"pages: dataset {name!r} has no {sub}/ folder at {folder}; "
                             f"fetch it again with `python -m fovea_book.fetch {name}`")
        for f in sorted(folder.iterdir()):
            if f.suffix.lower() in (".jpg", ".jpeg", ".png"):
                with Image.open(f) as im:
                    out.append((name, f, im.size[1], im.size[0]))
    if not out:
        raise BenchError(f"pages: no .jpg or .png page in the {kind} datasets "
                         f"{[n for n, _ in KINDS[kind]]}")
    return out


def plan_pages(kinds: Sequence[str], sizes_mp: Sequence[float], formats: Sequence[str],
               root: str | Path | None = None) -> list[PagePlan]:
    """One :class:`PagePlan` per kind, size and format, by the rule of the module docstring
    (nearest real page within :data:`REAL_WITHIN`, one in the wanted format first; else a
    larger one down; else the largest up). ``root``: the datasets' root (default
    :func:`fovea_book.paths.data_dir`). Raises :class:`BenchError` naming a missing dataset."""
    plans = []
    for kind in kinds:
        pool = _candidates(kind, root)
        for mp in sizes_mp:
            want = mp * 1e6
            for fmt in formats:
                def near(c):
                    return (abs(math.log(c[2] * c[3] / want)), _format_of(c[1]) != fmt, str(c[1]))
                real = [c for c in pool if abs(math.log(c[2] * c[3] / want)) <= math.log(REAL_WITHIN)]
                larger = [c for c in pool if c[2] * c[3] > want]
                if real:
                    c = min(real, key=lambda c: (_format_of(c[1]) != fmt, near(c)))
                    source, hw = "real", (c[2], c[3])
                else:
                    if larger:
                        c, source = min(larger, key=near), "downsampled"
                    else:
                        c, source = max(pool, key=lambda c: (c[2] * c[3], str(c[1]))), "upsampled"
                    s = math.sqrt(want / (c[2] * c[3]))
                    hw = (max(1, round(c[2] * s)), max(1, round(c[3] * s)))
                plans.append(PagePlan(f"{kind}-{mp:g}mp-{fmt}", kind, fmt, float(mp), source,
                                      c[0], c[1], (c[2], c[3]), hw))
    return plans


def page_image(plan: PagePlan):
    """The page as a PIL image: the real page decoded (upright, by its EXIF orientation),
    resampled with Lanczos to ``plan.size_hw`` when it is not real."""
    from PIL import Image, ImageOps

    with Image.open(plan.file) as im:
        img = ImageOps.exif_transpose(im)
        img.load()
    if img.mode not in ("RGB", "L"):
        img = img.convert("RGB")
    if (img.size[1], img.size[0]) != plan.size_hw:
        img = img.resize(plan.size_hw[::-1], Image.Resampling.LANCZOS)
    return img


def save_options(plan: PagePlan) -> dict:
    """Pillow ``save`` options of the page's files: a JPEG keeps the source JPEG's
    quantisation tables and chroma subsampling (else quality :data:`JPEG_QUALITY`); a PNG
    takes Pillow's defaults."""
    if plan.format == "png":
        return {"format": "PNG"}
    if _format_of(plan.file) != "jpeg":
        return {"format": "JPEG", "quality": JPEG_QUALITY}
    from PIL import Image, JpegImagePlugin

    with Image.open(plan.file) as im:
        opts = {"format": "JPEG", "qtables": im.quantization}
        if im.mode != "L":
            opts["subsampling"] = JpegImagePlugin.get_sampling(im)
    return opts


def mark(img, k: int):
    """A copy of ``img`` (PIL, RGB or L) with call ``k``'s bar code in its top-left corner:
    :data:`MARK_BITS` squares of side ``max(8, long side // 256)`` px, black for a 1 bit of
    ``k`` and white for a 0, so that every call's page (and every per-page cache key)
    differs while the page's content and size do not. ``k`` in ``[1, 2**MARK_BITS)``."""
    import numpy as np
    from PIL import Image

    if not 1 <= k < 2 ** MARK_BITS:
        raise ValueError(f"k must be in [1, {2 ** MARK_BITS}), got {k}")
    w, h = img.size
    s = max(8, max(w, h) // 256)
    if MARK_BITS * s > w or s > h:
        raise ValueError(f"img: a {h}x{w} page is too small for a {MARK_BITS * s}x{s} px mark")
    bits = (k >> np.arange(MARK_BITS)) & 1                                # [MARK_BITS]
    bar = np.repeat(np.where(bits == 1, 0, 255).astype(np.uint8), s)[None].repeat(s, 0)
    out = img.copy()
    out.paste(Image.fromarray(bar, "L").convert(img.mode), (0, 0))
    return out


def write_variants(plan: PagePlan, folder: Path, count: int) -> list[Path]:
    """``count`` files of the page, call marks ``1..count`` (:func:`mark`), in ``folder``."""
    img = page_image(plan)
    opts = save_options(plan)
    paths = []
    for k in range(1, count + 1):
        p = folder / f"{plan.name}-{k:04d}{_EXT[plan.format]}"
        mark(img, k).save(p, **opts)
        paths.append(p)
    return paths


# ----------------------------------------------------------------------------- the stock processor
def stock_pixels(size_hw: tuple[int, int], n: int, family: str = "qwen2-vl") -> tuple[int, int]:
    """``(pixels, tokens)``: the ``min_pixels = max_pixels`` at which the stock processor's
    ``smart_resize`` gives a page of ``size_hw`` the count of merged tokens nearest ``n``
    (ties: at most ``n``, then the pixel count nearest ``n`` cells), and that count.
    Searched over ``n`` cells' pixels times 0.5 .. 2 in steps of 0.1 %."""
    from fovea_core.vlm.positions import merged_cell_px, merged_grid_shape

    cell2 = merged_cell_px(family) ** 2
    best = None
    for i in range(1501):
        p = round(n * cell2 * (0.5 + i * 0.001))
        hm, wm = merged_grid_shape(size_hw, family, min_pixels=p, max_pixels=p)
        key = (abs(hm * wm - n), hm * wm > n, abs(p - n * cell2))
        if best is None or key < best[0]:
            best = (key, p, hm * wm)
    return best[1], best[2]


def stock_processor_at(fp, pixels: int):
    """A copy of ``fp``'s stock ``Qwen2VLImageProcessorPil`` with ``min_pixels = max_pixels =
    pixels``."""
    ip = copy.deepcopy(fp.processor.image_processor)
    ip.size = type(ip.size)(shortest_edge=int(pixels), longest_edge=int(pixels))
    return ip


# ----------------------------------------------------------------------------- timing
@dataclass
class PageBench:
    """The timed paths of one page and the file each call reads (set by :meth:`before`)."""

    plan: PagePlan
    methods: list[str]
    files: list[Path]                       # the page's marked files, one per call slot
    fp: object                              # the FoveatedProcessor
    ip: object                              # the stock image processor at N
    draft_wh: tuple[int, int]
    clock: object                           # ttft.StageClock for the OCR probe
    current: dict = field(default_factory=dict)
    ocr: dict = field(default_factory=dict)  # path -> [ms per call]
    slot: int = 0

    def fns(self) -> dict[str, Callable[[], object]]:
        """The timed paths, in the order each round runs them."""
        out = {"decode": self.decode, "stock": self.stock}
        if self.plan.format == "jpeg":
            out["draft"] = self.draft
        for kind in ("tokens", "inputs"):
            for m in self.methods:
                out[f"{kind}/{m}"] = self._call(kind, m)
        return out

    def next_round(self) -> None:
        """Hand the next round's files out: one per method, shared by both of its paths;
        the stock, decode and draft read the first method's."""
        self.current = {m: self.files[self.slot + j] for j, m in enumerate(self.methods)}
        self.slot += len(self.methods)

    def before(self, name: str) -> None:
        """Called before every call (outside its time): a new round's files at the round's
        first path; the OCR's read and embedding memory emptied before a method's call."""
        if name == "decode":
            self.next_round()
        if "/" in name:
            from fovea_core.importance.query import clear_caches

            clear_caches()
            self.clock.reset()

    def _file(self, m: str | None = None) -> str:
        return str(self.current[m or self.methods[0]])

    def decode(self) -> None:
        from PIL import Image

        with Image.open(self._file()) as im:
            im.load()

    def draft(self) -> None:
        from PIL import Image

        with Image.open(self._file()) as im:
            im.draft(im.mode, self.draft_wh)
            im.load()

    def stock(self):
        from PIL import Image

        with Image.open(self._file()) as im:
            return self.ip(images=im, return_tensors="pt")

    def _call(self, kind: str, m: str) -> Callable[[], object]:
        from fovea_core.foveation import FoveateWarning, foveate

        name = f"{kind}/{m}"

        def tokens():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FoveateWarning)   # resize ignores the question
                f = foveate(self._file(m), QUESTION, budget=BUDGET, method=m)
            f.tokens, f.patches                                       # never f.view
            self.ocr.setdefault(name, []).append(self.clock.times.get("ocr", 0.0))
            return f

        def inputs():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FoveateWarning)
                x = self.fp(self._file(m), QUESTION, budget=BUDGET, method=m)
            self.ocr.setdefault(name, []).append(self.clock.times.get("ocr", 0.0))
            return x

        return tokens if kind == "tokens" else inputs


def check_call(name: str, out, fp) -> None:
    """Raise :class:`BenchError` when a path did not give N tokens (checked on the warm-up)."""
    if name.startswith("tokens/"):
        got = out.tokens.budget
    elif name.startswith("inputs/"):
        got = int((out["input_ids"] == fp.image_token_id).sum())
    else:
        return
    if got != BUDGET:
        raise BenchError(f"pages: path {name} gave {got} tokens, not N = {BUDGET}")


def ocr_summary(values: Sequence[float]) -> dict:
    """Median, minimum, maximum and the list of one path's OCR milliseconds per round."""
    return {"median_ms": statistics.median(values), "min_ms": min(values),
            "max_ms": max(values), "rounds_ms": [round(v, 4) for v in values]}


def time_page(pb: PageBench, rounds: int, first_call: dict) -> dict:
    """Warm-up call of every path (timed apart; the process's first call of a path goes to
    ``first_call``), then ``rounds`` interleaved rounds. Returns the page's record."""
    fns = pb.fns()
    warm = {}
    for name, fn in fns.items():                          # the warm-up round, timed apart
        pb.before(name)
        t0 = time.perf_counter()
        out = fn()
        warm[name] = (time.perf_counter() - t0) * 1e3
        check_call(name, out, pb.fp)
        first_call.setdefault(name, {"ms": warm[name], "page": pb.plan.name})
    pb.ocr.clear()
    timings = time_rounds(fns, rounds=rounds, warmup=0, before=pb.before)
    ratios = {}
    for name in fns:
        if "/" in name:
            r = ratio(timings, name, "stock")
            r["round_ratios"] = [a / b for a, b in zip(timings[name]["rounds_ms"],
                                                       timings["stock"]["rounds_ms"])]
            ratios[name] = r
    ocr = {k: ocr_summary(v) for k, v in pb.ocr.items() if any(v)}
    return {"timings": timings, "ratios": ratios, "warmup_ms": warm, "ocr_ms": ocr}


# ----------------------------------------------------------------------------- for the book
def _default_name(record: Mapping) -> str:
    return record.get("default_method") or "cascade_glance"


def curve_rows(record: Mapping | None) -> list[dict]:
    """One row per page and timed path of a ``pages`` record: ``{"page", "kind", "format",
    "mp", "series", "path", "method", "median_ms", "min_ms", "max_ms", "ratio"}``
    (``series``: ``"stock"``, ``"decode"``, ``"draft"`` or ``"<path>/<method>"``; ``ratio``:
    the median of its per-round ratios to the stock processor, None for the references).
    An absent record gives no rows."""
    rows = []
    for p in (record or {}).get("pages", []):
        for series, t in p["timings"].items():
            path, _, method = series.partition("/")
            r = p["ratios"].get(series)
            rows.append({"page": p["name"], "kind": p["kind"], "format": p["format"],
                         "mp": p["mp"], "series": series, "path": path if method else series,
                         "method": method or None, "median_ms": t["median_ms"],
                         "min_ms": t["min_ms"], "max_ms": t["max_ms"],
                         "ratio": r["median_of_round_ratios"] if r else None})
    return rows


def _page_at(pages: Sequence[Mapping], kind: str, fmt: str, mp: float) -> Mapping | None:
    return next((p for p in pages if p["kind"] == kind and p["format"] == fmt
                 and p["target_mp"] == mp), None)


def targets(record: Mapping | None) -> dict:
    """The targets per kind, judged on that kind's 12-MP JPEG, tokens path (see the module
    docstring): ``{kind: {"page", "mp", "resize": {...}, "cascade": {...}, "default_s":
    {...}}}``, each ``{"target", "moonshot", "measured", "met"}`` (``measured``: a median of
    per-round ratios to the stock processor, or the default's median warm seconds; None and
    ``met`` None when not measured)."""
    out = {}
    pages = (record or {}).get("pages", [])
    default = _default_name(record or {})
    for kind in dict.fromkeys(p["kind"] for p in pages):
        page = _page_at(pages, kind, "jpeg", TARGET_MP)
        if page is None:
            continue
        entry: dict = {"page": page["name"], "mp": page["mp"]}
        for key, limit in TARGETS.items():
            if key == "default_s":
                t = page["timings"].get(f"tokens/{default}")
                measured = t["median_ms"] / 1e3 if t else None
            else:
                r = page["ratios"].get(f"tokens/{key}")
                measured = r["median_of_round_ratios"] if r else None
            entry[key] = {"target": limit, "moonshot": MOONSHOTS.get(key), "measured": measured,
                          "met": None if measured is None else bool(measured <= limit)}
        out[kind] = entry
    return out


def growth(record: Mapping | None, lo_mp: float = 1.0, hi_mp: float = 20.0) -> dict:
    """From ``lo_mp`` to ``hi_mp`` megapixels, per kind and format and timed path: the
    factor by which its median time grew beside the decode's: ``{"<kind>-<format>": {path:
    {"time_factor", "decode_factor", "met"}}}`` (met: it grew no more than the decode)."""
    out = {}
    pages = (record or {}).get("pages", [])
    for kind in dict.fromkeys(p["kind"] for p in pages):
        for fmt in dict.fromkeys(p["format"] for p in pages):
            lo, hi = _page_at(pages, kind, fmt, lo_mp), _page_at(pages, kind, fmt, hi_mp)
            if lo is None or hi is None:
                continue
            dec = hi["timings"]["decode"]["median_ms"] / lo["timings"]["decode"]["median_ms"]
            out[f"{kind}-{fmt}"] = {
                k: {"time_factor": hi["timings"][k]["median_ms"] / v["median_ms"],
                    "decode_factor": dec,
                    "met": bool(hi["timings"][k]["median_ms"] / v["median_ms"] <= dec)}
                for k, v in lo["timings"].items() if k in hi["timings"] and k != "decode"}
    return out


def _verdict(entry: Mapping) -> str:
    return ("not measured" if entry["met"] is None
            else "meets it" if entry["met"] else "misses it")


def _num(v: float | None, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def summary_words(record: Mapping | None, kind: str = "photo") -> str:
    """The chapter's sentence (Markdown) on ``kind``'s 12-MP JPEG: each method's ratio or
    time beside its target (:func:`targets`) with the verdict, the default's OCR time and its
    first call; without a record (or that page), a sentence that says none is committed yet
    and how it is measured."""
    t = targets(record).get(kind)
    if t is None:
        return ("**No page-size record is committed yet** (`data/benchmarks/pages.json`, "
                f"with a {TARGET_MP:g}-megapixel JPEG {kind}): it is measured on a quiet "
                "machine with `python -m fovea_book.bench pages --record`, and the figure "
                "stays empty until then.")
    page = next(p for p in record["pages"] if p["name"] == t["page"])
    default = _default_name(record)
    r, c, d = t["resize"], t["cascade"], t["default_s"]
    ocr = page.get("ocr_ms", {}).get(f"tokens/{default}")
    first = record.get("first_call", {}).get(f"tokens/{default}")
    words = (f"On the {t['mp']:.1f}-megapixel JPEG {kind} ({page['source']} page, "
             f"{page['dataset']}/{page['file']}), `resize` took {_num(r['measured'], '.2f')} "
             f"x the stock processor's time (target at most {r['target']:g} x: "
             f"{_verdict(r)}), `cascade` {_num(c['measured'], '.2f')} x (target "
             f"{c['target']:g} x: {_verdict(c)}), and the default `{default}` "
             f"{_num(d['measured'], '.2f')} s warm (target {d['target']:g} s: {_verdict(d)})")
    if ocr:
        words += f", of which its OCR took {ocr['median_ms'] / 1e3:.2f} s"
    if first:
        words += (f"; its first call in the process, which loads its models, took "
                  f"{first['ms'] / 1e3:.1f} s (on the page {first['page']})")
    return words + "."


# ----------------------------------------------------------------------------- main
@contextlib.contextmanager
def _threads(n: int) -> Iterator[dict]:
    """``n`` threads for torch and OpenCV for the block (the OCR's ONNX Runtime sessions
    take torch's count when they load); yields what was set, restores the counts after."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    out = {"torch": torch.get_num_threads(),
           "ocr_onnxruntime": "torch's count at the OCR's first load (fovea_core.importance.text)"}
    try:
        import cv2
    except ImportError:
        cv2 = None
    if cv2 is not None:
        saved_cv = cv2.getNumThreads()
        cv2.setNumThreads(n)
        out["opencv"] = cv2.getNumThreads()
    try:
        yield out
    finally:
        torch.set_num_threads(saved)
        if cv2 is not None:
            cv2.setNumThreads(saved_cv)


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _sizes(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be megapixels > 0, got {text!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"must be megapixels > 0, got {text!r}")
    return v


def _parser() -> argparse.ArgumentParser:
    from fovea_core.foveation import DEFAULT_METHOD

    ap = argparse.ArgumentParser(
        prog="python -m fovea_book.bench pages",
        description="Time from a page file to N tokens (foveate) and to the model's inputs "
                    "(FoveatedProcessor), beside the stock Qwen2-VL image processor, over "
                    "page sizes; writes _build/benchmarks/pages.json.")
    ap.add_argument("--quick", action="store_true",
                    help="one photograph of about 0.3 MP, JPEG, one round (for tests)")
    ap.add_argument("--rounds", type=int_at_least(1), default=None,
                    help=f"interleaved timed rounds per page (default {ROUNDS}; --quick 1)")
    ap.add_argument("--sizes", type=_sizes, nargs="+", default=None, metavar="MP",
                    help=f"page sizes in megapixels (default {' '.join(map(str, SIZES_MP))})")
    ap.add_argument("--kinds", nargs="+", choices=list(KINDS), default=None,
                    help="page kinds (default: all)")
    ap.add_argument("--formats", nargs="+", choices=list(FORMATS), default=None,
                    help="file formats (default: all)")
    ap.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                    help=f"methods (default resize cascade {DEFAULT_METHOD})")
    ap.add_argument("--threads", type=int_at_least(1), default=1,
                    help="threads for torch, OpenCV and the OCR (default 1: one core)")
    ap.add_argument("--data", default=None,
                    help="the datasets' root (default $FOVEA_DATA, else data/external)")
    add_output_args(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    from PIL import Image

    from fovea_core.foveation import DEFAULT_METHOD, method_names
    from fovea_core.vlm.positions import merged_cell_px, merged_grid_shape
    from fovea_book.qwen_models import qwen_config

    from fovea_book.bench.ttft import StageClock, probes, processor_for

    ap = _parser()
    args = ap.parse_args(argv)
    methods = list(dict.fromkeys(args.methods or ("resize", "cascade", DEFAULT_METHOD)))
    if bad := [m for m in methods if m not in method_names()]:
        ap.error(f"argument --methods: {bad} unknown; choose from {method_names()}")
    q = QUICK if args.quick else {}
    args.kinds = list(dict.fromkeys(args.kinds or q.get("kinds") or KINDS))
    args.sizes = list(dict.fromkeys(args.sizes or q.get("sizes") or SIZES_MP))
    args.formats = list(dict.fromkeys(args.formats or q.get("formats") or FORMATS))
    args.rounds = args.rounds or q.get("rounds") or ROUNDS
    args.methods = methods
    run = Run("pages", args)
    plans = plan_pages(args.kinds, args.sizes, args.formats, args.data)
    plans.sort(key=lambda p: (p.size_hw[0] * p.size_hw[1], p.kind, p.format))
    cfg = qwen_config("qwen2-vl-tiny")
    fp = processor_for(cfg, BUDGET)
    clock = StageClock()
    first_call: dict = {}
    pages = []
    with tempfile.TemporaryDirectory(prefix="fovea-bench-pages-") as tmp, \
            _threads(args.threads) as threads, _env(FOVEA_NO_DISK_CACHE="1"), \
            probes(clock, OCR_PROBES):
        print(f"pages: {len(plans)} pages x {len(methods)} methods, {args.rounds} round(s), "
              f"{threads['torch']} thread(s); methods {methods}", flush=True)
        for plan in plans:
            t0 = time.perf_counter()
            folder = Path(tmp) / plan.name
            folder.mkdir()
            files = write_variants(plan, folder, (1 + args.rounds) * len(methods))
            pixels, stock_n = stock_pixels(plan.size_hw, BUDGET)
            hm, wm = merged_grid_shape(plan.size_hw, min_pixels=pixels, max_pixels=pixels)
            cell = merged_cell_px()
            pb = PageBench(plan, methods, files, fp, stock_processor_at(fp, pixels),
                           (wm * cell, hm * cell), clock)
            made_s = time.perf_counter() - t0
            print(f"pages: {plan.name}: {plan.source} {plan.size_hw[0]}x{plan.size_hw[1]} from "
                  f"{plan.dataset}/{plan.file.name} (files written in {made_s:.1f} s)",
                  flush=True)
            res = time_page(pb, args.rounds, first_call)
            out = pb.stock()
            thw = out["image_grid_thw"][0].tolist()
            with Image.open(files[0]) as im:
                mode = im.mode
                if plan.format == "jpeg":
                    im.draft(im.mode, pb.draft_wh)
                drafted = list(im.size[::-1])
            rec = {**plan.info(), "mode": mode,
                   "file_bytes": statistics.median(f.stat().st_size for f in files),
                   "source_bytes": plan.file.stat().st_size,
                   "save_options": {k: (v if k != "qtables" else "the source JPEG's")
                                    for k, v in save_options(plan).items()},
                   "stock_pixels": pixels, "stock_tokens": thw[1] * thw[2] // 4,
                   "stock_grid_hw": [thw[1] // 2, thw[2] // 2],
                   "draft_hw": drafted if plan.format == "jpeg" else None, **res}
            if rec["stock_tokens"] != stock_n:
                raise BenchError(f"pages: the stock processor gave {rec['stock_tokens']} "
                                 f"merged tokens on {plan.name}, smart_resize predicted {stock_n}")
            pages.append(rec)
            shutil.rmtree(folder)
            line = "  ".join(f"{k} {v['median_ms'] / 1e3:.2f}s" for k, v in res["timings"].items())
            print(f"pages: {plan.name}: {line}", flush=True)
            print("pages:   ratios to stock (median of rounds): " + "  ".join(
                f"{k} {v['median_of_round_ratios']:.2f}" for k, v in res["ratios"].items()),
                flush=True)
    record = {
        "description": "time from a page file to N tokens (foveate, tokens and patches "
                       "only) and to the model's inputs (FoveatedProcessor), beside the stock "
                       "Qwen2VLImageProcessorPil at N merged tokens, over page sizes; one "
                       "core; every call reads a new page with the models loaded",
        "budget": BUDGET, "question": QUESTION, "methods": methods,
        "default_method": DEFAULT_METHOD, "rounds": args.rounds, "threads": threads,
        "transformers": __import__("transformers").__version__,
        "pillow": __import__("PIL").__version__,
        "processor": {"config": "qwen2-vl-tiny", "class": "FoveatedProcessor",
                      "min_pixels": fp.processor.image_processor.size.shortest_edge,
                      "max_pixels": fp.processor.image_processor.size.longest_edge,
                      "merged_px": fp.cell_px},
        "stock": {"class": "Qwen2VLImageProcessorPil", "merged_px": fp.cell_px,
                  "rule": "min_pixels = max_pixels = stock_pixels (per page): the count of "
                          "merged tokens nearest N that smart_resize allows (stock_tokens)"},
        "protocol": {
            "paths": {"tokens/<m>": "foveate(path, question, budget=N, method=m); f.tokens, "
                                    "f.patches (patch 16; f.view never touched)",
                      "inputs/<m>": "FoveatedProcessor(path, question, budget=N, method=m)",
                      "stock": "PIL open + Qwen2VLImageProcessorPil(image) -> pixel_values",
                      "decode": "PIL open + load (full size)",
                      "draft": "PIL open + draft(mode, stock output size) + load (JPEG only)"},
            "new_page": "each round's calls read their own file of the page with a bar code "
                        "unique to the call in its top-left corner; OCR disk cache off, its "
                        "read and embedding memory emptied before each method's call; models "
                        "stay loaded (warm)",
            "rounds": "per page one untimed warm-up call per path (warmup_ms), then interleaved "
                      "rounds; ratios per round to the stock processor of the same round",
            "first_call": "the first call of each path in the process (models loading)"},
        "first_call": first_call,
        "ocr_probe": {"function": ".".join(OCR_PROBES[0][:2]),
                      "calls_seen": any(p["ocr_ms"] for p in pages)},
        "pages": pages,
    }
    if DEFAULT_METHOD in methods and not record["ocr_probe"]["calls_seen"]:
        print(f"pages: note: the probe {record['ocr_probe']['function']} saw no OCR call; the "
              f"default's OCR time is not reported (update pages.OCR_PROBES if the OCR moved)",
              flush=True)
    record["targets"] = targets(record)
    record["growth"] = growth(record)
    for kind, t in record["targets"].items():
        print(f"pages: targets on {t['page']}: " + "  ".join(
            f"{k} {v['measured']:.2f} (<= {v['target']}: {'met' if v['met'] else 'not met'})"
            for k, v in t.items() if isinstance(v, dict) and v["measured"] is not None),
            flush=True)
    run.write(record, SOURCES)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
