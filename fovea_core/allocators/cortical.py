"""V1-style (cortical) allocation: foveal block + log-polar periphery, levels from M(E).

This is the torch reference of the ``v1_candidates`` CUDA kernel in
``cuda/fovea_kernels.cuh`` (the same formulas, in float64 so both agree exactly on which
candidate is valid); ``tests/test_kernels.py`` checks the two against each other. The
plan (:func:`plan_v1`) is what the book's kernel path executes
(``fovea_book.kernels.v1_layout``); the kernel layer never imports this module.

The layout, for a fixation ``f`` (pixels) on an image seen under ``fov_deg`` degrees across
its width (``ppd = W / fov_deg`` pixels per degree):

1. **Fovea.** An ``fs x fs`` block of level-0 grid cells centred on ``f`` (clipped into the
   image), at least ``round(fovea_deg * ppd / patch)`` (see 5): full resolution over the
   central ``fovea_deg`` degrees (2 deg by default: the conventional extent of foveal vision;
   a parameter, not a measured constant).
2. **Periphery.** Log-polar rings outside the fovea, (nearly) uniform in V1 coordinates:
   ``A`` rays ``dtheta = 2 pi / A`` apart and rings whose ``E + e0`` grows by
   ``exp(s)`` per ring, ``s ~ dtheta``, i.e. equal steps of the complex-log map
   ``w = log(z + e0)`` [Schwartz 1980] whose derivative is the linear magnification
   ``M(E) = k / (E + e0)`` [Horton & Hoyt 1991, eq. 1]; odd rings are rotated by half a ray.
   Ring ``r`` lies at ``E_r = (E_f + e0) exp(s (r + 1/2)) - e0``, ``E_f`` the foveal radius.
3. **Level from magnification.** Samples are ``E dtheta`` apart tangentially and
   ``(E + e0) s`` radially; a token's footprint ``patch * 2**level`` is matched to their
   geometric mean, ``level = round(log2(sqrt(E (E + e0) dtheta s) ppd / patch))``, clipped
   to the pyramid: one level coarser each time ``1 / M(E)`` doubles.
4. **Exactly N.** Per image, ``A`` comes from the sample density ``1 / (E (E + e0) dtheta^2)``
   per deg^2: ``A = ceil(2 pi sqrt(margin (N - fs^2) / I))`` with
   ``I = integral over (image minus fovea) of dA / (E (E + e0))`` (midpoint rule, 64 x 64).
   Because rays and rings are integers, the ring step ``s`` (isotropic value ``dtheta``) is
   then bisected so that the periphery inside the image holds just
   ``ceil(margin (N - fs^2))`` valid candidates. Candidates are ordered fovea, then rings
   inward to outward, then a fallback (the level-0 grid, row-major; not needed in
   practice); the first ``N`` valid (inside the image, outside the foveal block) and
   distinct ones are kept. The few spare candidates of the outermost ring are dropped; its
   rays are visited with a golden-ratio stride, so what is kept is spread over all
   directions.
5. **Fovea size.** ``fs`` is the smallest block of at least ``fovea_deg`` whose first
   peripheral ring is no denser than level-0 tokens (spacing >= ``patch / sqrt(2)``): a
   smaller fovea would stack level-0 tokens on top of each other in the inner rings, since no
   level is finer than 0. For 273 tokens on a 1024-px image at 20 deg this gives the 2 deg
   fovea (6 x 6 cells) for a central fixation and a larger one for fixations near a border.

Parameters: Horton & Hoyt's (1991) V1 magnification ``M(E) = k / (E + e0)``, ``k = 17.3`` mm,
``e0 = 0.75`` deg (:data:`HORTON_HOYT_K`, :data:`HORTON_HOYT_E0`; the book's biology chapters
use the same constants). The
field of view defaults to 20 deg across: a 1024-px image shown about 30 cm wide at a typical
desktop viewing distance of about 85 cm (``2 atan(15 / 85) = 20 deg``); pass ``fov_deg`` for
other viewing conditions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fovea_core.allocators.base import check_inputs, resolve_fixation
from fovea_core.pyramid import Pyramid
from fovea_core.tokens import TokenSet, token_keys

HORTON_HOYT_K: float = 17.3   # mm (Horton & Hoyt 1991)
HORTON_HOYT_E0: float = 0.75  # deg (Horton & Hoyt 1991)

__all__ = ["V1Plan", "plan_v1", "v1_candidates", "select_candidates", "v1_cortical",
           "FOV_DEG", "FOVEA_DEG"]

FOV_DEG = 20.0     #: default horizontal field of view of the image, degrees (see module doc)
FOVEA_DEG = 2.0    #: default diameter of the full-resolution foveal block, degrees
_INTEGRAL_GRID = 64
_TWO_PI = 2.0 * math.pi
_PHI = (1 + math.sqrt(5)) / 2
_BISECTION_STEPS = 10


@dataclass(frozen=True)
class V1Plan:
    """Everything the candidate kernel needs, per batch.

    Attributes:
        image_size: ``(H, W)`` pixels.  patch: token side.  num_levels: pyramid levels.
        budget: N.  ppd: pixels per degree.  e0, k: Horton-Hoyt parameters (deg, mm).
        fix_px: ``[B, 2]`` float64 fixation pixels.  fovea: ``[B]`` int32 foveal block side
        (cells).  rays: ``[B]`` int32 rays A per image.  rings: ``[B]`` int32 rings R.
        stride: ``[B]`` int32 ray visiting stride, coprime with A (golden ratio).
        ring_step: ``[B]`` float64 ring spacing in ``log(E + e0)`` (about ``2 pi / A``).
    """

    image_size: tuple[int, int]
    patch: int
    num_levels: int
    budget: int
    ppd: float
    e0: float
    k: float
    fix_px: torch.Tensor
    fovea: torch.Tensor
    rays: torch.Tensor
    rings: torch.Tensor
    stride: torch.Tensor
    ring_step: torch.Tensor

    @property
    def fs_max(self) -> int:
        return int(self.fovea.max())

    @property
    def a_max(self) -> int:
        return int(self.rays.max())

    @property
    def r_max(self) -> int:
        return int(self.rings.max())

    @property
    def grid(self) -> tuple[int, int]:
        h, w = self.image_size
        return -(-h // self.patch), -(-w // self.patch)

    @property
    def k_slots(self) -> int:
        """Candidate slots per image: fovea + periphery + level-0 fallback grid."""
        gh, gw = self.grid
        return self.fs_max ** 2 + self.r_max * self.a_max + gh * gw

    def cortical_spacing_mm(self) -> torch.Tensor:
        """``[B]`` V1 distance between neighbouring peripheral tokens, ``k * dtheta`` (mm)."""
        return self.k * _TWO_PI / self.rays.double()


def _fovea_origin(fix_px: torch.Tensor, fs: torch.Tensor, patch: int, grid: tuple[int, int]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-left cell ``(c0, r0)`` of the foveal block (as in ``v1_candidate``); ``fix_px``
    ``[..., 2]`` and ``fs`` broadcast together."""
    gh, gw = grid
    fs = fs.long()
    c0 = torch.floor(fix_px[..., 0] / patch - 0.5 * fs + 0.5).long()
    r0 = torch.floor(fix_px[..., 1] / patch - 0.5 * fs + 0.5).long()
    return (torch.minimum(c0, gw - fs).clamp_min(0), torch.minimum(r0, gh - fs).clamp_min(0))


