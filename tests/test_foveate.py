"""``fovea_core.foveate`` (one call) and ``python -m fovea_core foveate`` (the command).

Pages are two synthetic pages of :func:`fovea_book.eval.documents.make_document` scaled to
512 px, so that every test runs in seconds; most use methods without OCR, one the default
learned cascade.
"""

from __future__ import annotations

import json
import math
import os
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
from fovea_core.cost import COST_LABELS
from fovea_core.foveation import (OUTPUT_SUFFIXES, SHARED_OPTION_USERS, FoveateWarning,
                                  Foveation, ImageTooLargeError, foveate, load_image,
                                  method_names, method_summary, run_page, save_foveation,
                                  unused_options, uses_question)
from fovea_core.__main__ import main, output_stems

SIDE = 512
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> Path:
    """A folder of three files: two 512 px synthetic pages (PNG) and a broken ``.png``."""
    from fovea_book.eval.documents import make_document

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
    assert names[0] == "cascade_glance" and "resize" in names and "adaptive_budget" not in names
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
    assert re.search(r"foveate: 1 done, 0 skipped, 0 failed of 1 files .*"
                     r"\(cascade_glance, N = 273\)", captured.out)
    rec = json.loads(_outputs(out, "page0")["json"].read_text())
    assert rec["method"] == "cascade_glance" and rec["question_used"] is True
    assert len(rec["tokens"]) == 273 and rec["cost"]["label"] == "budgeted"
    stages = [t["stage"] for t in rec["tokens"]]
    assert set(stages) <= {0, 1, 2} and 2 in stages           # a glance, then a second look
    assert stages.count(0) > 0.8 * 273                        # the glance: most of N


