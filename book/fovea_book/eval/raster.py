"""Drawing text on a page and reading its ink back: the rasteriser of the synthetic pages.

:class:`Page` draws strings with matplotlib's bundled TrueType fonts (:func:`font_path`; no
system font needed) on a Pillow page and records each one's *ink* box (the tight bounding
box of the pixels it darkened); :class:`Canvas` adds centred and right-aligned lines;
:func:`finish_page` turns a drawn page into ``[H, W, 3]`` uint8 pixels, optionally with
the paper tone, ink, noise and blur of a scan. :func:`ink_mask` and :func:`element_mask`
compare ink and boxes. Re-exported by :mod:`fovea_book.eval.documents`."""

from __future__ import annotations

import os

import numpy as np

from fovea_book.eval.document_types import TextElement

__all__ = ["Canvas", "Page", "element_mask", "finish_page", "font_path", "ink_mask"]


def font_path(name: str = "DejaVuSans.ttf") -> str:
    """Path of one of matplotlib's bundled TrueType fonts (no system fonts needed)."""
    import matplotlib

    path = os.path.join(matplotlib.get_data_path(), "fonts", "ttf", name)
    if not os.path.exists(path):
        raise ValueError(f"font {name!r} is not bundled with matplotlib (looked in {path})")
    return path


class Page:
    """Draws strings on a PIL page and records each one's ink box."""

    def __init__(self, width: int, height: int):
        from PIL import Image, ImageDraw

        self.img = Image.new("L", (width, height), 255)
        self.draw = ImageDraw.Draw(self.img)
        self.elements: list[TextElement] = []
        self._fonts: dict[tuple[str, int], object] = {}

    def font(self, name: str, size: int):
        from PIL import ImageFont

        key = (name, size)
        if key not in self._fonts:
            self._fonts[key] = ImageFont.truetype(font_path(name), size)
        return self._fonts[key]

    def width_of(self, text: str, name: str, size: int) -> int:
        return int(np.ceil(self.draw.textlength(text, font=self.font(name, size))))

    def text(self, xy: tuple[int, int], text: str, kind: str, size: int,
             name: str = "DejaVuSans.ttf", ink: int = 0) -> TextElement:
        """Draw ``text`` with its top-left at ``xy`` and record its ink box."""
        from PIL import Image, ImageDraw

        font = self.font(name, size)
        x0, y0, x1, y1 = self.draw.textbbox(xy, text, font=font)
        pad = 2
        scratch = Image.new("L", (x1 - x0 + 2 * pad, y1 - y0 + 2 * pad), 0)
        ImageDraw.Draw(scratch).text((xy[0] - x0 + pad, xy[1] - y0 + pad), text, font=font,
                                     fill=255)
        bx0, by0, bx1, by1 = scratch.getbbox()
        box = (x0 - pad + bx0, y0 - pad + by0, x0 - pad + bx1, y0 - pad + by1)
        self.draw.text(xy, text, font=font, fill=ink)
        el = TextElement(kind, text, box, size)
        self.elements.append(el)
        return el

    def rule(self, x0: int, x1: int, y: int, width: int = 1) -> None:
        self.draw.rectangle((x0, y, x1 - 1, y + width - 1), fill=0)
        self.elements.append(TextElement("rule", "", (x0, y, x1, y + width), 0))


class Canvas(Page):
    """A page whose strings can be centred, right-aligned or written at a column."""

    def line(self, y: int, text: str, kind: str, size: int, font: str, *, align: str = "left",
             left: int = 0, right: int = 0) -> TextElement:
        width = self.width_of(text, font, size)
        x = {"left": left, "right": right - width, "centre": (left + right - width) // 2}[align]
        return self.text((max(x, 0), y), text, kind, size, font)


def finish_page(page: Page, rng: np.random.Generator, *, scan: bool) -> np.ndarray:
    """The drawn page as ``[H, W, 3]`` uint8; ``scan``: paper tone, lighter (thermal) ink,
    sensor noise and a slight blur, as in a scanned receipt."""
    gray = np.asarray(page.img, dtype=np.float32) / 255.0
    if scan:
        import cv2

        paper = rng.uniform(0.80, 1.0)
        ink = rng.uniform(0.0, 0.45)
        gray = ink + (paper - ink) * gray
        shade = np.linspace(0, rng.uniform(-0.06, 0.06), gray.shape[0], dtype=np.float32)
        gray = gray + shade[:, None] + rng.normal(0, rng.uniform(0.0, 0.04),
                                                  gray.shape).astype(np.float32)
        sigma = rng.uniform(0.0, 1.0)
        if sigma > 0.3:
            gray = cv2.GaussianBlur(gray, (0, 0), sigma)
    g = (np.clip(gray, 0, 1) * 255 + 0.5).astype(np.uint8)
    return np.repeat(g[:, :, None], 3, axis=2)


def ink_mask(image: np.ndarray, threshold: int = 250) -> np.ndarray:
    """``[H, W]`` bool: pixels darker than ``threshold`` in any channel (0..255)."""
    img = image if image.ndim == 2 else image.min(axis=2)
    return img < threshold


def element_mask(elements: tuple[TextElement, ...] | list[TextElement],
                 size: tuple[int, int]) -> np.ndarray:
    """``[H, W]`` bool: union of the element boxes (difference array, no per-pixel loop)."""
    h, w = size
    b = np.asarray([e.box for e in elements], dtype=np.int64).reshape(-1, 4)
    b[:, [0, 2]] = b[:, [0, 2]].clip(0, w)
    b[:, [1, 3]] = b[:, [1, 3]].clip(0, h)
    diff = np.zeros((h + 1, w + 1), np.int64)
    np.add.at(diff, (b[:, 1], b[:, 0]), 1)
    np.add.at(diff, (b[:, 1], b[:, 2]), -1)
    np.add.at(diff, (b[:, 3], b[:, 0]), -1)
    np.add.at(diff, (b[:, 3], b[:, 2]), 1)
    return diff.cumsum(0).cumsum(1)[:h, :w] > 0
