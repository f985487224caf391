"""The WildReceipt loader (fovea_book.eval.wildreceipt): the real dev folder (59 receipts,
answer boxes, counts per field, orientation), the space-free comparison, and the matching
and bad-input rules on tiny synthetic folders."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fovea_book.eval.metrics import anls
from fovea_book.eval.wildreceipt import (
    FIELD_LABELS,
    anls_without_spaces,
    exact_match_without_spaces,
    load_wildreceipt,
    match_segments,
    normalise_answer,
    rescore_without_spaces,
    reworded,
    squash,
)
from fovea_book.paths import DatasetNotFound, dataset_path
from PIL import Image

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


def _dev_root() -> Path:
    """``wildreceipt-dev`` under ``FOVEA_DATA`` when it is set, else under the shared
    datasets folder beside the checkout (else the default data root)."""
    if not os.environ.get("FOVEA_DATA") and (SHARED / "wildreceipt-dev").is_dir():
        return dataset_path("wildreceipt-dev", SHARED)
    return dataset_path("wildreceipt-dev")


# ------------------------------------------------------------------------------ the real set
@pytest.fixture(scope="module")
def dev():
    try:
        root = _dev_root()
    except DatasetNotFound as err:
        pytest.skip(f"wildreceipt-dev folder absent: {err}")
    skipped, unmatched = [], []
    docs = load_wildreceipt(root, skipped=skipped, unmatched=unmatched, log=lambda m: None)
    return root, docs, skipped, unmatched


def test_dev_loads_all_59_receipts(dev):
    root, docs, skipped, unmatched = dev
    assert len(docs) == 59
    assert [d.doc_id for d in docs] == sorted(f"wildreceipt{p.stem}"
                                              for p in (root / "key").glob("*.json"))
    assert skipped == [] and unmatched == []
    assert all(d.source == "wildreceipt" and d.image.dtype == np.uint8
               and d.image.ndim == 3 and d.image.shape[2] == 3 for d in docs)


def test_dev_every_receipt_has_a_question(dev):
    _, docs, _, _ = dev
    assert min(len(d.questions) for d in docs) >= 1


def test_dev_question_count_per_field(dev):
    root, docs, _, _ = dev
    counts = Counter(q.field for d in docs for q in d.questions)
    assert counts == {"company": 59, "date": 51, "total": 55}
    in_keys = Counter(f for p in (root / "key").glob("*.json")
                      for f, v in json.loads(p.read_text()).items() if str(v).strip())
    assert counts == {f: in_keys[f] for f in counts}        # every key field found its box


def test_dev_answer_boxes_lie_inside_the_image(dev):
    _, docs, _, _ = dev
    for d in docs:
        h, w = d.size
        for q in d.questions:
            assert q.boxes, (d.doc_id, q.field)
            for x0, y0, x1, y1 in q.boxes:
                assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h, (d.doc_id, q.field, q.boxes)


def test_dev_boxes_are_the_keys_labelled_box(dev):
    """The key took the first box of the field's class; the loader finds that box, also
    where the same text is printed in several boxes (a subtotal equal to the total)."""
    root, docs, _, _ = dev
    classes = (root / "class_list.txt").read_text().splitlines()
    for d in docs:
        stem = d.doc_id.removeprefix("wildreceipt")
        ann = json.loads((root / "ann" / f"{stem}.json").read_text())["annotations"]
        h, w = d.size
        for q in d.questions:
            first = next(a for a in ann if classes[a["label"]] == FIELD_LABELS[q.field])
            xs, ys = first["box"][0::2], first["box"][1::2]
            want = (int(min(xs)), int(min(ys)), min(int(max(xs)) + 1, w),
                    min(int(max(ys)) + 1, h))
            assert q.boxes == (want,), (d.doc_id, q.field)
            assert squash(first["text"]) == squash(q.answers[0])


def test_dev_photos_need_no_rotation(dev):
    """No photograph asks for a rotation (EXIF Orientation absent or 1) and each annotation
    is for the stored size, so the stored frame is the boxes' frame."""
    root, docs, _, _ = dev
    for d in docs:
        stem = d.doc_id.removeprefix("wildreceipt")
        with Image.open(root / "img" / f"{stem}.jpg") as im:
            assert im.getexif().get(0x0112, 1) == 1, stem
            assert (im.height, im.width) == d.size
        ann = json.loads((root / "ann" / f"{stem}.json").read_text())
        assert (ann["height"], ann["width"]) == d.size


