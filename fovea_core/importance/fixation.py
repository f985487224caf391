"""Where people look: a small learned readout over feature maps from models in wheels.

A fixation predictor in the spirit of Judd et al. (2009, "Learning to predict where humans
look", ICCV) and Xu et al. (2014, "Predicting human gaze beyond pixels", J. Vision 14(1):28):
low-level saliency channels plus detectors of the things people look at beyond pixels
(faces, text) and a centre bias, combined by a linear readout whose softmax over the image
is a fixation probability map. Training it (:mod:`fovea_book.eval.fit_fixation`)
maximises the log-likelihood of the observers' fixations, as DeepGaze does (Kuemmerer,
Wallis & Bethge 2016, "DeepGaze II", arXiv:1610.01563), with a handful of parameters.

Feature maps, each on a *working grid* whose longer side is :data:`WORK_CELLS` cells
(75 x 100 for an 800 x 600 image), peak-normalised per image:

- ``spectral_residual_{32,64,128}``: :func:`~fovea_core.importance.saliency.spectral_residual`
  (Hou & Zhang 2007) at three working resolutions;
- ``edges``: :func:`~fovea_core.importance.saliency.edge_density` (mean Sobel magnitude);
  these two and the colour contrast read the image shrunk to a longer side of
  :data:`LOW_SIDE` px;
- ``colour_contrast``: frequency-tuned colour contrast (Achanta, Hemami, Estrada &
  Suesstrunk 2009, CVPR): ``|| Lab_mean - Lab_blur(x) ||``;
- ``text``: the PP-OCR DB text detector [Liao et al. 2020] inside the ``rapidocr`` wheel,
  run alone through ONNX Runtime (detection only) on the image downscaled to a longer side
  of :data:`TEXT_SIDE` px;
- ``faces``: the LBP frontal-face cascade ``lbpcascade_frontalface_opencv.xml`` that ships
  inside the ``scikit-image`` wheel (``skimage/data``), run with
  :class:`skimage.feature.Cascade` on a grey image of longer side :data:`FACE_SIDE` px;
  every detection adds a Gaussian blob of ``sigma`` = half the face width. (The
  ``opencv-python-headless`` 5.0 wheel in this environment ships no Haar cascades,
  ``cv2.data.haarcascades`` is an empty folder, and OpenCV 5 dropped
  ``cv2.CascadeClassifier`` from its main module, so no profile-face detector is used.)

Each feature is also blurred by Gaussians of :data:`BLUR_CELLS` (cells) so the readout
learns the spatial scale, and enters both as is and square-rooted. The readout (Eq. 1)::

    logit(c) = sum_{k,s} (w_{k,s} F_{k,s}(c) + w'_{k,s} sqrt F_{k,s}(c))
               + a_u u + a_v v + a_uu u^2 + a_vv v^2
    p = G_post * softmax_c(logit)

with ``u = (x - W/2) / (W/2)``, ``v = (y - H/2) / (W/2)`` at the cell centres (the
coordinates of Clarke & Tatler 2014's centre bias, whose log is quadratic in them, so the
fitted centre term is an anisotropic Gaussian) and ``G_post`` a final Gaussian blur. The
coefficients are fitted on ``osie-train`` only and committed in
``fovea_core/weights/fixation_readout.json`` (package data) with a record of how (data, image
ids, seed, versions, training diagnostics). Nothing is downloaded at run time.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from fovea_core.importance.base import ImageLike, normalise, pool_to_grid, prepare, to_gray
from fovea_core.importance.saliency import edge_density, gaussian_blur, spectral_residual
from fovea_core.importance.text import ocr_extra, to_uint8_bgr
from fovea_core.paths import resource

#: longer side of the working grid, in cells (8-px cells on an 800 x 600 image)
WORK_CELLS: int = 100
#: longer side (px) of the image the text detector reads (a multiple of 32)
TEXT_SIDE: int = 320
#: longer side (px) of the grey image the face cascade reads
FACE_SIDE: int = 320
#: smallest face the cascade looks for, px of the FACE_SIDE image (16 px = 40 px on 800 x 600)
FACE_MIN: int = 16
#: cascade detections need this many overlapping windows (fewer false alarms)
FACE_NEIGHBOURS: int = 3
#: longer side (px) of the image the low-level channels (spectral residual, edges, colour) read
LOW_SIDE: int = 200
#: base feature maps, in the order of the readout's weights
FEATURES: tuple[str, ...] = ("spectral_residual_32", "spectral_residual_64",
                             "spectral_residual_128", "edges", "colour_contrast", "text",
                             "faces")
#: blurs (sigma, working cells) applied to every feature; 0 = unblurred
BLUR_CELLS: tuple[float, ...] = (0.0, 2.0, 5.0, 10.0)
#: centre-bias terms of the logit
CENTRE_TERMS: tuple[str, ...] = ("u", "v", "uu", "vv")

FACE_MODEL = "lbpcascade_frontalface_opencv.xml"
FACE_WHEEL = "scikit-image"
TEXT_WHEEL = "rapidocr"
#: committed readout coefficients
READOUT_PATH = resource("weights", "fixation_readout.json")


class ModelFileMissing(FileNotFoundError):
    """A detector's model file is not inside the wheel that should ship it."""


