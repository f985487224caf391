"""Bad input gets a clear error, never a silent wrong result.

One table, one row per bad input to the public API: the call, the exception type it must
raise and the argument its message must name (as a whole word). Every row was checked to
fail before its fix (the bad-input review reproduced them), and each row fails
again if the check it exercises is removed, because the call then either succeeds or dies
with an unrelated error or message. Where a later check would name the same argument (the
allocators' NaN/inf scores also reach ``fixation_from_scores``), the row also carries a
regex of the message of its own check.

Rows for files other owners maintain expect ``ValueError`` naming the argument; a row that
does not pass yet is listed in ``PENDING_LEAD`` and marked ``xfail(strict=True)``, so it turns
into a failure the moment the fix lands and the mark must be removed (empty today).
"""

from __future__ import annotations

import atexit
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fovea_core import build_pyramid
from fovea_core.methods import ALLOCATORS, INFO, allocate
from fovea_core.allocators.base import check_budget, check_seed, image_rand, resolve_fixation
from fovea_book.biology import cortex as C
from fovea_core.cascade.allocator import budget_range, cascade, cascade_parts
from fovea_core.cascade.core import gist
from fovea_core.cascade.localisers import uniform
from fovea_book.biology import psychophysics as P
from fovea_book.biology import retina as R
from fovea_book.eval.density import token_density
from fovea_book.eval import metrics as M
from fovea_book.eval.documents import synthetic_documents
from fovea_book.eval.reader import Reader, crop_box
from fovea_book.eval.sroie import load_sroie, match_field
from fovea_book.eval.sweep import run_sweep
from fovea_core.foveation import foveate, load_image
from fovea_core.importance import center_bias, fixation_from_scores, score, spectral_residual
from fovea_core.importance.query import query_scores
from fovea_core.importance.text import read_text
from fovea_book.logpolar import logpolar_lut, to_logpolar
from fovea_core.pyramid import Pyramid, as_image_batch
from fovea_core.sample import render, sample
from fovea_core.tokens import TokenSet
from fovea_core.vlm.positions import mrope_positions, rope2d_angles

# ----------------------------------------------------------------------------- fixtures
IMG = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
PYR = build_pyramid(IMG)                       # 64 x 64, 16 px patches: a 4 x 4 grid, 3 levels
SC = torch.rand(1, 4, 4, generator=torch.Generator().manual_seed(1))
TS = allocate("topk", PYR, SC, 4)              # 4 level-0 tokens
PATCHES = sample(PYR, TS)                      # [1, 4, 3, 16, 16]
NP_RGB = (np.random.default_rng(0).random((40, 48, 3)) * 255).astype(np.uint8)
CPYR = build_pyramid(torch.rand(1, 3, 128, 128, generator=torch.Generator().manual_seed(3)))


RECEIPT_BOX = "0,0,90,0,90,20,0,20,SHOP SDN BHD\n0,30,90,30,90,50,0,50,TOTAL 9.00\n"
RECEIPT_KEY = '{"company": "SHOP SDN BHD", "total": "9.00"}'


def sroie_dir(stems=("000",), *, key: str = RECEIPT_KEY, box: str | None = RECEIPT_BOX,
              img: bool = True) -> Path:
    """A fresh SROIE folder (``img/ box/ key/``) with one small receipt per stem; ``box=None``
    leaves the box files out, ``img=False`` the images."""
    import cv2

    root = Path(tempfile.mkdtemp(prefix="sroie_"))
    atexit.register(shutil.rmtree, root, True)
    for sub in ("img", "box", "key"):
        (root / sub).mkdir()
    for stem in stems:
        (root / "key" / f"{stem}.json").write_text(key, encoding="utf-8")
        if box is not None:
            (root / "box" / f"{stem}.csv").write_text(box, encoding="utf-8")
        if img:
            cv2.imwrite(str(root / "img" / f"{stem}.jpg"), np.full((60, 100, 3), 255, np.uint8))
    return root


def _closed_pil(load: bool = False):
    """A closed PIL image: used after its ``with Image.open(...)`` block (never read), or
    (``load``) read and then closed with ``img.close()``."""
    from PIL import Image

    path = Path(tempfile.mkdtemp(prefix="closed_")) / "page.png"
    atexit.register(shutil.rmtree, path.parent, True)
    Image.fromarray(NP_RGB).save(path)
    with Image.open(path) as img:
        if load:
            img.load()
    if load:
        img.close()
    return img


def _pil_f(value: float):
    """A 32-bit float PIL image (mode ``"F"``) of ramp 0..``value``."""
    from PIL import Image

    arr = np.linspace(0, 1, 32 * 32, dtype=np.float32).reshape(32, 32) * np.float32(value)
    if value != value:                                   # NaN: one NaN pixel in a ramp
        arr = np.linspace(0, 1, 32 * 32, dtype=np.float32).reshape(32, 32)
        arr[3, 3] = np.nan
    return Image.fromarray(arr)                        # float32 [H, W]: mode "F"


def _pil_i(low: int):
    """A 32-bit integer PIL image (mode ``"I"``) whose smallest value is ``low``."""
    from PIL import Image

    return Image.fromarray(np.full((32, 32), low, dtype=np.int32))   # int32: mode "I"


def tokens(**over) -> TokenSet:
    """TS with some fields replaced (levels, scores, centers ...)."""
    f = dict(centers=TS.centers, levels=TS.levels, scores=TS.scores, fixations=TS.fixations,
             image_size=TS.image_size, patch=TS.patch)
    f.update(over)
    return TokenSet(**f)


def nan_at(x: torch.Tensor, value: float = float("nan")) -> torch.Tensor:
    y = x.clone()
    y.view(-1)[0] = value
    return y


