"""The one-pass CPU sampler (``sample_image_onepass_cpu`` in cuda/fovea_kernels.cu, issue 22):
its pyramid equals ``cv2.pyrDown`` bit for bit, and ``sample_image`` through it equals the
two-step path (``cv2.pyrDown`` levels + gather kernel, ``onepass=False``) and the exact torch
reference on the same pyramid, bit for bit."""

from __future__ import annotations

import ctypes
import shutil

import cv2
import numpy as np
import pytest
import torch

from fovea_book import kernels as K
from fovea_core.kernels.cpu import _cpu_lib
from fovea_book.reference_samplers import sample_reference
from fovea_core.tokens import TokenSet

pytestmark = pytest.mark.skipif(shutil.which("g++") is None,
                                reason="g++ not installed: no CPU kernel build")

SIZES = [(1, 1), (3, 5), (17, 33), (2, 9), (40, 7), (1024, 768)]


def _tokens(g: torch.Generator, b: int, h: int, w: int, n: int = 24, patch: int = 16
            ) -> TokenSet:
    """Random tokens of levels 0..top (a third integer, the rest fractional), the first six
    on the image's corners and edges."""
    top = min(h, w).bit_length() - 1
    centers = torch.rand(b, n, 2, generator=g)
    centers[:, :6] = torch.tensor([[0.0, 0.0], [1.0, 1.0], [1.0, 0.0], [0.0, 1.0],
                                   [0.5, 1.0], [1.0, 0.5]])
    levels = torch.rand(b, n, generator=g) * top
    levels[:, ::3] = levels[:, ::3].round()
    levels[:, 1] = float(top)                                  # the top level is read
    return TokenSet(centers, levels, torch.zeros(b, n), torch.full((b, 1, 2), 0.5), (h, w),
                    patch)


def _onepass_pyramid(img: np.ndarray, num_levels: int) -> list[np.ndarray]:
    """Levels 1.. that ``sample_image_onepass_cpu`` writes for ``img [B, H, W, C]`` (no
    tokens), each ``[B, H_m, W_m, C]``."""
    b, h, w, c = img.shape
    shapes, hm, wm = [], h, w
    for _ in range(1, num_levels):
        hm, wm = (hm + 1) // 2, (wm + 1) // 2
        shapes.append((b, hm, wm, c))
    work = np.full(sum(int(np.prod(s)) for s in shapes) + 1, np.nan, dtype=np.float32)
    out = torch.empty(0)
    rc = _cpu_lib().sample_image_onepass_cpu(img.ctypes.data, b, h, w, c, num_levels,
                                             work.ctypes.data, 16, 0, None, None, None,
                                             out.data_ptr(), 1 << 30)
    assert rc == num_levels                                    # no tokens: all levels asked
    levels, off = [], 0
    for s in shapes:
        k = int(np.prod(s))
        levels.append(work[off:off + k].reshape(s))
        off += k
    assert np.isnan(work[-1])                                  # nothing written past the end
    return levels


def _cv2_pyramid(img: np.ndarray, num_levels: int) -> list[np.ndarray]:
    out = []
    for i in range(img.shape[0]):
        prev, lv = img[i], []
        for _ in range(1, num_levels):
            nxt = cv2.pyrDown(prev if prev.shape[-1] > 1 else prev[..., 0])
            prev = nxt if nxt.ndim == 3 else nxt[..., None]
            lv.append(prev)
        out.append(lv)
    return [np.stack([o[m] for o in out]) for m in range(num_levels - 1)]


@pytest.mark.parametrize("c", [1, 2, 3, 4])
@pytest.mark.parametrize("hw", SIZES + [(5, 5), (6, 70), (129, 66)])
def test_onepass_pyramid_equals_cv2_pyrdown_bit_for_bit(hw, c):
    rng = np.random.default_rng(hw[0] * 1000 + hw[1] * 10 + c)
    h, w = hw
    img = rng.random((2, h, w, c), dtype=np.float32)
    nl = max(min(h, w).bit_length(), 2)                        # every level >= 1 px, and one
    if min(h, w) == 1:
        nl = 3                                                 # 1 px: levels of 1 px
    for got, ref in zip(_onepass_pyramid(img, nl), _cv2_pyramid(img, nl)):
        assert got.shape == ref.shape
        assert np.array_equal(got.view(np.int32), ref.view(np.int32)), \
            f"level differs at {np.argwhere(got != ref)[:3].tolist()}"


@pytest.mark.parametrize("c", [1, 3, 4])
@pytest.mark.parametrize("hw", SIZES)
@pytest.mark.parametrize("b", [1, 3])
def test_sample_image_onepass_equals_the_two_step_path(hw, c, b):
    h, w = hw
    rng = np.random.default_rng(h * w + c + b)
    img = rng.random((b, h, w, c), dtype=np.float32)
    ts = _tokens(torch.Generator().manual_seed(h + w + c + b), b, h, w)
    got = K.sample_image(img, ts)
    ref = K.sample_image(img, ts, onepass=False)
    assert got.shape == (b, ts.levels.shape[1], c, 16, 16)
    assert torch.equal(got, ref)
    nl = K.levels_needed(ts, min(h, w).bit_length())
    assert torch.equal(got, sample_reference(K.build_pyramid_cv2(img, nl), ts))