# --------------------------------------------------------------------- model files
def face_model_path() -> Path:
    """The LBP frontal-face cascade inside the scikit-image wheel (``skimage/data``)."""
    import skimage.data

    path = Path(skimage.data.__file__).parent / FACE_MODEL
    if not path.is_file():
        raise ModelFileMissing(f"face model {FACE_MODEL} is missing from the {FACE_WHEEL} wheel "
                               f"(looked in {path.parent}); reinstall {FACE_WHEEL}")
    return path


def text_model_path() -> Path:
    """The PP-OCR DB detection model (``*det*.onnx``) inside the rapidocr wheel."""
    with ocr_extra():
        import rapidocr
    folder = Path(rapidocr.__file__).parent / "models"
    found = sorted(folder.glob("*det*.onnx")) if folder.is_dir() else []
    if not found:
        raise ModelFileMissing(f"text model PP-OCR det (*det*.onnx) is missing from the "
                               f"{TEXT_WHEEL} wheel (looked in {folder}); reinstall {TEXT_WHEEL}")
    return found[-1]


@functools.lru_cache(maxsize=1)
def _face_cascade():
    from skimage.feature import Cascade

    return Cascade(str(face_model_path()))


@functools.lru_cache(maxsize=1)
def text_session():
    """The ONNX Runtime session of the DB text detector (:func:`text_model_path`), one per
    process, with as many intra-op threads as torch has when it is made."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, torch.get_num_threads())
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(text_model_path()), opts, providers=["CPUExecutionProvider"])


# --------------------------------------------------------------------- geometry
def work_grid(image_size: tuple[int, int]) -> tuple[int, int, int]:
    """``(cell, gh, gw)``: the working cell side in px and the working grid for ``(H, W)``."""
    h, w = (int(v) for v in image_size)
    if h < 1 or w < 1:
        raise ValueError(f"image_size must be positive (H, W), got {image_size!r}")
    cell = max(1, math.ceil(max(h, w) / WORK_CELLS))
    return cell, math.ceil(h / cell), math.ceil(w / cell)


def centre_coords(image_size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Clarke & Tatler coordinates ``u [gw]``, ``v [gh]`` at the working cell centres."""
    h, w = image_size
    cell, gh, gw = work_grid(image_size)
    xs = ((torch.arange(gw, dtype=torch.float64) + 0.5) * cell).clamp(max=w)
    ys = ((torch.arange(gh, dtype=torch.float64) + 0.5) * cell).clamp(max=h)
    return (xs - w / 2) / (w / 2), (ys - h / 2) / (w / 2)


def centre_features(image_size: tuple[int, int]) -> torch.Tensor:
    """The centre terms ``[4, gh, gw]`` float64 in the order of :data:`CENTRE_TERMS`."""
    u, v = centre_coords(image_size)
    uu, vv = torch.meshgrid(u, v, indexing="xy")                  # [gh, gw] each
    return torch.stack([uu, vv, uu**2, vv**2])


