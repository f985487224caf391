"""OSIE loader, fixation maps and the COCO-Search18-style scanpath reader."""

import json

import numpy as np
import pytest
from PIL import Image
from scipy.io import savemat

from fovea_book.eval import eyetracking as et
from fovea_book.paths import DatasetNotFound, dataset_path


def _subject(xs, ys, ds):
    return {"fix_x": np.asarray(xs, float), "fix_y": np.asarray(ys, float),
            "fix_duration": np.asarray(ds, float)}


@pytest.fixture()
def osie_dir(tmp_path):
    """A 3-record OSIE-format folder; only 2 stimuli exist; odd subjects (1 and 0 fixations)."""
    (tmp_path / "stimuli").mkdir()
    (tmp_path / "eye").mkdir()
    for name, (w, h) in {"0002.jpg": (40, 30), "0001.jpg": (40, 30)}.items():
        Image.new("RGB", (w, h)).save(tmp_path / "stimuli" / name)
    recs = np.empty(3, dtype=object)
    subs1 = np.empty(2, dtype=object)
    subs1[0] = _subject([1, 40], [1, 30], [100, 200])         # corners, 1-based
    subs1[1] = _subject([20.5], [15.5], [300])                 # a single fixation
    subs2 = np.empty(2, dtype=object)
    subs2[0] = _subject([10, 11, 12], [5, 5, 5], [1, 2, 3])
    subs2[1] = _subject([], [], [])                            # no fixation at all
    recs[0] = {"img": "0002.jpg", "subjects": subs2}
    recs[1] = {"img": "0001.jpg", "subjects": subs1}
    recs[2] = {"img": "0003.jpg", "subjects": subs1}           # stimulus absent
    savemat(tmp_path / "eye" / "fixations.mat", {"fixations": recs})
    return tmp_path


def test_load_osie_format(osie_dir):
    recs = et.load_osie(osie_dir, empty_subjects="keep")
    assert [r.image for r in recs] == ["0001.jpg", "0002.jpg"]   # present only, sorted
    r1, r2 = recs
    assert r1.size == (30, 40) and r1.num_subjects == 2
    # 1-based (1, 1) is the centre of the first pixel: 0.5 in continuous coordinates
    np.testing.assert_allclose(r1.subjects[0], [[0.5, 0.5, 100], [39.5, 29.5, 200]])
    np.testing.assert_allclose(r1.subjects[1], [[20.0, 15.0, 300]])
    assert r2.subjects[1].shape == (0, 3)
    assert r2.points().shape == (3, 2)
    np.testing.assert_allclose(r1.points([1]), [[20.0, 15.0]])
    assert len(et.load_osie(osie_dir, max_images=1)) == 1          # 0001.jpg: no empty subject


def test_load_osie_subject_without_fixations(osie_dir):
    with pytest.raises(ValueError, match=r"image 0002\.jpg: observer\(s\) \[1\] have no fix"):
        et.load_osie(osie_dir)
    dropped = et.load_osie(osie_dir, empty_subjects="drop")[1]
    assert dropped.image == "0002.jpg" and dropped.num_subjects == 1
    with pytest.raises(ValueError, match="empty_subjects"):
        et.load_osie(osie_dir, empty_subjects="ignore")


def test_check_image_size_names_the_image():
    rec = et.FixationRecord("1010.jpg", None, (30, 40), ())
    et.check_image_size(rec, np.zeros((30, 40, 3)))
    et.check_image_size(rec, np.zeros((3, 30, 40)))
    et.check_image_size(rec, np.zeros((30, 40)))
    with pytest.raises(ValueError, match=r"image 1010\.jpg: the image is 60x80 .* 30x40"):
        et.check_image_size(rec, np.zeros((60, 80, 3)))
    with pytest.raises(ValueError, match=r"image 1010\.jpg: the image is 40x30"):
        et.check_image_size(rec, np.zeros((40, 30)))


def test_load_osie_errors(tmp_path, osie_dir):
    with pytest.raises(FileNotFoundError, match="OSIE"):
        et.load_osie(tmp_path / "nope")
    with pytest.raises(ValueError, match="max_images"):
        et.load_osie(osie_dir, max_images=0)


