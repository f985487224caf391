"""The learned fixation predictor: its detectors (models inside wheels), readout and fit."""

import json

import numpy as np
import pytest
import torch

from fovea_core.importance import SCORERS, score, scorer_cost
from fovea_book.eval import fit_fixation as ff
from fovea_core.importance import fixation as fx
from fovea_core.importance.text import text_probability


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _image(seed: int = 0, h: int = 120, w: int = 160) -> np.ndarray:
    rng = np.random.default_rng(seed)
    img = (rng.random((h, w, 3)) * 60 + 100).astype(np.uint8)
    img[40:70, 90:130] = [230, 30, 30]                         # a red patch
    return img


# --------------------------------------------------------------------- model files
def test_model_files_ship_in_their_wheels():
    assert fx.face_model_path().name == fx.FACE_MODEL
    assert fx.text_model_path().suffix == ".onnx" and "det" in fx.text_model_path().name


def test_missing_model_files_name_model_and_wheel(monkeypatch, tmp_path):
    import rapidocr
    import skimage.data

    monkeypatch.setattr(skimage.data, "__file__", str(tmp_path / "__init__.py"))
    with pytest.raises(fx.ModelFileMissing, match=r"lbpcascade_frontalface_opencv\.xml.*"
                                                  r"scikit-image wheel"):
        fx.face_model_path()
    monkeypatch.setattr(rapidocr, "__file__", str(tmp_path / "__init__.py"))
    with pytest.raises(fx.ModelFileMissing, match=r"PP-OCR det.*rapidocr wheel"):
        fx.text_model_path()


# --------------------------------------------------------------------- features
def test_text_map_is_the_rapidocr_detector_on_the_shrunk_image():
    """Our direct ONNX run equals fovea's rapidocr pipeline on the same 320 x 224 input."""
    from skimage import data

    page = data.page()                                          # grey scanned text, 191 x 384
    x = torch.from_numpy(np.stack([page] * 3, -1)).permute(2, 0, 1)[None].float() / 255
    small = fx._shrink(x, fx.TEXT_SIDE, multiple=32)
    assert small.shape[-2:] == (160, 320)
    ours = fx.text_map(x)
    ref = text_probability(small)
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), atol=1e-4)
    assert ours.amax() > 0.9                                    # it does find the text


def test_face_detector_finds_the_astronauts_face():
    from skimage import data

    gray = data.astronaut().astype(np.float64) @ [0.299, 0.587, 0.114] / 255.0   # 512 x 512
    small = gray[::2, ::2]                                      # 256 x 256, face ~ 40 px
    boxes = fx.face_boxes(small)
    assert len(boxes) >= 1
    cx, cy = boxes[:, 0] + boxes[:, 2] / 2, boxes[:, 1] + boxes[:, 3] / 2
    # the face of skimage's astronaut image lies near (210, 90) px of the 512 x 512 image
    assert np.any((np.abs(cx * 2 - 210) < 40) & (np.abs(cy * 2 - 90) < 40))
    assert len(fx.face_boxes(np.full((200, 300), 0.5))) == 0   # a flat image has no face


def test_face_map_blobs():
    m = fx.face_map(np.array([[10.0, 20.0, 8.0, 8.0], [40.0, 0.0, 4.0, 4.0]]), (30, 50), 1.0)
    assert m.shape == (30, 50) and float(m.max()) == pytest.approx(1.0, abs=0.02)
    r, c = np.unravel_index(int(m.argmax()), m.shape)
    assert {(r, c)} <= {(23, 13), (23, 14), (24, 13), (24, 14), (1, 41), (1, 42), (2, 41), (2, 42)}
    # sigma = half the width (4 px): at 4 px from the first centre the blob is exp(-1/2)
    assert float(m[23, 18]) == pytest.approx(np.exp(-0.5 * (4.5**2 + 0.5**2) / 16), rel=1e-4)
    assert fx.face_map(np.zeros((0, 4)), (5, 6), 1.0).abs().sum() == 0


