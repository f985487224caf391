"""Allocators on the scores' device, without host syncs (issue 22, item 2).

Every registered allocator that reads no pixels (and ``divprune`` / ``visionzip``, whose
pixels come from the pyramid on the same device) must run where the scores are, end to
end: no ``.cpu()`` / ``.numpy()`` / ``.tolist()`` / ``.item()``, no Python ``if tensor`` or
``int(tensor)``, no op whose output size depends on data (``nonzero``, boolean-mask
indexing, ``unique``, ``bincount``, ``repeat_interleave`` without ``output_size``): each is
a host sync on CUDA. There is no GPU here, so three checks stand in for it:

1. **No host sync** (CPU): :func:`no_host_sync` makes every host read of a tensor raise
   (the ``Tensor`` methods above are replaced) and a ``TorchDispatchMode`` raise on the ops
   that synchronise on CUDA and on any copy between devices; value checks take their device
   path (:data:`fovea_core.tokens.HOST_DEVICES` emptied: ``torch._assert_async``, and no
   host-only shortcut). Every sync-free allocator runs under it on the pinned cases.
2. **Same tokens as before**: the TokenSets (centres, levels, fixations, stages and, where
   they are exact, scores, bit for bit) are hashed and compared with hashes pinned from the
   code before the change (``tests/fixtures/allocators_device_pins.json``, made by ``python
   tests/test_allocators_device.py --pin``: first on commit 0244df8, again when selections
   moved to the rounding-robust ranking grid, ``fovea_core.allocators.base.rank_grid``),
   guarded and unguarded. A pin holds only what is exact on every x86 CPU: the allocators
   of :data:`INEXACT_SCORES` report token scores that are float means or sums, whose last
   bits depend on the CPU (SIMD width, BLAS), so their pins hash the tokens without the
   scores (the selection itself ranks on the grid and is the same everywhere).
3. **On the device** (``meta``): the same allocators run on ``meta`` tensors under the
   guard, which also forbids copies between devices; a tensor made on the host and mixed
   into the computation raises. Every output must be on ``meta``.

On a CUDA machine :func:`test_gpu_allocators_sync_free_and_equal_to_cpu` (``-m gpu``) runs
them under ``torch.cuda.set_sync_debug_mode("error")`` and compares with the CPU result.

Allocators that synchronise (and why) are listed in :data:`SYNCING`; every fixed-budget
allocator of the registry is in exactly one of the two lists (the cascade's, a higher layer
built on these, is not covered here).

The default fixation (``fixation_from_scores``, ``fovea_core/importance/base.py``) runs
under the guard too (:func:`test_default_fixation_is_sync_free`). One exemption:
``divprune`` runs its torch loop (the device path) instead of the CPU's C++ loop, which
reads on the host (:func:`_device_paths`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fovea_core import tokens as T
from fovea_core.methods import ALLOCATORS, INFO, allocate
from fovea_core.pyramid import Pyramid, build_pyramid

PATCH = 16
PINS_PATH = Path(__file__).parent / "fixtures" / "allocators_device_pins.json"

#: allocators that synchronise with the host, and why (each is a property of the method)
SYNCING = {
    "random": "its numbers come from torch's CPU generator seeded with a CRC32 of each score "
              "map on the ranking grid (read on the host); drawing on the device would change "
              "its tokens",
    "resize_nonblank": "reads pixels: a per-image search over scales whose steps depend on "
                       "counts of kept cells (unique patches) read on the host",
    "atlas": "reads pixels: SLIC superpixels (scikit-image, on the host); the number of "
             "regions sizes the quotas",
    "frequency": "reads pixels: steerable-pyramid band energies (pyrtools, numpy, on the host)",
    "v1_cortical": "the plan's sizes (rays and rings per image) depend on the fixation: "
                   "plan_v1 reads it back and lays the candidates out on the host (the "
                   "kernel layer's v1_layout does the same), then the tokens are copied over",
}


#: allocators whose token scores are float means or sums (the rest report input score values,
#: exact): their pins leave the scores out (:func:`test_exact_scores_are_input_values`)
INEXACT_SCORES = {
    "pyramid_global": "a coarse cell's score is the mean of its level-0 scores",
    "lod_dag": "a node's score is the summed importance mass under it",
    "frequency": "scores are steerable-band energies (FFT, float sums)",
    "visionzip": "a contextual token's score is the mean importance merged into it",
}


def _fixed_names() -> list[str]:
    return [k for k in ALLOCATORS if INFO[k]["kind"] == "fixed" and INFO[k]["family"] != "cascade"]


NAMES = _fixed_names()
SYNC_FREE = [k for k in NAMES if k not in SYNCING]

# ----------------------------------------------------------------------------- cases
#: (image size, batch, budget, fixation, score kind)
CASES = [((128, 160), 2, 24, None, "rand"),
         ((200, 136), 3, 20, (0.3, 0.7), "ties"),
         ((256, 256), 2, 80, [[0.2, 0.9], [0.75, 0.25]], "rand"),
         ((256, 256), 3, 64, None, "mixed")]
#: extra keyword sets per allocator (index 1, 2, ... of a pin key; 0 is the defaults)
VARIANTS = {"hybrid": [{"ratio": 0.2}],
            "visionzip": [{"dominant_ratio": 1.0}], "pyramid": [{"level_budget": (1, 1, 1)}],
            "lod_dag": [{"alpha": 0.5}], "foveated_pyramid": [{"max_level": 2}],
            "multi_fixation": [{"mode": "per_fixation", "k": 3},
                               {"fixation": [[[0.2, 0.3], [0.8, 0.7]], [[0.5, 0.5], [0.1, 0.9]]]}]}


def case(i: int) -> tuple[Pyramid, torch.Tensor, int, object]:
    """Pyramid, scores, budget and fixation of case ``i`` (deterministic)."""
    size, b, budget, fix, kind = CASES[i]
    g = torch.Generator().manual_seed(100 + i)
    h, w = size
    pyr = build_pyramid(torch.rand(b, 3, h, w, generator=g), patch=PATCH)
    gh, gw = pyr.grid_shape(PATCH, 0)
    if kind == "rand":
        s = torch.rand(b, gh, gw, generator=g)
    elif kind == "ties":
        s = torch.randint(0, 4, (b, gh, gw), generator=g).float()
    else:  # a peak, a flat map, a noisy map: adaptive_stratified picks different strata
        s = torch.rand(b, gh, gw, generator=g) * 0.01
        s[0, 2, 3] = 50.0
        s[1] = 1.0
        s[2] = torch.rand(gh, gw, generator=g) - 0.5
    return pyr, s, budget, fix


def digest(ts, scores: bool = True) -> str:
    """Hash of a TokenSet's tensors, bit for bit (shapes and dtypes included); ``scores``:
    whether the token scores are hashed too (only where they are exact)."""
    h = hashlib.sha256()
    for t in (ts.centers, ts.levels) + ((ts.scores,) if scores else ()) + (ts.fixations,) + (
            () if ts.stage is None else (ts.stage,)):
        t = t.detach().cpu().contiguous()
        h.update(str((tuple(t.shape), t.dtype)).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:32]


def run_case(name: str, i: int, j: int, call=None) -> str:
    """Digest (or ``"ValueError: ..."``) of allocator ``name`` on case ``i``, variant ``j``;
    ``call(fn)`` wraps the allocation (e.g. in the guard)."""
    pyr, s, budget, fix = case(i)
    kw = {"fixation": fix, **([{}] + VARIANTS.get(name, []))[j]}
    if name == "full":
        budget = None

    def go():
        return allocate(name, pyr, s, budget, **kw)
    try:
        ts = go() if call is None else call(go)
    except ValueError as exc:
        return f"ValueError: {exc}"
    return digest(ts, scores=name not in INEXACT_SCORES)


def pin_keys(names) -> list[tuple[str, int, int]]:
    return [(n, i, j) for n in names for i in range(len(CASES))
            for j in range(1 + len(VARIANTS.get(n, [])))]


# ----------------------------------------------------------------------------- the guard
class HostSync(AssertionError):
    """A host read of a tensor, or an op that synchronises on CUDA, inside the guard."""


_HOST_METHODS = ("cpu", "numpy", "tolist", "item", "__bool__", "__int__", "__float__",
                 "__index__")
_aten = torch.ops.aten
#: ops whose CUDA kernels synchronise with the host (their output size or value is read back)
_SYNC_OPS = {_aten._local_scalar_dense, _aten.nonzero, _aten.masked_select, _aten._unique,
             _aten._unique2, _aten.unique_dim, _aten.unique_consecutive,
             _aten.unique_dim_consecutive, _aten.bincount, _aten.equal, _aten.is_nonzero,
             _aten.item, _aten.argwhere, _aten.allclose}
_COPY_OPS = {_aten._to_copy, _aten.copy_, _aten.copy, _aten.to}


def _devices(args) -> set[torch.device]:
    out = set()
    for a in args:
        if isinstance(a, torch.Tensor):
            out.add(a.device)
        elif isinstance(a, (list, tuple)):
            out |= _devices(a)
    return out


class _SyncOps(TorchDispatchMode):
    """Raise on ops that synchronise on CUDA and on copies between devices."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        pkt = func.overloadpacket
        if pkt in _SYNC_OPS:
            raise HostSync(f"{func} synchronises with the host on CUDA")
        if pkt is _aten.repeat_interleave and func is not _aten.repeat_interleave.self_int \
                and kwargs.get("output_size") is None:
            raise HostSync(f"{func} without output_size synchronises on CUDA")
        if pkt in (_aten.index, _aten.index_put, _aten.index_put_, _aten._index_put_impl_):
            idx = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)
                   for t in idx):
                raise HostSync(f"{func} with a boolean mask synchronises on CUDA (nonzero)")
        if pkt in _COPY_OPS:
            src = _devices(args[:2] if pkt in (_aten.copy_, _aten.copy) else args[:1])
            dst = kwargs.get("device")
            if dst is not None:
                src = src | {torch.device(dst)}
            if len(src) > 1:
                raise HostSync(f"{func} copies between devices {sorted(map(str, src))} "
                               "(a host-to-device copy is a sync on CUDA)")
        return func(*args, **kwargs)