# ----------------------------------------------------------------------------- the table
# (id, call, exception type, the argument the message must name[, a regex of the message of
# the check the row exercises, where a later check would also name the argument])
CASES = [
    # --- image input (fovea_core.pyramid.as_image_batch / build_pyramid)
    ("image RGBA numpy", lambda: build_pyramid(np.zeros((32, 32, 4), np.uint8)), ValueError, "image"),
    ("image 2-channel numpy", lambda: as_image_batch(np.zeros((32, 32, 2), np.float32)), ValueError, "image"),
    ("image float 0..255", lambda: build_pyramid(NP_RGB.astype(np.float32)), ValueError, "image"),
    ("image uint16", lambda: build_pyramid(NP_RGB.astype(np.uint16) * 257), ValueError, "image"),
    ("image int64 tensor", lambda: as_image_batch(torch.zeros(3, 32, 32, dtype=torch.int64)), ValueError, "image"),
    ("image bool numpy", lambda: as_image_batch(np.zeros((32, 32), bool)), ValueError, "image"),
    ("image NaN", lambda: build_pyramid(nan_at(IMG)), ValueError, "image"),
    ("image inf numpy", lambda: as_image_batch(np.full((32, 32, 3), np.inf, np.float32)), ValueError, "image"),
    ("image negative float", lambda: as_image_batch(IMG - 0.5), ValueError, "image"),
    ("image CHW numpy", lambda: build_pyramid(np.zeros((3, 40, 48), np.float32)), ValueError, "image"),
    ("image HWC torch", lambda: build_pyramid(torch.rand(40, 48, 3)), ValueError, "image"),
    ("image empty batch", lambda: build_pyramid(np.zeros((0, 32, 32, 3), np.uint8)), ValueError, "image"),
    ("image zero width", lambda: as_image_batch(torch.zeros(1, 3, 32, 0)), ValueError, "image"),
    ("image 5-D", lambda: as_image_batch(torch.zeros(1, 1, 3, 8, 8)), ValueError, "image"),
    ("image list", lambda: build_pyramid([[0.0, 1.0]]), TypeError, "image"),
    ("num_levels too large", lambda: build_pyramid(IMG, num_levels=9), ValueError, "num_levels"),
    ("num_levels zero", lambda: build_pyramid(IMG, num_levels=0), ValueError, "num_levels"),
    ("num_levels float", lambda: build_pyramid(IMG, num_levels=2.5), ValueError, "num_levels"),
    ("build_pyramid patch 0", lambda: build_pyramid(IMG, patch=0), ValueError, "patch", "patch must be a positive int"),
    ("build_pyramid patch negative", lambda: build_pyramid(IMG, patch=-16), ValueError, "patch", "patch must be a positive int"),
    ("pyramid no levels", lambda: Pyramid(()), ValueError, "Pyramid"),
    # --- importance scorers
    ("scorer unknown", lambda: score("nope", IMG), ValueError, "scorer"),
    ("scorer patch 0", lambda: score("edge_density", IMG, patch=0), ValueError, "patch"),
    ("scorer patch bool", lambda: score("edge_density", IMG, patch=True), ValueError, "patch"),
    ("scorer image smaller than patch", lambda: score("center_bias", torch.rand(1, 3, 8, 64)), ValueError, "image"),
    ("scorer RGBA tensor", lambda: score("edge_density", torch.rand(1, 4, 32, 32)), ValueError, "image"),
    ("scorer NaN image", lambda: score("saliency", nan_at(IMG)), ValueError, "image"),
    ("scorer query missing", lambda: score("query", IMG), ValueError, "query"),
    ("scorer query blank", lambda: score("query", IMG, query="  "), ValueError, "query"),
    ("query coarse_level", lambda: query_scores(IMG, "total", coarse_level=-1), ValueError, "coarse_level"),
    ("spectral_residual size", lambda: spectral_residual(IMG, size=4), ValueError, "size"),
    ("center_bias sigma", lambda: center_bias(IMG, sigma=0.0), ValueError, "sigma"),
    ("center_bias NaN nu", lambda: center_bias(IMG, nu=float("nan")), ValueError, "nu"),
    ("spectral_residual NaN sigma", lambda: spectral_residual(IMG, sigma=float("nan")), ValueError, "sigma"),
    ("spectral_residual float size", lambda: spectral_residual(IMG, size=64.5), ValueError, "size"),
    ("query min_conf", lambda: query_scores(IMG, "total", min_conf=1.5), ValueError, "min_conf"),
    ("read_text float image", lambda: read_text(np.zeros((8, 8, 3), np.float32)), ValueError, "image_bgr"),
    ("fixation_from_scores NaN", lambda: fixation_from_scores(nan_at(SC)), ValueError, "scores"),
    ("fixation_from_scores 2-D", lambda: fixation_from_scores(SC[0]), ValueError, "scores"),
    # --- allocators (shared checks; every registered name is also swept below)
    ("allocate unknown", lambda: allocate("nope", PYR, SC, 4), ValueError, "allocator"),
    ("allocate NaN scores", lambda: allocate("topk", PYR, nan_at(SC), 4), ValueError, "scores", r"^topk: scores contain NaN \(1 cells\); importance maps must be finite"),
    ("allocate inf scores", lambda: allocate("topk", PYR, nan_at(SC, float("inf")), 4), ValueError, "scores", r"^topk: scores contain \+-inf; importance maps must be finite"),
    ("allocate None scores", lambda: allocate("topk", PYR, None, 4), ValueError, "scores", "None is only accepted"),
    ("allocate string scores", lambda: allocate("topk", PYR, "saliency", 4), ValueError, "scores", "numeric tensor or array"),
    ("allocate wrong grid", lambda: allocate("topk", PYR, torch.rand(1, 8, 8), 4), ValueError, "scores"),
    ("allocate float budget", lambda: allocate("topk", PYR, SC, 4.5), ValueError, "budget"),
    ("allocate bool budget", lambda: allocate("topk", PYR, SC, True), ValueError, "budget"),
    ("allocate budget 0", lambda: allocate("topk", PYR, SC, 0), ValueError, "budget"),
    ("allocate budget > grid", lambda: allocate("topk", PYR, SC, 17), ValueError, "budget"),
    ("allocate tensor as pyramid", lambda: allocate("topk", IMG, SC, 4), TypeError, "pyramid"),
    ("allocate NaN fixation", lambda: allocate("topk", PYR, SC, 4, fixation=(float("nan"), 0.5)), ValueError, "fixation"),
    ("allocate fixation out of [0, 1]", lambda: allocate("logpolar", PYR, SC, 4, fixation=(1.5, 0.5)), ValueError, "fixation"),
    ("allocate fixation wrong shape", lambda: allocate("topk", PYR, SC, 4, fixation=(0.1, 0.2, 0.3)), ValueError, "fixation"),
    ("allocate fixation string", lambda: allocate("topk", PYR, SC, 4, fixation="centre"), ValueError, "fixation"),
    ("registry variant override", lambda: allocate("stratified_8x8", build_pyramid(torch.rand(1, 3, 256, 256)), torch.rand(1, 16, 16), 100, strata=2), ValueError, "strata"),
    ("v1_cortical float budget", lambda: allocate("v1_cortical", PYR, SC, 4.0), ValueError, "budget"),
    ("v1_cortical NaN scores", lambda: allocate("v1_cortical", PYR, nan_at(SC), 4), ValueError, "scores"),
    ("v1_cortical wrong grid", lambda: allocate("v1_cortical", PYR, torch.rand(1, 8, 8), 4), ValueError, "scores"),
    ("v1_cortical NaN fixation", lambda: allocate("v1_cortical", PYR, SC, 4, fixation=(0.5, float("nan"))), ValueError, "fixation"),
    ("multi_fixation NaN fixation", lambda: allocate("multi_fixation", PYR, SC, 4, fixation=torch.full((1, 2, 2), float("nan"))), ValueError, "fixation"),
    # --- the cascade (fovea_core.cascade.allocator; the uniform localiser: no model needed)
    ("cascade legible_px 0", lambda: cascade(CPYR, None, 40, localiser=uniform, legible_px=0), ValueError, "legible_px", "legible_px must be a finite number > 0"),
    ("cascade level string", lambda: cascade(CPYR, None, 40, localiser=uniform, level="fine"), ValueError, "level", "level must be 'auto' or a finite number"),
    ("cascade negative context", lambda: cascade(CPYR, None, 40, localiser=uniform, context=(-1, 2)), ValueError, "context", "context must be \\(rows, cols\\)"),
    ("cascade query not a str", lambda: cascade(CPYR, None, 40, localiser=uniform, query=123), TypeError, "query", "query must be a str or None"),
    ("cascade gist_budget 0", lambda: cascade(CPYR, None, 40, localiser=uniform, gist_budget=0), ValueError, "gist_budget", "gist_budget must be None or an int"),
    ("cascade NaN context_weight", lambda: cascade(CPYR, None, 40, localiser=uniform, context_weight=float("nan")), ValueError, "context_weight", "context_weight must be a number in \\[0, 1\\]"),
    ("cascade fixation outside", lambda: allocate("cascade_gist_query", CPYR, None, 40, fixation=(2, 2)), ValueError, "fixation", "fixation must be finite"),
    ("cascade float budget", lambda: cascade(CPYR, None, 40.0, localiser=uniform), ValueError, "budget", r"budget must be in \[5, 64\] .*, got 40\.0 \(float; an int is needed"),
    ("cascade localiser all NaN", lambda: cascade(CPYR, None, 40, localiser=lambda g, q: torch.full((1, 8, 8), float("nan"))), ValueError, "localiser", "no usable mass"),
    ("cascade budget below its gist", lambda: cascade(CPYR, None, 4, localiser=uniform), ValueError, "budget", r"^cascade: budget must be in \[5, 64\] for a 128x128 page \(8x8 patches of 16 px; the cascade needs its gist plus at least one fovea token\), got 4$"),
    ("cascade budget above the page", lambda: cascade(CPYR, None, 65, localiser=uniform), ValueError, "budget", r"budget must be in \[5, 64\]"),
    ("cascade page of one patch", lambda: cascade(build_pyramid(torch.rand(1, 3, 16, 16)), None, 1, localiser=uniform), ValueError, "budget", r"^cascade: no budget fits for a 16x16 page \(1x1 patches .*the page cannot hold them"),
    ("cascade gist_budget too big for the page", lambda: cascade(CPYR, None, 64, localiser=uniform, gist_budget=64), ValueError, "budget", r"no budget fits .*gist_budget=64.*smaller gist_budget"),
    ("cascade gist of another page", lambda: cascade_parts(CPYR, 40, localiser=uniform, gist_budget=16, gist_obj=gist(build_pyramid(torch.zeros(1, 3, 128, 128)), 16)), ValueError, "gist_obj", "gist of another page"),
    ("cascade_parts surround 1", lambda: cascade_parts(CPYR, 40, localiser=uniform, surround=1.0), ValueError, "surround", "surround must be in"),
    # --- the one budget and seed checks (fovea_core.allocators.base)
    ("check_budget numpy float", lambda: check_budget(np.float64(4), 16), ValueError, "budget", r"^budget must be in \[1, 16\], got np\.float64\(4\.0\) \(float64; an int is needed, numpy integers accepted\)$"),
    ("check_budget unknown top", lambda: check_budget(0, None, arg="--budget"), ValueError, "--budget", r"^--budget must be in \[1, Gh\*Gw\], got 0$"),
    ("allocate budget message", lambda: allocate("topk", PYR, SC, 17), ValueError, "budget", r"^topk: budget must be in \[1, 16\] for a 4x4 patch grid, got 17$"),
    ("seed float", lambda: check_seed(1.5), ValueError, "seed", r"seed must be an int \(any integer"),
    ("seed bool", lambda: check_seed(True), ValueError, "seed", r"got True \(bool\)"),
    ("seed string", lambda: check_seed("abc"), ValueError, "seed", r"got 'abc' \(str\)"),
    ("random seed float", lambda: allocate("random", PYR, SC, 4, seed=1.5), ValueError, "seed", r"^random: seed must be an int"),
    ("image_rand seed string", lambda: image_rand(SC, "3"), ValueError, "seed", r"seed must be an int"),
    # --- foveate() and load_image() (fovea_core.foveation)
    ("foveate seed float", lambda: foveate(IMG, budget=4, method="random", seed=1.5), ValueError, "seed", r"got 1\.5 \(float\)"),
    ("foveate seed bool", lambda: foveate(IMG, budget=4, method="random", seed=True), ValueError, "seed", r"got True \(bool\)"),
    ("foveate seed string", lambda: foveate(IMG, budget=4, method="random", seed="abc"), ValueError, "seed", r"got 'abc' \(str\)"),
    ("foveate seed float, method without seed", lambda: foveate(IMG, budget=4, method="resize", seed=0.5), ValueError, "seed", r"seed must be an int"),
    ("foveate scorer list", lambda: foveate(IMG, budget=4, method="topk", scorer=["saliency"]), TypeError, "scorer", r"^scorer must be a str, one of \[.*'saliency'.*\], or None; got \['saliency'\] \(list\)$"),
    ("foveate scorer unknown", lambda: foveate(IMG, budget=4, method="topk", scorer="salience"), ValueError, "scorer", r"unknown scorer 'salience'"),
    ("foveate query option", lambda: foveate(IMG, budget=4, method="topk", query="total"), ValueError, "query", r"pass the question as foveate's `question`"),
    ("foveate page below a patch", lambda: foveate(torch.rand(1, 3, 1, 1), budget=1, method="resize"), ValueError, "image", r"^image: a 1x1 page is smaller than one patch \(16 px\)"),
    ("foveate page below a patch, budget 2", lambda: foveate(torch.rand(1, 3, 1, 1), budget=2, method="resize"), ValueError, "image", r"^image: a 1x1 page is smaller"),
    ("foveate cascade, page of one patch", lambda: foveate(torch.rand(1, 3, 16, 16), budget=1, method="cascade_prior"), ValueError, "budget", r"^no budget fits for a 16x16 page \(1x1 patches of 16 px; the cascade needs its gist plus at least one fovea token\): the page cannot hold them"),
    ("foveate cascade budget below its gist", lambda: foveate(IMG, budget=4, method="cascade_prior"), ValueError, "budget", r"budget must be in \[5, 16\] for a 64x64 page"),
    ("foveate full budget", lambda: foveate(IMG, budget=4, method="full"), ValueError, "budget", r"^budget must be in \[16, 16\] for method 'full'"),
    ("image meta tensor", lambda: load_image(torch.empty(3, 32, 32, device="meta")), ValueError, "image", r"^image: a tensor on the meta device"),
    ("image sparse tensor", lambda: load_image(torch.rand(3, 32, 32).to_sparse()), ValueError, "image", r"^image: a sparse tensor \(layout torch\.sparse_coo\)"),
    ("image closed PIL", lambda: load_image(_closed_pil()), ValueError, "image", r"^image: the PIL image cannot be read \(AssertionError\); it is probably closed"),
    ("image closed PIL, loaded first", lambda: load_image(_closed_pil(load=True)), ValueError, "image", r"^image: the PIL image cannot be read \(ValueError: Operation on closed image\); it is probably closed"),
    ("image float PIL out of range", lambda: load_image(_pil_f(300.0)), ValueError, "image", r"mode 'F' must hold floats in \[0, 1\] \(or 0\.\.255\); got values in \[0, 300\]"),
    ("image float PIL NaN", lambda: load_image(_pil_f(float("nan"))), ValueError, "image", r"mode 'F' contains NaN or inf"),
    ("image 32-bit int PIL negative", lambda: load_image(_pil_i(-5)), ValueError, "image", r"mode 'I' must hold integers in 0\.\.255 \(8-bit\) or 0\.\.65535"),
    # --- TokenSet (lead: float levels)
    ("TokenSet NaN level", lambda: tokens(levels=nan_at(TS.levels.float())), ValueError, "levels"),
    ("TokenSet inf level", lambda: tokens(levels=nan_at(TS.levels.float(), float("inf"))), ValueError, "levels"),
    ("TokenSet negative level", lambda: tokens(levels=TS.levels - 1), ValueError, "levels"),
    ("TokenSet inf score", lambda: tokens(scores=nan_at(TS.scores, float("inf"))), ValueError, "scores"),
    ("TokenSet NaN score", lambda: tokens(scores=nan_at(TS.scores)), ValueError, "scores"),
    ("TokenSet centre outside", lambda: tokens(centers=TS.centers + 1), ValueError, "centers"),
    # --- sample / render (lead: new render)
    ("sample level beyond pyramid", lambda: sample(PYR, tokens(levels=TS.levels + 5)), ValueError, "levels"),
    ("sample batch mismatch", lambda: sample(build_pyramid(torch.rand(2, 3, 64, 64)), TS), ValueError, "pyramid"),
    ("render size (0, 0)", lambda: render(TS, PATCHES, size=(0, 0)), ValueError, "size"),
    ("render negative size", lambda: render(TS, PATCHES, size=(-8, 64)), ValueError, "size"),
    ("render patch mismatch", lambda: render(TS, PATCHES[..., :8, :8]), ValueError, "patches"),
    ("render patches not 5-D", lambda: render(TS, PATCHES[0]), ValueError, "patches"),
    ("render level beyond pyramid", lambda: render(tokens(levels=TS.levels + 5), PATCHES, background=PYR), ValueError, "levels"),
    ("render background shape", lambda: render(TS, PATCHES, background=torch.rand(2, 3, 8, 8)), ValueError, "background"),
    # --- density, positions
    ("density size 0", lambda: token_density(TS, (0, 4)), ValueError, "size"),
    ("density kernel", lambda: token_density(TS, kernel="triangle"), ValueError, "kernel"),
    ("density NaN weights", lambda: token_density(TS, weights=torch.full((1, 4), float("nan"))), ValueError, "weights"),
    ("mrope grid 0", lambda: mrope_positions(TS, (0, 3)), ValueError, "grid_hw"),
    ("mrope text_before", lambda: mrope_positions(TS, (4, 4), text_before=-1), ValueError, "text_before"),
    ("rope2d dim", lambda: rope2d_angles(TS, 6), ValueError, "dim"),
    # --- evaluation: sweep, metrics, reader
    ("sweep backend", lambda: run_sweep(["topk"], [64], {"syn": synthetic_documents(1, seed=0)}, backend="spark", reader=Reader(cache_dir=None)), ValueError, "backend"),
    ("sweep budgets", lambda: run_sweep(["topk"], [0], {"syn": synthetic_documents(1, seed=0)}, reader=Reader(cache_dir=None)), ValueError, "budgets"),
    ("anls answers empty", lambda: M.anls("a", []), ValueError, "answers"),
    ("anls tau", lambda: M.anls("a", ["a"], tau=0.0), ValueError, "tau"),
    ("bootstrap ci", lambda: M.bootstrap_ci([1.0, 2.0], ci=1.5), ValueError, "ci"),
    ("bootstrap n_boot", lambda: M.bootstrap_ci([1.0, 2.0], n_boot=10), ValueError, "n_boot"),
    ("bootstrap 3-D values", lambda: M.bootstrap_ci(np.zeros((2, 2, 2))), ValueError, "values"),
    ("reader engine", lambda: Reader("easyocr", cache_dir=None), ValueError, "engine"),
    ("reader inverted box", lambda: crop_box(NP_RGB, (10, 10, 5, 20)), ValueError, "box"),
    ("sroie corrupt key JSON", lambda: load_sroie(sroie_dir(key='{"company": ')), ValueError, "000.json", "is not valid JSON"),
    ("sroie key JSON a list", lambda: load_sroie(sroie_dir(key='["SHOP"]')), ValueError, "000.json", "must hold a JSON object"),
    ("sroie limit string", lambda: load_sroie(sroie_dir(), limit="5"), ValueError, "limit", "limit must be a non-negative int"),
    ("sroie max_nl negative", lambda: load_sroie(sroie_dir(), max_nl=-1), ValueError, "max_nl", r"max_nl must be a number in \[0, 1\]"),
    ("match_field max_nl negative", lambda: match_field("TOTAL", [((0, 0, 9, 9), "TOTAL")], max_nl=-1), ValueError, "max_nl", r"max_nl must be a number in \[0, 1\]"),
    ("match_field max_nl NaN", lambda: match_field("TOTAL", [((0, 0, 9, 9), "TOTAL")], max_nl=float("nan")), ValueError, "max_nl", r"max_nl must be a number in \[0, 1\]"),
    # --- log-polar
    ("logpolar radius", lambda: logpolar_lut((10, 10), (8, 8), 0.5), ValueError, "max_radius"),
    ("logpolar out_size", lambda: logpolar_lut((10, 10), (0, 8), 20), ValueError, "out_size"),
    ("logpolar center outside", lambda: to_logpolar(IMG, (100, 10), 20, (8, 8)), ValueError, "center"),
    # --- biology
    ("eccentricity negative", lambda: R.cone_density(-1.0), ValueError, "ecc_deg"),
    ("eccentricity NaN", lambda: C.magnification(np.nan), ValueError, "ecc_deg"),
    ("eccentricity beyond Watson's fit", lambda: R.midget_rf_density(120.0), ValueError, "ecc_deg"),
    ("meridian", lambda: R.rgc_density(1.0, "left"), ValueError, "meridian"),
    ("cone_density per", lambda: R.cone_density(1.0, per="mm"), ValueError, "per"),
    ("cone_density_xy NaN", lambda: R.cone_density_xy_mm(np.nan, 0.0), ValueError, "x_mm"),
    ("density_xy inf", lambda: R.density_xy(np.inf, 0.0), ValueError, "x_deg"),
    ("spacing density 0", lambda: R.spacing_from_density(0.0), ValueError, "density"),
    ("count_in_disc radius", lambda: R.count_in_disc(R.density_xy, np.nan), ValueError, "radius"),
    ("magnification e0", lambda: C.magnification(1.0, e0=0.0), ValueError, "e0"),
    ("cortical_area hemifields", lambda: C.cortical_area(1.0, hemifields=3), ValueError, "hemifields"),
    ("complex_log_map left field", lambda: C.complex_log_map(-1 + 0j), ValueError, "z_deg"),
    ("cortical_grid float n_u", lambda: C.cortical_grid(10.0, 2.5, 3), ValueError, "n_u"),
    ("band_budget float budget", lambda: C.band_budget([0, 1, 2], 10.5), ValueError, "budget"),
    ("band_budget NaN budget", lambda: C.band_budget([0, 1, 2], np.nan), ValueError, "budget"),
    ("band_budget edges", lambda: C.band_budget([0, 5, 2], 10), ValueError, "edges_deg"),
    ("band_budget coverage", lambda: C.band_budget([0, 1, 2], 10, coverage=[1.0, 2.0]), ValueError, "coverage"),
    ("band_weights model", lambda: C.band_weights([0, 1], model="area"), ValueError, "model"),
    ("annulus_coverage NaN fixation", lambda: C.annulus_coverage([0, 1], 5, 5, fixation_deg=(np.nan, 0)), ValueError, "fixation_deg"),
    ("annulus_coverage samples", lambda: C.annulus_coverage([0, 1], 5, 5, samples=1), ValueError, "samples"),
    ("largest_remainder total NaN", lambda: C.largest_remainder([1, 2], np.nan), ValueError, "total"),
    ("largest_remainder all zero", lambda: C.largest_remainder([0, 0], 3), ValueError, "weights"),
    ("hamilton NaN weights", lambda: C.hamilton([1.0, np.nan], 3), ValueError, "weights"),
    ("hamilton minimum", lambda: C.hamilton([1.0, 2.0], 3, minimum=-1), ValueError, "minimum"),
    ("pRF slope negative", lambda: P.prf_sigma(1.0, slope=-0.1), ValueError, "slope"),
    ("pooling scaling negative", lambda: P.pooling_diameter(1.0, scaling=-0.46), ValueError, "scaling"),
    ("acuity e2 NaN", lambda: P.acuity_size(1.0, e2=np.nan), ValueError, "e2"),
    ("mip fov_deg", lambda: P.mip_level_for_eccentricity(1.0, fov_deg=0, image_px=512), ValueError, "fov_deg"),
    ("mip rf", lambda: P.mip_level_for_eccentricity(1.0, fov_deg=40, image_px=512, rf="x"), ValueError, "rf"),
    ("mip max_level", lambda: P.mip_level_for_eccentricity(1.0, fov_deg=40, image_px=512, max_level=-1), ValueError, "max_level"),
    ("mip eccentricity off the image", lambda: P.mip_level_for_eccentricity(100.0, fov_deg=40, image_px=512), ValueError, "ecc_deg"),
    ("max_mip_level patch", lambda: P.max_mip_level(100, 0), ValueError, "patch"),
    ("pixels_per_degree image_px", lambda: P.pixels_per_degree(40.0, 10.5), ValueError, "image_px"),
    ("pixel_eccentricity NaN", lambda: P.pixel_eccentricity([np.nan, 0], [0, 0], fov_deg=10, image_px=100), ValueError, "xy_px"),
]

