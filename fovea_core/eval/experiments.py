"""Shared set-up of the experiment chapters (notebooks 08-11): data, an ablation, verdicts.

* :func:`load_datasets` -- the synthetic pages and the SROIE receipts of chapter 07 (same
  seeds, same order, so the reader's crop cache is shared between chapters), with a clear
  message instead of an error when the receipts folder is missing;
* :func:`foveal_ratio_pyramid` -- the v2.5 ablation "foveal ratio": a foveated pyramid
  whose share of full-resolution (level-0) tokens is a parameter instead of a consequence
  of the budget;
* :func:`footprint_coverage` -- fraction of the image under at least one token footprint
  (the "context" a token set keeps);
* :func:`paired_vs` -- a family of paired differences against one baseline with their
  verdicts (:mod:`fovea_core.eval.stats` holds the one verdict rule and the protocol's
  statistics; :func:`verdict` and :func:`ci_text` are re-exported from there).
"""

from __future__ import annotations

import math

import torch

from fovea_core.allocators.base import (candidate_grid, cell_centers, cells_to_tokens,
                                        check_inputs, group_rank, resolve_fixation, select)
from fovea_core.eval.documents import Document, synthetic_documents
from fovea_core.eval.stats import ci_text, paired_family, verdict
from fovea_core.paths import DatasetNotFound, dataset_path
from fovea_core.pyramid import Pyramid
from fovea_core.tokens import TokenSet

__all__ = ["load_datasets", "foveal_ratio_pyramid", "footprint_coverage", "verdict",
           "ci_table", "paired_vs", "predicted_vs_measured",
           "ci_text", "SYNTHETIC_SEED"]

#: seed offset of the synthetic pages used by every experiment chapter (chapter 07's)
SYNTHETIC_SEED = 1000


def load_datasets(n_synthetic: int, n_receipts: int, *, data_dir=None, seed: int = 0
                  ) -> tuple[dict[str, list[Document]], str]:
    """``({"synthetic": pages, "sroie": receipts}, message)`` for an experiment chapter.

    Pages are ``synthetic_documents(n_synthetic, seed=SYNTHETIC_SEED + seed)``; receipts are
    the first ``n_receipts`` of ``dataset_path("sroie-dev", data_dir)`` (sorted by id).
    When that folder is missing (:class:`~fovea_core.paths.DatasetNotFound`) or
    ``n_receipts == 0`` the ``"sroie"`` key is absent and ``message`` says why, so a
    notebook prints it and carries on with the synthetic pages.
    """
    if n_synthetic < 1:
        raise ValueError(f"n_synthetic must be >= 1, got {n_synthetic}")
    if n_receipts < 0:
        raise ValueError(f"n_receipts must be >= 0, got {n_receipts}")
    from fovea_core.eval.sroie import load_sroie

    datasets = {"synthetic": synthetic_documents(n_synthetic, seed=SYNTHETIC_SEED + seed)}
    if n_receipts == 0:
        return datasets, "SROIE skipped: n_receipts = 0 in this profile."
    try:
        receipts = load_sroie(dataset_path("sroie-dev", data_dir), limit=n_receipts)
    except DatasetNotFound as err:
        return datasets, (f"SROIE skipped (dataset not found): {str(err).rstrip('.')}. "
                          "The real-data rows below are absent; the synthetic results "
                          "stand alone.")
    if receipts:
        datasets["sroie"] = receipts
    return datasets, f"SROIE: {len(receipts)} receipts loaded."


