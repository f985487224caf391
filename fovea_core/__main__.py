"""``python -m fovea_core foveate PAGE_OR_DIR [--question Q] [--budget N] [--method M] --out DIR``
and ``python -m fovea_core clean-stale [--cache-dir DIR] [--dry-run]``.

Per page (:func:`fovea_core.foveate.save_foveation`): ``<name>.foveated.png`` (what the
model sees), ``<name>.tokens.png`` (the tokens by level and by stage over the page, and the
view) and ``<name>.foveation.json`` (the tokens and the costs). A folder runs over all its
files (not its sub-folders) on a process pool with a progress bar; files that are not
readable images are skipped and counted; the last line is a summary. Exit status: 0 when
every image was foveated, 1 when a page failed, 2 for bad arguments (unknown method, missing
path, a folder without images).

``clean-stale`` (``make clean-stale``) deletes the sweep's row caches written by other
versions of the ``fovea_core`` source (:func:`fovea_core.eval.evaluator.stale_caches`:
``rows-<fingerprint>.sqlite`` but the current code's, and the unversioned files of older
code), printing each file and the bytes freed; ``--dry-run`` only lists them. Run it when
no book or sweep is running: a kernel started before a code change still writes the cache
of its own (now stale) fingerprint.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import textwrap
import time
from pathlib import Path

DEFAULT_BUDGET = 273


def _methods_epilog() -> str:
    from fovea_core.foveate import DEFAULT_METHOD, method_names, method_summary

    names = method_names()
    width = max(len(n) for n in names)
    lines = [f"  {n:<{width}}  {method_summary(n)}" + ("  [default]" if n == DEFAULT_METHOD
                                                       else "") for n in names]
    return ("methods (--method; fovea_core.allocators registry):\n" + "\n".join(lines)
            + "\n\nExample:\n  python -m fovea_core foveate receipts/ --question "
              "'What is the total?' --out foveated/")


def _option(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` -> ``(key, value)``, the value as a Python literal where it parses."""
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"--option must be KEY=VALUE (e.g. gist_budget=48), "
                                         f"got {text!r}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fovea_core",
                                     description="fovea_core commands.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser(
        "foveate", help="foveate a page or a folder of pages; write the view, a figure "
                        "of the tokens and a JSON per page",
        description=textwrap.fill(
            "Foveate a page (or every image in a folder) at a fixed token budget N and "
            "write, per page, the reconstruction (<name>.foveated.png), a figure of the "
            "tokens by level and stage (<name>.tokens.png) and the tokens and costs "
            "(<name>.foveation.json).", 88),
        epilog=_methods_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="PAGE_OR_DIR", help="an image file or a folder of images")
    p.add_argument("--question", "-q", default=None, help="the question about the page(s)")
    p.add_argument("--budget", "-n", type=int, default=None,
                   help=f"N, tokens per page (default {DEFAULT_BUDGET}; with --method full: every "
                        "patch of the page)")
    p.add_argument("--method", "-m", default=None, help="a method below (default: cascade)")
    p.add_argument("--option", "-o", type=_option, action="append", default=[],
                   metavar="KEY=VALUE", help="a keyword option of the method (repeatable), e.g. "
                                             "-o scorer=text_saliency, -o gist_budget=48")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created)")
    p.add_argument("--workers", "-j", type=int, default=None,
                   help="processes for a folder (default: the CPU count)")
    p.set_defaults(subparser=p, run=foveate_command)
    c = sub.add_parser(
        "clean-stale", help="delete the sweep's row caches of other code versions; print what "
                            "went and the bytes freed",
        description=textwrap.fill(
            "Delete the cell caches (rows-<fingerprint>.sqlite and their -wal/-shm files, and "
            "the unversioned caches of older code) whose fovea_core source fingerprint is not "
            "the current one: no row in them can be read again. The current code's cache is "
            "kept; nothing outside the cache folder is touched. Run it when no book or sweep "
            "is running.", 88))
    c.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="the sweep's cache folder (default: data/cache/sweep, and the old "
                        "cascade cells in data/cache/cascade)")
    c.add_argument("--dry-run", "-n", action="store_true",
                   help="list what would be deleted, delete nothing")
    c.set_defaults(subparser=c, run=clean_stale_command)
    return parser


def _list_inputs(path: Path) -> list[Path]:
    """The file itself, or a folder's regular, non-hidden files (sorted; not recursive)."""
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    return [path]


def _is_image(path: Path) -> str:
    """``""`` when PIL recognises the file's header, else the reason (cheap: no decoding)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path):
            return ""
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
        return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


def _stems(paths: list[Path]) -> list[str]:
    """Output stems: the file's stem, or ``stem_ext`` where two files share a stem."""
    count: dict[str, int] = {}
    for p in paths:
        count[p.stem] = count.get(p.stem, 0) + 1
    return [p.stem if count[p.stem] == 1 else f"{p.stem}_{p.suffix.lstrip('.')}" for p in paths]


