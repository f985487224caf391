"""The fit of read-then-look's glance rule on photograph-like training pages
(:mod:`fovea_book.eval.glance_rule`; the rule itself, ``glance_below`` and
``glance_share``, is tested in ``tests/test_cascade_reading.py``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fovea_book.eval.documents import make_document
from fovea_book.eval.glance_rule import (CONF_LABEL, READ_LABEL, VARIANTS, choose_rule,
                                         glance_curve, glance_fit_table, glance_label,
                                         glance_variants)


def test_the_variants_are_the_photo_variants_and_a_half_at_each_scale():
    doc = make_document(2, layout="receipt")
    vs = glance_variants(doc, scales=(1.0, 0.5))
    names = [v.doc_id.split("-")[-1] for v in vs]
    assert names[:6] == [f"{n}@{s:g}" for n in VARIANTS[:3] for s in (1.0, 0.5)]
    halves = vs[6:]
    if halves:                                        # a half keeps the answers it shows
        assert [h.doc_id.split("-")[-1] for h in halves] == ["half@1", "half@0.5"]
        assert halves[0].size[0] <= doc.size[0] // 2 + 1
        assert 0 < len(halves[0].questions) <= len(doc.questions)
    again = glance_variants(doc, scales=(1.0, 0.5))
    assert all(np.array_equal(a.image, b.image) for a, b in zip(vs, again))   # seeded


def _rows() -> pd.DataFrame:
    """Two variants of one document each, two questions: ``resize`` reads 0.5; fovea-first
    reads 1.0 on the scan (sure map, 0.9) and 0.0 on the photo (unsure, 0.2); a glance of
    0.8 N reads 0.6 everywhere, one of 0.9 N 0.55."""
    rows = []
    for variant, conf, read in (("scan", 0.9, 1.0), ("photo", 0.2, 0.0)):
        for q in ("q1", "q2"):
            base = dict(dataset="x", doc_id=f"d-{variant}@1", qid=q, variant=variant)
            rows += [dict(base, allocator="resize", anls=0.5),
                     dict(base, allocator=CONF_LABEL, anls=read, map_confidence=conf),
                     dict(base, allocator=READ_LABEL, anls=read),
                     dict(base, allocator=glance_label(0.8), anls=0.6),
                     dict(base, allocator=glance_label(0.9), anls=0.55)]
    return pd.DataFrame(rows)


def test_the_curve_glances_where_the_map_is_unsure_and_the_fit_keeps_resize_beaten():
    curve = glance_curve(_rows(), (0.8, 0.9), (0.0, 0.5, 1.0))
    at = curve.set_index(["share", "threshold"])
    assert at.loc[(0.8, 0.0), "anls"] == pytest.approx(0.5)      # never glance: 1.0 and 0.0
    assert at.loc[(0.8, 0.5), "anls"] == pytest.approx(0.8)      # the photo glances
    assert at.loc[(0.8, 1.0), "anls"] == pytest.approx(0.6)      # everything glances
    assert at.loc[(0.8, 0.5), "glanced"] == pytest.approx(0.5)
    assert at.loc[(0.8, 0.0), "margin_photo"] == pytest.approx(-0.5)
    assert at.loc[(0.9, 0.5), "margin_photo"] == pytest.approx(0.05)
    assert not at.loc[(0.8, 0.0), "feasible"] and at.loc[(0.8, 0.5), "feasible"]
    assert curve.attrs["resize"] == {"photo": 0.5, "scan": 0.5}
    chosen = choose_rule(curve)
    assert (chosen["share"], chosen["threshold"], chosen["feasible"]) == (0.8, 0.5, True)
    with pytest.raises(ValueError, match="no rows"):
        glance_curve(_rows(), (0.65,))


def test_with_nothing_feasible_the_fit_loses_least():
    t = _rows()
    t.loc[t.allocator.str.startswith("read | glance"), "anls"] = 0.3    # every glance < resize
    curve = glance_curve(t, (0.8, 0.9), (0.0, 0.5, 1.0))
    assert not curve.feasible.any()
    chosen = choose_rule(curve)
    assert chosen["feasible"] is False and (chosen["share"], chosen["threshold"]) == (0.8, 0.5)
    assert chosen["worst"] == pytest.approx(-0.2)


def test_the_fit_table_marks_the_chosen_rule_and_says_whether_it_holds():
    curve = glance_curve(_rows(), (0.8, 0.9), (0.0, 0.5, 1.0))
    pick = choose_rule(curve)
    row = curve[(curve.share == pick["share"]) & (curve.threshold == pick["threshold"])]
    rec = dict(curve=curve.to_dict("list"), chosen=row.iloc[0].to_dict(),
               variants=["scan", "photo"])
    table, words = glance_fit_table(rec)
    assert table.chosen.tolist().count("<-") == 1
    assert table[table.chosen == "<-"][["share", "threshold"]].values.tolist() == [[0.8, 0.5]]
    assert len(table) == 4                  # 3 thresholds at its share, the other share at its threshold
    assert "glance at 0.8 N when the map's confidence is below 0.5 (50 %" in words
    assert "every variant reads at least as well" in words and "photo, +10.0 points" in words


@pytest.mark.parametrize("weights", [None, "data/models/gist_localiser_photo_noposition.pt"])
def test_the_committed_fit_is_consistent(weights):
    """The committed localiser's fit and the position-free candidate's (chapter 14.5)."""
    from fovea_book.eval.glance_rule import (GLANCE_SHARES, THRESHOLDS, default_record_path,
                                             read_record)
    from fovea_book.eval.fitting import localiser_record
    from fovea_book.eval.unseen import WeightsLocaliser

    rec = read_record(default_record_path(weights))
    assert rec.get("localiser", "learned") == (weights or "learned")
    trained = (localiser_record() if weights is None else WeightsLocaliser(weights).record()
               )["train"]["sources"]
    for name in ("sroie-train", "funsd-train"):                 # pages it never trained on
        pages = {p.split("-")[0] for p in rec["pages"][name]}
        assert pages and not pages & set(trained[name]["page_ids"])
    curve = pd.DataFrame(rec["curve"])
    assert rec["shares"] == list(GLANCE_SHARES) and rec["thresholds"] == list(THRESHOLDS)
    chosen = choose_rule(curve)
    assert (rec["glance_share"], rec["glance_below"]) == (chosen["share"], chosen["threshold"])
    assert rec["chosen"]["feasible"] == chosen["feasible"]
    ids = [p.split("-")[0] for p in rec["pages"]["sroie-train"]]
    assert ids and all(int(i[5:]) % 16 for i in ids)            # never a sroie-dev receipt
    assert {p.split("-")[-1].split("@")[0] for ps in rec["pages"].values() for p in ps} \
        == set(VARIANTS)


def test_the_fit_takes_other_localiser_weights_and_names_its_record_after_them(monkeypatch,
                                                                             tmp_path):
    """``--localiser``: the methods carry the weights, the training pages are those the
    weights never trained on, the record is named after them; unknown weights are refused."""
    from fovea_book.eval import fitting
    from fovea_book.eval.glance_rule import GLANCE_SHARES, default_record_path, glance_methods
    from fovea_book.eval.unseen import FREE_WEIGHTS, WeightsLocaliser

    weights = FREE_WEIGHTS["photo + position-free"]
    seen = []
    monkeypatch.setattr(fitting, "unseen_training_pages",
                        lambda record, **kw: seen.append(record["sha256"]) or {})
    args, record, pages, _ = fitting.start_fit(
        "glance_rule", "doc", default_record_path(), ["--localiser", weights], localiser=True)
    loc = WeightsLocaliser(weights)
    assert args.localiser == weights and record == loc.record() and seen == [record["sha256"]]
    assert args.out == default_record_path(weights)
    assert args.out.name == "glance_rule_photo_noposition.json"
    args, record, _, _ = fitting.start_fit("glance_rule", "doc", default_record_path(), [],
                                           localiser=True)
    assert args.localiser is None and args.out == default_record_path()
    assert record == fitting.localiser_record()
    with pytest.raises(SystemExit):
        fitting.start_fit("glance_rule", "doc", default_record_path(),
                          ["--localiser", str(tmp_path / "none.pt")], localiser=True)
    with pytest.raises(SystemExit):             # a fit that does not take the option refuses it
        fitting.start_fit("tried.resize_rule", "doc", default_record_path(),
                          ["--localiser", weights])
    ms = glance_methods(loc)
    assert len(ms) == 2 + len(GLANCE_SHARES)
    assert ms[0].params["localiser"] == loc and all(m.params["localiser"] == loc for m in ms[1:])
    # the committed localiser's methods are the committed fit's (their rows stay cached)
    assert all("localiser" not in m.params for m in glance_methods()[1:])


def test_the_package_default_is_the_committed_fit():
    """``cascade_glance`` (``foveate``'s default) runs the pair the committed localiser's
    fit chose, on the localiser that fit was run with."""
    from fovea_book.eval.glance_rule import default_record_path, read_record
    from fovea_core.cascade.reading import GLANCE_BELOW, GLANCE_SHARE
    from fovea_core.methods import INFO

    rec = read_record(default_record_path())
    assert (GLANCE_BELOW, GLANCE_SHARE) == (rec["glance_below"], rec["glance_share"])
    assert INFO["cascade_glance"]["params"]["localiser"] == rec.get("localiser", "learned")


def test_the_ungated_rule_is_the_one_whose_worst_variant_loses_least():
    from fovea_book.eval.glance_rule import ungated_table

    means = {"scan": {"resize": 0.5, CONF_LABEL: 0.9, READ_LABEL: 0.95,
                      glance_label(0.8): 0.6, glance_label(0.9): 0.55},
             "photo": {"resize": 0.5, CONF_LABEL: 0.2, READ_LABEL: 0.1,
                       glance_label(0.8): 0.45, glance_label(0.9): 0.48}}
    rec = dict(anls_by_variant=means, variants=["scan", "photo"], shares=[0.8, 0.9])
    t, chosen = ungated_table(rec)
    assert chosen == glance_label(0.9)                        # worst -2 against -5, -30, -40
    assert t.set_index("method").loc[CONF_LABEL, "worst"] == -30.0
    assert list(t.chosen) == ["", "", "", "<-"]
    del means["photo"][READ_LABEL]
    with pytest.raises(ValueError, match="read \\| fovea first on photo"):
        ungated_table(rec)
