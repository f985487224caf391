"""How good are the pseudo-labels? Measured on the labelled training pages only.

:mod:`fovea_core.cascade.pseudo_labels` derives, from a page read once at full resolution,
where the answers to the book's questions lie, with a confidence. Here its labels are
compared with the true answer boxes of the *training* pages (``sroie-train``: the receipt
families company, date and total; ``funsd-train``: the form family), never a dev page:

* a label **hits** a true answer box when the label's centre lies inside the box, or their
  IoU is at least :data:`MIN_IOU` (the label is often a part of the annotated line: the date
  inside "DATE: 25/12/2018 10:30", which an IoU alone would miss);
* **precision** at a threshold ``t``: the share of the labels with confidence ``>= t`` that
  hit a true answer of their family on their page: for a receipt's date or total, the
  loader's answer box or another line of the receipt's box file that prints the same date
  or amount (:func:`printed_values`; ``FAMILY (own box)`` rows: the loader's box only);
  for a form, the answer of a question whose key reads as the label's key
  (:func:`same_key`; ``form (any answer)``: any answer box of the form);
* **recall** at ``t``: the share of the true answers with a hitting label of confidence
  ``>= t`` (for forms, of every question-answer link of the form, most of them keys without
  a colon or table headers, which the labeller does not try);
* the **threshold kept** per family is the lowest ``t`` of :data:`GRID` from which every
  threshold keeping at least :data:`MIN_KEPT` labels has precision at least
  :data:`TARGET`; ``None`` when none gets there (printed as such). These become
  :data:`fovea_core.cascade.pseudo_labels.KEEP`.

``python -m fovea_book.eval.pseudo_labels`` prints the table; ``--record`` also writes
``data/models/pseudo_labels.json`` (thresholds, table, pages, OCR seconds, commit). Every
page is read once by the OCR (about 3-7 s a page on one core); the disk cache makes a
second run fast.
"""

from __future__ import annotations

import argparse
import platform
import re
import time
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from fovea_book.eval.document_types import Document

__all__ = ["SETS", "MIN_IOU", "TARGET", "MIN_KEPT", "GRID", "hits", "same_key",
           "printed_values", "label_set",
           "quality_table", "choose_thresholds", "main"]

#: the training sets measured and the families asked on each
SETS = {"sroie-train": ("company", "date", "total"), "funsd-train": ("form",)}
#: a label hits a true box when its centre is inside it or their IoU reaches this
MIN_IOU = 0.3
#: the precision a kept family must reach on the training pages
TARGET = 0.9
#: the fewest labels a threshold must keep for its precision to count
MIN_KEPT = 20
#: the thresholds tried
GRID = tuple(float(v) for v in np.round(np.arange(0.0, 0.96, 0.05), 2))


def hits(box: Sequence[float], truth: np.ndarray) -> np.ndarray:
    """``[T]`` bool: whether the label ``box`` ``(x0, y0, x1, y1)`` hits each true box of
    ``truth`` ``[T, 4]`` (centre inside, or IoU >= :data:`MIN_IOU`)."""
    t = np.asarray(truth, np.float64).reshape(-1, 4)
    b = np.asarray(box, np.float64)
    cx, cy = (b[0] + b[2]) / 2, (b[1] + b[3]) / 2
    inside = (t[:, 0] <= cx) & (cx <= t[:, 2]) & (t[:, 1] <= cy) & (cy <= t[:, 3])
    iw = np.clip(np.minimum(b[2], t[:, 2]) - np.maximum(b[0], t[:, 0]), 0, None)
    ih = np.clip(np.minimum(b[3], t[:, 3]) - np.maximum(b[1], t[:, 1]), 0, None)
    union = (b[2] - b[0]) * (b[3] - b[1]) + (t[:, 2] - t[:, 0]) * (t[:, 3] - t[:, 1]) - iw * ih
    return inside | (iw * ih / np.maximum(union, 1e-9) >= MIN_IOU)


def _norm(key: str) -> str:
    return re.sub(r"[^0-9A-Z]", "", key.upper())


def same_key(a: str, b: str) -> bool:
    """Whether two form keys read alike: equal once upper-cased and reduced to letters and
    digits, or a normalised edit distance of at most 0.25 (an OCR slip)."""
    from fovea_book.eval.metrics import levenshtein

    x, y = _norm(a), _norm(b)
    if not x or not y:
        return False
    return x == y or levenshtein(x, y) / max(len(x), len(y)) <= 0.25