def _host_read(name: str):
    def raiser(self, *a, **k):
        raise HostSync(f"Tensor.{name}() reads a tensor on the host (a sync on CUDA)")
    return raiser


@contextlib.contextmanager
def no_host_sync():
    """Inside: any host read of a tensor or CUDA-synchronising op raises :class:`HostSync`;
    value checks take their device path (``torch._assert_async``)."""
    saved = {n: torch.Tensor.__dict__.get(n) for n in _HOST_METHODS}
    host = T.HOST_DEVICES
    for n in _HOST_METHODS:
        setattr(torch.Tensor, n, _host_read(n))
    T.HOST_DEVICES = set()
    try:
        with _SyncOps():
            yield
    finally:
        T.HOST_DEVICES = host
        for n, v in saved.items():
            if v is None:
                delattr(torch.Tensor, n)
            else:
                setattr(torch.Tensor, n, v)


@contextlib.contextmanager
def _device_paths():
    """``divprune`` on its torch loop (the device path; the CPU's C++ loop reads on the
    host)."""
    from fovea_core import kernels

    def no_cpp(*a, **k):
        raise RuntimeError("the device path: divprune's torch loop")

    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(kernels, "divprune_greedy", no_cpp)
        yield
    finally:
        mp.undo()


def guarded(fn):
    """``fn()`` under :func:`no_host_sync` (with the documented exemption)."""
    with _device_paths(), no_host_sync():
        return fn()


