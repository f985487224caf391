"""The reader: a real OCR model applied to the answer region of a (reconstructed) page.

An external judge of legibility: `rapidocr` [PaddleOCR PP-OCR recognition model, shipped
as ONNX inside the wheel] reads a crop around each line of the answer; tesseract is used
only when it is installed and asked for. The reader is told *where* the answer is (the
answer box, with a margin), so it measures whether the text survived the token budget,
not whether a model could find it: an oracle-localised legibility proxy, not VLM accuracy.

Results are cached in a SQLite file under ``data/cache/reader/`` (one file per reader id),
keyed by the SHA-1 of the crop's pixels *and* of the reader's fingerprint
(:func:`reader_versions`: the OCR library versions and the identity of the recognition model),
so re-running a sweep costs only the allocators, and a library or model upgrade never
reuses text read by the old one.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import shutil
import sqlite3
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fovea_core.paths import file_digest, project_root
from fovea_core.pyramid import Pyramid
from fovea_core.sample import _KEY_TOKEN_BITS, sample  # render's priority-key layout
from fovea_core.tokens import LEVEL_QUANTUM, TokenSet

Box = tuple[int, int, int, int]


def default_cache_dir() -> Path:
    """``<project>/data/cache/reader`` (git-ignored)."""
    return project_root() / "data" / "cache" / "reader"


def to_uint8(image: np.ndarray) -> np.ndarray:
    """``[H, W, 3]`` (or ``[H, W]``) float in [0, 1] or uint8 -> contiguous uint8 RGB."""
    img = np.asarray(image)
    if img.dtype != np.uint8:
        img = (np.clip(img, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    if img.ndim == 2:
        img = np.repeat(img[:, :, None], 3, axis=2)
    if img.ndim != 3 or img.shape[2] not in (1, 3):
        raise ValueError(f"image must be [H, W] or [H, W, 3], got {img.shape}")
    if img.shape[2] == 1:
        img = np.repeat(img, 3, axis=2)
    return np.ascontiguousarray(img)


def crop_box(image: np.ndarray, box: Box, margin: float = 0.3, min_margin: int = 3
             ) -> np.ndarray:
    """Crop ``box = (x0, y0, x1, y1)`` expanded by ``margin * box height`` (>= ``min_margin``
    px) on every side, clipped to the image; ``[h, w, C]``."""
    h, w = image.shape[:2]
    x0, y0, x1, y1 = (int(v) for v in box)
    if x1 <= x0 or y1 <= y0:
        raise ValueError(f"box must have x1 > x0 and y1 > y0, got {box}")
    m = max(min_margin, int(round(margin * (y1 - y0))))
    return image[max(0, y0 - m):min(h, y1 + m), max(0, x0 - m):min(w, x1 + m)]


class _Cache:
    """A tiny thread-safe key -> text store in SQLite (one file per reader id)."""

    def __init__(self, path: Path | None):
        self.path, self._lock, self._conn = path, threading.Lock(), None
        self.hits = self.misses = 0

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(self.path, timeout=60, check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("CREATE TABLE IF NOT EXISTS ocr (key TEXT PRIMARY KEY, text TEXT)")
        return self._conn

    def get(self, key: str) -> str | None:
        if self.path is None:
            return None
        with self._lock:
            row = self._db().execute("SELECT text FROM ocr WHERE key = ?", (key,)).fetchone()
        self.hits += row is not None
        self.misses += row is None
        return None if row is None else row[0]

    def put(self, key: str, text: str) -> None:
        if self.path is None:
            return
        with self._lock:
            db = self._db()
            db.execute("INSERT OR REPLACE INTO ocr VALUES (?, ?)", (key, text))
            db.commit()

    def __getstate__(self):  # connections do not pickle (dask workers reopen the file)
        return {"path": self.path}

    def __setstate__(self, state):
        self.__init__(state["path"])


@functools.lru_cache(maxsize=2)
def _rapidocr_engine(threads: int):
    from rapidocr import RapidOCR

    return RapidOCR(params={"Global.use_det": False, "Global.use_cls": False,
                            "Global.log_level": "error",
                            "EngineConfig.onnxruntime.intra_op_num_threads": threads})


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


@functools.lru_cache(maxsize=4)
def reader_versions(engine: str) -> tuple[tuple[str, str], ...]:
    """What the OCR output of ``engine`` depends on besides the pixels, as sorted
    ``(name, value)`` pairs: library versions and the recognition model's identity.

    * ``"rapidocr"``: the ``rapidocr``, ``onnxruntime`` and ``opencv-python-headless``
      versions, the recognition model's file name and SHA-1 (the ONNX file the engine
      loaded from inside the wheel) and its input shape;
    * ``"tesseract"``: the first line of ``tesseract --version``.

    Computed once per process (loading the engine if needed). Part of every cache key of
    :class:`Reader`.
    """
    if engine == "rapidocr":
        rec = _rapidocr_engine(1)._load_rec_model()
        path = getattr(getattr(rec.session, "session", None), "_model_path", None)
        if path is None:   # fall back to every recognition model shipped with the wheel
            root = Path(rec.cfg.model_root_dir)
            files = sorted(root.glob("*rec*.onnx"))
            model = ",".join(f"{f.name}:{file_digest(f, 'sha1')}" for f in files)
        else:
            model = f"{Path(path).name}:{file_digest(path, 'sha1')}"
        return tuple(sorted({
            "rapidocr": _dist_version("rapidocr"),
            "onnxruntime": _dist_version("onnxruntime"),
            "opencv": _dist_version("opencv-python-headless"),
            "rec_model": model,
            "rec_input": str(list(rec.rec_image_shape)),
        }.items()))
    res = subprocess.run(["tesseract", "--version"], capture_output=True, check=False)
    out = (res.stdout or res.stderr).decode("utf-8", "replace").splitlines()
    return (("tesseract", out[0].strip() if out else "unknown"),)


class Reader:
    """OCR of single text lines, cached by crop hash.

    Args:
        engine: ``"rapidocr"`` (default; recognition model only, ~35-100 ms per line crop
            on a CPU) or ``"tesseract"`` (only if the ``tesseract`` binary is installed).
        cache_dir: folder for the SQLite cache; ``None`` disables caching.
        threads: ONNX Runtime intra-op threads for rapidocr (-1 = library default).
        margin: crop margin as a fraction of the line height (see :func:`crop_box`).
    """

    ENGINES = ("rapidocr", "tesseract")

    def __init__(self, engine: str = "rapidocr", *, cache_dir: str | Path | None = "default",
                 threads: int = 1, margin: float = 0.3):
        if engine not in self.ENGINES:
            raise ValueError(f"engine must be one of {self.ENGINES}, got {engine!r}")
        if engine == "tesseract" and shutil.which("tesseract") is None:
            raise ValueError("engine='tesseract' needs the tesseract binary (apt tesseract-ocr); "
                             "use engine='rapidocr'")
        self.engine, self.threads, self.margin = engine, int(threads), float(margin)
        if cache_dir == "default":
            cache_dir = default_cache_dir()
        self.id = f"{engine}-m{self.margin:g}"
        self.cache = _Cache(None if cache_dir is None else Path(cache_dir) / f"{self.id}.sqlite")

    @property
    def versions(self) -> dict[str, str]:
        """Library versions and model identity of this reader (:func:`reader_versions`)."""
        return dict(reader_versions(self.engine))

    @property
    def fingerprint(self) -> str:
        """SHA-1 of :attr:`versions`: the part of every cache key that is not pixels."""
        text = "|".join(f"{k}={v}" for k, v in reader_versions(self.engine))
        return hashlib.sha1(text.encode()).hexdigest()

    def _recognise(self, crop: np.ndarray) -> str:
        if self.engine == "rapidocr":
            out = _rapidocr_engine(self.threads)(crop, use_det=False, use_cls=False, use_rec=True)
            return " ".join(t for t in (out.txts or ()) if t).strip()
        import cv2

        ok, png = cv2.imencode(".png", cv2.cvtColor(crop, cv2.COLOR_RGB2BGR))
        res = subprocess.run(["tesseract", "stdin", "stdout", "--psm", "7"], input=png.tobytes(),
                             capture_output=True, check=False)
        return res.stdout.decode("utf-8", "replace").strip()

    def read_crop(self, crop: np.ndarray) -> str:
        """Text of one line crop ``[h, w, 3]`` (uint8 or float in [0, 1])."""
        crop = to_uint8(crop)
        if crop.shape[0] < 2 or crop.shape[1] < 2:
            return ""
        key = hashlib.sha1(self.fingerprint.encode() + np.asarray(crop.shape, np.int64).tobytes()
                           + crop.tobytes()).hexdigest()
        text = self.cache.get(key)
        if text is None:
            text = self._recognise(crop)
            self.cache.put(key, text)
        return text

    def read(self, image: np.ndarray, boxes: Sequence[Box]) -> str:
        """Read each line box of an answer from ``image [H, W, 3]``; lines joined by spaces.

        Only the crops are converted to uint8 (:meth:`read_crop`), never the whole page:
        a float page of 1024 x 1024 would cost ~25 ms per conversion and question."""
        img = np.asarray(image)
        texts = [self.read_crop(crop_box(img, b, self.margin)) for b in boxes]
        return " ".join(t for t in texts if t)


def crop_window(box: tuple[int, int, int, int], size: tuple[int, int], margin: float,
                min_margin: int = 3) -> tuple[int, int, int, int]:
    """``(y0, y1, x0, x1)`` of :func:`fovea_core.eval.reader.crop_box`'s crop of ``box``."""
    h, w = size
    bx0, by0, bx1, by1 = (int(v) for v in box)
    m = max(min_margin, int(round(margin * (by1 - by0))))
    return max(0, by0 - m), min(h, by1 + m), max(0, bx0 - m), min(w, bx1 + m)


