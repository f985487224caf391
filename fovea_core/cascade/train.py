"""Train the cascade's learned localiser on synthetic pages: ``python -m fovea_core.cascade.train``.

Data (all synthetic, generated here from seeds; no real receipt is ever read):

* pages of two layouts of :mod:`fovea_core.eval.documents`: ``"paper"`` (the book's pages)
  and ``"receipt"``, with seeds from :data:`TRAIN_SEED` upwards (far from the seeds any
  chapter evaluates on: 1000 + k);
* questions phrased with the ``"train"`` wording pool (the ``"heldout"`` pool and the
  ``"invoice"`` layout are kept for evaluation);
* each page seen at one gist budget ``G`` drawn from :attr:`TrainConfig.gists`;
* for a share :attr:`TrainConfig.null_share` of the pages, one extra "question" with no
  text whose answer is every answer of the page (the question-agnostic prior).

Model and loss: :class:`~fovea_core.cascade.learned.GistLocaliserNet`, cross-entropy
between the softmax over the page's gist pixels and the answer boxes' area on them
(:func:`~fovea_core.cascade.learned.target_map`), Adam with a cosine learning-rate decay.

Reproducibility: one seed fixes the pages, the gist budgets, the initial weights, the
batch order and the augmentation; page ``i`` is a pure function of ``(seed, i)``, so the
first steps can be re-run without generating the whole set. The defaults of
:class:`TrainConfig` and of every command-line option are the configuration of the
committed run (``data/models/gist_localiser.json`` records it; a test compares them).

Output: ``<name>.pt`` (float32 state dict) and ``<name>.json`` beside it (its SHA-256, the
configuration, the loss of every step, validation metrics, the time it took). By default
they go to ``_build/models/gist_localiser.pt``, never over the committed weights;
``--replace-committed`` writes ``data/models/gist_localiser.pt`` and its record, which the
book loads (and whose SHA-256 ``tests/test_cascade_train.py`` pins, so a replacement must
be committed with the new hash on purpose). ``--out`` naming the committed file without
that flag is refused before anything is trained. ``tests/test_cascade_train.py`` also
re-runs the first steps and compares them with the record.

Examples::

    python -m fovea_core.cascade.train                      # -> _build/models/ (minutes)
    python -m fovea_core.cascade.train --epochs 8 --out _build/models/e8.pt
    python -m fovea_core.cascade.train --replace-committed  # -> data/models/ (then commit
                                                            #    it with the new hash)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from fovea_core.cascade.core import Gist, gist
from fovea_core.cascade.learned import (GistLocaliserNet, file_sha256, gist_features,
                                        pool_target, question_embedding, weights_path)
from fovea_core.eval.documents import Document, make_document
from fovea_core.paths import project_root
from fovea_core.pyramid import Pyramid, default_num_levels

__all__ = ["TRAIN_SEED", "VALID_SEED", "TrainConfig", "Sample", "make_sample",
           "training_samples", "train", "evaluate", "default_output", "build_parser",
           "output_path", "main"]

#: first seed of the training pages (chapters evaluate seeds 1000 + k)
TRAIN_SEED = 10_000_000
#: first seed of the validation pages (held out from training)
VALID_SEED = 20_000_000


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines the trained weights. The defaults are the committed run's
    configuration (``config`` in ``data/models/gist_localiser.json``; tested)."""

    seed: int = 0
    pages: int = 400                      # training pages
    gists_per_page: int = 2               # samples per page (distinct gist budgets)
    receipt_share: float = 0.6            # share of receipts among them (rest: paper)
    gists: tuple[int, ...] = (48, 64, 96)
    null_share: float = 0.25              # pages with an extra question-agnostic target
    epochs: int = 5
    batch: int = 8                        # pages per step
    lr: float = 3e-3
    weight_decay: float = 1e-4
    width: int = 16                       # network width (GistLocaliserNet)
    maps: int = 32
    wording: str = "train"
    valid_pages: int = 48                 # per validation set