def _to_work(m: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Resample ``[B, h, w]`` onto the working grid (area when shrinking, bilinear else)."""
    if tuple(m.shape[-2:]) == grid:
        return m
    mode = "area" if m.shape[-2] >= grid[0] and m.shape[-1] >= grid[1] else "bilinear"
    kw = {} if mode == "area" else {"align_corners": False}
    return F.interpolate(m[:, None].float(), size=grid, mode=mode, **kw)[:, 0]


def shrunk_size(h: int, w: int, side: int, multiple: int = 1) -> tuple[int, int]:
    """``(hs, ws)``: an ``h x w`` image scaled so its longer side is ``side`` (never enlarged),
    each side rounded to a multiple of ``multiple`` (at least ``multiple``). The one rule of
    :func:`_shrink`, of the reads it declares and of the cascade's detector render."""
    r = min(1.0, side / max(h, w))
    return (max(multiple, round(h * r / multiple) * multiple),
            max(multiple, round(w * r / multiple) * multiple))


def _shrink(x: torch.Tensor, side: int, multiple: int = 1) -> torch.Tensor:
    """Area-resize ``[B, C, H, W]`` so its longer side is ``side`` (never enlarges)."""
    h, w = x.shape[-2:]
    hs, ws = shrunk_size(h, w, side, multiple)
    return x if (hs, ws) == (h, w) else F.interpolate(x, size=(hs, ws), mode="area")


# --------------------------------------------------------------------- features
def text_map(x: torch.Tensor, side: int = TEXT_SIDE) -> torch.Tensor:
    """DB text probability ``[B, h, w]`` of the image shrunk to longer side ``side``
    (default :data:`TEXT_SIDE`; ``h``, ``w`` are multiples of 32).

    The detector alone (no recognition), the ``rapidocr`` preprocessing: BGR,
    ``(v / 255 - 0.5) / 0.5``, sides multiples of 32; all images of a batch in one run.
    """
    small = _shrink(x, side, multiple=32)
    bgr = to_uint8_bgr(small).astype(np.float32)                      # [B, h, w, 3]
    inp = np.ascontiguousarray((bgr / 255.0 - 0.5) / 0.5).transpose(0, 3, 1, 2)
    sess = text_session()
    out = sess.run(None, {sess.get_inputs()[0].name: inp})[0]          # [B, 1, h, w]
    return torch.from_numpy(np.asarray(out, dtype=np.float32)[:, 0]).clamp_(0, 1)


def face_boxes(gray: np.ndarray) -> np.ndarray:
    """Frontal faces in one grey image ``[h, w]`` (float in [0, 1]): ``[K, 4]`` (x, y, w, h)."""
    side = max(gray.shape)
    det = _face_cascade().detect_multi_scale(
        img=gray, scale_factor=1.25, step_ratio=1, min_size=(FACE_MIN, FACE_MIN),
        max_size=(side, side), min_neighbor_number=FACE_NEIGHBOURS)
    return np.array([[d["c"], d["r"], d["width"], d["height"]] for d in det],
                    dtype=np.float64).reshape(-1, 4)


def face_map(boxes: np.ndarray, shape: tuple[int, int], scale: float) -> torch.Tensor:
    """Gaussian blobs ``[h, w]`` (max over faces, peak 1) at boxes ``[K, 4]`` times ``scale``.

    Blob ``k`` is centred on its box, ``sigma`` = half the box width (vectorised over faces).
    """
    h, w = shape
    if len(boxes) == 0:
        return torch.zeros(h, w)
    b = torch.as_tensor(boxes, dtype=torch.float32) * scale
    cx, cy = b[:, 0] + b[:, 2] / 2, b[:, 1] + b[:, 3] / 2
    sig = (b[:, 2] / 2).clamp_min(0.5)
    ys, xs = torch.arange(h) + 0.5, torch.arange(w) + 0.5
    d2 = ((xs[None, None] - cx[:, None, None]) ** 2 + (ys[None, :, None] - cy[:, None, None]) ** 2)
    return torch.exp(-d2 / (2 * sig[:, None, None] ** 2)).amax(0)


def colour_contrast(rgb_u8: np.ndarray) -> torch.Tensor:
    """Frequency-tuned saliency (Achanta et al. 2009): ``|| mean Lab - blurred Lab ||``.

    Args:
        rgb_u8: ``[B, h, w, 3]`` uint8 RGB. Returns ``[B, h, w]`` float32.
    """
    out = []
    for img in rgb_u8:                                  # loop over images (cv2 per image)
        lab = cv2.cvtColor(cv2.GaussianBlur(img, (5, 5), 0), cv2.COLOR_RGB2LAB).astype(np.float32)
        out.append(np.linalg.norm(lab - lab.reshape(-1, 3).mean(0), axis=-1))
    return torch.from_numpy(np.stack(out))


def _rgb_u8(x: torch.Tensor) -> np.ndarray:
    """``[B, C, h, w]`` float in [0, 1] -> ``[B, h, w, 3]`` uint8 RGB."""
    rgb = (x.expand(-1, 3, -1, -1).clamp(0, 1) * 255).round().to(torch.uint8)
    return np.ascontiguousarray(rgb.permute(0, 2, 3, 1).numpy())


def base_features(image: ImageLike) -> torch.Tensor:
    """The base feature maps ``[B, K, gh, gw]`` (K = len(FEATURES)), each peak 1 per image."""
    x, _ = prepare(image, 1)
    b, _, h, w = x.shape
    cell, gh, gw = work_grid((h, w))
    grid = (gh, gw)
    low = _shrink(x, LOW_SIDE)
    maps = [_to_work(spectral_residual(low, patch=1, size=s), grid) for s in (32, 64, 128)]
    maps.append(_to_work(edge_density(low, patch=1), grid))
    maps.append(_to_work(colour_contrast(_rgb_u8(low)), grid))
    maps.append(_to_work(text_map(x), grid))
    small = _shrink(x, FACE_SIDE)
    gray = to_gray(small)[:, 0].double().numpy()                        # [B, h, w] in [0, 1]
    fscale = gw / small.shape[-1]
    maps.append(torch.stack([face_map(face_boxes(g), grid, fscale) for g in gray]))
    return normalise(torch.stack(maps, 1).reshape(b * len(FEATURES), gh, gw)
                     ).reshape(b, len(FEATURES), gh, gw)


def blurred_features(base: torch.Tensor) -> torch.Tensor:
    """``[B, K, gh, gw] -> [B, 2 K S, gh, gw]``: every feature at every blur of
    :data:`BLUR_CELLS` (feature-major), each re-normalised to peak 1, then the same maps
    square-rooted (a compressive nonlinearity: a weak response counts relatively more)."""
    b, k, gh, gw = base.shape
    flat = base.reshape(b * k, 1, gh, gw)
    outs = [normalise(gaussian_blur(flat, s)[:, 0]).reshape(b, k, 1, gh, gw) for s in BLUR_CELLS]
    lin = torch.cat(outs, 2).reshape(b, k * len(BLUR_CELLS), gh, gw)
    return torch.cat([lin, lin.sqrt()], 1)


def feature_names() -> list[str]:
    """Names of the readout's features, in its order: ``"<feature>@<sigma>"`` then
    ``"sqrt <feature>@<sigma>"``."""
    lin = [f"{f}@{s:g}" for f in FEATURES for s in BLUR_CELLS]
    return lin + [f"sqrt {n}" for n in lin]


# --------------------------------------------------------------------- the readout
@dataclass(frozen=True)
class Readout:
    """Coefficients of Eq. 1: ``weights [K * S]`` (order :func:`feature_names`),
    ``centre [4]`` (order :data:`CENTRE_TERMS`), ``post_blur`` (cells), and the same for
    the centre-bias-only model (``centre_only [4]``, ``centre_only_blur``)."""

    weights: torch.Tensor
    centre: torch.Tensor
    post_blur: float
    centre_only: torch.Tensor
    centre_only_blur: float


def readout_logits(feats: torch.Tensor, centre: torch.Tensor, weights: torch.Tensor,
                   centre_coef: torch.Tensor) -> torch.Tensor:
    """``logit [B, gh, gw]`` of Eq. 1 from ``feats [B, F, gh, gw]``, ``centre [4, gh, gw]``."""
    return (torch.einsum("bfhw,f->bhw", feats.to(weights.dtype), weights)
            + torch.einsum("chw,c->hw", centre.to(centre_coef.dtype), centre_coef))


def readout_map(logits: torch.Tensor, post_blur: float) -> torch.Tensor:
    """``softmax`` over the cells of ``[B, gh, gw]``, blurred by ``post_blur`` cells; sums to 1."""
    b, gh, gw = logits.shape
    p = torch.softmax(logits.reshape(b, -1).double(), 1).reshape(b, 1, gh, gw)
    p = gaussian_blur(p, post_blur)[:, 0] if post_blur > 0 else p[:, 0]
    return p / p.sum((-2, -1), keepdim=True)


def load_readout(path: str | Path | None = None) -> Readout:
    """Read and check the readout JSON (default: the committed :data:`READOUT_PATH`).

    Raises:
        FileNotFoundError: the file is absent (say how to fit it).
        ValueError: its feature list, blurs or centre terms differ from this module's.
    """
    path = Path(path) if path is not None else READOUT_PATH
    return _load_readout(str(path.resolve()))


@functools.lru_cache(maxsize=4)
def _load_readout(path: str) -> Readout:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"fixation readout {p} not found; fit it with `python -m "
                                "fovea_book.eval.fit_fixation --replace-committed`")
    d = json.loads(p.read_text())
    if d.get("features") != feature_names() or d.get("centre_terms") != list(CENTRE_TERMS):
        raise ValueError(f"{p}: its features/centre terms do not match this code's "
                         f"({feature_names()}, {list(CENTRE_TERMS)}); refit it")
    w = torch.tensor(d["weights"], dtype=torch.float64)
    c = torch.tensor(d["centre"], dtype=torch.float64)
    co = torch.tensor(d["centre_only"]["centre"], dtype=torch.float64)
    return Readout(w, c, float(d["post_blur"]), co, float(d["centre_only"]["post_blur"]))


