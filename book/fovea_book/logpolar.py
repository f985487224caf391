"""The log-polar transform as an image operation (sampling grids, forward and inverse).

Chapter 03's transform, for the book: the method does not resample images to log-polar
(the v6 allocators of :mod:`fovea_core.allocators.logpolar` place tokens in log-polar bins
of the page and sample them like every other token), so this lives in the book's package
and builds on :func:`fovea_book.reference_samplers.remap`.

The complex-logarithm model of the retino-cortical map [Schwartz 1977, 1980] sends a
retinal position ``z = r e^{i theta}`` (relative to the fixation) to ``w = log(z) =
log r + i theta``: a cortical image in which rows are polar angle and columns are
log-eccentricity. Two consequences make it interesting for vision models
[Schwartz 1980; Weiman & Chaikin 1979]:

* a scaling of the image about the centre, ``z -> s z``, becomes a translation by
  ``log s`` along the log-radius axis;
* a rotation about the centre, ``z -> e^{i a} z``, becomes a cyclic translation by ``a``
  along the angle axis.

Convention (shared with :mod:`fovea_core.sample` and the CUDA kernels): a *lookup table*
(LUT) is a float32 tensor ``[B, Ho, Wo, 2]`` with ``lut[..., 0] = x`` and
``lut[..., 1] = y`` in OpenCV pixel coordinates (the centre of pixel ``i`` is at ``i``), which
is exactly what ``cv2.remap`` takes as ``map_x`` / ``map_y``; it is sampled bilinearly with
zeros outside the image.

The mapping is OpenCV's ``cv2.warpPolar(..., WARP_POLAR_LOG)`` [OpenCV imgproc docs],
reproduced formula for formula (and rounding step for rounding step). What is exact, and
what is not:

* **forward map: OpenCV-exact.** The forward LUT equals OpenCV's internal map bit for bit,
  and for float32 images both backends equal ``cv2.warpPolar`` to float32 rounding
  (``tests/test_logpolar.py``).
* **inverse map: not OpenCV-exact.** OpenCV computes the inverse angle with
  ``cv::cartToPolar``, a polynomial approximation of ``atan2`` (documented as accurate to
  about 0.3 deg); we use ``atan2``. The inverse therefore differs from
  ``warpPolar(..., WARP_INVERSE_MAP)`` by up to ``e * Ho / (2 pi)`` rows for an angle error
  ``e``; the tests bound it that way, and notebook 03 measures it.
* **uint8 images: not OpenCV-exact.** ``cv2.remap`` uses fixed-point weights and rounds to
  integers for 8-bit images, so results differ by up to about one grey level.

With ``Ho`` angles and ``Wo`` radii,
``K_mag = ln(R) / Wo`` and ``K_ang = 2 pi / Ho``::

    forward  (row i, col j):  rho_j = exp(j K_mag) - 1          (float32)
                              x = rho_j cos(i K_ang) + cx,  y = rho_j sin(i K_ang) + cy
    inverse  (pixel x, y):    col = ln(1 + |(x, y) - c|) / K_mag
                              row = atan2(y - cy, x - cx) mod 2 pi / K_ang

so column ``j`` samples radius ``exp(j ln(R)/Wo) - 1`` (0 at ``j = 0``, ``R - 1`` at
``j = Wo``): the ``- 1`` / ``+ 1`` keeps the map finite at the centre. The inverse LUT
addresses the *angle-wrapped* log-polar image (:func:`wrap_angle`: one row of cyclic
padding above and below, as OpenCV does), so that angles between the last row and 2 pi
interpolate with the first row instead of with zeros.

Backends. :func:`to_logpolar` / :func:`from_logpolar` sample either with
``fovea_book.reference_samplers.remap`` (torch, exact bilinear weights, differentiable, batched, any
device) or with ``cv2.remap`` (CPU only; OpenCV 5 samples float32 images with exact float
bilinear weights, so both backends agree to float32 rounding; for uint8 images OpenCV uses
fixed-point weights, which is why the library works on float images).
``backend="auto"`` picks the fastest correct path: ``cv2.remap`` on each contiguous
``[H, W]`` plane for float32 CPU tensors that need no gradient (5-50x faster than the torch
sampler on the 2-core CPU, see ``python -m fovea_book.bench logpolar``; it also beats the
torch path for batches of centres), and torch otherwise (GPU tensors, float64, autograd).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import torch

from fovea_core.pyramid import as_image_batch

__all__ = ["BACKENDS", "expected_shift", "from_logpolar", "inverse_logpolar_lut", "logpolar_lut",
           "to_logpolar", "wrap_angle"]

BACKENDS = ("auto", "torch", "opencv")
ANGLE_BORDER = 1  # rows of cyclic padding that wrap_angle adds on each side (OpenCV's value)


# ----------------------------------------------------------------------------- validation

def _as_centers(center, name: str = "center") -> torch.Tensor:
    """``(x, y)`` or ``[B, 2]`` -> float64 tensor ``[B, 2]`` (values rounded to float32)."""
    c = torch.as_tensor(np.asarray(center, dtype=np.float64) if not isinstance(center, torch.Tensor)
                        else center.detach().cpu(), dtype=torch.float64)
    if c.ndim == 1:
        c = c[None]
    if c.ndim != 2 or c.shape[-1] != 2 or c.shape[0] < 1:
        raise ValueError(f"{name} must be (x, y) or a [B, 2] array of (x, y) pixel coordinates, "
                         f"got shape {tuple(c.shape)}")
    if not torch.isfinite(c).all():
        raise ValueError(f"{name} must be finite, got {c.tolist()}")
    # OpenCV takes the centre as a Point2f: round to float32 exactly as it does.
    return c.to(torch.float32).to(torch.float64)


def _as_radii(max_radius, batch: int) -> torch.Tensor:
    r = torch.as_tensor(max_radius.detach().cpu() if isinstance(max_radius, torch.Tensor)
                        else np.asarray(max_radius, dtype=np.float64), dtype=torch.float64)
    r = r.reshape(-1)
    if r.numel() not in (1, batch):
        raise ValueError(f"max_radius must be a scalar or have one value per centre ({batch}), "
                         f"got {r.numel()} values")
    if not torch.isfinite(r).all() or (r <= 1.0).any():
        raise ValueError(f"max_radius must be finite and > 1 pixel (ln(max_radius) sets the "
                         f"log-radius scale), got {r.tolist()}")
    return r.expand(batch) if r.numel() == 1 else r


def _as_size(size, name: str) -> tuple[int, int]:
    try:
        h, w = (int(s) for s in size)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair of positive ints (height, width), got {size!r}")
    if h < 1 or w < 1 or (h, w) != tuple(size):
        raise ValueError(f"{name} must be a pair of positive ints (height, width), got {size!r}")
    return h, w


def _check_in_image(c: torch.Tensor, image_size: tuple[int, int] | None) -> None:
    if image_size is None:
        return
    h, w = image_size
    bad = (c[:, 0] < 0) | (c[:, 0] > w - 1) | (c[:, 1] < 0) | (c[:, 1] > h - 1)
    if bad.any():
        raise ValueError(f"center must lie in the image: x in [0, {w - 1}], y in [0, {h - 1}] "
                         f"(pixel coordinates), got {c[bad].tolist()}")


# ----------------------------------------------------------------------------- lookup tables

def logpolar_lut(center, out_size: Sequence[int], max_radius, *,
                 image_size: Sequence[int] | None = None,
                 device: str | torch.device | None = None) -> torch.Tensor:
    """Forward sampling grid: image -> log-polar (the ``cv2.warpPolar`` ``WARP_POLAR_LOG`` map).

    Args:
        center: ``(x, y)`` or ``[B, 2]`` transform centres in pixel coordinates.
        out_size: ``(Ho, Wo)`` = (number of angles, number of log-radius bins); rows are
            angle ``2 pi i / Ho``, columns are radius ``exp(j ln(R) / Wo) - 1``. (OpenCV's
            ``dsize`` is ``(Wo, Ho)``.)
        max_radius: ``R > 1`` (pixels), scalar or ``[B]``: radius of the bounding circle.
        image_size: optional ``(H, W)``; when given, every centre must lie in the image.
        device: device of the returned tensor.

    Returns:
        float32 LUT ``[B, Ho, Wo, 2]`` (x, y), bit-identical to OpenCV's internal float maps.
    """
    ho, wo = _as_size(out_size, "out_size")
    c = _as_centers(center)
    if image_size is not None:
        _check_in_image(c, _as_size(image_size, "image_size"))
    r = _as_radii(max_radius, c.shape[0])
    k_mag = torch.log(r) / wo                                              # [B]
    j = torch.arange(wo, dtype=torch.float64)
    rho = (torch.exp(j[None] * k_mag[:, None]) - 1.0).float().double()     # [B, Wo]
    phi = (2.0 * math.pi / ho) * torch.arange(ho, dtype=torch.float64)     # [Ho]
    x = rho[:, None, :] * torch.cos(phi)[None, :, None] + c[:, 0, None, None]
    y = rho[:, None, :] * torch.sin(phi)[None, :, None] + c[:, 1, None, None]
    return torch.stack([x, y], dim=-1).float().to(device)


def inverse_logpolar_lut(center, out_size: Sequence[int], max_radius,
                         logpolar_size: Sequence[int], *,
                         device: str | torch.device | None = None) -> torch.Tensor:
    """Inverse sampling grid: log-polar -> image (``cv2.warpPolar`` with ``WARP_INVERSE_MAP``,
    but with an exact ``atan2`` where OpenCV approximates the angle: not OpenCV-exact).

    Args:
        center: ``(x, y)`` or ``[B, 2]`` centres used by the forward transform.
        out_size: ``(H, W)`` of the reconstructed (Cartesian) image.
        max_radius: the forward transform's ``R``, scalar or ``[B]``.
        logpolar_size: ``(Ho, Wo)`` of the log-polar image being inverted.
        device: device of the returned tensor.

    Returns:
        float32 LUT ``[B, H, W, 2]`` addressing the angle-wrapped log-polar image
        ``wrap_angle(lp)`` of shape ``[B, C, Ho + 2, Wo]``: ``x = ln(1 + r) Wo / ln(R)``,
        ``y = (atan2 mod 2 pi) Ho / (2 pi) + 1``. Pixels farther than ``R - 1`` from the
        centre map past the last column and read zeros.
    """
    h, w = _as_size(out_size, "out_size")
    ho, wo = _as_size(logpolar_size, "logpolar_size")
    c = _as_centers(center)
    r = _as_radii(max_radius, c.shape[0])
    cf = c.float()
    dx = torch.arange(w, dtype=torch.float32)[None, None, :] - cf[:, 0, None, None]  # [B,1,W]
    dy = torch.arange(h, dtype=torch.float32)[None, :, None] - cf[:, 1, None, None]  # [B,H,1]
    dx, dy = torch.broadcast_tensors(dx, dy)
    mag = torch.hypot(dx, dy)
    ang = torch.remainder(torch.atan2(dy, dx), 2.0 * math.pi)
    col = torch.log(mag + 1.0).double() / (torch.log(r) / wo)[:, None, None]
    row = ang.double() / (2.0 * math.pi / ho)
    return torch.stack([col.float(), row.float() + ANGLE_BORDER], dim=-1).to(device)


def wrap_angle(logpolar: torch.Tensor) -> torch.Tensor:
    """``[B, C, Ho, Wo] -> [B, C, Ho + 2, Wo]``: one row of cyclic padding on each side.

    Angle is periodic: the row above row 0 is row ``Ho - 1``. The inverse LUT addresses this
    padded image (OpenCV pads with ``BORDER_WRAP`` in the same way).
    """
    return torch.cat([logpolar[..., -ANGLE_BORDER:, :], logpolar,
                      logpolar[..., :ANGLE_BORDER, :]], dim=-2)


# ----------------------------------------------------------------------------- sampling

def _choose_backend(backend: str, image: torch.Tensor) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    cpu_float32 = image.device.type == "cpu" and image.dtype == torch.float32
    if backend == "auto":
        return "opencv" if cpu_float32 and not image.requires_grad else "torch"
    if backend == "opencv" and not cpu_float32:
        raise ValueError("backend='opencv' needs a float32 CPU tensor, got "
                         f"{image.dtype} on {image.device.type}; use backend='torch'")
    return backend


def _remap_opencv(image: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """``cv2.remap`` (bilinear, zeros outside) of ``[B, C, H, W]`` by ``[B, Ho, Wo, 2]``.

    Remaps each contiguous ``[H, W]`` plane in place of building an ``[H, W, C]`` copy (the
    copy costs ~10x the remap for a 1024 x 1024 RGB image); a loop over the few planes of a
    small batch, each call a multithreaded OpenCV remap.
    """
    import cv2

    image, lut = image.detach().contiguous(), lut.detach().contiguous()
    b, c = max(image.shape[0], lut.shape[0]), image.shape[1]
    out = image.new_empty(b, c, *lut.shape[1:3])
    for i in range(b):
        src = image[min(i, image.shape[0] - 1)]        # one image may serve many centres
        m = lut[min(i, lut.shape[0] - 1)]
        mx, my = m[..., 0].numpy(), m[..., 1].numpy()
        for k in range(c):
            cv2.remap(src[k].numpy(), mx, my, cv2.INTER_LINEAR, dst=out[i, k].numpy(),
                      borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    return out


def _sample(image: torch.Tensor, lut: torch.Tensor, backend: str) -> torch.Tensor:
    """``[B or 1, C, H, W]`` sampled by ``[B or 1, Ho, Wo, 2]`` -> ``[B, C, Ho, Wo]``."""
    if _choose_backend(backend, image) == "opencv":
        return _remap_opencv(image, lut.cpu())
    from fovea_book.reference_samplers import remap  # torch, cv2.remap semantics
    if lut.shape[0] > image.shape[0]:
        image = image.expand(lut.shape[0], -1, -1, -1)
    return remap(image, lut.to(image.device))


@functools.lru_cache(maxsize=16)
def _cached_lut(fn, center: tuple, *args) -> torch.Tensor:
    return fn(center, *args)


def _cached(fn, c: torch.Tensor, out_size, max_radius, *rest) -> torch.Tensor:
    """``fn(c, out_size, max_radius, *rest)``, memoised for one centre and a scalar radius.

    Building a 256 x 256 LUT costs about as much as sampling with it, and notebooks and
    pipelines call the transform repeatedly with the same fixation and sizes.
    """
    if c.shape[0] == 1 and np.ndim(max_radius) == 0 and not isinstance(max_radius, torch.Tensor):
        return _cached_lut(fn, tuple(c[0].tolist()), tuple(out_size), float(max_radius), *rest)
    return fn(c, out_size, max_radius, *rest)


def _prepare(image, center) -> tuple[torch.Tensor, torch.Tensor]:
    img = as_image_batch(image) if isinstance(image, np.ndarray) else image
    if not isinstance(img, torch.Tensor):
        raise TypeError(f"image must be a torch tensor or numpy array, got {type(image).__name__}")
    img = img[None] if img.ndim == 3 else img
    if img.ndim != 4:
        raise ValueError(f"image must be [C, H, W] or [B, C, H, W], got {tuple(img.shape)}")
    if not img.is_floating_point():
        img = as_image_batch(img)
    c = _as_centers(center)
    if img.shape[0] != c.shape[0] and 1 not in (img.shape[0], c.shape[0]):
        raise ValueError(f"center has {c.shape[0]} rows but image batch is {img.shape[0]}; "
                             "give one centre, one image, or one centre per image")
    return img, c


def to_logpolar(image, center, max_radius, out_size: Sequence[int], *,
                backend: str = "auto") -> torch.Tensor:
    """Resample ``image`` to log-polar about ``center`` (rows = angle, cols = log-radius).

    Args:
        image: ``[B, C, H, W]`` / ``[C, H, W]`` tensor, or a numpy image (see
            :func:`fovea_core.pyramid.as_image_batch`).
        center: ``(x, y)`` or ``[B, 2]`` pixel coordinates inside the image; one image with
            ``B`` centres gives ``B`` outputs.
        max_radius: ``R > 1`` pixels, scalar or ``[B]``.
        out_size: ``(Ho, Wo)`` = (angles, log-radius bins).
        backend: ``"auto"`` (OpenCV for float32 CPU tensors without grad, else torch),
            ``"torch"`` or ``"opencv"``.

    Returns:
        ``[B, C, Ho, Wo]`` float tensor, ``= cv2.warpPolar(..., WARP_POLAR_LOG |
        WARP_FILL_OUTLIERS)`` on the float32 image to float32 rounding (same map, bit for
        bit). This forward direction is the only OpenCV-exact one: see
        :func:`from_logpolar` and the module docstring for the inverse and uint8 images.
    """
    out_size = _as_size(out_size, "out_size")
    img, c = _prepare(image, center)
    _check_in_image(c, tuple(img.shape[-2:]))
    lut = _cached(logpolar_lut, c, out_size, max_radius)
    return _sample(img, lut, backend)


def from_logpolar(logpolar, center, max_radius, out_size: Sequence[int], *,
                  backend: str = "auto") -> torch.Tensor:
    """Map a log-polar image ``[B, C, Ho, Wo]`` back to a Cartesian ``[B, C, H, W]`` image.

    ``out_size = (H, W)``; ``center`` and ``max_radius`` are the forward transform's.
    Pixels farther than ``max_radius - 1`` from the centre are zero. Same backends as
    :func:`to_logpolar`.

    Not OpenCV-exact: ``cv2.warpPolar(..., WARP_INVERSE_MAP)`` approximates the angle
    (``cv::cartToPolar``, about 0.3 deg) where this uses ``atan2``, so the two differ by up to
    ``e * Ho / (2 pi)`` rows of the log-polar image for an angle error ``e`` (the bound the
    tests use).
    """
    out_size = _as_size(out_size, "out_size")
    lp, c = _prepare(logpolar, center)
    lut = _cached(inverse_logpolar_lut, c, out_size, max_radius, tuple(lp.shape[-2:]))
    return _sample(wrap_angle(lp), lut, backend)


def expected_shift(out_size: Sequence[int], max_radius: float, *, scale: float = 1.0,
                   angle: float = 0.0) -> tuple[float, float]:
    """``(d_rows, d_cols)`` by which the log-polar image moves under a similarity transform.

    Scaling the image by ``scale`` about the centre moves content from radius ``r`` to
    ``scale * r``: ``d_cols = ln(scale) * Wo / ln(R)`` (exact for ``log r``; OpenCV's
    ``log(r + 1)`` makes it approximate for ``r`` of a few pixels). Rotating by ``angle``
    radians in the direction of increasing row (from +x towards +y, i.e. clockwise on screen
    with y down) gives the cyclic shift ``d_rows = angle * Ho / (2 pi)`` [Schwartz 1980].
    """
    ho, wo = _as_size(out_size, "out_size")
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    r = float(_as_radii(max_radius, 1)[0])
    return angle * ho / (2.0 * math.pi), math.log(scale) * wo / math.log(r)