@pytest.mark.parametrize("argv, message", [
    (["--method", "nope"], r"unknown method 'nope'; registered: cascade_glance, .*resize"),
    (["--budget", "0"], r"--budget must be in \[1, Gh\*Gw\] \(tokens per page; .*\), "
                        r"got 0$"),
])
def test_command_rejects_bad_arguments(pages, tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        main(["foveate", str(pages), "--out", str(out)] + argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert re.search(message, err, re.M) and err.count("\n") == 1, err     # one line
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
    assert (f"budget must be in [1, {_grid_cells()}] for this {SIDE}x{SIDE} page"
            in captured.err)
    assert re.search(r"foveate: 0 done, 0 skipped, 1 failed of 1 files", captured.out)
    assert "Traceback" not in captured.err + captured.out
    assert list(out.iterdir()) == []


def test_a_page_that_fails_while_writing_leaves_no_file(pages, tmp_path, monkeypatch):
    import fovea_core.foveation as fv

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
    assert fovea_core.foveate is foveate and fovea_core.Foveation is Foveation


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
    from fovea_book.eval.sweep import alloc_read_tokens, scorer_tokens

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
    assert {r.label, t.label, fr.label} == set(COST_LABELS)


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
    with pytest.raises(ValueError, match=r"unknown method 'nope'; registered: cascade_glance, .*topk"):
        foveate(pages / "page0.png", method="nope")
    with pytest.raises(ValueError, match="does not return N tokens"):
        foveate(pages / "page0.png", method="adaptive_budget")
    cells = _grid_cells()
    for bad in (0, cells + 1, True, 4.0, "8"):
        with pytest.raises(ValueError, match=re.escape(
                f"budget must be in [1, {cells}] for this {SIDE}x{SIDE} page "
                f"(32x32 patches of 16 px), got {bad!r}")):
            foveate(pages / "page0.png", budget=bad, method="resize")
    assert foveate(pages / "page0.png", budget=np.int64(8), method="resize").budget == 8
    with pytest.raises(ValueError, match=re.escape(f"budget must be in [{cells}, {cells}] "
                                                   "for method 'full', which keeps every")):
        foveate(pages / "page0.png", budget=10, method="full")
    assert foveate(pages / "page0.png", budget=None, method="full").budget == cells
    with pytest.raises(ValueError, match=r"does not take option\(s\) \['bogus'\]"):
        foveate(pages / "page0.png", budget=10, method="topk", bogus=1)
    with pytest.raises(ValueError, match="unknown scorer"):
        foveate(pages / "page0.png", budget=10, method="topk", scorer="nope")
    with pytest.raises(ValueError, match="question must be a non-empty string"):
        foveate(pages / "page0.png", "  ", budget=10, method="resize")
    with pytest.raises(ValueError, match=re.escape(
            f"budget must be in [5, {cells}] for a {SIDE}x{SIDE} page (32x32 patches of "
            "16 px; the cascade needs its gist plus at least one fovea token), got 3")):
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
    assert f.method == "cascade_glance" and f.budget == 273 and f.question_used
    assert f.cost.label == "budgeted" and f.cost.total_tokens == 273 and f.cost.scorer == "none"
    assert set(f.tokens.stage[0].tolist()) <= {0, 1, 2} and 2 in f.tokens.stage[0].tolist()
    assert bool(f.tokens.is_distinct()[0])
    assert tuple(f.patches.shape) == (1, 273, 3, 16, 16) and f.view.shape == (3, SIDE, SIDE)


def test_a_file_and_its_pixels_as_floats_give_the_same_cascade_patches(pages):
    """The cascade reads a page file (decoded as 8-bit integers) and the same page given as
    float values k / 255 identically: the same tokens and bit-identical patches (both are
    summed as the exact 8-bit integers, pyramid.integer_page)."""
    path = pages / "page1.png"
    arr = np.array(Image.open(path))
    as_float = torch.from_numpy(arr).permute(2, 0, 1).float() / 255            # [3, H, W]
    a = foveate(path, "What is the total?", budget=96, method="cascade")
    b = foveate(as_float, "What is the total?", budget=96, method="cascade")
    assert torch.equal(a.tokens.centers, b.tokens.centers)
    assert torch.equal(a.tokens.levels, b.tokens.levels)
    assert torch.equal(a.patches, b.patches)
    # the gist's patches, kept from the cascade's own read, are those a new read gives
    from fovea_core.pyramid import build_pyramid
    from fovea_core.sample import sample
    assert torch.equal(a.patches, sample(build_pyramid(load_image(path)), a.tokens))


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
    entry point (:mod:`fovea_core.foveation`) nor the allocators; the first use does."""
    code = ("import sys, fovea_core; "
            "assert 'fovea_core.foveation' not in sys.modules; "
            "assert 'fovea_core.allocators' not in sys.modules; "
            "assert 'foveate' in fovea_core.__all__ and callable(fovea_core.foveate); "
            "assert 'fovea_core.foveation' in sys.modules; print('ok')")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_method_summary_names_what_a_registered_cascade_binds():
    from fovea_core.foveation import method_summary

    assert method_summary("cascade_text", width=200).endswith("(localiser=learned, side=text).")
    assert "(localiser=learned_prior)" in method_summary("cascade_prior", width=200)
    assert "localiser" not in method_summary("resize", width=200)


# ----------------------------------------------------------------------------- one entry point
def test_the_budget_has_one_check_and_one_message(pages, capsys):
    """foveate, the allocators, the cascade and the command all call
    ``fovea_core.allocators.base.check_budget``: one wording, the range stated."""
    from fovea_core import build_pyramid
    from fovea_core.cascade.allocator import cascade
    from fovea_core.methods import allocate

    img = load_image(pages / "page0.png")
    pyr = build_pyramid(img)
    said = []
    for call in (lambda: foveate(img, budget=0, method="topk"),
                 lambda: allocate("topk", pyr, torch.zeros(1, 32, 32), 0),
                 lambda: cascade(pyr, None, 0, localiser="uniform")):
        with pytest.raises(ValueError) as e:
            call()
        said.append(str(e.value))
    with pytest.raises(SystemExit):
        main(["foveate", str(pages / "page0.png"), "--budget", "0", "--out", "unused"])
    said.append(capsys.readouterr().err.strip())
    cells = _grid_cells()
    assert said[0] == (f"budget must be in [1, {cells}] for this {SIDE}x{SIDE} page "
                       "(32x32 patches of 16 px), got 0")
    assert said[1] == f"topk: budget must be in [1, {cells}] for a 32x32 patch grid, got 0"
    assert said[2].startswith(f"cascade: budget must be in [5, {cells}] for a ")
    assert said[3].endswith("--budget must be in [1, Gh*Gw] (tokens per page; Gh*Gw, "
                            "the page's patch count, is checked per page), got 0")
    assert all(re.search(r"budget must be in \[\d+, (\d+|Gh\*Gw)\]", m) for m in said)


def _warned(call) -> tuple[object, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = call()
    return out, [str(w.message) for w in caught if issubclass(w.category, FoveateWarning)]


def test_an_option_the_method_does_not_use_warns_and_is_not_recorded(pages):
    page = load_image(pages / "page0.png")
    f, said = _warned(lambda: foveate(page, budget=16, method="resize", fixation=(0.2, 0.3),
                                      seed=4, scorer="saliency"))
    assert f.options == {"patch": 16}                     # nothing it did not use
    assert said == [
        "method 'resize' does not use option scorer='saliency' (it reads no score map): it is "
        "ignored and not recorded in Foveation.options",
        "method 'resize' does not use option fixation=(0.2, 0.3) (its tokens do not depend on "
        "it): it is ignored and not recorded in Foveation.options",
        "method 'resize' does not use option seed=4 (its tokens do not depend on it): it is "
        "ignored and not recorded in Foveation.options"]
    assert torch.equal(f.tokens.centers, foveate(page, budget=16, method="resize").tokens.centers)
    # the cascade fixates its own map's peak: a fixation is ignored, and said so
    c, said = _warned(lambda: foveate(page, budget=40, method="cascade_prior",
                                      fixation=(0.1, 0.1)))
    assert "fixation" not in c.options and len(said) == 1
    assert "'cascade_prior' does not use option fixation=(0.1, 0.1) (the cascade fixates" in said[0]
    # a method that reads them records them, silently; the seed as the int it ran with
    lp, said = _warned(lambda: foveate(page, budget=16, method="logpolar", fixation=(0.2, 0.3)))
    assert said == [] and lp.options["fixation"] == (0.2, 0.3)
    r, said = _warned(lambda: foveate(page, budget=16, method="random", seed=np.int64(3)))
    assert said == [] and r.options["seed"] == 3 and type(r.options["seed"]) is int
    assert unused_options("random", seed=1, fixation=None) == ["fixation"]
    assert unused_options("topk", scorer="none") == []


def test_the_table_of_who_reads_fixation_and_seed_matches_every_method():
    """:data:`SHARED_OPTION_USERS` says which methods read ``fixation`` and ``seed``; every
    method is run with two values of each and its tokens compared, so a method that starts
    (or stops) reading one fails here instead of being warned about wrongly."""
    from fovea_book.eval.documents import make_document
    from fovea_core import build_pyramid
    from fovea_core.foveation import _scorer_for
    from fovea_core.importance import score
    from fovea_core.methods import INFO, allocate, allocate_parts

    doc = make_document(0, width=768, height=768)
    pyr = build_pyramid(load_image(np.asarray(Image.fromarray(doc.image).resize(
        (128, 128), Image.LANCZOS))))
    maps = {name: score(name, pyr.base) for name in ("saliency", "none")}
    values = {"fixation": ((0.15, 0.2), (0.85, 0.7)), "seed": (1, 2)}

    def run(name: str, **opt) -> object:        # the allocator with the option, as foveate
        s = maps[_scorer_for(name, None, {})]   # would pass it without the table
        n = 64 if name in ("full", "stratified_8x8") else 32       # full: every cell
        if INFO[name]["family"] == "cascade":
            return allocate_parts(name, pyr, s, n, **opt).tokens
        return allocate(name, pyr, s, n, **opt)

    for name in method_names():
        if name == "cascade_text":                       # the text detector: slow, no seed
            continue
        for opt, (a, b) in values.items():
            if name == "multi_fixation" and opt == "fixation":
                a, b = [[a, (0.5, 0.5)]], [[b, (0.5, 0.5)]]           # [B, k, 2]
            ta, tb = run(name, **{opt: a}), run(name, **{opt: b})
            differ = not (torch.equal(ta.centers, tb.centers) and torch.equal(ta.levels, tb.levels))
            assert differ == (name in SHARED_OPTION_USERS[opt]), (name, opt)


def test_topk_on_the_flat_map_warns_that_its_choice_means_nothing(pages):
    page = load_image(pages / "page0.png")
    f, said = _warned(lambda: foveate(page, budget=32, method="topk", scorer="none"))
    assert len(said) == 1 and said[0].startswith(
        "scorer='none' gives method 'topk' a flat map (all zeros): every patch ties")
    assert "for 'topk' that is the whole choice" in said[0]
    assert f.cost.scorer == "none" and bool((f.tokens.centers[0, :, 1] < 0.05).all())  # top row
    _, said = _warned(lambda: foveate(page, budget=32, method="topk"))
    assert said == []                                       # a real map: nothing to say


# ----------------------------------------------------------------------------- output names
def test_output_names_are_unique_whatever_the_folder_holds():
    P = [Path(n) for n in ("a.jpg", "a.png", "a_png.png")]
    assert output_stems(P) == ["a_jpg", "a_png-2", "a_png"]
    P = [Path(n) for n in ("A.png", "a.jpg", "b", "b.png", "b_png-2.png", "b_png.png", "c.tif")]
    got = output_stems(P)
    assert got == ["A_png", "a_jpg", "b", "b_png-3", "b_png-2", "b_png", "c"]
    assert len({g.casefold() for g in got}) == len(got)


def test_a_folder_with_a_png_a_jpg_and_a_png_png_keeps_all_three_pages(tmp_path, capsys):
    """``a.png`` and ``a.jpg`` became ``a_png`` and ``a_jpg``, and ``a_png.png`` kept
    ``a_png``: two pages wrote the same files and the command said "3 done"."""
    src, out = tmp_path / "pages", tmp_path / "out"
    src.mkdir()
    rng = np.random.default_rng(0)
    for name in ("a.png", "a.jpg", "a_png.png"):
        Image.fromarray((rng.random((64, 96, 3)) * 255).astype(np.uint8)).save(src / name)
    code = main(["foveate", str(src), "--method", "resize", "--budget", "8", "--workers", "1",
                 "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert re.search(r"foveate: 3 done, 0 skipped, 0 failed of 3 files", captured.out)
    records = sorted(out.glob("*.foveation.json"))
    assert len(records) == 3 and len(list(out.iterdir())) == 9
    sources = sorted(Path(json.loads(p.read_text())["source"]).name for p in records)
    assert sources == ["a.jpg", "a.png", "a_png.png"]             # every page, once
    assert json.loads((out / "a_png.foveation.json").read_text())["source"].endswith("a_png.png")
    assert "done a.png -> a_png-2.*" in captured.err


# ----------------------------------------------------------------------------- image files
def test_a_float_tiff_in_0_1_is_read_as_it_is_not_divided_by_255(pages, tmp_path):
    grey = np.asarray(Image.open(pages / "page0.png").convert("L"), dtype=np.float32) / 255
    path = tmp_path / "page.tif"
    Image.fromarray(grey).save(path)                            # mode "F", values in [0, 1]
    assert Image.open(path).mode == "F"
    x = load_image(path)
    np.testing.assert_array_equal(x[0, 0].numpy(), grey)       # not grey / 255 (a black page)
    assert torch.equal(load_image(Image.open(path)), x)
    a, b = foveate(path, budget=64, method="topk"), foveate(grey, budget=64, method="topk")
    assert torch.equal(a.tokens.centers, b.tokens.centers) and torch.equal(a.view, b.view)
    # 0..255 floats still read as 8-bit values; anything else is refused with the ranges
    Image.fromarray(grey * 255).save(tmp_path / "page255.tif")
    np.testing.assert_allclose(load_image(tmp_path / "page255.tif")[0, 0].numpy(), grey,
                               atol=1e-6)
    Image.fromarray(grey * 1000).save(tmp_path / "page1000.tif")
    with pytest.raises(ValueError, match=r"page1000\.tif: a PIL image of mode 'F' must hold "
                                         r"floats in \[0, 1\] \(or 0\.\.255\); got values in"):
        load_image(tmp_path / "page1000.tif")


def test_a_phone_photo_is_turned_upright_by_its_exif_orientation(tmp_path):
    from PIL import ImageOps

    arr = np.full((48, 80, 3), 255, np.uint8)
    arr[:12, :20] = (200, 0, 0)                                 # a red mark, top left as stored
    exif = Image.Exif()
    exif[0x0112] = 6                                            # "rotate 90 degrees to view"
    path = tmp_path / "photo.jpg"
    Image.fromarray(arr).save(path, exif=exif, quality=95)
    x = load_image(path)
    assert tuple(x.shape) == (1, 3, 80, 48)                     # upright: taller than wide
    want = np.asarray(ImageOps.exif_transpose(Image.open(path)), dtype=np.float32) / 255
    np.testing.assert_array_equal(x[0].permute(1, 2, 0).numpy(), want)
    red = (x[0, 0] > 0.6) & (x[0, 1] < 0.3)
    rows, cols = torch.nonzero(red, as_tuple=True)
    assert rows.max() < 25 and cols.min() > 24                  # now top right
    assert torch.equal(load_image(Image.open(path)), x)        # a PIL image: the same
    assert foveate(path, budget=10, method="resize").view.shape == (3, 80, 48)


def _png_header(path: Path, width: int, height: int) -> Path:
    """A PNG whose header declares ``width x height`` (no real pixel data)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
                     + chunk(b"IDAT", zlib.compress(b"\x00")) + chunk(b"IEND", b""))
    return path


def test_a_decompression_bomb_fails_its_page_only(pages, tmp_path, capsys):
    from PIL import Image as PILImage

    src, out = tmp_path / "pages", tmp_path / "out"
    src.mkdir()
    big = _png_header(src / "big.png", 20000, 20000)
    Image.open(pages / "page0.png").resize((64, 64)).save(src / "small.png")
    limit = 2 * PILImage.MAX_IMAGE_PIXELS
    with pytest.raises(ImageTooLargeError, match=re.escape(
            f"image: {big} declares 400,000,000 pixels, more than the limit of {limit:,} "
            "(Pillow's decompression-bomb guard")):
        load_image(big)
    assert issubclass(ImageTooLargeError, ValueError)          # as load_image documents
    code = main(["foveate", str(src), "--method", "resize", "--budget", "8", "--workers", "1",
                 "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 1, captured.err
    assert re.search(r"foveate: 1 done, 0 skipped, 1 failed of 2 files", captured.out)
    assert re.search(r"failed big\.png .*ImageTooLargeError: image: .* declares 400,000,000 "
                     r"pixels", captured.err)
    assert (out / "small.foveation.json").is_file() and not list(out.glob("big*"))


# ----------------------------------------------------------------------------- before any work
@pytest.fixture()
def no_work(monkeypatch):
    """Fail the test if the command foveates any page."""
    import fovea_core.foveation as fv

    monkeypatch.setattr(fv, "run_page", lambda job: pytest.fail(f"worked on {job['path']}"))


def _refused(argv: list[str], capsys) -> list[str]:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.out == ""
    return captured.err.splitlines()


def test_an_out_that_cannot_be_created_is_refused_before_any_work(pages, tmp_path, capsys,
                                                                  no_work):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    out = blocker / "out"
    lines = _refused(["foveate", str(pages), "--method", "resize", "--out", str(out)], capsys)
    assert lines == [f"python -m fovea_core foveate: error: --out {out} cannot be created: "
                     f"{blocker} is not a folder"]
    # the pre-check misses it (say, a race): creating it is the check, still before any work
    import fovea_core.__main__ as cli

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli, "_out_problem", lambda out: "")
        lines = _refused(["foveate", str(pages), "--method", "resize", "--out", str(out)],
                         capsys)
    assert lines[-1] == (f"python -m fovea_core foveate: error: --out {out} cannot be created "
                         "(Not a directory)")               # after the skipped broken.png
    assert sum("error" in line for line in lines) == 1


def test_a_read_only_out_is_refused_before_any_work(pages, tmp_path, capsys, monkeypatch,
                                                    no_work):
    import fovea_core.__main__ as cli

    out = tmp_path / "out"
    out.mkdir()
    real = os.access
    monkeypatch.setattr(cli.os, "access", lambda p, mode: False if Path(p) == out
                        else real(p, mode))
    lines = _refused(["foveate", str(pages), "--method", "resize", "--out", str(out)], capsys)
    assert lines == [f"python -m fovea_core foveate: error: --out {out} is not writable "
                     "(permission denied or a read-only file system)"]
    monkeypatch.undo()
    # and when the permission check passes but writing does not (the probe file)
    monkeypatch.setattr(cli, "_out_problem", lambda out: "")
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refuse)
    lines = _refused(["foveate", str(pages), "--method", "resize", "--out", str(out)], capsys)
    assert lines[-1] == (f"python -m fovea_core foveate: error: --out {out} is not writable "
                         "(Permission denied)")             # after the skipped broken.png
    assert sum("error" in line for line in lines) == 1


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="root writes into a read-only folder")
def test_a_chmod_read_only_out_is_refused_before_any_work(pages, tmp_path, capsys, no_work):
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o555)
    try:
        lines = _refused(["foveate", str(pages), "--method", "resize", "--out", str(out)],
                         capsys)
    finally:
        out.chmod(0o755)
    assert lines == [f"python -m fovea_core foveate: error: --out {out} is not writable "
                     "(permission denied or a read-only file system)"]