@dataclass
class Sample:
    """One training page: its gist features, geometry and questions."""

    x: torch.Tensor                       # [7, h, w] float16
    ys: torch.Tensor                      # [h] gist pixel centres (base px), float64
    xs: torch.Tensor                      # [w]
    half: float                           # half a gist pixel (base px)
    inside: torch.Tensor                  # [h, w] bool
    queries: list[tuple[str, str] | None]  # per question (wording key, {item} slot); None
                                           # = no question
    boxes: list[np.ndarray]               # per question [K, 4] base px
    sizes: list[float]                    # per question: log2 text height in gist pixels
    layout: str
    gist_budget: int
    meta: dict = field(default_factory=dict)


def _page_rng(cfg: TrainConfig, index: int, salt: int) -> np.random.Generator:
    return np.random.default_rng([cfg.seed, index, salt])


def page_spec(cfg: TrainConfig, index: int, *, base: int = TRAIN_SEED
              ) -> tuple[str, int, list[int]]:
    """``(layout, page seed, gist budgets)`` of training page ``index`` (a pure function)."""
    rng = _page_rng(cfg, index, base % 9973)
    layout = "receipt" if rng.random() < cfg.receipt_share else "paper"
    k = min(cfg.gists_per_page, len(cfg.gists))
    budgets = [int(b) for b in rng.choice(cfg.gists, size=k, replace=False)]
    return layout, base + cfg.seed * 100_003 + index, budgets


def gist_of(doc: Document, budget: int) -> Gist:
    """The gist of a page, building only the pyramid levels it needs."""
    from fovea_core.allocators.grid import resize_grid

    h, w = doc.size
    level = resize_grid((h, w), budget, 16)[2]
    levels = min(default_num_levels(h, w, 16), int(math.floor(level)) + 2)
    return gist(fast_pyramid(doc.image, levels), budget)


def fast_pyramid(image: np.ndarray, num_levels: int) -> Pyramid:
    """The page's :class:`~fovea_core.pyramid.Pyramid` built with ``cv2.pyrDown`` (what
    :func:`~fovea_core.pyramid.pyr_down` reproduces, ``tests/test_pyramid.py``), on one
    channel when the page is grey: several times faster for generating training data."""
    import cv2

    grey = bool((image[..., :1] == image).all())             # synthetic pages: R = G = B
    x = (image[..., 0] if grey else image).astype(np.float32) / 255.0
    levels = [x]
    for _ in range(num_levels - 1):
        levels.append(cv2.pyrDown(levels[-1]))
    as_t = (lambda a: torch.from_numpy(a)[None, None]) if grey else \
        (lambda a: torch.from_numpy(a).permute(2, 0, 1)[None])  # noqa: E731
    return Pyramid(tuple(as_t(np.ascontiguousarray(a)) for a in levels))


def make_sample(doc: Document, budget: int, *, null: bool, layout: str) -> Sample:
    """Gist features and targets of one page (plus the question-agnostic target if ``null``)."""
    g = gist_of(doc, budget)
    ys, xs = g.pixel_centres()
    from fovea_core.eval.documents import _wording_key

    queries: list[tuple[str, str] | None] = [(_wording_key(q.field, layout), _item(q))
                                             for q in doc.questions]
    boxes = [np.asarray(q.boxes, np.float64).reshape(-1, 4) for q in doc.questions]
    sizes = [float(np.log2(max(q.size_px, 1) / g.pixel)) for q in doc.questions]
    if null:
        queries.append(None)
        boxes.append(np.concatenate(boxes))
        sizes.append(float(np.mean(sizes)))
    return Sample(gist_features(g)[0].half(), ys, xs, g.pixel / 2, g.inside(), queries, boxes,
                  sizes, layout, budget, dict(doc_id=doc.doc_id, size=doc.size))


def _item(q) -> str:
    """The table item an ``amount`` question names (from its default wording), else ``""``."""
    if q.field != "amount":
        return ""
    return q.question.removeprefix("What is the amount for ").rstrip("?")