def test_base_features_shapes_and_batch():
    imgs = np.stack([_image(0), _image(1)])
    f = fx.base_features(imgs)
    cell, gh, gw = fx.work_grid((120, 160))
    assert f.shape == (2, len(fx.FEATURES), gh, gw) and (cell, gh, gw) == (2, 60, 80)
    assert torch.isfinite(f).all() and f.min() >= 0 and f.amax() <= 1
    np.testing.assert_allclose(fx.base_features(imgs[1:])[0], f[1], atol=1e-5)
    # the colour channel marks the red patch (cells of 2 px: rows 20-35, cols 45-65)
    colour = f[0, fx.FEATURES.index("colour_contrast")]
    assert colour[22:33, 47:63].mean() > 3 * colour.mean()
    b = fx.blurred_features(f)
    assert b.shape[1] == len(fx.feature_names()) == 2 * len(fx.FEATURES) * len(fx.BLUR_CELLS)
    np.testing.assert_allclose(b[:, len(b[0]) // 2:], b[:, : len(b[0]) // 2].sqrt())


def test_centre_features_are_clarke_tatler_coordinates():
    c = fx.centre_features((600, 800))                          # cells of 8 px, 75 x 100
    assert c.shape == (4, 75, 100)
    u, v = c[0], c[1]
    assert float(u[0, 0]) == pytest.approx((4 - 400) / 400)
    assert float(v[-1, 0]) == pytest.approx((596 - 300) / 400)
    np.testing.assert_allclose(c[2], u**2) and np.testing.assert_allclose(c[3], v**2)


# --------------------------------------------------------------------- readout
def test_committed_readout_loads_and_predicts():
    r = fx.load_readout()
    assert r.weights.shape == (len(fx.feature_names()),) and r.centre.shape == (4,)
    rec = json.loads(fx.READOUT_PATH.read_text())["record"]
    assert rec["data"] == "osie-train" and rec["n_images"] == len(rec["images"]) == 70
    assert all(int(i[:4]) % 10 == 5 for i in rec["images"])   # train ids 1005, 1015, ...
    # both centre models are centred Gaussians in u and v (negative quadratic terms)
    assert r.centre[2] < 0 and r.centre[3] < 0 and r.centre_only[2] < 0 and r.centre_only[3] < 0
    p = fx.fixation_probability(_image(), readout=r)
    assert p.shape == (1, 60, 80) and float(p.sum()) == pytest.approx(1.0, abs=1e-5)
    cb = fx.centre_bias_probability((120, 160), out_shape=(30, 40))
    assert cb.shape == (1, 30, 40) and float(cb.sum()) == pytest.approx(1.0, abs=1e-5)
    r_, c_ = np.unravel_index(int(cb[0].argmax()), (30, 40))
    assert abs(r_ - 14.5) <= 4 and abs(c_ - 19.5) <= 3


def test_scorer_is_registered_and_consistent():
    assert "fixation" in SCORERS
    img = _image()
    s = score("fixation", img, patch=16)
    assert s.shape == (1, 8, 10) and float(s.max()) == pytest.approx(1.0) and s.min() >= 0
    p = fx.fixation_probability(img)
    np.testing.assert_allclose(fx.scores_from_probability(p, (120, 160), patch=16), s, atol=1e-6)
    cost = scorer_cost("fixation", (600, 800))
    assert cost.pixels == 200 * 150 + 320 * 240 + 320 * 256   # the three views it reads
    # a face-free, text-free flat image is mostly the centre terms: peak in the central
    # columns, at or a little above the middle row (OSIE observers look above the centre)
    flat = score("fixation", np.full((96, 128, 3), 128, np.uint8), patch=16)
    r, c = np.unravel_index(int(flat[0].argmax()), flat[0].shape)
    assert c in (3, 4) and r in (1, 2, 3)
    assert float(flat[0, :, 0].max()) < 0.6 and float(flat[0, -1].max()) < 0.6


def test_readout_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="fit_fixation --replace-committed"):
        fx.load_readout(tmp_path / "none.json")
    d = json.loads(fx.READOUT_PATH.read_text())
    d["features"] = d["features"][:-1]
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="refit"):
        fx.load_readout(tmp_path / "bad.json")


# --------------------------------------------------------------------- fit
def _synthetic(seed: int = 0, n: int = 12, k: int = 3, shape=(15, 20), per_image: int = 400):
    """Fixations drawn from softmax(2 F0 - F1 + 0 F2 - 3 u^2 - 4 v^2)."""
    g = torch.Generator().manual_seed(seed)
    feats = torch.rand(n, k, *shape, generator=g, dtype=torch.float64)
    centre = fx.centre_features(shape)                          # cells of 1 px: grid = shape
    true_w = torch.tensor([2.0, -1.0, 0.0], dtype=torch.float64)
    true_c = torch.tensor([0.0, 0.0, -3.0, -4.0], dtype=torch.float64)
    logit = fx.readout_logits(feats, centre, true_w, true_c).reshape(n, -1)
    draws = torch.multinomial(torch.softmax(logit, 1), per_image, replacement=True, generator=g)
    ones = torch.ones_like(draws, dtype=logit.dtype)
    counts = torch.zeros_like(logit).scatter_add_(1, draws, ones)
    return feats, centre, counts.reshape(n, *shape), true_w, true_c


def test_fit_recovers_generating_coefficients_deterministically():
    feats, centre, counts, true_w, true_c = _synthetic()
    w, c = ff.fit(feats, centre, counts)
    np.testing.assert_allclose(w, true_w, atol=0.25)
    np.testing.assert_allclose(c[2:], true_c[2:], atol=0.8)
    w2, c2 = ff.fit(feats, centre, counts)
    assert torch.equal(w, w2) and torch.equal(c, c2)            # deterministic
    w0, c0 = ff.fit(feats, centre, counts, use_features=False)
    assert w0.numel() == 0 and c0[2] < 0 and c0[3] < 0           # the centre-only model
    nll = ff._nll(fx.readout_logits(feats, centre, w, c), counts).mean()
    nll0 = ff._nll(fx.readout_logits(feats[:, :0], centre, w0, c0), counts).mean()
    assert nll < nll0


def test_fit_refuses_a_dev_folder(tmp_path):
    with pytest.raises(SystemExit):
        ff.main(["--data", str(tmp_path / "osie-dev"), "--out", str(tmp_path / "x.json")])


@pytest.mark.parametrize("size", [(600, 800), (333, 517), (90, 70)])
def test_fixation_scorer_reads_what_it_declares(size, monkeypatch):
    """The page is looked at only through ``_shrink``'s three views; their pixels are the
    declared cost (``READS["fixation"]``)."""
    from fovea_core.importance import READS

    seen = []
    real = fx._shrink

    def spy(x, side, multiple=1):
        out = real(x, side, multiple)
        seen.append(int(out.shape[-2] * out.shape[-1]))
        return out

    monkeypatch.setattr(fx, "_shrink", spy)
    fx.base_features(torch.rand(1, 3, *size))
    assert sum(seen) == READS["fixation"](*size) and len(seen) == 3
