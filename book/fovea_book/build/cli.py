"""Command line of the book tool: ``python -m fovea_book.build COMMAND [options]``.

::

    python -m fovea_book.build all --profile smoke        # execute (incrementally) + HTML
    python -m fovea_book.build all --force                # re-execute every notebook
    python -m fovea_book.build run --only 07              # execute only, some notebooks
    python -m fovea_book.build all --jobs 1               # one notebook at a time
    python -m fovea_book.build build                      # HTML from the executed copies
    python -m fovea_book.build tidy [--check] [NB ...]    # notebook conventions
    python -m fovea_book.build batch notebooks/07_v1_grid_topk.ipynb -p seed 0 1 2
    python -m fovea_book.build check-html                 # every page in headless Chromium
    python -m fovea_book.build lab                        # JupyterLab; prints its URL

``run``/``all`` execute up to ``--jobs`` notebooks at once (default: ``$FOVEA_BOOK_JOBS``,
else two where there are two cores), each waiting for the notebooks its metadata names
(:mod:`fovea_book.build.runner`). A cell that raises fails ``run``/``all``, naming the
notebook and the cell.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import textwrap
import sys
import time
from pathlib import Path

from fovea_book.profiles import PROFILES


def _root(path: Path | None) -> Path:
    return (path or Path.cwd()).resolve()


def _jobs(text: str) -> int:
    """``--jobs``: a whole number of notebooks at once, at least one."""
    jobs = int(text)
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {jobs}")
    return jobs


def _timeout(text: str) -> int:
    """``--timeout``: whole seconds per cell, at least one (a negative value would mean no
    timeout at all to the kernel client)."""
    try:
        seconds = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of seconds >= 1, got "
                                         f"{text!r}") from None
    if seconds < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of seconds >= 1 (per cell), "
                                         f"got {seconds}")
    return seconds


def _usage_error(command: str, exc: Exception) -> int:
    """Print a :class:`~fovea_book.build.runner.UsageError` (raised before anything ran) as
    one line and return the exit status 2."""
    print(f"python -m fovea_book.build {command}: {exc}", file=sys.stderr)
    return 2


def cmd_execute(args: argparse.Namespace) -> int:
    from fovea_book.build.runner import UsageError, build_html, children_stop_with_us, run_all

    root = _root(args.root)
    if args.command in ("run", "all"):
        try:
            with children_stop_with_us():      # a killed build leaves no kernel running
                runs = run_all(root, args.profile, only=args.only, force=args.force,
                               jobs=args.jobs)
        except UsageError as exc:
            return _usage_error(args.command, exc)
        failed = [r for r in runs if not r.ok]
        if failed:
            print("Failed notebooks:\n" + "\n".join(f"  {r.error}" for r in failed),
                  file=sys.stderr)
            return 1
    if args.command in ("build", "all"):
        try:
            build_html(root, quiet=not args.verbose)
        except subprocess.CalledProcessError as exc:
            print(f"jupyter-book build failed (exit {exc.returncode})", file=sys.stderr)
            return 1
    return 0


def cmd_tidy(args: argparse.Namespace) -> int:
    import json

    from fovea_book.build.tidy import check_notebook, tidy_file

    root = _root(args.root)
    paths = args.notebooks or sorted((root / "notebooks").glob("*.ipynb"))
    dirty = 0
    for path in paths:
        changes = tidy_file(Path(path), write=not args.check)
        left = check_notebook(json.loads(Path(path).read_text())) if not args.check else []
        if changes or left:
            dirty += 1
            verb = "would change" if args.check else "tidied"
            print(f"{path}: " + "; ".join(([f"{verb}: " + ", ".join(changes)] if changes else [])
                                          + [f"still untidy: {p}" for p in left]))
    print(f"{len(paths)} notebooks, {dirty} {'untidy' if args.check else 'changed or untidy'}")
    return 1 if (args.check and dirty) else 0


def cmd_batch(args: argparse.Namespace) -> int:
    from fovea_book.build.batch import format_table, run_batch
    from fovea_book.build.runner import UsageError, children_stop_with_us

    t0 = time.perf_counter()
    try:                 # names, values and paths are checked before anything runs
        with children_stop_with_us():
            runs, table = run_batch(_root(args.root), Path(args.notebook), args.param,
                                    profile=args.profile, jobs=args.jobs, force=args.force,
                                    out=args.out, timeout=args.timeout)
    except UsageError as exc:
        return _usage_error("batch", exc)
    print(f"\n{table} ({len(runs)} runs, {time.perf_counter() - t0:.0f} s):")
    print(format_table(table))
    failed = [r for r in runs if r.status == "failed"]
    return 1 if failed else 0


def cmd_check_html(args: argparse.Namespace) -> int:
    from pathlib import PurePosixPath

    from fovea_book.build.browser import check_site, find_chromium, glue_expectations
    from fovea_book.build.runner import toc_files

    root = _root(args.root)
    html = args.html or root / "_build" / "html"
    if not (html / "index.html").exists():
        print(f"{html}/index.html not found: build the book first (make book)", file=sys.stderr)
        return 1
    if not find_chromium():
        print("check-html: Chromium not found. Install it (Debian: apt-get install -y "
              "--no-install-recommends chromium; .ci/run does this) or set $CHROMIUM.",
              file=sys.stderr)
        return 1
    files = [str(PurePosixPath(f)) for f in toc_files(root)]
    shots = args.screenshots or root / "_build" / "screenshots"
    t0 = time.perf_counter()
    print(f"Checking {html} in headless Chromium (screenshots: {os.path.relpath(shots)})")
    report = check_site(html, toc=files[1:], root_page=files[0] + ".html", search=args.search,
                        screenshots=shots, glue=glue_expectations(root / "_build" / "src"))
    if report.offline:
        print(f"  not checked (other hosts, offline here): {sorted(report.offline)}")
    n = len(report.pages)
    if not report.ok:
        print(f"check-html FAILED ({time.perf_counter() - t0:.0f} s):\n{report.text()}",
              file=sys.stderr)
        return 1
    print(f"check-html: {n} pages ok, sidebar complete, search works; {report.screenshots} "
          f"screenshots ({time.perf_counter() - t0:.0f} s)")
    return 0


def lab_command(root: Path, port: int, token: str) -> list[str]:
    """The ``jupyter lab`` command line used by ``make lab`` and the lab test."""
    exe = Path(sys.executable).parent / "jupyter-lab"
    return [str(exe) if exe.exists() else "jupyter-lab", "--no-browser",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
            # see runner.kernel_config: kernels get CurveZMQ keys, no plain-TCP warning
            "--KernelManager.transport_encryption=auto"] + (
                ["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])


def cmd_lab(args: argparse.Namespace) -> int:
    from fovea_book.build.browser import free_port

    root = _root(args.root)
    port = args.port or free_port()
    token = args.token or secrets.token_hex(16)
    print(f"JupyterLab (kernel 'fovea'): http://127.0.0.1:{port}/lab/tree/notebooks/"
          f"00_quickstart.ipynb?token={token}\nStop it with Ctrl-C.", flush=True)
    cmd = lab_command(root, port, token)
    os.execv(cmd[0], cmd) if os.path.isabs(cmd[0]) else os.execvp(cmd[0], cmd)
    return 0


def cmd_clean_stale(args: argparse.Namespace) -> int:
    """Delete (or with ``--dry-run`` list) the stale cell caches; one line per file with its
    size, then a summary line with the file count and the bytes. Exit 0 (also when nothing is
    stale), 2 when ``--cache-dir`` is not a folder."""
    from fovea_book.eval.evaluator import (cell_cache_path, default_cache_dir,
                                           evict_stale_caches, stale_caches)

    folder = default_cache_dir() if args.cache_dir is None else Path(args.cache_dir)
    if args.cache_dir is not None and not folder.is_dir():
        print(f"python -m fovea_book.build clean-stale: error: --cache-dir {folder} is not a "
              "folder", file=sys.stderr)
        raise SystemExit(2)
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
    parser = argparse.ArgumentParser(prog="python -m fovea_book.build", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--root", type=Path, default=None,
                        help="project root holding _toc.yml (default: the current folder)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_ in (("run", "execute the notebooks whose inputs changed"),
                        ("build", "build the HTML from the executed copies"),
                        ("all", "run, then build (make book)")):
        p = sub.add_parser(name, parents=[common], help=help_)
        p.add_argument("--profile", default=os.environ.get("PROFILE", "default"), choices=PROFILES)
        p.add_argument("--only", nargs="*",
                       help="execute only notebooks whose file name contains one of these "
                            "(a name that matches no notebook is an error)")
        p.add_argument("--force", action="store_true", help="re-execute even if cached")
        if name != "build":
            p.add_argument("--jobs", type=_jobs, default=os.environ.get("FOVEA_BOOK_JOBS") or None,
                           help="notebooks executed at once, each in its own process; 1: one "
                                "after another in this process (default: $FOVEA_BOOK_JOBS, else "
                                "2, or 1 on a single core)")
        p.add_argument("--verbose", action="store_true", help="show Sphinx's status output")
        p.set_defaults(func=cmd_execute)
    p = sub.add_parser("tidy", parents=[common],
                       help="apply the notebook conventions (title first, tags, kernel)")
    p.add_argument("notebooks", nargs="*", type=Path)
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if untidy")
    p.set_defaults(func=cmd_tidy)
    p = sub.add_parser("batch", parents=[common],
                       help="run a notebook over a grid of parameters")
    p.add_argument("notebook")
    p.add_argument("-p", "--param", nargs="+", action="append", default=[],
                   metavar=("NAME", "VALUE"),
                   help="a parameter of the notebook's parameters cell and its values "
                        "(repeatable): Python literals, or plain text where the default is a "
                        "string; an unknown name or a value that does not parse is refused")
    p.add_argument("--profile", default="default", choices=PROFILES)
    p.add_argument("--jobs", type=_jobs, default=None,
                   help="processes at once (default: one per core, at most one per run)")
    p.add_argument("--force", action="store_true", help="re-run runs that are already done")
    p.add_argument("--out", type=Path, default=None, help="default: _build/runs")
    p.add_argument("--timeout", type=_timeout, default=3600,
                   help="seconds per cell, at least 1 (default 3600)")
    p.set_defaults(func=cmd_batch)
    p = sub.add_parser("check-html", parents=[common],
                       help="check every page in headless Chromium")
    p.add_argument("--html", type=Path, default=None, help="default: _build/html")
    p.add_argument("--screenshots", type=Path, default=None, help="default: _build/screenshots")
    p.add_argument("--search", default="cortex", help="a word the search page must find")
    p.set_defaults(func=cmd_check_html)
    p = sub.add_parser("lab", parents=[common],
                       help="JupyterLab on the project's kernel; prints the URL")
    p.add_argument("--port", type=int, default=0, help="default: a free port")
    p.add_argument("--token", default=None, help="default: a random token")
    p.set_defaults(func=cmd_lab)
    c = sub.add_parser(
        "clean-stale", parents=[common], help="delete the sweep's row caches of other code versions; print what "
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
    c.set_defaults(func=cmd_clean_stale)
    args = parser.parse_args(argv)
    return args.func(args)