def foveal_ratio_pyramid(pyramid: Pyramid, scores, budget: int, *, ratio: float = 0.3,
                         max_level: int = 4, iters: int = 40, fixation=None, query=None,
                         seed: int = 0, patch: int = 16) -> TokenSet:
    """Foveated pyramid with a fixed foveal share: ``round(ratio * N)`` level-0 tokens.

    1. **Fovea**: the ``n0 = round(ratio * budget)`` level-0 cells whose centres are nearest
       the fixation (ties: row-major first), a disc of radius ``e_f`` base
       patches (the largest of their eccentricities).
    2. **Periphery**: cells of levels ``1..L`` (``L = min(max_level, levels - 1)``) whose
       centre lies outside the fovea (``e > e_f``) and whose level equals
       ``clamp(1 + floor(log2(1 + (e - e_f) / e1)), 1, L)`` -- token size grows linearly
       with eccentricity beyond the fovea, the cortical-magnification rule
       ``M^-1 ~ (e + e2)`` [Horton & Hoyt 1991] used by
       :func:`~fovea_core.allocators.pyramid.preferred_level`. ``e1`` is found by bisection
       on ``log e1`` (``iters`` steps, vectorised over the batch) as the smallest value
       whose periphery has at least ``budget - n0`` cells; its best cells by max-pooled
       score are kept.
    3. Any shortfall (a periphery too small) is filled by the best remaining cells.

    ``ratio`` in ``[0, 1]``; ``ratio = 1`` is a pure fovea of level-0 cells. Unlike
    ``foveated_pyramid``, whose level-0 share follows from the budget, the share here is
    fixed, which is the ablation the v2.5 chapter needs. Peripheral cells next to the
    fovea may overlap it by part of a footprint (as in ``foveated_pyramid``).

    Shapes: ``scores [B, Gh, Gw]`` -> :class:`TokenSet` with ``budget`` distinct tokens.
    """
    if not (isinstance(ratio, (int, float)) and 0.0 <= float(ratio) <= 1.0):
        raise ValueError(f"foveal_ratio_pyramid: ratio must be in [0, 1], got {ratio!r}")
    if max_level < 1:
        raise ValueError(f"foveal_ratio_pyramid: max_level must be >= 1, got {max_level}")
    s, n = check_inputs(pyramid, scores, budget, patch=patch, name="foveal_ratio_pyramid")
    fix = resolve_fixation(fixation, s)
    levels = list(range(min(max_level, pyramid.num_levels - 1) + 1))
    cand = candidate_grid(pyramid, levels, patch)
    h, w = pyramid.image_size
    centers = torch.cat([cell_centers(cand.shapes[i], lv, (h, w), patch)
                         for i, lv in enumerate(levels)])                    # [M, 2]
    ecc = ((centers[None] - fix[:, None]) * torch.tensor([w, h]) / patch).norm(dim=-1)  # [B, M]
    prio = cand.gather_scores(s, "max")                                      # [B, M]
    lv = cand.levels[None]                                                   # [1, M]
    n0 = min(int(round(float(ratio) * n)), cand.shapes[0][0] * cand.shapes[0][1])
    fovea = (lv == 0) & (group_rank(-ecc, cand.levels, len(levels), tier=None) < n0)
    e_f = torch.where(fovea, ecc, torch.zeros_like(ecc)).amax(1, keepdim=True)  # [B, 1]
    outside = (lv > 0) & (ecc > e_f)
    top = levels[-1]

    def periphery(log_e1: torch.Tensor) -> torch.Tensor:
        pref = 1 + torch.floor(torch.log2(1 + (ecc - e_f).clamp(min=0) / log_e1.exp()))
        return outside & (pref.clamp(1, max(top, 1)).long() == lv)

    lo = torch.full((s.shape[0], 1), math.log(1e-3))
    hi = torch.full((s.shape[0], 1), math.log(4.0 * max(h, w) / patch))
    need = n - n0
    for _ in range(iters):                                                   # bisection steps
        mid = (lo + hi) / 2
        ok = periphery(mid).sum(1, keepdim=True) >= need
        hi, lo = torch.where(ok, mid, hi), torch.where(ok, lo, mid)
    tier = 2 * fovea.long() + periphery(hi).long() * (need > 0)
    idx = select(prio, n, tier, -ecc)
    return cells_to_tokens(cand, idx, prio, (h, w), fix, patch)


