"""The FUNSD forms loader (fovea_book.eval.funsd): the real dev folder, the line grouping of
multi-line answers, the held-out wordings, every bad-input rule on tiny fixtures, and the
optional third set of ``load_datasets``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import cv2
import numpy as np
import pytest

from fovea_book.eval.documents import FORM_WORDINGS, WORDING_SETS, phrase
from fovea_book.eval.experiments import load_datasets
from fovea_book.eval.funsd import (SKIP_REASONS, answer_lines, form_key, load_form, load_funsd,
                                   reworded)
from fovea_book.paths import DatasetNotFound, dataset_path


# ------------------------------------------------------------------------------ the real forms
@pytest.fixture(scope="module")
def dev():
    try:
        root = dataset_path("funsd-dev")
    except DatasetNotFound as err:
        pytest.skip(f"FUNSD dev folder absent: {err}")
    skipped = []
    docs = load_funsd(root, skipped=skipped, log=lambda m: None)
    return root, docs, skipped


def _json(root: Path, doc_id: str) -> dict:
    stem = doc_id.removeprefix("funsd")
    return {e["id"]: e for e in
            json.loads((root / "annotations" / f"{stem}.json").read_text())["form"]}


def test_dev_counts_match_the_annotations(dev):
    root, docs, skipped = dev
    stems = sorted(p.stem for p in (root / "annotations").glob("*.json"))
    assert [d.doc_id for d in docs] == [f"funsd{s}" for s in stems]
    assert len(docs) == 37                               # the README's dev split
    n_pairs = n_lost = 0
    for d in docs:                                       # recount the pairs from the JSON
        ents = _json(root, d.doc_id)
        pairs = {(a, b) if ents[a]["label"] == "question" else (b, a)
                 for e in ents.values() for a, b in e["linking"]
                 if a in ents and b in ents
                 and {ents[a]["label"], ents[b]["label"]} == {"question", "answer"}}
        file = f"{d.doc_id.removeprefix('funsd')}.json"
        bad = {s.entity for s in skipped if s.file == file}
        lost = {p for p in pairs if p[0] in bad or p[1] in bad}
        n_pairs += len(pairs)
        n_lost += len(lost)
        assert len(d.questions) == len(pairs) - len(lost), d.doc_id
        assert sorted(q.qid for q in d.questions) == sorted(f"q{a}-a{b}" for a, b in pairs - lost)
    assert sum(len(d.questions) for d in docs) == n_pairs - n_lost >= 10 * len(docs)
    assert {s.reason for s in skipped} <= set(SKIP_REASONS)
    assert all(s.reason in ("answer_no_text", "question_no_text") for s in skipped)
    d = docs[0]
    gray = cv2.imread(str(root / "images" / f"{d.doc_id.removeprefix('funsd')}.png"),
                      cv2.IMREAD_UNCHANGED)
    assert gray.ndim == 2                                # the scans are gray ...
    assert d.image.shape == (*gray.shape, 3) and d.image.dtype == np.uint8
    assert all(np.array_equal(d.image[..., c], gray) for c in range(3))  # ... stored as RGB
    assert d.source == "funsd" and d.elements == ()


def test_every_question_is_a_linked_pair_of_the_json(dev):
    root, docs, _ = dev
    for d in docs:
        ents = _json(root, d.doc_id)
        h, w = d.size
        for q in d.questions:
            qi, ai = map(int, re.fullmatch(r"q(-?\d+)-a(-?\d+)", q.qid).groups())
            assert ents[qi]["label"] == "question" and ents[ai]["label"] == "answer"
            assert q.field == form_key(ents[qi]["text"]) and not q.field.endswith(":")
            assert q.question == f"What is the {q.field}?"
            assert q.answers[0] == " ".join(ents[ai]["text"].split())
            x0, y0, x1, y1 = ents[ai]["box"]
            for b in q.boxes:                            # every line inside the entity box
                assert x0 <= b[0] < b[2] <= min(x1 + 1, w) and y0 <= b[1] < b[3] <= min(y1 + 1, h)


def test_a_known_pair(dev):
    """``Date:`` on the first form, read from its JSON, is asked as "What is the Date?"."""
    root, docs, _ = dev
    d = docs[0]
    ents = _json(root, d.doc_id)
    qid = next(i for i, e in ents.items() if e["text"] == "Date:" and e["label"] == "question")
    aid = next(b for a, b in ents[qid]["linking"] if a == qid)
    q = next(q for q in d.questions if q.qid == f"q{qid}-a{aid}")
    assert q.question == "What is the Date?" and q.field == "Date"
    assert q.answers == (ents[aid]["text"],)
    w = np.asarray([w["box"] for w in ents[aid]["words"]])
    assert q.boxes == ((w[:, 0].min(), w[:, 1].min(), w[:, 2].max() + 1, w[:, 3].max() + 1),)


def test_multi_line_answers_have_one_box_per_line(dev):
    root, docs, _ = dev
    multi = [(d, q) for d in docs for q in d.questions if len(q.boxes) > 1]
    assert len(multi) >= 10
    for d, q in multi:
        ents = _json(root, d.doc_id)
        words = [w for w in ents[int(q.qid.split("-a")[1])]["words"] if w["text"].strip()]
        hw = np.median([w["box"][3] - w["box"][1] + 1 for w in words])
        b = np.asarray(q.boxes)
        assert ((b[:, 3] - b[:, 1]) <= 2.5 * hw).all(), (d.doc_id, q.qid)   # no merged lines
        for w in words:                                  # every word lies in one line box
            x0, y0, x1, y1 = w["box"]
            inside = (b[:, 0] <= x0) & (b[:, 1] <= y0) & (b[:, 2] >= x1 + 1) & (b[:, 3] >= y1 + 1)
            assert inside.any(), (d.doc_id, q.qid, w)
    # a paragraph answer: its lines go down the page, each one printed line high
    d, q = max(multi, key=lambda m: len(m[1].boxes))
    tops = [b[1] for b in q.boxes]
    assert tops == sorted(tops) and len(q.boxes) >= 5


def test_wording_changes_the_question_not_the_answer(dev):
    _, docs, _ = dev
    held = load_funsd("funsd-dev", limit=4, wording="heldout", log=lambda m: None)
    other = load_funsd("funsd-dev", limit=4, wording="heldout", seed=1, log=lambda m: None)
    moved = 0
    for a, b, c in zip(docs[:4], held, other, strict=True):
        assert np.array_equal(a.image, b.image)
        for qa, qb, qc in zip(a.questions, b.questions, c.questions, strict=True):
            assert (qa.qid, qa.answers, qa.boxes, qa.field) == (qb.qid, qb.answers, qb.boxes,
                                                                qb.field)
            assert qb.question != qa.question
            assert qb.question in {t.format(key=qa.field) for t in FORM_WORDINGS["heldout"]}
            moved += qb.question != qc.question
        assert reworded(a, "heldout").questions == b.questions
        assert reworded(b, "default").questions == a.questions
        assert reworded(a, "heldout", seed=1).questions == c.questions
    assert moved > 0                                     # the seed draws other templates


def test_form_wordings():
    assert FORM_WORDINGS["default"] == ("What is the {key}?",)
    assert set(FORM_WORDINGS) == set(WORDING_SETS)
    assert not set(FORM_WORDINGS["train"]) & set(FORM_WORDINGS["heldout"])
    assert len(FORM_WORDINGS["train"]) >= 4 and len(FORM_WORDINGS["heldout"]) >= 2
    assert all("{key}" in t for p in FORM_WORDINGS.values() for t in p)
    assert phrase("form", "heldout", 1, key="DATE") == \
        FORM_WORDINGS["heldout"][1].format(key="DATE")
    assert form_key("  Suggested  Solutions (s) : ") == "Suggested Solutions (s)"
    assert form_key("DATE:") == "DATE" and form_key(" : ") == ""


def test_answer_lines_on_a_skewed_paragraph():
    """Three printed lines that drift down by more than the line pitch across the page
    (a skewed scan), words listed out of order: three line boxes, words left to right."""
    words, pitch, height, slope = [], 14, 11, 0.03
    for line in range(3):
        for k in range(10):
            x = 10 + 60 * k
            y = 100 + pitch * line + int(slope * x)
            words.append({"box": [x, y, x + 50, y + height], "text": f"w{line}{k}"})
    rng = np.random.default_rng(0)
    shuffled = [words[i] for i in rng.permutation(len(words))]
    for ws in (words, shuffled):
        lines = answer_lines(ws, (0, 0, 700, 200), (200, 700))
        assert len(lines) == 3
        assert sorted(t for _, t in lines) == [" ".join(f"w{i}{k}" for k in range(10))
                                               for i in range(3)]
    lines = answer_lines(words, (0, 0, 700, 200), (200, 700))
    assert [t for _, t in lines][0].startswith("w00 w01")
    assert lines[0][0] == (10, 100, 601, 100 + int(slope * 550) + height + 1)
    # no usable word: the entity box as one line; a word box is clipped to the entity box
    assert answer_lines([{"box": [1, 1, 5, 5], "text": " "}], (0, 0, 9, 9), (20, 20)) == \
        [((0, 0, 9, 9), "")]
    assert answer_lines([{"box": [1, 1, 15, 5], "text": "a"}], (0, 0, 9, 9), (20, 20)) == \
        [((1, 1, 9, 6), "a")]
    with pytest.raises(ValueError, match="min_overlap"):
        answer_lines(words, (0, 0, 9, 9), (20, 20), min_overlap=0)


# ------------------------------------------------------------------------------ tiny fixtures
def _entity(i, label, text, box, links=(), words=None):
    return {"id": i, "label": label, "text": text, "box": box, "linking": [list(l) for l in links],
            "words": words if words is not None else [{"box": box, "text": text}]}


def _good_form():
    """DATE: -> 12/10/98 (link on the question only); NAME: <- a two-line answer (link on
    both entities, listed answer-first on the answer)."""
    return [
        _entity(0, "question", "DATE:", [2, 2, 20, 8], [(0, 1)]),
        _entity(1, "answer", "12/10/98", [24, 2, 50, 8]),
        _entity(2, "question", "NAME :", [2, 12, 20, 18], [(2, 3)]),
        _entity(3, "answer", "Ann Lee Smith", [24, 12, 58, 30], [(3, 2)],
                words=[{"box": [24, 12, 34, 18], "text": "Ann"},
                       {"box": [36, 12, 46, 18], "text": "Lee"},
                       {"box": [24, 23, 58, 30], "text": "Smith"}]),
        _entity(4, "header", "FORM", [2, 32, 20, 38], [(4, 0)]),
    ]


def _write(root: Path, forms: dict, images=None, size=(40, 64)):
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    for name, form in forms.items():
        text = form if isinstance(form, str) else json.dumps({"form": form})
        (root / "annotations" / f"{name}.json").write_text(text)
    for name in (forms if images is None else images):
        img = np.full(size, 255, np.uint8)
        img[2:8, 24:50] = 0
        assert cv2.imwrite(str(root / "images" / f"{name}.png"), img)
    return root


def test_fixture_form_loads(tmp_path, capsys):
    root = _write(tmp_path / "f", {"a": _good_form(), "b": _good_form()})
    docs = load_funsd(root)
    assert capsys.readouterr().out == ""                 # nothing skipped, nothing printed
    assert [d.doc_id for d in docs] == ["funsda", "funsdb"]
    d = docs[0]
    assert d.image.shape == (40, 64, 3) and d.source == "funsd"
    assert [(q.qid, q.question, q.answers) for q in d.questions] == [
        ("q0-a1", "What is the DATE?", ("12/10/98",)),
        ("q2-a3", "What is the NAME?", ("Ann Lee Smith",))]
    assert d.questions[0].boxes == ((24, 2, 51, 9),)         # exclusive ends
    assert d.questions[1].boxes == ((24, 12, 47, 19), (24, 23, 59, 31))
    assert len(load_funsd(root, limit=1)) == 1 and load_funsd(root, limit=0) == []
    one = load_form(root, "a", wording="train")
    assert all(q.question in {t.format(key=q.field) for t in FORM_WORDINGS["train"]}
               for q in one.questions)


def test_missing_image_names_the_file(tmp_path):
    root = _write(tmp_path / "f", {"a": _good_form(), "b": _good_form()}, images=["a"])
    with pytest.raises(FileNotFoundError, match=r"images/b\.png"):
        load_funsd(root)
    assert len(load_funsd(root, limit=1)) == 1           # the forms before it load


def test_orphan_image_is_counted(tmp_path, capsys):
    root = _write(tmp_path / "f", {"a": _good_form()}, images=["a", "z"])
    assert len(load_funsd(root)) == 1
    out = capsys.readouterr().out
    assert "1 images without an annotation" in out and "z.png" in out


@pytest.mark.parametrize("text", ['{"form": [{"id": 0, "label": "quest', "", "\xff\xfe",
                                  "[1, 2]", '{"form": [{"id": 0}]}'])
def test_corrupt_json_names_the_file(tmp_path, text):
    root = _write(tmp_path / "f", {"a": _good_form(), "bad": "x"})
    (root / "annotations" / "bad.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(ValueError, match=r"bad\.json"):
        load_funsd(root)


def test_duplicate_ids_name_the_file(tmp_path):
    form = _good_form()
    form[4]["id"] = 3
    root = _write(tmp_path / "f", {"dup": form})
    with pytest.raises(ValueError, match=r"dup\.json.*3.*twice"):
        load_funsd(root)


@pytest.mark.parametrize("box", [None, "missing", [1, 2, 3], [30, 2, 24, 8], ["a", 1, 2, 3],
                                 [900, 900, 950, 950]])
def test_answer_without_a_box_is_skipped_and_counted(tmp_path, capsys, box):
    form = _good_form()
    if box == "missing":
        del form[1]["box"]
    else:
        form[1]["box"] = box
    root = _write(tmp_path / "f", {"a": form, "b": _good_form()})
    skipped = []
    docs = load_funsd(root, skipped=skipped)
    assert [q.qid for q in docs[0].questions] == ["q2-a3"]
    assert len(docs[1].questions) == 2
    assert [(s.file, s.entity, s.reason) for s in skipped] == [("a.json", 1, "answer_no_box")]
    out = capsys.readouterr().out
    assert out.count("\n") == 1                          # printed once per load
    assert "1 answers without a usable box (a.json#1)" in out and "1 questions" not in out


def test_link_to_a_missing_id_is_skipped_and_counted(tmp_path, capsys):
    form = _good_form()
    form[0]["linking"].append([0, 77])
    form[2]["linking"].append("junk")
    root = _write(tmp_path / "f", {"a": form})
    skipped = []
    docs = load_funsd(root, skipped=skipped)
    assert len(docs[0].questions) == 2
    assert sorted((s.entity, s.reason) for s in skipped) == [(2, "bad_link"),
                                                              (77, "missing_id")]
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert "1 links to a missing id (a.json#77)" in out
    assert "1 links that are not a pair of ids (a.json#2)" in out


def test_empty_texts_are_skipped_and_counted(tmp_path):
    form = _good_form()
    form[1]["text"] = "  "
    form[2]["text"] = " : "
    root = _write(tmp_path / "f", {"a": form})
    messages = []
    docs = load_funsd(root, log=messages.append)
    assert docs[0].questions == ()
    assert len(messages) == 1
    assert "answers without text (a.json#1)" in messages[0]
    assert "questions without text (a.json#2)" in messages[0]


def test_a_bad_answer_of_two_questions_is_counted_once(tmp_path):
    form = _good_form()
    form[1]["text"] = ""
    form[2]["linking"].append([2, 1])                   # NAME: also points at the empty answer
    root = _write(tmp_path / "f", {"a": form})
    skipped = []
    docs = load_funsd(root, skipped=skipped, log=lambda m: None)
    assert [q.qid for q in docs[0].questions] == ["q2-a3"]
    assert [(s.entity, s.reason) for s in skipped] == [(1, "answer_no_text")]


def test_missing_folders_raise_dataset_not_found(tmp_path):
    with pytest.raises(DatasetNotFound, match="nowhere"):
        load_funsd(tmp_path / "nowhere")
    with pytest.raises(DatasetNotFound, match="funsd-elsewhere"):
        load_funsd("funsd-elsewhere", data_dir=tmp_path)
    (tmp_path / "half" / "annotations").mkdir(parents=True)
    with pytest.raises(DatasetNotFound, match="images/"):
        load_funsd(tmp_path / "half")
    root = _write(tmp_path / "data" / "funsd-dev", {"a": _good_form()})
    assert len(load_funsd("funsd-dev", data_dir=tmp_path / "data")) == 1
    assert load_funsd(root)[0].questions == load_funsd("funsd-dev",
                                                       data_dir=tmp_path / "data")[0].questions


@pytest.mark.parametrize("limit", [-1, 1.5, "2", True])
def test_bad_limit_names_it(tmp_path, limit):
    root = _write(tmp_path / "f", {"a": _good_form()})
    with pytest.raises(ValueError, match="limit"):
        load_funsd(root, limit=limit)
    with pytest.raises(ValueError, match="wording"):
        load_funsd(root, wording="casual")


# ------------------------------------------------------------------------------ load_datasets
def test_load_datasets_adds_the_forms(tmp_path):
    data_dir = tmp_path / "data"
    form = _good_form()
    form[1]["text"] = ""
    _write(data_dir / "funsd-dev", {"a": _good_form(), "b": form, "c": _good_form()})
    data, msg = load_datasets(1, 0, data_dir=data_dir, cache_dir=None, n_forms=2)
    assert list(data) == ["synthetic", "funsd"]
    assert [d.doc_id for d in data["funsd"]] == ["funsda", "funsdb"]
    assert "FUNSD: 2 forms, 3 questions loaded." in msg and "b.json#1" in msg
    held, _ = load_datasets(1, 0, data_dir=data_dir, cache_dir=None, n_forms=1,
                            wording="heldout")
    assert held["funsd"][0].questions == reworded(data["funsd"][0], "heldout").questions
    data, msg = load_datasets(1, 0, data_dir=tmp_path / "none", cache_dir=None, n_forms=2)
    assert list(data) == ["synthetic"] and "FUNSD skipped (dataset not found)" in msg
    data, msg = load_datasets(1, 0, data_dir=data_dir, cache_dir=None)
    assert list(data) == ["synthetic"] and "FUNSD" not in msg     # as before n_forms
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="n_forms"):
            load_datasets(1, 0, data_dir=data_dir, cache_dir=None, n_forms=bad)


def test_load_datasets_caches_the_forms_by_their_files(tmp_path, monkeypatch):
    import fovea_book.eval.funsd as funsd

    data_dir, cache = tmp_path / "data", tmp_path / "cache"
    root = _write(data_dir / "funsd-dev", {"a": _good_form()})
    first, msg = load_datasets(1, 0, data_dir=data_dir, cache_dir=cache, n_forms=1)
    load_datasets(1, 0, data_dir=data_dir, cache_dir=cache)           # no forms: another key
    assert len(list(cache.glob("*.pkl"))) == 2
    monkeypatch.setattr(funsd, "load_form", lambda *a, **k: pytest.fail("read again"))
    again, msg2 = load_datasets(1, 0, data_dir=data_dir, cache_dir=cache, n_forms=1)
    assert msg2 == msg
    a, b = first["funsd"][0], again["funsd"][0]
    assert (a.doc_id, a.questions, a.source) == (b.doc_id, b.questions, b.source)
    assert a.image.shape == b.image.shape and np.array_equal(a.image, b.image)
    form = _good_form()
    form[1]["text"] = "13/10/98"                          # an edited annotation: a new key
    (root / "annotations" / "a.json").write_text(json.dumps({"form": form}) + " ")
    with pytest.raises(pytest.fail.Exception, match="read again"):
        load_datasets(1, 0, data_dir=data_dir, cache_dir=cache, n_forms=1)


def test_unambiguous_keeps_the_questions_asked_once_on_the_form():
    import numpy as np

    from fovea_book.eval.documents import Document, Question
    from fovea_book.eval.funsd import unambiguous

    def q(qid, key):
        return Question(qid, f"What is the {key}?", ("x",), ((0, 0, 4, 4),), key)

    doc = Document("f", np.zeros((8, 8, 3), np.uint8),
                   (q("a", "DATE"), q("b", "SCORE"), q("c", "SCORE"), q("d", "NAME")), source="funsd")
    out = unambiguous(doc)
    assert [x.qid for x in out.questions] == ["a", "d"]
    assert out.image is doc.image and out.doc_id == "f" and len(doc.questions) == 4
