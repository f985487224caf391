"""Execute the book's notebooks with papermill and build the HTML with Jupyter Book.

The sources in ``notebooks/`` are committed without outputs. This module runs every
notebook listed in ``_toc.yml`` through papermill (passing ``profile`` to its
``parameters`` cell), writes the executed copies into a staging tree under
``_build/src/``, and builds the HTML from that tree with
``jupyter-book build -W -n --keep-going`` (execution is *off* in ``_config.yml``: the book
shows exactly what papermill produced). Both README commands go through here::

    python -m fovea_core.book run   --profile smoke     # execute only
    python -m fovea_core.book build                     # HTML from the executed copies
    python -m fovea_core.book all   --profile default   # both (``make book``)

A cell that raises fails the command, naming the notebook and the cell.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from fovea_core.profiles import PROFILES
KERNEL_NAME = "fovea"
#: What the staging tree needs besides the executed notebooks.
BOOK_FILES = ("_config.yml", "_toc.yml", "book")


@dataclass
class NotebookRun:
    """Outcome of executing one notebook."""

    notebook: str
    seconds: float
    ok: bool
    error: str = ""


class NotebookFailed(RuntimeError):
    """A notebook cell raised during execution."""


def toc_files(root: Path) -> list[str]:
    """All ``file:`` entries of ``root/_toc.yml`` (root page first), in reading order."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    files = [toc["root"]]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({k: v for k, v in toc.items() if k != "root"})
    return files


def toc_notebooks(root: Path) -> list[Path]:
    """Notebooks (relative paths) listed in ``_toc.yml``, in reading order."""
    return [Path(f).with_suffix(".ipynb") for f in toc_files(root)
            if (root / Path(f).with_suffix(".ipynb")).exists()]


def execute_notebook(src: Path, dst: Path, profile: str, *, kernel: str = KERNEL_NAME,
                     parameters: dict | None = None, timeout: int = 1800,
                     label: str | None = None) -> None:
    """Run ``src`` with papermill into ``dst``; raise :class:`NotebookFailed` on a cell error.

    The notebook runs with its own folder as working directory, so relative paths in
    a notebook mean the same in JupyterLab and here.
    """
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    dst.parent.mkdir(parents=True, exist_ok=True)
    params = {"profile": profile, **(parameters or {})}
    try:
        pm.execute_notebook(str(src), str(dst), parameters=params, kernel_name=kernel,
                            cwd=str(src.parent), progress_bar=False,
                            execution_timeout=timeout)
    except PapermillExecutionError as exc:
        raise NotebookFailed(f"{label or src}: {_describe_failure(dst, exc)}") from None


def _describe_failure(executed: Path, exc: Exception) -> str:
    """'cell K ('first line') raised E: msg', K being the cell's index in the *source* notebook.

    papermill adds cells to the executed copy (its injected parameters, an error banner);
    they are discounted so that K points at the cell a reader sees in JupyterLab.
    """
    import nbformat

    added = {"injected-parameters", "papermill-error-cell-tag"}
    where = f"cell {exc.cell_index} of the executed copy"
    try:
        cells = [c for c in nbformat.read(str(executed), as_version=4).cells
                 if not added & set(c.metadata.get("tags", []))]
        index = next(i for i, c in enumerate(cells)
                     if any(o.get("output_type") == "error" for o in c.get("outputs", [])))
        first = next((ln for ln in cells[index].source.splitlines() if ln.strip()), "")
        where = f"cell {index} ({first.strip()[:60]!r})"
    except (OSError, StopIteration, ValueError):
        pass
    return f"{where} raised {exc.ename}: {exc.evalue}"


def run_all(root: Path, profile: str, *, out: Path | None = None,
            only: list[str] | None = None) -> list[NotebookRun]:
    """Execute every ``_toc.yml`` notebook of ``root`` into ``out`` (``_build/src``).

    Keeps going after a failure so that one run reports every broken notebook; the
    caller decides the exit status. Timings go to ``out/timings.json``.
    """
    out = out or root / "_build" / "src"
    notebooks = toc_notebooks(root)
    if only:
        notebooks = [nb for nb in notebooks if any(key in nb.name for key in only)]
    runs: list[NotebookRun] = []
    print(f"Executing {len(notebooks)} notebooks (profile={profile}) into {out}", flush=True)
    for i, nb in enumerate(notebooks, 1):
        print(f"[{i}/{len(notebooks)}] {nb} ...", end=" ", flush=True)
        start = time.perf_counter()
        try:
            execute_notebook(root / nb, out / nb, profile, label=str(nb))
            runs.append(NotebookRun(str(nb), time.perf_counter() - start, True))
            print(f"ok ({runs[-1].seconds:.1f} s)", flush=True)
        except NotebookFailed as exc:
            runs.append(NotebookRun(str(nb), time.perf_counter() - start, False, str(exc)))
            print(f"FAILED ({runs[-1].seconds:.1f} s)\n    {exc}", flush=True)
    (out / "timings.json").parent.mkdir(parents=True, exist_ok=True)
    (out / "timings.json").write_text(json.dumps(
        {"profile": profile, "runs": [asdict(r) for r in runs]}, indent=1))
    return runs


def stage(root: Path, out: Path) -> None:
    """Copy the book's configuration and prose next to the executed notebooks."""
    for name in BOOK_FILES:
        src, dst = root / name, out / name
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True)
        else:
            shutil.copy2(src, dst)


def build_html(root: Path, src: Path | None = None) -> Path:
    """``jupyter-book build -W -n --keep-going`` of the staged tree into ``root/_build/html``."""
    src = src or root / "_build" / "src"
    stage(root, src)
    exe = Path(sys.executable).parent / "jupyter-book"
    cmd = [str(exe if exe.exists() else "jupyter-book"), "build", str(src),
           "--path-output", str(root), "-W", "-n", "--keep-going"]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    index = root / "_build" / "html" / "index.html"
    print(f"Book: {index}")
    return index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fovea_core.book", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("run", "build", "all"))
    parser.add_argument("--profile", default=os.environ.get("PROFILE", "default"),
                        choices=PROFILES)
    parser.add_argument("--root", type=Path, default=Path.cwd(),
                        help="project root holding _toc.yml (default: the current folder)")
    parser.add_argument("--only", nargs="*",
                        help="execute only notebooks whose file name contains one of these")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if args.command in ("run", "all"):
        start = time.perf_counter()
        runs = run_all(root, args.profile, only=args.only)
        failed = [r for r in runs if not r.ok]
        print(f"{len(runs) - len(failed)} notebooks ok, {len(failed)} failed, "
              f"{time.perf_counter() - start:.0f} s in all", flush=True)
        if failed:
            print("Failed notebooks:\n" + "\n".join(f"  {r.error}" for r in failed),
                  file=sys.stderr)
            return 1
    if args.command in ("build", "all"):
        try:
            build_html(root)
        except subprocess.CalledProcessError as exc:
            print(f"jupyter-book build failed (exit {exc.returncode})", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
