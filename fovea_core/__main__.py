"""``python -m fovea_core foveate PAGE_OR_DIR [--question Q] [--budget N] [--method M]
[--localiser FILE] --out DIR`` and ``python -m fovea_core adapt PAGES_DIR --out FILE``.

``adapt`` (:func:`fovea_core.adapt`): read every page of a folder once (OCR, cached), take
the answers it is sure of as labels and fine-tune the cascade's learned localiser on them;
writes ``FILE`` (``.pt``) and its record ``FILE`` ``.json``; ``foveate --localiser FILE``
then uses it. Exit status 0 when written, 2 for bad arguments or when nothing could be
adapted to (a bad folder, no readable page, no label found), each said in one line, nothing
written.

Per page (:func:`fovea_core.foveation.save_foveation`): ``<name>.foveated.png`` (what the
model sees), ``<name>.tokens.png`` (the tokens by level and by stage over the page, and the
view) and ``<name>.foveation.json`` (the tokens and the costs). A folder runs over all its
files (not its sub-folders) on a process pool with a progress bar; files that are not
images, and paths that are not regular files (a named pipe, a socket, a symbolic link loop
or a dangling link: never opened), are skipped, each with its reason, and counted, as are
the files foveate itself writes (names ending in ``.foveated.png``, ``.tokens.png`` or
``.foveation.json``, :data:`~fovea_core.foveation.OUTPUT_SUFFIXES`: said in one line), so
that ``--out`` may be a folder of pages without its outputs becoming pages; the last line
is a summary. Output names are
unique (:func:`output_stems`): two files that share a stem, or a stem and another file's
derived name, never write over each other. A file of several frames (a multi-page TIFF, an
animated GIF) is read at its first frame, and its line says so. Exit status: 0 when every
image was foveated, 1 when a page failed (an image too large to decode, or one whose data
cannot be decoded, e.g. a truncated JPEG, among them), 2 for bad arguments, each said in
one line before any page is foveated: an unknown or empty method, a budget below 1, an
option the method does not take (or a bad value of one: ``patch``, ``seed``, ``scorer``,
a cascade's ``gist_budget``, ...), a question that is not valid text, a missing path, a
folder without images, an empty ``--out`` or one that cannot be created or written, a
``FOVEA_NO_DISK_CACHE`` that is not a yes or a no.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import textwrap
import time
from pathlib import Path

from fovea_core.progress import progress_bar

DEFAULT_BUDGET = 273


def _methods_epilog() -> str:
    from fovea_core.foveation import DEFAULT_METHOD, method_names, method_summary

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
        raise argparse.ArgumentTypeError(f"--option must be KEY=VALUE (e.g. localiser=uniform), "
                                         f"got {text!r}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def build_parser() -> argparse.ArgumentParser:
    from fovea_core.foveation import DEFAULT_METHOD

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
    p.add_argument("--method", "-m", default=None,
                   help=f"a method below (default: {DEFAULT_METHOD})")
    p.add_argument("--option", "-o", type=_option, action="append", default=[],
                   metavar="KEY=VALUE", help="a keyword option of the method (repeatable), e.g. "
                                             "-o localiser=uniform (a cascade), "
                                             "-o scorer=text_saliency (a method that ranks a "
                                             "map, e.g. topk)")
    p.add_argument("--localiser", default=None, metavar="FILE",
                   help="a cascade's localiser: weights written by `python -m fovea_core adapt` "
                        "(a .pt file, its .json record beside it), or a localiser's name "
                        "(default: the method's, the committed learned localiser)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created)")
    p.add_argument("--workers", "-j", type=int, default=None,
                   help="processes for a folder (default: the CPU count)")
    p.set_defaults(subparser=p, run=foveate_command)
    a = sub.add_parser(
        "adapt", help="adapt the learned localiser to a folder of your own (unlabelled) pages",
        description=textwrap.fill(
            "Read every page of a folder once at full resolution (OCR, cached on disk, so a "
            "second run is fast), take the answers the reading is sure of as labels (a "
            "company at the head of a receipt, a date, a total, a form's value beside its "
            "key), and fine-tune the cascade's learned localiser on them, starting from the "
            "committed weights. Pages whose name hashes to 0 modulo 5 are held out for "
            "validation. Writes FILE (.pt) and its record FILE.json (pages, labels, losses, "
            "validation before and after, seconds); foveate --localiser FILE uses it.", 88),
        epilog="Example:\n  python -m fovea_core adapt my_receipts/ --out my_localiser.pt\n"
               "  python -m fovea_core foveate page.jpg -q 'What is the total?' -m cascade "
               "--localiser my_localiser.pt --out foveated/",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("pages", metavar="PAGES_DIR", help="a folder of page images (not recursive)")
    a.add_argument("--out", required=True, metavar="FILE",
                   help="the weights to write (.pt; the record goes beside it as .json)")
    a.add_argument("--start", default=None, metavar="FILE",
                   help="weights to start from (default: the committed localiser)")
    a.add_argument("--seed", type=int, default=None, help="seed of the gist budgets, batches "
                   "and augmentation (default 0)")
    a.add_argument("--epochs", type=int, default=None,
                   help="passes over the training pages (default 3)")
    a.add_argument("--threads", type=int, default=1,
                   help="torch threads while training (default %(default)s: deterministic)")
    a.set_defaults(subparser=a, run=adapt_command)
    return parser


def _list_inputs(path: Path) -> list[Path]:
    """The file itself, or a folder's non-hidden entries that are not folders (sorted; not
    recursive): regular files, and what :func:`_is_image` will skip with its reason (a
    named pipe, a socket, a symbolic link loop, a dangling link)."""
    if path.is_dir():
        return sorted(p for p in path.iterdir() if not p.name.startswith(".")
                      and not p.is_dir())
    return [path]


def _is_output(path: Path) -> bool:
    """Whether ``path`` is named as a file foveate writes
    (:data:`~fovea_core.foveation.OUTPUT_SUFFIXES`)."""
    from fovea_core.foveation import OUTPUT_SUFFIXES

    return path.name.endswith(tuple(OUTPUT_SUFFIXES.values()))


def _is_image(path: Path) -> str:
    """``""`` when one of PIL's formats recognises the file (even one it then fails to
    read, e.g. a truncated JPEG: that page fails), else the reason it is skipped (cheap: no
    decoding; a path that is not a regular file, e.g. a named pipe, is never opened)."""
    from PIL import Image, UnidentifiedImageError

    from fovea_core.foveation import NotAFileError, check_regular_file

    try:
        check_regular_file(path)
    except NotAFileError as err:
        return f"not a regular file: {err.what}; not opened"
    except FileNotFoundError:
        return "no such file (it went away)"
    try:
        with Image.open(path):
            return ""
    except UnidentifiedImageError as err:   # no format recognises it: not an image
        return f"not an image ({type(err).__name__}: " \
               f"{str(err).splitlines()[0] if str(err) else ''})"
    except (Image.DecompressionBombError, OSError, ValueError, SyntaxError):
        return ""                           # an image that fails to read: a failed page


def output_stems(paths: list[Path]) -> list[str]:
    """One output stem per input, all different (also to a case-insensitive file system).

    A file whose stem no other file shares (ignoring case) keeps it; the others get
    ``stem_ext`` (``a.png``, ``a.jpg`` -> ``a_png``, ``a_jpg``). A derived name may still
    be taken, by another file's own stem (``a_png.png``) or another derived name, so every
    name is checked against all the names taken so far, the plain stems first, and gets
    ``-2``, ``-3``, ... until it is free: no page's files ever replace another's.
    """
    count: dict[str, int] = {}
    for p in paths:
        count[p.stem.casefold()] = count.get(p.stem.casefold(), 0) + 1
    plain = [count[p.stem.casefold()] == 1 for p in paths]
    taken = {p.stem.casefold() for p, own in zip(paths, plain) if own}
    out = [p.stem if own else "" for p, own in zip(paths, plain)]
    for i, p in enumerate(paths):
        if plain[i]:
            continue
        base = f"{p.stem}_{p.suffix.lstrip('.')}" if p.suffix else p.stem
        name, k = base, 2
        while name.casefold() in taken:
            name, k = f"{base}-{k}", k + 1
        taken.add(name.casefold())
        out[i] = name
    return out


def _refuse(parser: argparse.ArgumentParser, *lines: str) -> None:
    """Bad arguments: each problem in one line on stderr, then exit status 2 (no usage
    block, no traceback)."""
    for line in lines:
        print(f"{parser.prog}: error: {line}", file=sys.stderr)
    raise SystemExit(2)


def _out_problem(out: Path) -> str:
    """Why ``--out`` cannot be created or written, from what exists now (nothing is
    created): ``""`` when it looks fine. :func:`_make_out` tries it for real."""
    if out.exists():
        if not out.is_dir():
            return f"--out {out} exists and is not a folder"
        if not os.access(out, os.W_OK | os.X_OK):
            return f"--out {out} is not writable (permission denied or a read-only file system)"
        return ""
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"--out {out} cannot be created: {parent} is not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return (f"--out {out} cannot be created: {parent} is not writable (permission denied "
                "or a read-only file system)")
    return ""


def _make_out(out: Path) -> str:
    """Create ``--out`` and write (then remove) a probe file in it; ``""`` or why not."""
    import tempfile

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return f"--out {out} cannot be created ({err.strerror or type(err).__name__})"
    try:
        with tempfile.NamedTemporaryFile(dir=out, prefix=".foveate-probe-"):
            pass
    except OSError as err:
        return f"--out {out} is not writable ({err.strerror or type(err).__name__})"
    return ""


def foveate_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from fovea_core.allocators.base import check_budget
    from fovea_core.foveation import DEFAULT_METHOD, check_options, run_page, worker_init

    from fovea_core.paths import disk_cache_enabled

    t0 = time.perf_counter()
    errors = []                  # every problem found before any work, one line each
    if args.method is not None and not args.method.strip():
        errors.append("--method must be a method's name (see --help), got an empty string")
    method = args.method or DEFAULT_METHOD
    options = dict(args.option)
    for key, flag in (("budget", "--budget"), ("question", "--question"), ("method", "--method")):
        if key in options:
            errors.append(f"--option {key}=...: the {key} is given with {flag}, not as an option")
            del options[key]
    if args.localiser is not None:
        if "localiser" in options:
            errors.append("--option localiser=...: the localiser is given with --localiser, "
                          "not as an option")
        options["localiser"] = args.localiser
    budget = args.budget if args.budget is not None else (None if method == "full"
                                                          else DEFAULT_BUDGET)
    try:
        notes = check_options(method, args.question, budget=budget, **options)
    except (ValueError, TypeError) as err:
        notes = []
        errors.append(f"--localiser {args.localiser}: {err}" if args.localiser is not None
                      and "localiser" in str(err) else str(err))
    try:
        disk_cache_enabled()
    except ValueError as err:
        errors.append(str(err))
    if budget is not None:
        try:
            check_budget(budget, None, arg="--budget",
                         where=" (tokens per page; Gh*Gw, the page's patch count, is checked "
                               "per page)")
        except ValueError as err:
            errors.append(str(err))
    if args.workers is not None and args.workers < 1:
        errors.append(f"--workers must be >= 1, got {args.workers}")
    src = Path(args.path)
    out = Path(args.out)
    if not args.path:
        errors.append("PAGE_OR_DIR must be an image file or a folder, got an empty string")
    elif not src.exists() and not src.is_symlink():
        errors.append(f"no such file or folder: {src}")
    elif src.is_dir() and out.resolve() == src.resolve():
        errors.append("--out must not be the input folder (the outputs would become inputs)")
    if not args.out.strip():
        errors.append("--out must be a folder's path, got an empty string (use --out . for "
                      "the current folder)")
    else:
        errors += [e for e in [_out_problem(out)] if e]
    if errors:
        _refuse(parser, *errors)
    for note in notes:                       # said once for the whole folder
        print(f"note: {note}", file=sys.stderr)

    files = _list_inputs(src)
    images, skipped, ours = [], [], []
    for p in files:
        if src.is_dir() and _is_output(p):          # what foveate wrote: never a page
            ours.append(p)
            continue
        why = _is_image(p)
        (skipped.append((p, why)) if why else images.append(p))
    for p, why in skipped:
        print(f"skipped {p.name}: {why}", file=sys.stderr)
    if ours:
        shown = ", ".join(p.name for p in ours[:3]) + (", ..." if len(ours) > 3 else "")
        print(f"skipped {len(ours)} file(s) that foveate writes ({shown}): outputs, not pages",
              file=sys.stderr)
    skipped += [(p, "an output of foveate") for p in ours]
    if not images:
        if src.is_dir():
            print(f"error: no images in {src} ({len(files)} files, {len(skipped)} skipped)",
                  file=sys.stderr)
        else:
            print(f"error: {src} is not a readable image ({skipped[0][1]})", file=sys.stderr)
        return 2
    problem = _make_out(out)                 # created only now: there are pages to write
    if problem:
        _refuse(parser, problem)
    jobs = [dict(path=str(p), stem=s, out_dir=str(out), question=args.question, budget=budget,
                 method=method, options=options)
            for p, s in zip(images, output_stems(images))]
    workers = min(args.workers or os.cpu_count() or 1, len(jobs))
    update, write, close = progress_bar(len(jobs))
    results = []

    def report(r: dict) -> None:
        results.append(r)
        name = Path(r["path"])
        renamed = r.get("stem") not in (None, name.stem)
        write(f"{r['status']} {name.name}" + (f" -> {r['stem']}.*" if renamed else "")
              + f" ({r['seconds']:.1f} s)" + (f": {r['message']}" if r["message"] else ""))
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
                        report(dict(path=futs[fut]["path"], stem=futs[fut]["stem"],
                                    status="failed", seconds=0.0,
                                    message=f"worker: {type(err).__name__}: {err}"))
    finally:
        close()
    done = sum(r["status"] == "done" for r in results)
    failed = sum(r["status"] == "failed" for r in results)
    skip = len(skipped) + sum(r["status"] == "skipped" for r in results)
    print(f"foveate: {done} done, {skip} skipped, {failed} failed of {len(files)} files "
          f"in {time.perf_counter() - t0:.1f} s ({method}, N = {budget or 'all'}) -> {out}")
    return 1 if failed or not done else 0


def adapt_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``python -m fovea_core adapt``: check the arguments (exit 2 naming each bad one), then
    :func:`fovea_core.adapt` with a progress bar on stderr; one summary line on stdout."""
    from fovea_core.adaptation import AdaptConfig, adapt, list_pages

    errors = []
    cfg = AdaptConfig(**{k: v for k, v in (("seed", args.seed), ("epochs", args.epochs))
                         if v is not None})
    if args.epochs is not None and args.epochs < 1:
        errors.append(f"--epochs must be >= 1, got {args.epochs}")
    if args.threads < 1:
        errors.append(f"--threads must be >= 1, got {args.threads}")
    if not args.out.strip():
        errors.append("--out must name a .pt file, got an empty string")
    elif not args.out.endswith(".pt"):
        errors.append(f"--out must name a .pt file (the record goes beside it as .json), got "
                      f"{args.out}")
    elif Path(args.out).is_dir():
        errors.append(f"--out {args.out} is a folder; name the .pt file to write")
    if args.start is not None and not Path(args.start).is_file():
        errors.append(f"--start {args.start}: no such weights file")
    try:
        list_pages(args.pages)
    except ValueError as err:
        errors.append(str(err).replace("pages: ", "PAGES_DIR: ", 1))
    if errors:
        _refuse(parser, *errors)
    print(f"adapting the learned localiser to {args.pages} -> {args.out}", file=sys.stderr)
    try:
        rec = adapt(args.pages, out=args.out, start=args.start, config=cfg,
                    threads=args.threads)
    except ValueError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    v = rec["validation"]
    lab = rec["labels"]["train"]
    shown = (f"; validation hit mass {v['before']['hit_mass']:.3f} -> "
             f"{v['after']['hit_mass']:.3f} on {v['after']['questions']} pseudo-labelled "
             "questions" if v["after"] else "; no validation page had a label")
    print(f"adapt: {len(rec['pages'])} pages read ({len(rec['skipped'])} skipped), "
          f"{sum(lab.values())} training labels ({', '.join(f'{k} {n}' for k, n in lab.items())}),"
          f" {rec['train']['steps']} steps in {rec['seconds']['total']:.0f} s (reading "
          f"{rec['seconds']['ocr']:.0f} s){shown} -> {args.out}")
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
