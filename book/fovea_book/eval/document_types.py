"""The types of a document page: :class:`TextElement` (a drawn string and its ink box),
:class:`Question` (a question, its answers and their boxes) and :class:`Document` (a page
and its questions), shared by the synthetic layouts (:mod:`fovea_book.eval.layouts`) and
the real sets (SROIE, FUNSD). Re-exported by :mod:`fovea_book.eval.documents`."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Box", "Document", "Question", "TextElement"]

Box = tuple[int, int, int, int]  # (x0, y0, x1, y1) in pixels, x1/y1 exclusive


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