def tokens_over(tokens: TokenSet, windows: Sequence[tuple[int, int, int, int]]) -> torch.Tensor:
    """``[N]`` bool: tokens of image 0 whose footprint meets one of the ``(y0, y1, x0, x1)``
    windows (only those can paint a window's pixels)."""
    b = tokens.boxes()[0]                                                  # [N, 4]
    w = torch.as_tensor(windows, dtype=b.dtype).reshape(-1, 4)             # [K, 4]
    meet = ((b[:, None, 0] < w[None, :, 3]) & (b[:, None, 2] > w[None, :, 2])
            & (b[:, None, 1] < w[None, :, 1]) & (b[:, None, 3] > w[None, :, 0]))
    return meet.any(1)


def subset(tokens: TokenSet, keep: torch.Tensor) -> TokenSet:
    """The tokens of image 0 where ``keep`` (order kept, so render's tie rule -- the lowest
    index wins -- picks the same token)."""
    return TokenSet(tokens.centers[:1, keep], tokens.levels[:1, keep], tokens.scores[:1, keep],
                    tokens.fixations[:1], tokens.image_size, tokens.patch,
                    None if tokens.stage is None else tokens.stage[:1, keep])


def read_answer(reader: Reader, pyramid: Pyramid, tokens: TokenSet,
                patches: torch.Tensor | None, boxes: Sequence[tuple[int, int, int, int]]) -> str:
    """What :meth:`Reader.read` returns on the reconstruction for an answer's ``boxes``,
    rendering only the crops it reads. ``patches``: the sampled patches of all tokens, or
    ``None`` to sample only the tokens that meet the crops (what a crop needs)."""
    wins = [crop_window(bx, tokens.image_size, reader.margin) for bx in boxes]
    wins = [w for w in wins if w[1] > w[0] and w[3] > w[2]]
    if patches is None and wins:
        keep = tokens_over(tokens, wins)
        if not bool(keep.any()):
            keep[0] = True                                  # background only; one dummy token
        tokens = subset(tokens, keep)
        patches = sample(pyramid, tokens)
    texts = []
    for win in wins:                                        # one line crop per box
        crop = render_window(tokens, patches, win, pyramid)[0].permute(1, 2, 0)
        texts.append(reader.read_crop(to_uint8(crop.clamp(0, 1).numpy())))
    return " ".join(t for t in texts if t)