def _key_of(question: str) -> str:
    from fovea_core.cascade.pseudo_labels import FORM_QUESTION

    head, tail = FORM_QUESTION.split("{key}")
    return question.removeprefix(head).removesuffix(tail)


def printed_values(lines: Sequence[tuple[Sequence[float], str]], answer: str,
                   family: str) -> list[tuple]:
    """The boxes of ``lines`` (a SROIE box file's ``(box, text)`` rows) that print the
    ``answer`` of a date or total question again: a date (amount) of the line whose digits
    are the answer's. A receipt prints its total two or three times ("TOTAL", "NETT
    TOTAL", the amount tendered by card); the loader keeps one of them as the answer's box,
    and a reader looking at any of them reads the answer."""
    from fovea_core.cascade.reading import AMOUNT_RE, DATE_RE

    rx = {"date": DATE_RE, "total": AMOUNT_RE}.get(family)
    digits = re.sub(r"\D", "", answer)
    if rx is None or not digits:
        return []
    return [tuple(b) for b, t in lines
            if any(re.sub(r"\D", "", m.group()) == digits for m in rx.finditer(t))]


def label_set(docs: Sequence[Document], families: Sequence[str], *,
              box_lines: Mapping[str, Sequence] | None = None,
              log=print) -> tuple[list[dict], list[dict], float]:
    """Label every page of ``docs`` (every label, no threshold) and score it.

    Args:
        docs: the pages and their questions.
        families: the families asked on them.
        box_lines: per ``doc_id``, the receipt's box-file rows ``(box, text)``: a date or
            total label on another printing of the answer (:func:`printed_values`) hits too.
        log: progress lines.

    Returns:
        ``(labels, answers, seconds)``: one dict per label (``family``, ``doc``,
        ``confidence``, ``hit``, ``hit_strict``: against the loader's answer box only; forms
        ``hit_any``: any answer box of the form) and per true answer (``family``, ``doc``,
        ``best``, ``best_strict``: the highest confidence of a label hitting it, -1 if none),
        and the wall seconds of reading and labelling (the OCR on a cold cache).
    """
    from fovea_core.cascade.pseudo_labels import page_labels

    labels, answers = [], []
    t0 = time.perf_counter()
    for n, doc in enumerate(docs):                       # pages, read one at a time
        found = page_labels(doc.image, families=families, keep=None)
        rows = (box_lines or {}).get(doc.doc_id, [])
        for fam in families:
            qs = [q for q in doc.questions if fam == "form" or q.field == fam]
            truth = [np.asarray(list(q.boxes) + printed_values(rows, q.answers[0], fam))
                     for q in qs]
            best, strict = np.full(len(qs), -1.0), np.full(len(qs), -1.0)
            for p in (p for p in found if p.family == fam):
                hit = np.array([bool(hits(p.box, t).any()) for t in truth], bool)
                own = np.array([bool(hits(p.box, np.asarray(q.boxes)).any()) for q in qs], bool)
                row = dict(family=fam, doc=doc.doc_id, confidence=p.confidence)
                if fam == "form":
                    keyed = np.array([same_key(_key_of(p.question), q.field) for q in qs], bool)
                    row.update(hit_any=bool(hit.any()))
                    hit, own = hit & keyed, own & keyed
                row.update(hit=bool(hit.any()), hit_strict=bool(own.any()))
                labels.append(row)
                best = np.where(hit, np.maximum(best, p.confidence), best)
                strict = np.where(own, np.maximum(strict, p.confidence), strict)
            answers += [dict(family=fam, doc=doc.doc_id, best=float(b), best_strict=float(c))
                        for b, c in zip(best, strict)]
        if (n + 1) % 25 == 0:
            log(f"  {n + 1}/{len(docs)} pages, {time.perf_counter() - t0:.0f} s")
    return labels, answers, time.perf_counter() - t0


def quality_table(labels: Sequence[Mapping], answers: Sequence[Mapping],
                  grid: Sequence[float] = GRID) -> pd.DataFrame:
    """Precision and recall per family and threshold (module docstring): columns
    ``family, threshold, kept, precision, recall, answers``. Beside each family, ``FAMILY
    (own box)``: against the loader's answer box only (not another printing of the date or
    total); for forms, ``form (any answer)``: against any answer box of the form."""
    lab, ans = pd.DataFrame(labels), pd.DataFrame(answers)
    if lab.empty or ans.empty:
        raise ValueError("no labels or no true answers to measure")
    rows = []
    for fam in dict.fromkeys(lab["family"]):
        sel, a = lab[lab["family"] == fam], ans[ans["family"] == fam]
        conf = sel["confidence"].to_numpy(float)
        variants = [(fam, "hit", "best"), (f"{fam} (own box)", "hit_strict", "best_strict")]
        if fam == "form":
            variants = variants[:1] + [("form (any answer)", "hit_any", None)]
        for name, hit_col, best_col in variants:
            hit = sel[hit_col].to_numpy(bool)
            for t in grid:
                k = conf >= t
                rows.append(dict(
                    family=name, threshold=float(t), kept=int(k.sum()),
                    precision=float(hit[k].mean()) if k.any() else float("nan"),
                    recall=(float((a[best_col].to_numpy(float) >= t).mean()) if best_col
                            else float("nan")), answers=len(a)))
    return pd.DataFrame(rows)


