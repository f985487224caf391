"""``fovea_core.foveate`` (one call) and ``python -m fovea_core foveate`` (the command).

Pages are two synthetic pages of :func:`fovea_core.eval.documents.make_document` scaled to
512 px, so that every test runs in seconds; most use methods without OCR, one the default
learned cascade.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fovea_core
from fovea_core.foveate import (LABELS, OUTPUT_SUFFIXES, FoveateWarning, Foveation, foveate,
                                load_image, method_names, method_summary, run_page,
                                save_foveation, uses_question)
from fovea_core.__main__ import main

SIDE = 512
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> Path:
    """A folder of three files: two 512 px synthetic pages (PNG) and a broken ``.png``."""
    from fovea_core.eval.documents import make_document

    d = tmp_path_factory.mktemp("pages")
    for seed in (0, 1):
        doc = make_document(seed, width=768, height=768)
        Image.fromarray(doc.image).resize((SIDE, SIDE), Image.LANCZOS).save(d / f"page{seed}.png")
    (d / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not an image")
    return d


def _outputs(out: Path, stem: str) -> dict[str, Path]:
    return {k: out / f"{stem}{suf}" for k, suf in OUTPUT_SUFFIXES.items()}


def _grid_cells(side: int = SIDE, patch: int = 16) -> int:
    return math.ceil(side / patch) ** 2


# ----------------------------------------------------------------------------- the command
def test_command_on_a_folder_writes_each_page_skips_the_broken_file(pages, tmp_path):
    out = tmp_path / "out"
    res = subprocess.run(
        [sys.executable, "-m", "fovea_core", "foveate", str(pages), "--method", "resize",
         "--budget", "64", "--question", "What is the total?", "--out", str(out),
         "--workers", "2"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    summary = res.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"foveate: 2 done, 1 skipped, 0 failed of 3 files in [\d.]+ s "
                        r"\(resize, N = 64\) -> .*", summary), summary
    assert re.search(r"skipped broken\.png: not an image", res.stderr)
    # a question the method does not read: said once for the folder, not once per page
    assert res.stderr.count("does not read the question") == 1
    for seed in (0, 1):
        files = _outputs(out, f"page{seed}")
        assert all(p.is_file() for p in files.values()), sorted(out.iterdir())
        view = np.asarray(Image.open(files["view"]))
        assert view.shape == (SIDE, SIDE, 3)
        fig = Image.open(files["figure"])
        assert fig.size[0] > SIDE / 2 and fig.size[1] > 100
        rec = json.loads(files["json"].read_text())
        assert rec["method"] == "resize" and rec["budget"] == 64 and len(rec["tokens"]) == 64
        assert rec["question"] == "What is the total?" and rec["question_used"] is False
        assert rec["cost"]["label"] == "budgeted" and rec["cost"]["total_tokens"] == 64
        assert rec["source"].endswith(f"page{seed}.png")
        # the JSON's tokens are the ones foveate() chooses for the page
        f = foveate(pages / f"page{seed}.png", budget=64, method="resize")
        np.testing.assert_allclose([[t["x"], t["y"]] for t in rec["tokens"]],
                                   f.tokens.centers[0].numpy(), atol=1e-6)
        np.testing.assert_allclose([t["level"] for t in rec["tokens"]],
                                   f.tokens.levels[0].numpy(), atol=1e-6)
        np.testing.assert_array_equal(view, f.view_uint8())
    assert not list(out.glob("broken*")) and not list(out.glob(".*"))   # nothing half-written


def test_help_lists_every_method_with_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["foveate", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    names = method_names()
    assert names[0] == "cascade" and "resize" in names and "adaptive_budget" not in names
    for name in names:
        line = next((ln for ln in text.splitlines() if ln.split()[:1] == [name]), None)
        assert line is not None, name
        assert method_summary(name) in " ".join(line.split()[1:]) or \
            " ".join(method_summary(name).split()) in " ".join(line.split())


def test_command_default_cascade_on_one_page(pages, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["foveate", str(pages / "page0.png"), "--question",
                 "What is the date in the header?", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "does not read the question" not in captured.err
    assert re.search(r"foveate: 1 done, 0 skipped, 0 failed of 1 files .*\(cascade, N = 273\)",
                     captured.out)
    rec = json.loads(_outputs(out, "page0")["json"].read_text())
    assert rec["method"] == "cascade" and rec["question_used"] is True
    assert len(rec["tokens"]) == 273 and rec["cost"]["label"] == "budgeted"
    stages = [t["stage"] for t in rec["tokens"]]
    assert set(stages) == {0, 1}                             # gist and fovea
    assert stages.count(0) <= 64                              # the default gist at N = 273


@pytest.mark.parametrize("argv, message", [
    (["--method", "nope"], r"unknown method 'nope'; registered: cascade, .*resize"),
    (["--budget", "0"], r"--budget must be a positive int"),
])
def test_command_rejects_bad_arguments(pages, tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        main(["foveate", str(pages), "--out", str(out)] + argv)
    assert e.value.code == 2
    assert re.search(message, capsys.readouterr().err)
    assert not out.exists()


def test_command_missing_unreadable_and_empty_inputs(pages, tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        main(["foveate", str(tmp_path / "missing.png"), "--out", str(out)])
    assert e.value.code == 2 and "no such file or folder" in capsys.readouterr().err
    assert main(["foveate", str(pages / "broken.png"), "--method", "resize",
                 "--out", str(out)]) == 2
    assert "is not a readable image" in capsys.readouterr().err
    empty = tmp_path / "no_images"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a page")
    assert main(["foveate", str(empty), "--method", "resize", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "skipped notes.txt: not an image" in err and "no images in" in err
    assert not out.exists()                                   # nothing written


def test_command_budget_too_large_fails_the_page_and_writes_nothing(pages, tmp_path, capsys):
    out = tmp_path / "out"
    big = _grid_cells() + 1
    code = main(["foveate", str(pages / "page1.png"), "--method", "resize", "--budget",
                 str(big), "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 1
    assert f"budget must be in [1, {_grid_cells()}] for this {SIDE}x{SIDE} page" in captured.err
    assert re.search(r"foveate: 0 done, 0 skipped, 1 failed of 1 files", captured.out)
    assert "Traceback" not in captured.err + captured.out
    assert list(out.iterdir()) == []


def test_a_page_that_fails_while_writing_leaves_no_file(pages, tmp_path, monkeypatch):
    import fovea_core.foveate as fv

    def broken_figure(*args, **kwargs):
        raise RuntimeError("the figure broke")

    monkeypatch.setattr(fv, "plot_foveation", broken_figure)
    r = run_page(dict(path=str(pages / "page0.png"), stem="page0", out_dir=str(tmp_path),
                      question=None, budget=32, method="resize", options={}))
    assert r["status"] == "failed" and r["message"] == "RuntimeError: the figure broke"
    assert list(tmp_path.iterdir()) == []                     # no view, no temp file
    r = run_page(dict(path=str(pages / "broken.png"), stem="broken", out_dir=str(tmp_path),
                      question=None, budget=32, method="resize", options={}))
    assert r["status"] == "skipped" and "not a readable image" in r["message"]


# ----------------------------------------------------------------------------- foveate()
def test_every_input_type_gives_the_same_tokens(pages, tmp_path):
    grey_page = np.array(Image.open(pages / "page1.png"))
    tint = np.linspace(0.3, 1.0, 3)[None, None, :]               # a colour page: R != G != B
    arr = (grey_page * tint).astype(np.uint8)
    arr[40:120, 300:480] = (200, 30, 90)
    path = tmp_path / "colour.png"
    Image.fromarray(arr).save(path)
    pil = Image.open(path)
    inputs = {"str": str(path), "Path": path, "PIL": pil, "numpy": arr,
              "numpy float": arr.astype(np.float32) / 255,
              "tensor uint8": torch.from_numpy(arr).permute(2, 0, 1),
              "tensor float": torch.from_numpy(arr).permute(2, 0, 1).float() / 255,
              "tensor batch of one": torch.from_numpy(arr).permute(2, 0, 1)[None],
              "PIL RGBA, opaque": pil.convert("RGBA")}
    ref = foveate(path, budget=48, method="topk")              # scores from the pixels
    assert isinstance(ref, Foveation) and ref.budget == 48
    for name, image in inputs.items():
        f = foveate(image, budget=48, method="topk")
        assert torch.equal(f.tokens.centers, ref.tokens.centers), name
        assert torch.equal(f.tokens.levels, ref.tokens.levels), name
        assert torch.equal(f.view, ref.view), name
    assert not torch.equal(ref.view[0], ref.view[2])           # the channels stay in order
    # a grey PIL image and its array agree too (one channel)
    grey = pil.convert("L")
    a, b = foveate(grey, budget=48, method="topk"), foveate(np.array(grey), budget=48,
                                                            method="topk")
    assert a.view.shape == (1, SIDE, SIDE) and torch.equal(a.tokens.centers, b.tokens.centers)


def test_foveation_fields_and_the_package_export(pages):
    f = fovea_core.foveate(pages / "page0.png", budget=40, method="pyramid")
    assert f.tokens.budget == 40 and tuple(f.patches.shape) == (1, 40, 3, 16, 16)
    assert f.view.shape == (3, SIDE, SIDE) and 0 <= float(f.view.min()) <= float(f.view.max()) <= 1
    assert f.method == "pyramid" and f.options["scorer"] == "saliency"
    assert f.scores is not None and tuple(f.scores.shape) == (1, SIDE // 16, SIDE // 16)
    with pytest.raises(dataclasses_frozen()):
        f.method = "x"
    import fovea_core.foveate as module                       # the submodule is callable too
    assert module(pages / "page0.png", budget=40, method="pyramid").tokens.keys().equal(
        f.tokens.keys())


def dataclasses_frozen():
    import dataclasses

    return dataclasses.FrozenInstanceError


def test_a_cascade_with_side_compute_is_costed_from_the_run_that_allocated(pages, monkeypatch):
    """foveate takes the text detector's cost from the cascade run that made the tokens
    (one detector run, never a second call that hopes for a cache hit)."""
    from fovea_core.cascade import allocator as A
    from fovea_core.cascade.side import detector_flops, render_size

    calls = []
    real = A.detect_text

    def counted(pyr, **kw):
        calls.append(1)
        return real(pyr, **{**kw, "key": None})               # no cache: every run counts
    monkeypatch.setattr(A, "detect_text", counted)
    f = foveate(pages / "page0.png", "What is the title?", method="cascade_text")
    assert len(calls) == 1
    c = f.cost
    assert c.label == "side compute" and c.side_flops == detector_flops(*render_size((SIDE, SIDE))) > 0
    assert c.side_ms > 0 and c.side_pixels > 0


def test_cost_uses_the_sweeps_token_rules(pages):
    from fovea_core import build_pyramid
    from fovea_core.eval.sweep import alloc_read_tokens, scorer_tokens

    img = load_image(pages / "page0.png")
    pyr = build_pyramid(img)
    size = (SIDE, SIDE)
    r = foveate(img, budget=64, method="resize").cost
    assert (r.label, r.total_tokens, r.scorer, r.side_pixels) == ("budgeted", 64, "none", 0)
    t = foveate(img, budget=64, method="topk").cost             # a 64 px saliency thumbnail
    assert t.scorer == "saliency" and t.scorer_tokens == scorer_tokens("saliency", size) > 0
    assert t.total_tokens == 64 + t.scorer_tokens and t.label == "side compute"
    assert t.side_ms > 0 and t.side_pixels > 0
    fr = foveate(img, budget=64, method="frequency").cost        # reads every pixel itself
    a_tok = alloc_read_tokens("frequency", pyr)
    assert fr.alloc_read_tokens == a_tok and fr.total_tokens == 64 + t.scorer_tokens + a_tok
    assert fr.label == "unbudgeted" and a_tok > 64
    assert {r.label, t.label, fr.label} == set(LABELS)


def test_bad_inputs_of_foveate(pages):
    with pytest.raises(FileNotFoundError, match="image: no such file"):
        foveate(pages / "missing.png", method="resize")
    with pytest.raises(ValueError, match="is not a readable image"):
        foveate(pages / "broken.png", method="resize")
    with pytest.raises(ValueError, match="is a folder"):
        foveate(pages, method="resize")
    with pytest.raises(TypeError, match="image must be a path"):
        foveate([[0.5]], method="resize")
    with pytest.raises(ValueError, match="one page at a time"):
        foveate(torch.zeros(2, 3, 64, 64), method="resize")
    with pytest.raises(ValueError, match=r"unknown method 'nope'; registered: cascade, .*topk"):
        foveate(pages / "page0.png", method="nope")
    with pytest.raises(ValueError, match="does not return N tokens"):
        foveate(pages / "page0.png", method="adaptive_budget")
    cells = _grid_cells()
    for bad in (0, cells + 1):
        with pytest.raises(ValueError, match=re.escape(f"budget must be in [1, {cells}] for "
                                                       f"this {SIDE}x{SIDE} page")):
            foveate(pages / "page0.png", budget=bad, method="resize")
    with pytest.raises(ValueError, match="budget must be an int"):
        foveate(pages / "page0.png", budget=True, method="resize")
    with pytest.raises(ValueError, match=f"budget must be {cells}"):
        foveate(pages / "page0.png", budget=10, method="full")
    assert foveate(pages / "page0.png", budget=None, method="full").budget == cells
    with pytest.raises(ValueError, match=r"does not take option\(s\) \['bogus'\]"):
        foveate(pages / "page0.png", budget=10, method="topk", bogus=1)
    with pytest.raises(ValueError, match="reads no score map"):
        foveate(pages / "page0.png", budget=10, method="resize", scorer="saliency")
    with pytest.raises(ValueError, match="unknown scorer"):
        foveate(pages / "page0.png", budget=10, method="topk", scorer="nope")
    with pytest.raises(ValueError, match="question must be a non-empty string"):
        foveate(pages / "page0.png", "  ", budget=10, method="resize")
    with pytest.raises(ValueError, match="cascade: .*tokens"):
        foveate(pages / "page0.png", budget=3, method="cascade")


def test_a_question_the_method_ignores_is_said_once(pages):
    # a first call imports what resize needs; an import that sets a warnings filter resets
    # Python's once-per-place memory, which would make the test depend on the tests before it
    foveate(pages / "page0.png", budget=16, method="resize")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            f = foveate(pages / "page0.png", "What is the total?", budget=16, method="resize")
    said = [w for w in caught if issubclass(w.category, FoveateWarning)]
    assert len(said) == 1 and "'resize' does not read the question" in str(said[0].message)
    assert f.question == "What is the total?" and f.question_used is False
    assert not uses_question("resize") and not uses_question("cascade_prior")
    assert not uses_question("topk", scorer="saliency") and uses_question("topk")
    assert uses_question("cascade") and not uses_question("cascade", localiser="uniform")


def test_default_cascade_reads_the_question_inside_the_budget(pages):
    f = foveate(pages / "page0.png", "What is the date in the header?")
    assert f.method == "cascade" and f.budget == 273 and f.question_used
    assert f.cost.label == "budgeted" and f.cost.total_tokens == 273 and f.cost.scorer == "none"
    assert set(f.tokens.stage[0].tolist()) == {0, 1}
    assert bool(f.tokens.is_distinct()[0])
    assert tuple(f.patches.shape) == (1, 273, 3, 16, 16) and f.view.shape == (3, SIDE, SIDE)


def test_save_foveation_writes_three_files(pages, tmp_path):
    img = load_image(pages / "page1.png")
    f = foveate(img, budget=24, method="random", seed=3)
    paths = save_foveation(f, img, tmp_path, "p")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths.values())
    rec = json.loads(paths["json"].read_text())
    assert rec["options"]["seed"] == 3 and len(rec["tokens"]) == 24
    assert {"x", "y", "cx", "cy", "level", "side", "score", "stage"} == set(rec["tokens"][0])


def test_import_fovea_core_stays_light():
    """``fovea_core.foveate`` is exported lazily: importing the package loads neither the
    entry point nor the allocators; the first use does."""
    code = ("import sys, fovea_core; "
            "assert 'fovea_core.foveate' not in sys.modules; "
            "assert 'fovea_core.allocators' not in sys.modules; "
            "assert 'foveate' in fovea_core.__all__ and callable(fovea_core.foveate); "
            "assert 'fovea_core.foveate' in sys.modules; print('ok')")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_method_summary_names_what_a_registered_cascade_binds():
    from fovea_core.foveate import method_summary

    assert method_summary("cascade_text", width=200).endswith("(localiser=learned, side=text).")
    assert "(localiser=learned_prior)" in method_summary("cascade_prior", width=200)
    assert "localiser" not in method_summary("resize", width=200)