def training_samples(cfg: TrainConfig, index: int) -> list[Sample]:
    """The samples of training page ``index`` (one per gist budget; a pure function of
    ``cfg.seed`` and ``index``)."""
    layout, seed, budgets = page_spec(cfg, index)
    null = _page_rng(cfg, index, 17).random() < cfg.null_share
    doc = make_document(seed, layout=layout)              # questions re-phrased per step
    return [make_sample(doc, b, null=null, layout=layout) for b in budgets]


def epoch_batches(cfg: TrainConfig, gen: torch.Generator) -> list[list[tuple[int, int]]]:
    """One epoch's batches of ``(page, gist)`` sample ids: a random order, cut into groups
    of ``8 * batch`` samples, each group sorted by the page's seed-determined shape class
    (layout, gist budget) so that a batch pads little, then cut into batches; the batch
    order is shuffled again."""
    ids = [(i, j) for i in range(cfg.pages) for j in range(cfg.gists_per_page)]
    perm = torch.randperm(len(ids), generator=gen).tolist()
    ids = [ids[k] for k in perm]
    group = 8 * cfg.batch
    batches = []
    for g0 in range(0, len(ids), group):                    # sort within a group
        chunk = sorted(ids[g0:g0 + group], key=lambda t: (page_spec(cfg, t[0])[0],
                                                          page_spec(cfg, t[0])[2][t[1]]))
        batches += [chunk[k:k + cfg.batch] for k in range(0, len(chunk), cfg.batch)]
    order = torch.randperm(len(batches), generator=gen).tolist()
    return [batches[k] for k in order]


def _targets(s: Sample) -> torch.Tensor:
    """``[Q, h, w]`` normalised answer areas per gist pixel (separable overlaps)."""
    out = []
    for b in s.boxes:                                   # a handful of questions
        bt = torch.as_tensor(b)
        oy = (torch.minimum(s.ys[None] + s.half, bt[:, 3:4]) -
              torch.maximum(s.ys[None] - s.half, bt[:, 1:2])).clamp(min=0)
        ox = (torch.minimum(s.xs[None] + s.half, bt[:, 2:3]) -
              torch.maximum(s.xs[None] - s.half, bt[:, 0:1])).clamp(min=0)
        t = torch.einsum("ky,kx->yx", oy, ox) * s.inside
        out.append(t / t.sum().clamp(min=1e-12))
    return torch.stack(out).float()


#: standard deviation of the Gaussian noise added to each embedding coordinate in training
EMBED_NOISE = 0.01


def phrase_embedding(key: tuple[str, str] | None, emb: dict, wording: str,
                     gen: torch.Generator | None) -> torch.Tensor:
    """The embedding of a question ``(wording key, item)``: with ``gen`` (training), a random
    mix ``lam e_i + (1 - lam) e_j`` of two random templates of the field plus Gaussian noise,
    renormalised (the network must not learn a handful of exact sentence vectors); without,
    the field's first template. ``None``: the empty question."""
    from fovea_core.eval.documents import WORDINGS

    if key is None:
        return emb[""]
    field, item = key[:2]
    pool = [t.format(item=item) for t in WORDINGS[wording][field]]
    if gen is None:
        return emb[pool[key[2] % len(pool)] if len(key) > 2 else pool[0]]
    i, j = torch.randint(len(pool), (2,), generator=gen).tolist()
    lam = float(torch.rand((), generator=gen))
    v = lam * emb[pool[i]] + (1 - lam) * emb[pool[j]]
    v = v + EMBED_NOISE * torch.randn(v.shape, generator=gen)
    return v / v.norm().clamp(min=1e-6)


