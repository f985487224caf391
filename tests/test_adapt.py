"""Adapting the learned localiser to a folder of unlabelled pages (:mod:`fovea_core.adaptation`).

No OCR runs: the pages are synthetic (dark bars where a receipt's lines are) and the page
reader of :mod:`fovea_core.cascade.pseudo_labels` is replaced by one that returns those
lines (its docstring says tests replace it). Page ``k`` carries ``k`` in its top-left
pixel, so the reader knows which page it is given."""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fovea_core
from fovea_core.adaptation import AdaptConfig, adapt, page_split
from fovea_core.cascade import pseudo_labels as pl
from fovea_core.cascade.learned import load_model, weights_path
from fovea_core.importance.text import TextRead

H, W = 400, 300
#: a fast configuration: one epoch, a rate high enough that a few steps move the map
FAST = AdaptConfig(epochs=1, lr=0.05, l2sp=0.0, batch=4)


def _rows(k: int) -> list[tuple[str, tuple[int, int, int, int]]]:
    """Page ``k``'s lines: a shop's name at the head, a dated line, items, a total, the
    cash; everything below the head shifted down by ``3 k`` px."""
    d = 3 * k
    return [("YONGFATT ENTERPRISE", (40, 12, 260, 36)),
            ("NO 122 JALAN DEDAP 13", (50, 44, 250, 56)),
            (f"DATE: {k % 28 + 1:02d}/12/2018 10:30", (10, 80 + d, 230, 92 + d)),
            ("ITEM A", (10, 130 + d, 70, 142 + d)), ("3.00", (240, 130 + d, 280, 142 + d)),
            ("TOTAL", (10, 230 + d, 60, 242 + d)), (f"{k + 10}.90", (240, 230 + d, 280, 242 + d)),
            ("CASH", (10, 260 + d, 50, 272 + d)), ("100.00", (230, 260 + d, 280, 272 + d)),
            ("TOTAL", (10, 300 + d, 60, 312 + d)), (f"{k + 10}.90", (240, 300 + d, 280, 312 + d))]


def _page(k: int) -> np.ndarray:
    img = np.full((H, W, 3), 235, np.uint8)
    for _, (x0, y0, x1, y1) in _rows(k):
        img[y0 + 2:y1 - 2, x0:x1] = 40
    img[0, 0] = k                                   # which page this is, for the reader
    return img


def _fake_read(image) -> tuple[TextRead, tuple[int, int]]:
    x = image if isinstance(image, torch.Tensor) else torch.as_tensor(np.asarray(image))
    if min(x.shape[-2:]) < 8:                     # as the core's reader refuses such a page
        raise ValueError(f"coarse_level=0 leaves a view under 8 px for a {tuple(x.shape[-2:])} "
                         "image")
    k = int(round(float(x.reshape(-1, *x.shape[-2:])[0, 0, 0]) * 255)) if x.is_floating_point() \
        else int(x.reshape(-1)[0])
    rows = _rows(k)
    return (TextRead(np.array([r[1] for r in rows], np.float32), tuple(r[0] for r in rows),
                     np.full(len(rows), 0.99, np.float32)), (H, W))


def _blank_read(image):
    return TextRead(np.zeros((0, 4), np.float32), (), np.zeros(0, np.float32)), (H, W)


@pytest.fixture
def reader(monkeypatch):
    monkeypatch.setattr(pl, "read_full_page", _fake_read)


def _folder(root: Path, n: int = 12) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for k in range(n):
        Image.fromarray(_page(k)).save(root / f"page{k:02d}.png")
    return root


def _files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


# ----------------------------------------------------------------------------- errors
def test_a_bad_folder_no_readable_page_and_no_label_are_named_and_write_nothing(
        tmp_path, monkeypatch):
    out_dir = tmp_path / "out"
    out = out_dir / "loc.pt"
    with pytest.raises(ValueError, match="no such folder"):
        adapt(tmp_path / "missing", out=out, config=FAST, progress=False)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("not a page")
    with pytest.raises(ValueError, match="no image in"):
        adapt(tmp_path / "notes", out=out, config=FAST, progress=False)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "a.png").write_bytes(b"not a png at all")
    with pytest.raises(ValueError, match="no readable page"):
        adapt(tmp_path / "broken", out=out, config=FAST, progress=False)
    monkeypatch.setattr(pl, "read_full_page", _blank_read)
    pages = _folder(tmp_path / "pages", 4)
    with pytest.raises(ValueError, match="no pseudo-label found"):
        adapt(pages, out=out, config=FAST, progress=False)
    with pytest.raises(ValueError, match=r"\.pt"):
        adapt(pages, out=out_dir / "loc.json", config=FAST, progress=False)
    with pytest.raises(ValueError, match="committed"):
        adapt(pages, out=weights_path(), config=FAST, progress=False)
    with pytest.raises(ValueError, match="gists_per_page"):
        adapt(pages, out=out, config=AdaptConfig(gists_per_page=4), progress=False)
    assert not out_dir.exists() and _files(tmp_path / "pages") == _files(pages)
    assert not list(tmp_path.rglob("*.json"))