def plan_v1(fixations: torch.Tensor, image_size: tuple[int, int], budget: int, *,
            patch: int = 16, num_levels: int, fov_deg: float = FOV_DEG,
            fovea_deg: float = FOVEA_DEG, e0: float = HORTON_HOYT_E0, k: float = HORTON_HOYT_K,
            margin: float = 1.03) -> V1Plan:
    """Choose the fovea size and, per image, the number of rays and rings (module doc, 4).

    Args:
        fixations: ``[B, 2]`` (x, y) in ``[0, 1]``.
        image_size: ``(H, W)``.  budget: N >= 1.  num_levels: pyramid levels >= 1.
        fov_deg: degrees spanned by the image width (0 < fov_deg <= 180).
        fovea_deg: foveal block diameter in degrees (>= 0; at least one cell is used).
        e0, k: Horton & Hoyt (1991) magnification parameters (deg, mm).
        margin: over-provisioning of the periphery's candidate count (>= 1).
    """
    h, w = int(image_size[0]), int(image_size[1])
    fix = torch.as_tensor(fixations, dtype=torch.float64).reshape(-1, 2).cpu()
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    if not 0 < fov_deg <= 180:
        raise ValueError(f"fov_deg must be in (0, 180], got {fov_deg}")
    if fovea_deg < 0:
        raise ValueError(f"fovea_deg must be >= 0, got {fovea_deg}")
    if e0 <= 0:
        raise ValueError(f"e0 must be > 0 deg, got {e0}")
    if margin < 1:
        raise ValueError(f"margin must be >= 1, got {margin}")
    if num_levels < 1:
        raise ValueError(f"num_levels must be >= 1, got {num_levels}")
    if fix.numel() == 0 or fix.min() < 0 or fix.max() > 1:
        raise ValueError("fixations must be [B, 2] with (x, y) in [0, 1]")
    gh, gw = -(-h // patch), -(-w // patch)
    if budget > gh * gw:
        raise ValueError(f"budget must be <= {gh * gw} (the level-0 grid of a {h}x{w} image "
                         f"with patch {patch}), got {budget}")
    ppd = w / fov_deg
    fs_cap = max(1, min(gh, gw, math.isqrt(budget)))
    fs_min = min(fs_cap, max(1, round(fovea_deg * ppd / patch)))
    fix_px = fix * torch.tensor([w, h], dtype=torch.float64)
    # every foveal size fs in [fs_min, fs_cap] at once: axis 0 = fs, axis 1 = image
    fs_all = torch.arange(fs_min, fs_cap + 1)[:, None]                      # [S, 1]
    c0, r0 = _fovea_origin(fix_px[None], fs_all, patch, (gh, gw))            # [S, B]
    g = _INTEGRAL_GRID
    xs = (torch.arange(g, dtype=torch.float64) + 0.5) * (w / g)
    ys = (torch.arange(g, dtype=torch.float64) + 0.5) * (h / g)
    ecc = torch.sqrt((xs[None, None, :] - fix_px[:, 0, None, None]) ** 2
                     + (ys[None, :, None] - fix_px[:, 1, None, None]) ** 2) / ppd  # [B, g, g]
    lo_x, hi_x = (c0 * patch)[..., None, None], ((c0 + fs_all) * patch)[..., None, None]
    lo_y, hi_y = (r0 * patch)[..., None, None], ((r0 + fs_all) * patch)[..., None, None]
    in_fovea = ((xs >= lo_x) & (xs < hi_x)) & ((ys[:, None] >= lo_y) & (ys[:, None] < hi_y))
    dens = torch.where(in_fovea, 0.0, 1.0 / (ecc.clamp_min(1e-6) * (ecc + e0)))  # [S, B, g, g]
    integral = dens.sum(dim=(-2, -1)) * (w / g) * (h / g) / ppd ** 2        # [S, B]
    n_per = (budget - fs_all ** 2).double()
    rays = torch.ceil(_TWO_PI * torch.sqrt(margin * n_per / integral.clamp_min(1e-12)))
    rays = rays.clamp(6, 4096)
    # smallest fovea whose first ring is no denser than the level-0 tokens (spacing >= p/sqrt2)
    dth = _TWO_PI / rays
    ef = 0.5 * fs_all.double() * patch / ppd
    e1 = (ef + e0) * torch.exp(0.5 * dth) - e0
    ok = torch.sqrt(e1 * (e1 + e0)) * dth * ppd >= patch / math.sqrt(2)
    ok[-1] = True
    pick = ok.double().argmax(dim=0)                                          # first True
    fovea = fs_all[pick, 0].to(torch.int32)
    rays = rays.gather(0, pick[None])[0].to(torch.int32)
    # fit exactly: the ring step (isotropic value 2 pi / A) is bisected per image so that the
    # periphery holds ceil(margin * (N - fs^2)) valid candidates with as few spare as possible
    need = torch.ceil(margin * (budget - fovea.double() ** 2))
    base = _TWO_PI / rays.double()
    args = ((h, w), patch, num_levels, budget, ppd, e0, k, fix_px, fovea, rays)
    lo, hi = torch.log(base * 0.6), torch.log(base * 1.6)   # log ring step; want count(lo) ok
    for _ in range(8):                                       # widen until lo really is dense enough
        short = _periphery(_make_plan(*args, torch.exp(lo)))[3].sum(dim=1) < need
        if not bool(short.any()):
            break
        lo = torch.where(short, lo - math.log(2.0), lo)
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        ok = _periphery(_make_plan(*args, torch.exp(mid)))[3].sum(dim=1) >= need
        lo, hi = torch.where(ok, mid, lo), torch.where(ok, hi, mid)
    return _make_plan(*args, torch.exp(lo))


def _make_plan(size, patch, num_levels, budget, ppd, e0, k, fix_px, fovea, rays, ring_step
               ) -> V1Plan:
    """Rings (out to the farthest image corner) and strides for the given fovea, rays, step."""
    h, w = size
    ef = 0.5 * fovea.double() * patch / ppd
    corners = torch.tensor([[0.0, 0.0], [w, 0.0], [0.0, h], [w, h]], dtype=torch.float64)
    e_far = (fix_px[:, None, :] - corners[None]).norm(dim=-1).max(dim=1).values / ppd
    rings = torch.ceil(torch.log((e_far + e0) / (ef + e0)) / ring_step - 0.5) + 1
    rings = rings.clamp(1, 100_000).to(torch.int32)
    return V1Plan((h, w), patch, num_levels, budget, ppd, e0, k, fix_px, fovea,
                  rays.to(torch.int32), rings, _golden_strides(rays.to(torch.int32)),
                  ring_step.double())

def _golden_strides(rays: torch.Tensor) -> torch.Tensor:
    """Per image the integer nearest ``A / phi^2`` (>= 1) that is coprime with ``A``."""
    stride = torch.round(rays.double() * (1 - 1 / _PHI)).clamp_min(1).long()
    for _ in range(64):                           # a few increments always suffice
        bad = torch.gcd(stride, rays.long()) != 1
        if not bool(bad.any()):
            break
        stride = torch.where(bad, stride + 1, stride)
    return stride.to(torch.int32)


def _periphery(plan: V1Plan) -> tuple[torch.Tensor, ...]:
    """Periphery slots ``[B, R_max * A_max]`` (ring-major): pixel x, y (float64), level, valid."""
    h, w = plan.image_size
    p, f64 = plan.patch, torch.float64
    gh, gw = plan.grid
    a_max = plan.a_max
    fix = plan.fix_px
    fs = plan.fovea.long()[:, None]                                          # [B, 1]
    c0, r0 = _fovea_origin(fix, fs[:, 0], p, (gh, gw))
    kp = torch.arange(plan.r_max * a_max)
    ring, ray = (kp // a_max)[None], (kp % a_max)[None]                     # [1, R*A]
    dth = (_TWO_PI / plan.rays.clamp_min(1).to(f64))[:, None]               # [B, 1]
    ef = 0.5 * fs.to(f64) * p / plan.ppd                                     # [B, 1]
    rstep = plan.ring_step[:, None]
    ecc = (ef + plan.e0) * torch.exp(rstep * (ring.to(f64) + 0.5)) - plan.e0
    direction = (ray * plan.stride.long()[:, None]) % plan.rays.long().clamp_min(1)[:, None]
    th = dth * (direction.to(f64) + 0.5 * (ring & 1).to(f64))
    px = torch.floor((fix[:, 0:1] + ecc * plan.ppd * torch.cos(th)) * 256.0 + 0.5) / 256.0
    py = torch.floor((fix[:, 1:2] + ecc * plan.ppd * torch.sin(th)) * 256.0 + 0.5) / 256.0
    spacing = torch.sqrt(ecc * (ecc + plan.e0) * dth * rstep) * plan.ppd
    lvl = torch.floor(torch.log2(spacing / p) + 0.5).clamp(0, plan.num_levels - 1)
    in_image = (px >= 0) & (px < w) & (py >= 0) & (py < h)
    in_fovea = ((px >= (c0[:, None] * p).to(f64)) & (px < ((c0[:, None] + fs) * p).to(f64))
                & (py >= (r0[:, None] * p).to(f64)) & (py < ((r0[:, None] + fs) * p).to(f64)))
    ok = ((ray < plan.rays[:, None]) & (ring < plan.rings[:, None]) & in_image & ~in_fovea)
    return px, py, lvl, ok


def v1_candidates(plan: V1Plan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All candidate slots, vectorised: ``cxy [B, K, 2]`` float32 in [0, 1],
    ``level [B, K]`` int64, ``valid [B, K]`` bool (torch twin of ``v1_candidate``)."""
    h, w = plan.image_size
    p = plan.patch
    gh, gw = plan.grid
    nf = plan.fs_max ** 2
    fix = plan.fix_px
    fs = plan.fovea.long()[:, None]                                          # [B, 1]
    c0, r0 = _fovea_origin(fix, fs[:, 0], p, (gh, gw))
    b = fix.shape[0]
    # fovea + fallback: level-0 grid cells
    m = torch.arange(nf)[None]
    fov_x = ((c0[:, None] + m % fs).double() + 0.5) * p                     # [B, F]
    fov_y = ((r0[:, None] + m // fs).double() + 0.5) * p
    fov_ok = m < fs * fs
    kk = torch.arange(gh * gw)
    fb_x = ((kk % gw).double() + 0.5).mul(p).expand(b, -1)
    fb_y = ((kk // gw).double() + 0.5).mul(p).expand(b, -1)
    px, py, lvl, ok = _periphery(plan)
    x = torch.cat([fov_x, px, fb_x], dim=1).clamp(max=w)
    y = torch.cat([fov_y, py, fb_y], dim=1).clamp(max=h)
    cxy = torch.stack([(x / w).float(), (y / h).float()], dim=-1)
    level = torch.cat([torch.zeros(b, nf), lvl.expand(b, -1), torch.zeros(b, gh * gw)],
                      dim=1).long()
    valid = torch.cat([fov_ok.expand(b, -1), ok,
                       torch.ones(b, gh * gw, dtype=torch.bool)], dim=1)
    return cxy, level, valid


def select_candidates(cxy: torch.Tensor, level: torch.Tensor, valid: torch.Tensor, budget: int,
                      image_size: tuple[int, int]) -> torch.Tensor:
    """Slot indices ``[B, budget]`` of the first ``budget`` valid, distinct candidates.

    Distinct = different :func:`fovea_core.tokens.token_keys` (the one token-identity rule,
    the same as :meth:`TokenSet.keys`: level and centre to 1/8 px); the first occurrence of a
    key wins. Raises ``ValueError`` if an image has too few.
    """
    h, w = image_size
    kslots = level.shape[1]
    # invalid slots may lie outside the image; their keys are replaced below, so clamping
    # them into [0, 1] (a no-op for every valid slot) only keeps the key's domain
    keys = token_keys(cxy.clamp(0, 1) * cxy.new_tensor([w, h]), level)
    keys = torch.where(valid, keys, -1 - torch.arange(kslots)[None])       # never collide
    skeys, perm = torch.sort(keys, dim=1, stable=True)
    first_sorted = torch.ones_like(valid)
    first_sorted[:, 1:] = skeys[:, 1:] != skeys[:, :-1]
    first = torch.zeros_like(valid).scatter(1, perm, first_sorted)
    keep = valid & first
    rank = keep.long().cumsum(1)
    if (rank[:, -1] < budget).any():
        bad = int((rank[:, -1] < budget).nonzero()[0])
        raise ValueError(f"image {bad} has only {int(rank[bad, -1])} distinct candidates for "
                         f"budget {budget}")
    chosen = keep & (rank <= budget)
    return chosen.nonzero()[:, 1].reshape(-1, budget)


def v1_cortical(pyramid: Pyramid, scores: torch.Tensor, budget: int, *,
                fixation=None, query=None, seed: int = 0, patch: int = 16,
                **params) -> TokenSet:
    """V1 cortical-magnification allocator: exactly ``budget`` distinct tokens per image.

    Inputs go through the shared checks of every allocator
    (:func:`~fovea_core.allocators.base.check_inputs`: scores ``[B, Gh, Gw]`` on the
    level-0 grid of ``patch``, finite; ``budget`` an int in ``[1, Gh * Gw]``) and the shared
    fixation rule (:func:`~fovea_core.allocators.base.resolve_fixation`), so on the same
    scores it fixates where every other allocator does.

    Args:
        pyramid: the image pyramid (gives ``B``, ``(H, W)`` and the number of levels).
        scores: ``[B, Gh, Gw]`` importance on the base patch grid (``Gh = ceil(H / patch)``;
            a tensor or array); only used to pick the fixation when ``fixation`` is None,
            and copied into ``TokenSet.scores`` (the score of the cell under each token
            centre).
        budget: N tokens per image.
        fixation: ``(x, y)`` in ``[0, 1]`` for every image, or ``[B, 2]``; default: the
            shared rule's peak of ``scores``.
        query, seed: unused (the layout is deterministic and query-free); accepted for the
            allocator interface.
        patch: token side in pixels (the scores' grid must match it).
        **params: :func:`plan_v1`'s keywords: ``fov_deg`` (default 20), ``fovea_deg`` (2),
            ``e0`` and ``k`` (Horton & Hoyt), ``margin`` (1.03).

    Returns:
        :class:`TokenSet` with ``budget`` tokens per image, the fixation in ``fixations``.
    """
    del query, seed
    h, w = pyramid.image_size
    s, n = check_inputs(pyramid, scores, budget, patch=patch, name="v1_cortical")
    fix = resolve_fixation(fixation, s, dtype=torch.float64)       # [B, 2], exact if given
    # the plan's sizes (rays, rings per image) depend on the fixation: it is made on the host
    # (plan_v1 reads the fixation back, a sync on a device) and the layout is copied over
    plan = plan_v1(fix, (h, w), n, patch=patch, num_levels=pyramid.num_levels, **params)
    cxy, level, valid = v1_candidates(plan)
    idx = select_candidates(cxy, level, valid, n, (h, w))
    centers = torch.gather(cxy, 1, idx[..., None].expand(-1, -1, 2)).to(s.device)
    levels = torch.gather(level, 1, idx).to(s.device)
    b, gh, gw = s.shape
    col = (centers[..., 0] * gw).long().clamp(0, gw - 1)
    row = (centers[..., 1] * gh).long().clamp(0, gh - 1)
    tok_scores = s.reshape(b, -1).gather(1, row * gw + col)
    return TokenSet(centers, levels, tok_scores, fix.float()[:, None, :], (h, w), patch)
