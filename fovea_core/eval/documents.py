"""Synthetic DocVQA-like pages with every text element's box and string recorded.

A page (default 1024 x 1024 px, so the full level-0 grid of 16 px patches is 64 x 64 =
4096 tokens) holds the parts of a scientific or business document that a fixed token
budget must share: a running header with a date, a title, an author line, paragraphs, a
formula, a table ending in a total, margin notes, and a footer that cites a source. Font
sizes run from 8 to 28 px. Fonts are matplotlib's bundled DejaVu TTFs, so no system font
is needed, and a page is a pure function of its seed.

Each :class:`TextElement` records its string and its *ink* box (the tight bounding box of
the pixels it darkened), so a test can check that boxes and rendered ink agree. Questions
("What is the title?", "What is the total in the table?", "What does the footer cite?",
...) point at one element each; the answer's box is kept in the :class:`Question` for the
reader and is never passed to an allocator or scorer (only ``Document.image`` and the
question text are).

Questions follow DocVQA [Mathew et al. 2021]: extractive answers, scored with ANLS.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

Box = tuple[int, int, int, int]  # (x0, y0, x1, y1) in pixels, x1/y1 exclusive

_WORDS = (
    "analysis method results model data sample signal image vision token budget retina "
    "fovea periphery density pyramid level patch scale window region report study design "
    "system network layer output input value measure error noise contrast detail field "
    "centre border margin table total figure section review summary process quality level "
    "control market growth price sales order account balance policy energy water light "
    "colour shape motion memory attention language reading letter number record record "
    "survey group effect change factor rate area point line surface structure function "
    "simple strong early local global visual human natural formal direct common public"
).split()
_TITLE_WORDS = (
    "Adaptive Foveated Sampling Visual Tokens Retinal Budgets Sparse Attention Document "
    "Understanding Efficient Cortical Magnification Dynamic Resolution Learned Allocation "
    "Multiscale Reading Receipts Layout Analysis Robust Scene Text Fixation Guided Coverage"
).split()
_SURNAMES = ("Moreau Tanaka Okafor Lindqvist Castillo Novak Haddad Petrov Rossi Schmidt "
             "Oliveira Kowalski Nakamura Brennan Duarte Weber Larsen Costa Ferreira Ahmed").split()
_INITIALS = "ABCDEFGHJKLMNPRST"
_MONTHS = ("January February March April May June July August September October "
           "November December").split()
_JOURNALS = ("Journal of Synthetic Documents", "Proceedings of Vision Budgets",
             "Annals of Token Allocation", "Review of Foveated Systems")
_VENUES = ("J. Vis.", "Vision Res.", "Proc. CVPR", "Proc. ICDAR", "Nat. Neurosci.", "TPAMI")
_ITEMS = ("Sensors", "Lenses", "Cables", "Licences", "Storage", "Labour", "Travel",
          "Printing", "Shipping", "Support", "Training", "Hosting")
_NOTES = ("see Fig. 2", "revised", "cf. Eq. 1", "draft", "checked", "see Table 1",
          "note 4", "verified")


def font_path(name: str = "DejaVuSans.ttf") -> str:
    """Path of one of matplotlib's bundled TrueType fonts (no system fonts needed)."""
    import matplotlib

    path = os.path.join(matplotlib.get_data_path(), "fonts", "ttf", name)
    if not os.path.exists(path):
        raise ValueError(f"font {name!r} is not bundled with matplotlib (looked in {path})")
    return path


@dataclass(frozen=True)
class TextElement:
    """One rendered string (or a table rule, ``text == ""``).

    Attributes:
        kind: ``header``, ``title``, ``authors``, ``paragraph``, ``formula``, ``table``,
            ``margin``, ``footer`` or ``rule``.
        text: the exact string drawn.
        box: ink bounding box ``(x0, y0, x1, y1)`` in page pixels (exclusive ends).
        size_px: font size in pixels (0 for rules).
    """

    kind: str
    text: str
    box: Box
    size_px: int


@dataclass(frozen=True)
class Question:
    """A question whose answer is printed on the page.

    Attributes:
        qid: id unique within the document.
        question: the question text (what a query-aware scorer may see).
        answers: accepted answer strings (ANLS takes the best match).
        boxes: one box per printed line of the answer, page pixels; hidden from allocators.
        field: what is asked (``title``, ``total``, ``citation``, ...).
        size_px: font size of the answer (0 if unknown, e.g. scanned receipts).
    """

    qid: str
    question: str
    answers: tuple[str, ...]
    boxes: tuple[Box, ...]
    field: str
    size_px: int = 0

    @property
    def union_box(self) -> Box:
        """The box enclosing every line of the answer."""
        b = np.asarray(self.boxes)
        return (int(b[:, 0].min()), int(b[:, 1].min()), int(b[:, 2].max()), int(b[:, 3].max()))


