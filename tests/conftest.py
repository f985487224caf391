"""Hypothesis profiles, and the page fixtures several test modules share.

``make test`` (and CI) run the ``default`` profile: derandomised, so every run draws the same
examples and a red CI is reproducible from a clean clone. Random exploration, which is how
new counter-examples are found, is ``HYPOTHESIS_PROFILE=explore python -m pytest`` (fresh
random draws on every run; the number of examples is each test's own); a failure it finds
becomes a regression test.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("default", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(scope="module")
def receipt():
    """``(pyramid, question)``: synthetic receipt 0 and its first question (the cascade's
    switch-to-``resize`` rules are tested on it)."""
    from fovea_book.eval.documents import make_document
    from fovea_core import build_pyramid

    doc = make_document(0, layout="receipt")
    return build_pyramid(doc.image), doc.questions[0].question