# rows that wait for another owner's fix (marked strict xfail: they fail once fixed);
# the lead's tokens.py/sample.py rows all pass since the float-levels merge
PENDING_LEAD: set[str] = set()


def _param(row):
    marks = [pytest.mark.xfail(strict=True, reason="lead's tokens.py/sample.py rewrite")] \
        if row[0] in PENDING_LEAD else []
    call, exc, arg, *match = row[1:]
    return pytest.param(call, exc, arg, match[0] if match else None, id=row[0], marks=marks)


def test_fractional_levels_are_kept_not_truncated():
    # a TokenSet used to cast levels to int64 (0.5 -> 0, silently); levels are float now
    ts = tokens(levels=torch.full((1, 4), 0.5))
    assert ts.levels.dtype.is_floating_point and torch.all(ts.levels == 0.5)


def test_table_is_large_and_ids_unique():
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 30
    assert PENDING_LEAD <= set(ids)


@pytest.mark.parametrize("call, exc, arg, match", [_param(c) for c in CASES])
def test_bad_input_raises_naming_the_argument(call, exc, arg, match):
    with pytest.raises(exc) as info:
        call()
    assert type(info.value) is exc, f"{type(info.value).__name__}: {info.value}"
    assert re.search(rf"(?<![A-Za-z0-9_]){re.escape(arg)}(?![A-Za-z0-9_])", str(info.value)), \
        f"message does not name {arg!r}: {info.value}"
    if match is not None:           # the message of the check this row exercises
        assert re.search(match, str(info.value)), f"not the check {match!r}: {info.value}"


