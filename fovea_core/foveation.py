"""One call from a page (and a question) to what a VLM should see: :func:`foveate`.

The book wires the stages in notebook cells (chapters 07 and 14.5); this module is the same
wiring as a single function, for a researcher's own pages::

    image --load_image--> [1, C, H, W] --build_pyramid--> Pyramid
          --score(scorer, question)--> [1, Gh, Gw]         (methods that read a score map)
          --allocate(method, budget, query=question)--> TokenSet (exactly N tokens)
    TokenSet --sample--> patches [1, N, C, p, p] --render--> view [C, H, W]

``method`` is any name of :func:`method_names` (default :data:`DEFAULT_METHOD`). Methods
that rank a score map get ``scorer="saliency"`` without a question and the query-aware
``"query_saliency"`` with one (an OCR of the half-resolution page, outside the budget:
chapter 07), unless ``scorer=`` says otherwise. The cost record (:class:`Cost`) follows the
one cost rule the book's evaluator uses too (:func:`fovea_core.cost.method_cost`), so a page
foveated here is labelled as the book's tables label it.
"""

from __future__ import annotations

import inspect
import math
import time
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fovea_core.allocators.base import DEFAULT_BUDGET
from fovea_core.pyramid import Pyramid, as_image_batch, build_pyramid
from fovea_core.tokens import TokenSet

__all__ = ["Cost", "Foveation", "FoveateWarning", "ImageTooLargeError", "ImageDecodeError",
           "NotAFileError", "DEFAULT_METHOD",
           "foveate", "load_image", "method_names", "method_summary", "uses_question",
           "check_method", "check_options", "check_regular_file", "check_text",
           "unused_options", "plot_foveation"]

#: the method :func:`foveate` runs by default: chapter 14.7's read-then-look cascade under the
#: glance rule (:func:`~fovea_core.cascade.reading.cascade_glance`: the whole page at most of
#: N, read by the core's OCR, the rest of N where the reading points), the one budgeted
#: method of chapter 14.8 whose carry-over target on the WildReceipt photographs is met under
#: both readers; ``"cascade"`` (one fixation, no reading) keeps more on pages like the
#: training pages and less on the photographs
DEFAULT_METHOD = "cascade_glance"
#: cascade localisers that do not read the question (:mod:`fovea_core.cascade.localisers`)
_QUESTION_BLIND_LOCALISERS = ("learned_prior", "uniform")
#: the keywords every allocator accepts (so that one call fits all) but only some read:
#: option -> the methods whose tokens depend on it. Every other method ignores it (the
#: tokens are the same whatever its value; ``resize`` only records the fixation), so
#: :func:`foveate` warns and leaves it out of :attr:`Foveation.options`.
#: ``tests/test_foveate.py`` runs every method with two values of each to hold this to it.
SHARED_OPTION_USERS: dict[str, frozenset[str]] = {
    "fixation": frozenset({"foveated_pyramid", "hybrid", "logpolar", "multi_fixation",
                           "pseudo_logpolar", "v1_cortical"}),
    "seed": frozenset({"random"}),
}


class FoveateWarning(UserWarning):
    """A question or option that the chosen method does not use, a combination whose
    result means little (a method that ranks a map, given the flat ``"none"`` map), or a
    file of several frames (a multi-page TIFF, an animated GIF) of which one is read."""


class ImageTooLargeError(ValueError):
    """An image file whose header declares more pixels than Pillow's decompression-bomb
    limit (``2 * PIL.Image.MAX_IMAGE_PIXELS``): refused before it is decoded. A
    ``ValueError``; the command counts such a page as failed (not as a non-image)."""


class ImageDecodeError(ValueError):
    """An image file that one of Pillow's formats recognises but cannot read to the end (a
    truncated or corrupt JPEG or PNG, in its header or its data), or a file that cannot be
    opened at all (permission denied). A ``ValueError``; the command counts such a page as
    failed (unlike a file no format recognises, which is skipped as not an image)."""


class NotAFileError(ValueError):
    """A path that is not a regular file (:func:`check_regular_file` lists the kinds),
    refused before anything opens it (a FIFO would block the reader forever). A
    ``ValueError``; the command skips such a path and says why. ``what``: what the path is,
    e.g. ``"a named pipe (FIFO)"``."""

    def __init__(self, path: Path, what: str, advice: str = ""):
        self.path, self.what = path, what
        super().__init__(f"image: {path} is {what}, not a regular file"
                         + (f"; {advice}" if advice else ""))


