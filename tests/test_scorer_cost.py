"""Every scorer's declared cost (``importance.READS``) equals what its code actually reads.

Each check intercepts the one call through which a scorer looks at the page (the area
resize of the spectral residual, the detector's input, the OCR of the coarse view) and
compares the pixels that went in with the declaration, so a change of working resolution
that is not declared fails here.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fovea_core.importance.query as Q
import fovea_core.importance.saliency as S
import fovea_core.importance.text as T
from fovea_core.importance import READS, SCORERS, score, scorer_cost

SIZES = [(1024, 1024), (700, 450), (333, 517)]


def test_every_scorer_declares_a_cost():
    assert set(READS) == set(SCORERS)
    c = scorer_cost("query", (1024, 1024))
    assert (c.pixels, c.tokens) == (512 * 512, 1024)
    assert scorer_cost("none", (10, 10)).tokens == 0
    with pytest.raises(ValueError, match="declares no cost"):
        scorer_cost("nope", (10, 10))
    fn = lambda image, **kw: None  # noqa: E731
    fn.reads = lambda h, w: h * w // 4
    assert scorer_cost(fn, (64, 64)).pixels == 1024


@pytest.mark.parametrize("size", SIZES)
def test_spectral_residual_reads_its_thumbnail(size, monkeypatch):
    seen = []
    real = S.F.interpolate

    def spy(x, size=None, mode=None, **kw):
        if mode == "area":
            seen.append(size[0] * size[1])
        return real(x, size=size, mode=mode, **kw)

    monkeypatch.setattr(S.F, "interpolate", spy)
    img = torch.rand(1, 3, *size)
    score("saliency", img)
    assert seen == [READS["saliency"](*size)] == [READS["spectral_residual"](*size)]


@pytest.mark.parametrize("size", SIZES)
def test_text_detector_reads_its_input(size, monkeypatch):
    seen = []
    session, pre = T._det_parts()

    def fake_session(x):
        seen.append(int(np.prod(x.shape[-2:])))
        return np.zeros((1, 1, *x.shape[-2:]), np.float32)

    monkeypatch.setattr(T, "_det_parts", lambda: (fake_session, pre))
    T.text_probability(torch.rand(1, 3, *size))
    assert seen == [READS["text"](*size)]


@pytest.mark.parametrize("size", SIZES)
def test_query_scorer_reads_the_half_resolution_page(size, monkeypatch):
    seen = []

    def fake_read(img, **kw):
        seen.append(img.shape[0] * img.shape[1])
        return T.TextRead(np.zeros((0, 4), np.float32), [], np.zeros(0, np.float32))

    monkeypatch.setattr(Q, "read_text", fake_read)
    monkeypatch.setattr(Q, "_READ_CACHE", type(Q._READ_CACHE)())
    monkeypatch.setattr(Q, "_disk_cache", lambda: None)
    Q.read_page(torch.rand(1, 3, *size))
    assert seen == [READS["query"](*size)]


def test_coarse_ocr_disk_cache_round_trips(monkeypatch, tmp_path):
    from fovea_core.cache import SqliteCache

    store = SqliteCache(tmp_path / "reads.sqlite")
    monkeypatch.setattr(Q, "_disk_cache", lambda: store)
    calls = []

    def fake_read(img, min_conf=0.5):
        calls.append(1)
        return T.TextRead(np.array([[1, 2, 30, 12]], np.float32), ("TOTAL 9.00",),
                          np.array([0.9], np.float32))

    monkeypatch.setattr(Q, "read_text", fake_read)
    img = np.zeros((40, 60, 3), np.uint8)
    a = Q._read_text_cached(img, ("k", img.shape, 0.5))
    b = Q._read_text_cached(img, ("k", img.shape, 0.5))
    assert calls == [1] and b.texts == a.texts == ("TOTAL 9.00",)
    np.testing.assert_array_equal(a.boxes, b.boxes)
    Q._read_text_cached(img, ("other", img.shape, 0.5))
    assert calls == [1, 1]
