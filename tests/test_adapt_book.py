"""Chapter 14.9's helpers around the adaptation (fovea_book.eval.adapting): the share of a
supervised gain recovered, the learning curve's page subsets, the pseudo-labels' quality
table and the question whose fovea moved most."""

from __future__ import annotations

import pandas as pd
import pytest

from fovea_book.eval.adapting import (curve_pages, label_quality, labels_figure,
                                      moved_question, recovery_share)


def _rows(anls: dict[str, list[float]], ceiling: float = 1.0) -> pd.DataFrame:
    """Evaluator rows of one dataset: ``{method: [anls of document i]}``, one question each,
    plus a ``full`` ceiling."""
    out = []
    n = len(next(iter(anls.values())))
    for m, vals in {**anls, "full": [ceiling] * n}.items():
        for i, a in enumerate(vals):
            out.append(dict(dataset="d", doc_id=f"doc{i}", qid="q", allocator=m, anls=a,
                            ceiling_anls=ceiling, fovea_share=a))
    return pd.DataFrame(out)


def test_recovery_share_is_the_ratio_of_the_gains_over_the_baseline():
    n = 30
    t = _rows({"resize": [0.2] * n, "supervised": [0.6] * n,
               "adapted": [0.5 if i % 2 else 0.3 for i in range(n)]})
    s = recovery_share(t, "adapted", "supervised", seed=0)
    # gains summed over documents: adapted (0.4 * 15 + 0.1 * 15) / supervised 0.4 * 30
    assert s["share"] == pytest.approx((0.3 * 15 + 0.1 * 15) / (0.4 * 30))
    assert s["gain_supervised"] == pytest.approx(0.4)
    assert s["gain_adapted"] == pytest.approx(0.2)
    assert s["lo"] < s["share"] < s["hi"] and s["n_docs"] == n


def test_recovery_share_pairs_documents_and_names_a_missing_method():
    t = _rows({"resize": [0.0, 0.0], "supervised": [1.0, 1.0], "adapted": [1.0, 1.0]})
    t = t[~((t.allocator == "adapted") & (t.doc_id == "doc1"))]     # adapted read doc0 only
    assert recovery_share(t, "adapted", "supervised")["n_docs"] == 1
    with pytest.raises(ValueError, match="no rows of \\['other'\\]"):
        recovery_share(t, "other", "supervised")


def test_curve_pages_are_nested_and_fixed_by_the_seed(tmp_path):
    for i in range(12):
        (tmp_path / f"p{i:02d}.png").write_bytes(b"")
    five, ten = curve_pages(tmp_path, 5), curve_pages(tmp_path, 10)
    assert ten[:5] == five and len(set(ten)) == 10
    assert curve_pages(tmp_path, 5) == five
    assert curve_pages(tmp_path, 5, seed=1) != five
    with pytest.raises(ValueError, match=r"n must be in \[1, 12\]"):
        curve_pages(tmp_path, 13)


def test_label_quality_reads_each_family_at_its_threshold():
    rec = dict(target=0.9, thresholds={"date": 0.5, "form": None}, table=dict(
        family=["date", "date", "form"], threshold=[0.0, 0.5, 0.0], kept=[10, 6, 4],
        precision=[0.7, 0.95, 0.5], recall=[0.8, 0.6, 0.1], answers=[10, 10, 8]))
    q = label_quality(rec).set_index("family")
    assert q.precision["date"] == pytest.approx(0.95) and q.kept["date"] == 6
    assert q.verdict["date"] == "met" and q.verdict["form"] == "not met"
    rec["target"] = 0.96
    assert label_quality(rec).set_index("family").verdict["date"] == "not met"


def test_moved_question_finds_the_largest_gain_in_the_fovea():
    t = _rows({"before": [0.1, 0.5, 0.2], "after": [0.2, 0.4, 0.9]})
    mv = moved_question(t, "before", "after")
    assert (mv["doc_id"], mv["before"], mv["after"]) == ("doc2", 0.2, 0.9)
    with pytest.raises(ValueError, match="share no question"):
        moved_question(t, "before", "nothing")


def test_labels_figure_draws_one_box_per_label():
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    labels = [dict(family="date", box=[1, 2, 5, 6], confidence=0.9),
              dict(family="total", box=[3, 3, 8, 9], confidence=1.0)]
    fig = labels_figure(np.zeros((20, 10, 3), dtype=np.uint8), labels)
    assert len(fig.axes[0].patches) == 2 and len(fig.axes[0].texts) == 2


def test_pseudo_documents_ask_the_kept_labels_answered_by_their_reading(tmp_path, monkeypatch):
    import cv2
    import numpy as np

    from fovea_core.cascade import pseudo_labels as P
    from fovea_book.eval.adapting import pseudo_documents

    for name in ("a.png", "b.png"):
        cv2.imwrite(str(tmp_path / name), np.full((40, 30, 3), 255, np.uint8))
    labels = {40 * 30: [P.PseudoLabel("total", "What is the total?", (1.4, 2.0, 9.6, 8.0), 0.9,
                                      "x", "12.50"),
                        P.PseudoLabel("form", "What is the NAME?", (0, 0, 5, 5), 0.9, "y", "Ann"),
                        P.PseudoLabel("date", "What is the date?", (0, 0, 5, 5), 0.9, "z", "")]}
    monkeypatch.setattr(P, "page_labels",
                        lambda image: labels[image.shape[-1] * image.shape[-2]])
    docs = pseudo_documents([tmp_path / "a.png", tmp_path / "b.png"], source="wr")
    assert [d.doc_id for d in docs] == ["wra-real@1", "wrb-real@1"]
    (q,) = docs[0].questions                  # the form family is not asked; no text, no question
    assert (q.qid, q.answers, q.boxes, q.field) == ("total", ("12.50",), ((1, 2, 10, 8),), "total")
    assert docs[0].image.shape == (40, 30, 3)


def test_fit_pages_are_the_adaptations_validation_pages(tmp_path):
    from fovea_core.adaptation import page_split
    from fovea_book.eval.adapting import fit_pages

    for i in range(30):
        (tmp_path / f"p{i:02d}.png").write_bytes(b"")
    held = [p.name for p in fit_pages(tmp_path, 100)]
    assert held and all(page_split(n) == "validation" for n in held)
    assert held == sorted(held) and [p.name for p in fit_pages(tmp_path, 2)] == held[:2]