@dataclass(frozen=True)
class Cost:
    """What one foveation spent (the book's evaluation protocol, "Same currency").

    Attributes:
        tokens: visual tokens the model receives (N).
        scorer: the importance scorer whose map the method ranked (``"none"``: it reads no
            map, e.g. ``resize`` or the cascade, which looks through its own gist tokens).
        scorer_tokens: 16 x 16-pixel token equivalent of what the scorer read outside N.
        alloc_read_tokens: the same for what the allocator itself read besides the map.
        total_tokens: ``tokens + scorer_tokens + alloc_read_tokens``.
        side_pixels: pixels read outside the N tokens (0 for a budgeted method).
        side_ms: CPU milliseconds of that outside look (the scorer's call; 0 if none).
        side_flops: FLOPs of the outside look where the method declares them (the cascade's
            text detector, :func:`~fovea_core.cascade.side.detector_flops`; ``None``: not
            declared, as for the scorers).
        reads_text: the outside look recognises text (an OCR): unbudgeted whatever its size.
        label: ``"budgeted"``, ``"side compute"`` or ``"unbudgeted"``, by the one cost rule
            (:mod:`fovea_core.cost`).
    """

    tokens: int
    scorer: str
    scorer_tokens: float
    alloc_read_tokens: float
    total_tokens: float
    side_pixels: int
    side_ms: float
    side_flops: float | None
    reads_text: bool
    label: str

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, eq=False)
class Foveation:
    """The result of :func:`foveate` for one page.

    Attributes:
        tokens: the :class:`~fovea_core.tokens.TokenSet` (batch of one, exactly ``budget``
            tokens; ``tokens.stage`` labels a cascade's gist (0) and fovea (1) tokens).
        patches: ``[1, N, C, p, p]`` float32, what each token carries
            (:func:`fovea_core.sample.sample`).
        cost: the :class:`Cost` record.
        method: the allocator's registry name.
        options: the keyword options the method used (besides budget and question):
            ``patch``, ``scorer`` for a method that ranks a map, and what the allocator
            read; an option it ignores (:func:`unused_options`) is not recorded.
        question: the question asked (``None``: none).
        question_used: whether ``method`` (with its scorer or localiser) read the question.
        scores: ``[1, Gh, Gw]`` the map the allocator ranked, or ``None`` for methods that
            read no score map.
        background: ``[1, C, h, w]`` the pyramid's coarsest level, under the tokens in
            :meth:`render` (pixels no token reaches).

    The reconstruction of what the model sees, :attr:`view`, is made when it is first asked
    for (and kept); a caller who wants only the tokens, the patches or the model inputs
    never pays for it. :meth:`render` makes it at another size.
    """

    tokens: TokenSet
    patches: torch.Tensor
    cost: Cost
    method: str
    options: dict = field(default_factory=dict)
    question: str | None = None
    question_used: bool = False
    scores: torch.Tensor | None = None
    background: torch.Tensor | None = field(default=None, repr=False)

    @property
    def budget(self) -> int:
        return self.tokens.budget

    @property
    def view(self) -> torch.Tensor:
        """``[C, H, W]`` float32 in ``[0, 1]``: the reconstruction of what the model sees at
        the page's size (:meth:`render`), made on first access and kept."""
        view = self.__dict__.get("_view")
        if view is None:
            view = self.render()
            object.__setattr__(self, "_view", view)
        return view

    def render(self, size: tuple[int, int] | None = None) -> torch.Tensor:
        """``[C, H, W]`` float32 in ``[0, 1]``: the tokens' reconstruction
        (:func:`fovea_core.sample.render`, smooth painter, over :attr:`background`) at
        ``size`` ``(H, W)`` (default: the page's size; a smaller size costs less, e.g. a
        preview of a 12-megapixel photograph)."""
        from fovea_core.sample import render

        return render(self.tokens, self.patches, size, background=self.background)[0].clamp(0, 1)

    def view_uint8(self) -> np.ndarray:
        """The reconstruction as an ``[H, W, C]`` uint8 array (``C`` = 1 or 3), for saving."""
        v = (self.view.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        return v[..., 0] if v.shape[-1] == 1 else v

    def to_json(self) -> dict:
        """A JSON-ready dict: the method, its options, the question, the costs and one entry
        per token (``x, y`` in [0, 1]; ``cx, cy`` and ``side`` in base pixels; ``level``;
        ``score``; ``stage``, ``None`` when the method has no stages)."""
        t = self.tokens
        xy = t.centers[0].tolist()
        cpx = t.centers_px()[0].tolist()
        side = t.footprint()[0].tolist()
        stage = t.stage[0].tolist() if t.stage is not None else [None] * t.budget
        cols = zip(xy, cpx, t.levels[0].tolist(), side, t.scores[0].tolist(), stage)
        toks = [dict(x=a[0], y=a[1], cx=b[0], cy=b[1], level=lv, side=s, score=sc, stage=st)
                for a, b, lv, s, sc, st in cols]
        return dict(method=self.method, options={k: _jsonable(v) for k, v in self.options.items()},
                    question=self.question, question_used=self.question_used,
                    image_size=list(t.image_size), patch=t.patch, budget=t.budget,
                    cost=self.cost.as_dict(), fixations=t.fixations[0].tolist(), tokens=toks)


def _jsonable(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return repr(v)


# ----------------------------------------------------------------------------- images
#: EXIF / TIFF tag of the orientation a camera records (1: upright)
_ORIENTATION_TAG = 0x0112


def _upright(img: Any) -> Any:
    """``img`` turned as its EXIF orientation says (a phone photo is stored sideways with a
    tag saying so; :func:`PIL.ImageOps.exif_transpose`); ``img`` itself when it has no such
    tag or is upright (no copy)."""
    from PIL import ImageOps

    if img.getexif().get(_ORIENTATION_TAG, 1) in (None, 1):
        return img
    return ImageOps.exif_transpose(img)


def _range_error(img: Any, lo: float, hi: float, accepted: str) -> ValueError:
    return ValueError(f"image: a PIL image of mode {img.mode!r} must hold {accepted}; got values "
                      f"in [{lo:g}, {hi:g}]")


def _pil_to_array(img: Any) -> np.ndarray:
    """A PIL image as ``[H, W]`` (grey) or ``[H, W, 3]`` uint8 / float32 in ``[0, 1]``, by
    the rules :func:`load_image` states (a 16-bit PNG opens as mode ``"I"``; ``"F"`` keeps
    ``[0, 1]`` up to :data:`~fovea_core.pyramid.IMAGE_RANGE_TOL`); ``ValueError`` (message
    starts with ``image``) for values outside them."""
    from PIL import Image

    from fovea_core.pyramid import IMAGE_RANGE_TOL

    img = _upright(img)
    if img.mode in ("I;16", "I;16B", "I;16L", "I;16N"):
        return (np.array(img, dtype=np.float64) / 65535.0).astype(np.float32)
    if img.mode in ("I", "F"):
        arr = np.array(img, dtype=np.float64)
        if arr.size == 0:
            return arr.astype(np.float32)
        if not np.isfinite(arr).all():
            raise ValueError(f"image: a PIL image of mode {img.mode!r} contains NaN or inf")
        lo, hi = float(arr.min()), float(arr.max())
        if img.mode == "I":
            if lo < 0 or hi > 65535:
                raise _range_error(img, lo, hi, "integers in 0..255 (8-bit) or 0..65535 "
                                                "(16-bit)")
            return (arr / (255.0 if hi <= 255 else 65535.0)).astype(np.float32)
        if lo >= -IMAGE_RANGE_TOL and hi <= 1 + IMAGE_RANGE_TOL:     # float in [0, 1]
            return np.clip(arr, 0, 1).astype(np.float32)
        if lo >= 0 and hi <= 255:                                     # float in 0..255
            return (arr / 255.0).astype(np.float32)
        raise _range_error(img, lo, hi, "floats in [0, 1] (or 0..255)")
    if img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (
            img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return np.array(Image.alpha_composite(white, rgba).convert("RGB"))
    if img.mode in ("L", "1"):
        return np.array(img if img.mode == "L" else img.convert("L"))
    return np.array(img if img.mode == "RGB" else img.convert("RGB"))   # no extra copy


def _pixels_in(err: BaseException) -> str:
    """The pixel count in Pillow's decompression-bomb message (``"?"`` if it has none)."""
    import re

    m = re.search(r"\((\d+) pixels\)", str(err))
    return f"{int(m.group(1)):,}" if m else "?"


def _tensor_page(image: torch.Tensor) -> torch.Tensor:
    """A tensor page checked for what :func:`~fovea_core.pyramid.as_image_batch` cannot
    read: on the meta device (no values) or sparse: ``ValueError`` naming ``image``. A
    tensor that requires grad is detached (foveation selects and resamples pixels; it is
    not differentiable, and the caller's tensor is left as it is)."""
    if image.is_meta:
        raise ValueError(f"image: a tensor on the meta device has a shape {list(image.shape)} "
                         "but no values; pass a tensor with data (CPU or CUDA)")
    if image.layout != torch.strided:
        raise ValueError(f"image: a sparse tensor (layout {image.layout}) is not a page; pass "
                         "a dense one (x.to_dense())")
    return image.detach()


def check_regular_file(path: str | Path) -> Path:
    """``path`` if it is a regular file (or a link to one), checked with ``os.stat`` without
    opening it; anything else raises.

    Raises:
        FileNotFoundError: nothing is at ``path``.
        NotAFileError: (a ``ValueError``, message starts with ``image``) a folder, a named
            pipe (FIFO), a socket, a device, a symbolic link loop, or a symbolic link to
            nothing; the message says which.
    """
    import errno
    import os
    import stat

    path = Path(path)
    try:
        st = os.stat(path)
    except OSError as err:
        if path.is_symlink():
            if err.errno == errno.ELOOP:
                raise NotAFileError(path, "a symbolic link loop (it never reaches a file)"
                                    ) from None
            raise NotAFileError(path, f"a dangling symbolic link (to {os.readlink(path)}, "
                                      "which does not exist)") from None
        if err.errno in (errno.ENOENT, errno.ENOTDIR):
            raise FileNotFoundError(f"image: no such file: {path}") from None
        raise NotAFileError(path, f"a path that cannot be read ({err.strerror or err})"
                            ) from None
    if stat.S_ISREG(st.st_mode):
        return path
    if stat.S_ISDIR(st.st_mode):
        raise NotAFileError(path, "a folder", "pass one image file (the command `python -m "
                                              "fovea_core foveate` runs over folders)")
    kind = ("a named pipe (FIFO)" if stat.S_ISFIFO(st.st_mode) else
            "a socket" if stat.S_ISSOCK(st.st_mode) else
            "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else
            "a special file")
    raise NotAFileError(path, kind, "pass an image file (it was not opened: reading a pipe "
                                    "could wait forever)")


def _frames_note(img: Any, where: str) -> str:
    """``""`` for a one-frame image; for a multi-page TIFF or an animated GIF / PNG / WebP,
    the note that only one frame is read (the one ``img`` is at: the first, for a file).
    ``""`` too when the frames cannot be counted (a PIL image whose file is closed)."""
    try:
        n = getattr(img, "n_frames", 1)
    except (OSError, ValueError, EOFError, AttributeError):
        return ""
    if not isinstance(n, int) or n <= 1:
        return ""
    k = img.tell()
    return (f"image: {where} holds {n} frames (pages); only frame {k + 1} of {n} is read. To "
            "read another, open it with PIL, img.seek(k) (0-based), and pass the image")


def load_image(image: Any) -> torch.Tensor:
    """One page as ``[1, C, H, W]`` float32 in ``[0, 1]`` (``C`` = 1 or 3).

    ``image`` is one of:

    * a path (``str`` or :class:`~pathlib.Path`) of an image file PIL reads;
    * a PIL image that can still be read (one closed by ``img.close()``, or one never read
      before its ``with Image.open(...)`` block ended, raises ``ValueError``);
    * a numpy array ``[H, W]`` / ``[H, W, C]``: ``uint8`` (0..255) or float in ``[0, 1]``;
    * a torch tensor ``[C, H, W]`` / ``[1, C, H, W]``: ``uint8`` or float in ``[0, 1]``, on
      any device but ``meta``, dense (see :func:`fovea_core.as_image_batch`); one that
      requires grad is detached.

    Files and PIL images: turned upright by their EXIF orientation (a phone photo;
    :func:`PIL.ImageOps.exif_transpose`), transparency composited over white, 8-bit modes
    divided by 255, 16-bit grey by 65535, 32-bit integer grey by 255 when its values are in
    0..255, else by 65535, 32-bit float grey (``"F"``, e.g. a float TIFF) kept as it is when
    its values are in ``[0, 1]`` and divided by 255 when they are in ``[0, 255]``; other
    values raise. A path and the PIL image read from it give the same tensor.

    A file of several frames (a multi-page TIFF, an animated GIF) is read at its first
    frame, a PIL image at the frame it is at (``img.seek(k)`` chooses), each with a
    :class:`FoveateWarning` that names the frame count and the frame read.

    Raises:
        FileNotFoundError: the path does not exist.
        NotAFileError, ImageTooLargeError, ImageDecodeError: (each a ``ValueError``) see
            their classes; the message of the second gives the pixels and the limit.
        ValueError: (message starts with ``image``) a file no format of PIL recognises, a
            closed PIL image, values outside the ranges above, a meta or sparse tensor, a
            batch of more than one image, or an array :func:`~fovea_core.as_image_batch`
            rejects.
        TypeError: any other type.
    """
    return _one_page(as_image_batch(_writable(_page_array(image))))


def _load_page(image: Any) -> torch.Tensor:
    """:func:`load_image`'s page, but an 8-bit one stays ``uint8`` ``[1, C, H, W]``
    (:func:`~fovea_core.pyramid.build_pyramid` divides it by 255 as it packs the levels, as
    :func:`load_image` does: the same pyramid, without a float copy of the page)."""
    arr = _writable(_page_array(image))
    if isinstance(arr, np.ndarray) and arr.dtype == np.uint8 and (
            arr.ndim == 2 or (arr.ndim == 3 and arr.shape[-1] in (1, 3))) and min(arr.shape) > 0:
        t = torch.from_numpy(arr)
        return _one_page(t[None, None] if arr.ndim == 2 else t.permute(2, 0, 1)[None])
    return _one_page(as_image_batch(arr))


def _page_array(image: Any) -> np.ndarray | torch.Tensor:
    """The pixels of ``image`` as :func:`load_image` reads them, before their conversion to
    ``[1, C, H, W]`` float (``uint8`` or float arrays, or a tensor); raises what it raises."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:  # pragma: no cover - pillow is a dependency
        Image = None
    if isinstance(image, (str, Path)):
        path = check_regular_file(image)          # a FIFO is never opened (it would block)
        try:
            img = Image.open(path)
        except Image.DecompressionBombError as err:
            limit = 2 * Image.MAX_IMAGE_PIXELS if Image.MAX_IMAGE_PIXELS else 0
            raise ImageTooLargeError(
                f"image: {path} declares {_pixels_in(err)} pixels, more than the limit of "
                f"{limit:,} (Pillow's decompression-bomb guard, 2 x PIL.Image.MAX_IMAGE_PIXELS):"
                " refused before decoding; downscale the file, or raise "
                "PIL.Image.MAX_IMAGE_PIXELS if you trust it") from None
        except PermissionError as err:             # a file, maybe an image: it fails
            raise ImageDecodeError(f"image: {path} cannot be opened ({err.strerror or err})"
                                   ) from None
        except UnidentifiedImageError as err:      # no format recognises it: not an image
            raise ValueError(f"image: {path} is not a readable image "
                             f"({type(err).__name__}: {err})") from None
        except (OSError, ValueError, SyntaxError) as err:  # a format took it, then failed
            raise ImageDecodeError(f"image: {path} is an image whose header cannot be read "
                                   f"({type(err).__name__}: {err})") from None
        with img:
            try:
                img.load()
            except (OSError, ValueError, SyntaxError) as err:   # truncated / corrupt data
                raise ImageDecodeError(f"image: {path} is an image ({img.format}, "
                                       f"{img.width}x{img.height}) whose data cannot be "
                                       f"decoded ({type(err).__name__}: {err})") from None
            note = _frames_note(img, str(path))
            if note:
                warnings.warn(note, FoveateWarning, stacklevel=2)
            try:
                arr = _pil_to_array(img)
            except ValueError as err:                # values outside the accepted ranges
                raise ValueError(f"image: {path}: {str(err).removeprefix('image: ')}") from None
    elif Image is not None and isinstance(image, Image.Image):
        try:
            image.load()
        except (AssertionError, ValueError, OSError, AttributeError) as err:
            why = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
            raise ValueError(f"image: the PIL image cannot be read ({why}); it is probably "
                             "closed (used after its `with Image.open(...)` block): pass the "
                             "path, or img.copy() inside the block") from None
        note = _frames_note(image, "the PIL image")
        if note:
            warnings.warn(note, FoveateWarning, stacklevel=2)
        arr = _pil_to_array(image)
    elif isinstance(image, torch.Tensor):
        arr = _tensor_page(image)
    elif isinstance(image, np.ndarray):
        arr = image
    else:
        raise TypeError("image must be a path (str or Path), a PIL image, a numpy array "
                        f"[H, W(, C)] or a torch tensor [C, H, W]; got {type(image).__name__}")
    return arr


def _writable(arr: Any) -> Any:
    if isinstance(arr, np.ndarray) and not arr.flags.writeable:
        arr = arr.copy()                     # torch.from_numpy warns on read-only arrays
    return arr


def _one_page(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``[B, C, H, W]`` checked to be one page of 1 or 3 channels."""
    if x.shape[0] != 1:
        raise ValueError(f"image: one page at a time, got a batch of {x.shape[0]} "
                         "(call foveate per page)")
    if x.shape[1] not in (1, 3):
        raise ValueError(f"image: the scorers and the cascade need 1 or 3 channels, got "
                         f"{x.shape[1]}")
    return x


# ----------------------------------------------------------------------------- methods
def _registry() -> tuple[dict, dict]:
    """``(ALLOCATORS, INFO)`` with every method registered, the cascade's included (it
    registers itself when :mod:`fovea_core.cascade` is imported)."""
    from fovea_core.methods import ALLOCATORS, INFO

    return ALLOCATORS, INFO


def method_names() -> list[str]:
    """Every method :func:`foveate` runs: the registered allocators that return exactly N
    tokens for one page (kind ``"fixed"``), sorted, the default first."""
    _, INFO = _registry()

    names = sorted(n for n, info in INFO.items() if info["kind"] == "fixed")
    return [DEFAULT_METHOD] + [n for n in names if n != DEFAULT_METHOD]


def method_summary(name: str, width: int = 100) -> str:
    """One line on a method for ``--help``: the first sentence of the registered function's
    docstring (reST roles and literals stripped, at most ``width`` characters), plus the
    keywords its registry entry binds (a variant's, e.g. ``strata=8``, or a cascade's
    options, e.g. ``localiser=gist_query``)."""
    import re

    _, INFO = _registry()

    entry = INFO[name]
    bound = entry["params"]
    doc = inspect.getdoc(entry["fn"]) or ""
    para = " ".join(doc.strip().split("\n\n")[0].split()) or "(no description)"
    para = re.sub(r":\w+:`~?([^`]+)`", r"\1", para).replace("``", "")
    m = re.search(r"(?<=\.)\s", para)
    line = para[:m.start()] if m else para
    if bound:
        line = f"{line.rstrip('.')} ({', '.join(f'{k}={v}' for k, v in bound.items())})."
    return line if len(line) <= width else line[:width - 3].rstrip() + "..."


def check_method(method: str) -> None:
    """Raise ``ValueError`` listing the accepted names if ``method`` is not one of them."""
    _, INFO = _registry()

    if not isinstance(method, str) or method not in INFO:
        raise ValueError(f"unknown method {method!r}; registered: {', '.join(method_names())}")
    if INFO[method]["kind"] != "fixed":
        raise ValueError(f"method {method!r} (kind {INFO[method]['kind']!r}) does not return N "
                         "tokens for one page; choose one of: " + ", ".join(method_names()))


def _scorer_for(method: str, question: str | None, options: Mapping) -> str:
    _, INFO = _registry()

    if not INFO[method]["uses_scores"]:
        return "none"
    return options.get("scorer") or ("query_saliency" if question else "saliency")


def _query_scorers() -> tuple[str, ...]:
    """Scorers whose map depends on the question (:data:`fovea_core.importance.PAGE_PARTS`:
    per-question maps of an OCR read of the page)."""
    from fovea_core.importance import PAGE_PARTS

    return tuple(PAGE_PARTS)


def uses_question(method: str, **options: Any) -> bool:
    """Whether ``method`` (with ``options``) reads a question: a score-map method through a
    query-aware scorer (``scorer=``, default ``"query_saliency"`` when a question is given),
    a cascade through a localiser that reads it (every localiser but ``"learned_prior"``
    and ``"uniform"``); ``resize``, ``full`` and the other methods that ignore the map never."""
    _, INFO = _registry()

    check_method(method)
    info = INFO[method]
    if info["uses_scores"]:
        return _scorer_for(method, "?", options) in _query_scorers()
    if info["family"] == "cascade":
        loc = options.get("localiser", info["params"].get("localiser") or "learned")
        return callable(loc) or loc not in _QUESTION_BLIND_LOCALISERS
    return False


# ----------------------------------------------------------------------------- cost
def _cost(method: str, scorer: str, pyramid, budget: int, side_ms: float,
          side_cost=None) -> Cost:
    """The cost record, by the one rule the evaluator uses too
    (:func:`~fovea_core.cost.method_cost`: tokens read outside N and the label), with what
    was measured beside it: the pixels read outside N and their milliseconds (``side``:
    the cascade side channel's :class:`~fovea_core.cascade.side.SideCost`, its FLOPs and
    milliseconds, if any)."""
    from fovea_core.cost import method_cost, uses_scores
    from fovea_core.importance import READS
    from fovea_core.methods import allocator_reads

    h, w = pyramid.image_size
    used = uses_scores(method)
    c = method_cost(method, scorer, pyramid, budget)
    side_px = (int(READS[scorer](h, w)) if used else 0) + int(allocator_reads(method, pyramid))
    return Cost(tokens=int(budget), scorer=scorer, scorer_tokens=c.scorer_tokens,
                alloc_read_tokens=c.alloc_read_tokens, total_tokens=c.total_tokens,
                side_pixels=side_px,
                side_ms=float(side_cost.cpu_ms if side_cost is not None else
                              side_ms if used and c.scorer_tokens > 0 else 0.0),
                side_flops=None if side_cost is None else float(side_cost.flops),
                reads_text=c.reads_text, label=c.label)


# ----------------------------------------------------------------------------- foveate
def _accepted_options(method: str) -> list[str]:
    """Keyword options the registered method takes (for error messages): those its
    function names, or for a method with stages (the cascade's) those its runner names
    plus the shared keywords, which :func:`~fovea_core.allocators.registry.allocate_parts`
    checks."""
    _, INFO = _registry()

    entry = INFO[method]
    run = entry["runner"]
    params = inspect.signature(run or entry["fn"]).parameters
    names = {k for k, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    if run is not None:
        names = (names | _SHARED_KEYWORDS) - _RUNNER_HOOKS
    return sorted(names - {"pyramid", "scores", "budget", "query", "params"})


def _glance(method: str, options: Mapping, budget: Any) -> int | None:
    """The glance's size (tokens) when ``method`` with ``options`` glances on every page at
    ``budget``, so that the glance replaces the gist and ``gist_budget`` is read nowhere;
    ``None`` otherwise: a read-then-look cascade with ``glance_below`` >= 1 (the default
    ``cascade_glance``'s rule) at a known int ``budget`` whose glance
    (:func:`~fovea_core.cascade.reading.glance_images`) is finer than ``gist_budget``."""
    from fovea_core.cascade.allocator import is_number
    from fovea_core.cascade.reading import reading_parts

    _, INFO = _registry()
    if INFO[method]["runner"] is not reading_parts or isinstance(budget, bool) \
            or not isinstance(budget, (int, np.integer)):
        return None
    merged = {**INFO[method]["params"], **options}
    below, share = merged.get("glance_below"), merged.get("glance_share")
    if not (is_number(below) and float(below) >= 1.0 and is_number(share)
            and 0.0 < float(share) < 1.0):
        return None
    glance = min(int(round(float(share) * int(budget))), int(budget) - 2)
    gist_budget = options.get("gist_budget")
    if not isinstance(gist_budget, (int, np.integer)) or isinstance(gist_budget, bool) \
            or int(gist_budget) >= glance:
        return None
    return glance


def unused_options(method: str, *, budget: int | None = None, **options: Any) -> list[str]:
    """The names among ``options`` that ``method`` accepts but does not read: ``scorer``
    for a method that reads no score map (unless ``"none"``), the shared keywords of
    :data:`SHARED_OPTION_USERS` (``fixation``, ``seed``) for the methods that ignore them
    (e.g. ``fixation`` for ``resize`` or the cascade, ``seed`` for every method but
    ``random``), and ``gist_budget`` for a cascade that glances instead of making a gist
    (the default ``cascade_glance`` at a ``budget`` whose glance is finer than the gist
    asked for: :func:`_glance`)."""
    _, INFO = _registry()

    check_method(method)
    out = [k for k, users in SHARED_OPTION_USERS.items() if k in options and method not in users]
    if options.get("scorer") not in (None, "none") and not INFO[method]["uses_scores"]:
        out.insert(0, "scorer")
    if "gist_budget" in options and _glance(method, options, budget) is not None:
        out.append("gist_budget")
    return out


#: the keywords every registered allocator takes besides its own (the shared rules)
_SHARED_KEYWORDS = frozenset({"fixation", "seed", "patch"})
#: a runner's keywords for its callers' reuse (a computed gist, a size head), not options
_RUNNER_HOOKS = frozenset({"gist_obj", "size"})
#: the one-fixation cascade's switches to ``resize``, which the read-then-look cascades
#: (``cascade_read``, ``cascade_glance``) do not take
_RESIZE_SWITCHES = ("resize_within", "resize_below", "resize_legible")


def _check_cascade_values(method: str, opts: Mapping, budget: Any) -> None:
    """The values of a cascade's own options (``gist_budget``, below ``budget`` when that is
    an int, and every option the cascade's own checks hold), checked before any page is read
    by those checks (the messages name the option and its range)."""
    from fovea_core.cascade import allocator as A
    from fovea_core.cascade.localisers import get_localiser

    o = {**_registry()[1][method]["params"], **opts}
    gb = o.get("gist_budget")
    if gb is not None:
        known = isinstance(budget, (int, np.integer)) and not isinstance(budget, bool) \
            and int(budget) >= 2
        if not A._is_int(gb) or int(gb) < 1 or (known and int(gb) >= int(budget)):
            rng = f"in [1, {int(budget) - 1}] (below budget = {int(budget)})" if known \
                else ">= 1 (below the budget)"
            raise ValueError(f"gist_budget must be None or an int {rng}: the tokens of the "
                             f"cascade's gist (numpy integers accepted), got {gb!r} "
                             f"({type(gb).__name__})")
    sig = inspect.signature(A.cascade).parameters
    d = {k: o.get(k, sig[k].default) for k in ("level", "legible_px", "surround", "context",
                                               "context_weight")}
    A.check_cascade_options(query=None, gist_budget=None, budget=1 << 20, **d)
    loc = o.get("localiser")
    if loc is not None:
        get_localiser(loc)
    if o.get("resize_within") is not None:
        A._check_within(o["resize_within"])
    if o.get("resize_below") is not None:
        A._check_below(o["resize_below"])
    if o.get("resize_legible") is not None:
        A._check_legible(o["resize_legible"])
    from fovea_core.cascade import reading as R

    if _registry()[1][method]["runner"] is R.reading_parts:
        rsig = inspect.signature(R.reading_parts).parameters
        R._check_args(*(o.get(k, rsig[k].default) for k in ("first_share", "geometry", "side",
                                                              "fovea")))
        below, share = o.get("glance_below"), o.get("glance_share")
        if below is not None or share is not None:
            R._check_glance(below, share)


@dataclass(frozen=True)
class _Plan:
    """What :func:`foveate` runs, from its arguments alone (before any page is read)."""

    patch: int
    scorer: str                   # the resolved scorer ("none": the method reads no map)
    options: dict                 # what the allocator receives and the method reads
    question_used: bool
    notes: tuple[str, ...]        # FoveateWarning texts, in order


def check_text(text: Any, name: str = "question") -> str:
    """``text`` if it is a ``str`` that UTF-8 can encode; a ``str`` holding a lone surrogate
    (e.g. ``"\\ud800"``, from a broken decode) raises ``ValueError`` naming ``name`` and the
    position (a tokenizer or an OCR matcher would fail on it with an unrelated error)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"{name} must be valid Unicode text: it holds a lone surrogate "
                         f"{text[err.start]!r} at position {err.start} (a broken decode?); "
                         f"got {text!r}") from None
    return text


def _prepare(method: str, question: str | None, options: Mapping,
             budget: Any = None) -> _Plan:
    """Check ``method``, ``question`` and the options (the values of a cascade's own
    options too: :func:`_check_cascade_values`); resolve the scorer; drop (with a note)
    the options the method does not read (at ``budget``, when known). Raises
    ``ValueError`` naming the argument (``TypeError`` for a ``scorer`` that is not a
    string)."""
    from fovea_core.allocators.base import check_seed
    from fovea_core.importance import SCORERS

    _, INFO = _registry()
    check_method(method)
    if question is not None and (not isinstance(question, str) or not question.strip()):
        raise ValueError(f"question must be a non-empty string or None, got {question!r}")
    if question is not None:
        check_text(question, "question")
    opts = dict(options)
    if "query" in opts:
        raise ValueError("query: pass the question as foveate's `question` argument "
                         "(the second one), not as an option")
    patch = opts.pop("patch", 16)
    if isinstance(patch, bool) or not isinstance(patch, (int, np.integer)) or patch < 1:
        raise ValueError(f"patch must be an int >= 1 (pixels), got {patch!r}")
    patch = int(patch)
    scorer = opts.pop("scorer", None)
    if scorer is not None and not isinstance(scorer, str):
        raise TypeError(f"scorer must be a str, one of {sorted(SCORERS)}, or None; got "
                        f"{scorer!r} ({type(scorer).__name__})")
    if scorer is not None and scorer not in SCORERS:
        raise ValueError(f"unknown scorer {scorer!r}; scorer must be one of {sorted(SCORERS)} "
                         "or None")
    if "seed" in opts:
        opts["seed"] = check_seed(opts["seed"])
    bad = sorted(set(opts) - set(_accepted_options(method)))
    if bad:
        switches = [k for k in bad if k in _RESIZE_SWITCHES]
        why = (f" ({', '.join(switches)}: a switch of the one-fixation cascades, e.g. "
               "'cascade', to resize's tokens; the read-then-look cascades 'cascade_read' "
               "and 'cascade_glance' read the page instead)" if switches else "")
        raise ValueError(f"method {method!r} does not take option(s) {bad}{why}; it takes: "
                         f"{', '.join(_accepted_options(method) + ['scorer'])}")
    if INFO[method]["family"] == "cascade":
        _check_cascade_values(method, opts, budget)
    notes = []
    for name in unused_options(method, budget=budget, scorer=scorer, **opts):
        value = scorer if name == "scorer" else opts.pop(name)
        glance = _glance(method, {**options, name: value}, budget) \
            if name == "gist_budget" else None
        why = ("it reads no score map" if name == "scorer" else
               "the cascade fixates the peak of its own localiser's map"
               if name == "fixation" and INFO[method]["family"] == "cascade"
               else f"at N = {int(budget)} it glances at the whole page in {glance} tokens "
                    "instead of making a gist; a gist_budget of at least that many would be "
                    "read" if name == "gist_budget"
               else "its tokens do not depend on it")
        notes.append(f"method {method!r} does not use option {name}={value!r} ({why}): it is "
                     "ignored and not recorded in Foveation.options")
    scorer = _scorer_for(method, question, {"scorer": scorer})
    if scorer in _query_scorers() and question is None:
        raise ValueError(f"scorer {scorer!r} is query-aware: pass a question (or another scorer)")
    if INFO[method]["uses_scores"] and scorer == "none":
        notes.append(f"scorer='none' gives method {method!r} a flat map (all zeros): every "
                     "patch ties, so wherever the method ranks the map its tie-break chooses "
                     "(row-major: the top rows of the page first; for 'topk' that is the whole "
                     "choice). The tokens say nothing about the page; pass a scorer, or use a "
                     "method that reads no map ('resize')")
    q_used = question is not None and uses_question(method, scorer=scorer, **opts)
    if question is not None and not q_used:
        notes.append(f"method {method!r} does not read the question (it is ignored)")
    return _Plan(patch, scorer, opts, q_used, tuple(notes))


def check_options(method: str, question: str | None = None, *, budget: int | None = None,
                  **options: Any) -> list[str]:
    """Check what :func:`foveate` would be called with, before any page is read (the
    command does, once for a whole folder): the method, the question and the options (the
    names the method takes, ``patch``, ``scorer``, ``seed``, and the values of a cascade's
    own options, e.g. ``gist_budget``), at ``budget`` when given. Returns the notes
    :func:`foveate` would give as :class:`FoveateWarning` (an ignored question or option, a
    flat map); raises the ``ValueError`` (or ``TypeError``) it would raise, naming the
    argument."""
    return list(_prepare(method, question, options, budget).notes)


def _page_budget(method: str, budget: Any, size: tuple[int, int], patch: int,
                 options: Mapping) -> int:
    """``budget`` for this page through the one budget check
    (:func:`~fovea_core.allocators.base.check_budget`), with the range the method truly
    runs at: ``[1, Gh*Gw]``, exactly ``Gh*Gw`` for ``full``, the cascade's
    :func:`~fovea_core.cascade.allocator.budget_range`. ``None``: every level-0 patch."""
    from fovea_core.allocators.base import check_budget

    _, INFO = _registry()
    h, w = size
    gh, gw = math.ceil(h / patch), math.ceil(w / patch)
    page = f"this {h}x{w} page ({gh}x{gw} patches of {patch} px)"
    if budget is None:
        budget = gh * gw
    if INFO[method]["family"] == "cascade":
        from fovea_core.cascade.allocator import check_cascade_budget

        gist_budget = options.get("gist_budget", INFO[method]["params"].get("gist_budget"))
        return check_cascade_budget(budget, size, patch=patch, gist_budget=gist_budget,
                                    name=None)
    if method == "full":
        return check_budget(budget, gh * gw, low=gh * gw,
                            where=f" for method 'full', which keeps every patch of {page}; "
                                  "None means all")
    return check_budget(budget, gh * gw, where=f" for {page}")


# ----------------------------------------------------------------------------- decoding
#: methods whose tokens follow from the page's size alone (no pixel and no score map is
#: read to place them): :func:`foveate` places their tokens first and then decodes a file
#: once, at the finest scale a token needs (``tests/test_foveate.py`` holds each to the
#: tokens of a full decode)
PLACED_BEFORE_DECODING = frozenset({"resize", "uniform"})
#: the coarsest reduced decode (a JPEG decodes at 1/2, 1/4 or 1/8 of its size: libjpeg's
#: scaled inverse DCT, Pillow's ``Image.draft``)
MAX_REDUCED_LEVEL = 3


def _check_page_size(size: tuple[int, int], patch: int) -> None:
    h, w = size
    if min(h, w) < patch:
        raise ValueError(f"image: a {h}x{w} page is smaller than one patch ({patch} px): "
                         f"foveate needs H and W >= patch; pass a larger page or a smaller "
                         f"patch=")


def _upright_size(img: Any) -> tuple[int, int]:
    """``(H, W)`` of a PIL image (not decoded) once turned upright by its EXIF orientation
    (5-8 swap the sides)."""
    w, h = img.size
    return (w, h) if img.getexif().get(_ORIENTATION_TAG, 1) in (5, 6, 7, 8) else (h, w)


def _reduced_read(image: Any, method: str, patch: int) -> tuple[int, int] | None:
    """The page's ``(H, W)`` from the file's header when ``image`` is a path, ``method``
    places its tokens from the page's size alone (:data:`PLACED_BEFORE_DECODING`) and the
    header reads; else ``None`` (the page is decoded whole first, and any error about the
    file is :func:`load_image`'s)."""
    if method not in PLACED_BEFORE_DECODING or not isinstance(image, (str, Path)):
        return None
    from PIL import Image

    path = Path(image)
    if not path.is_file():
        return None
    try:
        with Image.open(path) as img:
            if getattr(img, "n_frames", 1) != 1:
                return None
            size = _upright_size(img)
    except Exception:  # noqa: BLE001 - load_image says what is wrong with the file
        return None
    if min(size) < patch:
        return None
    return size


def _geometry_pyramid(size: tuple[int, int], patch: int) -> Pyramid:
    """A pixel-free stand-in for the page's pyramid: its size and levels, its coarsest
    level stored as zeros, for a method that places tokens from the size alone."""
    from fovea_core.pyramid import ReducedPyramid, default_num_levels

    h, w = size
    top = default_num_levels(h, w, patch) - 1
    k = 2**top
    return ReducedPyramid((torch.zeros(1, 1, -(-h // k), -(-w // k)),), top, (h, w))


def _decode_for(image: str | Path, tokens: TokenSet, num_levels: int) -> Pyramid:
    """The pyramid of the file ``image`` decoded once at the finest scale ``tokens`` need:
    page level ``k = min(floor(min level), MAX_REDUCED_LEVEL)``. A JPEG decodes at that
    scale directly (``Image.draft``: libjpeg's scaled inverse DCT); another format, or a
    JPEG whose reduced size is not ``ceil(size / 2**k)``, decodes whole and is area-averaged
    over ``2**k``-pixel blocks. ``k = 0``: the full page (:func:`build_pyramid`). The
    patches read from a reduced page are area means of its pixels, equal to the full
    page's up to the decoder's rounding and the blocks' edges."""
    from PIL import Image

    from fovea_core.pyramid import ReducedPyramid

    h, w = tokens.image_size
    k = int(min(math.floor(float(tokens.levels.min())), MAX_REDUCED_LEVEL))
    if k <= 0:
        return build_pyramid(load_image(image), num_levels)
    kh, kw = -(-h // 2**k), -(-w // 2**k)
    x = None
    try:
        with Image.open(image) as img:
            if img.format == "JPEG":
                sw, sh = img.size                       # as stored (before EXIF turns it)
                # Pillow scales by the largest power of two <= size // requested: ask for
                # size // 2**k, which gives 2**k exactly and ceil(size / 2**k) pixels
                img.draft(None, (max(1, sw // 2**k), max(1, sh // 2**k)))
                img.load()
                arr = _pil_to_array(img)
                if arr.shape[:2] == (kh, kw):
                    x = as_image_batch(arr)
    except Exception:  # noqa: BLE001 - decoded whole below, where errors are reported
        x = None
    if x is None:
        full = load_image(image)
        x = torch.nn.functional.avg_pool2d(full, 2**k, ceil_mode=True,
                                           count_include_pad=False)
    stored = build_pyramid(x, num_levels - k)
    return ReducedPyramid(stored.levels, k, (h, w))


def _read_patches(pyr: Pyramid, tokens: TokenSet, gist: Any = None) -> torch.Tensor:
    """The tokens' patches ``[1, N, C, p, p]`` (:func:`fovea_core.sample.sample`), the
    gist's taken as the cascade read them when ``tokens`` hold ``gist``'s tokens (stage 0,
    same centres, levels and patch, in order) and the page is 8-bit: its area reads are
    exact sums, so a token's patch does not depend on what else is read with it
    (:func:`~fovea_core.pyramid.integer_page`), and the whole page is not read twice."""
    from fovea_core.pyramid import integer_page
    from fovea_core.sample import sample

    g = getattr(gist, "tokens", None)
    if not isinstance(g, TokenSet) or tokens.stage is None or tokens.batch_size != 1 \
            or g.batch_size != 1 or g.patch != tokens.patch or integer_page(pyr) is None:
        return sample(pyr, tokens)
    mine = torch.nonzero(tokens.stage[0] == 0).squeeze(1)                 # [G]
    if mine.numel() != g.budget or mine.numel() == tokens.budget \
            or not torch.equal(tokens.centers[0, mine], g.centers[0]) \
            or not torch.equal(tokens.levels[0, mine], g.levels[0]):
        return sample(pyr, tokens)
    p, (r, c) = g.patch, (gist.rows, gist.cols)
    ch = gist.image.shape[1]
    gp = gist.image.reshape(1, ch, r, p, c, p).permute(0, 2, 4, 1, 3, 5).reshape(1, r * c, ch,
                                                                               p, p)
    rest = torch.nonzero(tokens.stage[0] != 0).squeeze(1)                # [N - G]
    others = replace(tokens, centers=tokens.centers[:, rest], levels=tokens.levels[:, rest],
                     scores=tokens.scores[:, rest], stage=tokens.stage[:, rest])
    out = gp.new_empty(1, tokens.budget, ch, p, p)
    out[:, mine] = gp
    out[:, rest] = sample(pyr, others)
    return out


def foveate(image: Any, question: str | None = None, *, budget: int | None = DEFAULT_BUDGET,
            method: str = DEFAULT_METHOD, **method_options: Any) -> Foveation:
    """Foveate one page: exactly ``budget`` tokens, their patches, the view and the cost.

    Args:
        image: a path, a PIL image, a numpy array or a torch tensor (:func:`load_image`
            says which values it accepts).
        question: the question about the page, or ``None``. Methods that read it: the
            cascade (its learned localiser embeds it) and the score-map methods with a
            query-aware scorer (default ``query_saliency`` when a question is given: an OCR
            outside the budget, labelled unbudgeted). A method that ignores it says so once
            (a :class:`FoveateWarning`).
        budget: N, an int in the method's range for this page (numpy integers accepted):
            ``[1, Gh * Gw]`` (``Gh = ceil(H / patch)``) for most methods, exactly
            ``Gh * Gw`` for ``"full"``, the gist plus at least one fovea token for a
            cascade (:func:`~fovea_core.cascade.allocator.budget_range`); the message of a
            budget outside it states the range. ``None``: every level-0 patch.
        method: a name of :func:`method_names` (``"cascade"``, ``"resize"``, ``"topk"``,
            ...); see ``python -m fovea_core foveate --help`` for one line on each.
        **method_options: ``scorer=`` (a :data:`fovea_core.importance.SCORERS` name, for
            methods that rank a score map), ``patch=`` (default 16), ``seed=`` (an int),
            ``fixation=(x, y)``, and the allocator's own keywords (e.g. ``gist_budget=`` or
            ``localiser=`` for the cascade, ``strata=`` for ``stratified``).

    An option the method accepts but does not read (:func:`unused_options`) is said once (a
    :class:`FoveateWarning`), not passed on and not recorded in :attr:`Foveation.options`.
    ``scorer="none"`` with a method that ranks a map (``topk``, ...) runs, with a warning:
    the flat map leaves the choice to the tie-break (the top rows of the page).

    Returns:
        A :class:`Foveation` (tokens ``[1, N]``, patches ``[1, N, C, p, p]``, cost; the
        view ``[C, H, W]`` is rendered when first asked for).

    Raises:
        FileNotFoundError, TypeError, ValueError: a missing or unreadable image, an unknown
        method (the message lists the registered ones), a page smaller than one patch, a
        budget outside the page's range, a non-integer ``seed``, a ``scorer`` that is not a
        scorer's name, an option the method does not take; each message names the argument
        and the accepted values.
    """
    from fovea_core.methods import allocate, allocate_parts

    _, INFO = _registry()
    from fovea_core.importance import score
    from fovea_core.sample import sample

    plan = _prepare(method, question, method_options, budget)
    for note in plan.notes:
        warnings.warn(note, FoveateWarning, stacklevel=2)
    patch, scorer, opts, q_used = plan.patch, plan.scorer, plan.options, plan.question_used

    reduced = _reduced_read(image, method, patch)
    if reduced is not None:             # tokens from the page's geometry, then one decode
        size = reduced
        budget = _page_budget(method, budget, size, patch, opts)
        pyr = _geometry_pyramid(size, patch)
    else:
        x = _load_page(image)
        size = tuple(x.shape[-2:])
        _check_page_size(size, patch)
        budget = _page_budget(method, budget, size, patch, opts)
        pyr = build_pyramid(x, patch=patch)
        del x
    if scorer == "none":                 # a method that reads no map: no look at the page
        scores, side_ms = torch.zeros(1, *pyr.grid_shape(patch, 0)), 0.0
    else:
        t0 = time.perf_counter()
        scores = score(scorer, pyr.base, query=question if scorer in _query_scorers() else None,
                       patch=patch)
        side_ms = (time.perf_counter() - t0) * 1e3
    call = dict(opts, patch=patch)
    if question is not None and q_used:
        call["query"] = question
    side = parts = None                 # a cascade's side cost, from the run that allocated
    try:
        if INFO[method]["runner"] is not None:        # a method with stages: its parts
            # a method that reads no map gets none (the budget is not checked again with it)
            parts = allocate_parts(method, pyr, scores if INFO[method]["uses_scores"] else None,
                                   budget, **call)
            tokens, side = parts.tokens, parts.side
        else:
            tokens = allocate(method, pyr, scores, budget, **call)
    except TypeError as err:
        if "unexpected keyword argument" not in str(err):
            raise
        bad = sorted(set(opts) - set(_accepted_options(method)))
        raise ValueError(f"method {method!r} does not take option(s) {bad or list(opts)}; it "
                         f"takes: {', '.join(_accepted_options(method))}") from None
    except ValueError as err:
        msg = str(err)
        raise ValueError(msg if msg.startswith(method) else f"{method}: {msg}") from None
    budget = int(budget)                # a cascade's PageBudget, checked once, as a plain int
    if not isinstance(tokens, TokenSet) or tokens.budget != budget:
        got = tokens.budget if isinstance(tokens, TokenSet) else type(tokens).__name__
        raise ValueError(f"method {method!r} with options {opts} returned {got} tokens, not "
                         f"budget = {budget} (e.g. multi_fixation's mode='per_fixation'); "
                         "foveate needs exactly N")
    if reduced is not None:
        pyr = _decode_for(image, tokens, pyr.num_levels)
    patches = _read_patches(pyr, tokens, getattr(parts, "gist", None))
    cost = _cost(method, scorer, pyr, budget, side_ms, side)
    return Foveation(tokens=tokens, patches=patches, cost=cost, method=method,
                     background=pyr.levels[-1].clone(),
                     options=dict(opts, patch=patch, **({"scorer": scorer}
                                                        if scorer != "none" else {})),
                     question=question, question_used=q_used,
                     scores=scores if INFO[method]["uses_scores"] else None)


# ----------------------------------------------------------------------------- figure
def plot_foveation(f: Foveation, image: Any, *, title: str | None = None, width: float = 4.0):
    """A figure of the page with the tokens by level (:func:`fovea_core.draw.overlay_tokens`),
    by stage (when the method has stages, e.g. the cascade's gist and fovea) and the view.

    ``image`` is the page (anything :func:`load_image` takes). Returns a
    :class:`matplotlib.figure.Figure` drawn without pyplot (safe in worker processes).
    """
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    from fovea_core.draw import _show_image, box_vertices, overlay_tokens, to_display

    x = image if isinstance(image, torch.Tensor) and image.ndim == 4 else load_image(image)
    t = f.tokens
    staged = t.stage is not None and int(t.stage.unique().numel()) > 1
    n = 3 if staged else 2
    h, w = t.image_size
    fig = Figure(figsize=(width * n, width * h / w + 0.8), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    overlay_tokens(axes[0], x, t, show_centers=t.budget <= 400)
    axes[0].set_title(f"{t.budget} tokens by level")
    if staged:
        _show_image(axes[1], to_display(x))
        verts = box_vertices(t.boxes()[0].numpy())
        stage = t.stage[0].numpy()
        colors = ("tab:blue", "tab:red", "tab:green", "tab:orange", "tab:purple")
        handles = []
        for k, s in enumerate(np.unique(stage)):                 # few stages, not tokens
            sel = stage == s
            c = colors[k % len(colors)]
            axes[1].add_collection(PolyCollection(verts[sel], facecolors="none",
                                                  edgecolors=[c], linewidth=0.6))
            name = {0: "gist", 1: "fovea"}.get(int(s), f"stage {int(s)}") \
                if f.method.startswith("cascade") else f"stage {int(s)}"
            handles.append(Patch(facecolor="none", edgecolor=c, label=f"{name}: {int(sel.sum())}"))
        axes[1].legend(handles=handles, loc="upper right", fontsize="small", framealpha=0.8)
        axes[1].set_xlim(0, w)
        axes[1].set_ylim(h, 0)
        axes[1].set_title("tokens by stage")
    _show_image(axes[-1], to_display(f.view[None]))
    axes[-1].set_title(f"what the model sees ({f.cost.label})")
    q = f" | {f.question}" if f.question else ""
    fig.suptitle(title or f"{f.method}, N = {t.budget}{q}", fontsize="medium")
    return fig


# ----------------------------------------------------------------------------- files
#: the files :func:`save_foveation` writes per page, as suffixes of the page's stem
OUTPUT_SUFFIXES = {"view": ".foveated.png", "figure": ".tokens.png", "json": ".foveation.json"}


def save_foveation(f: Foveation, image: Any, out_dir: str | Path, stem: str, *,
                   source: str | None = None, dpi: int = 110) -> dict[str, Path]:
    """Write one page's reconstruction (PNG), its token figure (:func:`plot_foveation`, PNG)
    and its JSON (:meth:`Foveation.to_json` plus ``source``) into ``out_dir`` as
    ``<stem>`` + :data:`OUTPUT_SUFFIXES`.

    All or nothing: a target that exists and is not a file (a folder named
    ``<stem>.foveation.json``, say) is refused before anything is written; each file is
    written under a temporary name, and the three are then renamed into place, each file
    they replace kept aside until all three are in. If any step fails, the temporary
    files are removed, the files renamed so far are taken back and the ones they replaced
    restored: the folder holds what it held before (no file of the page, or the page's
    earlier files). Returns ``{"view" | "figure" | "json": path}``.

    Raises:
        IsADirectoryError: a target is a folder (or another non-file); nothing is written.
        OSError, ...: whatever writing raised; nothing of the page is left.
    """
    import json
    import os
    import stat

    from PIL import Image

    out_dir = Path(out_dir)
    final = {k: out_dir / f"{stem}{suf}" for k, suf in OUTPUT_SUFFIXES.items()}
    for p in final.values():                        # refuse what a rename cannot replace
        try:
            mode = os.lstat(p).st_mode
        except FileNotFoundError:
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            raise IsADirectoryError(f"{p} exists and is not a file (a folder?): the page's "
                                    "files are not written; move it away or choose another "
                                    "--out")
    tmp = {k: p.with_name(f".{p.name}.tmp{os.getpid()}") for k, p in final.items()}
    old = {k: p.with_name(f".{p.name}.old{os.getpid()}") for k, p in final.items()}
    moved: list[str] = []                           # renamed into place so far
    kept: dict[str, bool] = {}                      # k -> an earlier file is kept aside
    try:
        Image.fromarray(f.view_uint8()).save(tmp["view"], format="PNG")
        fig = plot_foveation(f, image)
        fig.savefig(tmp["figure"], format="png", dpi=dpi)
        record = dict(f.to_json(), source=source)
        tokens = record.pop("tokens")                   # one line per token, the rest indented
        head = json.dumps(record, indent=1)[:-2]
        body = ",\n  ".join(json.dumps(t) for t in tokens)
        tmp["json"].write_text(f'{head},\n "tokens": [\n  {body}\n ]\n}}\n')
        for k in ("view", "figure", "json"):            # the JSON last: it marks a whole page
            kept[k] = os.path.lexists(final[k])
            if kept[k]:
                os.replace(final[k], old[k])
            os.replace(tmp[k], final[k])
            moved.append(k)
    except BaseException:
        for k in reversed(list(kept)):                  # take back, restore what was there
            try:
                if k in moved:
                    final[k].unlink(missing_ok=True)
                if kept[k]:
                    os.replace(old[k], final[k])
            except OSError:                             # pragma: no cover - best effort
                pass
        for p in tmp.values():
            p.unlink(missing_ok=True)
        raise
    for k, was in kept.items():
        if was:
            old[k].unlink(missing_ok=True)
    return final


def _one_line(err: BaseException) -> str:
    msg = str(err).strip().splitlines()
    return f"{type(err).__name__}: {msg[0] if msg else ''}".rstrip(": ")


def worker_init() -> None:
    """Initialiser of the command's worker processes: one torch thread each (the pool has
    one process per core)."""
    torch.set_num_threads(1)


def run_page(job: Mapping) -> dict:
    """Foveate one file and save it (the command's unit of work; picklable for a process
    pool). ``job``: ``path, stem, out_dir, question, budget, method, options``. Returns
    ``{"path", "stem", "status": "done" | "skipped" | "failed", "message", "seconds"}``:
    *skipped* when the path is not an image (a file Pillow does not recognise, or a
    :class:`NotAFileError`), *failed* when it is an image that cannot be read
    (:class:`ImageTooLargeError`, :class:`ImageDecodeError`) or when foveating or writing
    it raised (the message is the error's first line; no file of the page is left behind).
    A file of several frames is read at its first, and the message says so."""
    t0 = time.perf_counter()
    out = dict(path=str(job["path"]), stem=job.get("stem"), status="done", message="",
               seconds=0.0)
    said: list[str] = []                     # what loading the page warned (its frames)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", FoveateWarning)
            x = load_image(job["path"])
        said = [str(w.message).removeprefix("image: ").split(". ")[0] for w in caught
                if issubclass(w.category, FoveateWarning)]
    except (ImageTooLargeError, ImageDecodeError) as err:    # an image, but unreadable
        out.update(status="failed", message=_one_line(err))
    except (ValueError, FileNotFoundError, TypeError) as err:
        out.update(status="skipped", message=_one_line(err))
    else:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FoveateWarning)   # the command says it once
                # the path, as a user's foveate(path) call reads it (a method placed
                # before decoding reads the file at its tokens' scale); x draws the figure
                f = foveate(job["path"], job.get("question"), budget=job.get("budget"),
                            method=job["method"], **dict(job.get("options") or {}))
                save_foveation(f, x, job["out_dir"], job["stem"], source=str(job["path"]))
            out["message"] = (f"{f.budget} tokens, {f.cost.label}, "
                              f"{f.cost.total_tokens:g} tokens in all"
                              + "".join(f"; note: {n}" for n in said))
        except Exception as err:  # noqa: BLE001 - one line per page, never a traceback
            out.update(status="failed", message=_one_line(err))
    out["seconds"] = time.perf_counter() - t0
    return out