# ----------------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def pins() -> dict:
    return json.loads(PINS_PATH.read_text())


def test_every_fixed_allocator_is_classified_and_pinned(pins):
    assert set(SYNCING) <= set(NAMES)
    assert SYNC_FREE and set(SYNC_FREE).isdisjoint(SYNCING)
    assert {f"{n}|{i}|{j}" for n, i, j in pin_keys(NAMES)} <= set(pins)


def test_exact_scores_are_input_values():
    """The allocators outside :data:`INEXACT_SCORES` report token scores that are values of
    the input map (or 0): exact on every CPU, so their pins may hash them."""
    inexact = set()
    for n, i, j in pin_keys(NAMES):
        pyr, s, budget, fix = case(i)
        kw = {"fixation": fix, **([{}] + VARIANTS.get(n, []))[j]}
        try:
            ts = allocate(n, pyr, s, None if n == "full" else budget, **kw)
        except ValueError:
            continue
        for b in range(ts.batch_size):
            known = torch.cat([s[b].flatten(), torch.zeros(1)])
            if not bool(torch.isin(ts.scores[b], known).all()):
                inexact.add(n)
    assert inexact == set(INEXACT_SCORES)


@pytest.mark.parametrize("name", NAMES)
def test_cpu_tokens_unchanged(name, pins):
    """Every allocator gives the tokens of the code before the change, bit for bit."""
    for n, i, j in pin_keys([name]):
        assert run_case(n, i, j) == pins[f"{n}|{i}|{j}"], (n, i, j)


