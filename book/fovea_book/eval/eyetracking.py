"""Human eye-tracking data: the OSIE loader, fixation maps and scanpath JSON reader.

OSIE (Xu, Jiang, Wang, Kankanhalli & Zhao 2014, "Predicting human gaze beyond pixels",
Journal of Vision 14(1):28): 700 natural images of 800x600 pixels, free viewing for 3 s,
15 observers per image. The release's ``eye/fixations.mat`` holds, per image, the file
name and per subject ``fix_x``, ``fix_y`` (pixels, **1-based**, MATLAB convention) and
``fix_duration`` (ms).

Coordinates here follow :mod:`fovea_core.tokens`: continuous pixel coordinates, pixel ``i``
spans ``[i, i + 1)``. A 1-based MATLAB coordinate ``x`` (pixel ``x`` has its centre at
``x``) becomes ``x - 0.5``; its pixel index is ``floor(x - 0.5) = round(x) - 1``, exactly the
pixel the reference code ``computeFixationMaps.m`` marks.

Blur and visual angle. Fixation *density* maps blur the fixations with a Gaussian of
:data:`FIXATION_BLUR_DEG` = 1 degree of visual angle, the convention of the MIT benchmark
(Judd et al. 2009; Bylinskii et al. 2018: fixations blurred by a Gaussian of about one degree),
reflecting foveal extent and eye-tracker error. **Assumption**: OSIE at
:data:`OSIE_PIXELS_PER_DEGREE` = 24 px/deg. Basis: the OSIE release's own configuration
(``src/common/config.m``: ``params.eye.radius = 24``) blurs its fixation maps with a
Gaussian of sigma 24 px (``computeFixationMaps.m``); we take that to be the conventional
1-degree blur. The paper's display geometry (screen size, viewing distance) is not
re-derived here; change the constant if you know better.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy import ndimage

#: Blur of human fixation density maps, degrees of visual angle (MIT benchmark convention).
FIXATION_BLUR_DEG: float = 1.0
#: Pixels per degree assumed for OSIE (sigma = 24 px in the OSIE release's config.m).
OSIE_PIXELS_PER_DEGREE: float = 24.0
#: OSIE stimulus size ``(H, W)``.
OSIE_IMAGE_SIZE: tuple[int, int] = (600, 800)


@dataclass(frozen=True)
class FixationRecord:
    """The human fixations on one image.

    Attributes:
        image: file name, e.g. ``"1010.jpg"``.
        path: full path of the stimulus.
        size: ``(H, W)`` of the stimulus in pixels.
        subjects: one float64 array ``[K_s, 3]`` per observer: ``(x, y, duration_ms)``, x and
            y continuous 0-based pixel coordinates (may lie slightly outside the image).
    """

    image: str
    path: Path
    size: tuple[int, int]
    subjects: tuple[np.ndarray, ...] = field(repr=False)

    @property
    def num_subjects(self) -> int:
        return len(self.subjects)

    def points(self, subjects: np.ndarray | list[int] | None = None) -> np.ndarray:
        """Fixations ``[K, 2]`` (x, y) of the chosen observers (default: all), in order."""
        idx = range(self.num_subjects) if subjects is None else subjects
        chosen = [self.subjects[int(i)][:, :2] for i in idx]
        return np.concatenate(chosen) if chosen else np.zeros((0, 2))


def _subject_array(sub: object) -> np.ndarray:
    """One MATLAB subject record -> ``[K, 3]`` (x0, y0, duration); handles K = 0 and 1."""
    x, y, d = (np.atleast_1d(np.asarray(getattr(sub, k), dtype=np.float64))
               for k in ("fix_x", "fix_y", "fix_duration"))
    if not (x.size == y.size == d.size):
        raise ValueError(f"fix_x, fix_y, fix_duration lengths differ: {x.size}, {y.size}, {d.size}")
    return np.stack([x - 0.5, y - 0.5, d], axis=1)


def load_osie(root: str | Path, *, max_images: int | None = None,
              empty_subjects: str = "error") -> list[FixationRecord]:
    """Read an OSIE folder (``stimuli/*.jpg``, ``eye/fixations.mat``).

    Only the records whose stimulus file is present are returned (the development subset
    holds 70 of the 700 images), sorted by file name.

    Args:
        root: the dataset folder, e.g. ``fovea_book.paths.dataset_path("osie-dev")``.
        max_images: keep the first ``max_images`` records (``>= 1``); default all.
        empty_subjects: what to do with an observer who has no fixation on an image:
            ``"error"`` (default: such a record would silently shrink a half of the
            observers), ``"drop"`` (leave the observer out of that image's record) or
            ``"keep"`` (a ``[0, 3]`` array).

    Raises:
        FileNotFoundError: the folder lacks ``eye/fixations.mat`` or ``stimuli/``.
        ValueError: ``max_images < 1``; an observer without fixations (the message names
            the image and the observer) when ``empty_subjects="error"``.
    """
    from PIL import Image
    from scipy.io import loadmat

    root = Path(root)
    mat, stim = root / "eye" / "fixations.mat", root / "stimuli"
    if not mat.is_file() or not stim.is_dir():
        raise FileNotFoundError(f"{root} is not an OSIE folder (needs eye/fixations.mat and "
                                "stimuli/)")
    if max_images is not None and max_images < 1:
        raise ValueError(f"max_images must be >= 1 or None, got {max_images}")
    if empty_subjects not in ("error", "drop", "keep"):
        raise ValueError(f"empty_subjects must be 'error', 'drop' or 'keep', got "
                         f"{empty_subjects!r}")
    present = {p.name for p in stim.glob("*.jpg")}
    recs = np.atleast_1d(loadmat(mat, squeeze_me=True, struct_as_record=False)["fixations"])
    chosen = sorted((r for r in recs if str(r.img) in present), key=lambda r: str(r.img))
    out = []
    for r in chosen[:max_images]:  # loop over images
        path = stim / str(r.img)
        with Image.open(path) as im:
            w, h = im.size
        subs = tuple(_subject_array(s) for s in np.atleast_1d(r.subjects))
        empty = [i for i, s in enumerate(subs) if len(s) == 0]
        if empty and empty_subjects == "error":
            raise ValueError(f"image {r.img}: observer(s) {empty} have no fixations (pass "
                             "empty_subjects='drop' or 'keep' to load them anyway)")
        if empty_subjects == "drop":
            subs = tuple(s for s in subs if len(s))
        out.append(FixationRecord(str(r.img), path, (h, w), subs))
    return out


def check_image_size(record: FixationRecord, image: np.ndarray) -> None:
    """Raise ``ValueError`` (naming the image) if ``image`` (``[H, W]``, ``[H, W, C]`` or
    ``[C, H, W]`` with C in 1, 3, 4) is not of the record's size ``(H, W)``: fixations are
    pixel coordinates of the image the observers saw, so a resized image would misplace them.
    """
    shape = tuple(np.shape(image))
    if len(shape) == 2:
        hw = shape
    elif len(shape) == 3:
        hw = shape[1:] if shape[0] in (1, 3, 4) and shape[-1] not in (1, 3, 4) else shape[:2]
    else:
        raise ValueError(f"image {record.image}: expected [H, W] or [H, W, C], got shape {shape}")
    if tuple(hw) != tuple(record.size):
        raise ValueError(f"image {record.image}: the image is {hw[0]}x{hw[1]} (H x W) but its "
                         f"fixation record is for {record.size[0]}x{record.size[1]}; resize "
                         "the fixations, not the image")


# --------------------------------------------------------------------- maps
def _check_shape(shape: tuple[int, int]) -> tuple[int, int]:
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f"shape must be (H, W) with H, W >= 1, got {shape}")
    return int(shape[0]), int(shape[1])


def _pixel_index(points: np.ndarray, shape: tuple[int, int], scale: float) -> np.ndarray:
    """Continuous (x, y) -> clipped integer (row, col) ``[K, 2]`` on a grid ``scale`` x finer."""
    p = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    if not np.isfinite(p).all():
        raise ValueError("points must be finite")
    h, w = shape
    col = np.clip(np.floor(p[:, 0] * scale), 0, w - 1).astype(np.int64)
    row = np.clip(np.floor(p[:, 1] * scale), 0, h - 1).astype(np.int64)
    return np.stack([row, col], axis=1)


def fixation_counts(points: np.ndarray, shape: tuple[int, int], *, scale: float = 1.0
                    ) -> np.ndarray:
    """Number of fixations per pixel, float64 ``[H, W]``.

    Args:
        points: ``[K, 2]`` (x, y) continuous pixel coordinates of the original image.
        shape: ``(H, W)`` of the output grid.
        scale: output pixels per input pixel (0.5 = half resolution). Fixations outside the
            image are clipped onto the border pixel, as ``computeFixationMaps.m`` does.
    """
    h, w = _check_shape(shape)
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    rc = _pixel_index(points, (h, w), scale)
    counts = np.bincount(rc[:, 0] * w + rc[:, 1], minlength=h * w).astype(np.float64)
    return counts.reshape(h, w)


def fixation_map(points: np.ndarray, shape: tuple[int, int], *, scale: float = 1.0
                 ) -> np.ndarray:
    """Binary fixation map ``[H, W]`` (bool): the pixels that hold at least one fixation."""
    return fixation_counts(points, shape, scale=scale) > 0


def fixation_density(points: np.ndarray, shape: tuple[int, int], *, sigma_px: float,
                     scale: float = 1.0, image: str | None = None) -> np.ndarray:
    """Fixation density ``[H, W]``: counts blurred by a Gaussian, normalised to sum 1.

    Zero padding at the borders (as ``imfilter(map, G, 0)`` in the OSIE code), kernel
    truncated at 3.5 sigma (the reference window is ``7 sigma`` wide). Every fixation
    counts (not only distinct pixels), so a spot fixated by many observers weighs more.

    Args:
        points: ``[K, 2]`` (x, y) in pixels of the original image.
        shape: output ``(H, W)``.
        sigma_px: Gaussian sigma in *output* pixels, ``> 0`` (e.g.
            ``FIXATION_BLUR_DEG * OSIE_PIXELS_PER_DEGREE * scale``).
        scale: output pixels per input pixel.
        image: the image's name, for the error message.

    Raises:
        ValueError: no fixation (an empty map is no density; the message names ``image``).
    """
    if not sigma_px > 0:
        raise ValueError(f"sigma_px must be > 0, got {sigma_px}")
    if len(np.asarray(points).reshape(-1, 2)) == 0:
        raise ValueError(f"image {image or '(unnamed)'}: no fixations, the fixation map is "
                         "empty (a density needs at least one)")
    counts = fixation_counts(points, shape, scale=scale)
    d = ndimage.gaussian_filter(counts, sigma_px, mode="constant", truncate=3.5)
    return d / d.sum()


def split_subjects(num_subjects: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Random split of observers ``0..S-1`` into two halves (sizes ``floor(S/2)``, ``ceil``).

    Used for the inter-observer ceiling: one half's density predicts the other half's
    fixations (the inter-observer or human baseline of Bylinskii et al. 2018).
    """
    if num_subjects < 2:
        raise ValueError(f"num_subjects must be >= 2 to split, got {num_subjects}")
    perm = rng.permutation(num_subjects)
    return np.sort(perm[: num_subjects // 2]), np.sort(perm[num_subjects // 2:])


# --------------------------------------------------------------------- scanpath JSON
@dataclass(frozen=True)
class Scanpath:
    """One observer's fixation sequence on one image (COCO-Search18 style).

    Attributes:
        name: image file name.
        subject: observer id.
        task: search target category (``""`` for free viewing).
        condition: ``"present"`` / ``"absent"`` / ``""``.
        xy: ``[K, 2]`` float64 (x, y) continuous 0-based pixel coordinates, in fixation order.
        duration: ``[K]`` float64 fixation durations (ms).
    """

    name: str
    subject: int
    task: str
    condition: str
    xy: np.ndarray = field(repr=False)
    duration: np.ndarray = field(repr=False)


def read_scanpaths_json(path: str | Path, *, one_based: bool = False) -> list[Scanpath]:
    """Read a COCO-Search18-style JSON scanpath file.

    The file is a list of records with ``name``, ``subject``, ``X``, ``Y``, ``T`` (durations,
    ms) and optionally ``task``, ``condition`` and ``length`` (= ``len(X)``; checked when
    present), as released by Chen et al. (2021), "COCO-Search18 fixation dataset for
    predicting goal-directed attention control", Scientific Reports 11:8776. Other keys
    (``bbox``, ``split``, ``RT``, ...) are ignored.

    Args:
        path: the JSON file.
        one_based: the coordinates are 1-based pixel coordinates (as OSIE's); they are
            shifted to this module's convention. COCO-Search18 coordinates are taken as
            continuous 0-based pixel positions (the default).

    Raises:
        ValueError: a record lacks a key or has ``X``, ``Y``, ``T`` of different lengths;
            the message gives the record index.
    """
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of scanpath records, got "
                         f"{type(data).__name__}")
    shift = 0.5 if one_based else 0.0
    out = []
    for i, rec in enumerate(data):  # loop over records (observer x image), not fixations
        missing = [k for k in ("name", "subject", "X", "Y", "T") if k not in rec]
        if missing:
            raise ValueError(f"{path}: record {i} lacks {missing}")
        x, y, t = (np.asarray(rec[k], dtype=np.float64).reshape(-1) for k in ("X", "Y", "T"))
        if not (x.size == y.size == t.size):
            raise ValueError(f"{path}: record {i} has len(X), len(Y), len(T) = "
                             f"{x.size}, {y.size}, {t.size}; they must be equal")
        if "length" in rec and int(rec["length"]) != x.size:
            raise ValueError(f"{path}: record {i} has length {rec['length']} but {x.size} "
                             "fixations")
        out.append(Scanpath(str(rec["name"]), int(rec["subject"]), str(rec.get("task", "")),
                            str(rec.get("condition", "")), np.stack([x - shift, y - shift], 1), t))
    return out


def scanpath_points(scanpaths: list[Scanpath], name: str) -> np.ndarray:
    """All fixations ``[K, 2]`` on image ``name`` over every observer (empty if none)."""
    xy = [s.xy for s in scanpaths if s.name == name]
    return np.concatenate(xy) if xy else np.zeros((0, 2))


# --------------------------------------------------------------------- evaluation protocol
def score_against_half_splits(record: FixationRecord, maps: dict[str, np.ndarray],
                              other_fixations: np.ndarray, *, scale: float, sigma_px: float,
                              n_splits: int, rng: np.random.Generator,
                              ceiling_name: str = "inter-observer") -> list[dict]:
    """Score predicted maps and the human ceiling against the same held-out observers.

    For each of ``n_splits`` random halvings of the observers (:func:`split_subjects`),
    the *target* is half B: its fixation density (blur ``sigma_px``) for CC, SIM and KL and
    its binary fixation map for NSS, AUC-Judd and sAUC. Every map in ``maps`` and the
    density of half A (the inter-observer ceiling, the human baseline of
    Bylinskii et al. 2018) are scored against it with
    :func:`fovea_book.eval.saliency_metrics.all_metrics`. Scoring models and ceiling on
    the same targets keeps the comparison like for like (the half-observer target is
    noisier than the 15-observer one, so all scores are lower than against all observers).

    Args:
        record: the image's fixations.
        maps: name -> predicted map ``[H, W]`` at the evaluation grid (non-negative).
        other_fixations: ``[H, W]`` fixation counts of the other images (the sAUC
            negatives, :func:`fixation_counts` summed over them; a binary map counts each
            pixel once).
        scale: evaluation pixels per image pixel; sigma_px: target blur in evaluation pixels.
        n_splits: number of random halvings (``>= 1``); rng: their random generator.

    Returns:
        One dict per (split, map): ``image``, ``split``, ``model`` and the six metrics.

    Raises:
        ValueError: a map's shape differs from ``other_fixations``'; a half of the observers
            has no fixation, or ``other_fixations`` is empty (each names the image).
    """
    from fovea_book.eval.saliency_metrics import all_metrics

    if n_splits < 1:
        raise ValueError(f"n_splits must be >= 1, got {n_splits}")
    shape = other_fixations.shape
    bad = {k: np.shape(v) for k, v in maps.items() if np.shape(v) != shape}
    if bad:
        raise ValueError(f"image {record.image}: maps {bad} differ from the evaluation grid "
                         f"{shape}")
    if not np.asarray(other_fixations).any():
        raise ValueError(f"image {record.image}: other_fixations is empty (the shuffled AUC "
                         "needs the other images' fixations as negatives)")
    names = list(maps) + [ceiling_name]
    rows = []
    for split in range(n_splits):  # a handful of random halvings
        a, b = split_subjects(record.num_subjects, rng)
        pts_a, pts_b = record.points(a), record.points(b)
        stack = np.stack([*maps.values(), fixation_density(
            pts_a, shape, sigma_px=sigma_px, scale=scale, image=record.image)])
        m = len(names)
        dens_b = np.broadcast_to(fixation_density(pts_b, shape, sigma_px=sigma_px,
                                                  scale=scale, image=record.image), (m, *shape))
        fix_b = np.broadcast_to(fixation_map(pts_b, shape, scale=scale), (m, *shape))
        other = np.broadcast_to(other_fixations, (m, *shape))
        res = all_metrics(stack, dens_b, fix_b, other)
        rows += [{"image": record.image, "split": split, "model": n,
                  **{k: float(v[i]) for k, v in res.items()}} for i, n in enumerate(names)]
    return rows