# ----------------------------------------------------------------------------- the record
def test_the_record_names_pages_labels_losses_and_the_split(tmp_path, reader):
    pages = _folder(tmp_path / "pages")
    (pages / "broken.png").write_bytes(b"\x89PNG but not really")
    Image.fromarray(np.full((6, 6, 3), 200, np.uint8)).save(pages / "tiny.png")   # unreadable
    out = tmp_path / "models" / "loc.pt"
    rec = adapt(pages, out=out, config=FAST, progress=False)
    assert _files(out.parent) == ["loc.json", "loc.pt"]           # no temporary file left
    mask = os.umask(0)
    os.umask(mask)
    assert {p.stat().st_mode & 0o777 for p in out.parent.iterdir()} == {0o666 & ~mask}
    assert json.loads(out.with_suffix(".json").read_text()) == rec
    assert rec["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert rec["start"]["sha256"] == json.loads(
        weights_path().with_suffix(".json").read_text())["sha256"]
    names = [f"page{k:02d}.png" for k in range(12)]
    assert [r["name"] for r in rec["pages"]] == names
    assert [s["name"] for s in rec["skipped"]] == ["broken.png", "tiny.png"]
    for r in rec["pages"]:
        assert r["sha256"] == hashlib.sha256((pages / r["name"]).read_bytes()).hexdigest()
        want = "validation" if zlib.crc32(r["name"].encode()) % 5 == 0 else "train"
        assert r["split"] == want == page_split(r["name"])
        assert {lab["family"] for lab in r["labels"]} == {"company", "date", "total"}
        assert len(r["gists"]) == (2 if want == "train" else 1)
    assert {"train", "validation"} == {r["split"] for r in rec["pages"]}
    for split in ("train", "validation"):
        for fam in ("company", "date", "total"):
            assert rec["labels"][split][fam] == sum(r["split"] == split for r in rec["pages"])
        assert rec["labels"][split]["form"] == 0
    n_train = sum(r["split"] == "train" for r in rec["pages"])
    assert rec["train"]["samples"] == 2 * n_train
    assert len(rec["train"]["loss"]) == rec["train"]["steps"] == -(-2 * n_train // FAST.batch)
    assert all(np.isfinite(rec["train"]["loss"]))
    v = rec["validation"]
    assert v["before"]["questions"] == v["after"]["questions"] == 3 * v["pages"]
    assert set(v["before"]["fields"]) == {"company", "date", "total"}
    assert set(rec["seconds"]) >= {"ocr", "train", "total"}
    assert rec["config"]["seed"] == 0 and rec["config"]["lr"] == FAST.lr
    assert rec["arch"] == json.loads(weights_path().with_suffix(".json").read_text())["arch"]
    assert {"torch", "python"} <= set(rec["environment"])
    assert "commit" in rec
    load_model(str(out), verify=True)                              # the record vouches


def test_the_defaults_are_the_committed_trainings_gists_null_share_and_split():
    cfg = json.loads(weights_path().with_suffix(".json").read_text())["config"]
    d = AdaptConfig()
    assert (list(d.gists), d.gists_per_page, d.null_share, d.batch, d.valid_mod) == \
        (cfg["gists"], cfg["gists_per_page"], cfg["null_share"], cfg["batch"],
         cfg["real_valid_mod"])


def test_same_pages_and_seed_give_the_same_bytes_and_the_weights_move(tmp_path, reader):
    pages = _folder(tmp_path / "pages", 8)
    a, b, c = (tmp_path / f"{n}.pt" for n in "abc")
    adapt(pages, out=a, config=FAST, progress=False)
    adapt(pages, out=b, config=FAST, progress=False)
    adapt(pages, out=c, config=AdaptConfig(epochs=1, lr=0.05, l2sp=0.0, batch=4, seed=1),
          progress=False)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    start = load_model(None).state_dict()
    moved = torch.load(a, weights_only=True)
    assert max(float((moved[k] - start[k]).abs().max()) for k in start) > 1e-3


def test_the_pull_toward_the_start_weights_keeps_them_closer(tmp_path, reader):
    """L2-SP: with the pull, the weights end nearer the start than without it."""
    pages = _folder(tmp_path / "pages", 8)
    free, held = tmp_path / "free.pt", tmp_path / "held.pt"
    adapt(pages, out=free, config=FAST, progress=False)
    adapt(pages, out=held, config=AdaptConfig(epochs=1, lr=0.05, l2sp=50.0, batch=4),
          progress=False)
    start = load_model(None).state_dict()

    def dist(p: Path) -> float:
        s = torch.load(p, weights_only=True)
        return float(sum(((s[k] - start[k]) ** 2).sum() for k in start))

    assert dist(held) < 0.5 * dist(free)


# ----------------------------------------------------------------------------- use
def test_foveate_with_the_adapted_file_uses_its_map(tmp_path, reader):
    from fovea_core.cascade.core import gist
    from fovea_core.cascade.localisers import get_localiser
    from fovea_core.pyramid import build_pyramid

    pages = _folder(tmp_path / "pages", 12)
    out = tmp_path / "loc.pt"
    adapt(pages, out=out, config=FAST, progress=False)
    page = _page(5)
    q = "What is the total?"
    g = gist(build_pyramid(torch.from_numpy(page).permute(2, 0, 1)[None].float() / 255), 64)
    mine, committed = get_localiser(str(out))(g, q), get_localiser("learned")(g, q)
    assert mine.shape == committed.shape
    assert float((mine - committed).abs().sum()) > 0.1            # another map
    f_mine = fovea_core.foveate(page, q, method="cascade", localiser=str(out))
    f_comm = fovea_core.foveate(page, q, method="cascade")
    f_again = fovea_core.foveate(page, q, method="cascade", localiser=out)   # a Path
    assert f_mine.options["localiser"] == str(out)
    assert not torch.equal(f_mine.tokens.centers, f_comm.tokens.centers)
    assert torch.equal(f_mine.tokens.centers, f_again.tokens.centers)


def test_a_weights_file_without_its_record_is_refused(tmp_path, reader):
    from fovea_core.cascade.localisers import get_localiser

    pages = _folder(tmp_path / "pages", 6)
    out = tmp_path / "loc.pt"
    adapt(pages, out=out, config=FAST, progress=False)
    rec = json.loads(out.with_suffix(".json").read_text())
    rec["sha256"] = "0" * 64
    out.with_suffix(".json").write_text(json.dumps(rec))
    with pytest.raises(ValueError, match="SHA-256"):
        get_localiser(str(out))
    with pytest.raises(ValueError, match="no weights file"):
        get_localiser(str(tmp_path / "none.pt"))


# ----------------------------------------------------------------------------- commands
def test_the_adapt_command_writes_and_refuses_bad_options(tmp_path, reader, capsys):
    from fovea_core.__main__ import main

    pages = _folder(tmp_path / "pages", 6)
    with pytest.raises(SystemExit) as exc:
        main(["adapt", str(tmp_path / "nowhere"), "--out", str(tmp_path / "a.json"),
              "--epochs", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "PAGES_DIR" in err and "--out" in err and "--epochs" in err
    out = tmp_path / "m" / "loc.pt"
    assert main(["adapt", str(pages), "--out", str(out), "--epochs", "1"]) == 0
    said = capsys.readouterr().out
    assert "adapt: 6 pages read" in said and out.exists() and out.with_suffix(".json").exists()
    rec = json.loads(out.with_suffix(".json").read_text())
    assert rec["config"]["epochs"] == 1


def test_foveate_command_takes_the_adapted_file(tmp_path, reader, capsys):
    from fovea_core.__main__ import main

    pages = _folder(tmp_path / "pages", 6)
    loc = tmp_path / "loc.pt"
    adapt(pages, out=loc, config=FAST, progress=False)
    with pytest.raises(SystemExit) as exc:
        main(["foveate", str(pages / "page01.png"), "-m", "cascade", "--localiser",
              str(tmp_path / "none.pt"), "--out", str(tmp_path / "f")])
    assert exc.value.code == 2 and "--localiser" in capsys.readouterr().err
    assert main(["foveate", str(pages / "page01.png"), "-q", "What is the total?", "-m",
                 "cascade", "--localiser", str(loc), "--out", str(tmp_path / "f"),
                 "-j", "1"]) == 0
    rec = json.loads((tmp_path / "f" / "page01.foveation.json").read_text())
    assert str(loc) in json.dumps(rec)


def test_the_processor_foveates_with_the_adapted_file(tmp_path, reader):
    from fovea_book.qwen_models import build_qwen
    from fovea_core.vlm.processor import FoveatedProcessor

    pages = _folder(tmp_path / "pages", 12)
    loc = tmp_path / "loc.pt"
    adapt(pages, out=loc, config=FAST, progress=False)
    model = build_qwen("qwen2-vl-tiny", seed=0)
    with pytest.raises(ValueError, match="no weights file"):
        FoveatedProcessor.from_model(model, localiser=str(tmp_path / "none.pt"))
    mine = FoveatedProcessor.from_model(model, localiser=str(loc))
    stock = FoveatedProcessor.from_model(model)
    page, q = _page(5), "What is the total?"
    a = mine(page, q, budget=120, method="cascade").foveation
    b = stock(page, q, budget=120, method="cascade").foveation
    c = mine(page, q, budget=120, method="cascade", localiser="learned").foveation
    assert a.options["localiser"] == str(loc)
    assert not torch.equal(a.tokens.centers, b.tokens.centers)
    assert torch.equal(c.tokens.centers, b.tokens.centers)       # a call's own choice wins
    assert mine(page, q, budget=120, method="resize", question=None).foveation.method == "resize"
