"""Chapter 16's fidelity computations (fovea_book.eval.fidelity)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from fovea_book.eval.fidelity import (fixation_targets, grid_density, model_kind,
                                      paired_gain_measure, summarize_models, target_measure)
from fovea_book.eval.metrics import bootstrap_ci


def test_grid_density_puts_each_cell_s_score_on_its_footprint():
    s = torch.zeros(1, 4, 6)
    s[0, 1, 4] = 1.0
    d = grid_density(s, (64, 96), (32, 48))            # 16-px cells -> 8 x 8 on the grid
    assert d.shape == (32, 48)
    r, c = np.unravel_index(d.argmax(), d.shape)
    assert 8 <= r < 16 and 32 <= c < 40               # the density peaks on that cell
    assert d[8:16, 32:40].sum() > d[:, :16].sum()      # and falls off away from it
    assert d.sum() == pytest.approx(1.0, rel=1e-4)    # a density over the grid
    with pytest.raises(ValueError, match="scores must be"):
        grid_density(torch.zeros(4, 6), (64, 96), (32, 48))


def test_model_kind():
    assert model_kind("inter-observer") == "ceiling"
    assert model_kind("topk [saliency]") == "allocator"
    assert model_kind("uniform map") == "baseline"


def _per_image(n_img: int = 24) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    models = {"inter-observer": 0.8, "fixation predictor (map)": 0.65, "centre": 0.4,
              "a [fixation]": 0.6, "b [fixation]": 0.3, "c [saliency]": 0.5}
    rows = [{"model": m, "image": f"im{i:02d}", "CC": mu + 0.01 * rng.standard_normal(),
             "sAUC": mu + 0.2 + 0.01 * rng.standard_normal(), "NSS": 2 * mu, "KL": 1 - mu}
            for m, mu in models.items() for i in range(n_img)]
    return pd.DataFrame(rows).set_index(["model", "image"])


def test_summarize_models_sorted_by_cc_with_bootstrap_cis():
    per = _per_image()
    summary, table = summarize_models(per, ["CC", "KL"], n_boot=200, seed=1)
    assert list(summary.index[:2]) == ["inter-observer", "fixation predictor (map)"]
    assert summary.loc["a [fixation]", "kind"] == "allocator"
    est, lo, hi = bootstrap_ci(per.loc["centre", "CC"].to_numpy(), n_boot=200, seed=1)
    assert summary.loc["centre", ["CC", "CC lo", "CC hi"]].tolist() == [est, lo, hi]
    assert table.loc["centre", "CC"] == f"{est:.3f} [{lo:.3f}, {hi:.3f}]"
    assert list(table.columns) == ["kind", "CC", "KL"]
    with pytest.raises(ValueError, match="not columns"):
        summarize_models(per, ["XX"], n_boot=200)


def test_target_words():
    assert target_measure(np.full(25, 0.7), 0.6, n_boot=200)[1] == "met"
    assert target_measure(np.full(25, 0.5), 0.6, n_boot=200)[1] == "not met"
    assert target_measure(np.full(5, 0.7), 0.6, n_boot=200)[1] == "too few documents (n = 5)"
    assert paired_gain_measure(np.full(25, 0.1), n_boot=200)[1] == "met"
    assert paired_gain_measure(np.zeros(25), n_boot=200)[1] == "not met"


def test_fixation_targets_choose_on_one_half_report_on_the_other():
    per = _per_image(44)
    t = {"predictor map CC": ("fixation predictor (map)", "CC", 0.6),
         "token map CC": (None, "CC", 0.55), "token map sAUC": (None, "sAUC", 0.9)}
    fix = fixation_targets(per, t, centre_row="centre", predictor_row="fixation predictor (map)",
                           n_boot=200, seed=0)
    assert fix["best"] == "a [fixation]"
    # b is best on the report half only: the choice must not see it
    odd = per.index.get_level_values("image").isin(fix["report"])
    swapped = per.copy()
    swapped.loc[("b [fixation]", odd), "CC"] = 0.9
    again = fixation_targets(swapped, t, centre_row="centre",
                             predictor_row="fixation predictor (map)", n_boot=200, seed=0)
    assert again["best"] == "a [fixation]"
    assert fix["report"] == [f"im{i:02d}" for i in range(1, 44, 2)]
    assert list(fix["shown"].images) == [44, 22, 44, 44]
    assert list(fix["targets"].verdict) == ["met", "met", "not met", "met"]
    with pytest.raises(ValueError, match="fixation scorer"):
        fixation_targets(per.drop(["a [fixation]", "b [fixation]"], level="model"), t,
                         centre_row="centre", predictor_row="fixation predictor (map)",
                         n_boot=200)
