"""fovea_core.importance: score-map contract, each scorer's behaviour, and bad input.

The OCR (RapidOCR) and sentence-encoder (MiniLM) models load once per test session.
"""

import math

import cv2
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fovea_core import build_pyramid
from fovea_core.importance import (SCORERS, center_bias, edge_density, fixation_from_scores,
                                   pool_to_grid, query_scores, score, spatial_prior,
                                   spectral_residual, text_likelihood)
from fovea_core.importance.base import normalise
from fovea_core.importance.query import (box_coverage, clear_caches, embed,
                                         extend_along_rows, query_words)

CHEAP = ["spectral_residual", "edge_density", "center_bias", "saliency"]
MODEL = ["text", "text_saliency", "query", "query_saliency"]


# ----------------------------------------------------------------------------- stimuli
def page(lines, size=(512, 384)):
    """White page with black text ``[(text, (x, y) baseline-left, scale), ...]``, uint8 RGB."""
    img = np.full(size + (3,), 255, np.uint8)
    for text, (x, y), sc in lines:
        cv2.putText(img, text, (x, y), cv2.FONT_HERSHEY_SIMPLEX, sc, (0, 0, 0), 2, cv2.LINE_AA)
    return img


def odd_one_out(odd_rc, size=256, n=8, half=14, thick=6):
    """n x n grid of vertical bars with one horizontal bar at grid cell ``odd_rc``."""
    img = np.full((size, size), 255, np.uint8)
    step = size // n
    for r in range(n):
        for c in range(n):
            cy, cx = r * step + step // 2, c * step + step // 2
            if (r, c) == odd_rc:
                cv2.line(img, (cx - half, cy), (cx + half, cy), 0, thick)
            else:
                cv2.line(img, (cx, cy - half), (cx, cy + half), 0, thick)
    return img


@pytest.fixture(scope="session")
def models():
    """Load RapidOCR and MiniLM once (lazy singletons) so later tests measure behaviour only."""
    from fovea_core.importance.query import text_encoder
    from fovea_core.importance.text import ocr_engine

    return ocr_engine(), text_encoder()


@pytest.fixture(scope="session")
def invoice():
    return page([("INVOICE", (40, 60), 1.2), ("TOTAL 42.00", (40, 460), 1.2)])


# ----------------------------------------------------------------------------- contract
def check_map(s, b, gh, gw):
    assert isinstance(s, torch.Tensor) and s.dtype == torch.float32
    assert s.shape == (b, gh, gw)
    assert torch.isfinite(s).all() and s.min() >= 0 and s.max() <= 1 + 1e-6


