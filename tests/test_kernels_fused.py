"""The fused token gather (``gather_tokens``, issue 22 item 1): NHWC4 pyramid in, the VLM
patch embedding's layout out. The g++ build of the same per-quad code equals the torch
reference bit for bit (fp32) and ``.to(torch.bfloat16)`` of it (bf16); its rows are Qwen2-VL's
``pixel_values`` rows; nvcc compiles it without spills; on a GPU the device build equals them."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fovea_book.kernel_source import kernel_resources
from fovea_book import kernels as K
from fovea_core.pyramid import Pyramid
from fovea_book.reference_samplers import sample_reference
from fovea_core.tokens import TokenSet
from fovea_core.vlm.qwen import PIXEL_NORM, QWEN_MERGE, QWEN_PATCH, pixel_values

HAS_NVCC = shutil.which("nvcc") is not None
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None,
                               reason="g++ not installed: no CPU kernel build")
needs_gpu = pytest.mark.skipif("cuda" not in K.available_backends(),
                               reason=f"CUDA backend unavailable: {K.backend_status()['cuda']}")


def _case(g: torch.Generator, b: int, c: int, h: int, w: int, n: int, patch: int, levels: int,
          trilinear: bool, device: str = "cpu"):
    """An image, its padded pyramid (CPU kernels or the GPU) and tokens with edge/corner cases."""
    img = torch.rand(b, c, h, w, generator=g)
    centers = torch.rand(b, n, 2, generator=g)
    k = min(n, 4)
    centers[:, :k] = torch.tensor([[0.0, 0.0], [1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])[:k]
    lv = (torch.rand(b, n, generator=g) * (levels - 1) if trilinear
          else torch.randint(0, levels, (b, n), generator=g).float())
    ts = TokenSet(centers, lv, torch.zeros(b, n), torch.full((b, 1, 2), 0.5), (h, w), patch)
    img, ts = img.to(device), ts.to(device)
    return img, K.nhwc4_pyramid(img, levels), ts


def _reference(pyr4: Pyramid, ts: TokenSet, c: int, merge: int = 1) -> torch.Tensor:
    """The torch reference on the first ``c`` channels as ``merge x merge`` blocks:
    ``[B, N, merge^2, c, q, q]``."""
    ref = sample_reference(Pyramid(tuple(lv[:, :c] for lv in pyr4.levels)), ts)
    b, n, _, p, _ = ref.shape
    q = p // merge
    return (ref.reshape(b, n, c, merge, q, merge, q).permute(0, 1, 3, 5, 2, 4, 6)
            .reshape(b, n, merge * merge, c, q, q))


@needs_gxx
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 100_000), b=st.integers(1, 3), c=st.integers(1, 6),
       h=st.integers(9, 90), w=st.integers(9, 90), n=st.integers(1, 30),
       patch=st.sampled_from([1, 3, 4, 14, 16]), levels=st.integers(1, 3),
       trilinear=st.booleans(), temporal=st.integers(1, 2), bf16=st.booleans(),
       merge=st.sampled_from([1, 2]))
def test_cpu_build_equals_the_reference_bit_for_bit(seed, b, c, h, w, n, patch, levels,
                                                    trilinear, temporal, bf16, merge):
    merge = merge if patch % merge == 0 else 1
    q = patch // merge
    g = torch.Generator().manual_seed(seed)
    img, pyr, ts = _case(g, b, c, h, w, n, patch, levels, trilinear)
    dtype = torch.bfloat16 if bf16 else torch.float32
    got = K.gather_tokens(pyr, ts, channels=c, temporal=temporal, merge=merge, dtype=dtype,
                          backend="cpu")
    assert got.shape == (b, n, merge * merge, c, temporal, q, q) and got.dtype == dtype
    ref = _reference(pyr, ts, c, merge).to(dtype)          # RNE, as the kernel rounds
    for u in range(temporal):
        assert torch.equal(got[:, :, :, :, u], ref)
    # the same values as the unfused gather on the unpadded pyramid
    if not bf16 and merge == 1:
        assert torch.equal(got[:, :, 0, :, 0],
                           K.gather_patches(K.device_pyramid(img, levels), ts, backend="cpu"))


@needs_gxx
def test_padded_pyramid_is_channels_last_and_its_channels_are_the_plain_pyramid():
    img = torch.rand(2, 3, 37, 50, generator=torch.Generator().manual_seed(1))
    pyr4 = K.nhwc4_pyramid(img, 4)
    plain = K.device_pyramid(img, 4)
    for m, (a, b) in enumerate(zip(pyr4.levels, plain.levels)):
        assert a.shape[1] == 4 and a.stride(1) == 1 and a.stride(3) == 4, m
        assert torch.equal(a[:, :3], b), m
        assert not a[:, 3].any(), m                        # the padding channel stays zero


@needs_gxx
def test_rows_are_qwen2_vl_pixel_values():
    """The merged cells of a page as level-0 tokens of side 2p in raster order: the rows of
    ``gather_tokens(..., merge=2, temporal=2).view(B * 4N, -1)`` are ``pixel_values`` bit
    for bit (each merged token one 2 x 2 block of ViT patches, the image repeated twice)."""
    p, m, hm, wm = QWEN_PATCH["qwen2-vl"], QWEN_MERGE, 3, 2
    h, w = hm * m * p, wm * m * p
    images = torch.rand(2, 3, h, w, generator=torch.Generator().manual_seed(2))
    pv, _ = pixel_values(images, "qwen2-vl")
    mean, std = (images.new_tensor(v).view(1, 3, 1, 1) for v in PIXEL_NORM["qwen2-vl"])
    normed = (images - mean) / std                         # what pixel_values normalises
    rows, cols = torch.meshgrid(torch.arange(hm), torch.arange(wm), indexing="ij")
    cell = m * p
    ts = TokenSet.from_grid(rows.reshape(1, -1).expand(2, -1), cols.reshape(1, -1).expand(2, -1),
                            0, image_size=(h, w), patch=cell)
    got = K.gather_tokens(K.nhwc4_pyramid(normed, 1), ts, channels=3, temporal=2, merge=m,
                          backend="cpu")
    assert got.shape == (2, hm * wm, m * m, 3, 2, p, p)
    assert torch.equal(got.view(2 * hm * wm * m * m, -1), pv)


@needs_gxx
@pytest.mark.parametrize("bad, match", [
    (dict(channels=0), "channels must be"), (dict(channels=5), "channels must be"),
    (dict(temporal=0), "temporal must be"), (dict(dtype=torch.float16), "dtype must be"),
    (dict(merge=3), "merge must be"), (dict(merge=0), "merge must be"),
    (dict(out=torch.empty(1)), "out must be"),
])
def test_bad_arguments_are_named(bad, match):
    g = torch.Generator().manual_seed(0)
    _, pyr, ts = _case(g, 1, 3, 32, 32, 5, 4, 2, False)
    with pytest.raises(ValueError, match=match):
        K.gather_tokens(pyr, ts, backend="cpu", **bad)


@needs_gxx
def test_a_pyramid_in_another_layout_is_refused():
    g = torch.Generator().manual_seed(0)
    img, pyr, ts = _case(g, 1, 3, 32, 32, 5, 4, 2, False)
    with pytest.raises(ValueError, match="nhwc4_pyramid"):
        K.gather_tokens(K.device_pyramid(img, 2), ts, backend="cpu")       # NCHW, 3 channels
    with pytest.raises(ValueError, match="does not match tokens"):
        K.gather_tokens(pyr, replace(ts, image_size=(32, 31)), backend="cpu")


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not installed")
def test_nvcc_builds_it_without_spills_within_its_launch_bounds():
    res = kernel_resources("sm_90")["gather_tokens"]
    assert res["spill_stores"] == 0 and res["spill_loads"] == 0 and res["stack_bytes"] == 0
    # __launch_bounds__(256, 2): 2 blocks of 256 threads an SM fit 65,536 registers
    assert res["registers"] * K.GATHER_TOKENS_BLOCK * K.GATHER_TOKENS_BLOCKS_PER_SM \
        <= 65536


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("bf16", [False, True])
def test_gpu_build_equals_the_reference_and_stays_on_the_device(bf16):
    g = torch.Generator().manual_seed(5)
    _, pyr, ts = _case(g, 3, 3, 200, 150, 273, 16, 4, False, device="cuda")
    dtype = torch.bfloat16 if bf16 else torch.float32
    torch.cuda.set_sync_debug_mode("error")                # any host sync raises
    try:
        got = K.gather_tokens(pyr, ts, channels=3, temporal=2, merge=2, dtype=dtype)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert got.is_cuda
    ref = _reference(pyr, ts, 3, 2).to(dtype)
    assert torch.equal(got[:, :, :, :, 0], ref) and torch.equal(got[:, :, :, :, 1], ref)
    tri = replace(ts, levels=torch.rand(3, 273, generator=g).cuda() * 3)
    assert torch.equal(K.gather_tokens(pyr, tri, channels=3, dtype=dtype)[:, :, 0, :, 0],
                       _reference(pyr, tri, 3)[:, :, 0].to(dtype))
    # the CPU build of the same source gives the same bits
    cpu = Pyramid(tuple(lv.cpu() for lv in pyr.levels))
    assert torch.equal(got.cpu(), K.gather_tokens(cpu, ts.to("cpu"), channels=3, temporal=2,
                                                  merge=2, dtype=dtype, backend="cpu"))