def _progress(total: int):
    """``(update, write, close)``: a tqdm bar on stderr (hidden when stderr is not a terminal)
    or a plain counter; ``write`` prints a page's line on stderr above the bar."""
    try:
        from tqdm.auto import tqdm
    except ImportError:                                            # pragma: no cover
        tqdm = None
    if tqdm is not None:
        bar = tqdm(total=total, desc="pages", unit="page", disable=None, file=sys.stderr)
        return bar.update, lambda s: bar.write(s, file=sys.stderr), bar.close
    state = {"k": 0}

    def update(n: int = 1) -> None:
        state["k"] += n
        print(f"[{state['k']}/{total}]", file=sys.stderr, flush=True)
    return update, lambda s: print(s, file=sys.stderr), lambda: None


def foveate_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from fovea_core.foveate import (DEFAULT_METHOD, method_names, run_page, uses_question,
                                    worker_init)

    t0 = time.perf_counter()
    method = args.method or DEFAULT_METHOD
    if method not in method_names():
        parser.error(f"unknown method {method!r}; registered: {', '.join(method_names())}")
    budget = args.budget if args.budget is not None else (None if method == "full"
                                                          else DEFAULT_BUDGET)
    if budget is not None and budget < 1:
        parser.error(f"--budget must be a positive int (tokens per page), got {budget}")
    if args.workers is not None and args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    options = dict(args.option)
    if args.question is not None and not args.question.strip():
        parser.error("--question must not be empty")
    src = Path(args.path)
    if not src.exists():
        parser.error(f"no such file or folder: {src}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        parser.error(f"--out {out} exists and is not a folder")
    if src.is_dir() and out.resolve() == src.resolve():
        parser.error("--out must not be the input folder (the outputs would become inputs)")
    if args.question is not None and not uses_question(method, **options):
        print(f"note: method {method!r} does not read the question; it is ignored",
              file=sys.stderr)

    files = _list_inputs(src)
    images, skipped = [], []
    for p in files:
        why = _is_image(p)
        (skipped.append((p, why)) if why else images.append(p))
    for p, why in skipped:
        print(f"skipped {p.name}: not an image ({why})", file=sys.stderr)
    if not images:
        if src.is_dir():
            print(f"error: no images in {src} ({len(files)} files, {len(skipped)} skipped)",
                  file=sys.stderr)
        else:
            print(f"error: {src} is not a readable image", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    jobs = [dict(path=str(p), stem=s, out_dir=str(out), question=args.question, budget=budget,
                 method=method, options=options) for p, s in zip(images, _stems(images))]
    workers = min(args.workers or os.cpu_count() or 1, len(jobs))
    update, write, close = _progress(len(jobs))
    results = []

    def report(r: dict) -> None:
        results.append(r)
        write(f"{r['status']} {Path(r['path']).name} ({r['seconds']:.1f} s)"
              + (f": {r['message']}" if r["message"] else ""))
        update(1)

    try:
        if workers == 1:
            for j in jobs:
                report(run_page(j))
        else:
            import concurrent.futures as cf
            import multiprocessing as mp

            with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"),
                                        initializer=worker_init) as pool:
                futs = {pool.submit(run_page, j): j for j in jobs}
                for fut in cf.as_completed(futs):
                    try:
                        report(fut.result())
                    except Exception as err:  # noqa: BLE001 - a worker died (e.g. memory)
                        report(dict(path=futs[fut]["path"], status="failed", seconds=0.0,
                                    message=f"worker: {type(err).__name__}: {err}"))
    finally:
        close()
    done = sum(r["status"] == "done" for r in results)
    failed = sum(r["status"] == "failed" for r in results)
    skip = len(skipped) + sum(r["status"] == "skipped" for r in results)
    print(f"foveate: {done} done, {skip} skipped, {failed} failed of {len(files)} files "
          f"in {time.perf_counter() - t0:.1f} s ({method}, N = {budget or 'all'}) -> {out}")
    return 1 if failed or not done else 0


def clean_stale_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Delete (or with ``--dry-run`` list) the stale cell caches; one line per file with its
    size, then a summary line with the file count and the bytes. Exit 0 (also when nothing is
    stale), 2 when ``--cache-dir`` is not a folder."""
    from fovea_core.eval.evaluator import (cell_cache_path, default_cache_dir,
                                           evict_stale_caches, stale_caches)

    folder = default_cache_dir() if args.cache_dir is None else Path(args.cache_dir)
    if args.cache_dir is not None and not folder.is_dir():
        parser.error(f"--cache-dir {folder} is not a folder")
    sizes = {p: p.stat().st_size for p in stale_caches(args.cache_dir)}
    gone = list(sizes) if args.dry_run else evict_stale_caches(args.cache_dir)
    verb = "would remove" if args.dry_run else "removed"
    for p in gone:
        print(f"{verb} {p} ({sizes.get(p, 0):,} bytes)")
    total = sum(sizes.get(p, 0) for p in gone)
    keep = cell_cache_path(folder)
    print(f"clean-stale: {verb} {len(gone)} file{'s' if len(gone) != 1 else ''}, {total:,} bytes"
          f" ({total / 2**20:.1f} MiB) in {folder}; kept {keep.name} (the current code's"
          f"{'' if keep.exists() else ', not written yet'})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return args.run(args, args.subparser)


if __name__ == "__main__":
    sys.exit(main())
