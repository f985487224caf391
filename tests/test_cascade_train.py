"""The learned localiser: committed weights match their record, and the training script
reproduces the committed run (its first steps) and is deterministic."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict

import numpy as np
import pytest
import torch

from fovea_core.cascade.learned import (GistLocaliserNet, LearnedLocaliser, file_sha256,
                                        load_model, weights_path)
from fovea_book import train as train_module
from fovea_book.train import (REAL_SOURCES, TrainConfig, TrainingSet, answer_text_px,
                                      build_parser, default_output, embed_vocabulary,
                                      merge_repeated, output_path, phrase_embedding,
                                      real_pages, record_ids, train, vocabulary)
from fovea_book.eval.documents import FORM_FIELD, FORM_WORDINGS, Question
from fovea_book.paths import DatasetNotFound, dataset_path

WEIGHTS = weights_path()
RECORD = WEIGHTS.with_suffix(".json")
needs_weights = pytest.mark.skipif(not WEIGHTS.exists(), reason="no committed weights")


def _have_real() -> bool:
    try:
        return all(dataset_path(name).is_dir() for name in REAL_SOURCES)
    except DatasetNotFound:
        return False


needs_real = pytest.mark.skipif(not _have_real(), reason="the real training folders "
                                f"{sorted(REAL_SOURCES)} are not under FOVEA_DATA / data/external")
#: a synthetic-only configuration for quick tests of the training loop
SMALL = dict(gists_per_page=1, epochs=1, batch=2, valid_pages=1, real=())

#: SHA-256 of the committed fovea_core/weights/gist_localiser.pt. Pinned here, not only in the JSON
#: beside the weights, which a retraining rewrites together with them: a run that replaced
#: the weights (``--replace-committed``) fails this test until the new hash is copied here.
COMMITTED_SHA256 = "07d0a18b0b3a78782c5666c26f4dafc2f7b87809f7bd07fb5686525b0b8ceaf1"


def _record() -> dict:
    return json.loads(RECORD.read_text())


@needs_weights
def test_committed_weights_match_their_record_and_are_small():
    rec = _record()
    assert file_sha256(WEIGHTS) == rec["sha256"]
    assert WEIGHTS.stat().st_size < 1_000_000
    net = load_model(str(WEIGHTS))
    assert sum(p.numel() for p in net.parameters()) == rec["parameters"]
    assert set(rec["validation"]) >= {"paper/heldout", "receipt/heldout", "invoice/heldout"}


@needs_weights
def test_committed_weights_have_the_pinned_hash():
    """A silent retraining rewrites the weights *and* the JSON beside them, so the loader's
    check (weights vs JSON) accepts it; the hash pinned in this file does not."""
    assert file_sha256(WEIGHTS) == COMMITTED_SHA256
    assert _record()["sha256"] == COMMITTED_SHA256


def _committed_config() -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in _record()["config"].items()}


@needs_weights
def test_the_defaults_are_the_committed_configuration():
    """``TrainConfig()`` and every option of the command line default to what the committed
    record says was used (the record once said 5 epochs while the default trained 8)."""
    assert asdict(TrainConfig()) == _committed_config()
    defaults = vars(build_parser().parse_args([]))
    fields = {k: v for k, v in defaults.items() if k in _committed_config()}
    assert fields and fields == {k: _committed_config()[k] for k in fields}
    assert set(defaults) - set(fields) == {"out", "replace_committed", "threads", "data_dir",
                                           "allow_missing_real"}
    assert defaults["threads"] == _record()["environment"]["threads"]
    assert defaults["out"] is None and defaults["replace_committed"] is False
    assert defaults["allow_missing_real"] is False
    assert _record()["data"]["allow_missing_real"] is False and not _record()["data"]["missing"]


@needs_weights
def test_the_record_says_what_each_source_gave():
    """The committed run trained on synthetic pages and on both real training folders; the
    record names every real page, none of them a validation page or a dev page."""
    rec = _record()
    src = rec["train"]["sources"]
    assert set(src) == {"synthetic", *REAL_SOURCES}
    assert src["synthetic"]["pages"] == rec["config"]["pages"]
    for name, layout in REAL_SOURCES.items():
        s = src[name]
        assert s["pages"] == len(s["page_ids"]) > 0 and s["layouts"] == {layout: s["pages"]}
        assert s["questions"] > s["pages"] and not set(s["page_ids"]) & set(s["validation_ids"])
        assert all(i.startswith(layout) for i in s["page_ids"]) and "dev" not in s["path"]
    assert src["funsd-train"]["repeated_questions"]["merged"] > 0
    assert rec["train"]["pages_generated"] == sum(s["pages"] for s in src.values())
    assert {"sroie/heldout", "funsd/heldout"} <= set(rec["validation"])


def test_by_default_the_committed_weights_are_not_the_output():
    parser = build_parser()
    out = output_path(parser.parse_args([]))
    assert out == default_output() and out.parent.name == "models"
    assert out.parent.parent.name == "_build" and out != WEIGHTS
    assert output_path(parser.parse_args(["--replace-committed"])) == WEIGHTS
    assert output_path(parser.parse_args(["--replace-committed", "--out", str(WEIGHTS)])) == WEIGHTS
    with pytest.raises(ValueError, match="--replace-committed"):
        output_path(parser.parse_args(["--out", str(WEIGHTS)]))
    rel = os.path.relpath(WEIGHTS.with_suffix(".json"))          # its record, relatively
    with pytest.raises(ValueError, match="--replace-committed"):
        output_path(parser.parse_args(["--out", rel[:-len(".json")] + ".pt"]))
    with pytest.raises(ValueError, match="drop --out"):
        output_path(parser.parse_args(["--replace-committed", "--out", "x.pt"]))
    with pytest.raises(ValueError, match="--epochs must be at least 1"):
        output_path(parser.parse_args(["--epochs", "0"]))


def test_main_refuses_the_committed_path_before_training(monkeypatch, capsys):
    def no_training(*args, **kwargs):
        raise AssertionError("trained before checking where the weights go")

    monkeypatch.setattr(train_module, "train", no_training)
    with pytest.raises(SystemExit) as exc:
        train_module.main(["--out", str(WEIGHTS)])
    assert exc.value.code == 2 and "--replace-committed" in capsys.readouterr().err


def test_main_writes_weights_and_record_where_told(tmp_path, monkeypatch):
    """The full command with a tiny run (training and validation replaced by small stand-ins):
    the weights and their record go to ``--out``, and the loader's hash check accepts them."""
    small = TrainConfig(pages=2, **SMALL)
    seen = {}

    def tiny_train(cfg, **kwargs):
        seen["cfg"] = cfg
        return train(TrainConfig(**{**asdict(small), "seed": cfg.seed}), progress=False)

    monkeypatch.setattr(train_module, "train", tiny_train)
    monkeypatch.setattr(train_module, "validation_samples", lambda cfg, layout, **kw: [])
    monkeypatch.setattr(train_module, "evaluate", lambda net, samples, wording: {})
    before = file_sha256(WEIGHTS) if WEIGHTS.exists() else None
    out = tmp_path / "run" / "loc.pt"
    assert train_module.main(["--out", str(out), "--seed", "3"]) == 0
    assert seen["cfg"] == TrainConfig(seed=3)                        # the committed config, seed 3
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["sha256"] == file_sha256(out) and meta["config"]["seed"] == 3
    load_model(str(out))                                              # the check passes
    assert (file_sha256(WEIGHTS) if WEIGHTS.exists() else None) == before


