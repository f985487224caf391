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

The module is the public face of the synthetic documents; the parts live by concern:

* :mod:`fovea_book.eval.document_types` -- :class:`TextElement`, :class:`Question`,
  :class:`Document` (``Box``);
* :mod:`fovea_book.eval.raster` -- the text rasteriser (:func:`font_path`, the page that
  records ink boxes), :func:`ink_mask`, :func:`element_mask`;
* :mod:`fovea_book.eval.layouts` -- the paper, receipt and invoice layouts
  (:func:`make_document`, :func:`make_receipt`, :func:`make_invoice`,
  :func:`synthetic_documents`, :data:`LAYOUTS`);
* :mod:`fovea_book.eval.wordings` -- how questions are phrased (:data:`WORDING_SETS`,
  :data:`WORDINGS`, :data:`FORM_WORDINGS`, :func:`phrase`, :func:`reword`).

Every name is re-exported here, so ``from fovea_book.eval.documents import X`` works as
before the split.
"""

from __future__ import annotations

from fovea_book.eval.document_types import Box, Document, Question, TextElement
from fovea_book.eval.layouts import (_ITEMS, LAYOUTS, make_document, make_invoice,
                                     make_receipt, synthetic_documents)
from fovea_book.eval.raster import element_mask, font_path, ink_mask
from fovea_book.eval.wordings import (FORM_FIELD, FORM_WORDINGS, WORDING_SETS, WORDINGS,
                                      check_wording, phrase, reword, wording_key)

__all__ = ["Box", "Document", "FORM_FIELD", "FORM_WORDINGS", "LAYOUTS", "Question",
           "TextElement", "WORDINGS", "WORDING_SETS", "element_mask", "font_path", "ink_mask",
           "make_document", "make_invoice", "make_receipt", "phrase", "reword",
           "synthetic_documents"]