def resample_probability(p: torch.Tensor, out_shape: tuple[int, int] | None) -> torch.Tensor:
    """A probability map ``[B, h, w]`` resampled bilinearly to ``out_shape`` (renormalised
    to sum 1 per map); float32; unchanged (as float32) when ``out_shape`` is None."""
    if out_shape is None:
        return p.float()
    q = F.interpolate(p[:, None].float(), size=tuple(out_shape), mode="bilinear",
                      align_corners=False)[:, 0].clamp_min(0)
    return q / q.sum((-2, -1), keepdim=True)


def fixation_probability(image: ImageLike, *, out_shape: tuple[int, int] | None = None,
                         readout: Readout | None = None) -> torch.Tensor:
    """The predictor's fixation probability map ``[B, gh, gw]`` (working grid, sums to 1),
    or bilinearly resampled to ``out_shape = (h, w)`` (renormalised to sum 1)."""
    r = readout or load_readout()
    x, _ = prepare(image, 1)
    feats = blurred_features(base_features(x))
    logit = readout_logits(feats, centre_features(tuple(x.shape[-2:])), r.weights, r.centre)
    return resample_probability(readout_map(logit, r.post_blur), out_shape)


def centre_bias_probability(image_size: tuple[int, int], *,
                            out_shape: tuple[int, int] | None = None,
                            readout: Readout | None = None) -> torch.Tensor:
    """The centre-bias-only model fitted beside the readout, ``[1, gh, gw]`` (sums to 1)."""
    r = readout or load_readout()
    logit = torch.einsum("chw,c->hw", centre_features(image_size), r.centre_only)[None]
    return resample_probability(readout_map(logit, r.centre_only_blur), out_shape)