@pytest.mark.parametrize("name", CHEAP)
@pytest.mark.parametrize("h, w, patch", [(96, 128, 16), (100, 75, 16), (64, 64, 14)])
def test_cheap_scorers_contract_and_determinism(name, h, w, patch):
    x = torch.rand(2, 3, h, w, generator=torch.Generator().manual_seed(1))
    s = score(name, x, patch=patch)
    check_map(s, 2, math.ceil(h / patch), math.ceil(w / patch))
    assert torch.allclose(s.amax(dim=(1, 2)), torch.ones(2))              # peak-normalised
    assert torch.equal(s, score(name, x, patch=patch))                     # deterministic
    # A Pyramid, a numpy HWC uint8 and the tensor give the same map.
    assert torch.allclose(score(name, build_pyramid(x, 2), patch=patch), s)
    as_np = (x[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    s_np = score(name, as_np, patch=patch)
    assert s_np.shape == (1,) + s.shape[1:]


@pytest.mark.parametrize("name", MODEL)
def test_model_scorers_contract_and_determinism(models, invoice, name):
    x = np.stack([invoice, invoice[::-1].copy()])                          # batch of 2
    s = score(name, x, query="What is the total?")
    check_map(s, 2, 32, 24)
    clear_caches()                                     # recompute OCR + embeddings from scratch
    assert torch.equal(s, score(name, x, query="What is the total?"))


def test_registry_names():
    assert {"spectral_residual", "edge_density", "center_bias", "text", "query", "saliency",
            "text_saliency"} <= set(SCORERS)


# ----------------------------------------------------------------------------- saliency
@pytest.mark.parametrize("odd_rc", [(2, 5), (6, 1), (4, 4)])
def test_spectral_residual_finds_the_odd_one_out(odd_rc):
    s = spectral_residual(odd_one_out(odd_rc))                             # [1, 16, 16]
    want = torch.tensor([(odd_rc[1] * 32 + 16) / 256, (odd_rc[0] * 32 + 16) / 256])
    fix = fixation_from_scores(s, image_size=(256, 256))[0]
    assert (fix - want).abs().max() <= 1.5 / 16                            # within 1.5 cells
    # ... and it is a real peak, not a flat map.
    assert s.max() > 3 * s.median()


def test_edge_density_prefers_text_texture_over_flat():
    img = page([("lorem ipsum dolor", (10, 40), 0.7)], size=(128, 256))
    s = edge_density(img)                                                  # [1, 8, 16]
    assert float(s[0, 1:3].mean()) > 5 * float(s[0, 5:].mean())
    assert float(s[0, 5:].max()) == 0.0                                    # flat => exactly 0
    assert torch.equal(edge_density(np.full((64, 64), 128, np.uint8)), torch.zeros(1, 4, 4))


def test_center_bias_symmetric_with_peak_at_centre():
    s = center_bias(torch.zeros(1, 3, 128, 192))[0]                        # [8, 12]
    assert torch.allclose(s, s.flip(0), atol=1e-6) and torch.allclose(s, s.flip(1), atol=1e-6)
    r, c = divmod(int(s.argmax()), s.shape[1])
    assert (r, c) in {(3, 5), (3, 6), (4, 5), (4, 6)}                      # the 4 central cells
    # anisotropic: nu < 1 => falls faster vertically than horizontally (per pixel)
    assert s[3, 5 - 3] > s[3 - 3, 5]
    # content does not matter
    assert torch.equal(center_bias(torch.rand(1, 3, 128, 192))[0], s)


# ----------------------------------------------------------------------------- text
def test_text_scorer_puts_mass_on_the_text(models):
    img = page([("Quarterly report 2024", (40, 200), 1.0)], size=(384, 512))
    s = text_likelihood(img)[0]                                            # [24, 32]
    ys, xs = np.nonzero((255 - img[..., 0]) > 0)
    rows = slice(ys.min() // 16, ys.max() // 16 + 1)
    cols = slice(xs.min() // 16, xs.max() // 16 + 1)
    inside = torch.zeros_like(s, dtype=torch.bool)
    inside[rows, cols] = True
    assert float(s[inside].sum()) > 0.9 * float(s.sum())                  # >90% of the mass
    assert float(s[inside].mean()) > 20 * float(s[~inside].mean())
    assert bool(inside[divmod(int(s.argmax()), s.shape[1])])


def test_text_scorer_on_blank_page_is_zero_or_tiny(models):
    s = text_likelihood(np.full((128, 128, 3), 255, np.uint8))
    check_map(s, 1, 8, 8)


# ----------------------------------------------------------------------------- query
def region_mean(s, y0, y1):
    return float(s[0, y0 // 16:(y1 + 15) // 16].mean())


def test_query_ranks_the_matching_line_above_unrelated_text(models):
    # TOTAL at the TOP, INVOICE at the bottom: the weak "total -> bottom" prior works against
    # the answer line, so only the semantic match can put the peak on it.
    img = page([("TOTAL 42.00", (40, 60), 1.2), ("INVOICE", (40, 460), 1.2)])
    s, reads, sims = query_scores(img, "What is the total?", return_reads=True)
    texts = [t.upper() for t in reads[0].texts]
    assert any("TOTAL" in t for t in texts) and any("INVOICE" in t for t in texts)
    sim = dict(zip(texts, sims[0]))
    assert max(v for t, v in sim.items() if "TOTAL" in t) > sim["INVOICE"] + 0.2
    assert region_mean(s, 20, 80) > 2 * region_mean(s, 420, 480)
    assert fixation_from_scores(s)[0, 1] < 0.25                            # fixates the top line
    # the same page and another question moves the peak to the other line
    s2 = query_scores(img, "Who issued this invoice?")
    assert fixation_from_scores(s2)[0, 1] > 0.75


@pytest.mark.parametrize("query, where", [
    ("What does the footer say?", "bottom"), ("What is written in the header?", "top"),
    ("What is at the bottom of the page?", "bottom")])
def test_query_respects_spatial_words(models, query, where):
    img = page([("NOTE", (40, 60), 1.2), ("NOTE", (40, 460), 1.2)])       # identical lines
    s = query_scores(img, query)
    top, bottom = region_mean(s, 20, 80), region_mean(s, 420, 480)
    assert (bottom > 3 * top) if where == "bottom" else (top > 3 * bottom)


def test_query_on_pyramid_and_coarse_levels(models, invoice):
    s0 = query_scores(invoice, "What is the total?")
    s1 = query_scores(build_pyramid(invoice, 3), "What is the total?")
    assert torch.allclose(s0, s1)                                          # level 1 reused
    s2 = query_scores(invoice, "What is the total?", coarse_level=2)
    assert fixation_from_scores(s2)[0, 1] > 0.75                           # still the TOTAL line


def test_query_row_extension_marks_the_value_next_to_the_label(models):
    img = page([("Cashier: Ann", (20, 80), 0.9), ("TOTAL", (20, 300), 0.9),
                ("42.00", (280, 300), 0.9)], size=(384, 384))
    on, reads, _ = query_scores(img, "What is the total?", return_reads=True)
    off = query_scores(img, "What is the total?", rows=False)
    value = [b for t, b in zip(reads[0].texts, reads[0].boxes) if "42" in t][0]
    cell = (int((value[1] + value[3]) / 2) // 16, int((value[0] + value[2]) / 2) // 16)
    assert float(off[0][cell]) < 0.8                # the number alone: weaker than its label
    assert float(on[0][cell]) > 0.99                # stretched label: the value is at the peak


def test_extend_along_rows():
    b = torch.tensor([[10.0, 10, 50, 30], [100, 12, 150, 32], [5, 60, 40, 80], [0, 40, 8, 58]])
    out = extend_along_rows(b)
    assert out[:, 2].tolist() == [150, 150, 40, 8]            # row 1 stretched; others alone
    assert torch.equal(out[:, [0, 1, 3]], b[:, [0, 1, 3]])
    assert extend_along_rows(torch.zeros(0, 4)).shape == (0, 4)


def test_embedding_cache_returns_the_same_vectors(models):
    clear_caches()
    a = embed(["TOTAL 42.00", "INVOICE", "TOTAL 42.00"])
    assert a.shape == (3, 384) and np.allclose(np.linalg.norm(a, axis=1), 1, atol=1e-5)
    assert np.array_equal(a[0], a[2]) and np.array_equal(embed(["INVOICE"])[0], a[1])
    assert embed([]).shape == (0, 384)


# ----------------------------------------------------------------------------- spatial prior
def test_spatial_prior_profiles():
    assert torch.equal(spatial_prior("What is the name?", (8, 6)), torch.ones(8, 6))
    foot = spatial_prior("footer", (9, 6))
    assert torch.all(foot[1:] >= foot[:-1]) and foot[-1, 0] > 0.9 and foot[0, 0] < 0.1
    tl = spatial_prior("What is in the top-left corner?", (9, 9))
    assert int(tl.argmax()) == 0 and tl[-1, -1] < 0.01
    right = spatial_prior("right column", (6, 9))
    assert torch.all(right[:, 1:] >= right[:, :-1]) and torch.equal(right[0], right[-1])
    total = spatial_prior("What is the total?", (9, 6))                    # weak: 0.5 + 0.5 m
    assert 0.5 <= float(total.min()) < 0.6 and float(total.max()) > 0.95
    assert (spatial_prior("anything", (5, 5)) > 0).all()
    assert query_words("Top-LEFT, please!") == ["top", "left", "please"]


# ----------------------------------------------------------------------------- helpers
def test_box_coverage_matches_areas():
    cov = box_coverage(torch.tensor([[16.0, 16.0, 32.0, 32.0], [0.0, 0.0, 40.0, 24.0]]),
                       (48, 64), 16)                                       # [2, 3, 4]
    assert cov.shape == (2, 3, 4)
    assert cov[0, 1, 1] == 1 and cov[0].sum() == 1
    assert torch.isclose((cov[1] * 256).sum(), torch.tensor(40.0 * 24.0))
    assert cov[1, 0, 2] == 0.5 and cov[1, 1, 2] == 0.25


def test_pool_to_grid_partial_cells_average_in_image_pixels():
    m = torch.ones(2, 40, 50)
    assert torch.allclose(pool_to_grid(m, 16), torch.ones(2, 3, 4))
    ramp = torch.arange(40.0)[:, None].expand(40, 50)[None]
    assert torch.isclose(pool_to_grid(ramp, 16)[0, 2, 0], torch.tensor(35.5))  # rows 32..39


def test_normalise_keeps_zero_maps_and_clamps():
    out = normalise(torch.stack([torch.zeros(2, 2), torch.tensor([[-1.0, 2.0], [1.0, 4.0]])]))
    assert torch.equal(out[0], torch.zeros(2, 2))
    assert torch.equal(out[1], torch.tensor([[0.0, 0.5], [0.25, 1.0]]))


# ----------------------------------------------------------------------------- fixation
def test_fixation_flat_map_is_centre_and_peak_is_found():
    assert torch.allclose(fixation_from_scores(torch.ones(1, 5, 7)), torch.tensor([[0.5, 0.5]]))
    s = torch.zeros(2, 6, 8)
    s[0, 1, 6] = 1.0
    s[1, 4, 0] = 3.0
    fix = fixation_from_scores(s)
    assert torch.allclose(fix, torch.tensor([[6.5 / 8, 1.5 / 6], [0.5 / 8, 4.5 / 6]]))
    # with image_size: pixel centre of the (possibly partial) cell over (W, H)
    fix_px = fixation_from_scores(s, image_size=(90, 120), patch=16)
    assert torch.allclose(fix_px[0], torch.tensor([104 / 120, 24 / 90]))
    assert torch.allclose(fix_px[1], torch.tensor([8 / 120, 72 / 90]))    # row 4 is 64..80 px
    s[1, 4, 0], s[1, 5, 0] = 0.0, 3.0
    fix_px = fixation_from_scores(s, image_size=(90, 120), patch=16)
    assert torch.allclose(fix_px[1], torch.tensor([8 / 120, 85 / 90]))    # partial row 80..90


def test_fixation_smoothing_prefers_a_region_over_a_single_spike():
    s = torch.zeros(1, 9, 9)
    s[0, 1, 1] = 1.0                                    # isolated spike
    s[0, 6:9, 6:9] = 0.8                                # coherent blob
    assert torch.allclose(fixation_from_scores(s), torch.tensor([[7.5 / 9, 7.5 / 9]]))
    assert torch.allclose(fixation_from_scores(s, smooth=False), torch.tensor([[1.5 / 9, 1.5 / 9]]))


def test_fixation_tie_break_is_nearest_centre_then_row_major():
    s = torch.zeros(1, 5, 5)
    s[0, 0, 0] = s[0, 4, 4] = s[0, 1, 2] = s[0, 3, 2] = 1.0   # (1,2) and (3,2) equally central
    assert torch.allclose(fixation_from_scores(s, smooth=False), torch.tensor([[0.5, 0.3]]))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 12), st.integers(1, 12), st.integers(0, 2**31 - 1))
def test_fixation_property_unique_max(b, gh, gw, seed):
    s = torch.rand(b, gh, gw, generator=torch.Generator().manual_seed(seed))
    fix = fixation_from_scores(s, smooth=False)
    assert fix.shape == (b, 2) and (fix > 0).all() and (fix < 1).all()
    flat = s.reshape(b, -1).argmax(1)
    want = torch.stack([((flat % gw).float() + 0.5) / gw, ((flat // gw).float() + 0.5) / gh], -1)
    assert torch.allclose(fix, want)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("call, message", [
    (lambda: score("nope", torch.rand(1, 3, 32, 32)), "unknown scorer"),
    (lambda: score("edge_density", torch.rand(1, 3, 32, 32), patch=0), "patch"),
    (lambda: score("edge_density", torch.rand(1, 3, 8, 32)), "smaller than one 16px patch"),
    (lambda: score("edge_density", torch.rand(3, 32)), r"\[C,H,W\]"),
    (lambda: score("edge_density", torch.rand(1, 4, 32, 32)), "1 or 3 channels"),
    (lambda: score("edge_density", torch.full((1, 3, 32, 32), float("nan"))), "NaN"),
    (lambda: score("center_bias", torch.rand(0, 3, 32, 32)), "empty"),
    (lambda: score("query", torch.rand(1, 3, 32, 32)), "query="),
    (lambda: score("query", torch.rand(1, 3, 32, 32), query="   "), "non-empty"),
    (lambda: query_scores(torch.rand(1, 3, 32, 32), "total", coarse_level=3), "coarse_level"),
    (lambda: query_scores(torch.rand(1, 3, 32, 32), "total", coarse_level=-1), "coarse_level"),
    (lambda: spectral_residual(torch.rand(1, 3, 32, 32), sigma=-1), "sigma"),
    (lambda: center_bias(torch.rand(1, 3, 32, 32), nu=0), "nu"),
    (lambda: fixation_from_scores(torch.rand(4, 4)), r"\[B, Gh, Gw\]"),
    (lambda: fixation_from_scores(torch.full((1, 2, 2), float("inf"))), "NaN or inf"),
    (lambda: fixation_from_scores(torch.rand(1, 2, 2), image_size=(64, 64)), "grid"),
])
def test_bad_input_raises_clear_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()
