"""End-to-end time to first token (TTFT) on one CPU: a foveated page against the page resized.

``python -m fovea_book.bench ttft [--quick] [--rounds R] [--tokens n ...] [--threads T]
[--record]`` times, on this machine's CPU, everything between a page (``[H, W, 3]`` uint8)
and the logits of the first generated token of a random-weight Qwen2-VL model
(:func:`fovea_book.qwen_models.build_qwen`; default ``qwen2-vl-2b`` in float32, the 2B-class
config: 2.2 B parameters, a 32-layer vision tower of width 1280 and a 28-layer language
model of width 1536). Two kinds of path, each as the repository runs it end to end:

**Foveated** (``--methods``, default ``cascade``, the one-fixation learned cascade the
targets of chapter 14.5 were set for, and ``cascade_text``, which adds a text detector as
side compute; ``foveate``'s default ``cascade_glance`` reads with an OCR that stands for the
model's own reading, so its time here would be the OCR's, not a VLM's) at ``N = --budget``
(default 273) image tokens, through :class:`fovea_core.vlm.processor.FoveatedProcessor`,
the drop-in processor::

    page --resized_page (the stock processor's smart_resize)--> [1, 3, Hr, Wr]
         --foveate(method, budget=N, patch=28)--> TokenSet [1, N] + patches [1, N, 3, 28, 28]
         --encode--> input_ids [1, S], position_ids [3, 1, S] (M-RoPE),
                     pixel_values [4N, 1176], image_grid_thw [N, 3] (= [1, 2, 2] each)
         --vision tower--> [N, 1536] --embed text, scatter image rows, LM prefill-->
         logits of the last position [1, 1, V]

**The vision tower sees only the N tokens**: the processor hands every token to it as a
one-token image (a 2 x 2 block of 14-px patches), so it runs on ``4N`` patches with its
attention inside each token, not on the page's full grid. (Chapter 15's other path,
:func:`fovea_book.qwen_pooled.foveated_inputs`, runs the tower on the page's full grid and pools
each token's footprint; :mod:`fovea_book.bench.vlm_latency` leaves the tower out for that
reason. It is not timed here: its tower costs what the full page costs.)

**Resize** at each of ``--tokens`` (default 273, 576, 820, 1024, 1536, 2048): the same
``foveate`` call with ``method="resize"`` (the whole page on the largest ``rows x cols``
grid of at most n cells; the ``n - rows * cols`` leftovers re-read the centre one octave
finer, so the model gets exactly n tokens), the same processor, the same model. Its vision
tower runs as a stock Qwen2-VL runs a resized page (``--resize-tower grid``, default): the
``rows x cols`` grid as *one* image (``image_grid_thw = [1, 2 rows, 2 cols]``, attention over
all ``4 rows cols`` patches), the few leftovers as one-token images; the vision rows are
then put in the prompt's raster order. ``--resize-tower tokens`` feeds the resize's tokens
as the processor feeds the cascade's (one-token images: cheaper, no cross-token attention,
not what a stock model does). Each path's processor reads the page at the stock defaults
(``min_pixels = 56^2``, ``max_pixels = 28^2 * 1280``) raised to at least ``n * 28^2`` pixels,
so a page with fewer merged cells than n is upsampled to hold n (as a stock processor
configured with ``min_pixels = n * 28^2`` does); the first SROIE receipt has 612 cells at
its own resolution.

**Stages** (wall ms per call; the parts sum to the call): ``page`` (the processor's resize),
``pyramid``, ``gist``, ``localiser``, ``side`` (cascade_text's text detector),
``fovea`` (the cascade's placement: what the cascade spends outside gist, localiser and
side: level choice, core, surround, checks), ``allocate`` (resize: the grid), ``sample``
(each token's pixels read from the pyramid; the reconstruction ``foveate`` offers is made
only when read, which the model never does), ``foveate_other`` (the rest of ``foveate``: checks,
the scorer ``"none"``, the cost record), ``encode`` (the processor's prompt, M-RoPE ids and
``pixel_values``; for the grid tower also the grid layout, whose per-token copy the
processor made first is a few ms of waste at most), ``vision`` (the tower,
``get_image_features``) and ``prefill`` (text embeddings, image rows scattered in, the
language model with a KV cache, the LM head on the last position: ``generate``'s first
step). "Gather" in the book's sense is ``sample`` + ``encode`` (on a GPU,
:mod:`fovea_book.bench.vlm_latency`'s ``--pipeline`` fuses them into
:func:`fovea_book.kernels.gather_tokens`; the CPU processor path runs them as here).
Nested calls are timed exclusively (:class:`StageClock`) by probes that wrap the functions
``foveate`` and the cascade call (:data:`PROBES`); a probe that sees no call raises, naming it.

**Each call reads a new page.** The cascade keeps per-page results (the gist's encoding,
the text-size map, the detector's layout) keyed by a hash of the pyramid's coarsest level,
so the same page again would time cache look-ups. Before every call an 8 x 8 px corner block
of the page is set to a value unique to the call (:func:`mark_page`): every page key
differs and every per-page cache misses, as for a page seen the first time. What a process
makes once and keeps (the localiser's weights, the detector's ONNX session, its FLOP count
per input shape, shape tables) is made by a light warm-up before timing: every path's front
end once, and the model on a few tokens (``--warmup`` adds whole untimed rounds).

**Timing rule**: interleaved rounds (:func:`~fovea_book.bench.common.time_rounds`: each
round runs every path once, in turn), medians per path and stage, per-round ratios
``t(resize at n) / t(foveated at N)`` with a percentile bootstrap 95 % CI of their median
(:func:`~fovea_book.bench.common.ratio`), all from the same run. The record holds the
hardware, library versions and commit (:class:`~fovea_book.bench.common.Run`), the model
config, the page (dataset and doc id, or ``"synthetic"``), each path's exact image-token
count (counted in ``input_ids``), sequence length, vision patches and images, the FLOPs of
its prefill (:func:`~fovea_book.qwen_models.lm_prefill_flops`, LM head on one position) and of
its vision tower (:func:`vision_flops`), and the raw per-round times of every path and stage.

**For the book**: :func:`resize_ttft_at` interpolates the resize path's TTFT (or one
stage's) at any token count between the measured ones (log-log, or linear);
:func:`ttft_speedup` gives the end-to-end speedup ``TTFT(resize at n_equal) / TTFT(foveated
at N)`` with the per-stage breakdown, e.g. at the token count where resize reads as well as
the cascade.

**Run time.** The 2B model's calls are TFLOPs each (:func:`vision_flops` + prefill): a
foveated call ~2.2 TFLOP, resize ~2.4 / 5.3 / 8.2 / 10.8 / 18.1 / 27.2 TFLOP at 273 / 576 /
820 / 1024 / 1536 / 2048 tokens (its grid attention grows as n^2). This 2-core CPU does
~40-110 GFLOP/s in float32 depending on its neighbours, so one round of the default paths
(~90 TFLOP) takes 15-35 min; a run of ~10 min is e.g. ``--rounds 1 --tokens 273 1024 1280``
(~32 TFLOP). For ``--record`` on a 2-core machine use ``--threads 1``: two busy threads
alone put the 1-minute load average at the core count, which the record rule refuses.
``--quick`` (the tiny model, 2 rounds, resize at 64 and 128 tokens) takes seconds, for the
tests.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from fovea_book.bench.common import (
    BenchError,
    Run,
    add_output_args,
    int_at_least,
    ratio,
    record_name,
    time_rounds,
)

#: the foveated paths' image-token budget N
BUDGET = 273
#: resize token counts of a full run
TOKENS = (273, 576, 820, 1024, 1536, 2048)
QUICK_TOKENS = (64, 128)
#: the foveated methods timed (the first is the record's ``default_method``)
METHODS = ("cascade", "cascade_text")
MODEL = "qwen2-vl-2b"
QUICK_MODEL = "qwen2-vl-tiny"
#: models whose vision tower :func:`vision_flops` counts exactly (Qwen2-VL's ViT)
MODELS = ("qwen2-vl-tiny", "qwen2-vl-mid", "qwen2-vl-2b")
ROUNDS = 3
QUICK_ROUNDS = 2
#: side of the corner block :func:`mark_page` sets per call (px)
MARK_PX = 8

#: stage -> what it times (module docstring); the order of the record and of the printout
STAGES = {
    "page": "FoveatedProcessor.resized_page: the stock processor's resize of the page",
    "pyramid": "build_pyramid of the resized page",
    "gist": "the cascade's gist (stage a)",
    "localiser": "the cascade's learned localiser on the gist and the question (stage b)",
    "side": "cascade_text's side compute: the DB text detector on a 512-px render",
    "fovea": "the cascade's fovea placement (stage c) and its other work outside a, b, side",
    "allocate": "the resize allocator's grid",
    "sample": "each token's patch read from the pyramid (area resample)",
    "foveate_other": "the rest of foveate: checks, the 'none' scorer, the cost record",
    "encode": "FoveatedProcessor.encode: prompt ids, M-RoPE ids, pixel_values "
              "(+ the grid layout for the grid tower)",
    "vision": "the vision tower (get_image_features) on pixel_values",
    "prefill": "text embeddings + image rows, LM prefill with KV cache, LM head on the last "
               "position",
}
#: groups of stages for a breakdown: the front end (page to pixel_values), tower, prefill
STAGE_GROUPS = {"front_end": ("page", "pyramid", "gist", "localiser", "side", "fovea",
                              "allocate", "sample", "foveate_other", "encode"),
                "vision": ("vision",), "prefill": ("prefill",)}
#: (module, attribute, stage): the functions wrapped to time the stages inside ``foveate``.
#: ``get_localiser`` is wrapped so that the localiser it returns is timed.
PROBES = (("fovea_core.foveation", "build_pyramid", "pyramid"),
          ("fovea_core.methods", "allocate", "allocate"),
          ("fovea_core.methods", "allocate_parts", "allocate"),
          ("fovea_core.cascade.allocator", "gist", "gist"),
          ("fovea_core.cascade.allocator", "get_localiser", "localiser"),
          ("fovea_core.cascade.allocator", "detect_text", "side"),
          ("fovea_core.sample", "sample", "sample"))
#: what the record's timings cover (besides :data:`~fovea_book.bench.common.COMMON_SOURCES`)
SOURCES = ("book/fovea_book/bench/ttft.py", "book/fovea_book/qwen_models.py",
           "book/fovea_book/qwen_pooled.py", "fovea_core/vlm",
           "fovea_core/cascade", "fovea_core/foveation.py", "fovea_core/sample.py",
           "fovea_core/allocators", "fovea_core/methods.py", "fovea_core/importance/fixation.py",
           "fovea_core/weights/gist_localiser.pt")


# ----------------------------------------------------------------------------- FLOPs
def vision_flops(vision_config, image_grid_thw: torch.Tensor | np.ndarray) -> dict:
    """Matmul FLOPs of one Qwen2-VL vision-tower call (1 multiply-add = 2 FLOPs).

    ``image_grid_thw`` is ``[G, 3]`` (frames, patch rows, patch columns per image), as the
    processor gives it. With ``P_i = t h w`` patches of image ``i``, ``P = sum P_i``, width
    ``d``, MLP ratio ``r``, ``L`` layers, patch input ``c = C * T * p * p``, merge ``m`` and
    output width ``D``::

        embed     = 2 P c d                                  # the patch Conv3d
        linear    = L * 2 P (4 d^2 + 2 r d^2)                # qkv, proj, MLP
        attention = L * 4 d * sum_i P_i^2                    # Q K^T and A V, within each image
        merger    = 2 (P / m^2) (m^2 d)(m^2 d + D)           # the 2 x 2 merge MLP

    Norms, rotary embeddings, softmax and activations are not counted. Returns ``{"embed",
    "linear", "attention", "merger", "total", "patches", "images"}``.
    """
    c = vision_config
    thw = torch.as_tensor(image_grid_thw, dtype=torch.float64).reshape(-1, 3)
    if thw.shape[0] < 1 or bool((thw < 1).any()):
        raise ValueError(f"image_grid_thw must be [G >= 1, 3] of positive ints, got "
                         f"{tuple(thw.shape)}")
    d, L, r = float(c.embed_dim), float(c.depth), float(c.mlp_ratio)
    p = c.patch_size
    cin = c.in_channels * c.temporal_patch_size * p * p
    m2 = float(c.spatial_merge_size ** 2)
    per = thw.prod(1)                                                    # [G] patches
    n = float(per.sum())
    out = {"embed": 2 * n * cin * d,
           "linear": L * 2 * n * (4 * d * d + 2 * r * d * d),
           "attention": L * 4 * d * float((per * per).sum()),
           "merger": 2 * (n / m2) * (m2 * d) * (m2 * d + float(c.hidden_size))}
    out["total"] = sum(out.values())
    return {**out, "patches": int(n), "images": int(thw.shape[0])}


# ----------------------------------------------------------------------------- stage clock
class StageClock:
    """Exclusive ("self") wall time per stage of nested, timed calls.

    ``with clock.stage(name):`` adds the time spent inside, minus that of stages opened
    within it, to ``times[name]`` (ms) and counts the call in ``calls[name]``; so the times of
    one call's stages sum to the time of its outermost stages. ``clock`` (seconds) is the
    wall clock (a test passes a fake one).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.times: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._children: list[float] = []

    def reset(self) -> None:
        """Forget the times and counts (the stack must be empty)."""
        if self._children:
            raise RuntimeError("StageClock.reset inside an open stage")
        self.times, self.calls = {}, {}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = self.clock()
        self._children.append(0.0)
        try:
            yield
        finally:
            dt = self.clock() - t0
            inner = self._children.pop()
            self.times[name] = self.times.get(name, 0.0) + (dt - inner) * 1e3
            self.calls[name] = self.calls.get(name, 0) + 1
            if self._children:
                self._children[-1] += dt

    def wrap(self, fn: Callable, name: str, *, returns_callable: bool = False) -> Callable:
        """``fn`` timed as stage ``name`` (``returns_callable``: time the callable it returns,
        e.g. ``get_localiser``, instead of ``fn`` itself)."""
        if returns_callable:
            def getter(*args, **kwargs):
                inner = fn(*args, **kwargs)
                return self.wrap(inner, name)
            return getter

        def timed(*args, **kwargs):
            with self.stage(name):
                return fn(*args, **kwargs)
        timed.__wrapped__ = fn
        return timed