# ------------------------------------------------------------------------------ comparison
def test_normalise_answer_ignores_spaces_and_case():
    assert normalise_answer(" Korean\tRestaurant \n") == "koreanrestaurant"
    assert normalise_answer(normalise_answer("A b")) == "ab"
    assert anls("Korean Restaurant", ["KOREANRESTAURANT"]) < 1.0
    assert anls_without_spaces("Korean Restaurant", ["KOREANRESTAURANT"]) == 1.0
    assert anls_without_spaces("Korean Restaurant", "KOREANRESTAURANT") == 1.0
    assert exact_match_without_spaces("$60. 44", ["$60.44"]) == 1.0
    assert exact_match_without_spaces("$60.45", ["$60.44"]) == 0.0


def test_rescore_without_spaces(tmp_path):
    doc = _fake_doc(tmp_path)
    table = pd.DataFrame({"doc_id": [doc.doc_id] * 2, "qid": ["company"] * 2,
                          "pred": ["KOREAN RESTAURANT", "KOREAN RESTAURAN"],
                          "allocator": ["full", "resize"], "anls": [0.9, 0.8],
                          "em": [0.0, 0.0], "ceiling_anls": [0.9, 0.9],
                          "ceiling_em": [0.0, 0.0]})
    out = rescore_without_spaces(table, [doc])
    assert out["anls"].tolist()[0] == 1.0 and out["em"].tolist() == [1.0, 0.0]
    assert out["ceiling_anls"].tolist() == [1.0, 1.0]
    assert table["anls"].tolist() == [0.9, 0.8]                # the input is not changed
    with pytest.raises(KeyError):
        rescore_without_spaces(table.assign(qid="nope"), [doc])


# ------------------------------------------------------------------------------ matching
def test_match_segments_rules():
    rows = [((0, 0, 5, 5), "1"), ((0, 10, 40, 20), "KOREAN"), ((45, 10, 90, 20), "RESTAURANT"),
            ((0, 30, 40, 40), "DATE:12/1/2016"), ((0, 50, 40, 60), "$5.00"),
            ((0, 70, 40, 80), "$5.00")]
    assert match_segments("KOREAN RESTAURANT", rows) == [1, 2]      # segments together
    assert match_segments("12/1/2016", rows) == [3]                 # a box containing it, not "1"
    assert match_segments("$5.00", rows) == [4]                     # first of equal boxes
    labels = [None, None, None, None, "Subtotal_value", "Total_value"]
    assert match_segments("$5.00", rows, labels, "Total_value") == [5]
    assert match_segments("KOREAN RESTAURAMT", rows) == [1, 2]      # near miss
    assert match_segments("ZZZZ", rows) is None
    with pytest.raises(ValueError, match="labels"):
        match_segments("$5.00", rows, labels[:2], "Total_value")


