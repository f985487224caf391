"""Checks of the log-polar transform (chapter 03): agreement with OpenCV's ``warpPolar`` and
the two shift properties (a zoom about the fixation is a translation along log-radius, a
rotation a cyclic translation along angle).

The notebook shows the tables, the figure and the words; the measurements are here so
that they are tested (``tests/test_logpolar_checks.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np
import pandas as pd
import torch

from fovea_book.logpolar import expected_shift, from_logpolar, logpolar_lut, to_logpolar

#: OpenCV's flags for the reference transform: log-polar, bilinear, zeros outside
WARP_FLAGS = cv2.WARP_POLAR_LOG | cv2.INTER_LINEAR | cv2.WARP_FILL_OUTLIERS


def _hwc_image(image: np.ndarray, name: str = "image") -> np.ndarray:
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"{name} must be an [H, W, 3] array, got shape {image.shape}")
    if not np.issubdtype(image.dtype, np.floating):
        raise ValueError(f"{name} must be a float image in [0, 1], got dtype {image.dtype}")
    return image.astype(np.float32, copy=False)


def _to_t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(x).permute(2, 0, 1)[None]


def _to_np(x: torch.Tensor) -> np.ndarray:
    return x[0].permute(1, 2, 0).numpy()


@dataclass(frozen=True)
class OpenCVAgreement:
    """How our log-polar maps compare with ``cv2.warpPolar`` on one image.

    Attributes:
        table: one row per comparison: ``comparison``, ``max |diff|``, ``fraction of values
            differing`` (for uint8, the fraction differing by more than 0.5 grey level).
        lut_identical: our forward LUT fed to ``cv2.remap`` gives ``warpPolar``'s output bit
            for bit.
        fwd_err: the largest ``|to_logpolar - warpPolar|`` over both backends.
        inv_err_max, inv_err_mean: ``|from_logpolar (torch) - warpPolar inverse|``.
        u8_err: the largest difference (grey levels) between our float result times 255 and
            ``warpPolar`` on the uint8 image.
    """

    table: pd.DataFrame
    lut_identical: bool
    fwd_err: float
    inv_err_max: float
    inv_err_mean: float
    u8_err: float


def opencv_agreement(image: np.ndarray, center: tuple[float, float], radius: float,
                     out_size: Sequence[int]) -> OpenCVAgreement:
    """Compare the forward LUT, both backends of ``to_logpolar`` / ``from_logpolar`` and a
    uint8 image with ``cv2.warpPolar`` (the reference, flags :data:`WARP_FLAGS`).

    Args:
        image: ``[H, W, 3]`` float image, square (``warpPolar``'s inverse writes ``H x H``);
            noise makes the comparison strict (any position error shows).
        center: the fixation ``(x, y)`` in pixels.
        radius: the bounding radius R in pixels.
        out_size: ``(Ho, Wo)``, angles x log-radius bins.
    """
    image = _hwc_image(image)
    side = image.shape[0]
    if image.shape[1] != side:
        raise ValueError(f"image must be square, got shape {image.shape}")
    ho, wo = (int(v) for v in out_size)
    lut = logpolar_lut(center, (ho, wo), radius)[0].numpy()
    ref = cv2.warpPolar(image, (wo, ho), center, radius, WARP_FLAGS)
    via_lut = cv2.remap(image, lut[..., 0], lut[..., 1], cv2.INTER_LINEAR,
                        borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    fwd = {b: _to_np(to_logpolar(_to_t(image), center, radius, (ho, wo), backend=b))
           for b in ("torch", "opencv")}
    ref_inv = cv2.warpPolar(ref, (side, side), center, radius,
                            WARP_FLAGS | cv2.WARP_INVERSE_MAP)
    inv = {b: _to_np(from_logpolar(_to_t(ref), center, radius, (side, side), backend=b))
           for b in ("torch", "opencv")}
    image_u8 = (image * 255).round().astype(np.uint8)
    ref_u8 = cv2.warpPolar(image_u8, (wo, ho), center, radius, WARP_FLAGS).astype(np.float32)
    ours_u8 = _to_np(to_logpolar(torch.from_numpy(image_u8 / 255.0).float().permute(2, 0, 1)
                                 [None], center, radius, (ho, wo), backend="torch"))
    d_u8 = np.abs(ours_u8 * 255 - ref_u8)
    rows = [
        ("forward LUT -> cv2.remap vs warpPolar (float32)", np.abs(via_lut - ref).max(),
         np.mean(via_lut != ref)),
        *[(f"to_logpolar {b} vs warpPolar (float32)", np.abs(fwd[b] - ref).max(),
           np.mean(fwd[b] != ref)) for b in ("torch", "opencv")],
        *[(f"from_logpolar {b} vs warpPolar inverse", np.abs(inv[b] - ref_inv).max(),
           np.mean(inv[b] != ref_inv)) for b in ("torch", "opencv")],
        ("to_logpolar torch x 255 vs warpPolar (uint8; fraction: > 0.5 grey level)",
         d_u8.max(), np.mean(d_u8 > 0.5)),
    ]
    table = pd.DataFrame(rows, columns=["comparison", "max |diff|",
                                        "fraction of values differing"])
    d_inv = np.abs(inv["torch"] - ref_inv)
    return OpenCVAgreement(
        table=table, lut_identical=bool(np.array_equal(via_lut, ref)),
        fwd_err=float(max(np.abs(fwd[b] - ref).max() for b in fwd)),
        inv_err_max=float(d_inv.max()), inv_err_mean=float(d_inv.mean()),
        u8_err=float(d_u8.max()))


def opencv_angle_error(xy: np.ndarray) -> float:
    """The largest angle error (radians) of ``cv2.cartToPolar`` against ``atan2`` over the
    points ``xy`` (``[2, n]`` float32: x row, y row), wrapped to ``[0, pi]``.

    OpenCV's inverse log-polar map takes its angle from ``cartToPolar``, a polynomial
    approximation (documented "about 0.3 degrees"); an angle error ``e`` moves a sample by
    ``e Ho / (2 pi)`` rows, the bound the tests of the inverse use.
    """
    xy = np.asarray(xy)
    if xy.ndim != 2 or xy.shape[0] != 2 or xy.shape[1] == 0:
        raise ValueError(f"xy must be a non-empty [2, n] array, got shape {xy.shape}")
    xy = xy.astype(np.float32, copy=False)
    d = np.abs(cv2.cartToPolar(xy[0], xy[1])[1].ravel()
               - np.mod(np.arctan2(xy[1].astype(np.float64), xy[0]), 2 * np.pi))
    return float(np.minimum(d, 2 * np.pi - d).max())


def shift_mismatch(reference: np.ndarray, moved: np.ndarray, shifts: Sequence[int], *,
                   axis: int, columns: slice = slice(None)) -> np.ndarray:
    """Mean ``|reference - moved shifted back by d|`` for every shift ``d`` in ``shifts``.

    ``moved`` is rolled by ``-d`` along ``axis`` (0: rows = angle, cyclic; 1: columns =
    log-radius) and both are compared on ``columns`` only (e.g. the radii where OpenCV's
    ``log(r + 1)`` is close to ``log r``). The shift that minimises the result is the
    translation the transform caused.
    """
    reference, moved = np.asarray(reference), np.asarray(moved)
    if reference.shape != moved.shape:
        raise ValueError(f"moved must have reference's shape {reference.shape}, "
                         f"got {moved.shape}")
    if axis not in (0, 1):
        raise ValueError(f"axis must be 0 (rows) or 1 (columns), got {axis}")
    ref = reference[:, columns]
    return np.array([np.abs(ref - np.roll(moved, -int(d), axis=axis)[:, columns]).mean()
                     for d in shifts])


@dataclass(frozen=True)
class ShiftCheck:
    """One transform of :func:`shift_checks`: the transformed image, its log-polar image,
    the mismatch per candidate shift and the predicted shift."""

    name: str
    moved: np.ndarray
    logpolar: np.ndarray
    shifts: np.ndarray
    mismatch: np.ndarray
    expected: float

    @property
    def found(self) -> int:
        """The shift with the least mismatch."""
        return int(self.shifts[self.mismatch.argmin()])

    @property
    def residual(self) -> float:
        """The least mismatch."""
        return float(self.mismatch.min())

    @property
    def unshifted(self) -> float:
        """The mismatch without a shift."""
        return float(self.mismatch[self.shifts == 0][0])

    @property
    def holds(self) -> bool:
        """The found shift is the predicted one, rounded."""
        return self.found == round(self.expected)


@dataclass(frozen=True)
class ShiftChecks:
    """:func:`shift_checks`' result: the zoom factor, the rotation (degrees,
    counter-clockwise as ``getRotationMatrix2D`` counts) and the two checks."""

    scale: float
    angle_deg: float
    min_radius_px: float
    zoom: ShiftCheck
    rotation: ShiftCheck


def shift_checks(image: np.ndarray, center: tuple[float, float], radius: float,
                 out_size: Sequence[int], *, zoom_columns: int, rotate_rows: int,
                 min_radius_px: float = 16.0) -> ShiftChecks:
    """Zoom ``image`` about ``center`` by ``s = exp(zoom_columns ln R / Wo)`` and rotate it
    by ``2 pi rotate_rows / Ho`` (exact similarity transforms, ``cv2.warpAffine``), take the
    log-polar image of each and search the shift back to the original's.

    The zoom is compared on the columns whose radius is at least ``min_radius_px`` and
    whose zoom source lies inside R, over shifts ``-3k..3k`` (``k = zoom_columns``); the
    rotation on every column but the first two, over shifts ``-Ho/4..Ho/4``.
    """
    image = _hwc_image(image)
    ho, wo = (int(v) for v in out_size)
    if not 0 < zoom_columns < wo:
        raise ValueError(f"zoom_columns must be in (0, {wo}), got {zoom_columns}")
    if not radius > 1:
        raise ValueError(f"radius must be > 1 pixel, got {radius}")
    side_hw = (image.shape[1], image.shape[0])
    s = math.exp(zoom_columns * math.log(radius) / wo)
    angle_deg = -360.0 * rotate_rows / ho     # getRotationMatrix2D: positive = counter-clockwise
    exp_rows, exp_cols = expected_shift((ho, wo), radius, scale=s,
                                        angle=math.radians(-angle_deg))
    warp = {"zoom": cv2.getRotationMatrix2D(center, 0.0, s),
            "rotation": cv2.getRotationMatrix2D(center, angle_deg, 1.0)}
    moved = {k: cv2.warpAffine(image, m, side_hw, flags=cv2.INTER_LINEAR)
             for k, m in warp.items()}
    lp0 = _to_np(to_logpolar(_to_t(image), center, radius, (ho, wo)))
    lps = {k: _to_np(to_logpolar(_to_t(v), center, radius, (ho, wo))) for k, v in moved.items()}
    lo = math.ceil(math.log(1 + min_radius_px) * wo / math.log(radius))   # r >= min_radius_px
    hi = wo - zoom_columns                                               # source inside R
    col_shifts = np.arange(-3 * zoom_columns, 3 * zoom_columns + 1)
    row_shifts = np.arange(-ho // 4, ho // 4 + 1)
    zoom = ShiftCheck("zoom", moved["zoom"], lps["zoom"], col_shifts,
                      shift_mismatch(lp0, lps["zoom"], col_shifts, axis=1,
                                     columns=slice(lo, hi)), exp_cols)
    rotation = ShiftCheck("rotation", moved["rotation"], lps["rotation"], row_shifts,
                          shift_mismatch(lp0, lps["rotation"], row_shifts, axis=0,
                                         columns=slice(2, None)), exp_rows)
    return ShiftChecks(s, angle_deg, min_radius_px, zoom, rotation)
