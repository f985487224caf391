"""The CUDA C kernels (cuda/fovea_kernels.cu): nvcc compiles them, the g++ build of the same
source equals the torch references, the V1 allocation is exact, the GPU build (when there is
a GPU) equals them too."""

from __future__ import annotations

import shutil
import threading
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fovea_book.kernel_source import KERNEL_NAMES, compile_cuda
from fovea_book import kernels as K
from fovea_core.allocators.cortical import plan_v1, v1_candidates, v1_cortical
from fovea_core.pyramid import build_pyramid
from fovea_core.pyramid import Pyramid
from fovea_book.reference_samplers import (pyramid_atlas, remap, remap_reference, sample_mip,
                                           sample_reference)
from fovea_core.tokens import TokenSet

HAS_NVCC = shutil.which("nvcc") is not None
HAS_GXX = shutil.which("g++") is not None
needs_gxx = pytest.mark.skipif(not HAS_GXX, reason="g++ not installed: no CPU kernel build")
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif("cuda" not in K.available_backends(),
                               reason=f"CUDA backend unavailable: {K.backend_status()['cuda']}")


def _random_case(g: torch.Generator, b: int, c: int, h: int, w: int, n: int, patch: int,
                 levels: int):
    pyr = build_pyramid(torch.rand(b, c, h, w, generator=g), num_levels=levels)
    centers = torch.rand(b, n, 2, generator=g)
    k = min(n, 6)   # edge and corner tokens in every case
    centers[:, :k] = torch.tensor([[0.0, 0.0], [1.0, 1.0], [1.0, 0.0], [0.0, 1.0],
                                   [0.5, 1.0], [1.0, 0.5]])[:k]
    lv = torch.randint(0, levels, (b, n), generator=g).float()
    ts = TokenSet(centers, lv, torch.zeros(b, n), torch.full((b, 1, 2), 0.5), (h, w), patch)
    return pyr, ts


# ------------------------------------------------------------------------------ compile
@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("target", ["ptx", "cubin"])
def test_nvcc_compiles_every_kernel(tmp_path, arch, target):
    out = compile_cuda(target, arch, tmp_path)
    data = out.read_bytes()
    assert len(data) > 1000
    for name in KERNEL_NAMES:              # extern "C": unmangled entry points
        assert name.encode() in data, f"{name} missing from the {arch} {target}"
    if target == "ptx":
        assert f".target {arch}".encode() in data


@needs_gxx
def test_cpu_build_is_cached_and_concurrent_safe():
    path = K.build_cpu_library()
    assert path.exists() and path == K.build_cpu_library()        # cached: same file
    errors: list[BaseException] = []

    def rebuild():
        try:
            K.build_cpu_library(force=True)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=rebuild) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and path.exists()
    assert "cpu" in K.available_backends()
    assert not list(path.parent.glob(".tmp_fovea_*"))                # no temp files left


def test_missing_pieces_are_named(monkeypatch):
    if K.backend_status()["cuda"] is not None:
        with pytest.raises(RuntimeError, match="cuda"):
            K.remap(torch.rand(1, 1, 4, 4), torch.zeros(1, 2, 2, 2), backend="cuda")
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    with pytest.raises(RuntimeError, match="g\\+\\+"):
        K.build_cpu_library(force=True)
    assert "g++" in K.backend_status()["cpu"]
    with pytest.raises(ValueError, match="backend"):
        K.remap(torch.rand(1, 1, 4, 4), torch.zeros(1, 2, 2, 2), backend="metal")