# ----------------------------------------------------------------------------- crops of a render
def _background_window(top: torch.Tensor, size: tuple[int, int], window: tuple[int, int, int, int]
                       ) -> torch.Tensor:
    """Rows ``y0:y1``, columns ``x0:x1`` of ``F.interpolate(top, size, "bilinear",
    align_corners=False)`` ``[B, C, y1-y0, x1-x0]``, computed only there (same source
    coordinates ``(i + .5) in / out - .5`` clamped at 0, same weights; equal up to float
    rounding)."""
    y0, y1, x0, x1 = window
    hb, wb = top.shape[-2:]
    h, w = size

    def axis(i0: int, i1: int, n_in: int, n_out: int):
        scale = n_in / n_out
        src = ((torch.arange(i0, i1, dtype=torch.float32) + 0.5) * scale - 0.5).clamp(min=0)
        lo = src.floor().long().clamp(max=n_in - 1)
        hi = (lo + 1).clamp(max=n_in - 1)
        lam = (src - lo.float()).clamp(0, 1)
        return lo, hi, lam

    ylo, yhi, ly = axis(y0, y1, hb, h)
    xlo, xhi, lx = axis(x0, x1, wb, w)
    rows = top[:, :, ylo] * (1 - ly)[:, None] + top[:, :, yhi] * ly[:, None]     # [B,C,h',wb]
    return rows[..., xlo] * (1 - lx) + rows[..., xhi] * lx


