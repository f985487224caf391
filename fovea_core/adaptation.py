"""Adapt the learned localiser to a folder of your own pages, which nobody has annotated.

The committed localiser (:mod:`fovea_core.cascade.learned`) was trained on synthetic pages
and scanned receipts and forms; on a collection unlike them (phone photographs of
receipts, another country's scans) its map is worth little. A user has many pages of their
own kind and no answer boxes. :func:`adapt` reads each page once at full resolution with
the core's OCR (:func:`~fovea_core.cascade.pseudo_labels.page_labels`, cached on disk, so a
second run skips the reading) and takes the answers it is sure of as labels (a company
name at the head of a receipt, a date, a total, a form's value beside its key), then
fine-tunes the localiser from the committed weights on them:

* **samples** as the committed training builds them: each training page seen at
  ``gists_per_page`` of the committed gist budgets :attr:`AdaptConfig.gists`
  (:func:`~fovea_core.cascade.learned.gist_features` of the page's gist), the target of a
  label the area of its box on the gist's pixels
  (:func:`~fovea_core.cascade.learned.answer_targets`), its text size the box's height
  (as the committed training takes a scanned answer's line height), the question the
  label's own wording embedded as the localiser embeds questions (MiniLM); a share
  :attr:`AdaptConfig.null_share` of the pages also asks the empty question with the union
  of its labels as the answer (the question-agnostic prior the committed training keeps);
* **training** with the committed training's augmentation (the ink channel's gamma, gain
  and noise, :func:`~fovea_core.cascade.learned.augment_ink`, and noise on the question
  embedding, :func:`~fovea_core.cascade.learned.jitter_embedding`), its loss
  (:func:`~fovea_core.cascade.learned.batch_loss`), Adam with a cosine decay of the
  learning rate over the run, one seed for the gist budgets, the batches and the
  augmentation (the same pages and seed give the same weights, byte for byte);
* **validation**: pages whose name hashes to 0 modulo :attr:`AdaptConfig.valid_mod`
  (``crc32(name) % 5 == 0``, the committed training's rule for its real pages) are never
  trained on; the record gives the loss and the probability mass on their labels before
  and after. These are pseudo-labels, not the truth: a number to watch for drift, not a
  result.

**Against drift: L2-SP.** Without the user's labels nothing says when the fine-tuning has
gone wrong, and the labels cover a few families on the pages where the reading was sure.
The labels come from reading the page, not from the model's own predictions, so there is
no self-training loop for a slowly updated teacher (Adaptive Teacher, Li et al. 2022,
arXiv 2111.13216) to damp; the risk is forgetting what the committed training taught
(scans, forms, questions the labels never ask). So the loss adds
``l2sp / 2 * ||w - w_start||^2``, a pull of every weight toward the start weights (L2-SP,
Li, Grandvalet and Davoudi 2018, "Explicit inductive bias for transfer learning with
convolutional networks"), in place of a weight decay toward zero: the adapted localiser
may move only as far as the labels keep pulling it. One constant, not tuned on any
labelled page of the collection (a user has none).

Output: ``<out>.pt`` (float32 state dict) and ``<out>.json`` beside it (the SHA-256 of the
weights, so :func:`~fovea_core.cascade.learned.load_model` verifies them as it verifies
the committed ones; the pages and their SHA-256, the labels per family, the loss of every
step, validation before and after, the seconds of reading and of training, the start
weights' SHA-256, the configuration, the commit and the environment), both written to
temporary files first and moved into place at the end. A bad folder, no readable page or no
label found raises ``ValueError`` naming the problem, and nothing is written.

Use the result with ``foveate(page, question, method="cascade", localiser="<out>.pt")``,
``python -m fovea_core foveate ... --localiser <out>.pt`` or
``FoveatedProcessor(processor, localiser="<out>.pt")``. There the adapted weights give the
map of where the answer lies; the text height that sets the fovea's level is still the
committed weights' estimate (:func:`~fovea_core.cascade.allocator.text_size_map`), so the
size head trained here is recorded but not yet used.
"""

from __future__ import annotations