# ------------------------------------------------------------------------------ cv2 pyramid
def test_cv2_pyramid_matches_the_torch_pyramid():
    img = torch.rand(2, 3, 100, 77)
    pyr = build_pyramid(img, num_levels=4)
    fast = K.build_pyramid_cv2(img.permute(0, 2, 3, 1).contiguous().numpy(), 4)
    assert [tuple(l.shape) for l in fast.levels] == [tuple(l.shape) for l in pyr.levels]
    for a, b in zip(fast.levels, pyr.levels):              # cv2.pyrDown == torch pyr_down
        assert (a - b).abs().max() <= 1e-5
    # one channel: the same values as the torch pyramid of that channel at every level
    gray = K.build_pyramid_cv2(img[0, 0].numpy()[..., None].copy(), 3)
    ref = build_pyramid(img[:1, :1], num_levels=3)
    assert gray.channels == 1 and tuple(gray.levels[2].shape) == (1, 1, 25, 20)
    for m in range(3):
        assert (gray.levels[m] - ref.levels[m]).abs().max() <= 1e-5, m


# ------------------------------------------------------------------------------ CPU parity
@needs_gxx
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 100_000), b=st.integers(1, 3), c=st.integers(1, 4),
       h=st.integers(16, 120), w=st.integers(16, 120), n=st.integers(1, 40),
       patch=st.sampled_from([1, 4, 14, 16]), levels=st.integers(1, 3),
       trilinear=st.booleans())
def test_cpu_gather_equals_torch_reference(seed, b, c, h, w, n, patch, levels, trilinear):
    g = torch.Generator().manual_seed(seed)
    pyr, ts = _random_case(g, b, c, h, w, n, patch, levels)
    if trilinear:                                         # any scale: fractional levels
        ts = replace(ts, levels=torch.rand(b, n, generator=g) * (levels - 1))
    ref = sample_reference(pyr, ts)
    got = K.gather_patches(pyr, ts, backend="cpu")
    assert got.shape == (b, n, c, patch, patch)
    assert torch.equal(got, ref)                          # bit for bit (no FMA in either)
    # the same through other layouts of the same levels: separate NCHW tensors, and a
    # pyramid whose level 0 is the caller's channels-last image (no copy)
    sep = Pyramid(tuple(lv.contiguous() for lv in pyr.levels))
    assert torch.equal(K.gather_patches(sep, ts, backend="cpu"), ref)
    assert torch.equal(sample_reference(sep, ts), ref)
    # the fast torch path (one grid_sample) equals the reference up to coordinate rounding
    assert (sample_mip(pyr, ts) - ref).abs().max() <= 1e-4


@needs_gxx
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 100_000), b=st.integers(1, 3), h=st.integers(1, 60),
       w=st.integers(1, 60), per_image=st.booleans())
def test_cpu_remap_equals_torch_reference(seed, b, h, w, per_image):
    g = torch.Generator().manual_seed(seed)
    img = torch.rand(b, 3, h, w, generator=g)
    lut = torch.rand(b if per_image else 1, 23, 19, 2, generator=g)
    lut = lut * torch.tensor([w + 4.0, h + 4.0]) - 2                    # beyond every border
    ref = remap_reference(img, lut)
    assert torch.equal(K.remap(img, lut, backend="cpu"), ref)              # bit for bit
    hwc = img.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)         # channels last
    assert torch.equal(K.remap(hwc, lut, backend="cpu"), ref)
    assert torch.equal(remap(img, lut), ref)                               # the torch twin


# ------------------------------------------------------------------------------ V1 layout
fixations = st.tuples(st.sampled_from([0.0, 1.0, 0.5]) | st.floats(0, 1),
                      st.sampled_from([0.0, 1.0, 0.5]) | st.floats(0, 1))


@needs_gxx
@settings(max_examples=15, deadline=None)
@given(f1=fixations, f2=fixations, budget=st.sampled_from([1, 16, 64, 273, 400]),
       size=st.sampled_from([(1024, 1024), (768, 1024), (448, 336), (512, 256)]),
       fov=st.sampled_from([10.0, 20.0, 40.0]))