def render_window(tokens: TokenSet, patches: torch.Tensor, window: tuple[int, int, int, int],
                  background: Pyramid) -> torch.Tensor:
    """The window ``(y0, y1, x0, x1)`` (base pixels) of
    ``render(tokens, patches, background=background)`` at the page's size:
    ``[B, C, y1 - y0, x1 - x0]``.

    The same painting rule as :func:`fovea_core.sample.render`, evaluated only on the
    window's pixels: each token's footprint is intersected with the window, every (token,
    pixel) pair of the intersection is enumerated (``repeat_interleave``), the finest level
    (then the lowest token index) wins per pixel (``scatter_reduce(amin)``), and the winner's
    sample is the one whose sub-square holds the pixel centre. Work ``O(window area x
    overlapping footprints)`` instead of ``O(page area)``.
    """
    b, n, c, p, _ = patches.shape
    h, w = tokens.image_size
    y0, y1, x0, x1 = (int(v) for v in window)
    if not (0 <= y0 < y1 <= h and 0 <= x0 < x1 <= w):
        raise ValueError(f"window must lie in the page {h}x{w}, got {window}")
    hw, ww = y1 - y0, x1 - x0
    out = _background_window(background.levels[-1].to(patches.dtype), (h, w), window)
    step = torch.exp2(tokens.levels).flatten()                            # [B*N]
    half = p * step / 2
    cx, cy = tokens.centers[..., 0].flatten() * w, tokens.centers[..., 1].flatten() * h
    tx0, ty0 = cx - half, cy - half
    # covered page pixels (as in render, output scale 1), intersected with the window
    j0 = torch.ceil(tx0 * 1.0 - 0.5).clamp(0, w).long().clamp(x0, x1)
    j1 = torch.ceil((cx + half) * 1.0 - 0.5).clamp(0, w).long().clamp(x0, x1)
    i0 = torch.ceil(ty0 * 1.0 - 0.5).clamp(0, h).long().clamp(y0, y1)
    i1 = torch.ceil((cy + half) * 1.0 - 0.5).clamp(0, h).long().clamp(y0, y1)
    nx = (j1 - j0).clamp(min=0)
    cnt = nx * (i1 - i0).clamp(min=0)
    img = torch.arange(b).repeat_interleave(n)
    start = (img * hw + (i0 - y0)) * ww + (j0 - x0)
    lq = torch.round(tokens.levels.flatten() * LEVEL_QUANTUM).long()
    tkey = lq * 2**_KEY_TOKEN_BITS + torch.arange(n).repeat(b)
    owner = torch.repeat_interleave(torch.arange(b * n), cnt)
    sel = lambda t: t.index_select(0, owner)                            # noqa: E731
    off = torch.arange(owner.numel()) - sel(torch.cumsum(cnt, 0) - cnt)
    rowlen = sel(nx.clamp(min=1))
    r = torch.div(off, rowlen, rounding_mode="floor")
    pix = sel(start) + r * ww + (off - r * rowlen)
    best = torch.full((b * hw * ww,), torch.iinfo(torch.int64).max, dtype=torch.int64)
    best.scatter_reduce_(0, pix, sel(tkey), reduce="amin", include_self=True)
    hit = (best != torch.iinfo(torch.int64).max).nonzero().squeeze(1)
    win = best.index_select(0, hit) % 2**_KEY_TOKEN_BITS
    pb = torch.div(hit, hw * ww, rounding_mode="floor")
    rem = hit - pb * (hw * ww)
    prow = torch.div(rem, ww, rounding_mode="floor") + y0
    pcol = rem - (prow - y0) * ww + x0
    flat = pb * n + win
    stp = step.index_select(0, flat)
    kx = torch.floor(((pcol.float() + 0.5) / 1.0 - tx0.index_select(0, flat)) / stp)
    ky = torch.floor(((prow.float() + 0.5) / 1.0 - ty0.index_select(0, flat)) / stp)
    src = (flat * p + ky.long().clamp(0, p - 1)) * p + kx.long().clamp(0, p - 1)
    vals = patches.permute(0, 1, 3, 4, 2).reshape(-1, c).index_select(0, src)
    flat_out = out.permute(0, 2, 3, 1).reshape(-1, c).clone()
    flat_out.index_copy_(0, hit, vals.to(flat_out.dtype))
    return flat_out.reshape(b, hw, ww, c).permute(0, 3, 1, 2).contiguous()
