"""``python -m fovea_book.fetch``: the datasets from their public sources, checked and atomic.

No network: the tests build a local mirror of the source repositories
(``OWNER/REPO/COMMIT/PATH``) in ``tmp_path`` from a few files of the reference copies in
``../shared/datasets`` (beside the checkout) and point ``--base-url`` at it with a
``file://`` URL. WildReceipt's ``test.txt`` is rebuilt for the lines used from the
reference ``ann/`` files (only ``file_name`` differs, and the derivation replaces it);
the other lines are placeholders. Tests that need the reference copies are skipped, with
that reason, where they are absent.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from fovea_book import fetch as F

REF = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
needs_ref = pytest.mark.skipif(
    not REF.is_dir(), reason=f"reference datasets not found at {REF} (they live beside the "
                             "checkout, not in it)")

MANIFEST = F.load_manifest()
# The real file_name of test.txt's line 0 (read from the repository); other lines get one
# made up for the mirror.
LINE0_FILE = "image_files/Image_12/10/845be0dd6f5b04866a2042abd28d558032ef2576.jpeg"
PLACEHOLDER = json.dumps({"file_name": "image_files/none.jpeg", "height": 1, "width": 1,
                          "annotations": []})

SUBSET = {
    "sroie-dev": ["img/000.jpg", "box/000.csv", "key/000.json", "key/016.json"],
    "funsd-dev": ["images/0000971160.png", "annotations/0000971160.json"],
    "osie-dev": ["stimuli/1010.jpg"],
    "wildreceipt-dev": ["class_list.txt", "ann/000.json", "box/000.csv", "key/000.json",
                        "img/000.jpg", "ann/008.json", "box/008.csv", "key/008.json",
                        "img/008.jpg"],
}


def subset(name: str, dests: list[str] | None = None) -> F.Dataset:
    """Dataset ``name`` of the committed manifest, restricted to ``dests`` (default SUBSET)."""
    keep = set(SUBSET[name] if dests is None else dests)
    ds = MANIFEST[name]
    files = tuple(f for f in ds.files if f.dest in keep)
    assert {f.dest for f in files} == keep, "a SUBSET file is not in the manifest"
    return dataclasses.replace(ds, files=files)


def image_name(line: int) -> str:
    return LINE0_FILE if line == 0 else f"image_files/Image_0/0/line{line:03d}.jpeg"


def build_mirror(root: Path, datasets: list[F.Dataset]) -> tuple[str, str]:
    """Lay out the upstream files of ``datasets`` under ``root``; return (base URL, image URL)."""
    images = root / "wildreceipt-images"
    for ds in datasets:
        repo = root / ds.repo / ds.commit
        ref = REF / ds.name
        lines: dict[int, str] = {}
        for f in ds.files:
            if f.path is not None:
                (repo / f.path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(ref / f.dest, repo / f.path)
            elif f.derive == "img":
                target = images / image_name(f.line)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(ref / f.dest, target)
            if f.line is not None and f.line not in lines:
                record = json.loads((ref / f"ann/{f.line:03d}.json").read_text())
                record["file_name"] = image_name(f.line)
                lines[f.line] = json.dumps(record)
        if ds.derive_path is not None:
            text = "\n".join(lines.get(i, PLACEHOLDER) for i in range(max(lines) + 1)) + "\n"
            (repo / ds.derive_path).parent.mkdir(parents=True, exist_ok=True)
            (repo / ds.derive_path).write_text(text)
    return root.as_uri(), images.as_uri()


def leftovers(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.iterdir()) if dest.exists() else []


@pytest.fixture
def mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """(manifest subset, base URL, image URL, destination) for the SUBSET datasets."""
    if not REF.is_dir():
        pytest.skip(f"reference datasets not found at {REF}")
    for var in (F.BASE_URL_ENV, F.IMAGES_ENV, "FOVEA_DATA"):
        monkeypatch.delenv(var, raising=False)
    manifest = {name: subset(name) for name in SUBSET}
    base, images = build_mirror(tmp_path / "mirror", list(manifest.values()))
    return manifest, base, images, tmp_path / "dest"


def upstream_file(base: str, ds: F.Dataset, path: str) -> Path:
    root = Path(urllib.request.url2pathname(urllib.parse.urlsplit(base).path))
    return root / ds.repo / ds.commit / path


# -------------------------------------------------------------------------------- fetching

@needs_ref
def test_fetch_reproduces_the_reference_bytes_then_is_up_to_date(mirror) -> None:
    manifest, base, images, dest = mirror
    out = F.fetch(None, dest, manifest=manifest, base_url=base, images_base_url=images,
                  progress=False)
    assert out == {name: "fetched" for name in SUBSET}
    for name, dests in SUBSET.items():
        got = sorted(str(p.relative_to(dest / name)) for p in (dest / name).rglob("*")
                     if p.is_file())
        assert got == sorted(dests), name
        for d in dests:
            assert (dest / name / d).read_bytes() == (REF / name / d).read_bytes(), d
    assert leftovers(dest) == sorted(SUBSET)        # no temporary folder, no .sources
    again = F.fetch(None, dest, manifest=manifest, base_url=base, images_base_url=images,
                    progress=False)
    assert again == {name: "up to date" for name in SUBSET}


@needs_ref
def test_base_url_and_image_source_come_from_the_environment(mirror, monkeypatch) -> None:
    manifest, base, images, dest = mirror
    monkeypatch.setenv(F.BASE_URL_ENV, base)
    monkeypatch.setenv(F.IMAGES_ENV, images)
    monkeypatch.setenv("FOVEA_DATA", str(dest))
    assert F.main(["-q", "wildreceipt-dev", "sroie-dev"], manifest=manifest) == 0
    assert (dest / "wildreceipt-dev" / "img" / "008.jpg").read_bytes() == \
        (REF / "wildreceipt-dev" / "img" / "008.jpg").read_bytes()
    assert leftovers(dest) == ["sroie-dev", "wildreceipt-dev"]


@needs_ref
def test_a_corrupted_file_names_the_file_and_leaves_nothing(mirror) -> None:
    manifest, base, _, dest = mirror
    ds = manifest["sroie-dev"]
    bad = upstream_file(base, ds, "data/box/000.csv")
    bad.write_bytes(bad.read_bytes() + b"tampered\r\n")
    with pytest.raises(F.ChecksumError) as err:
        F.fetch_dataset(ds, dest, base_url=base, progress=False)
    entry = next(f for f in ds.files if f.dest == "box/000.csv")
    message = str(err.value)
    assert "sroie-dev/box/000.csv" in message and "data/box/000.csv" in message
    assert entry.sha256 in message and F.file_digest(bad) in message
    assert leftovers(dest) == []


@needs_ref
def test_a_changed_source_line_fails_the_derived_file(mirror) -> None:
    manifest, base, images, dest = mirror
    ds = manifest["wildreceipt-dev"]
    source = upstream_file(base, ds, ds.derive_path)
    lines = source.read_text().split("\n")
    lines[8] = lines[8].replace('"label": 1}', '"label": 2}', 1)
    source.write_text("\n".join(lines))
    with pytest.raises(F.ChecksumError, match=r"wildreceipt-dev/ann/008\.json.*line 8"):
        F.fetch_dataset(ds, dest, base_url=base, images_base_url=images, progress=False)
    assert leftovers(dest) == []


@needs_ref
@pytest.mark.parametrize("error", [ConnectionResetError, KeyboardInterrupt])
def test_an_interrupted_download_leaves_nothing(mirror, monkeypatch, error) -> None:
    manifest, base, _, dest = mirror
    real_open = F._open
    calls = []

    class Dropped:
        """A response that gives a few bytes, then fails."""

        def __init__(self, inner):
            self.inner, self.sent = inner, False

        def read(self, n: int = -1) -> bytes:
            if self.sent:
                raise error("connection dropped mid-file")
            self.sent = True
            return self.inner.read(100)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.inner.close()

    def flaky_open(url: str, timeout: float = F.TIMEOUT_S):
        calls.append(url)
        response = real_open(url, timeout)
        return Dropped(response) if len(calls) == 3 else response

    monkeypatch.setattr(F, "_open", flaky_open)
    expected = F.FetchError if error is ConnectionResetError else KeyboardInterrupt
    with pytest.raises(expected):
        F.fetch_dataset(manifest["sroie-dev"], dest, base_url=base, progress=False)
    assert len(calls) == 3                    # two files written, the third cut short
    assert leftovers(dest) == []


@needs_ref
def test_a_missing_upstream_file_is_named(mirror) -> None:
    manifest, base, _, dest = mirror
    ds = manifest["funsd-dev"]
    upstream_file(base, ds, "train_data/FUNSD/training_data/images/0000971160.png").unlink()
    with pytest.raises(F.FetchError, match=r"cannot download .*0000971160\.png"):
        F.fetch_dataset(ds, dest, base_url=base, progress=False)
    assert leftovers(dest) == []


@needs_ref
def test_wildreceipt_without_an_image_source_says_how_to_give_one(mirror) -> None:
    manifest, base, _, dest = mirror
    with pytest.raises(F.FetchError, match="--wildreceipt-images"):
        F.fetch_dataset(manifest["wildreceipt-dev"], dest, base_url=base, progress=False)
    assert leftovers(dest) == []


@needs_ref
def test_an_existing_folder_that_differs_is_kept_unless_forced(mirror) -> None:
    manifest, base, _, dest = mirror
    ds = manifest["sroie-dev"]
    (dest / "sroie-dev" / "key").mkdir(parents=True)
    (dest / "sroie-dev" / "key" / "000.json").write_text("{}")
    with pytest.raises(F.FetchError, match=r"exists but differs.*key/000\.json.*--force"):
        F.fetch_dataset(ds, dest, base_url=base, progress=False)
    assert (dest / "sroie-dev" / "key" / "000.json").read_text() == "{}"
    assert F.fetch_dataset(ds, dest, base_url=base, force=True, progress=False) == "replaced"
    assert F.check_folder(ds, dest / "sroie-dev") == []
    assert leftovers(dest) == ["sroie-dev"]


# -------------------------------------------------------------------------------- the CLI

def test_list_prints_every_dataset(capsys) -> None:
    assert F.main(["--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == list(MANIFEST)
    assert set(MANIFEST) >= {"sroie-dev", "sroie-train", "funsd-dev", "funsd-train",
                             "osie-dev", "osie-train", "wildreceipt-dev"}


def test_an_unknown_name_exits_2_with_the_valid_names(capsys, tmp_path) -> None:
    with pytest.raises(SystemExit) as err:
        F.main(["sroie-dev", "no-such-set", "--dest", str(tmp_path / "d")])
    assert err.value.code == 2
    message = capsys.readouterr().err
    assert "no-such-set" in message
    assert all(name in message for name in MANIFEST)
    assert not (tmp_path / "d").exists()


def test_module_runs_as_a_command() -> None:
    env = dict(os.environ)
    book = str(Path(F.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (book, env.get("PYTHONPATH")) if p)
    run = subprocess.run([sys.executable, "-m", "fovea_book.fetch", "--list"], env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert "wildreceipt-dev" in run.stdout


# ---------------------------------------------------------------------------- the manifest

def test_urls_are_raw_github_files_pinned_by_commit(monkeypatch) -> None:
    monkeypatch.delenv(F.BASE_URL_ENV, raising=False)
    ds = MANIFEST["sroie-dev"]
    assert F.raw_url(ds, "data/img/000.jpg") == (
        "https://raw.githubusercontent.com/zzzDavid/ICDAR-2019-SROIE/"
        "27be4271b251c256f695acbade9a801bffe85994/data/img/000.jpg")
    for d in MANIFEST.values():
        assert len(d.commit) == 40 and d.licence and d.split


def test_the_manifest_follows_the_split_rules() -> None:
    def stems(name: str, folder: str) -> list[str]:
        return sorted(f.dest.split("/")[1].split(".")[0] for f in MANIFEST[name].files
                      if f.dest.startswith(folder + "/"))

    assert stems("sroie-dev", "img") == [f"{i:03d}" for i in range(0, 626, 16)]
    train = {i for i in range(626) if i % 6 == 3} | {
        i for i in range(480, 626) if i % 16 and i % 6 != 3}
    assert stems("sroie-train", "img") == [f"{i:03d}" for i in sorted(train)]
    forms = sorted(stems("funsd-dev", "images") + stems("funsd-train", "images"))
    assert len(forms) == 147 and stems("funsd-dev", "images") == forms[::4]
    assert stems("osie-dev", "stimuli") == [str(i) for i in range(1010, 1701, 10)]
    assert stems("osie-train", "stimuli") == [str(i) for i in range(1005, 1700, 10)]
    assert stems("wildreceipt-dev", "img") == [f"{i:03d}" for i in range(0, 465, 8)]
    for name, folders in [("sroie-dev", ("box", "key")), ("funsd-dev", ("annotations",)),
                          ("wildreceipt-dev", ("ann", "box", "key"))]:
        first = "img" if name != "funsd-dev" else "images"
        for folder in folders:
            assert stems(name, folder) == stems(name, first), (name, folder)


def test_unsafe_manifest_paths_are_refused(tmp_path) -> None:
    raw = json.loads(F.MANIFEST_PATH.read_text())
    raw["datasets"] = {"sroie-dev": raw["datasets"]["sroie-dev"]}
    raw["datasets"]["sroie-dev"]["files"] = [dict(raw["datasets"]["sroie-dev"]["files"][0],
                                                  dest="../../outside.csv")]
    path = tmp_path / "m.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="not a safe relative path"):
        F.load_manifest(path)


@needs_ref
@pytest.mark.parametrize("name", ["sroie-dev", "funsd-dev", "osie-dev", "wildreceipt-dev"])
def test_the_manifest_pins_the_reference_copies(name) -> None:
    ds = MANIFEST[name]
    assert F.check_folder(ds, REF / name) == []
    on_disk = sorted(str(p.relative_to(REF / name)) for p in (REF / name).rglob("*")
                     if p.is_file())
    assert on_disk == sorted(f.dest for f in ds.files)


@needs_ref
def test_wildreceipt_derivation_reproduces_every_reference_file() -> None:
    ref = REF / "wildreceipt-dev"
    for ann in sorted((ref / "ann").glob("*.json")):
        number = int(ann.stem)
        record = json.loads(ann.read_text())
        record["file_name"] = image_name(number)
        line = json.dumps(record)
        for kind, path in [("ann", ann), ("box", ref / "box" / f"{ann.stem}.csv"),
                           ("key", ref / "key" / f"{ann.stem}.json")]:
            assert F.derive_wildreceipt(kind, line, number) == path.read_bytes(), path


@needs_ref
def test_force_keeps_the_users_own_files_and_says_so(mirror) -> None:
    """``--force`` over a dataset folder replaces the manifest's files and keeps every other
    file in it (it deleted them, without a word, before)."""
    manifest, base, _, dest = mirror
    ds = manifest["sroie-dev"]
    folder = dest / "sroie-dev"
    (folder / "key").mkdir(parents=True)
    (folder / "key" / "000.json").write_text("{}")                  # a manifest file, stale
    (folder / "notes.txt").write_text("my notes")                   # the user's own
    (folder / "mine").mkdir()
    (folder / "mine" / "extra.jpg").write_bytes(b"\xff\xd8 mine")
    outcome = F.fetch_dataset(ds, dest, base_url=base, force=True, progress=False)
    assert outcome == ("replaced; kept 2 file(s) not in the manifest: mine/extra.jpg, "
                       "notes.txt")
    assert F.check_folder(ds, folder) == []
    assert (folder / "notes.txt").read_text() == "my notes"
    assert (folder / "mine" / "extra.jpg").read_bytes() == b"\xff\xd8 mine"
    assert leftovers(dest) == ["sroie-dev"]                         # no old folder left


def test_an_empty_dest_is_refused(capsys, tmp_path, monkeypatch) -> None:
    """``--dest ''`` fetched into the default root, as if no --dest were given."""
    monkeypatch.setenv("FOVEA_DATA", str(tmp_path))
    monkeypatch.setattr(F, "fetch", lambda *a, **k: pytest.fail("fetched"))
    with pytest.raises(SystemExit) as e:
        F.main(["--dest", "", "sroie-dev"])
    assert e.value.code == 2
    assert "--dest must be a folder's path, got an empty string" in capsys.readouterr().err