def test_v1_kernel_equals_torch_allocator(f1, f2, budget, size, fov):
    h, w = size
    fix = torch.tensor([f1, f2], dtype=torch.float64)
    levels = 5
    budget = min(budget, (h // 16) * (w // 16))
    plan = plan_v1(fix, size, budget, num_levels=levels, fov_deg=fov)
    ref_c, ref_l, ref_v = v1_candidates(plan)
    got_c, got_l, got_v = K.v1_candidates_kernel(plan, backend="cpu")
    assert torch.equal(got_v, ref_v) and torch.equal(got_l, ref_l)
    assert torch.equal(got_c, ref_c)
    pyr = build_pyramid(torch.zeros(2, 1, h, w), num_levels=levels)
    ts = v1_cortical(pyr, torch.zeros(2, h // 16, w // 16), budget, fixation=fix, fov_deg=fov)
    cen, lev = K.v1_allocate(fix, size, budget, num_levels=levels, backend="cpu", fov_deg=fov)
    assert torch.equal(cen, ts.centers) and torch.equal(lev, ts.levels)
    assert ts.budget == budget and bool(ts.is_distinct().all())


def test_v1_layout_is_foveated():
    """Fovea at full resolution around the fixation; levels grow with eccentricity."""
    pyr = build_pyramid(torch.zeros(1, 1, 1024, 1024))
    scores = torch.zeros(1, 64, 64)
    scores[0, 40, 20] = 1.0                                   # peak -> fixation
    ts = v1_cortical(pyr, scores, 273)
    fx = torch.tensor([20.5 / 64, 40.5 / 64])
    assert torch.allclose(ts.fixations[0, 0], fx)
    d = (ts.centers[0] - fx).norm(dim=-1)
    order = d.argsort()
    assert (ts.levels[0, order[:9]] == 0).all()               # nearest tokens: level 0
    periph = ts.levels[0] > 0
    lv, dd = ts.levels[0][periph], d[periph]
    lv_sorted = lv[dd.argsort()]
    assert (lv_sorted[1:] >= lv_sorted[:-1]).all()            # monotone in eccentricity
    assert ts.levels.max() >= 2 and ts.scores.shape == (1, 273)
    with pytest.raises(ValueError, match="budget"):
        v1_cortical(pyr, scores, 10_000)
    with pytest.raises(ValueError, match="fixation"):
        v1_cortical(pyr, scores, 10, fixation=torch.zeros(3, 2))


# ------------------------------------------------------------------------------ fast paths
@needs_gxx
def test_cv2_pyramid_reads_the_image_in_place_and_sample_image_is_end_to_end():
    rng = np.random.default_rng(0)
    img = rng.random((2, 150, 110, 3), dtype=np.float32)
    pyr = build_pyramid(img, num_levels=4)
    fast = K.build_pyramid_cv2(img, 4)
    assert np.shares_memory(fast.base.numpy(), img)                  # level 0: no copy
    for a, b in zip(fast.levels, pyr.levels):
        assert (a - b).abs().max() <= 1e-5                            # cv2.pyrDown == pyr_down
    g = torch.Generator().manual_seed(1)
    ts = TokenSet(torch.rand(2, 40, 2, generator=g), torch.rand(2, 40, generator=g) * 2.5,
                  torch.zeros(2, 40), torch.full((2, 1, 2), 0.5), (150, 110), 16)
    assert K.levels_needed(ts) == 4 - int(float(ts.levels.max()) <= 2)
    got = K.sample_image(img, ts)
    assert torch.equal(got, K.gather_patches(K.build_pyramid_cv2(img, K.levels_needed(ts)), ts,
                                             backend="cpu"))
    assert (got - sample_reference(pyr, ts)).abs().max() <= 1e-5


@needs_gxx
def test_kernel_pyramid_equals_the_torch_pyramid():
    x = torch.rand(2, 3, 77, 64)
    ref = build_pyramid(x, num_levels=4)
    dev = K.device_pyramid(x, 4, backend="cpu")
    assert dev.base is x                                              # level 0: the input
    store = dev.levels[1].untyped_storage().data_ptr()
    assert all(lv.untyped_storage().data_ptr() == store for lv in dev.levels[1:])  # packed
    for a, b in zip(dev.levels, ref.levels):
        assert a.shape == b.shape and (a - b).abs().max() <= 1e-6


def test_level_table_rejects_what_the_kernels_cannot_read():
    with pytest.raises(ValueError, match="float32"):
        K.level_table([torch.zeros(1, 1, 4, 4, dtype=torch.float64)])
    with pytest.raises(ValueError, match="1 to 16 levels"):
        K.level_table([torch.zeros(1, 1, 4, 4)] * 17)
    with pytest.raises(ValueError, match="level 1"):
        K.level_table([torch.zeros(1, 3, 4, 4), torch.zeros(1, 1, 2, 2)])


# ------------------------------------------------------------------------------ GPU
@gpu
@needs_gpu
@pytest.mark.parametrize("binding", ["driver", "pycuda"])
def test_gpu_gather_equals_torch_reference(binding):
    if binding == "pycuda" and K.backend_status()["pycuda"] is not None:
        pytest.skip(K.backend_status()["pycuda"])
    g = torch.Generator().manual_seed(0)
    pyr, ts = _random_case(g, 3, 3, 200, 150, 273, 16, 4)
    gp, gt = pyr.to("cuda"), ts.to("cuda")
    ref = sample_reference(gp, gt)                          # torch on the GPU: same rounding
    got = K.gather_patches(gp, gt, binding=binding)
    assert got.is_cuda and torch.equal(got, ref)
    tri = replace(gt, levels=torch.rand(3, 273, generator=g).cuda() * 3)
    assert torch.equal(K.gather_patches(gp, tri, binding=binding), sample_reference(gp, tri))
    assert (got.cpu() - sample_reference(pyr, ts)).abs().max() <= 1e-5
    assert (sample_mip(gp, gt) - ref).abs().max() <= 1e-4      # grid_sample path on the GPU


@gpu
@needs_gpu
def test_gpu_path_stays_on_the_device_and_the_current_stream():
    x = torch.rand(2, 3, 256, 192, device="cuda")
    g = torch.Generator().manual_seed(3)
    ts = TokenSet(torch.rand(2, 50, 2, generator=g), torch.rand(2, 50, generator=g) * 3,
                  torch.zeros(2, 50), torch.full((2, 1, 2), 0.5), (256, 192), 16).to("cuda")
    ref = K.sample_image(x, ts)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())           # x and ts were made on the default
    with torch.cuda.stream(side):                           # a non-default stream
        pyr = K.device_pyramid(x)
        got = K.gather_patches(pyr, ts)
    side.synchronize()
    assert torch.equal(got, ref)
    cpu = build_pyramid(x.cpu())
    for a, b in zip(pyr.levels, cpu.levels):
        assert a.is_cuda and (a.cpu() - b).abs().max() <= 1e-5
    atlas = build_pyramid(x)                                 # torch pyramid: kernel-built atlas
    assert pyramid_atlas(atlas) is not None and atlas.base.is_cuda
    for a, b in zip(atlas.levels, cpu.levels):
        assert (a.cpu() - b).abs().max() <= 1e-5


@gpu
@needs_gpu
def test_gpu_remap_and_v1_equal_references():
    img = torch.rand(2, 3, 64, 80)
    lut = torch.rand(1, 50, 40, 2) * torch.tensor([84.0, 68.0]) - 2
    ref = remap_reference(img.cuda(), lut.cuda())
    assert torch.equal(K.remap(img.cuda(), lut.cuda()), ref)
    assert (ref.cpu() - remap_reference(img, lut)).abs().max() <= 1e-5
    fix = torch.tensor([[0.5, 0.5], [0.0, 1.0]], dtype=torch.float64)
    plan = plan_v1(fix, (1024, 1024), 273, num_levels=7)
    ref_c, ref_l, ref_v = v1_candidates(plan)
    got_c, got_l, got_v = K.v1_candidates_kernel(plan, backend="cuda")
    assert torch.equal(got_v, ref_v) and torch.equal(got_l, ref_l)
    assert (got_c - ref_c).abs().max() <= 1e-5
    assert np.isfinite(got_c.numpy()).all()
