"""Chapter 16's eye-tracking fidelity: score maps on the evaluation grid, the per-model
summary with bootstrap CIs, and the fixation predictor's targets chosen on one half of the
images and reported on the other.

The notebook shows the tables and words; the computations are here (tested in
``tests/test_fidelity.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from fovea_book.eval.density import token_density
from fovea_book.eval.metrics import bootstrap_ci
from fovea_book.eval.stats import target_verdict
from fovea_core.tokens import TokenSet

#: the row of the inter-observer ceiling in the per-image scores
CEILING = "inter-observer"
#: the metrics of the fixation-predictor table
FIXATION_METRICS = ("CC", "sAUC", "NSS", "KL")


def grid_density(scores: torch.Tensor, image_size: tuple[int, int],
                 eval_shape: tuple[int, int]) -> np.ndarray:
    """A ``[1, Gh, Gw]`` score map drawn on the evaluation grid ``eval_shape``: each grid
    cell a level-0 token of the ``image_size`` (H, W) page weighted by its score."""
    if scores.ndim != 3 or scores.shape[0] != 1:
        raise ValueError(f"scores must be a [1, Gh, Gw] map, got shape {tuple(scores.shape)}")
    rows, cols = torch.meshgrid(torch.arange(scores.shape[1]), torch.arange(scores.shape[2]),
                                indexing="ij")
    cells = TokenSet.from_grid(rows.reshape(1, -1), cols.reshape(1, -1), 0,
                               image_size=image_size)
    return token_density(cells, eval_shape, weights=scores.reshape(1, -1))[0].numpy()


def model_kind(model: str) -> str:
    """``"ceiling"`` (the inter-observer row), ``"allocator"`` (a token density, named
    ``"allocator [scorer]"``) or ``"baseline"`` (a map)."""
    return "ceiling" if model == CEILING else "allocator" if "[" in model else "baseline"


def ci_cell(est: float, lo: float, hi: float, digits: int = 3) -> str:
    """``"0.512 [0.430, 0.601]"``."""
    return f"{est:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def summarize_models(per_image: pd.DataFrame, metrics: Iterable[str], *, n_boot: int,
                     seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Mean and 95 % bootstrap CI over images of every metric, per model.

    Args:
        per_image: one row per (``model``, ``image``) (a MultiIndex), one column per metric.
        metrics: the metric columns.

    Returns:
        ``(summary, table)``: ``summary`` indexed by model, sorted by CC (highest first),
        with ``kind`` (:func:`model_kind`) and per metric ``m``, ``m lo``, ``m hi``; ``table``
        the same as text cells (:func:`ci_cell`) with ``kind`` first.
    """
    metrics = list(metrics)
    if "model" not in per_image.index.names:
        raise ValueError(f"per_image must be indexed by 'model' (and 'image'), got "
                         f"{per_image.index.names}")
    missing = [m for m in metrics if m not in per_image.columns]
    if missing:
        raise ValueError(f"metrics {missing} are not columns of per_image")
    summary = []
    for model, df in per_image.groupby(level="model"):           # loop over models
        row = {"model": model, "kind": model_kind(model)}
        for m in metrics:
            est, lo, hi = bootstrap_ci(df[m].to_numpy(), n_boot=n_boot, seed=seed)
            row.update({m: est, f"{m} lo": lo, f"{m} hi": hi})
        summary.append(row)
    summary = pd.DataFrame(summary).sort_values("CC", ascending=False).set_index("model")
    table = pd.DataFrame({m: [ci_cell(e, l, h) for e, l, h in
                              summary[[m, f"{m} lo", f"{m} hi"]].to_numpy()]
                          for m in metrics}, index=summary.index)
    table.insert(0, "kind", summary["kind"])
    return summary, table


