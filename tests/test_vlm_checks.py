"""Chapter 15's invariants table (fovea_book.eval.vlm_checks) on a tiny random Qwen2-VL."""

from __future__ import annotations

import pytest
import torch

from fovea_book.eval.vlm_checks import mrope_invariants, random_cells
from fovea_book.qwen_models import has_family


def test_random_cells_are_distinct_per_image():
    c = random_cells(30, 11, torch.Generator().manual_seed(0))
    assert c.shape == (2, 11)
    assert all(len(set(row.tolist())) == 11 for row in c)
    assert int(c.min()) >= 0 and int(c.max()) < 30
    with pytest.raises(ValueError, match="k must be"):
        random_cells(5, 6, torch.Generator())


@pytest.mark.skipif(not has_family("qwen2-vl"), reason="transformers without Qwen2-VL")
def test_invariants_hold_on_a_tiny_qwen2_vl():
    row = mrope_invariants("qwen2-vl", seed=0)
    assert row["family"] == "qwen2-vl"
    assert row["seq len S"] == 3 + 30 + 4
    assert row["ids == get_rope_index"] is True
    assert row["subset ids == full ids at kept"] is True
    assert row["max |logits - reference|"] < 1e-5
    before, after = row["moved: max |dlogits| before / from token"]
    assert before == 0 and after > 0            # causal: only positions from the token on move
    with pytest.raises(ValueError, match="moved_token"):
        mrope_invariants("qwen2-vl", moved_token=0)
