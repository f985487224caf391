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


#: configuration fields added after the committed run, at the values that train as it did
#: (``photo``: no photo-like augmentation; ``steps``: epochs x an epoch's batches)
ADDED_FIELDS = {"photo": False, "steps": None, "part": 0.0, "position": True}


@needs_weights
def test_the_defaults_are_the_committed_configuration():
    """``TrainConfig()`` and every option of the command line default to what the committed
    record says was used (the record once said 5 epochs while the default trained 8); the
    fields added since default to the values that reproduce it."""
    assert not set(ADDED_FIELDS) & set(_committed_config())
    assert asdict(TrainConfig()) == {**_committed_config(), **ADDED_FIELDS}
    defaults = vars(build_parser().parse_args([]))
    fields = {k: v for k, v in defaults.items() if k in asdict(TrainConfig())}
    assert fields and fields == {k: {**_committed_config(), **ADDED_FIELDS}[k] for k in fields}
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
    from fovea_book.train import answer_targets

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
    :func:`~fovea_book.train.target_map` of each question's boxes on the page's
    gist (the question-agnostic target: all answers' boxes), on synthetic receipts and
    papers and on real SROIE and FUNSD training pages, at every gist budget: the one
    target rule, so the committed weights (pinned hash) stay what this code trains."""
    from fovea_book.train import target_map
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


# ----------------------------------------------------------------------------- photo pages
def _ink_page() -> tuple[np.ndarray, list]:
    """A white 800 x 1000 page with three short dark strings far apart and far from the
    edges (more than 1.6 string widths: a box shifted by its width stays on the page after
    the crop); each string's box is the tight bounding box of its drawn pixels."""
    import cv2

    from fovea_book.eval.documents import Document

    img = np.full((800, 1000), 255, np.uint8)
    qs = []
    for k, (text, x, y, scale) in enumerate((("TOTAL 12.50", 400, 200, 0.9),
                                             ("25/12/2018", 380, 420, 0.7),
                                             ("ACME SDN BHD", 420, 640, 0.6))):
        layer = np.zeros_like(img)
        cv2.putText(layer, text, (x, y), cv2.FONT_HERSHEY_SIMPLEX, scale, 255, 2)
        ys, xs = np.nonzero(layer)
        img[layer > 0] = 0
        box = (int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1)
        qs.append(Question(f"q{k}", "?", (text,), (box,), f"f{k}"))
    return Document("ink", np.repeat(img[..., None], 3, 2), tuple(qs)), qs


def test_photo_page_keeps_each_answer_box_on_its_ink():
    """Drawn strings on a white page, augmented with 12 seeds: inside each moved box the page
    is much darker than in the same box shifted by its own width or height to any side
    (plain paper), and a band just outside the box is nearly as light as paper (the box
    still encloses its ink)."""
    from fovea_book.train import photo_page

    doc, _ = _ink_page()
    for seed in range(12):
        out = photo_page(doc, np.random.default_rng(seed), min_cells=192)
        g = 255.0 - out.image[..., 0].astype(np.float64)                  # darkness
        for q in out.questions:
            (x0, y0, x1, y1), = q.boxes
            w, h = x1 - x0, y1 - y0
            inside = g[y0:y1, x0:x1].mean()
            shifts = ((w + 4, 0), (-w - 4, 0), (0, h + 4), (0, -h - 4))
            assert all(0 <= x0 + dx and x1 + dx <= g.shape[1] and 0 <= y0 + dy
                       and y1 + dy <= g.shape[0] for dx, dy in shifts)
            shifted = [g[y0 + dy:y1 + dy, x0 + dx:x1 + dx].mean() for dx, dy in shifts]
            assert inside > max(shifted) + 25, (seed, q.qid, inside, shifted)
            m = max(2, h // 3)                                              # a ring of h/3 px
            ring = np.concatenate([g[y0 - m:y0 - 1, x0:x1].ravel(),
                                   g[y1 + 1:y1 + m, x0:x1].ravel(),
                                   g[y0:y1, x0 - m:x0 - 1].ravel(),
                                   g[y0:y1, x1 + 1:x1 + m].ravel()])
            assert ring.mean() < 0.5 * inside, (seed, q.qid, ring.mean(), inside)


def test_photo_page_is_deterministic_uint8_and_of_the_advertised_size():
    from fovea_book.train import PHOTO, photo_page

    doc, qs = _ink_page()
    h, w = doc.size
    a = photo_page(doc, np.random.default_rng(7), min_cells=192)
    b = photo_page(doc, np.random.default_rng(7), min_cells=192)
    c = photo_page(doc, np.random.default_rng(8), min_cells=192)
    assert np.array_equal(a.image, b.image) and a.questions == b.questions
    assert a.image.shape != c.image.shape or not np.array_equal(a.image, c.image)
    assert doc.image.shape == (800, 1000, 3) and doc.questions == tuple(qs)  # input untouched
    longs = []
    for seed in range(30):
        out = photo_page(doc, np.random.default_rng(seed), min_cells=192)
        img = out.image
        assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3
        assert img.flags["C_CONTIGUOUS"] and (img[..., :1] == img).all()    # grey stays grey
        hh, ww = img.shape[:2]
        assert -(-hh // 16) * -(-ww // 16) >= 192                           # what the gist needs
        assert max(hh, ww) <= 1.35 * max(h, w)                              # never scaled up
        assert len(out.questions) == 3 and out.elements == ()
        for q, q0 in zip(out.questions, qs):
            (x0, y0, x1, y1), = q.boxes
            assert 0 <= x0 < x1 <= ww and 0 <= y0 < y1 <= hh and q.answers == q0.answers
            # the text height scales as the string's width does (within the tilt's and
            # the keystone's distortion and the outward rounding)
            width_scale = (x1 - x0) / (q0.boxes[0][2] - q0.boxes[0][0])
            assert 0.8 < q.size_px / answer_text_px(q0) / width_scale < 1.15, (seed, q)
        longs.append(max(hh, ww) / max(h, w))
    assert min(longs) < 0.45 and max(longs) > 0.8                           # low and high res
    for seed in range(10):                                                  # the floor holds
        hh, ww = photo_page(doc, np.random.default_rng(seed), min_cells=1000).size
        assert -(-hh // 16) * -(-ww // 16) >= 1000
    assert PHOTO.scale == (0.25, 1.0)
    from dataclasses import replace                                          # a floor above
    big = photo_page(doc, np.random.default_rng(0), min_cells=5000)        # the page: 1x
    same = photo_page(doc, np.random.default_rng(0), min_cells=5000,
                      ranges=replace(PHOTO, scale=(1.0, 1.0)))
    assert np.array_equal(big.image, same.image)


def test_photo_training_is_a_pure_function_of_seed_and_page_and_off_by_default():
    from fovea_book.train import photo_training_page, training_samples

    cfg = TrainConfig(pages=3, gists_per_page=1, real=())
    photo = TrainConfig(**{**asdict(cfg), "photo": True})
    doc, _ = _ink_page()
    assert photo_training_page(cfg, 0, doc) is doc                          # photo=False: as is
    clean, a, b = (training_samples(c, 1)[0] for c in (cfg, photo, photo))
    assert torch.equal(a.x, b.x) and a.sizes == b.sizes and a.meta == b.meta
    assert a.meta["size"] != clean.meta["size"] and a.meta["doc_id"] == clean.meta["doc_id"]
    other = training_samples(TrainConfig(**{**asdict(photo), "seed": 1}), 1)[0]
    assert other.meta["size"] != a.meta["size"]                             # the seed matters


def test_a_fixed_step_count_spans_the_schedule_and_equals_the_epoch_run():
    """``steps`` = epochs x an epoch's batches is the epoch run, step for step; any other
    count trains exactly that many steps whatever the number of pages."""
    cfg = TrainConfig(pages=4, gists_per_page=1, epochs=2, batch=2, valid_pages=1, real=())
    _, epochs = train(cfg, progress=False)
    assert epochs["steps"] == 4
    _, fixed = train(TrainConfig(**{**asdict(cfg), "steps": 4}), progress=False)
    assert fixed["loss"] == epochs["loss"] and fixed["steps_per_epoch"] == 2
    _, more = train(TrainConfig(**{**asdict(cfg), "steps": 5}), progress=False)
    assert more["steps"] == 5 and more["loss"][0] == epochs["loss"][0]
    with pytest.raises(ValueError, match="steps"):
        train(TrainConfig(**{**asdict(cfg), "steps": 0}), progress=False)


@needs_real
def test_every_real_training_page_is_used_with_the_same_validation_rule():
    """``real_pages=None`` takes every page the loaders find in the folders (216 receipts,
    110 forms of which one has no question), held out by ``crc32(doc_id) % 5`` as before:
    the committed run's held-out pages are still held out."""
    import zlib

    tr, va, rep = real_pages(tuple(REAL_SOURCES), None, 5)
    for name in REAL_SOURCES:
        r = rep[name]
        found = len(list((dataset_path(name) / ("img" if "sroie" in name else "annotations"))
                         .iterdir()))
        assert r["pages"] + len(r["validation_ids"]) + len(r["no_question_ids"]) == found
        assert not r["unused_ids"]
        assert all(zlib.crc32(i.encode()) % 5 == 0 for i in r["validation_ids"])
        if RECORD.exists():
            old = _record()["train"]["sources"][name]
            assert set(old["validation_ids"]) <= set(r["validation_ids"])
            assert set(old["page_ids"]) <= set(r["page_ids"])


@needs_real
def test_learning_curve_writes_its_record(tmp_path, monkeypatch):
    """A tiny curve through the command line (2 steps, 2 synthetic pages, one validation
    page per set; sentence embeddings replaced by zeros): the JSON has every point with its
    page counts (nested subsets, the same held-out pages, disjoint from them), the same
    step count, the validation numbers of every set with per-field numbers, the commit and
    versions."""
    from fovea_book import learning_curve as lc

    monkeypatch.setattr(train_module, "embed_vocabulary", lambda vocab: _ZeroEmbeddings())
    out = tmp_path / "lc.json"
    assert lc.main(["--out", str(out), "--fractions", "0", "0.05", "--steps", "2",
                    "--pages", "2", "--valid-pages", "1", "--valid-limit", "1",
                    "--clean-full"] + ([] if WEIGHTS.exists() else ["--no-reference"])) == 0
    rec = json.loads(out.read_text())
    assert rec["complete"] and rec["fractions"] == [0.0, 0.05] and rec["photo"] is True
    assert rec["steps"]["per_point"] == 2 and rec["config"]["steps"] == 2
    assert rec["commit"]["head"]
    assert {"torch", "numpy", "opencv", "python"} <= set(rec["environment"])
    assert [p["label"] for p in rec["points"]] == ["0+photo", "0.05+photo", "1"]
    assert [p["photo"] for p in rec["points"]] == [True, True, False]
    folders = rec["pages"]["folders"]
    held = {k: set(v["held_out"]) for k, v in folders.items()}
    sizes = []
    for p in rec["points"]:
        assert p["steps"] == 2 and p["synthetic_pages"] == 2
        assert set(p["validation"]) == set(rec["validations"])
        for key, v in p["validation"].items():
            assert {"cross_entropy", "hit_mass", "top1", "size_rmse", "fields"} <= set(v), key
            assert 0 <= v["hit_mass"] <= 1 and sum(f["questions"] for f in v["fields"].values()) \
                == v["questions"]
        assert set(p["validation"]["sroie/heldout"]["fields"]) <= {"company", "date", "address",
                                                                  "total"}
        for name, ids in p["page_ids"].items():
            assert not set(ids) & held[name] and all("dev" not in i for i in ids)
            assert p["held_out_pages"][name] == len(held[name])
            assert p["real_pages"][name] == len(ids)
        sizes.append(sum(p["real_pages"].values()))
    assert sizes[0] == 0 < sizes[1] < sizes[2]
    small, full = rec["points"][1]["page_ids"], rec["points"][2]["page_ids"]
    assert all(set(small[k]) <= set(full[k]) for k in small)                # nested subsets
    assert full["sroie-train"] == sorted(folders["sroie-train"]["train_order"])
    if WEIGHTS.exists():
        assert rec["reference"]["sha256"] == COMMITTED_SHA256
    assert rec["table"][0]["label"] == ("reference" if WEIGHTS.exists() else "0+photo")


def test_vocabulary_embeddings_do_not_depend_on_what_was_embedded_before():
    """The same vocabulary embeds to the same bits whether or not some of its strings went
    through the sentence encoder's string cache first (that cache encodes only the missing
    strings, in other batches: ~1e-7 apart, enough to move a trained run)."""
    from fovea_core.importance import query

    vocab = vocabulary("train", ["DATE", "TO"])[:300]
    train_module._EMBEDDED.clear()
    query._EMB_CACHE.clear()
    fresh = embed_vocabulary(vocab)
    train_module._EMBEDDED.clear()
    query._EMB_CACHE.clear()
    query.embed(vocab[::7])                                   # part of it cached, out of turn
    again = embed_vocabulary(vocab)
    assert all(torch.equal(fresh[t], again[t]) for t in vocab)
    assert embed_vocabulary(vocab) is not embed_vocabulary(vocab)   # callers get their own dict


def test_real_names_the_folders_to_train_on(tmp_path, monkeypatch):
    """``--real`` leaves a collection out: the configuration trains on the folders named (in
    REAL_SOURCES' order), none with ``--real`` alone; an unknown folder is refused."""
    seen = {}

    def stop(cfg, **kwargs):
        seen["cfg"] = cfg
        raise DatasetNotFound("stopped here")

    monkeypatch.setattr(train_module, "train", stop)
    for names, real in ((["funsd-train"], ("funsd-train",)), ([], ()),
                        (["funsd-train", "sroie-train"], ("sroie-train", "funsd-train"))):
        assert train_module.main(["--out", str(tmp_path / "x.pt"), "--real", *names]) == 2
        assert seen["cfg"].real == real
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--real", "sroie-dev"])


# ----------------------------------------------------------------------------- position-free
def test_a_position_free_net_never_reads_where_a_pixel_lies():
    """``position=False`` zeroes the position and aspect channels before the stem: its maps
    do not move when those channels change (the default net's do), and its weights have the
    default net's shapes."""
    torch.manual_seed(0)
    free, plain = GistLocaliserNet(position=False), GistLocaliserNet()
    plain.load_state_dict(free.state_dict())                          # the same weights
    x = torch.rand(2, 7, 24, 20)
    y = x.clone()
    y[:, list(GistLocaliserNet.POSITION_CHANNELS)] = torch.rand(2, 5, 24, 20)
    m_free, s_free = free.encode(x)
    assert torch.equal(m_free, free.encode(y)[0]) and torch.equal(s_free, free.encode(y)[1])
    assert not torch.allclose(plain.encode(x)[0], plain.encode(y)[0])
    z = x.clone()
    z[:, 0] = torch.rand(2, 24, 20)                                   # the ink is read
    assert not torch.allclose(m_free, free.encode(z)[0])
    assert "position=False" in repr(free) and "position" not in repr(plain)


def test_position_free_weights_load_as_a_position_free_net(tmp_path):
    """The record's ``arch`` builds the net the weights were trained as: ``--no-position``
    reaches the config, and a saved position-free net loads with ``position=False``."""
    assert build_parser().parse_args(["--no-position"]).position is False
    assert build_parser().parse_args([]).position is True
    torch.manual_seed(1)
    net = GistLocaliserNet(position=False)
    out = tmp_path / "free.pt"
    torch.save(net.state_dict(), out)
    out.with_suffix(".json").write_text(json.dumps(dict(
        sha256=file_sha256(out), arch=dict(width=16, maps=32, position=False))))
    loaded = load_model(str(out))
    assert loaded.position is False
    x = torch.rand(1, 7, 16, 16)
    assert torch.equal(loaded.encode(x)[0], net.encode(x)[0])