def footprint_coverage(tokens: TokenSet, resolution: int = 128) -> torch.Tensor:
    """Fraction ``[B]`` of the image covered by at least one token footprint.

    Evaluated at the centres of a ``resolution x resolution`` grid of sample points
    (``resolution`` >= 1; 128 resolves a 1024 px page to 8 px, finer than any footprint),
    as one broadcast comparison ``[B, N, P]`` of points against :meth:`TokenSet.boxes`.
    """
    if not (isinstance(resolution, int) and resolution >= 1):
        raise ValueError(f"resolution must be an int >= 1, got {resolution!r}")
    h, w = tokens.image_size
    t = (torch.arange(resolution, dtype=torch.float32) + 0.5) / resolution
    ys, xs = torch.meshgrid(t * h, t * w, indexing="ij")
    px, py = xs.reshape(1, 1, -1), ys.reshape(1, 1, -1)                     # [1, 1, P]
    b = tokens.boxes().float()[..., None]                                    # [B, N, 4, 1]
    inside = (b[:, :, 0] <= px) & (px < b[:, :, 2]) & (b[:, :, 1] <= py) & (py < b[:, :, 3])
    return inside.any(1).float().mean(1)


def ci_table(summary, budgets, metric: str = "kept"):
    """Pivot of :func:`~fovea_core.eval.sweep.summarize`'s table: rows ``(dataset,
    allocator)``, columns the budgets (as text) plus ``"all"`` for the full-resolution
    row, cells ``"est [lo, hi]"`` of ``metric`` (two decimals)."""
    cell = summary.apply(lambda r: f"{r[metric]:.2f} [{r[metric + '_lo']:.2f}, "
                                   f"{r[metric + '_hi']:.2f}]", axis=1)
    n = summary.budget.where(summary.allocator != "full", "all").astype(str)
    view = summary.assign(N=n, cell=cell)
    return view.pivot(index=["dataset", "allocator"], columns="N", values="cell").reindex(
        columns=[str(b) for b in budgets] + ["all"]).fillna("")


def paired_vs(table, methods, baseline: str, budget: int, *, metric: str = "anls",
              seed: int = 0, docs=None, correct: bool = True):
    """Paired differences ``method - baseline`` of ``metric`` at ``budget`` for every dataset,
    as one family: :func:`fovea_core.eval.stats.paired_family` (bootstrap CIs over documents,
    Holm-corrected sign-flip p-values, verdicts only from >= ``MIN_DOCS`` documents).
    Columns ``dataset, method, budget, diff, diff_lo, diff_hi, n_docs, p_holm, text,
    verdict``. Methods absent from the table are skipped."""
    out = paired_family(table, methods, baseline, budget, metric=metric, seed=seed, docs=docs,
                        correct=correct)
    return out[["dataset", "method", "budget", "diff", "diff_lo", "diff_hi", "n_docs", "p_holm",
                "text", "verdict"]]


def predicted_vs_measured(summary, predicted: dict, budget: int):
    """Seed predictions beside measurements: one row per method in ``predicted``
    (``{method: number or None}``; ``None`` = the seeds give no number), the prediction
    labelled as such, and per dataset the measured ANLS % ``[95 % CI]`` at ``budget``
    (the ``full`` row at its own budget); ``"n/a"`` where the method was not run."""
    import pandas as pd

    ref = summary[(summary.budget == budget) | (summary.allocator == "full")]
    rows = []
    for name, pred in predicted.items():
        r = {"method": name, "predicted DocVQA acc. % (seed, not measured)":
             "none given" if pred is None else f"{pred:.1f}"}
        for ds in sorted(summary.dataset.unique()):
            m = ref[(ref.dataset == ds) & (ref.allocator == name)]
            r[f"{ds}: measured ANLS % [95% CI]"] = (
                f"{100 * m.anls.iloc[0]:.1f} [{100 * m.anls_lo.iloc[0]:.1f}, "
                f"{100 * m.anls_hi.iloc[0]:.1f}]" if len(m) else "n/a")
        rows.append(r)
    return pd.DataFrame(rows).set_index("method")