def choose_thresholds(table: pd.DataFrame) -> dict[str, float | None]:
    """Per family (not the ``(own box)`` / ``(any answer)`` rows): the lowest threshold from
    which on every threshold that keeps at least :data:`MIN_KEPT` labels precision is at
    least :data:`TARGET` (so that a lucky dip does not decide), else ``None``."""
    out: dict[str, float | None] = {}
    for fam, sel in table.groupby("family", sort=False):
        if " (" in fam:
            continue
        sel = sel[sel["kept"] >= MIN_KEPT].sort_values("threshold")
        good = (sel["precision"] >= TARGET).to_numpy()
        # from the last failing threshold on, every one meets the target
        tail = good[::-1].cumprod()[::-1].astype(bool)
        out[fam] = float(sel["threshold"].to_numpy()[tail].min()) if tail.any() else None
    return out


def _load(name: str, data_dir, limit: int | None) -> tuple[list[Document], dict]:
    """The documents of a training set and, for receipts, each one's box-file rows."""
    from fovea_book.eval.funsd import load_funsd
    from fovea_book.eval.sroie import load_sroie, parse_box_file
    from fovea_book.paths import dataset_path

    quiet = lambda s: None                                                   # noqa: E731
    if name.startswith("funsd"):
        return load_funsd(name, data_dir=data_dir, limit=limit, log=quiet), {}
    root = dataset_path(name, data_dir)
    docs = load_sroie(root, limit=limit, log=quiet)
    return docs, {d.doc_id: parse_box_file(root / "box" / f"{d.doc_id.removeprefix('sroie')}.csv")
                  for d in docs}


def main(argv: Sequence[str] | None = None) -> int:
    """Measure the labeller on the training pages, print the table (and ``--record``)."""
    ap = argparse.ArgumentParser(prog="python -m fovea_book.eval.pseudo_labels",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default=None, help="the data root (default FOVEA_DATA)")
    ap.add_argument("--limit", type=int, default=None, help="the first pages of each set")
    ap.add_argument("--sets", nargs="+", choices=tuple(SETS), default=tuple(SETS),
                    help="the training sets to measure (default both)")
    ap.add_argument("--record", action="store_true",
                    help="also write data/models/pseudo_labels.json")
    args = ap.parse_args(argv)
    labels, answers, seconds, pages = [], [], {}, {}
    for name in args.sets:
        fams = SETS[name]
        docs, lines = _load(name, args.data_dir, args.limit)
        print(f"{name}: {len(docs)} pages, families {', '.join(fams)}")
        lab, ans, sec = label_set(docs, fams, box_lines=lines)
        labels += lab
        answers += ans
        seconds[name], pages[name] = sec, [d.doc_id for d in docs]
    table = quality_table(labels, answers)
    chosen = choose_thresholds(table)
    with pd.option_context("display.max_rows", None, "display.width", 120):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    for fam, t in chosen.items():
        if t is None:
            print(f"{fam}: no threshold reaches precision {TARGET:.0%} on >= {MIN_KEPT} labels")
        else:
            r = table[(table["family"] == fam) & (table["threshold"] == t)].iloc[0]
            print(f"{fam}: keep >= {t:.2f} (precision {r.precision:.3f} on {r.kept} labels, "
                  f"recall {r.recall:.3f} of {r.answers} answers)")
    print("seconds (read + label): " + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items()))
    if args.record:
        from fovea_book.eval.resize_rule import git_commit, models_record_path, write_fit_record

        path = write_fit_record(dict(
            thresholds=chosen, target=TARGET, min_kept=MIN_KEPT, min_iou=MIN_IOU,
            rule="centre inside or IoU >= min_iou; forms: same key", table=table.to_dict("list"),
            pages=pages, seconds=seconds, commit=git_commit(),
            environment=dict(python=platform.python_version(), machine=platform.machine())),
            models_record_path("pseudo_labels"))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