def test_fixation_map_pixel_convention(osie_dir):
    r1 = et.load_osie(osie_dir, empty_subjects="keep")[0]
    m = et.fixation_map(r1.points(), r1.size)
    # 1-based (1,1) -> pixel [0,0]; (40,30) -> [29,39]; (20.5,15.5) -> round = (21,16) -> [15,20]
    assert set(zip(*np.nonzero(m))) == {(0, 0), (29, 39), (15, 20)}
    # half resolution: pixel (39.5, 29.5) -> (19, 14)
    half = et.fixation_map(r1.points(), (15, 20), scale=0.5)
    assert half[14, 19] and half[0, 0] and half.sum() == 3


def test_fixation_counts_and_clipping():
    pts = np.array([[2.2, 1.7], [2.9, 1.1], [-3.0, 50.0]])   # two in one pixel, one outside
    c = et.fixation_counts(pts, (4, 5))
    assert c[1, 2] == 2 and c[3, 0] == 1 and c.sum() == 3
    assert et.fixation_map(pts, (4, 5)).sum() == 2


def test_fixation_density_is_blurred_and_normalised():
    pts = np.array([[50.5, 40.5]] * 3)
    d = et.fixation_density(pts, (80, 100), sigma_px=5.0)
    assert d.sum() == pytest.approx(1.0)
    assert np.unravel_index(d.argmax(), d.shape) == (40, 50)
    # second moment about the peak ~ sigma^2 (the kernel is truncated at 3.5 sigma)
    y = np.arange(80)[:, None] - 40
    assert (d * y**2).sum() == pytest.approx(25.0, rel=0.02)
    with pytest.raises(ValueError, match="sigma_px"):
        et.fixation_density(pts, (80, 100), sigma_px=0)
    with pytest.raises(ValueError, match=r"image 1010\.jpg: no fixations"):
        et.fixation_density(np.zeros((0, 2)), (80, 100), sigma_px=5.0, image="1010.jpg")


def test_split_subjects_halves():
    a, b = et.split_subjects(15, np.random.default_rng(0))
    assert len(a) == 7 and len(b) == 8
    assert sorted(np.concatenate([a, b]).tolist()) == list(range(15))
    with pytest.raises(ValueError, match="num_subjects"):
        et.split_subjects(1, np.random.default_rng(0))


def test_read_scanpaths_json(tmp_path):
    recs = [
        {"name": "a.jpg", "subject": 1, "task": "bottle", "condition": "present",
         "bbox": [1, 2, 3, 4], "X": [10.0, 20.0], "Y": [5.0, 6.0], "T": [200, 300], "length": 2},
        {"name": "a.jpg", "subject": 2, "X": [7.0], "Y": [8.0], "T": [100]},
        {"name": "b.jpg", "subject": 1, "X": [1.0, 2.0, 3.0], "Y": [1.0, 2.0, 3.0],
         "T": [1, 2, 3], "split": "train"},
    ]
    p = tmp_path / "scanpaths.json"
    p.write_text(json.dumps(recs))
    sp = et.read_scanpaths_json(p)
    assert [s.subject for s in sp] == [1, 2, 1]
    assert sp[0].task == "bottle" and sp[1].condition == ""
    np.testing.assert_allclose(sp[0].xy, [[10, 5], [20, 6]])
    np.testing.assert_allclose(sp[0].duration, [200, 300])
    np.testing.assert_allclose(et.scanpath_points(sp, "a.jpg"), [[10, 5], [20, 6], [7, 8]])
    assert et.scanpath_points(sp, "zzz.jpg").shape == (0, 2)
    np.testing.assert_allclose(et.read_scanpaths_json(p, one_based=True)[1].xy, [[6.5, 7.5]])


@pytest.mark.parametrize("bad, match", [
    ({"name": "a", "subject": 1, "X": [1.0], "Y": [1.0, 2.0], "T": [1]}, "record 0 has len"),
    ({"name": "a", "subject": 1, "X": [1.0], "Y": [1.0]}, r"record 0 lacks \['T'\]"),
    ({"name": "a", "subject": 1, "X": [1.0], "Y": [1.0], "T": [1], "length": 3}, "length 3"),
])
def test_read_scanpaths_json_errors(tmp_path, bad, match):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps([bad]))
    with pytest.raises(ValueError, match=match):
        et.read_scanpaths_json(p)
    p.write_text(json.dumps({"not": "a list"}))
    with pytest.raises(ValueError, match="JSON list"):
        et.read_scanpaths_json(p)