def collate(samples: list[Sample], emb: dict, *, augment: torch.Generator | None = None,
            wording: str = "train"):
    """Pad a list of pages to one batch: ``x [B, 7, H, W]``, ``mask [B, H, W]``,
    ``q [Q, 384]``, ``page [Q]``, ``target [Q, H, W]``, ``size [Q]`` (log2 text height in
    gist pixels). Questions are phrased from the ``wording`` pool
    (:func:`phrase_embedding`). With ``augment`` (a generator), the phrasing is random, and
    the ink channel is given a random gamma and gain and a little noise."""
    hmax = max(s.x.shape[1] for s in samples)
    wmax = max(s.x.shape[2] for s in samples)
    b = len(samples)
    x = torch.zeros(b, 7, hmax, wmax)
    mask = torch.zeros(b, hmax, wmax, dtype=torch.bool)
    tg, qs, page, size = [], [], [], []
    for i, s in enumerate(samples):                     # pages of one batch
        h, w = s.x.shape[1:]
        x[i, :, :h, :w] = s.x.float()
        mask[i, :h, :w] = s.inside
        t = _targets(s)
        tg.append(torch.nn.functional.pad(t, (0, wmax - w, 0, hmax - h)))
        qs += [phrase_embedding(q, emb, wording, augment) for q in s.queries]
        page += [i] * len(s.queries)
        size += s.sizes
    if augment is not None:
        gamma = torch.exp(torch.randn(b, 1, 1, generator=augment) * 0.25)
        gain = torch.exp(torch.randn(b, 1, 1, generator=augment) * 0.15)
        noise = torch.randn(b, hmax, wmax, generator=augment) * 0.03
        ink = (x[:, 0].clamp(min=0) ** gamma * gain + noise).clamp(0, 1)
        x[:, 0] = ink * mask
    return x, mask, torch.stack(qs), torch.tensor(page), torch.cat(tg), torch.tensor(size)


#: weight of the text-size loss (squared error in octaves) beside the location loss
SIZE_WEIGHT = 0.5


def batch_loss(net: GistLocaliserNet, batch, *, parts: bool = False):
    """Mean cross-entropy ``-sum_pixels target * log_softmax(logits)`` over the questions,
    plus :data:`SIZE_WEIGHT` x the squared error (octaves) of the size map averaged over the
    answer's pixels. ``parts``: return ``(total, location, size)``."""
    x, mask, q, page, target, size = batch
    logit, smap = net(x, mask, q, page)
    logp = torch.log_softmax(logit.flatten(1), 1)
    t = pool_target(target).flatten(1)
    loc = -(t * torch.where(t > 0, logp, torch.zeros_like(logp))).sum(1).mean()
    pred = (t * smap[page].flatten(1)).sum(1)
    err = ((pred - size) ** 2).mean()
    total = loc + SIZE_WEIGHT * err
    return (total, loc, err) if parts else total


def _items() -> list[str]:
    from fovea_core.eval.documents import _ITEMS

    return list(_ITEMS)


def _rotate(s: Sample, wording: str, k: int) -> Sample:
    """``s`` whose questions use template ``k`` of their pool (as the first template, which
    :func:`phrase_embedding` takes without a generator)."""
    from dataclasses import replace as _replace

    from fovea_core.eval.documents import WORDINGS

    def rot(q):
        if q is None:
            return None
        pool = WORDINGS[wording][q[0]]
        return (q[0], q[1], k % len(pool))
    return _replace(s, queries=[rot(q) for q in s.queries])


def vocabulary(wording: str) -> list[str]:
    """Every question a training page can ask in ``wording`` (each template of every field,
    ``{item}`` filled with every table item) and ``""`` (no question), sorted. Embedded once,
    in one call, so the embeddings do not depend on the order pages are generated in."""
    from fovea_core.eval.documents import _ITEMS, WORDINGS

    out = {""}
    for pool in WORDINGS[wording].values():
        for t in pool:
            out.update(t.format(item=i) for i in _ITEMS) if "{item}" in t else out.add(t)
    return sorted(out)


