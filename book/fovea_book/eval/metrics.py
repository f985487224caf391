"""Answer metrics (ANLS, exact match), coverage and density of a token set, bootstrap CIs.

ANLS is the DocVQA metric [Mathew et al. 2021], defined for ST-VQA by Biten et al. (2019,
Eq. 1): for a prediction ``p`` and ground-truth answers ``a_j``,

    s(p) = max_j  (1 - NL(p, a_j))  if NL(p, a_j) < tau  else 0,
    NL(p, a) = Levenshtein(p, a) / max(|p|, |a|),

with ``tau = 0.5``, after lower-casing, stripping and collapsing whitespace (the official
evaluation script's normalisation). Dataset ANLS is the mean of ``s`` over questions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from fovea_core.tokens import TokenSet


# ---------------------------------------------------------------- answers
def normalize_answer(text: str) -> str:
    """Lower-case, strip, collapse runs of whitespace (DocVQA evaluation normalisation)."""
    return " ".join(str(text).lower().split())


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insert, delete, substitute all cost 1) between two strings.

    One numpy row per character of ``a``; within a row the insertion recurrence
    ``d[j] = min(d[j], d[j-1] + 1)`` is a running minimum of ``d[j] - j`` plus ``j``.
    """
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return len(a)
    bb = np.frombuffer(b.encode("utf-32-le"), dtype=np.uint32)
    j = np.arange(len(b) + 1)
    prev = j.copy()
    for ch in a.encode("utf-32-le").decode("utf-32-le"):  # loop over characters of a string
        c = np.uint32(ord(ch))
        sub = prev[:-1] + (bb != c)
        cur = np.empty_like(prev)
        cur[0] = prev[0] + 1
        cur[1:] = np.minimum(prev[1:] + 1, sub)
        prev = np.minimum.accumulate(cur - j) + j
    return int(prev[-1])


def normalized_levenshtein(pred: str, answer: str) -> float:
    """``NL = Levenshtein / max(len)`` in ``[0, 1]`` on normalised strings (0 if both empty)."""
    p, a = normalize_answer(pred), normalize_answer(answer)
    n = max(len(p), len(a))
    return 0.0 if n == 0 else levenshtein(p, a) / n


def anls(pred: str, answers: str | Sequence[str], tau: float = 0.5) -> float:
    """ANLS score of one prediction against its accepted answers (Biten et al. 2019, Eq. 1).

    Args:
        pred: the reader's string.
        answers: one answer or several accepted answers.
        tau: threshold in ``(0, 1]``; ``NL >= tau`` scores 0 (DocVQA uses 0.5).
    """
    if not 0 < tau <= 1:
        raise ValueError(f"tau must be in (0, 1], got {tau}")
    answers = [answers] if isinstance(answers, str) else list(answers)
    if not answers:
        raise ValueError("answers must hold at least one string")
    best = 0.0
    for a in answers:  # a handful of accepted answers
        nl = normalized_levenshtein(pred, a)
        best = max(best, 1.0 - nl if nl < tau else 0.0)
    return best


def exact_match(pred: str, answers: str | Sequence[str]) -> float:
    """1.0 if the normalised prediction equals a normalised answer, else 0.0."""
    answers = [answers] if isinstance(answers, str) else list(answers)
    p = normalize_answer(pred)
    return float(any(p == normalize_answer(a) for a in answers))


# ---------------------------------------------------------------- coverage
def strata_coverage(tokens: TokenSet, strata: int = 8) -> torch.Tensor:
    """Fraction of the ``strata x strata`` cells of the image holding >= 1 token centre.

    Returns ``[B]`` float in ``[1/strata^2, 1]``. Uniform grids and stratified sampling
    score 1 once ``N >= strata^2``; a top-K allocator that piles tokens on one region
    scores low: the "blind spots" of the seed's argument.
    """
    if strata < 1:
        raise ValueError(f"strata must be >= 1, got {strata}")
    cell = (tokens.centers * strata).floor().long().clamp(0, strata - 1)  # [B,N,2]
    flat = cell[..., 1] * strata + cell[..., 0]
    hit = torch.zeros(tokens.batch_size, strata * strata, dtype=torch.bool)
    hit.scatter_(1, flat, True)
    return hit.float().mean(1)