@needs_weights
def test_tampered_weights_are_refused(tmp_path):
    bad = tmp_path / "gist_localiser.pt"
    shutil.copy(WEIGHTS, bad)
    shutil.copy(RECORD, tmp_path / "gist_localiser.json")
    state = torch.load(bad, weights_only=True)
    k = next(iter(state))
    state[k] = state[k] + 1e-3
    torch.save(state, bad)
    with pytest.raises(ValueError, match="SHA-256"):
        load_model(str(bad))
    load_model(str(bad), verify=False)                      # explicit opt-out still loads


@needs_weights
@needs_real
def test_training_script_reproduces_the_committed_run():
    """Re-run the first steps of the committed configuration: the same pages (the record's
    real page ids: the training folders have grown since), gists, initial weights, batches
    and augmentation give the same losses as the record (to float tolerance across
    machines)."""
    rec = _record()
    cfg = TrainConfig(**{k: tuple(v) if isinstance(v, list) else v
                         for k, v in rec["config"].items()})
    k = 4
    _, run = train(cfg, max_steps=k, progress=False, only_ids=record_ids(rec))
    for name, src in run["sources"].items():                 # the record's pages, no other
        if name != "synthetic":
            assert src["page_ids"] == rec["train"]["sources"][name]["page_ids"], name
    want = np.asarray(rec["train"]["loss"][:k])
    assert np.allclose(run["loss"], want, rtol=2e-3, atol=2e-3), (run["loss"], want)