@dataclass(frozen=True, eq=False)
class Document:
    """A page and its questions.

    Attributes:
        doc_id: id unique within its dataset.
        image: ``[H, W, 3]`` uint8 RGB page.
        questions: the question/answer pairs.
        elements: every text element (synthetic pages; empty for scans without layout).
        source: dataset name.
    """

    doc_id: str
    image: np.ndarray
    questions: tuple[Question, ...]
    elements: tuple[TextElement, ...] = field(default=())
    source: str = "synthetic"

    @property
    def size(self) -> tuple[int, int]:
        """``(H, W)`` in pixels."""
        return self.image.shape[0], self.image.shape[1]


class _Page:
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


def _money(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(np.round(rng.uniform(lo, hi), 2))


def _fmt_money(v: float) -> str:
    return f"{v:,.2f}"


def _sentence_lines(page: _Page, rng: np.random.Generator, width: int, size: int,
                    n_lines: int) -> list[str]:
    """Greedy word wrap of random words into ``n_lines`` lines at most ``width`` px wide."""
    words = list(rng.choice(_WORDS, size=n_lines * 16))
    lines, cur = [], ""
    for w in words:  # string layout, not a tensor loop
        trial = f"{cur} {w}".strip()
        if page.width_of(trial, "DejaVuSans.ttf", size) > width:
            lines.append(cur)
            cur = w
            if len(lines) == n_lines:
                break
        else:
            cur = trial
    return lines


def make_document(seed: int, *, width: int = 1024, height: int = 1024,
                  doc_id: str | None = None) -> Document:
    """Render one synthetic page deterministically from ``seed``.

    Args:
        seed: any non-negative integer; the page is a pure function of it.
        width, height: page size in pixels (the layout is designed for 1024 x 1024;
            accepted range 768..2048 each).

    Returns:
        A :class:`Document` with ~40 text elements and 7 questions (title, first author,
        header date, formula, a table amount, the table total, the footer citation).
    """
    if not (768 <= width <= 2048 and 768 <= height <= 2048):
        raise ValueError(f"width and height must be in [768, 2048], got {width} x {height}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    rng = np.random.default_rng(seed)
    page = _Page(width, height)
    left, right = 112, width - 80
    content = right - left
    q: list[Question] = []

    def ask(qid: str, question: str, el: TextElement, field_: str, *alternatives: str):
        q.append(Question(qid, question, (el.text, *alternatives), (el.box,), field_, el.size_px))

    # running header: journal (left) and date (right), 10-12 px
    hs = int(rng.integers(10, 13))
    page.text((left, 28), str(rng.choice(_JOURNALS)), "header", hs)
    date = f"{rng.choice(_MONTHS)} {int(rng.integers(1, 29))}, {int(rng.integers(1995, 2026))}"
    el = page.text((right - page.width_of(date, "DejaVuSans.ttf", hs), 28), date, "header", hs)
    ask("date", "What is the date in the header?", el, "date")
    page.rule(left, right, 28 + hs + 10)

    # title, 20-28 px bold
    ts = int(rng.integers(20, 29))
    nwords = int(rng.integers(3, 6))
    title = " ".join(rng.choice(_TITLE_WORDS, size=nwords, replace=False))
    while page.width_of(title, "DejaVuSans-Bold.ttf", ts) > content:
        title = title.rsplit(" ", 1)[0]
    y = 80
    el = page.text((left, y), title, "title", ts, "DejaVuSans-Bold.ttf")
    ask("title", "What is the title?", el, "title")
    y += ts + 18

    # authors, 12-15 px
    aus = int(rng.integers(12, 16))
    names = [f"{rng.choice(list(_INITIALS))}. {s}"
             for s in rng.choice(_SURNAMES, size=3, replace=False)]
    x = left
    for i, name in enumerate(names):
        el = page.text((x, y), name, "authors", aus)
        if i == 0:
            ask("author", "Who is the first author?", el, "author")
        x += page.width_of(name + "     ", "DejaVuSans.ttf", aus)
    y += aus + 26

    # body paragraph(s), 11-14 px
    bs = int(rng.integers(11, 15))
    lead = int(bs * 1.55)

    def paragraph(y: int, n: int) -> int:
        for line in _sentence_lines(page, rng, content, bs, n):
            page.text((left, y), line, "paragraph", bs)
            y += lead
        return y + 12

    y = paragraph(y, int(rng.integers(4, 7)))

    # formula, 15-20 px serif italic, centred
    fs = int(rng.integers(15, 21))
    a, b, c = int(rng.integers(2, 10)), int(rng.integers(2, 10)), int(rng.integers(1, 20))
    var = str(rng.choice(list("xtuz")))
    formula = f"f({var}) = {a}{var}\u00b2 + {b}{var} - {c}"
    fw = page.width_of(formula, "DejaVuSerif-Italic.ttf", fs)
    el = page.text(((left + right - fw) // 2, y + 6), formula, "formula", fs,
                   "DejaVuSerif-Italic.ttf")
    ask("formula", "What is the formula?", el, "formula", formula.replace("\u00b2", "^2"),
        formula.replace("\u00b2", "2"))
    y += fs + 30

    y = paragraph(y, int(rng.integers(2, 4)))

    # table: Item | Qty | Amount, 4-6 rows, Total row; 11-15 px
    tsz = int(rng.integers(11, 16))
    rows = int(rng.integers(4, 7))
    items = list(rng.choice(_ITEMS, size=rows, replace=False))
    qty = rng.integers(1, 20, size=rows)
    amounts = [_money(rng, 10, 900) for _ in range(rows)]
    total = float(np.round(sum(amounts), 2))
    tl, tr = left + 40, right - 40
    cols = (tl + 8, tl + int(0.55 * (tr - tl)), tr - 8)  # item x0, qty x0, amount right edge
    rh = int(tsz * 1.9)
    page.rule(tl, tr, y, 2)
    y += 8
    page.text((cols[0], y), "Item", "table", tsz, "DejaVuSans-Bold.ttf")
    page.text((cols[1], y), "Qty", "table", tsz, "DejaVuSans-Bold.ttf")
    page.text((cols[2] - page.width_of("Amount", "DejaVuSans-Bold.ttf", tsz), y), "Amount",
              "table", tsz, "DejaVuSans-Bold.ttf")
    y += rh
    page.rule(tl, tr, y - 6)
    pick = int(rng.integers(0, rows))
    for i in range(rows):  # a handful of table rows
        page.text((cols[0], y), items[i], "table", tsz)
        page.text((cols[1], y), str(int(qty[i])), "table", tsz)
        s = _fmt_money(amounts[i])
        el = page.text((cols[2] - page.width_of(s, "DejaVuSans.ttf", tsz), y), s, "table", tsz)
        if i == pick:
            ask("amount", f"What is the amount for {items[i]}?", el, "amount")
        y += rh
    page.rule(tl, tr, y - 6)
    page.text((cols[0], y), "Total", "table", tsz, "DejaVuSans-Bold.ttf")
    s = _fmt_money(total)
    el = page.text((cols[2] - page.width_of(s, "DejaVuSans-Bold.ttf", tsz), y), s, "table", tsz,
                   "DejaVuSans-Bold.ttf")
    ask("total", "What is the total in the table?", el, "total")
    y += rh
    page.rule(tl, tr, y - 4, 2)
    y += 20

    # more body text while it fits above the footer
    footer_y = height - 44
    n_more = max(0, (footer_y - 40 - y) // lead)
    y = paragraph(y, int(min(n_more, rng.integers(6, 16))))

    # margin notes in the left margin, 8-10 px
    for ny in np.sort(rng.choice(np.arange(200, footer_y - 60, 40), size=3, replace=False)):
        page.text((12, int(ny)), str(rng.choice(_NOTES)), "margin", int(rng.integers(8, 11)))

    # footer: citation (left) and page number (right), 9-11 px
    fts = int(rng.integers(9, 12))
    page.rule(left, right, footer_y - 10)
    label = "Cites:"
    page.text((left, footer_y), label, "footer", fts)
    cite = (f"{rng.choice(_SURNAMES)} et al. ({int(rng.integers(1980, 2025))}) "
            f"{rng.choice(_VENUES)} {int(rng.integers(1, 60))}")
    el = page.text((left + page.width_of(label + " ", "DejaVuSans.ttf", fts), footer_y), cite,
                   "footer", fts)
    ask("citation", "What does the footer cite?", el, "citation")
    pno = str(int(rng.integers(1, 400)))
    page.text((right - page.width_of(pno, "DejaVuSans.ttf", fts), footer_y), pno, "footer", fts)

    gray = np.asarray(page.img)
    image = np.repeat(gray[:, :, None], 3, axis=2)
    return Document(doc_id or f"syn{seed:05d}", image, tuple(q), tuple(page.elements),
                    "synthetic")


def synthetic_documents(n: int, seed: int = 0, **kwargs) -> list[Document]:
    """``n`` pages with seeds ``seed, seed+1, ...`` (see :func:`make_document`)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return [make_document(seed + i, **kwargs) for i in range(n)]


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
