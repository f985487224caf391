"""The page-size benchmark (``python -m fovea_book.bench pages``): its page rule, the per-call
marks, the stock processor's N, the record's schema and round ratios, and the book's helpers
that read the record. Runs on a scratch data root of synthetic pages (no dataset needed)."""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest
from PIL import Image

from fovea_book.bench import common, pages
from fovea_book.bench.__main__ import main as bench_main
from fovea_book.paths import project_root

REAL = project_root() / "data" / "benchmarks"


def _page(path, h, w, *, mode="RGB", seed=0):
    """A synthetic page file: dark strokes on paper, ``h x w`` px."""
    from fovea_book.eval.documents import make_document

    img = Image.fromarray(make_document(seed, layout="receipt").image).resize((w, h))
    path.parent.mkdir(parents=True, exist_ok=True)
    img.convert(mode).save(path)
    return path


@pytest.fixture
def root(tmp_path):
    """A data root with the four datasets the benchmark reads: photos of 0.31 and 0.08 MP,
    scans of 0.02 MP (JPEG) and 0.05 MP (grey PNG)."""
    r = tmp_path / "datasets"
    _page(r / "wildreceipt-dev" / "img" / "000.jpg", 640, 480)
    _page(r / "wildreceipt-unlabelled" / "img" / "0001.jpg", 320, 240, seed=1)
    _page(r / "sroie-dev" / "img" / "000.jpg", 160, 120, seed=2)
    _page(r / "funsd-dev" / "images" / "a.png", 250, 200, mode="L", seed=3)
    return r


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """Scratch stand-ins for data/benchmarks and _build/benchmarks; a quiet load average."""
    data, build = tmp_path / "data", tmp_path / "build"
    data.mkdir()
    build.mkdir()
    monkeypatch.setattr(common, "results_dir", lambda: data)
    monkeypatch.setattr(common, "build_dir", lambda: build)
    monkeypatch.setattr(common, "_load_average", lambda: [0.05, 0.05, 0.05])
    return data, build


@pytest.fixture(autouse=True)
def _committed_records_untouched():
    before = {p.name: p.read_bytes() for p in REAL.glob("*.json")}
    yield
    assert {p.name: p.read_bytes() for p in REAL.glob("*.json")} == before


# ----------------------------------------------------------------------------- the pages
def test_plan_takes_a_real_page_near_the_size_else_resamples_a_real_one(root):
    plans = pages.plan_pages(["photo", "scan"], [0.3, 0.02, 0.5], ["jpeg", "png"], root)
    by = {p.name: p for p in plans}
    assert len(plans) == 12
    real = by["photo-0.3mp-jpeg"]                       # 0.307 MP, within REAL_WITHIN
    assert (real.source, real.file.name, real.size_hw) == ("real", "000.jpg", (640, 480))
    assert "upsampled_from" not in real.info() and "downsampled_from" not in real.info()
    down = by["photo-0.02mp-png"]                       # no real one: the smallest larger, down
    assert (down.source, down.file.name) == ("downsampled", "0001.jpg")
    assert down.size_hw[0] * down.size_hw[1] == pytest.approx(0.02e6, rel=0.02)
    assert down.info()["downsampled_from"].startswith("wildreceipt-unlabelled/0001.jpg (320x240")
    up = by["scan-0.5mp-jpeg"]                          # none larger: the largest, up
    assert (up.source, up.file.name) == ("upsampled", "a.png")
    assert up.info()["upsampled_from"].startswith("funsd-dev/a.png")
    assert up.info()["mp"] == pytest.approx(0.5, rel=0.02)
    assert up.size_hw[0] / up.size_hw[1] == pytest.approx(250 / 200, rel=0.01)
    # 0.02 MP scan: the real JPEG (0.019 MP) for both formats, within REAL_WITHIN
    assert by["scan-0.02mp-png"].source == by["scan-0.02mp-jpeg"].source == "real"


def test_a_missing_dataset_stops_the_run_with_a_message_that_says_how(tmp_path, dirs):
    with pytest.raises(common.BenchError) as exc:
        bench_main(["pages", "--quick", "--data", str(tmp_path / "nowhere")])
    msg = str(exc.value)
    assert "wildreceipt-dev" in msg and "FOVEA_DATA" in msg and "fetch" in msg
    assert not any(dirs[1].iterdir())                   # nothing written