def test_training_is_deterministic_and_learns():
    cfg = TrainConfig(pages=6, gists_per_page=1, epochs=3, batch=3, valid_pages=2, real=())
    a, ra = train(cfg, progress=False)
    b, rb = train(cfg, progress=False)
    assert ra["loss"] == rb["loss"]
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
    assert np.mean(ra["loss"][-2:]) < np.mean(ra["loss"][:2])            # it learns
    c, rc = train(TrainConfig(**{**cfg.__dict__, "seed": 1}), progress=False)
    assert rc["loss"] != ra["loss"]                                       # the seed matters


def test_repeated_form_questions_train_on_the_union_of_their_boxes():
    def q(qid, key, box):
        return Question(qid, f"What is the {key}?", (qid,), (box,), key)

    qs = [q("q1-a2", "DATE", (0, 0, 5, 5)), q("q3-a4", "SCORE", (0, 10, 5, 15)),
          q("q3-a5", "SCORE", (0, 20, 5, 25)), q("q6-a7", "NAME", (9, 9, 20, 20))]
    out, merged = merge_repeated(qs)
    assert merged == 2 and [x.field for x in out] == ["DATE", "SCORE", "NAME"]
    assert out[1].boxes == ((0, 10, 5, 15), (0, 20, 5, 25)) and out[1].qid == "q3-a4+q3-a5"
    assert out[0] == qs[0] and out[2] == qs[3]
    assert merge_repeated(qs[:1]) == ((qs[0],), 0)


def test_real_answers_take_their_line_height_as_text_size():
    three = Question("a", "?", ("x",), ((0, 0, 9, 10), (0, 20, 9, 34), (0, 40, 9, 70)),
                     "address")
    assert answer_text_px(three) == 14.0                              # median of 10, 14, 30
    assert answer_text_px(Question("b", "?", ("x",), ((0, 0, 9, 10),), "title", 31)) == 31.0


def test_form_questions_are_phrased_from_the_train_form_wordings():
    vocab = vocabulary("train", ["DATE", "TO"])
    for t in FORM_WORDINGS["train"]:
        assert t.format(key="DATE") in vocab and t.format(key="TO") in vocab
    assert not any(t.format(key="DATE") in vocab for t in FORM_WORDINGS["heldout"])
    emb = embed_vocabulary(vocab)
    first = phrase_embedding((FORM_FIELD, "DATE"), emb, "train", None)
    assert torch.equal(first, emb[FORM_WORDINGS["train"][0].format(key="DATE")])
    mixed = phrase_embedding((FORM_FIELD, "DATE"), emb, "train", torch.Generator().manual_seed(0))
    assert float(mixed.norm()) == pytest.approx(1.0, abs=1e-5)
    span = torch.stack([emb[t.format(key="DATE")] for t in FORM_WORDINGS["train"]])   # [8, 384]
    proj = span.T @ torch.linalg.lstsq(span.T, mixed[:, None]).solution[:, 0]
    assert float(proj.norm()) > 0.9                  # a mix of DATE's templates, plus noise
    other = torch.stack([emb[t.format(key="TO")] for t in FORM_WORDINGS["train"]])
    assert not torch.allclose(other.T @ torch.linalg.lstsq(other.T, mixed[:, None]).solution[:, 0],
                              proj, atol=0.1)