def target_measure(values: np.ndarray, target: float, *, n_boot: int,
                   seed: int = 0) -> tuple[str, str]:
    """``(measured, verdict)`` of a mean against a target: ``"0.61 [0.55, 0.66]"`` and
    :func:`fovea_book.eval.stats.target_verdict` (``met`` when the whole CI is at or above
    ``target``; ``too few documents (n = K)`` under 20 images)."""
    values = np.asarray(values, dtype=float)
    est, lo, hi = bootstrap_ci(values, n_boot=n_boot, seed=seed)
    return ci_cell(est, lo, hi, 2), target_verdict(lo, hi, target, len(values))


def paired_gain_measure(diffs: np.ndarray, *, n_boot: int, seed: int = 0) -> tuple[str, str]:
    """``(measured, verdict)`` of a paired difference that should be above 0: ``met`` when
    the CI's lower end is above 0, ``not met`` when its upper end is at or below 0."""
    diffs = np.asarray(diffs, dtype=float)
    est, lo, hi = bootstrap_ci(diffs, n_boot=n_boot, seed=seed)
    word = (f"too few documents (n = {len(diffs)})" if len(diffs) < 20 else
            "met" if lo > 0 else "not met" if hi <= 0 else "undecided")
    return ci_cell(est, lo, hi), word


def fixation_targets(per_image: pd.DataFrame, targets: Mapping[str, tuple[str | None, str,
                                                                           float]],
                     *, centre_row: str, predictor_row: str, n_boot: int,
                     seed: int = 0) -> dict:
    """The fixation predictor's table and targets.

    The token density fed by the fixation scorer (rows ending ``[fixation]``) is chosen by
    mean CC on the even-numbered images (sorted ids) and reported on the odd ones.

    Args:
        per_image: one row per (``model``, ``image``), one column per metric.
        targets: ``name -> (model, metric, bar)``; model ``None`` means the chosen token
            density (on the report half), else the named row on every image.
        centre_row, predictor_row: the centre-bias and predictor-map rows.

    Returns:
        ``{"best", "report", "shown", "targets"}``: the chosen model, the report images, the
        table of the four models (:data:`FIXATION_METRICS` as text) and the targets table
        (``target``, ``measured [95 % CI]``, ``verdict``; the last row the paired sAUC gain
        of the token density over the centre bias).
    """
    fix_rows = [m for m in per_image.index.get_level_values("model").unique()
                if m.endswith("[fixation]")]
    if not fix_rows:
        raise ValueError("per_image has no model fed by the fixation scorer ('... [fixation]')")
    ids = sorted(per_image.index.get_level_values("image").unique())
    select, report = ids[0::2], ids[1::2]
    pm_img = per_image.unstack("model")
    best = pm_img["CC"].loc[select, fix_rows].mean().idxmax()
    shown = {predictor_row: (predictor_row, ids),
             f"{best} (chosen on other images)": (best, report),
             centre_row: (centre_row, ids), CEILING: (CEILING, ids)}
    tab = []
    for label, (model, imgs) in shown.items():                       # four rows
        row = {"model": label, "images": len(imgs)}
        for m in FIXATION_METRICS:
            row[m] = ci_cell(*bootstrap_ci(pm_img[m].loc[imgs, model].to_numpy(),
                                           n_boot=n_boot, seed=seed))
        tab.append(row)
    tgt = []
    for name, (model, m, bar) in targets.items():
        imgs = ids if model else report
        meas, word = target_measure(pm_img[m].loc[imgs, model or best].to_numpy(), bar,
                                    n_boot=n_boot, seed=seed)
        tgt.append({"target": f"{name} >= {bar}", "measured [95 % CI]": meas, "verdict": word})
    d_sauc = (pm_img["sAUC"].loc[report, best] - pm_img["sAUC"].loc[report, centre_row])
    meas, word = paired_gain_measure(d_sauc.to_numpy(), n_boot=n_boot, seed=seed)
    tgt.append({"target": "token map sAUC - centre bias sAUC > 0 (paired)",
                "measured [95 % CI]": meas, "verdict": word})
    return {"best": best, "report": report, "pm_img": pm_img,
            "shown": pd.DataFrame(tab).set_index("model"),
            "targets": pd.DataFrame(tgt).set_index("target")}