# ----------------------------------------------------------------------------- every allocator
FIXED = sorted(n for n in ALLOCATORS if INFO[n]["kind"] == "fixed" and n != "full")


@pytest.mark.parametrize("name", FIXED)
@pytest.mark.parametrize("bad, arg", [
    (lambda: (nan_at(SC), 4), "scores"),
    (lambda: (torch.rand(1, 3, 5), 4), "scores"),
    (lambda: (SC, 4.0), "budget"),
    (lambda: (SC, 10_000), "budget"),
], ids=["NaN scores", "wrong grid", "float budget", "budget too large"])
def test_every_allocator_runs_the_shared_checks(name, bad, arg):
    scores, budget = bad()
    with pytest.raises(ValueError, match=rf"\b{arg}\b"):
        allocate(name, PYR, scores, budget)


# ----------------------------------------------------------------------------- one fixation rule
def _off_centre_scores() -> torch.Tensor:
    """A 16 x 16 map whose raw argmax (one noisy cell) and smoothed peak (a coherent blob)
    differ: an allocator with its own argmax fixates elsewhere."""
    s = torch.zeros(1, 16, 16)
    s[0, 2, 13] = 1.0                                  # a single spike, top right
    s[0, 9:13, 3:7] = 0.9                              # a blob, bottom left
    return s