# ------------------------------------------------------------------------------ tiny folders
def _write(root: Path, stem: str = "000", *, rows: list[str], key: dict, size=(60, 200),
           ann: dict | None = None, classes: list[str] | None = None, exif_orientation=None):
    for sub in ("img", "box", "key"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    h, w = size
    img = np.full((h, w, 3), 255, np.uint8)
    img[:, : w // 2] = (200, 0, 0)                          # left half red: tells the frame
    pil = Image.fromarray(img)
    if exif_orientation is None:
        pil.save(root / "img" / f"{stem}.jpg", quality=95)
    else:
        exif = Image.Exif()
        exif[0x0112] = exif_orientation
        pil.save(root / "img" / f"{stem}.jpg", quality=95, exif=exif)
    (root / "box" / f"{stem}.csv").write_text("\n".join(rows) + "\n")
    (root / "key" / f"{stem}.json").write_text(json.dumps(key))
    if ann is not None:
        (root / "ann").mkdir(exist_ok=True)
        (root / "ann" / f"{stem}.json").write_text(json.dumps(ann))
    if classes is not None:
        (root / "class_list.txt").write_text("\n".join(classes) + "\n")


ROWS = ["10,5,60,5,60,20,10,20,KOREAN", "62,5,150,5,150,20,62,20,RESTAURANT",
        "10,25,20,25,20,35,10,35,1", "30,25,120,25,120,40,30,40,12/1/2016",
        "10,45,60,45,60,58,10,58,$9.99", "100,45,150,45,150,59,100,59,$9.99"]


def _fake_doc(tmp: Path):
    root = tmp / "wr"
    _write(root, rows=ROWS, key={"company": "KOREAN RESTAURANT"})
    return load_wildreceipt(root, log=lambda m: None)[0]


def test_tiny_folder_loads_expected_questions_and_boxes(tmp_path):
    root = tmp_path / "wr"
    _write(root, rows=ROWS, key={"company": "KOREAN RESTAURANT", "date": "12/1/2016"})
    docs = load_wildreceipt(root, log=lambda m: None)
    assert len(docs) == 1
    d = docs[0]
    assert d.doc_id == "wildreceipt000" and d.size == (60, 200)
    qs = {q.field: q for q in d.questions}
    assert set(qs) == {"company", "date"}                   # no total in the key: no question
    assert qs["company"].boxes == ((10, 5, 61, 21), (62, 5, 151, 21))
    assert qs["company"].answers == ("KOREAN RESTAURANT", "KOREANRESTAURANT")
    assert qs["company"].question == "What is the company?"
    assert qs["date"].boxes == ((30, 25, 121, 41),) and qs["date"].answers == ("12/1/2016",)
    assert reworded(d, "heldout").questions[0].question != "What is the company?"
    assert reworded(reworded(d, "heldout"), "default").questions == d.questions


def test_tiny_folder_labels_pick_the_total_and_boxes_are_clipped(tmp_path):
    root = tmp_path / "wr"
    classes = ["Ignore", "Subtotal_value", "Total_value"]
    texts = [r.split(",", 8)[8] for r in ROWS]
    ann = {"width": 200, "height": 60, "annotations": [
        {"box": [], "text": t, "label": 2 if i == 5 else 1 if i == 4 else 0}
        for i, t in enumerate(texts)]}
    _write(root, rows=ROWS, key={"total": "$9.99"}, ann=ann, classes=classes)
    (d,) = load_wildreceipt(root, log=lambda m: None)
    assert d.questions[0].boxes == ((100, 45, 151, 60),)   # y1 60 = H, not 61
    (d,) = load_wildreceipt(root, use_labels=False, log=lambda m: None)
    assert d.questions[0].boxes == ((10, 45, 61, 59),)


def test_tiny_folder_keeps_the_stored_frame_despite_exif(tmp_path):
    root = tmp_path / "wr"
    _write(root, rows=ROWS, key={"company": "KOREAN"}, exif_orientation=6)
    with Image.open(root / "img" / "000.jpg") as im:
        assert im.getexif()[0x0112] == 6
    (d,) = load_wildreceipt(root, log=lambda m: None)
    assert d.size == (60, 200)                              # not rotated to 200 x 60
    assert d.image[30, 20, 0] > 150 and d.image[30, 20, 1] < 60   # red on the left


def test_tiny_folder_annotation_of_another_size_raises(tmp_path):
    root = tmp_path / "wr"
    _write(root, rows=ROWS, key={"company": "KOREAN"},
           ann={"width": 60, "height": 200, "annotations": []})
    with pytest.raises(ValueError, match="ann/000.json|000.json"):
        load_wildreceipt(root, log=lambda m: None)


def test_tiny_folder_skips_and_unmatched(tmp_path):
    root = tmp_path / "wr"
    _write(root, "000", rows=ROWS, key={"company": "NOWHERE", "total": "$9.99"})
    _write(root, "001", rows=ROWS, key={"company": "NOWHERE"})
    (root / "key" / "002.json").write_text("{}")
    skipped, unmatched, logged = [], [], []
    docs = load_wildreceipt(root, skipped=skipped, unmatched=unmatched, log=logged.append)
    assert [d.doc_id for d in docs] == ["wildreceipt000"]
    assert [q.field for q in docs[0].questions] == ["total"]
    assert unmatched == [("000", "company", "NOWHERE"), ("001", "company", "NOWHERE")]
    assert skipped == [("box/001.csv", "no question"), ("img/002.jpg", "no image")]
    assert len(logged) == 1 and logged[0].startswith("WildReceipt wr:")
    assert len(load_wildreceipt(root, limit=1, log=lambda m: None)) == 1


def test_missing_folder_raises_dataset_not_found(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(DatasetNotFound, match=str(missing)):
        load_wildreceipt(missing)
    with pytest.raises(DatasetNotFound, match="wildreceipt-dev") as err:
        load_wildreceipt(data_dir=tmp_path)
    assert str(tmp_path) in str(err.value)
    (tmp_path / "part" / "img").mkdir(parents=True)
    (tmp_path / "part" / "key").mkdir()
    with pytest.raises(DatasetNotFound, match="no box/"):
        load_wildreceipt(tmp_path / "part")


def test_bad_arguments_and_files(tmp_path):
    root = tmp_path / "wr"
    _write(root, rows=ROWS, key={"company": "KOREAN"})
    with pytest.raises(ValueError, match="limit"):
        load_wildreceipt(root, limit=-1)
    with pytest.raises(ValueError, match="max_nl"):
        load_wildreceipt(root, max_nl=2.0)
    (root / "key" / "000.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="000.json"):
        load_wildreceipt(root)


# ------------------------------------------------------------------------------ the chapter's
def test_carry_over_verdict_needs_both_conditions_and_enough_documents():
    from fovea_book.eval.wildreceipt import carry_over_verdict

    assert carry_over_verdict(0.5, -1.5, 59) == "met"
    assert carry_over_verdict(-0.1, -1.0, 59) == "not met"      # estimate below 0
    assert carry_over_verdict(3.0, -2.0, 59) == "not met"       # lower bound not above -2
    assert carry_over_verdict(3.0, 1.0, 19) == "too few documents (n = 19)"


def test_native_grid_and_kept_by_field():
    import pandas as pd

    from fovea_book.eval.documents import Document
    from fovea_book.eval.wildreceipt import kept_by_field, native_grid

    doc = Document(doc_id="x", image=np.zeros((33, 48, 3), np.uint8), questions=())
    assert native_grid(doc) == 3 * 3 and native_grid(doc, patch=8) == 5 * 6
    t = pd.DataFrame(dict(field=["date", "date", "total", "date"],
                          allocator=["resize", "resize", "resize", "cascade"],
                          anls=[1.0, 0.0, 0.5, 1.0], ceiling_anls=[1.0, 1.0, 1.0, 1.0]))
    k = kept_by_field(t, ["resize", "cascade", "absent"])
    assert list(k.columns) == ["resize", "cascade"]
    assert k.loc["date", "resize"] == 0.5 and k.loc["total", "resize"] == 0.5
    assert k.loc["date", "cascade"] == 1.0 and np.isnan(k.loc["total", "cascade"])


def test_book_wildreceipt_without_the_dataset_gives_a_message(tmp_path):
    from fovea_book.eval.wildreceipt import book_wildreceipt

    docs, msg = book_wildreceipt("smoke", data_dir=tmp_path)
    assert docs == [] and "skipped" in msg and "wildreceipt-dev" in msg
    with pytest.raises(ValueError, match="profile"):
        book_wildreceipt("huge", data_dir=tmp_path)


def test_answer_px_at_resize_divides_by_the_resize_scale():
    """A 1,024 x 512 page at 128 tokens of 16 px is resized by 4 (a 16 x 8 grid), so a 20 px
    answer is 5 px in resize's view; an answer's height is its boxes' median."""
    from fovea_book.eval.documents import Document, Question
    from fovea_book.eval.wildreceipt import answer_px_at_resize

    qs = (Question("a", "date?", ("1",), ((0, 0, 10, 20),), "date"),
          Question("b", "total?", ("2",), ((0, 0, 10, 8), (0, 20, 10, 32), (0, 40, 10, 80)),
                   "total"))
    doc = Document(doc_id="x", image=np.zeros((1024, 512, 3), np.uint8), questions=qs)
    assert np.allclose(answer_px_at_resize(doc, 128), [5.0, 3.0])
    assert np.allclose(answer_px_at_resize(doc, 512), [10.0, 6.0])