def train(cfg: TrainConfig = TrainConfig(), *, max_steps: int | None = None,
          progress: bool = True, threads: int | None = 1) -> tuple[GistLocaliserNet, dict]:
    """Train on ``cfg`` (deterministic). Returns ``(net, record)`` with the loss of every
    step in ``record["loss"]``. ``max_steps`` stops early (the test re-runs the first
    steps of the committed run); only the pages those steps need are generated."""
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(cfg.seed)
    net = GistLocaliserNet(width=cfg.width, maps=cfg.maps)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = len(epoch_batches(cfg, torch.Generator().manual_seed(cfg.seed)))
    total = steps_per_epoch * cfg.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda k: 0.5 * (1 + math.cos(math.pi * min(k, total) / total)))
    gen = torch.Generator().manual_seed(cfg.seed)
    cache: dict[int, list[Sample]] = {}
    vocab = vocabulary(cfg.wording)
    emb = dict(zip(vocab, question_embedding(vocab)))
    losses: list[float] = []
    t0 = time.perf_counter()
    gen_s = 0.0
    step = 0
    for epoch in range(cfg.epochs):
        for ids in epoch_batches(cfg, gen):
            if max_steps is not None and step >= max_steps:
                break
            t1 = time.perf_counter()
            for i, _ in ids:                                # generate pages on first use
                if i not in cache:
                    cache[i] = training_samples(cfg, i)
            gen_s += time.perf_counter() - t1
            batch = collate([cache[i][j] for i, j in ids], emb, augment=gen, wording=cfg.wording)
            net.train()
            loss = batch_loss(net, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
            step += 1
        if progress:
            recent = np.mean(losses[-steps_per_epoch:]) if losses else float("nan")
            print(f"epoch {epoch + 1}/{cfg.epochs}: mean loss {recent:.4f} "
                  f"({time.perf_counter() - t0:.0f} s, {len(cache)} pages)", flush=True)
        if max_steps is not None and step >= max_steps:
            break
    net.eval()
    record = dict(loss=losses, steps=step, seconds=time.perf_counter() - t0,
                  data_seconds=gen_s, pages_generated=len(cache),
                  layouts={lay: sum(s[0].layout == lay for s in cache.values())
                           for lay in ("paper", "receipt")},
                  questions=sum(len(s[0].queries) for s in cache.values()))
    return net, record


def validation_samples(cfg: TrainConfig, layout: str, n: int | None = None) -> list[Sample]:
    """Held-out pages (seeds from :data:`VALID_SEED`), gist budget cycling through
    ``cfg.gists``."""
    n = cfg.valid_pages if n is None else n
    out = []
    for i in range(n):                                      # a few dozen pages
        doc = make_document(VALID_SEED + i, layout=layout)
        out.append(make_sample(doc, cfg.gists[i % len(cfg.gists)], null=False, layout=layout))
    return out


def evaluate(net: GistLocaliserNet, samples: list[Sample], wording: str = "heldout") -> dict:
    """Validation metrics: cross-entropy, the probability mass on the answer
    (``hit_mass``), whether the arg-max output pixel lies on the answer (``top1``), and the
    text-size error in octaves (``size_rmse``: the size map averaged under the *predicted*
    location, as the cascade uses it). Each question is asked in every template of
    ``wording`` in turn (one template per page, cycling)."""
    from fovea_core.eval.documents import WORDINGS

    vocab = sorted({t.format(item=i) for pool in WORDINGS[wording].values() for t in pool
                    for i in _items()} | {""})
    emb = dict(zip(vocab, question_embedding(vocab)))
    ce, mass, top1, serr = [], [], [], []
    with torch.no_grad():
        for k in range(0, len(samples), 8):                 # batches of pages
            rot = [_rotate(s, wording, k + i) for i, s in enumerate(samples[k:k + 8])]
            batch = collate(rot, emb, wording=wording)
            ce.append(float(batch_loss(net, batch, parts=True)[1]) * batch[2].shape[0])
            x, mask, q, page, target, size = batch
            logit, smap = net(x, mask, q, page)
            p = torch.softmax(logit.flatten(1), 1)
            t = pool_target(target).flatten(1)
            mass += (p * (t > 0)).sum(1).tolist()
            top1 += (t.gather(1, p.argmax(1, keepdim=True))[:, 0] > 0).float().tolist()
            serr += ((p * smap[page].flatten(1)).sum(1) - size).tolist()
    n = len(mass)
    return dict(questions=n, cross_entropy=sum(ce) / max(n, 1), hit_mass=float(np.mean(mass)),
                top1=float(np.mean(top1)), size_rmse=float(np.sqrt(np.mean(np.square(serr)))))


def default_output() -> Path:
    """Where a training run writes by default: ``_build/models/gist_localiser.pt`` (scratch,
    ignored by git), never the committed :func:`~fovea_core.cascade.learned.weights_path`."""
    return project_root() / "_build" / "models" / weights_path().name


def build_parser() -> argparse.ArgumentParser:
    """The command line. Every option that sets the configuration defaults to the committed
    run's value (:class:`TrainConfig`'s defaults; ``--threads`` to the record's 1)."""
    cfg = TrainConfig()
    parser = argparse.ArgumentParser(prog="python -m fovea_core.cascade.train",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write the weights (the JSON record goes beside them); "
                             f"default: {os.path.relpath(default_output(), project_root())}")
    parser.add_argument("--replace-committed", action="store_true",
                        help=f"write the committed weights {weights_path().name} and their "
                             "record under data/models (the book's; their SHA-256 is pinned "
                             "in tests/test_cascade_train.py)")
    parser.add_argument("--pages", type=int, default=cfg.pages,
                        help="training pages (default: %(default)s, the committed run's)")
    parser.add_argument("--epochs", type=int, default=cfg.epochs,
                        help="epochs (default: %(default)s, the committed run's)")
    parser.add_argument("--seed", type=int, default=cfg.seed,
                        help="seed of pages, weights and batches (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default %(default)s: deterministic and fastest on "
                             "a shared machine; the committed run used 1)")
    return parser


def output_path(args: argparse.Namespace) -> Path:
    """The weights file a run will write, checked before anything is trained: the committed
    file only with ``--replace-committed`` (which takes no other ``--out``). Raises
    ``ValueError`` naming the option otherwise."""
    for name in ("pages", "epochs", "threads"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be at least 1, got {getattr(args, name)}")
    committed = weights_path()
    if args.replace_committed:
        if args.out is not None and Path(args.out).resolve() != committed.resolve():
            raise ValueError(f"--replace-committed writes {committed}; drop --out "
                             f"({args.out}) or drop --replace-committed")
        return committed
    out = Path(args.out) if args.out is not None else default_output()
    if out.suffix != ".pt":
        raise ValueError(f"--out must name a .pt file (its record goes beside it as .json), "
                         f"got {out}")
    if out.resolve() == committed.resolve() or \
            out.with_suffix(".json").resolve() == committed.with_suffix(".json").resolve():
        raise ValueError(f"--out {out} is the committed weights (and their record); pass "
                         "--replace-committed to replace them on purpose")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        out = output_path(args)
    except ValueError as exc:
        parser.error(str(exc))
    cfg = TrainConfig(seed=args.seed, pages=args.pages, epochs=args.epochs)
    where = "the COMMITTED weights " if out == weights_path() else ""
    print(f"training the gist localiser into {where}{out}: {cfg}", flush=True)
    net, rec = train(cfg, threads=args.threads)
    t0 = time.perf_counter()
    vs = {layout: validation_samples(cfg, layout) for layout in ("paper", "receipt", "invoice")}
    valid = {f"{layout}/{wording}": evaluate(net, vs[layout], wording)
             for layout, wording in (("paper", "heldout"), ("receipt", "heldout"),
                                     ("invoice", "heldout"), ("paper", "train"),
                                     ("receipt", "train"))}
    out.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone().float() for k, v in net.state_dict().items()}
    torch.save(state, out)
    meta = dict(sha256=file_sha256(out), arch=dict(width=cfg.width, maps=cfg.maps),
                parameters=int(sum(v.numel() for v in state.values())),
                config=asdict(cfg), train=rec, validation=valid,
                validation_seconds=time.perf_counter() - t0,
                environment=dict(torch=torch.__version__, python=platform.python_version(),
                                 machine=platform.machine(), threads=args.threads))
    out.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps({k: meta[k] for k in ("sha256", "parameters", "validation")}, indent=1))
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB) in "
          f"{rec['seconds']:.0f} s of training")
    if out == weights_path():
        print("replaced the committed weights: update COMMITTED_SHA256 in "
              "tests/test_cascade_train.py to the new hash above, and commit both")
    return 0


if __name__ == "__main__":
    sys.exit(main())