def test_real_osie_subset():
    """The shared development subset, when present: 15 observers, fixations on the image."""
    try:
        root = dataset_path("osie-dev")
    except DatasetNotFound as exc:
        pytest.skip(str(exc))
    recs = et.load_osie(root)
    assert len(recs) == len(list((root / "stimuli").glob("*.jpg")))
    assert all(r.num_subjects == 15 and r.size == et.OSIE_IMAGE_SIZE for r in recs)
    pts = np.concatenate([r.points() for r in recs])
    h, w = et.OSIE_IMAGE_SIZE
    inside = (pts[:, 0] >= 0) & (pts[:, 0] < w) & (pts[:, 1] >= 0) & (pts[:, 1] < h)
    assert inside.mean() > 0.99
    # the central fixation bias (Tatler 2007): the mean fixation is near the centre
    assert abs(pts[:, 0].mean() / w - 0.5) < 0.1 and abs(pts[:, 1].mean() / h - 0.5) < 0.1


def test_score_against_half_splits():
    rng = np.random.default_rng(0)
    # 10 observers who all look near (30, 20) of a 60x40 image
    subs = tuple(np.column_stack([rng.normal(30, 2, 5), rng.normal(20, 2, 5), np.full(5, 200.0)])
                 for _ in range(10))
    rec = et.FixationRecord("x.jpg", None, (40, 60), subs)
    right = et.fixation_density(np.array([[30.0, 20.0]]), (40, 60), sigma_px=3)
    wrong = et.fixation_density(np.array([[5.0, 35.0]]), (40, 60), sigma_px=3)
    other = np.zeros((40, 60), bool)
    other[::4, ::4] = True
    rows = et.score_against_half_splits(
        rec, {"right": right, "wrong": wrong, "flat": np.ones((40, 60))}, other,
        scale=1.0, sigma_px=3.0, n_splits=3, rng=np.random.default_rng(1))
    assert len(rows) == 3 * 4 and {r["split"] for r in rows} == {0, 1, 2}
    by = {(r["model"], r["split"]): r for r in rows}
    for s in range(3):
        assert by[("inter-observer", s)]["CC"] > 0.8
        assert by[("right", s)]["CC"] > 0.8 > 0.0 > by[("wrong", s)]["CC"]
        assert by[("right", s)]["NSS"] > by[("flat", s)]["NSS"] == 0.0
        assert by[("flat", s)]["AUC-Judd"] == pytest.approx(0.5)
        assert by[("right", s)]["KL"] < by[("flat", s)]["KL"] < by[("wrong", s)]["KL"]
    again = et.score_against_half_splits(
        rec, {"right": right}, other, scale=1.0, sigma_px=3.0, n_splits=3,
        rng=np.random.default_rng(1))
    assert [r["CC"] for r in again if r["model"] == "inter-observer"] == [
        by[("inter-observer", s)]["CC"] for s in range(3)]
    with pytest.raises(ValueError, match="n_splits"):
        et.score_against_half_splits(rec, {}, other, scale=1, sigma_px=3, n_splits=0,
                                     rng=rng)
    with pytest.raises(ValueError, match=r"image x\.jpg: maps \{'small'"):
        et.score_against_half_splits(rec, {"small": np.ones((20, 30))}, other, scale=1,
                                     sigma_px=3, n_splits=1, rng=rng)
    with pytest.raises(ValueError, match=r"image x\.jpg: other_fixations is empty"):
        et.score_against_half_splits(rec, {}, np.zeros((40, 60), bool), scale=1, sigma_px=3,
                                     n_splits=1, rng=rng)
    # two observers, one of whom fixated nothing: one half is empty, an error names the image
    lonely = et.FixationRecord("y.jpg", None, (40, 60), (subs[0], np.zeros((0, 3))))
    with pytest.raises(ValueError, match=r"image y\.jpg: no fixations"):
        et.score_against_half_splits(lonely, {}, other, scale=1, sigma_px=3, n_splits=1,
                                     rng=np.random.default_rng(0))