def test_a_missing_training_folder_stops_the_run_unless_allowed(tmp_path, capsys):
    with pytest.raises(DatasetNotFound, match="--allow-missing-real") as exc:
        real_pages(("sroie-train",), None, 5, str(tmp_path))
    assert "sroie-train" in str(exc.value) and str(tmp_path) in str(exc.value)
    with pytest.raises(ValueError, match="never a \\*-dev"):
        real_pages(("sroie-dev",), None, 5, str(tmp_path))
    assert train_module.main(["--out", str(tmp_path / "x.pt"), "--data-dir",
                              str(tmp_path)]) == 2
    assert "--allow-missing-real" in capsys.readouterr().err
    assert not (tmp_path / "x.pt").exists()
    _, rec = train(TrainConfig(pages=2, **{**SMALL, "real": ("funsd-train",)}),
                   progress=False, data_dir=tmp_path, allow_missing=True)
    assert "funsd-train" in rec["sources"]["funsd-train"]["missing"]
    assert rec["sources"]["funsd-train"]["pages"] == 0 and rec["pages_generated"] == 2


@needs_real
def test_real_pages_split_by_a_fixed_rule_and_feed_training():
    import zlib

    tr, va, rep = real_pages(tuple(REAL_SOURCES), None, 5)
    ids_t, ids_v = {p.doc_id for p in tr}, {p.doc_id for p in va}
    assert tr and va and not ids_t & ids_v
    assert all(zlib.crc32(i.encode()) % 5 == 0 for i in ids_v)
    assert all(zlib.crc32(i.encode()) % 5 != 0 for i in ids_t)
    for name, layout in REAL_SOURCES.items():
        assert rep[name]["page_ids"] == sorted(p.doc_id for p in tr if p.source == name)
        assert all(len({q.field for q in p.questions}) == len(p.questions)
                   for p in tr if p.layout == "funsd")             # no repeated text is left
    cfg = TrainConfig(pages=1, gists_per_page=1, epochs=1, batch=3, real_pages=1)
    data = TrainingSet(cfg)
    assert len(data) == 1 + len(REAL_SOURCES)
    assert [data.spec(i)[0] for i in range(1, 3)] == list(REAL_SOURCES.values())
    _, rec = train(cfg, progress=False)
    assert rec["steps"] == 1 and np.isfinite(rec["loss"]).all()
    for name in REAL_SOURCES:
        s = rec["sources"][name]
        assert s["pages"] == 1 and s["page_ids"] == rep[name]["page_ids"][:1]
        assert s["unused_ids"] == rep[name]["page_ids"][1:]


class _ZeroEmbeddings(dict):
    """Every phrase embeds to zeros: :func:`collate` then needs no sentence model."""

    def __missing__(self, key):
        return torch.zeros(384)


def _training_docs(data: TrainingSet, index: int):
    """The document behind page ``index`` of ``data`` (synthetic or real)."""
    from fovea_book.eval.documents import make_document

    if index < data.cfg.pages:
        layout, seed, _ = train_module.page_spec(data.cfg, index)
        return make_document(seed, layout=layout)
    return data.real[index - data.cfg.pages].document()