@pytest.mark.parametrize("name", SYNC_FREE)
def test_sync_free_under_the_guard(name, pins):
    """No host read, no syncing op, and still the same tokens."""
    for n, i, j in pin_keys([name]):
        assert run_case(n, i, j, guarded) == pins[f"{n}|{i}|{j}"], (n, i, j)


@pytest.mark.parametrize("name", ["stratified", "stratified_8x8", "adaptive_stratified"])
def test_host_shortcuts_equal_the_device_path(name):
    """On the CPU these take a data-sized shortcut (``topk`` by the largest quota; each
    granularity on its own images); the device path (the guard) gives the same tokens."""
    g = torch.Generator().manual_seed(5)
    for trial in range(12):
        h, w = (int(v) for v in torch.randint(8, 20, (2,), generator=g) * PATCH)
        pyr = build_pyramid(torch.rand(3, 3, h, w, generator=g), patch=PATCH)
        gh, gw = pyr.grid_shape(PATCH, 0)
        s = torch.rand(3, gh, gw, generator=g) ** int(torch.randint(1, 12, (1,), generator=g))
        s[int(trial % 3)] = 1.0                                  # a flat map in the batch
        budget = int(torch.randint(64, gh * gw + 1, (1,), generator=g))

        def go():
            return allocate(name, pyr, s, budget, fixation=(0.5, 0.5))
        assert digest(go()) == digest(guarded(go)), (name, trial, (gh, gw), budget)


def _fixation_for(name: str, b: int, device, k: int = 2) -> torch.Tensor:
    """An explicit fixation (``[B, k, 2]`` for ``multi_fixation``) made on ``device``."""
    g = torch.Generator().manual_seed(7)
    if name == "multi_fixation":
        return torch.rand(b, k, 2, generator=g).to(device)
    return torch.rand(b, 2, generator=g).to(device)


@pytest.mark.parametrize("name", SYNC_FREE)
def test_runs_on_the_scores_device(name, pins):
    """On ``meta`` tensors, under the guard (which also forbids copies between devices),
    every pinned case and variant that the method accepts: every output tensor is on the
    scores' device, with the CPU result's shapes."""
    ran = 0
    for n, i, j in pin_keys([name]):
        if pins[f"{n}|{i}|{j}"].startswith("ValueError"):
            continue
        pyr, s, budget, _ = case(i)
        kw = ([{}] + VARIANTS.get(name, []))[j]
        k = kw.get("k", 2)
        want = allocate(name, pyr, s, None if name == "full" else budget,
                        **{**kw, "fixation": _fixation_for(name, s.shape[0], "cpu", k)})
        meta = Pyramid(tuple(lv.to("meta") for lv in pyr.levels))
        kw = {**kw, "fixation": _fixation_for(name, s.shape[0], "meta", k)}
        sm = s.to("meta")

        def go():
            return allocate(name, meta, sm, None if name == "full" else budget, **kw)
        go()                                    # caches (strata, constants) made once
        ts = guarded(go)
        for field in ("centers", "levels", "scores", "fixations"):
            got = getattr(ts, field)
            assert got.device.type == "meta", (name, i, j, field)
            assert got.shape == getattr(want, field).shape, (name, i, j, field)
        ran += 1
    assert ran


