"""Side compute for the cascade: a text detector that says *where* text is and how tall, never
*what* it says (the book's evaluation protocol, "side compute").

The PP-OCR DB text detector [Liao et al. 2020, "Real-time scene text detection with
differentiable binarization", AAAI] shipped inside the ``rapidocr`` wheel runs on a
low-resolution render of the page (longer side :data:`RENDER_SIDE` px). Its per-pixel text
probability gives, on the level-0 patch grid:

* ``mask`` -- the cells that hold text (a cell whose mean probability exceeds
  :data:`CELL_THRESHOLD`, grown by one cell: DB's kernels are shrunk text);
* ``log_px`` -- log2 of the text height in base pixels where there is text: the height of
  each connected kernel (probability > :data:`KERNEL_THRESHOLD`) times
  :data:`KERNEL_TO_TEXT`, averaged over the cell's kernel pixels.

Nothing recognises characters: the detector's output is a probability of "text here", and
nothing downstream sees the render. The cost is a :class:`SideCost` beside the N tokens:
the detector's FLOPs at this input size (convolutions from the ONNX graph, counted by
:func:`detector_flops`), the CPU milliseconds of the run, and the pixels of the render
(shown as 16 x 16 token equivalents).

The constants were chosen on training pages only (``sroie-train``, ``funsd-train``), never
on a page the book reports.
"""

from __future__ import annotations

import functools
import json
import math
import tempfile
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from fovea_core.pyramid import Pyramid

__all__ = ["RENDER_SIDE", "KERNEL_THRESHOLD", "CELL_THRESHOLD", "KERNEL_TO_TEXT", "SideCost",
           "TextLayout", "detect_text", "detector_flops", "render_size"]

#: longer side (px) of the render the detector reads. On the held-out fifth of the
#: training forms a 512-px render finds form lines (8-12 px text) that a 384-px one merges;
#: its median run is ~55 ms on one core (the protocol's side-compute limit is 100 ms)
RENDER_SIDE = 512
#: DB probability above which a render pixel is a text kernel (the PP-OCR post-processing's
#: binarisation threshold, ``Det.thresh = 0.3``)
KERNEL_THRESHOLD = 0.3
#: mean probability above which a level-0 cell holds text
CELL_THRESHOLD = 0.1
#: text height / DB kernel height: the median over training pages of (median answer-box
#: height) / (median height of the page's kernels wider than 2 render px, in base px),
#: 1.54 on 28 ``funsd-train`` forms and 1.52 on 33 ``sroie-train`` receipts (pages that
#: train the localiser)
KERNEL_TO_TEXT = 1.53


@dataclass(frozen=True)
class SideCost:
    """What a side computation spent on one page, beside the N tokens.

    Attributes:
        flops: FLOPs of the computation (2 per multiply-add; :func:`detector_flops`).
        cpu_ms: wall milliseconds of the run on the calling process's threads (one in the
            book's workers, so CPU milliseconds of one core there).
        pixels: pixels of the input it read.
        patch: token side in pixels, for :attr:`token_equivalents`.
    """

    flops: float
    cpu_ms: float
    pixels: int
    patch: int = 16

    @property
    def token_equivalents(self) -> float:
        """``pixels / patch**2``: the render's pixels as tokens of ``patch x patch``."""
        return self.pixels / self.patch ** 2


@dataclass(frozen=True)
class TextLayout:
    """The detector's answer for a batch of pages, on the level-0 patch grid.

    Attributes:
        mask: ``[B, Gh, Gw]`` float, 1 where a cell holds text (grown by one cell), else 0.
        log_px: ``[B, Gh, Gw]`` float, log2 text height in base pixels; NaN where no text.
        cost: the :class:`SideCost` of one page (the mean over the batch).
    """

    mask: torch.Tensor
    log_px: torch.Tensor
    cost: SideCost


def render_size(image_size: tuple[int, int], side: int = RENDER_SIDE) -> tuple[int, int]:
    """``(h, w)`` of the detector's input: the page area-shrunk to longer side ``side`` (never
    enlarged), each side rounded to a multiple of 32 (at least 32), as the DB network needs."""
    if isinstance(side, bool) or not isinstance(side, (int, np.integer)) or side < 32:
        raise ValueError(f"side must be an int >= 32 (render's longer side in px), got {side!r}")
    from fovea_core.importance.fixation import shrunk_size    # text_map's own rule

    h, w = (int(v) for v in image_size)
    return shrunk_size(h, w, int(side), 32)