def test_answer_targets_are_box_areas_on_the_gist_pixels():
    """Known areas: 1-px gist pixels centred at 0.5, 1.5, 2.5 (x) and 0.5, 1.5 (y)."""
    from fovea_core.cascade.learned import answer_targets

    ys = torch.tensor([0.5, 1.5], dtype=torch.float64)
    xs = torch.tensor([0.5, 1.5, 2.5], dtype=torch.float64)
    inside = torch.ones(2, 3, dtype=torch.bool)
    t = answer_targets(ys, xs, 0.5, inside, [
        [(0, 0, 2, 1)],                      # two whole pixels
        [(0.5, 0, 1.5, 1), (2, 1, 3, 2)],    # two half pixels + one whole pixel, area 2
        [(10, 10, 20, 20)],                  # off the gist: all zeros
        [(2.25, 1.5, 2.75, 2)],              # a quarter of a pixel's area: still sums to 1
    ])
    assert t.shape == (4, 2, 3) and t.dtype == torch.float32
    assert torch.equal(t[0], torch.tensor([[0.5, 0.5, 0], [0, 0, 0]]))
    assert torch.equal(t[1], torch.tensor([[0.25, 0.25, 0], [0, 0, 0.5]]))
    assert torch.equal(t[2], torch.zeros(2, 3))
    assert torch.equal(t[3], torch.tensor([[0.0, 0, 0], [0, 0, 1]]))
    off = inside.clone()
    off[0, 1] = False                        # a pixel off the page takes no mass
    assert torch.equal(answer_targets(ys, xs, 0.5, off, [[(0, 0, 2, 1)]])[0],
                       torch.tensor([[1.0, 0, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match="half must be > 0"):
        answer_targets(ys, xs, 0.0, inside, [[(0, 0, 1, 1)]])
    with pytest.raises(ValueError, match="inside has shape"):
        answer_targets(ys, xs, 0.5, inside.T, [[(0, 0, 1, 1)]])
    with pytest.raises(ValueError, match="boxes is empty"):
        answer_targets(ys, xs, 0.5, inside, [])


@needs_real
def test_training_targets_are_target_map_on_real_gists():
    """The targets the training batches carry (:func:`collate`) are, bit for bit,
    :func:`~fovea_core.cascade.learned.target_map` of each question's boxes on the page's
    gist (the question-agnostic target: all answers' boxes), on synthetic receipts and
    papers and on real SROIE and FUNSD training pages, at every gist budget: the one
    target rule, so the committed weights (pinned hash) stay what this code trains."""
    from fovea_core.cascade.learned import target_map
    from fovea_book.train import collate, gist_of

    cfg = TrainConfig(pages=4, gists_per_page=3, real_pages=3, null_share=0.5)
    data = TrainingSet(cfg)
    n_checked, n_null = 0, 0
    for i in range(len(data)):
        doc = _training_docs(data, i)
        for s in data.samples(i):
            target = collate([s], _ZeroEmbeddings())[4]                  # [Q, h, w]
            g = gist_of(doc, s.gist_budget)
            want = [q.boxes for q in doc.questions]
            if len(s.queries) > len(doc.questions):                       # + the null target
                want.append(np.concatenate([np.asarray(b, np.float64).reshape(-1, 4)
                                            for b in want]))
                n_null += 1
            assert target.shape[0] == len(want) and target.dtype == torch.float32
            for t, b in zip(target, want, strict=True):
                ref = target_map(g, b)
                assert ref.shape == t.shape and torch.equal(t, ref), (s.meta, s.gist_budget)
                assert float(t.sum()) == pytest.approx(1.0, abs=1e-5)
            n_checked += len(want)
    assert n_checked > 30 and n_null > 0
    assert {data.source(i) for i in range(len(data))} == {"synthetic", *REAL_SOURCES}


@pytest.mark.skipif(not os.environ.get("FOVEA_RETRAIN"), reason="set FOVEA_RETRAIN=1 to retrain "
                    "the localiser in full (several minutes) and compare with the committed one")
@needs_weights
def test_full_retraining_reproduces_the_weights():
    rec = _record()
    cfg = TrainConfig(**{k: tuple(v) if isinstance(v, list) else v
                         for k, v in rec["config"].items()})
    net, run = train(cfg, progress=False)
    ref = load_model(str(WEIGHTS))
    for (k, v), (_, w) in zip(net.state_dict().items(), ref.state_dict().items()):
        assert torch.allclose(v, w, rtol=1e-2, atol=1e-3), k
    assert np.allclose(run["loss"], rec["train"]["loss"], rtol=1e-2, atol=1e-2)


@needs_weights
def test_learned_localiser_gives_a_probability_map():
    from fovea_core import build_pyramid
    from fovea_core.cascade import gist
    from fovea_book.eval.documents import make_document

    doc = make_document(1234)
    g = gist(build_pyramid(doc.image), 64)
    loc = LearnedLocaliser()
    for q in doc.questions[:2]:
        m = loc(g, q.question)
        assert m.shape == (1, 64, 64) and (m >= 0).all()
        assert float(m.sum()) == pytest.approx(1.0, abs=1e-4)
    assert not torch.allclose(loc(g, doc.questions[0].question), loc(g, doc.questions[6].question))
    px = loc.text_px(g, doc.questions[1].question)
    assert 4 < float(px) < 60                                              # a plausible height