@contextlib.contextmanager
def probes(clock: StageClock, table: tuple[tuple[str, str, str], ...] = PROBES
           ) -> Iterator[None]:
    """Wrap the functions of ``table`` (``(module, attribute, stage)``) with ``clock`` for the
    duration of the block and restore them after. Raises :class:`BenchError` naming a probe
    whose module or attribute no longer exists (the benchmark needs updating)."""
    saved = []
    try:
        for mod_name, attr, stage in table:
            try:
                mod = importlib.import_module(mod_name)
                fn = getattr(mod, attr)
            except (ImportError, AttributeError) as err:
                raise BenchError(f"stage probe {mod_name}.{attr} ({stage}) is gone "
                                 f"({type(err).__name__}: {err}); update the benchmark's "
                                 "probe table (e.g. ttft.PROBES)") from None
            saved.append((mod, attr, fn))
            setattr(mod, attr, clock.wrap(fn, stage, returns_callable=attr == "get_localiser"))
        yield
    finally:
        for mod, attr, fn in reversed(saved):
            setattr(mod, attr, fn)


# ----------------------------------------------------------------------------- the page
def load_page(root=None, *, log: Callable[[str], object] = print) -> tuple[np.ndarray, dict]:
    """The benchmark's page: the first receipt of ``sroie-dev`` under the data root
    (:func:`fovea_book.paths.dataset_path`; ``root`` default :func:`fovea_book.data_dir`),
    else the book's synthetic receipt ``make_document(0, layout="receipt")`` with a printed
    note (missing or unreadable data never raises).

    Returns ``(image [H, W, 3] uint8, info)``, ``info = {"dataset", "doc_id", "shape_hw",
    "question", "note"}``: ``question`` is the page's first question (what the cascade's
    localiser reads and the prompt asks).
    """
    note = None
    try:
        from fovea_book.eval.sroie import load_sroie
        from fovea_book.paths import dataset_path

        docs = load_sroie(dataset_path("sroie-dev", root), limit=1, log=lambda _m: None)
        if not docs:
            raise ValueError("its first receipt has no usable question")
        doc, dataset = docs[0], "sroie-dev"
    except (OSError, ValueError) as err:             # DatasetNotFound is a FileNotFoundError
        from fovea_book.eval.layouts import make_document

        note = (f"sroie-dev not available ({type(err).__name__}: {str(err).splitlines()[0]}); "
                "using the book's synthetic receipt make_document(0, layout='receipt')")
        log(f"ttft: {note}")
        doc, dataset = make_document(0, layout="receipt"), "synthetic"
    image = np.ascontiguousarray(doc.image, dtype=np.uint8)
    if image.ndim != 3 or image.shape[2] != 3:
        raise BenchError(f"ttft: page {doc.doc_id} is not [H, W, 3] uint8: {image.shape}")
    return image.copy(), {"dataset": dataset, "doc_id": doc.doc_id,
                          "shape_hw": list(image.shape[:2]),
                          "question": doc.questions[0].question, "note": note}