def test_unknown_options_are_refused_once_before_any_work(pages, tmp_path, capsys, no_work):
    out = tmp_path / "out"
    lines = _refused(["foveate", str(pages), "--method", "resize", "-o", "bogus=1",
                      "-o", "fixation=(0.5, 0.5)", "--out", str(out)], capsys)
    assert lines == ["python -m fovea_core foveate: error: method 'resize' does not take "
                     "option(s) ['bogus']; it takes: fixation, patch, seed, scorer"]
    assert not out.exists()
    lines = _refused(["foveate", str(pages), "--method", "random", "-o", "seed=1.5",
                      "--out", str(out)], capsys)
    assert lines == ["python -m fovea_core foveate: error: seed must be an int (any integer, "
                     "numpy integers accepted), got 1.5 (float)"]
    # several problems: one line each, all before any work
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    lines = _refused(["foveate", str(pages), "--method", "resize", "-o", "bogus=1",
                      "--budget", "0", "--out", str(blocker / "out")], capsys)
    assert len(lines) == 3 and "'bogus'" in lines[0] and "--budget" in lines[1]
    assert "cannot be created" in lines[2]


def test_the_command_says_an_ignored_option_once(pages, tmp_path, capsys):
    out = tmp_path / "out"
    src = tmp_path / "two"
    src.mkdir()
    for seed in (0, 1):
        Image.open(pages / f"page{seed}.png").resize((64, 64)).save(src / f"p{seed}.png")
    code = main(["foveate", str(src), "--method", "resize", "--budget", "8", "-o",
                 "fixation=(0.5, 0.5)", "--workers", "1", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert err.count("does not use option fixation=(0.5, 0.5)") == 1
    assert all("fixation" not in json.loads(p.read_text())["options"]
               for p in out.glob("*.json"))
