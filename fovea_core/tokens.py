"""``TokenSet``: the one structure every stage of the pipeline passes along.

Per image, exactly ``N`` tokens (the budget; identical across the batch, so every
downstream shape is fixed). Token ``n`` of image ``b`` is a ``patch x patch`` sample grid
read at scale ``levels[b, n]`` and centred at ``centers[b, n]``; it covers a square
footprint of ``patch * 2**level`` base pixels. The level is **continuous** (a float):
integer levels are the mip levels of the pyramid, and any level reads the page resampled
at scale ``2**-level`` (:func:`fovea_core.sample.sample`), so a token can be any scale
(e.g. the whole page resized to fit N cells, :func:`fovea_core.allocators.grid.resize`).

Coordinates: ``(x, y)`` normalised to ``[0, 1]`` over the base image, x to the right, y
down; pixel ``i`` spans ``[i, i+1)`` so its centre is ``(i + 0.5) / W``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch


def _as_tensor(x: torch.Tensor | object, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype) if isinstance(x, torch.Tensor) else torch.as_tensor(x, dtype=dtype)


#: Device types whose tensors the host reads without waiting for a device (the CPU). There a
#: value check (:func:`require`) raises the exact ``ValueError`` at once, and a few allocators
#: take a data-dependent shortcut (a ``topk`` sized by the largest quota) that gives the same
#: tokens as their device path. On any other device (CUDA) reading a tensor back would make
#: the host wait, so checks are queued on the device and sizes come from shapes. Add
#: ``"cuda"`` for the exact errors on the GPU, at one host sync per check;
#: ``tests/test_allocators_device.py`` empties it to run the device path on the CPU.
HOST_DEVICES: set[str] = {"cpu"}


def on_host(t: torch.Tensor) -> bool:
    """Whether the host reads ``t`` without a sync (its device type is in :data:`HOST_DEVICES`)."""
    return t.device.type in HOST_DEVICES


def require(ok: torch.Tensor, message: str, *, detail: Callable[[], str] | None = None,
            error: type[Exception] = ValueError) -> None:
    """Check that every element of the bool tensor ``ok`` is true, without a host sync on a
    device.

    Where :func:`on_host` (the CPU) this raises ``error`` at once, with ``detail()`` (built
    only on failure, so it may read the data) or else ``message``. On any other device (CUDA)
    the check is ``torch._assert_async(ok.all(), message)``: no sync, and a violation surfaces
    at the device's next synchronisation as a device-side assertion (a ``RuntimeError``;
    torch documents that it leaves the CUDA context unusable), so a bad input still stops
    the run instead of flowing on silently.
    """
    if on_host(ok):
        if not bool(ok.all()):
            raise error(detail() if detail is not None else message)
    else:
        torch._assert_async(ok.all(), message)


#: a level is quantised to 1/LEVEL_QUANTUM in :func:`token_keys` (two tokens whose levels
#: differ by less are the same token)
LEVEL_QUANTUM = 256


def token_keys(centers_px: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """One integer key per token ``[...]`` identifying (level, centre), the one token-identity
    rule of the package.

    Args:
        centers_px: ``[..., 2]`` centres in base pixels (x, y), ``0 <= x, y < 2**17``.
        levels: ``[...]`` float levels ``0 <= level < 2**12 / LEVEL_QUANTUM``.

    The level is rounded to ``1 / LEVEL_QUANTUM`` and the centre to 1/8 pixel:
    ``key = (round(256 level) * 2**20 + round(8 y)) * 2**20 + round(8 x)`` (52 bits).
    """
    xy = torch.round(centers_px * 8).long()
    lq = torch.round(levels.double() * LEVEL_QUANTUM).long()
    return (lq * 2**20 + xy[..., 1]) * 2**20 + xy[..., 0]


@dataclass(frozen=True, eq=False)
class TokenSet:
    """A batch of fixed-size foveated token sets.

    Attributes:
        centers: ``[B, N, 2]`` float32, ``(x, y)`` in ``[0, 1]``.
        levels: ``[B, N]`` float32 scale, finite, ``0 <= level``; level ``l`` covers
            ``patch * 2**l`` base pixels (``l`` need not be an integer).
        scores: ``[B, N]`` float32 importance of each token (finite).
        fixations: ``[B, K, 2]`` float32 fixation(s) in ``[0, 1]`` used to allocate.
        image_size: ``(H, W)`` of the base image in pixels.
        patch: samples per token side (16 by default; 14 for Qwen-style encoders).
        stage: optional ``[B, N]`` int64 label of the step that produced each token (e.g. a
            cascade's 0 = gist, 1 = fovea; meaning defined by the producer), or ``None``.
    """

    centers: torch.Tensor
    levels: torch.Tensor
    scores: torch.Tensor
    fixations: torch.Tensor
    image_size: tuple[int, int]
    patch: int = 16
    stage: torch.Tensor | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "centers", _as_tensor(self.centers, torch.float32))
        lv = self.levels
        if isinstance(lv, torch.Tensor) and lv.dtype == torch.bool:
            raise ValueError("levels must be a float tensor [B, N], got a bool tensor")
        object.__setattr__(self, "levels", _as_tensor(lv, torch.float32))
        object.__setattr__(self, "scores", _as_tensor(self.scores, torch.float32))
        fix = _as_tensor(self.fixations, torch.float32)
        object.__setattr__(self, "fixations", fix[:, None, :] if fix.ndim == 2 else fix)
        if self.stage is not None:
            object.__setattr__(self, "stage", _as_tensor(self.stage, torch.int64))
        size = tuple(self.image_size) if isinstance(self.image_size, (tuple, list)) else ()
        if len(size) != 2 or any(isinstance(v, bool) or int(v) != v for v in size):
            raise ValueError(f"image_size must be (H, W) in whole pixels, got {self.image_size!r}")
        object.__setattr__(self, "image_size", (int(size[0]), int(size[1])))
        if isinstance(self.patch, bool) or not isinstance(self.patch, int):
            raise ValueError(f"patch must be an int >= 1, got {self.patch!r}")
        self.validate()

    # ---------------------------------------------------------------- validation
    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field that breaks the contract."""
        c, lv, s, f = self.centers, self.levels, self.scores, self.fixations
        if c.ndim != 3 or c.shape[-1] != 2:
            raise ValueError(f"centers must be [B, N, 2], got {tuple(c.shape)} "
                             "(a ragged batch cannot be a TokenSet: every image has N tokens)")
        b, n = c.shape[:2]
        if b < 1:
            raise ValueError("centers: a TokenSet needs at least one image (B >= 1), got B = 0")
        if n < 1:
            raise ValueError("centers: a TokenSet needs at least one token per image (N >= 1)")
        if lv.shape != (b, n):
            raise ValueError(f"levels must be [B, N] = [{b}, {n}], got {tuple(lv.shape)}")
        if s.shape != (b, n):
            raise ValueError(f"scores must be [B, N] = [{b}, {n}], got {tuple(s.shape)}")
        if f.ndim != 3 or f.shape[0] != b or f.shape[1] < 1 or f.shape[-1] != 2:
            raise ValueError(f"fixations must be [B, K, 2] with B = {b}, got {tuple(f.shape)}")
        # value checks: exact errors on the CPU, queued on a device (no host sync, :func:`require`)
        c_ok = torch.isfinite(c) & (c >= 0) & (c <= 1)
        require(c_ok, "centers must be finite and in [0, 1]", detail=lambda: (
            f"centers must be finite and in [0, 1]; found {c[~c_ok][:3].tolist()}"))
        require(torch.isfinite(f) & (f >= 0) & (f <= 1), "fixations must be finite and in [0, 1]")
        require(torch.isfinite(lv),
                "levels must be finite (a level l covers patch * 2**l pixels)")
        require(lv >= 0, "levels must be >= 0",
                detail=lambda: f"levels must be >= 0, found {float(lv.min()):g}")
        require(torch.isfinite(s), "scores must be finite (found NaN or inf)")
        if self.stage is not None and tuple(self.stage.shape) != (b, n):
            raise ValueError(f"stage must be None or [B, N] = [{b}, {n}], "
                             f"got {tuple(self.stage.shape)}")
        if self.patch < 1:
            raise ValueError(f"patch must be >= 1, got {self.patch}")
        if min(self.image_size) < 1:
            raise ValueError(f"image_size must be positive, got {self.image_size}")

    # ---------------------------------------------------------------- shape
    @property
    def batch_size(self) -> int:
        return self.centers.shape[0]

    @property
    def budget(self) -> int:
        """N, the number of tokens per image."""
        return self.centers.shape[1]

    @property
    def device(self) -> torch.device:
        return self.centers.device

    # ---------------------------------------------------------------- geometry
    def footprint(self) -> torch.Tensor:
        """Footprint side in base pixels, ``[B, N]`` float: ``patch * 2**level``."""
        return self.patch * torch.exp2(self.levels)

    def centers_px(self) -> torch.Tensor:
        """Centres in base pixels ``[B, N, 2]`` (x, y)."""
        h, w = self.image_size
        return self.centers * self.centers.new_tensor([w, h])

    def boxes(self) -> torch.Tensor:
        """Footprints as pixel boxes ``[B, N, 4]`` = (x0, y0, x1, y1); may leave the image."""
        half = (self.footprint() / 2)[..., None]
        xy = self.centers_px()
        return torch.cat([xy - half, xy + half], dim=-1)

    def base_cells(self) -> torch.Tensor:
        """Index ``(row, col)`` ``[B, N, 2]`` of the level-0 patch cell under each centre."""
        h, w = self.image_size
        gh, gw = -(-h // self.patch), -(-w // self.patch)
        xy = self.centers_px() / self.patch
        col = xy[..., 0].floor().long().clamp(0, gw - 1)
        row = xy[..., 1].floor().long().clamp(0, gh - 1)
        return torch.stack([row, col], dim=-1)

    def keys(self) -> torch.Tensor:
        """Integer key per token ``[B, N]`` identifying (level, centre): :func:`token_keys`."""
        return token_keys(self.centers_px(), self.levels)

    def is_distinct(self) -> torch.Tensor:
        """``[B]`` bool: no two tokens of an image share level and centre."""
        k = self.keys().sort(dim=1).values
        return (k[:, 1:] != k[:, :-1]).all(dim=1) if self.budget > 1 else torch.ones(
            self.batch_size, dtype=torch.bool, device=k.device)

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_grid(cls, rows: torch.Tensor, cols: torch.Tensor, levels: torch.Tensor | float,
                  *, image_size: tuple[int, int], patch: int = 16,
                  scores: torch.Tensor | None = None,
                  fixations: torch.Tensor | None = None,
                  stage: torch.Tensor | None = None) -> "TokenSet":
        """Tokens at cells ``(row, col)`` of the level-``l`` patch grid, all ``[B, N]``.

        The cell ``(i, j)`` of level ``l`` has its centre at pixel
        ``((j + 0.5) * s, (i + 0.5) * s)`` with ``s = patch * 2**l``, clipped into the image.
        """
        rows, cols = rows.long(), cols.long()
        if isinstance(levels, (int, float)):           # a scalar: made on the cells' device
            levels = torch.full((), float(levels), device=rows.device)
        lv = torch.as_tensor(levels, dtype=torch.float32).expand_as(rows)
        h, w = image_size
        side = patch * torch.exp2(lv)
        cx = ((cols.float() + 0.5) * side / w).clamp(0, 1)
        cy = ((rows.float() + 0.5) * side / h).clamp(0, 1)
        if scores is None:
            scores = torch.zeros(rows.shape, device=rows.device)
        if fixations is None:
            fixations = torch.full((rows.shape[0], 1, 2), 0.5, device=rows.device)
        return cls(torch.stack([cx, cy], -1), lv, scores, fixations, image_size, patch, stage)

    def to(self, device: str | torch.device) -> "TokenSet":
        return replace(self, centers=self.centers.to(device), levels=self.levels.to(device),
                       scores=self.scores.to(device), fixations=self.fixations.to(device),
                       stage=None if self.stage is None else self.stage.to(device))

    def __getitem__(self, index: int | slice | torch.Tensor) -> "TokenSet":
        """Select images of the batch (the budget is unchanged)."""
        if isinstance(index, int):
            index = slice(index, index + 1)
        return replace(self, centers=self.centers[index], levels=self.levels[index],
                       scores=self.scores[index], fixations=self.fixations[index],
                       stage=None if self.stage is None else self.stage[index])

    @staticmethod
    def cat(sets: list["TokenSet"]) -> "TokenSet":
        """Concatenate along the batch; all sets must share budget, image size and patch."""
        first = sets[0]
        for s in sets[1:]:
            if (s.budget, s.image_size, s.patch) != (first.budget, first.image_size, first.patch):
                raise ValueError("TokenSet.cat needs equal budget, image_size and patch")
        k = max(s.fixations.shape[1] for s in sets)
        fix = [torch.cat([s.fixations, s.fixations[:, -1:].expand(-1, k - s.fixations.shape[1], -1)],
                         1) for s in sets]
        if len({s.stage is None for s in sets}) > 1:
            raise ValueError("TokenSet.cat needs stage on all sets or on none")
        stage = None if first.stage is None else torch.cat([s.stage for s in sets])
        return TokenSet(torch.cat([s.centers for s in sets]), torch.cat([s.levels for s in sets]),
                        torch.cat([s.scores for s in sets]), torch.cat(fix), first.image_size,
                        first.patch, stage)