def test_sample_image_onepass_on_the_benchmark_case():
    from fovea_book.bench.sampling import test_image, v1_tokens

    img, ts = test_image(), v1_tokens(1)
    assert img.flags.c_contiguous and img.shape == (1024, 1024, 3)
    assert torch.equal(K.sample_image(img, ts), K.sample_image(img, ts, onepass=False))


def test_sample_image_onepass_takes_any_cpu_image_form():
    rng = np.random.default_rng(7)
    big = rng.random((2, 70, 90, 3), dtype=np.float32)
    view = big[:, 3:60, 5:80]                                  # not contiguous
    g = torch.Generator().manual_seed(3)
    ts = _tokens(g, 2, 57, 75, n=30, patch=8)
    assert torch.equal(K.sample_image(view, ts), K.sample_image(view, ts, onepass=False))
    chw = torch.from_numpy(np.ascontiguousarray(view)).permute(0, 3, 1, 2).contiguous()
    assert torch.equal(K.sample_image(chw, ts), K.sample_image(view, ts))
    one = _tokens(g, 1, 57, 75)
    assert torch.equal(K.sample_image(view[0], one), K.sample_image(view[:1], one))


def test_sample_image_onepass_errors():
    img = np.zeros((1, 20, 20, 3), dtype=np.float32)
    ts = _tokens(torch.Generator().manual_seed(0), 1, 20, 20)
    with pytest.raises(ValueError, match="does not match"):
        K.sample_image(np.zeros((1, 21, 20, 3), dtype=np.float32), ts)
    with pytest.raises(ValueError, match="does not match"):
        K.sample_image(np.zeros((2, 20, 20, 3), dtype=np.float32), ts)
    too_high = TokenSet(ts.centers, ts.levels + 5, ts.scores, ts.fixations, (20, 20), 16)
    for onepass in (True, False):
        with pytest.raises(ValueError, match="tokens.levels must lie in"):
            K.sample_image(img, too_high, onepass=onepass)
    with pytest.raises(ValueError, match="1-4 channels"):
        K.sample_image(np.zeros((1, 20, 20, 5), dtype=np.float32), ts)
    rc = _cpu_lib().sample_image_onepass_cpu(img.ctypes.data, 1, 20, 20, 5, 2, None, 16, 0,
                                             None, None, None, None, 1)
    assert rc == -1                                            # C outside 1..4: refused


@pytest.mark.parametrize("hw", [(17, 33), (150, 110), (1024, 768)])
def test_tokens_read_only_built_levels(hw):
    """Every row a token reads is built before it is read (serial and OpenMP gathers): with a
    workspace of NaN, a row read too early would come out NaN (or differ)."""
    h, w = hw
    img = np.random.default_rng(5).random((2, h, w, 3), dtype=np.float32)
    ts = _tokens(torch.Generator().manual_seed(11), 2, h, w, n=60)
    nl = K.levels_needed(ts, min(h, w).bit_length())
    ref = K.sample_image(img, ts, onepass=False)
    b, n = ts.levels.shape
    total, hm, wm = 0, h, w
    for _ in range(1, nl):
        hm, wm = (hm + 1) // 2, (wm + 1) // 2
        total += b * hm * wm * 3
    lods = ts.levels.float().contiguous()
    cen = ts.centers.float().contiguous()
    steps = torch.exp2(lods)
    for min_parallel in (1 << 30, 1):                          # serial, then OpenMP
        work = np.full(total, np.nan, dtype=np.float32)
        out = torch.full((b, n, 3, 16, 16), float("nan"))
        assert _cpu_lib().sample_image_onepass_cpu(
            img.ctypes.data, b, h, w, 3, nl, work.ctypes.data, 16, n, cen.data_ptr(),
            lods.data_ptr(), steps.data_ptr(), out.data_ptr(), min_parallel) == nl
        assert torch.equal(out, ref)


def test_sample_image_onepass_patch_errors_match_the_two_step_path():
    img = np.zeros((1, 20, 20, 3), dtype=np.float32)
    base = _tokens(torch.Generator().manual_seed(0), 1, 20, 20)
    big = TokenSet(base.centers, base.levels, base.scores, base.fixations, (20, 20), 300)
    for onepass in (True, False):
        with pytest.raises(ValueError, match="patch must be <= 256 for the CPU kernel"):
            K.sample_image(img, big, onepass=onepass)


@pytest.mark.parametrize("hw", [(17, 33), (300, 257)])
def test_sample_image_onepass_integer_levels(hw):
    """Integer levels take the steps 2**level computed in C (no torch.exp2 call): the same
    bits as torch.exp2's, so the same patches."""
    h, w = hw
    img = np.random.default_rng(9).random((2, h, w, 3), dtype=np.float32)
    ts = _tokens(torch.Generator().manual_seed(4), 2, h, w, n=40)
    ts = TokenSet(ts.centers, ts.levels.round(), ts.scores, ts.fixations, (h, w), 16)
    assert torch.equal(K.sample_image(img, ts), K.sample_image(img, ts, onepass=False))