@functools.lru_cache(maxsize=64)
def detector_flops(h: int, w: int) -> float:
    """FLOPs of one DB detector run on an ``h x w`` input (multiples of 32).

    Counted from the ONNX graph as ONNX Runtime executes it (one profiled run): for every
    ``Conv`` (fused or not) ``2 * prod(output) * prod(weight[1:])`` and for every
    ``ConvTranspose`` ``2 * prod(input) * prod(weight[1:])`` (where the profile omits its
    folded weight, ``2 * prod(output) * C_in``: exact for DB's head, kernel = stride 2 and
    one group); element-wise operations,
    pooling and resizing (about 1 % of these) are not counted.
    """
    import onnxruntime as ort

    from fovea_core.importance.fixation import text_model_path

    if h % 32 or w % 32 or h < 32 or w < 32:
        raise ValueError(f"detector input must be multiples of 32 px, got {h}x{w}")
    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(tmp) / "db")
        opts.intra_op_num_threads = 1
        sess = ort.InferenceSession(str(text_model_path()), opts,
                                    providers=["CPUExecutionProvider"])
        sess.run(None, {sess.get_inputs()[0].name: np.zeros((1, 3, h, w), np.float32)})
        events = json.loads(Path(sess.end_profiling()).read_text())
    total = 0.0
    for e in events:
        args = e.get("args", {})
        op = args.get("op_name", "")
        if e.get("cat") != "Node" or "Conv" not in op:
            continue
        ins = [next(iter(t.values())) for t in args["input_type_shape"]]
        out = next(iter(args["output_type_shape"][0].values()))
        if len(ins) >= 2:                       # the weight is listed: [C_out, C_in/g, k, k]
            lead = ins[0] if op == "ConvTranspose" else out
            total += 2.0 * math.prod(lead) * math.prod(ins[1][1:])
        elif op == "ConvTranspose":             # weight folded away: kernel = stride, g = 1
            total += 2.0 * math.prod(out) * ins[0][1]
        else:
            raise RuntimeError(f"detector_flops: {op} lists no weight; cannot count it")
    if total <= 0:
        raise RuntimeError("detector_flops: the profile listed no convolution; has the ONNX "
                           "Runtime profile format changed?")
    return total


def _probability(base: torch.Tensor, side: int) -> tuple[torch.Tensor, float]:
    """DB probability ``[B, h, w]`` of ``base`` ``[B, C, H, W]`` rendered at ``side``, and the
    wall ms of the network run (the render and the pre-processing included; the ONNX
    session, made once per process, is not)."""
    from fovea_core.importance.fixation import ModelFileMissing, text_map, text_session

    try:
        text_session()                  # made once per process, not charged to a page
    except ModelFileMissing as err:
        raise ModelFileMissing(f"the cascade's text side channel (side='text', allocator "
                               f"'cascade_text') cannot run: {err}") from None
    t0 = time.perf_counter()
    prob = text_map(base.float(), side)
    return prob, (time.perf_counter() - t0) * 1e3


def _kernel_heights(prob: np.ndarray) -> np.ndarray:
    """``[h, w]`` float32: each pixel of a connected text kernel of the ``[h, w]`` probability
    map (8-connected, probability > :data:`KERNEL_THRESHOLD`) holds its kernel's height in
    render px (0 off kernels)."""
    _, lab, stats, _ = cv2.connectedComponentsWithStats(
        (prob > KERNEL_THRESHOLD).astype(np.uint8), connectivity=8)
    heights = np.concatenate([[0.0], stats[1:, cv2.CC_STAT_HEIGHT]]).astype(np.float32)
    return heights[lab]


_LAYOUTS: OrderedDict = OrderedDict()     # per page key: the questions of a page share one run


def detect_text(pyramid: Pyramid, *, side: int = RENDER_SIDE, patch: int = 16,
                key: Iterable[str] | None = None) -> TextLayout:
    """Run the DB detector on a ``side``-px render of each page of ``pyramid``.

    Args:
        pyramid: the pages; the render is an area-resample of its base level.
        side: the render's longer side in px (:func:`render_size`).
        patch: level-0 cell side in px.
        key: the pages' keys (:func:`~fovea_core.cascade.core.page_key`) to keep the result
            for the next question about the same pages (cost included: it is the page's).

    Returns:
        :class:`TextLayout` with ``mask`` and ``log_px`` ``[B, Gh, Gw]``.
    """
    h, w = pyramid.image_size
    rh, rw = render_size((h, w), side)
    ck = (tuple(key), side, patch, (h, w)) if key else None
    if ck is not None and ck in _LAYOUTS:
        _LAYOUTS.move_to_end(ck)
        return _LAYOUTS[ck]
    prob, ms = _probability(pyramid.base, side)                        # [B, rh, rw]
    gh, gw = pyramid.grid_shape(patch, 0)
    # the render covers the page; cells of `patch` base px = patch * rh / h render px
    up = F.interpolate(prob[:, None], size=(gh * patch, gw * patch), mode="bilinear",
                       align_corners=False)[:, 0]
    valid = torch.zeros(gh * patch, gw * patch)
    valid[:h, :w] = 1
    cell = (up * valid).view(-1, gh, patch, gw, patch).mean((2, 4))
    mask = F.max_pool2d((cell > CELL_THRESHOLD).float()[:, None], 3, 1, 1)[:, 0]
    heights = np.stack([_kernel_heights(p) for p in prob.numpy()])      # [B, rh, rw] render px
    on = torch.from_numpy(heights > 0).float()
    logh = torch.from_numpy(np.log2(np.maximum(heights, 1e-6) * KERNEL_TO_TEXT * h / rh))
    scale = dict(size=(gh, gw), mode="area")
    num = F.interpolate((logh.float() * on)[:, None], **scale)[:, 0]
    den = F.interpolate(on[:, None], **scale)[:, 0]
    log_px = torch.where(den > 0, num / den.clamp(min=1e-12), torch.full_like(num, math.nan))
    cost = SideCost(flops=detector_flops(rh, rw), cpu_ms=ms / pyramid.batch_size,
                    pixels=rh * rw, patch=patch)
    out = TextLayout(mask, log_px, cost)
    if ck is not None:
        _LAYOUTS[ck] = out
        while len(_LAYOUTS) > 16:
            _LAYOUTS.popitem(last=False)
    return out