def scores_from_probability(prob: torch.Tensor, image_size: tuple[int, int], *,
                            patch: int = 16) -> torch.Tensor:
    """The ``fixation`` scorer's map ``[B, Gh, Gw]`` from a working-grid probability
    ``[B, gh, gw]`` of an ``(H, W)`` image: resampled to the pixels (bilinear), averaged per
    ``patch`` cell, peak 1. (So a caller that needs both computes the features once.)"""
    return normalise(pool_to_grid(resample_probability(prob, tuple(image_size)), patch))


def fixation_scores(image: ImageLike, *, patch: int = 16) -> torch.Tensor:
    """The ``fixation`` scorer ``[B, Gh, Gw]``: :func:`fixation_probability` on the pixels
    (bilinear), averaged per ``patch`` cell, peak 1."""
    x, _ = prepare(image, patch)
    return scores_from_probability(fixation_probability(x), tuple(x.shape[-2:]), patch=patch)


def fixation_reads(h: int, w: int) -> int:
    """Pixels the ``fixation`` scorer reads: the LOW_SIDE image of the low-level channels,
    the FACE_SIDE grey image and the TEXT_SIDE detector input."""
    def px(side: int, multiple: int = 1) -> int:
        return math.prod(shrunk_size(h, w, side, multiple))
    return px(LOW_SIDE) + px(FACE_SIDE) + px(TEXT_SIDE, 32)