def mark_page(page: np.ndarray, k: int) -> np.ndarray:
    """Make ``page`` (``[H, W, 3]`` uint8, changed in place and returned) a new page: its
    top-left ``MARK_PX x MARK_PX`` block is set to the grey levels ``(k % 256, k // 256 % 256,
    255 - k % 256)``, one value per call index ``k`` (unique for ``k < 65536``), so that the
    pyramid's coarsest level, and with it every per-page cache key, differs from call to call."""
    if page.ndim != 3 or page.shape[2] != 3 or page.dtype != np.uint8:
        raise ValueError(f"page must be [H, W, 3] uint8, got {page.shape} {page.dtype}")
    if min(page.shape[:2]) < MARK_PX:
        raise ValueError(f"page must be at least {MARK_PX} px on each side, got {page.shape[:2]}")
    page[:MARK_PX, :MARK_PX] = np.array([k % 256, (k // 256) % 256, 255 - k % 256], np.uint8)
    return page


# ----------------------------------------------------------------------------- the model side
def processor_for(model, n_tokens: int):
    """A :class:`~fovea_core.vlm.processor.FoveatedProcessor` for ``model`` (its stock processor
    with the offline tokenizer) whose image processor reads a page at no fewer than
    ``n_tokens`` merged cells: ``min_pixels`` (and ``max_pixels``) raised to at least
    ``n_tokens * cell^2`` where the stock defaults give fewer."""
    from fovea_core.vlm.processor import FoveatedProcessor

    fp = FoveatedProcessor.from_model(model)
    ip = fp.processor.image_processor
    need = int(n_tokens) * fp.cell_px ** 2
    ip.size = type(ip.size)(shortest_edge=max(int(ip.size.shortest_edge), need),
                            longest_edge=max(int(ip.size.longest_edge), need))
    return fp


def grid_layout(foveation, family: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``resize`` foveation's pixels as a stock processor lays out the resized page.

    The first ``rows * cols`` tokens (:func:`~fovea_core.allocators.grid.resize_grid`,
    row-major, one level) are assembled into one ``[1, 3, rows * f, cols * f]`` image (``f``
    = merged cell px) and patchified as one image; the ``n - rows * cols`` leftovers follow
    as one-token images. Returns ``pixel_values [4n, 3 * 2 * p * p]`` and ``image_grid_thw
    [G, 3]``; the tower's output rows are then in the tokens' own order (row ``k`` is token
    ``k``). Raises ``ValueError`` for a foveation that is not such a grid.
    """
    from fovea_core.allocators.grid import resize_grid
    from fovea_core.vlm.positions import QWEN_MERGE
    from fovea_core.vlm.qwen import pixel_values

    t = foveation.tokens
    n, f = t.budget, t.patch
    r, c, _ = resize_grid(t.image_size, n, f)
    rc = r * c
    lv = t.levels[0]
    if t.batch_size != 1 or rc > n or not bool((lv[:rc] == lv[0]).all()):
        raise ValueError(f"foveation: not one resize grid of {r}x{c} tokens at one level "
                         f"({n} tokens, method {getattr(foveation, 'method', '?')!r})")
    patches = foveation.patches[0]                                       # [n, C, f, f]
    if patches.shape[1] == 1:
        patches = patches.expand(-1, 3, -1, -1)
    grid = patches[:rc].reshape(r, c, 3, f, f).permute(2, 0, 3, 1, 4).reshape(1, 3, r * f, c * f)
    pv, thw = pixel_values(grid, family, grid_hw=(r, c))
    extra = n - rc
    if extra:
        strip = patches[rc:].permute(1, 2, 0, 3).reshape(1, 3, f, extra * f)
        pv2, _ = pixel_values(strip, family, grid_hw=(1, extra))
        pv = torch.cat([pv, pv2])
        thw = torch.cat([thw, torch.tensor([[1, QWEN_MERGE, QWEN_MERGE]]).expand(extra, 3)])
    return pv, thw


@torch.no_grad()
def vision_rows(model, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
    """The vision tower's merged tokens ``[sum_i h_i w_i / 4, D]`` (images in order)."""
    out = model.model.get_image_features(pixel_values, image_grid_thw, return_dict=True)
    return torch.cat(list(out.pooler_output))


@torch.no_grad()
def first_token_logits(model, input_ids: torch.Tensor, position_ids: torch.Tensor,
                       image_rows: torch.Tensor) -> torch.Tensor:
    """``generate``'s first step: the logits ``[1, 1, V]`` of the last prompt position.

    The prompt's ``input_ids [1, S]`` are embedded, the image placeholders replaced by
    ``image_rows [N, D]`` in order, and the language model run with ``position_ids [3, 1, S]``
    and a KV cache (:func:`fovea_book.qwen_pooled.lm_logits`, LM head on one position).
    """
    from fovea_book.qwen_pooled import LMInputs, lm_logits

    mask = input_ids == model.config.image_token_id
    if int(mask.sum()) != image_rows.shape[0]:
        raise ValueError(f"the prompt has {int(mask.sum())} image placeholders but the tower "
                         f"gave {image_rows.shape[0]} rows")
    emb = model.get_input_embeddings()(input_ids)
    x = emb.masked_scatter(mask[..., None], image_rows.to(emb.dtype))
    return lm_logits(model, LMInputs(x, position_ids, mask), logits_to_keep=1, use_cache=True)


# ----------------------------------------------------------------------------- the paths
@dataclass
class TimedPath:
    """One timed path: a method at a token count through its processor and the model."""

    name: str                   # "cascade", "cascade_text", "resize@576"
    kind: str                   # "foveated" | "resize"
    method: str
    n: int
    layout: str                 # vision tower input: "tokens" (one-token images) | "grid"
    fp: object                  # its FoveatedProcessor
    log: list[dict] = field(default_factory=list)      # per call: {stage: ms}, "total"
    info: dict = field(default_factory=dict)           # shapes of the last call


@dataclass
class Bench:
    """What every path shares: the model, the page (marked per call), the prompt."""

    model: torch.nn.Module
    family: str
    page: np.ndarray
    text: str
    clock: StageClock = field(default_factory=StageClock)
    calls: int = 0
    verbose: bool = True

    def front_end(self, path: TimedPath) -> tuple[dict, object]:
        """page -> foveate -> processor inputs (stages into ``self.clock``); returns
        ``(inputs, foveation)`` where ``inputs`` has ``input_ids``, ``position_ids``,
        ``pixel_values``, ``image_grid_thw`` and ``order`` (LM slot -> tower row, or None)."""
        from fovea_core.foveation import FoveateWarning, foveate
        from fovea_core.vlm.positions import mrope_positions

        self.calls += 1
        page = mark_page(self.page, self.calls)
        fp, ck = path.fp, self.clock
        with ck.stage("page"):
            img = fp.resized_page(page)
        with ck.stage("foveate_other"), warnings.catch_warnings():
            warnings.simplefilter("ignore", FoveateWarning)   # resize ignores the question
            fov = foveate(img, self.text, budget=path.n, method=path.method, patch=fp.cell_px)
        with ck.stage("encode"):
            enc = fp.encode(fov, self.text)
            inputs = {k: enc[k] for k in ("input_ids", "position_ids", "pixel_values",
                                          "image_grid_thw")}
            inputs["order"] = None
            if path.layout == "grid":
                inputs["pixel_values"], inputs["image_grid_thw"] = grid_layout(fov, self.family)
                hr, wr = fov.tokens.image_size
                inputs["order"] = mrope_positions(fov.tokens, (hr // fp.cell_px,
                                                               wr // fp.cell_px)).order[0]
        return inputs, fov

    def run(self, path: TimedPath, *, model: bool = True) -> None:
        """One call of ``path`` (front end, and with ``model`` the tower and the prefill),
        its stages appended to ``path.log``."""
        ck = self.clock
        ck.reset()
        t0 = time.perf_counter()
        inputs, fov = self.front_end(path)
        if model:
            with ck.stage("vision"):
                rows = vision_rows(self.model, inputs["pixel_values"], inputs["image_grid_thw"])
                if inputs["order"] is not None:
                    rows = rows[inputs["order"]]
            with ck.stage("prefill"):
                logits = first_token_logits(self.model, inputs["input_ids"],
                                            inputs["position_ids"], rows)
        total = (time.perf_counter() - t0) * 1e3
        stages = {_stage_name(path, k): v for k, v in ck.times.items()}
        path.log.append({**stages, "total": total})
        ids = inputs["input_ids"]
        path.info = {"image_tokens": int((ids == self.model.config.image_token_id).sum()),
                     "seq_len": int(ids.shape[1]),
                     "page_hw": list(fov.tokens.image_size),
                     "merged_grid": [fov.tokens.image_size[0] // path.fp.cell_px,
                                     fov.tokens.image_size[1] // path.fp.cell_px],
                     "pixel_values_shape": list(inputs["pixel_values"].shape),
                     "image_grid_thw": inputs["image_grid_thw"],
                     "cost_label": fov.cost.label, "side_flops": fov.cost.side_flops,
                     "calls": {_stage_name(path, k): v for k, v in ck.calls.items()}}
        if model:
            path.info["logits_shape"] = list(logits.shape)
            path.info["logits_finite"] = bool(torch.isfinite(logits).all())
        if self.verbose:
            what = "  ".join(f"{k} {v / 1e3:.2f}" for k, v in stages.items()
                             if k in ("vision", "prefill"))
            print(f"  {path.name:14s} {total / 1e3:8.2f} s  ({what or 'front end only'})",
                  flush=True)


def _stage_name(path: TimedPath, probe: str) -> str:
    """The cascade's allocation self time is its fovea placement."""
    return "fovea" if probe == "allocate" and path.kind == "foveated" else probe


def expected_stages(path: TimedPath) -> tuple[str, ...]:
    """The stages a path must show (a probe that saw no call means the code it wraps moved)."""
    common = ("page", "pyramid", "sample", "foveate_other", "encode", "vision", "prefill")
    if path.kind == "resize":
        return common + ("allocate",)
    side = ("side",) if path.method == "cascade_text" else ()
    return common + ("gist", "localiser", "fovea") + side


def _warm_model(model, family: str) -> None:
    """First calls of the tower and the language model on a few tokens (lazy inits)."""
    from fovea_core.vlm.positions import QWEN_MERGE, QWEN_PATCH

    p, m = QWEN_PATCH[family], QWEN_MERGE
    pv = torch.zeros(4 * m * m, 3 * 2 * p * p)
    rows = vision_rows(model, pv, torch.tensor([[1, m, m]] * 4))
    ids = torch.full((1, 8), model.config.image_token_id)
    first_token_logits(model, ids, torch.arange(8).expand(3, 1, 8), torch.cat([rows, rows]))


# ----------------------------------------------------------------------------- summaries
def _timing(values: list[float]) -> dict:
    return {"median_ms": statistics.median(values), "min_ms": min(values),
            "max_ms": max(values), "rounds_ms": [round(v, 4) for v in values]}


def path_record(path: TimedPath, timing: dict, model_cfg, skip: int) -> dict:
    """One path's section of the record: token counts, shapes, FLOPs, the outer timing of
    :func:`time_rounds` and each stage's per-round times (the calls after ``skip`` warm-up
    ones)."""
    from fovea_book.qwen_models import lm_prefill_flops

    log = path.log[skip:]
    if len(log) != len(timing["rounds_ms"]):
        raise RuntimeError(f"{path.name}: {len(log)} stage records for "
                           f"{len(timing['rounds_ms'])} timed rounds")
    names = [s for s in STAGES if s in log[0]]
    stages = {s: _timing([r.get(s, 0.0) for r in log]) for s in names}
    info = dict(path.info)
    thw = info.pop("image_grid_thw")
    pre = lm_prefill_flops(model_cfg.text_config, info["seq_len"], logits_to_keep=1)
    vis = vision_flops(model_cfg.vision_config, thw)
    for s, fl in (("vision", vis["total"]), ("prefill", pre["total"])):
        stages[s]["gflops_per_s"] = fl / stages[s]["median_ms"] / 1e6
    return {"method": path.method, "kind": path.kind, "visual_tokens": path.n,
            **info, "vision_layout": path.layout,
            "vision_images": vis["images"], "vision_patches": vis["patches"],
            "flops": {"prefill": pre, "vision": {k: v for k, v in vis.items()
                                                 if k not in ("patches", "images")},
                      "total": pre["total"] + vis["total"]},
            **timing, "stages": stages,
            "stage_sum_rounds_ms": [round(sum(r.get(s, 0.0) for s in names), 4) for r in log]}


def summary_lines(rec: dict) -> list[str]:
    """A table of the record: TTFT and the big stages per path, and the ratios."""
    head = (f"{'path':16s} {'tokens':>6s} {'S':>5s} {'TTFT s':>8s} {'front':>7s} "
            f"{'vision':>7s} {'prefill':>7s}")
    lines = [head]
    rows = [(m, p) for m, p in rec["foveated"].items()] + \
        [(f"resize@{n}", p) for n, p in rec["resize"].items()]
    for name, p in rows:
        st = p["stages"]
        front = sum(st[s]["median_ms"] for s in STAGE_GROUPS["front_end"] if s in st)
        lines.append(f"{name:16s} {p['image_tokens']:6d} {p['seq_len']:5d} "
                     f"{p['median_ms'] / 1e3:8.2f} {front / 1e3:7.2f} "
                     f"{st['vision']['median_ms'] / 1e3:7.2f} "
                     f"{st['prefill']['median_ms'] / 1e3:7.2f}")
    for m, per in rec["ratios"].items():
        for n, r in per.items():
            lo, hi = r["ci95"]
            lines.append(f"t(resize@{n}) / t({m}@{rec['budget']}): median of round ratios "
                         f"{r['median_of_round_ratios']:.2f} [{lo:.2f}, {hi:.2f}], ratio of "
                         f"medians {r['ratio_of_medians']:.2f}")
    return lines


# ----------------------------------------------------------------------------- for the book
def _points(record: Mapping, stage: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Measured ``(n [K], ms [K])`` of the resize path, sorted by n (a stage's median, 0
    where a point lacks the stage; else the whole path's median)."""
    res = record.get("resize") if isinstance(record, Mapping) else None
    if not isinstance(res, Mapping) or not res:
        raise ValueError("record has no 'resize' section of measured token counts (a ttft "
                         "benchmark record is needed)")
    ns, ts = [], []
    for key, p in res.items():
        if not isinstance(p, Mapping):
            raise TypeError(f"record['resize'][{key!r}] is not a path record (a dict)")
        n = p.get("visual_tokens")
        if stage is None:
            t = p.get("median_ms")
        else:
            st = p.get("stages")
            if not isinstance(st, Mapping):
                raise ValueError(f"record['resize'][{key!r}] has no 'stages'")
            t = st.get(stage, {}).get("median_ms", 0.0)
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"record['resize'][{key!r}]['visual_tokens'] must be an int >= 1, "
                             f"got {n!r}")
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) \
                or t < 0 or (stage is None and t <= 0):
            what = f"stage {stage!r}" if stage else "median_ms"
            raise ValueError(f"record['resize'][{key!r}] {what} must be a finite time "
                             f"{'>= 0' if stage else '> 0'} (ms), got {t!r}")
        ns.append(int(n))
        ts.append(float(t))
    order = np.argsort(ns, kind="stable")
    n_arr, t_arr = np.asarray(ns, float)[order], np.asarray(ts, float)[order]
    if np.any(np.diff(n_arr) == 0):
        raise ValueError(f"record['resize'] measures a token count twice: {sorted(ns)}")
    return n_arr, t_arr


def resize_token_range(record: Mapping) -> tuple[int, int]:
    """The smallest and largest token counts the record's resize path was measured at (the
    range :func:`resize_ttft_at` interpolates in). Raises as :func:`resize_ttft_at` does for
    a record without a usable ``resize`` section."""
    ns = _points(record, None)[0]
    return int(ns[0]), int(ns[-1])


def resize_ttft_at(record: Mapping, n_tokens: float, *, stage: str | None = None,
                   interp: str = "loglog") -> float:
    """The resize path's TTFT (ms, median over rounds) at ``n_tokens`` image tokens.

    Interpolated between the two measured token counts around ``n_tokens`` (a measured count
    gives its own median): ``interp="loglog"`` (default) is linear in ``log n`` vs ``log t``,
    exact for a power law ``t = a n^b`` (the prefill and the tower are ``n^1``..``n^2``);
    ``"linear"`` is linear in ``n`` and ``t``. ``stage`` (a :data:`STAGES` name): that
    stage's median instead (0 where resize has no such stage; a stage that is 0 at either
    end is interpolated linearly).

    Raises:
        ValueError: ``n_tokens`` not a finite number inside the measured range (no
            extrapolation; the message gives the range), an unknown ``interp`` or
            ``stage``, or a record without a usable ``resize`` section (missing, a token
            count twice, a time that is not positive and finite).
        TypeError: a ``resize`` entry that is not a dict.
    """
    if interp not in ("loglog", "linear"):
        raise ValueError(f"interp must be 'loglog' or 'linear', got {interp!r}")
    if stage is not None and stage not in STAGES:
        raise ValueError(f"stage must be None or one of {list(STAGES)}, got {stage!r}")
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, (int, float, np.integer,
                                                                np.floating)) \
            or not math.isfinite(float(n_tokens)):
        raise ValueError(f"n_tokens must be a finite number, got {n_tokens!r}")
    n = float(n_tokens)
    ns, ts = _points(record, stage)
    if not ns[0] <= n <= ns[-1]:
        raise ValueError(f"n_tokens {n:g} is outside the measured range [{ns[0]:g}, "
                         f"{ns[-1]:g}] of the resize path (measured at "
                         f"{[int(v) for v in ns]}); no extrapolation")
    if interp == "loglog" and bool((ts > 0).all()):
        return float(np.exp(np.interp(np.log(n), np.log(ns), np.log(ts))))
    return float(np.interp(n, ns, ts))


def ttft_speedup(record: Mapping, n_equal: float, *, method: str | None = None,
                 interp: str = "loglog") -> dict:
    """End-to-end speedup of the foveated path: ``TTFT(resize at n_equal) / TTFT(method at N)``.

    ``n_equal`` is the token count at which resize reads as well as the foveated method
    (measured elsewhere); the resize TTFT there is :func:`resize_ttft_at`. ``method``:
    a foveated path of the record (default its ``default_method``, the cascade).

    Returns ``{"method", "budget" (N), "n_equal", "interp", "bracket" [n0, n1] (the measured
    counts around n_equal), "foveated_ms", "resize_ms", "speedup", "stages": {stage:
    {"foveated_ms", "resize_ms"}}, "groups": {"front_end" | "vision" | "prefill":
    {"foveated_ms", "resize_ms", "speedup"}}, "measured": {n: per-round ratio of the record
    (median, CI) at each bracketing count}}``. Whole-path times are medians of the
    whole calls; stage times are each stage's median (their sum is close to, not equal to,
    the whole median).

    Raises:
        ValueError: an unknown ``method``, a broken record or ``n_equal`` outside the
            measured range (:func:`resize_ttft_at`).
    """
    fov_all = record.get("foveated") if isinstance(record, Mapping) else None
    if not isinstance(fov_all, Mapping) or not fov_all:
        raise ValueError("record has no 'foveated' section (a ttft benchmark record is needed)")
    method = method if method is not None else record.get("default_method", next(iter(fov_all)))
    if method not in fov_all:
        raise ValueError(f"method {method!r} is not in the record; it has {list(fov_all)}")
    fov = fov_all[method]
    f_ms = fov.get("median_ms") if isinstance(fov, Mapping) else None
    if isinstance(f_ms, bool) or not isinstance(f_ms, (int, float)) or not math.isfinite(f_ms) \
            or f_ms <= 0:
        raise ValueError(f"record['foveated'][{method!r}]['median_ms'] must be a finite time "
                         f"> 0 (ms), got {f_ms!r}")
    r_ms = resize_ttft_at(record, n_equal, interp=interp)
    ns, _ = _points(record, None)
    i = int(np.searchsorted(ns, float(n_equal), side="left"))
    bracket = [int(ns[i])] * 2 if ns[i] == float(n_equal) else [int(ns[i - 1]), int(ns[i])]
    fst = fov.get("stages") or {}
    stages = {}
    for s in STAGES:
        fs = float(fst.get(s, {}).get("median_ms", 0.0))
        rs = resize_ttft_at(record, n_equal, stage=s, interp=interp)
        if fs or rs:
            stages[s] = {"foveated_ms": fs, "resize_ms": rs}
    groups = {}
    for g, members in STAGE_GROUPS.items():
        fg = sum(stages[s]["foveated_ms"] for s in members if s in stages)
        rg = sum(stages[s]["resize_ms"] for s in members if s in stages)
        groups[g] = {"foveated_ms": fg, "resize_ms": rg, "speedup": rg / fg if fg else None}
    per = (record.get("ratios") or {}).get(method) or {}
    measured = {n: per[str(n)] for n in dict.fromkeys(bracket) if str(n) in per}
    return {"method": method, "budget": fov.get("visual_tokens"), "n_equal": float(n_equal),
            "interp": interp, "bracket": bracket, "foveated_ms": float(f_ms),
            "resize_ms": r_ms, "speedup": r_ms / float(f_ms), "stages": stages,
            "groups": groups, "measured": measured}


# ----------------------------------------------------------------------------- main
def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m fovea_book.bench ttft",
                                 description="End-to-end time to first token on the CPU: "
                                             "foveated at N against resize at n tokens.")
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK_MODEL}, {QUICK_ROUNDS} rounds, resize at "
                         f"{'/'.join(map(str, QUICK_TOKENS))} tokens (seconds; for the tests)")
    ap.add_argument("--model", choices=MODELS, default=None,
                    help=f"random-weight model (default {MODEL}; --quick: {QUICK_MODEL})")
    ap.add_argument("--rounds", type=int_at_least(1), default=None,
                    help=f"interleaved timed rounds (default {ROUNDS}; --quick {QUICK_ROUNDS})")
    ap.add_argument("--warmup", type=int_at_least(0), default=0,
                    help="whole untimed rounds before timing (default 0: a light warm-up "
                         "always runs every front end once and the model on a few tokens)")
    ap.add_argument("--tokens", type=int_at_least(1), nargs="+", default=None,
                    help=f"resize token counts (default {' '.join(map(str, TOKENS))}; "
                         f"--quick {' '.join(map(str, QUICK_TOKENS))})")
    ap.add_argument("--budget", type=int_at_least(2), default=BUDGET,
                    help=f"the foveated paths' image tokens N (default {BUDGET})")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), metavar="METHOD",
                    help=f"foveated methods (cascade variants; default {' '.join(METHODS)})")
    ap.add_argument("--resize-tower", choices=("grid", "tokens"), default="grid",
                    help="resize's vision-tower input: the grid as one image, as a stock "
                         "processor gives it (default), or one-token images as the "
                         "foveated paths")
    ap.add_argument("--threads", type=int_at_least(1), default=None,
                    help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--name", type=record_name, default="ttft",
                    help="record name (<name>.json; letters, digits, '_', '.', '-')")
    add_output_args(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    from fovea_core.foveation import method_names
    from fovea_core.methods import INFO
    from fovea_book.qwen_models import build_qwen, qwen_config
    from fovea_core.vlm.qwen import family_of

    ap = _parser()
    args = ap.parse_args(argv)
    model_name = args.model or (QUICK_MODEL if args.quick else MODEL)
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
    tokens = sorted(set(args.tokens or (QUICK_TOKENS if args.quick else TOKENS)))
    cascades = [m for m in method_names() if INFO[m]["family"] == "cascade"]
    if bad := [m for m in args.methods if m not in cascades]:
        ap.error(f"argument --methods: {bad} not cascade methods; choose from {cascades}")
    methods = list(dict.fromkeys(args.methods))
    args.model, args.rounds, args.tokens = model_name, rounds, tokens
    run = Run(args.name, args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    page, page_info = load_page()
    text = page_info["question"]
    print(f"ttft: page {page_info['dataset']}/{page_info['doc_id']} "
          f"{page_info['shape_hw'][0]}x{page_info['shape_hw'][1]}, question {text!r}; "
          f"model {model_name} float32 on the CPU ({torch.get_num_threads()} threads)",
          flush=True)
    t0 = time.perf_counter()
    model = build_qwen(model_name)
    build_s = time.perf_counter() - t0
    cfg = qwen_config(model_name)
    family = family_of(model)
    bench = Bench(model, family, page, text)
    paths = [TimedPath(m, "foveated", m, args.budget, "tokens", processor_for(model, args.budget))
             for m in methods]
    paths += [TimedPath(f"resize@{n}", "resize", "resize", n, args.resize_tower,
                   processor_for(model, n)) for n in tokens]

    with torch.no_grad(), probes(bench.clock):
        print(f"ttft: model built in {build_s:.1f} s; light warm-up", flush=True)
        for p in paths:
            try:
                bench.run(p, model=False)
            except ValueError as err:
                raise BenchError(f"ttft: path {p.name} cannot run on this page: {err}") from None
            seen = set(p.log[-1])
            if missing := [s for s in expected_stages(p) if s not in seen
                           and s not in ("vision", "prefill")]:
                raise BenchError(f"ttft: path {p.name}: no call seen by the probe(s) of "
                                 f"{missing} (the code ttft.PROBES wraps has moved)")
            p.log.clear()
        _warm_model(model, family)
        state = {"call": 0}
        per_round = len(paths)

        def fn(p: TimedPath) -> Callable[[], None]:
            def call() -> None:
                k = state["call"]
                if k % per_round == 0:
                    r = k // per_round
                    label = (f"warm-up round {r + 1}/{args.warmup}" if r < args.warmup
                             else f"round {r - args.warmup + 1}/{rounds}")
                    print(f"ttft: {label}", flush=True)
                state["call"] += 1
                bench.run(p)
            return call

        timings = time_rounds({p.name: fn(p) for p in paths}, rounds=rounds,
                              warmup=args.warmup)
    for p in paths:
        if missing := [s for s in expected_stages(p) if s not in p.log[-1]]:
            raise BenchError(f"ttft: path {p.name}: stages {missing} not timed")
        if p.info["image_tokens"] != p.n:
            raise BenchError(f"ttft: path {p.name} gave the model {p.info['image_tokens']} "
                             f"image tokens, not {p.n}")

    recs = {p.name: path_record(p, timings[p.name], cfg, args.warmup) for p in paths}
    ratios = {m: {str(n): ratio(timings, f"resize@{n}", m) for n in tokens} for m in methods}
    tc, vc = cfg.text_config, cfg.vision_config
    rec = {
        "description": "end-to-end time to first token on the CPU: page -> foveate -> "
                       "FoveatedProcessor inputs -> vision tower -> LM prefill -> logits of "
                       "the first token; random-weight Qwen2-VL, float32",
        "model": {"name": model_name, "family": family, "dtype": "float32", "device": "cpu",
                  "params": sum(p.numel() for p in model.parameters()),
                  "attn_implementation": tc._attn_implementation,
                  "text_config": {k: getattr(tc, k) for k in (
                      "hidden_size", "intermediate_size", "num_hidden_layers",
                      "num_attention_heads", "num_key_value_heads", "vocab_size")},
                  "vision_config": {k: getattr(vc, k) for k in (
                      "depth", "embed_dim", "num_heads", "mlp_ratio", "patch_size",
                      "spatial_merge_size", "temporal_patch_size", "hidden_size")},
                  "build_s": build_s},
        "page": page_info, "prompt": text, "default_method": methods[0],
        "budget": args.budget, "tokens": tokens, "rounds": rounds, "warmup": args.warmup,
        "resize_tower": args.resize_tower, "threads": torch.get_num_threads(),
        "transformers": __import__("transformers").__version__,
        "stages": STAGES, "stage_groups": {k: list(v) for k, v in STAGE_GROUPS.items()},
        "page_marking": f"each call's page has its top-left {MARK_PX}x{MARK_PX} px block set "
                        "to a value unique to the call (per-page caches miss)",
        "flops_formula": "prefill: lm_prefill_flops (causal, LM head on 1 position); vision: "
                         "ttft.vision_flops (attention within each image); 2 FLOPs per MAC",
        "foveated": {m: recs[m] for m in methods},
        "resize": {str(n): recs[f"resize@{n}"] for n in tokens},
        "ratios": ratios,
    }
    print("\n".join(summary_lines(rec)), flush=True)
    run.write(rec, sources=SOURCES)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
