"""The synthetic pages are pinned: a few pages of each layout and wording hash to the values
they had when ``eval/documents.py`` was split into modules (issue 21 item 4: a pure move).

A page is a pure function of its seed (``fovea_book.eval.documents``), drawn with
matplotlib's bundled DejaVu/STIX/cm fonts and Pillow's rasteriser; the hashes hold for the
project's pinned environment (``.venv``). If a deliberate change to the pages (or an
upgrade of Pillow or matplotlib's fonts) alters them, every cached read and stored row of
the synthetic sets changes too: update these values in the same commit and say why."""

from __future__ import annotations

import hashlib

import pytest

from fovea_book.eval.documents import make_document

#: (layout, seed, wording) -> the first 16 hex digits of :func:`_digest`
PINNED = {
    ("paper", 0, "default"): "c186e090812627cb",
    ("paper", 7, "train"): "1fb59c97409354cb",
    ("paper", 12, "heldout"): "ec55a24d8e824776",
    ("receipt", 0, "default"): "e3666b7a160afe2c",
    ("receipt", 7, "train"): "0200d0b2e547feca",
    ("receipt", 12, "heldout"): "d09851be4f5baff5",
    ("invoice", 0, "default"): "0c378a269c047449",
    ("invoice", 7, "train"): "0210e0a2f6d28ef3",
    ("invoice", 12, "heldout"): "d738a53a708c3f32",
}


def _digest(doc) -> str:
    """SHA-256 of the page's pixels (with their shape) and of its id, questions (text,
    answer, box, field), text elements (kind, string, ink box, size) and source."""
    h = hashlib.sha256()
    h.update(repr(doc.image.shape).encode())
    h.update(doc.image.tobytes())
    h.update(repr((doc.doc_id, doc.questions, doc.elements, doc.source)).encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("layout, seed, wording", sorted(PINNED))
def test_page_is_unchanged(layout, seed, wording):
    doc = make_document(seed, layout=layout, wording=wording)
    assert _digest(doc) == PINNED[layout, seed, wording]