def largest_empty_disc(tokens: TokenSet, resolution: int = 64) -> torch.Tensor:
    """Radius in base pixels of the largest disc centred in the image free of token centres.

    Approximated on a ``resolution x resolution`` lattice of candidate disc centres (pixel
    centres of a coarse grid): ``max_q min_n |q - c_n|``. Returns ``[B]`` float.
    """
    if resolution < 2:
        raise ValueError(f"resolution must be >= 2, got {resolution}")
    h, w = tokens.image_size
    gx = (torch.arange(resolution) + 0.5) / resolution * w
    gy = (torch.arange(resolution) + 0.5) / resolution * h
    q = torch.stack(torch.meshgrid(gx, gy, indexing="xy"), -1).reshape(1, -1, 2)
    d = torch.cdist(q.expand(tokens.batch_size, -1, -1), tokens.centers_px())  # [B,Q,N]
    return d.min(-1).values.max(-1).values


def footprint_cover(tokens: TokenSet, grid_shape: tuple[int, int]) -> torch.Tensor:
    """How many token footprints cover each level-0 patch cell: ``[B, Gh, Gw]`` long.

    Footprints (``patch * 2**level`` squares, :meth:`TokenSet.boxes`) are rounded to whole
    cells and clipped to the grid, then rasterised with a 2-D difference array (four
    scatter-adds and two cumulative sums; no loop over tokens).
    """
    gh, gw = grid_shape
    b = tokens.batch_size
    box = torch.round(tokens.boxes() / tokens.patch).long()                   # [B, N, 4]
    x0, y0 = box[..., 0].clamp(0, gw), box[..., 1].clamp(0, gh)
    x1, y1 = box[..., 2].clamp(0, gw), box[..., 3].clamp(0, gh)
    diff = torch.zeros(b, (gh + 1) * (gw + 1), dtype=torch.long, device=box.device)
    one = torch.ones_like(x0)
    for ys, xs, sign in ((y0, x0, 1), (y0, x1, -1), (y1, x0, -1), (y1, x1, 1)):  # 4 corners
        diff.scatter_add_(1, ys * (gw + 1) + xs, sign * one)
    cover = diff.view(b, gh + 1, gw + 1).cumsum(1).cumsum(2)
    return cover[:, :gh, :gw]


def importance_captured(tokens: TokenSet, scores: torch.Tensor) -> torch.Tensor:
    """``[B]``: share of the (min-shifted) importance mass whose cells some footprint covers."""
    s = torch.as_tensor(scores, dtype=torch.float32)
    w = s - s.flatten(1).amin(1).view(-1, *([1] * (s.ndim - 1)))   # a measure: no grid
    cov = footprint_cover(tokens, tuple(w.shape[1:])) > 0
    tot = w.flatten(1).sum(1)
    return torch.where(tot > 0, (w * cov).flatten(1).sum(1) / tot.clamp(min=1e-30),
                       cov.flatten(1).float().mean(1))


# ---------------------------------------------------------------- statistics
def bootstrap_ci(values: np.ndarray | Sequence[float], *, n_boot: int = 2000,
                 ci: float = 0.95, seed: int = 0,
                 stat: Callable[[np.ndarray], np.ndarray] | None = None
                 ) -> tuple[float, float, float]:
    """Percentile bootstrap CI [Efron & Tibshirani 1993] of a statistic over units.

    Args:
        values: ``[n]`` or ``[n, k]``, one row per resampling unit (e.g. per document);
            rows with a non-finite entry are dropped.
        n_boot: bootstrap replicates (>= 100).
        ci: coverage in ``(0, 1)``.
        stat: maps a resampled batch ``[R, n]`` (or ``[R, n, k]``) to ``[R]``; default the
            mean over units. E.g. a paired ratio: ``lambda a: a[..., 0].sum(1) / a[..., 1].sum(1)``.

    Returns:
        ``(estimate, low, high)``; NaNs if no unit is left; the CI collapses to the estimate
        when ``n == 1``.
    """
    if not 0 < ci < 1:
        raise ValueError(f"ci must be in (0, 1), got {ci}")
    if n_boot < 100:
        raise ValueError(f"n_boot must be >= 100, got {n_boot}")
    v = np.asarray(values, dtype=float)
    if v.ndim not in (1, 2):
        raise ValueError(f"values must be [n] or [n, k], got shape {v.shape}")
    keep = np.isfinite(v) if v.ndim == 1 else np.isfinite(v).all(axis=1)
    v = v[keep]
    stat = stat or (lambda a: a.mean(axis=1))
    if len(v) == 0:
        return (float("nan"),) * 3
    est = float(stat(v[None])[0])
    rng = np.random.default_rng(seed)
    reps = stat(v[rng.integers(0, len(v), size=(n_boot, len(v)))])
    lo, hi = np.quantile(reps, [(1 - ci) / 2, (1 + ci) / 2])
    return est, float(lo), float(hi)