def test_each_call_gets_its_own_page_of_the_same_size(root, tmp_path):
    plan = pages.plan_pages(["photo"], [0.3], ["jpeg"], root)[0]
    files = pages.write_variants(plan, tmp_path, 3)
    imgs = [np.asarray(Image.open(f).convert("RGB"), dtype=np.int16) for f in files]
    assert all(i.shape == (640, 480, 3) for i in imgs)
    s = max(8, 640 // 256)
    corners = [i[:s, :pages.MARK_BITS * s].mean(axis=(0, 2)) for i in imgs]
    for a in range(3):
        for b in range(a + 1, 3):
            assert np.abs(corners[a] - corners[b]).max() > 100     # the bar codes differ
            assert np.abs(imgs[a][s + 8:] - imgs[b][s + 8:]).mean() < 2  # the page does not
    with pytest.raises(ValueError, match="k must be"):
        pages.mark(Image.open(files[0]), 0)


@pytest.mark.parametrize("hw", [(640, 480), (4032, 3024), (1000, 754)])
def test_the_stock_processor_is_set_to_the_count_nearest_n(hw):
    from fovea_core.vlm.positions import merged_grid_shape

    pixels, n = pages.stock_pixels(hw, 273)
    assert abs(n - 273) <= 12
    hm, wm = merged_grid_shape(hw, min_pixels=pixels, max_pixels=pixels)
    assert hm * wm == n
    # no setting in a wide range gets nearer
    for p in range(150_000, 350_000, 1_000):
        a, b = merged_grid_shape(hw, min_pixels=p, max_pixels=p)
        assert abs(a * b - 273) >= abs(n - 273)


# ----------------------------------------------------------------------------- timing
def test_time_rounds_calls_before_ahead_of_every_call_outside_its_time():
    log: list[str] = []
    t = common.time_rounds({"a": lambda: log.append("a"), "b": lambda: log.append("b")},
                           rounds=2, warmup=1, before=lambda k: log.append(f"before {k}"))
    assert log == ["before a", "a", "before b", "b"] * 3
    assert t["a"]["repeats"] == 2


def test_quick_run_writes_a_record_whose_ratios_are_per_round(root, dirs):
    data, build = dirs
    assert bench_main(["pages", "--quick", "--rounds", "2", "--methods", "resize",
                       "--data", str(root)]) == 0
    assert not any(data.iterdir())                      # the committed folder untouched
    rec = json.loads((build / "pages.json").read_text())
    for key in ("hardware", "sources", "args", "load", "budget", "methods", "default_method",
                "rounds", "threads", "stock", "processor", "protocol", "first_call", "pages",
                "targets", "growth"):
        assert key in rec, key
    assert rec["benchmark"] == "pages" and rec["budget"] == 273 and rec["rounds"] == 2
    assert rec["args"]["quick"] is True and rec["threads"]["torch"] == 1
    assert rec["hardware"]["git_commit"] and "fovea_core/foveation.py" in rec["sources"]["files"]
    [page] = rec["pages"]
    assert (page["name"], page["source"], page["format"]) == ("photo-0.3mp-jpeg", "real", "jpeg")
    assert page["size_hw"] == [640, 480] and page["mp"] == pytest.approx(0.3072)
    assert abs(page["stock_tokens"] - 273) <= 12
    paths = {"decode", "stock", "draft", "tokens/resize", "inputs/resize"}
    assert set(page["timings"]) == paths == set(page["warmup_ms"])
    assert set(rec["first_call"]) == paths
    assert set(page["ratios"]) == {"tokens/resize", "inputs/resize"}
    stock = page["timings"]["stock"]["rounds_ms"]
    assert len(stock) == 2
    for name, r in page["ratios"].items():
        t = page["timings"][name]
        # the record keeps each round's milliseconds and the ratios to 4 decimals
        assert t["median_ms"] == pytest.approx(statistics.median(t["rounds_ms"]), abs=1e-4)
        assert r["round_ratios"] == pytest.approx([a / b for a, b in zip(t["rounds_ms"], stock)],
                                                  rel=1e-3, abs=1e-4)
        assert r["median_of_round_ratios"] == pytest.approx(statistics.median(r["round_ratios"]),
                                                            abs=1e-4)
        assert r["rounds"] == 2
    rows = pages.curve_rows(rec)
    assert len(rows) == len(paths)
    assert {r["ratio"] for r in rows if r["series"] == "tokens/resize"} == \
        {page["ratios"]["tokens/resize"]["median_of_round_ratios"]}


def test_bad_arguments_name_the_flag(capsys):
    for argv, flag in ((["--rounds", "0"], "--rounds"), (["--sizes", "-1"], "--sizes"),
                       (["--methods", "nope"], "--methods"), (["--kinds", "x"], "--kinds")):
        with pytest.raises(SystemExit) as exc:
            pages.main(argv)
        assert exc.value.code == 2
        assert flag in capsys.readouterr().err


# ----------------------------------------------------------------------------- for the book
def _fake(mp, ms, stock_ms, decode_ms, kind="photo"):
    timings = {"decode": {"median_ms": decode_ms, "min_ms": decode_ms, "max_ms": decode_ms},
               "stock": {"median_ms": stock_ms, "min_ms": stock_ms, "max_ms": stock_ms}}
    ratios = {}
    for m, t in ms.items():
        timings[f"tokens/{m}"] = {"median_ms": t, "min_ms": t, "max_ms": t}
        ratios[f"tokens/{m}"] = {"median_of_round_ratios": t / stock_ms}
    return {"name": f"{kind}-{mp:g}mp-jpeg", "kind": kind, "format": "jpeg", "target_mp": mp,
            "mp": mp, "timings": timings, "ratios": ratios}


def test_targets_and_growth_are_read_from_the_pages():
    rec = {"default_method": "cascade_glance", "pages": [
        _fake(1.0, {"resize": 100, "cascade": 150, "cascade_glance": 200}, 100, 10),
        _fake(12.0, {"resize": 140, "cascade": 250, "cascade_glance": 600}, 100, 100),
        _fake(20.0, {"resize": 400, "cascade": 300, "cascade_glance": 1000}, 150, 200)]}
    t = pages.targets(rec)["photo"]
    assert t["page"] == "photo-12mp-jpeg"
    assert (t["resize"]["measured"], t["resize"]["met"]) == (pytest.approx(1.4), True)
    assert (t["cascade"]["measured"], t["cascade"]["met"]) == (pytest.approx(2.5), False)
    assert (t["default_s"]["measured"], t["default_s"]["met"]) == (pytest.approx(0.6), False)
    g = pages.growth(rec)["photo-jpeg"]
    assert g["tokens/resize"] == {"time_factor": 4.0, "decode_factor": 20.0, "met": True}
    assert g["stock"]["time_factor"] == 1.5
    assert pages.targets(None) == {} and pages.growth({"pages": []}) == {}
    for p in rec["pages"]:
        p.update(source="real", dataset="wildreceipt-unlabelled", file="0622.jpg")
    words = pages.summary_words(rec)
    assert "`resize` took 1.40 x" in words and "at most 1.5 x: meets it" in words
    assert "`cascade` 2.50 x (target 2 x: misses it)" in words
    assert "`cascade_glance` 0.60 s warm (target 0.5 s: misses it)" in words
    assert pages.summary_words(None).startswith("**No page-size record is committed yet**")


def test_the_curve_has_one_line_per_method_and_the_stock_processor():
    import matplotlib
    matplotlib.use("Agg")
    from fovea_book.plotting import page_cost_figure

    rec = {"pages": [_fake(mp, {"resize": 50 * mp, "cascade": 80 * mp}, 30 * mp, 5 * mp, k)
                     for k in ("photo", "scan") for mp in (1.0, 4.0, 12.0)]}
    fig = page_cost_figure(pages.curve_rows(rec))
    axes = fig.axes
    assert len(axes) == 2
    for ax in axes:
        labels = [ln.get_label() for ln in ax.get_lines()]
        assert labels == ["decode (PIL, full size)", "stock Qwen2VLImageProcessorPil",
                          "resize: file to tokens", "cascade: file to tokens"]
        assert ax.get_xscale() == ax.get_yscale() == "log"
        assert list(ax.get_lines()[2].get_xdata()) == [1.0, 4.0, 12.0]
    empty = page_cost_figure([])
    assert "no page-size benchmark record" in empty.axes[0].texts[0].get_text()