def test_default_fixation_is_sync_free():
    from fovea_core.allocators.base import fixation_from_scores

    _, s, _, _ = case(0)
    want = fixation_from_scores(s)
    s_meta = s.to("meta")
    with no_host_sync():
        got = fixation_from_scores(s)
        on_meta = fixation_from_scores(s_meta)           # nothing made on another device
    assert torch.equal(got, want)
    assert on_meta.device.type == "meta" and on_meta.shape == want.shape


def test_the_guard_catches_host_reads_and_syncing_ops():
    x = torch.arange(6.0)
    for bad in (lambda: x.sum().item(), lambda: bool(x.max() > 2), lambda: int(x[0]),
                lambda: x.tolist(), lambda: x.cpu(), lambda: torch.nonzero(x),
                lambda: x[x > 2], lambda: torch.unique(x), lambda: torch.bincount(x.long()),
                lambda: torch.repeat_interleave(x.long()),
                lambda: torch.ones(2).to("meta")):
        with no_host_sync(), pytest.raises(HostSync):
            bad()
    with no_host_sync():                        # what allocators legitimately do
        torch.topk(x, 2).indices.sort()
        torch.repeat_interleave(x, 2)
        torch._assert_async(torch.isfinite(x).all(), "finite")
        assert bool(3) and int(2.0) == 2        # Python numbers are not tensors
    assert bool(x.sum() > 0)                    # restored afterwards


def test_device_path_of_the_value_checks():
    """A failed check raises on the CPU (exact message); its device path is
    ``torch._assert_async`` (on the CPU it raises at once, with no message to match)."""
    pyr, s, budget, _ = case(0)
    bad = s.clone()
    bad[0, 1, 1] = float("nan")
    with pytest.raises(ValueError, match=r"topk: scores contain NaN \(1 cells\)"):
        allocate("topk", pyr, bad, budget)
    with no_host_sync(), pytest.raises(RuntimeError):
        allocate("topk", pyr, bad, budget, fixation=(0.5, 0.5))
    with pytest.raises(ValueError, match="fixation must be finite"):
        allocate("topk", pyr, s, budget, fixation=(0.5, 1.5))


# ----------------------------------------------------------------------------- Hamilton
def _random_weights(g: np.random.Generator, b: int, n: int) -> np.ndarray:
    kind = g.integers(0, 5)
    if kind == 0:
        return g.random((b, n))
    if kind == 1:                                   # ties: small integers
        return g.integers(0, 4, (b, n)).astype(np.float64)
    if kind == 2:                                   # equal weights and zero rows
        w = np.ones((b, n))
        w[g.random(b) < 0.5] = 0.0
        return w
    if kind == 3:                                   # wide range, some negative (count as 0)
        return g.standard_normal((b, n)) * 10.0 ** g.integers(-3, 4, (b, n))
    return g.random((b, n)) ** 8                    # a few dominant groups