import io
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from fovea_core.cascade.core import gist
from fovea_core.cascade.learned import (GistLocaliserNet, batch_loss, collate_pages, file_sha256,
                                        gist_features, jitter_embedding, load_model,
                                        pool_target, weights_path)
from fovea_core.cascade.pseudo_labels import FAMILIES, PseudoLabel
from fovea_core.progress import progress_bar
from fovea_core.pyramid import build_pyramid, default_num_levels

__all__ = ["AdaptConfig", "adapt", "list_pages", "page_split", "embed_questions",
           "IMAGE_SUFFIXES", "NULL_SALT", "GIST_SALT"]

#: the file endings :func:`list_pages` takes as pages (case-insensitive)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp", ".gif")
#: salt of a page's draw of its gist budgets (the committed training's ``TRAIN_SEED % 9973``)
GIST_SALT = 10_000_000 % 9973
#: salt of a page's draw of whether it also asks the empty question (the committed training's)
NULL_SALT = 17


@dataclass(frozen=True)
class AdaptConfig:
    """Everything besides the pages and the start weights that determines the adapted
    weights. ``gists``, ``gists_per_page``, ``null_share``, ``batch`` and ``valid_mod`` are
    the committed training's (``fovea_core/weights/gist_localiser.json``; tested)."""

    seed: int = 0
    gists: tuple[int, ...] = (48, 64, 96)   # gist budgets a page is seen at
    gists_per_page: int = 2                 # distinct budgets per training page
    null_share: float = 0.25                # pages that also ask the empty question
    batch: int = 8                          # samples per step
    epochs: int = 3                         # passes over the training samples
    lr: float = 1e-3                        # Adam's peak rate (cosine decay to 0)
    l2sp: float = 0.01                      # pull toward the start weights (module docstring)
    valid_mod: int = 5                      # a page is held out if crc32(name) % this == 0
    families: tuple[str, ...] = FAMILIES    # pseudo-label families trained on

    def check(self) -> None:
        """``ValueError`` naming the first field out of its range."""
        if not (self.gists and all(isinstance(g, int) and g >= 1 for g in self.gists)):
            raise ValueError(f"gists must be gist budgets (ints >= 1), got {self.gists!r}")
        if not 1 <= self.gists_per_page <= len(self.gists):
            raise ValueError(f"gists_per_page must be in [1, {len(self.gists)}], got "
                             f"{self.gists_per_page}")
        if not 0.0 <= self.null_share <= 1.0:
            raise ValueError(f"null_share must be in [0, 1], got {self.null_share}")
        for name in ("batch", "epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0 or not self.l2sp >= 0:
            raise ValueError(f"lr must be > 0 and l2sp >= 0, got {self.lr} and {self.l2sp}")
        if self.valid_mod < 2:
            raise ValueError(f"valid_mod must be >= 2 (1 would hold out every page), got "
                             f"{self.valid_mod}")
        bad = [f for f in self.families if f not in FAMILIES]
        if bad or not self.families:
            raise ValueError(f"families must be a non-empty selection of {FAMILIES}, got "
                             f"{self.families!r}")


@dataclass
class _Sample:
    """One page at one gist budget, as :func:`~fovea_core.cascade.learned.collate_pages`
    takes it: features ``x [7, h, w]`` float16, gist pixel centres ``ys [h]``, ``xs [w]``
    (base px), ``half`` (half a gist pixel), ``inside [h, w]``; per question its text
    (``None``: the empty question), boxes ``[K, 4]``, log2 text height in gist pixels and
    family."""

    x: torch.Tensor
    ys: torch.Tensor
    xs: torch.Tensor
    half: float
    inside: torch.Tensor
    queries: list[str | None]
    boxes: list[np.ndarray]
    sizes: list[float]
    families: list[str] = field(default_factory=list)


def list_pages(pages: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """The page files of a folder (its non-hidden files ending in one of
    :data:`IMAGE_SUFFIXES`, sorted; not recursive), or the given list of files.

    Raises ``ValueError`` naming the folder when it does not exist, is not a folder, or
    holds no such file."""
    if isinstance(pages, (str, os.PathLike)):
        root = Path(pages)
        if not root.exists():
            raise ValueError(f"pages: no such folder {root}")
        if not root.is_dir():
            raise ValueError(f"pages: {root} is not a folder (give a folder of page images)")
        found = sorted(p for p in root.iterdir() if p.is_file() and not p.name.startswith(".")
                       and p.suffix.lower() in IMAGE_SUFFIXES)
        if not found:
            raise ValueError(f"pages: no image in {root} (files ending in "
                             f"{', '.join(IMAGE_SUFFIXES)})")
        return found
    found = [Path(p) for p in pages]
    if not found:
        raise ValueError("pages: the list of page files is empty")
    return found


def page_split(name: str, valid_mod: int = 5) -> str:
    """``"validation"`` when ``crc32(name) % valid_mod == 0`` (never trained on), else
    ``"train"``: the committed training's rule for its real pages, on the file name."""
    return "validation" if zlib.crc32(name.encode()) % valid_mod == 0 else "train"


def embed_questions(texts: Sequence[str]) -> dict[str, torch.Tensor]:
    """``{text: [384] MiniLM embedding}`` of the questions (``""``: the empty question),
    embedded in one call in sorted order, so the numbers do not depend on what this process
    embedded before (:func:`~fovea_core.importance.query.embed` caches per string)."""
    from fovea_core.importance.query import text_encoder

    vocab = sorted(set(texts))
    vecs = np.asarray(text_encoder().encode(vocab, normalize_embeddings=True,
                                            convert_to_numpy=True, show_progress_bar=False),
                      dtype=np.float32)
    return {t: torch.from_numpy(v.copy()) for t, v in zip(vocab, vecs)}


def _samples(image: torch.Tensor, labels: list[PseudoLabel], budgets: Sequence[int],
             null: bool) -> list[_Sample]:
    """One :class:`_Sample` per gist budget of a page ``image [1, C, H, W]`` and its labels
    (plus the empty question, the union of the labels' boxes, when ``null``). The pyramid
    is built only down to the level the coarsest gist reads (its levels are the same as a
    whole pyramid's)."""
    from fovea_core.allocators.grid import resize_grid

    h, w = image.shape[-2:]
    coarsest = max(resize_grid((h, w), int(b), 16)[2] for b in budgets)   # the smallest gist's
    pyr = build_pyramid(image, min(default_num_levels(h, w, 16), int(math.floor(coarsest)) + 2))
    out = []
    for b in budgets:                                           # two or three budgets
        g = gist(pyr, int(b))
        ys, xs = g.pixel_centres()
        queries: list[str | None] = [p.question for p in labels]
        boxes = [np.asarray(p.box, np.float64).reshape(1, 4) for p in labels]
        sizes = [float(np.log2(max(p.box[3] - p.box[1], 1.0) / g.pixel)) for p in labels]
        fams = [p.family for p in labels]
        if null:
            queries.append(None)
            boxes.append(np.concatenate(boxes))
            sizes.append(float(np.mean(sizes)))
            fams.append("")
        out.append(_Sample(gist_features(g)[0].half(), ys, xs, g.pixel / 2, g.inside(),
                           queries, boxes, sizes, fams))
    return out


def _embedding(q: str | None, emb: dict[str, torch.Tensor],
               gen: torch.Generator | None) -> torch.Tensor:
    v = emb[q or ""]
    return v if gen is None else jitter_embedding(v, gen)


def _evaluate(net: GistLocaliserNet, samples: list[_Sample], emb: dict[str, torch.Tensor],
              batch: int) -> dict:
    """Cross-entropy of the location, probability mass on the labelled box (``hit_mass``)
    and whether the arg-max lies on it (``top1``) over the questions of ``samples`` (no
    augmentation), overall and per family."""
    ce, mass, top1, fams = [], [], [], []
    with torch.no_grad():
        for k in range(0, len(samples), batch):                 # batches of samples
            part = samples[k:k + batch]
            q = torch.stack([_embedding(t, emb, None) for s in part for t in s.queries])
            bt = collate_pages(part, q)
            _, loc, _ = batch_loss(net, bt, parts=True)
            x, mask, q, page, target, _ = bt
            logit, _ = net(x, mask, q, page)
            p = torch.softmax(logit.flatten(1), 1)
            t = pool_target(target).flatten(1)
            ce.append(float(loc) * len(page))
            mass += (p * (t > 0)).sum(1).tolist()
            top1 += (t.gather(1, p.argmax(1, keepdim=True))[:, 0] > 0).float().tolist()
            fams += [f for s in part for f in s.families]
    n = len(mass)
    per = {f: dict(questions=sum(g == f for g in fams),
                   hit_mass=float(np.mean([m for m, g in zip(mass, fams) if g == f])),
                   top1=float(np.mean([m for m, g in zip(top1, fams) if g == f])))
           for f in sorted(set(fams)) if f}
    return dict(questions=n, cross_entropy=sum(ce) / max(n, 1),
                hit_mass=float(np.mean(mass)) if n else float("nan"),
                top1=float(np.mean(top1)) if n else float("nan"), fields=per)


def _commit() -> str | None:
    """The git commit of the checkout this module runs from, or ``None`` (an installed
    package, no git)."""
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() or None if r.returncode == 0 else None


def _check_out(out: str | os.PathLike) -> Path:
    out = Path(out)
    if out.suffix != ".pt":
        raise ValueError(f"out must name a .pt file (its record goes beside it as .json), got "
                         f"{out}")
    committed = weights_path()
    if out.resolve() == committed.resolve():
        raise ValueError(f"out {out} is the committed weights; adapted weights go elsewhere "
                         "(the committed ones stay the default)")
    if out.exists() and out.is_dir():
        raise ValueError(f"out {out} is a folder; name the .pt file to write")
    return out


def _dumps(record: dict) -> str:
    """The record as indented JSON, but one line per page and one line for each list of
    per-step numbers (a folder of hundreds of pages stays a file one can read and diff)."""
    slots = {"@PAGES@": "[\n  " + ",\n  ".join(json.dumps(r) for r in record["pages"]) + "\n ]"
             if record["pages"] else "[]"}
    train = dict(record["train"])
    for key in ("loss", "l2sp_distance"):
        slots[f"@{key}@"] = json.dumps(train[key])
        train[key] = f"@{key}@"
    text = json.dumps(dict(record, pages="@PAGES@", train=train), indent=1)
    for k, v in slots.items():
        text = text.replace(f'"{k}"', v, 1)
    return text


def _write(out: Path, state: dict, record: dict) -> None:
    """``out`` and ``out.json`` through temporary files in the same folder, moved into place
    (the weights first, the record that vouches for them last). The weights are serialised
    in memory, so their bytes depend on the weights alone (a ``torch.save`` to a path names
    its archive after the file)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_pt = tempfile.NamedTemporaryFile(dir=out.parent, prefix=f".{out.stem}.", suffix=".pt",
                                         delete=False)
    tmp_js = tempfile.NamedTemporaryFile(dir=out.parent, prefix=f".{out.stem}.", suffix=".json",
                                         delete=False, mode="w")
    mask = os.umask(0)
    os.umask(mask)
    try:
        for t in (tmp_pt.name, tmp_js.name):   # a temporary file is private; the result is not
            os.chmod(t, 0o666 & ~mask)
        buf = io.BytesIO()                     # the archive's inner name is then fixed, not the
        torch.save(state, buf)                 # file's: the same weights, the same bytes
        tmp_pt.write(buf.getvalue())
        tmp_pt.close()
        record = dict(sha256=file_sha256(tmp_pt.name), **record)
        tmp_js.write(_dumps(record) + "\n")
        tmp_js.close()
        os.replace(tmp_pt.name, out)
        os.replace(tmp_js.name, out.with_suffix(".json"))
    finally:
        for t in (tmp_pt.name, tmp_js.name):
            if os.path.exists(t):
                os.unlink(t)


def adapt(pages: str | os.PathLike | Sequence[str | os.PathLike], *, out: str | os.PathLike,
          start: str | os.PathLike | None = None, config: AdaptConfig = AdaptConfig(),
          progress: Callable[[int], tuple[Callable, Callable, Callable]] | bool = True,
          threads: int | None = 1) -> dict:
    """Fine-tune the learned localiser on the pseudo-labels of a folder of pages (module
    docstring) and write ``out`` (``.pt``) and its record ``out.json``.

    Args:
        pages: a folder of page images (:func:`list_pages`), or a list of image files.
        out: the ``.pt`` file to write (its folder is created); never the committed weights.
        start: the weights to start from (default: the committed ones,
            :func:`~fovea_core.cascade.learned.weights_path`), verified against their record.
        config: :class:`AdaptConfig` (seed, gist budgets, steps, learning rate, L2-SP).
        progress: ``True`` a progress bar on stderr while the pages are read, ``False``
            none, or a factory ``total -> (update, write, close)``.
        threads: torch's threads while training (1: deterministic and one core); restored
            after.

    Returns:
        The record written beside the weights (a dict).

    Raises:
        ValueError: a bad folder, no readable page, no label on any training page, a bad
            ``out`` or ``config``; nothing is written.
    """
    from fovea_core.cascade import pseudo_labels as P
    from fovea_core.foveation import load_image

    t_all = time.perf_counter()
    config.check()
    out = _check_out(out)
    files = list_pages(pages)
    start_path = Path(start) if start is not None else weights_path()
    net0 = load_model(str(start_path), verify=True)
    start_meta = json.loads(start_path.with_suffix(".json").read_text())
    if progress is True:
        update, write, close = progress_bar(len(files), "reading pages")
    elif progress:
        update, write, close = progress(len(files))
    else:
        update, write, close = (lambda n=1: None), (lambda s: None), (lambda: None)

    rows, train_s, valid_s, skipped = [], [], [], []
    ocr_s = feat_s = 0.0
    try:
        for index, path in enumerate(files):                   # the pages, read once each
            name = path.name
            try:
                image = load_image(path)
            except (OSError, ValueError, TypeError) as err:
                skipped.append(dict(name=name, reason=f"{type(err).__name__}: {err}"))
                write(f"skipped {name}: {type(err).__name__}: {err}")
                update(1)
                continue
            t = time.perf_counter()
            try:
                labels = [p for p in P.page_labels(image) if p.family in config.families]
            except ValueError as err:                          # e.g. a page too small to read
                skipped.append(dict(name=name, reason=f"not read: {err}"))
                write(f"skipped {name}: not read: {err}")
                update(1)
                continue
            finally:
                ocr_s += time.perf_counter() - t
            split = page_split(name, config.valid_mod)
            rng = np.random.default_rng([config.seed, index, GIST_SALT])
            if split == "train":
                budgets = [int(b) for b in rng.choice(config.gists, size=config.gists_per_page,
                                                      replace=False)]
            else:
                budgets = [config.gists[len(valid_s) % len(config.gists)]]
            null = split == "train" and bool(
                np.random.default_rng([config.seed, index, NULL_SALT]).random()
                < config.null_share)
            t = time.perf_counter()
            h, w = image.shape[-2:]
            if labels:
                try:
                    made = _samples(image, labels, budgets, null)
                except ValueError as err:                      # a page too small for a gist
                    made = []
                    skipped.append(dict(name=name, reason=f"no gist: {err}"))
                (train_s if split == "train" else valid_s).extend(made)
            feat_s += time.perf_counter() - t
            rows.append(dict(name=name, sha256=file_sha256(path), size=[int(h), int(w)],
                             split=split, gists=budgets if labels else [],
                             null_question=null and bool(labels),
                             labels=[dict(family=p.family, question=p.question,
                                          box=[round(v, 1) for v in p.box],
                                          confidence=round(p.confidence, 4),
                                          evidence=p.evidence) for p in labels]))
            update(1)
    finally:
        close()
    if not rows:
        raise ValueError(f"pages: no readable page among {len(files)} file(s) "
                         f"(first: {skipped[0]['name']}: {skipped[0]['reason']})")
    if not train_s:
        n_lab = sum(len(r["labels"]) for r in rows)
        n_fit = sum(r["split"] == "train" for r in rows)
        raise ValueError(f"pages: no pseudo-label found on the {n_fit} training page(s) of "
                         f"{len(rows)} readable page(s) ({n_lab} label(s) "
                         "in all): the reading found no company, date, total or form key it "
                         "was sure of; nothing to adapt to")

    # ------------------------------------------------------------------ training
    vocab = {q or "" for s in train_s + valid_s for q in s.queries} | {""}
    emb = embed_questions(sorted(vocab))
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        torch.manual_seed(config.seed)
        net = GistLocaliserNet(**start_meta.get("arch", {}))
        net.load_state_dict(net0.state_dict())
        ref = [p.detach().clone() for p in net.parameters()]
        net.eval()
        t = time.perf_counter()
        before = _evaluate(net, valid_s, emb, config.batch) if valid_s else None
        valid_secs = time.perf_counter() - t
        opt = torch.optim.Adam(net.parameters(), lr=config.lr)
        per_epoch = math.ceil(len(train_s) / config.batch)
        total = per_epoch * config.epochs
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda k: 0.5 * (1 + math.cos(math.pi * min(k, total) / total)))
        gen = torch.Generator().manual_seed(config.seed)
        losses, pulls = [], []
        t = time.perf_counter()
        for _ in range(config.epochs):
            order = torch.randperm(len(train_s), generator=gen).tolist()
            for k in range(0, len(order), config.batch):       # the steps of an epoch
                part = [train_s[i] for i in order[k:k + config.batch]]
                q = torch.stack([_embedding(t_, emb, gen) for s in part for t_ in s.queries])
                bt = collate_pages(part, q, augment=gen)
                net.train()
                loss = batch_loss(net, bt)
                pull = sum(((p - r) ** 2).sum() for p, r in zip(net.parameters(), ref))
                opt.zero_grad()
                (loss + 0.5 * config.l2sp * pull).backward()
                opt.step()
                sched.step()
                losses.append(float(loss.detach()))
                pulls.append(float(pull.detach()))
        train_secs = time.perf_counter() - t
        net.eval()
        t = time.perf_counter()
        after = _evaluate(net, valid_s, emb, config.batch) if valid_s else None
        valid_secs += time.perf_counter() - t
    finally:
        torch.set_num_threads(old_threads)

    counts = {split: {f: sum(lab["family"] == f for r in rows if r["split"] == split
                             for lab in r["labels"]) for f in config.families}
              for split in ("train", "validation")}
    state = {k: v.detach().clone().float() for k, v in net.state_dict().items()}
    record = dict(
        kind="adapted", arch=dict(start_meta.get("arch", {})),
        parameters=int(sum(v.numel() for v in state.values())),
        start=dict(path=str(start_path), sha256=file_sha256(start_path)),
        config=asdict(config),
        pages=rows, skipped=skipped,
        labels=dict(counts, pages_with_labels={
            s: sum(bool(r["labels"]) for r in rows if r["split"] == s)
            for s in ("train", "validation")}),
        train=dict(samples=len(train_s), questions=sum(len(s.queries) for s in train_s),
                   steps=len(losses), steps_per_epoch=per_epoch, loss=losses,
                   l2sp_distance=pulls),
        validation=dict(rule=f"crc32(page name) % {config.valid_mod} == 0, never trained on; "
                             "scored on its pseudo-labels (not the truth)",
                        pages=sum(r["split"] == "validation" for r in rows),
                        samples=len(valid_s), before=before, after=after),
        seconds=dict(ocr=ocr_s, features=feat_s, train=train_secs, validation=valid_secs,
                     total=time.perf_counter() - t_all),
        commit=_commit(),
        environment=dict(torch=torch.__version__, numpy=np.__version__,
                         python=platform.python_version(), machine=platform.machine(),
                         threads=threads, cpus=os.cpu_count()))
    _write(out, state, record)
    return json.loads(out.with_suffix(".json").read_text())