# (the cascade ignores the score map: it fixates at the peak of its own localiser's map,
# computed from the gist inside its budget; tests/test_cascade.py checks that)
@pytest.mark.parametrize("name", [n for n in FIXED if n not in ("random",)
                                  and INFO[n]["family"] != "cascade"])
def test_every_allocator_fixates_by_the_shared_rule(name):
    pyr = build_pyramid(torch.rand(1, 3, 256, 256, generator=torch.Generator().manual_seed(2)))
    s = _off_centre_scores()
    want = resolve_fixation(None, s)
    got = allocate(name, pyr, s, 80).fixations[:, 0]
    assert torch.allclose(got, want, atol=1e-6), (name, got, want)


def test_v1_cortical_fixation_differs_from_a_raw_argmax():
    # the guard of the test above: on this map a raw argmax (v1_cortical's old rule) is
    # somewhere else than the shared rule
    s = _off_centre_scores()
    flat = int(s.flatten().argmax())
    raw = torch.tensor([((flat % 16) + 0.5) / 16, ((flat // 16) + 0.5) / 16])
    assert (resolve_fixation(None, s)[0] - raw).abs().max() > 0.2


# ----------------------------------------------------------------------------- read-only pages
def test_read_only_numpy_page_builds_without_a_warning():
    # np.asarray(PIL image) is read-only; torch.from_numpy warns on it (to every user)
    page = NP_RGB.copy()
    page.flags.writeable = False
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pyr = build_pyramid(page)
    assert torch.equal(pyr.levels[0], build_pyramid(NP_RGB).levels[0])


# ----------------------------------------------------------------------------- scores=None
@pytest.mark.parametrize("name", sorted(n for n in ALLOCATORS if not INFO[n]["uses_scores"]
                                        and INFO[n]["family"] != "cascade"))
def test_allocators_that_read_no_scores_accept_none(name):
    # resize & co. read no scores: None is a zero map, the same tokens as any map
    n = None if name == "full" else 4              # full takes no budget but all cells
    got, want = allocate(name, PYR, None, n), allocate(name, PYR, SC, n)
    assert torch.equal(got.centers, want.centers) and torch.equal(got.levels, want.levels)


# ----------------------------------------------------------------------------- the cascade
def test_cascade_accepts_a_numpy_integer_budget():
    # np.int64(N) (a budget from a numpy array) was rejected by the cascade only
    a = cascade(CPYR, None, np.int64(40), localiser=uniform)
    b = cascade(CPYR, None, 40, localiser=uniform)
    assert a.centers.shape[1] == b.centers.shape[1] == 40
    assert torch.equal(a.centers, b.centers) and torch.equal(a.levels, b.levels)


@pytest.mark.parametrize("flat", [torch.zeros(1, 8, 8), torch.full((1, 8, 8), -1.0)],
                         ids=["all zero", "all negative"])
def test_cascade_reads_a_map_with_no_mass_as_flat(flat):
    # "nothing stands out" (a blank page under the query scorer) used to be refused by
    # cascade_gist_query alone; it is the uniform localiser's flat map now, as documented
    got = cascade(CPYR, None, 40, localiser=lambda g, q: flat.clone())
    want = cascade(CPYR, None, 40, localiser=uniform)
    assert torch.equal(got.centers, want.centers) and torch.equal(got.levels, want.levels)


def test_every_cascade_accepts_an_all_black_page():
    black = build_pyramid(torch.zeros(1, 3, 128, 128))
    for name in ("cascade_gist_query", "cascade_prior", "cascade"):
        assert allocate(name, black, None, 40).budget == 40, name


def test_the_cascades_stated_budget_range_is_true():
    # the range a message states must run at both ends and refuse just outside them
    for side in (48, 64, 128):
        pyr = build_pyramid(torch.rand(1, 3, side, side, generator=torch.Generator().manual_seed(5)))
        low, high = budget_range((side, side))
        assert high == (side // 16) ** 2 and low == 5
        for n in (low, high):
            assert cascade(pyr, None, n, localiser=uniform).budget == n
        for n in (low - 1, high + 1):
            with pytest.raises(ValueError, match=rf"budget must be in \[{low}, {high}\]"):
                cascade(pyr, None, n, localiser=uniform)
    assert budget_range((16, 16))[0] > budget_range((16, 16))[1]         # one patch: none fits


def test_a_tensor_that_requires_grad_is_detached_not_refused():
    page = IMG[0].clone().requires_grad_(True)
    x = load_image(page)
    assert not x.requires_grad and torch.equal(x, IMG)
    assert page.requires_grad                           # the caller's tensor is left as it is
    assert torch.equal(foveate(page, budget=4, method="resize").view, foveate(IMG, budget=4, method="resize").view)


# ----------------------------------------------------------------------------- SROIE skips
def test_sroie_receipt_without_a_box_file_is_a_counted_printed_skip(tmp_path):
    root = sroie_dir(("000", "001"))
    (root / "box" / "001.csv").unlink()
    skipped, said = [], []
    docs = load_sroie(root, skipped=skipped, log=said.append)
    assert [d.doc_id for d in docs] == ["sroie000"]
    assert skipped == [("box/001.csv", "no box file")]
    assert len(said) == 1 and "1 receipts without a box file (box/001.csv)" in said[0]


def test_sroie_receipt_with_garbage_box_rows_is_a_counted_printed_skip(capsys):
    root = sroie_dir(("000",), box="not,a,box,row\n1,2,three\n")
    skipped: list = []
    assert load_sroie(root, skipped=skipped) == []
    assert skipped == [("box/000.csv", "no question")]
    out = capsys.readouterr().out                   # printed by default
    assert "0 receipts, 0 questions" in out and "box/000.csv" in out


def test_sroie_clean_folder_prints_nothing(capsys):
    docs = load_sroie(sroie_dir(("000", "001")), limit=np.int64(1))
    assert len(docs) == 1 and len(docs[0].questions) == 2
    assert capsys.readouterr().out == ""


# ----------------------------------------------------------------------------- constant images
@pytest.mark.parametrize("value", [0.0, 0.5, 1.0], ids=["black", "grey", "white"])
def test_saliency_of_a_constant_image_is_uniform(value):
    # a black page used to put a round-off spike (peak 1) at cell (0, 0)
    img = torch.cat([torch.full((1, 3, 64, 80), value),
                     torch.rand(1, 3, 64, 80, generator=torch.Generator().manual_seed(4))])
    m = score("saliency", img)
    assert torch.all(m[0] == m[0, 0, 0])                       # uniform: nothing stands out
    assert m[1].max() == 1 and m[1].min() < 1                  # the textured page is not


# ============================================================================ a new user's files
# Bad input to ``foveate`` and ``python -m fovea_core foveate`` as a new user would give it:
# named pipes and broken links, a save that cannot finish, pages of several frames, a
# folder that holds the command's own outputs, undecodable images, options that do nothing
# or hold bad values, text that is not valid Unicode.
import os                                                         # noqa: E402
import subprocess                                                 # noqa: E402
import sys                                                        # noqa: E402
import threading                                                  # noqa: E402
import warnings                                                   # noqa: E402

from PIL import Image                                             # noqa: E402

from fovea_core.__main__ import main as foveate_main              # noqa: E402
from fovea_core.foveation import (FoveateWarning, ImageDecodeError, NotAFileError,  # noqa: E402
                                  check_options, run_page, save_foveation)

ROOT = Path(__file__).resolve().parent.parent
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")


def _png(path: Path, side: int = 64, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray((rng.random((side, side, 3)) * 255).astype(np.uint8)).save(path)
    return path


def _unblock(fifo: Path) -> None:
    """Open the pipe's write end and close it: a reader blocked on it then sees its end."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:                                # no reader waits: nothing to unblock
        pass


@needs_fifo
def test_a_named_pipe_is_refused_without_being_opened(tmp_path):
    fifo = tmp_path / "p.png"
    os.mkfifo(fifo)
    result = {}

    def load():
        try:
            load_image(fifo)
        except Exception as err:                   # noqa: BLE001 - inspected below
            result["err"] = err
    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(20)
    blocked = t.is_alive()
    _unblock(fifo)                                 # a reader blocked before the fix: free it
    t.join(5)
    assert not blocked, "load_image opened the named pipe and waited on it"
    assert type(result.get("err")) is NotAFileError and isinstance(result["err"], ValueError)
    assert str(result["err"]).startswith(f"image: {fifo} is a named pipe (FIFO), not a "
                                         "regular file")


@needs_fifo
def test_the_command_on_a_named_pipe_ends_and_says_why(tmp_path):
    fifo = tmp_path / "p.png"
    os.mkfifo(fifo)
    try:
        res = subprocess.run([sys.executable, "-m", "fovea_core", "foveate", str(fifo),
                              "--method", "resize", "--out", str(tmp_path / "o")], cwd=ROOT,
                             capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    except subprocess.TimeoutExpired:
        _unblock(fifo)
        pytest.fail("the command waited on the named pipe")
    assert res.returncode == 2, res.stderr
    assert "p.png is not a readable image (not a regular file: a named pipe (FIFO)" in res.stderr
    assert "Traceback" not in res.stderr


@needs_fifo
def test_a_folders_pipes_and_broken_links_are_reported_and_counted(tmp_path, capsys):
    src = tmp_path / "pages"
    src.mkdir()
    _png(src / "ok.png")
    os.mkfifo(src / "pipe.png")
    (src / "loop.png").symlink_to("loop.png")
    (src / "gone.png").symlink_to("nowhere.png")
    code = foveate_main(["foveate", str(src), "--method", "resize", "--budget", "8",
                         "--workers", "1", "--out", str(tmp_path / "o")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert re.search(r"foveate: 1 done, 3 skipped, 0 failed of 4 files", captured.out)
    for line in ("skipped pipe.png: not a regular file: a named pipe (FIFO); not opened",
                 "skipped loop.png: not a regular file: a symbolic link loop",
                 "skipped gone.png: not a regular file: a dangling symbolic link (to "
                 "nowhere.png, which does not exist)"):
        assert line in captured.err, captured.err


def test_a_save_that_cannot_finish_leaves_no_file_of_the_page(tmp_path):
    """A folder where the page's JSON should go: the page fails and neither its view nor
    its figure is left behind (they were before: the renames were not all or nothing)."""
    page = _png(tmp_path / "p.png")
    out = tmp_path / "out"
    (out / "p.foveation.json").mkdir(parents=True)
    r = run_page(dict(path=str(page), stem="p", out_dir=str(out), question=None, budget=8,
                      method="resize", options={}))
    assert r["status"] == "failed" and "p.foveation.json exists and is not a file" in r["message"]
    assert sorted(p.name for p in out.iterdir()) == ["p.foveation.json"]


def test_a_rename_that_fails_midway_restores_the_pages_earlier_files(tmp_path, monkeypatch):
    """The last rename fails (a full disk, say): the files renamed before it are taken back
    and the page's earlier files, from a run before, are where they were, unchanged."""
    page = _png(tmp_path / "p.png")
    out = tmp_path / "out"
    out.mkdir()
    f = foveate(page, budget=8, method="resize")
    earlier = save_foveation(f, page, out, "p")
    before = {k: p.read_bytes() for k, p in earlier.items()}
    real = os.replace

    def replace(src, dst):
        if str(src).endswith(".tmp" + str(os.getpid())) and str(dst).endswith(".foveation.json"):
            raise OSError(28, "No space left on device")
        return real(src, dst)
    monkeypatch.setattr(os, "replace", replace)
    g = foveate(page, budget=12, method="resize")
    with pytest.raises(OSError, match="No space left"):
        save_foveation(g, page, out, "p")
    monkeypatch.undo()
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in earlier.values())
    assert {k: p.read_bytes() for k, p in earlier.items()} == before


@pytest.mark.parametrize("fmt", ["TIFF", "GIF"])
def test_a_file_of_several_frames_says_which_frame_is_read(tmp_path, fmt, capsys):
    """A multi-page TIFF or an animated GIF: read at its first frame, with a warning that
    names the frame count and the frame; the command's line for the page says so too."""
    frames = [Image.new("RGB", (64, 48), c) for c in ("white", "black", "red")]
    path = tmp_path / f"doc.{fmt.lower()}"
    frames[0].save(path, format=fmt, save_all=True, append_images=frames[1:])
    with pytest.warns(FoveateWarning, match=rf"holds 3 frames \(pages\); only frame 1 of 3 is "
                                            r"read.*img\.seek\(k\)"):
        x = load_image(path)
    assert float(x.min()) > 0.99                                 # the first frame: white
    with Image.open(path) as img:
        img.seek(1)
        with pytest.warns(FoveateWarning, match="only frame 2 of 3 is read"):
            assert float(load_image(img).max()) < 0.01           # the frame it is at: black
    code = foveate_main(["foveate", str(path), "--method", "resize", "--budget", "4",
                         "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 0 and "note: " in err
    assert "holds 3 frames (pages); only frame 1 of 3 is read" in err


def test_a_folder_run_skips_the_files_foveate_wrote_there(tmp_path, capsys):
    """``foveate dir/p.png --out dir`` then ``foveate dir``: the outputs are not pages."""
    src = tmp_path / "dir"
    src.mkdir()
    _png(src / "p.png")
    assert foveate_main(["foveate", str(src / "p.png"), "--method", "resize", "--budget", "8",
                         "--out", str(src)]) == 0
    capsys.readouterr()
    out = tmp_path / "o"
    code = foveate_main(["foveate", str(src), "--method", "resize", "--budget", "8",
                         "--workers", "1", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert re.search(r"foveate: 1 done, 3 skipped, 0 failed of 4 files", captured.out)
    assert "skipped 3 file(s) that foveate writes (p.foveated.png, p.foveation.json, " \
           "p.tokens.png): outputs, not pages" in captured.err
    assert sorted(p.name for p in out.iterdir()) == ["p.foveated.png", "p.foveation.json",
                                                     "p.tokens.png"]


def test_an_undecodable_image_fails_like_an_oversized_one(tmp_path, capsys):
    """A truncated JPEG is an image that cannot be read: *failed*, exit 1 (as a file over
    the decompression-bomb limit); a file that is no image at all is *skipped*."""
    src = tmp_path / "pages"
    src.mkdir()
    buf = tmp_path / "whole.jpg"
    Image.fromarray((np.random.default_rng(0).random((96, 96, 3)) * 255).astype(np.uint8)
                    ).save(buf, quality=90)
    data = buf.read_bytes()
    (src / "cut.jpg").write_bytes(data[:len(data) // 2])            # its data cut
    (src / "head.jpg").write_bytes(data[:100])                      # its header cut
    _png(src / "ok.png")
    (src / "notes.txt").write_text("not a page")
    with pytest.raises(ImageDecodeError, match=r"image: .*cut\.jpg is an image \(JPEG, 96x96\) "
                                               r"whose data cannot be decoded"):
        load_image(src / "cut.jpg")
    with pytest.raises(ImageDecodeError, match=r"image: .*head\.jpg is an image whose header "
                                               r"cannot be read"):
        load_image(src / "head.jpg")
    code = foveate_main(["foveate", str(src), "--method", "resize", "--budget", "8",
                         "--workers", "1", "--out", str(tmp_path / "o")])
    captured = capsys.readouterr()
    assert code == 1
    assert re.search(r"foveate: 1 done, 1 skipped, 2 failed of 4 files", captured.out)
    assert re.search(r"failed cut\.jpg .*ImageDecodeError", captured.err)
    assert re.search(r"failed head\.jpg .*ImageDecodeError", captured.err)
    assert "skipped notes.txt: not an image" in captured.err


# ----------------------------------------------------------------------------- options
GLANCE_PAGE = (np.random.default_rng(5).random((128, 128)) * 255).astype(np.uint8)


def test_gist_budget_on_the_default_is_said_unused_and_not_recorded():
    """``cascade_glance`` glances at 0.9 N instead of making a gist: a ``gist_budget`` below
    the glance changes nothing; it is said, and left out of ``Foveation.options``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = foveate(GLANCE_PAGE, budget=40, method="cascade_glance", gist_budget=8)
        b = foveate(GLANCE_PAGE, budget=40, method="cascade_glance", gist_budget=20)
        c = foveate(GLANCE_PAGE, budget=40, method="cascade_glance")
    said = [str(w.message) for w in caught if issubclass(w.category, FoveateWarning)]
    assert len(said) == 2 and all("'cascade_glance' does not use option gist_budget=" in s
                                  and "glances at the whole page in 36 tokens" in s for s in said)
    assert "gist_budget" not in a.options and "gist_budget" not in b.options
    for f in (b, c):                                  # the rule is true: the same tokens
        assert torch.equal(a.tokens.centers, f.tokens.centers)
        assert torch.equal(a.tokens.levels, f.tokens.levels)
    # the one-fixation cascade reads it, and records it
    assert check_options("cascade", budget=40, gist_budget=8) == []
    assert check_options("cascade_glance", budget=40, gist_budget=37) == []   # may be read


@pytest.mark.parametrize("value", ["zzz", [1, 2], "48", 0, 2.5, True])
def test_a_bad_gist_budget_is_refused_naming_it_before_any_page(value):
    for method in ("cascade_glance", "cascade"):
        with pytest.raises(ValueError, match=r"^gist_budget must be None or an int in \[1, 272\]"):
            check_options(method, budget=273, gist_budget=value)
        with pytest.raises(ValueError, match=r"^gist_budget must be None or an int >= 1"):
            check_options(method, gist_budget=value)
    with pytest.raises(ValueError, match=r"^gist_budget must be"):
        foveate(GLANCE_PAGE, budget=40, method="cascade_glance", gist_budget=value)


def test_the_command_refuses_bad_values_once_before_any_page(tmp_path, capsys, monkeypatch):
    import fovea_core.foveation as fv

    monkeypatch.setattr(fv, "run_page", lambda job: pytest.fail(f"worked on {job['path']}"))
    src = tmp_path / "pages"
    src.mkdir()
    for k in range(2):
        _png(src / f"p{k}.png", seed=k)
    for argv, line in [
        (["-o", "gist_budget=zzz"], "gist_budget must be None or an int in [1, 272]"),
        (["-o", "gist_budget=[1, 2]"], "gist_budget must be None or an int in [1, 272]"),
        (["-m", "cascade", "-o", "surround=2"], "cascade: surround must be in [0, 1)"),
        (["-o", "glance_share=1.5"], "glance_share must be a number in (0, 1)"),
        (["--method", ""], "--method must be a method's name (see --help), got an empty string"),
        (["-q", "What\ud800"], "question must be valid Unicode text: it holds a lone surrogate"),
    ]:
        with pytest.raises(SystemExit) as e:
            foveate_main(["foveate", str(src), "--workers", "1", "--out", str(tmp_path / "o")]
                         + argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and line in err and err.count("\n") == 1, (argv, err)
    with pytest.raises(SystemExit) as e:
        foveate_main(["foveate", str(src), "--out", ""])
    assert e.value.code == 2 and "--out must be a folder's path, got an empty string" in \
        capsys.readouterr().err
    monkeypatch.setenv("FOVEA_NO_DISK_CACHE", "maybe")
    with pytest.raises(SystemExit) as e:
        foveate_main(["foveate", str(src), "--out", str(tmp_path / "o")])
    assert e.value.code == 2 and "FOVEA_NO_DISK_CACHE must be one of" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_resize_switches_on_a_reading_cascade_are_refused_without_listing_them():
    with pytest.raises(ValueError) as info:
        check_options("cascade_glance", resize_within=2.0)
    msg = str(info.value)
    takes = msg.split("it takes: ")[1]
    assert "does not take option(s) ['resize_within'] (resize_within: a switch of the " \
           "one-fixation cascades" in msg
    assert "resize_within" not in takes and "resize_below" not in takes and "gist_budget" in takes
    assert check_options("cascade", resize_within=2.0) == []           # there it is taken


def test_help_names_the_real_default_and_suggests_no_unused_option(capsys):
    with pytest.raises(SystemExit):
        foveate_main(["foveate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: cascade_glance)" in text and "default: cascade)" not in text
    assert "gist_budget" not in text


def test_a_lone_surrogate_in_a_question_names_the_question():
    with pytest.raises(ValueError, match=r"^question must be valid Unicode text: it holds a lone "
                                         r"surrogate '\\ud800' at position 4"):
        foveate(GLANCE_PAGE, "What\ud800 is it?", budget=40, method="cascade")


def test_the_commands_own_arguments_given_as_options_are_named(tmp_path, capsys):
    src = tmp_path / "pages"
    src.mkdir()
    _png(src / "p.png")
    with pytest.raises(SystemExit) as e:
        foveate_main(["foveate", str(src), "-o", "budget=5", "-o", "question='x'", "--out",
                      str(tmp_path / "o")])
    lines = capsys.readouterr().err.splitlines()
    assert e.value.code == 2 and lines == [
        "python -m fovea_core foveate: error: --option budget=...: the budget is given with "
        "--budget, not as an option",
        "python -m fovea_core foveate: error: --option question=...: the question is given "
        "with --question, not as an option"]


def test_a_page_without_read_permission_fails_naming_it(tmp_path, monkeypatch):
    """A file that cannot be opened (permission denied; simulated, root reads anything) is
    a page that fails, said as such, not a file skipped as not an image."""
    page = _png(tmp_path / "p.png")

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(page))
    monkeypatch.setattr(Image, "open", denied)
    with pytest.raises(ImageDecodeError, match=r"p\.png cannot be opened \(Permission denied\)"):
        load_image(page)
    r = run_page(dict(path=str(page), stem="p", out_dir=str(tmp_path), question=None, budget=8,
                      method="resize", options={}))
    assert r["status"] == "failed" and "cannot be opened" in r["message"]