def test_torch_largest_remainder_equals_the_numpy_rule():
    """Hamilton's method on torch gives exactly the quotas of the numpy rule
    (:func:`fovea_book.biology.cortex.hamilton`), on many random cases (ties, zero rows,
    negative weights, minimum, capacity, per-row totals)."""
    from fovea_core.allocators.base import largest_remainder
    from fovea_book.biology.cortex import hamilton

    g = np.random.default_rng(22)
    for trial in range(600):
        n = int(g.choice([1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 64, 100, 129, 300]))
        b = int(g.integers(1, 5))
        w = _random_weights(g, b, n)
        minimum = int(g.integers(0, 3))
        if g.random() < 0.5:
            total = int(g.integers(0, 4 * n + 10))
        else:
            total = g.integers(0, 4 * n + 10, b)
        cap = g.integers(0, 8, (b, n)) if g.random() < 0.3 else None
        want = hamilton(w, total, minimum=minimum, capacity=cap)
        got = largest_remainder(torch.from_numpy(w), torch.from_numpy(total)
                                if isinstance(total, np.ndarray) else total, minimum,
                                None if cap is None else torch.from_numpy(cap))
        assert got.dtype == torch.int64
        np.testing.assert_array_equal(got.numpy(), want, err_msg=f"trial {trial}")


def test_torch_largest_remainder_is_sync_free_and_checks_like_numpy():
    from fovea_core.allocators.base import largest_remainder

    w = torch.rand(3, 16, dtype=torch.float64)
    with no_host_sync():
        largest_remainder(w, 40, 1, torch.full((3, 16), 5))
        largest_remainder(w, torch.tensor([3, 0, 40]))
    for args, msg in (((torch.zeros(2, 0), 3), "non-empty last axis"),
                      ((torch.tensor([[1.0, float("nan")]]), 3), "finite"),
                      ((w, -1), "total must be"), ((w, 2.5), "total must be"),
                      ((w, torch.tensor([1, -1, 2])), "total must be")):
        with pytest.raises(ValueError, match=msg):
            largest_remainder(*args)


# ----------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("name", SYNC_FREE)
def test_gpu_allocators_sync_free_and_equal_to_cpu(name):
    """On CUDA scores (explicit fixation on the device), under
    ``torch.cuda.set_sync_debug_mode("error")``: no host sync, every output on the GPU, the
    same tokens as on the CPU (keys and levels exact, scores to float rounding: sums on the
    GPU run in another order)."""
    dev = torch.device("cuda")
    for n, i, j in pin_keys([name]):
        pyr, s, budget, _ = case(i)
        budget = None if name == "full" else budget
        kw = ([{}] + VARIANTS.get(name, []))[j]
        fix = _fixation_for(name, s.shape[0], "cpu", kw.get("k", 2))
        try:
            want = allocate(name, pyr, s, budget, **{**kw, "fixation": fix})
        except ValueError:
            continue                              # the case does not fit this method
        pyr_d = Pyramid(tuple(lv.to(dev) for lv in pyr.levels))
        s_d, kw = s.to(dev), {**kw, "fixation": fix.to(dev)}
        allocate(name, pyr_d, s_d, budget, **kw)  # warm-up: caches, cuBLAS handles
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = allocate(name, pyr_d, s_d, budget, **kw)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
        for field in ("centers", "levels", "scores", "fixations"):
            assert getattr(got, field).device.type == "cuda", (name, i, field)
        assert torch.equal(got.keys().cpu(), want.keys()), (name, i)
        assert torch.equal(got.levels.cpu(), want.levels), (name, i)
        assert torch.equal(got.fixations.cpu(), want.fixations), (name, i)
        torch.testing.assert_close(got.scores.cpu(), want.scores, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gpu_default_fixation_on_the_device():
    pyr, s, budget, _ = case(0)
    pyr_d = Pyramid(tuple(lv.cuda() for lv in pyr.levels))
    s_d = s.cuda()                      # the copy to the device syncs; the allocation must not
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ts = allocate("topk", pyr_d, s_d, budget)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert ts.fixations.is_cuda and ts.centers.is_cuda


if __name__ == "__main__" and "--pin" in sys.argv:
    # run once on the code *before* a change, from outside the checkout so that
    # PYTHONPATH=<a checkout of that commit> decides which fovea_core is imported
    PINS_PATH.write_text(json.dumps({f"{n}|{i}|{j}": run_case(n, i, j)
                                     for n, i, j in pin_keys(NAMES)}, indent=1, sort_keys=True)
                         + "\n")
