"""The real-document sets and tables shared by chapters 14.5 and 17 (fovea_core.eval.realsets)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fovea_core.eval import realsets as R
from fovea_core.paths import dataset_path


def _has_funsd() -> bool:
    try:
        dataset_path("funsd-dev")
        return True
    except Exception:
        return False


@pytest.mark.skipif(not _has_funsd(), reason="funsd-dev not found (FOVEA_DATA / data/external)")
def test_book_forms_keeps_unambiguous_questions_and_rewords_them():
    sets, msg = R.book_forms("smoke", limit=3)
    forms, held = sets["funsd"], sets["funsd (held-out wording)"]
    assert 1 <= len(forms) <= 3 and len(held) == len(forms)
    for f, h in zip(forms, held):
        keys = [q.field for q in f.questions]
        assert f.questions and len(set(keys)) == len(keys)           # each key once
        assert [q.boxes for q in f.questions] == [q.boxes for q in h.questions]
        assert [q.question for q in f.questions] != [q.question for q in h.questions]
    assert "FUNSD dev forms" in msg and "asked once" in msg


def test_book_forms_without_the_folder_says_so(tmp_path):
    sets, msg = R.book_forms("smoke", data_dir=tmp_path)
    assert sets == {} and msg.startswith("FUNSD forms skipped")
    with pytest.raises(ValueError, match="profile"):
        R.book_forms("huge")


def _table() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for d in range(24):
        for q in range(3):
            base = dict(dataset="set", doc_id=f"d{d}", qid=f"q{q}", budget=273)
            rows += [dict(base, allocator="full", anls=1.0),
                     dict(base, allocator="resize", anls=0.2 + 0.05 * rng.random()),
                     dict(base, allocator="good", anls=0.8 + 0.05 * rng.random()),
                     dict(base, allocator="same", anls=0.2 + 0.05 * rng.random())]
    t = pd.DataFrame(rows)
    t["ceiling_anls"] = 1.0
    return t


def test_kept_table_is_the_share_of_the_full_page():
    k = R.kept_table(_table(), ["resize", "good", "absent"]).set_index("method")
    assert list(k.index) == ["resize", "good"] and (k.n_docs == 24).all()
    assert 0.8 < k.loc["good", "kept"] < 0.85 and k.loc["good", "lo"] <= k.loc["good", "kept"]
    assert 0.2 < k.loc["resize", "kept"] < 0.25


def test_real_family_is_holm_corrected():
    fam = R.real_family(_table(), ["good", "same"], 273).set_index("method")
    assert fam.loc["good", "verdict"] == "better"
    assert fam.loc["same", "verdict"] == "no detectable difference"
    assert (fam.p_holm >= fam.p).all()
