"""Execute the book's notebooks with papermill (incrementally) and build the HTML.

The sources in ``notebooks/`` are committed without outputs. :func:`run_all` executes every
notebook listed in ``_toc.yml`` through papermill (passing ``profile`` to its ``parameters``
cell) into a store per profile, ``_build/executed/<profile>/``, skipping a notebook whose
inputs have not changed since its last successful run (:mod:`fovea_book.build.cache`), and
stages the executed copies in ``_build/src/``. :func:`build_html` builds the HTML from that
tree with ``jupyter-book build -W -n --keep-going`` (execution is *off* in ``_config.yml``:
the book shows exactly what papermill produced; Sphinx re-reads only the pages that changed).

Up to ``jobs`` notebooks execute at once (default :func:`default_jobs`: two where there
are two cores), each in its own spawned process; with ``jobs=1`` they run one after another
in this process. Notebooks start in ``_toc.yml`` order, except that a notebook can declare,
in its own metadata, notebooks that must have *finished* (ran, cached or failed) before it
starts: ``metadata["fovea"]["after"]``, a list of file stems of earlier notebooks, or
``"*"`` for every earlier one (:func:`notebook_order`). The order is about reusing the disk
caches an earlier chapter fills (``data/cache``), not about correctness; a notebook still
waiting does not hold back a later one that is ready (:func:`schedule`).

A cell that raises fails the command, naming the notebook and the cell; the other notebooks
still run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Hashable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import TypeVar

import yaml

from fovea_book.build.cache import CacheRecords, Inputs, notebook_key
from fovea_book.build.tidy import KERNEL_NAME
from fovea_core.paths import file_digest
from fovea_book.profiles import PROFILES

#: What the staging tree needs besides the executed notebooks.
BOOK_FILES = ("_config.yml", "_toc.yml", "book")
#: Tag papermill puts on the cell it injects; the runner adds :data:`HIDE_INJECTED`.
INJECTED = "injected-parameters"
HIDE_INJECTED = "hide-cell"
#: glibc malloc settings for the kernels (and the sweep workers they start): keep freed
#: blocks of up to 128 MiB in the heap instead of returning each page-sized tensor to the
#: OS. The experiments allocate and free tens of MB per question; with the defaults a
#: worker spent up to 3/4 of its time in the kernel (page faults, munmap); a query-aware
#: scoring loop measured 7.6 s -> 1.6 s of system time. Numbers are unchanged (allocation
#: only); other C libraries ignore the variables; a value already set is kept.
KERNEL_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 * 2**20),
              "MALLOC_TRIM_THRESHOLD_": str(512 * 2**20)}
#: Notebook metadata key of the build's settings; ``after`` is the ordering constraint.
METADATA_KEY = "fovea"
#: ``after`` value meaning every notebook before this one in ``_toc.yml``.
AFTER_ALL = "*"


@dataclass
class NotebookRun:
    """Outcome of one notebook in one build."""

    notebook: str
    status: str            # "ran", "cached" or "failed"
    seconds: float         # spent in this build
    total: float           # running total of the build so far
    ran_seconds: float     # how long its executed copy took to produce
    error: str = ""
    reason: str = ""       # why it ran (the inputs that changed)
    started: float = 0.0   # seconds from the build's start to this notebook's turn

    @property
    def ok(self) -> bool:
        return self.status != "failed"


class NotebookFailed(RuntimeError):
    """A notebook cell raised during execution."""


class UsageError(ValueError):
    """A command asked for something that does not exist or is not allowed (an unknown
    notebook or parameter, a value that does not parse, a path outside the output folder).
    Raised before anything is executed; the command line prints it and exits 2."""


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


def notebook_order(root: Path, toc: Sequence[Path]) -> dict[Path, list[Path]]:
    """For each notebook of ``toc``, the notebooks that must finish before it starts.

    Read (as JSON, no kernel) from the notebook's ``metadata["fovea"]["after"]``: file stems
    of notebooks, or ``"*"`` for every notebook before it in ``toc``. A stem that is not a
    notebook *before* it in ``toc`` raises ValueError naming it, before anything runs: a
    constraint on a later notebook would change the order with ``jobs=1`` (and could wait
    forever), an unknown one is a typo that would silently order nothing.
    """
    index = {nb.stem: i for i, nb in enumerate(toc)}
    order: dict[Path, list[Path]] = {}
    for i, nb in enumerate(toc):
        meta = json.loads((root / nb).read_text(encoding="utf-8")).get("metadata", {})
        after = meta.get(METADATA_KEY, {}).get("after", [])
        if after == AFTER_ALL:
            order[nb] = list(toc[:i])
            continue
        if not isinstance(after, list) or not all(isinstance(a, str) for a in after):
            raise UsageError(f"{nb}: metadata {METADATA_KEY}.after must be a list of notebook "
                             f"stems or {AFTER_ALL!r}, not {after!r}")
        unknown = [a for a in after if a not in index]
        if unknown:
            raise UsageError(f"{nb}: metadata {METADATA_KEY}.after names unknown notebooks "
                             f"{unknown} (not in _toc.yml)")
        later = [a for a in after if index[a] >= i]
        if later:
            raise UsageError(f"{nb}: metadata {METADATA_KEY}.after names {later}, which do "
                             "not come before it in _toc.yml")
        order[nb] = [toc[index[a]] for a in after]
    return order


def select_notebooks(toc: Sequence[Path], only: Sequence[str] | None) -> list[Path]:
    """The notebooks of ``toc`` whose file name contains one of ``only`` (all of them when
    ``only`` is empty or ``None``), in ``toc`` order.

    A key that matches no notebook raises :class:`UsageError` naming it and listing the
    notebooks: ``--only typo`` must not run nothing and succeed.
    """
    if not only:
        return list(toc)
    unmatched = [key for key in only if not any(key in nb.name for nb in toc)]
    if unmatched:
        raise UsageError(f"--only {' '.join(map(repr, unmatched))} matches no notebook in "
                         f"_toc.yml; the notebooks are: {', '.join(nb.name for nb in toc)}")
    return [nb for nb in toc if any(key in nb.name for key in only)]


T = TypeVar("T", bound=Hashable)


def schedule(items: Sequence[T], after: Mapping[T, Collection[T]], jobs: int,
             begin: Callable[[T], Future]) -> Iterator[tuple[T, Future]]:
    """Start each of ``items`` once, at most ``jobs`` at a time; yield ``(item, future)`` as
    each finishes.

    ``begin(item)`` starts one and returns its future; a future already done when ``begin``
    returns (a cached notebook, or one executed in the caller's thread) takes no slot and is
    yielded at once. An item may start when every item it comes ``after`` (those of
    ``items``) has finished, whatever its outcome; the first such in ``items`` order starts
    next, so an item that waits does not hold back a later one that is ready. ``begin``
    runs, and the items are yielded, in the caller's thread, and an item counts as finished
    only once the caller takes it, so whatever the caller does with a finished item (cache
    records, staging) is done before its dependents start. Kept apart from papermill so
    that the order can be tested with fakes.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    needs = {x: set(after.get(x, ())) & set(items) for x in items}   # others are not run here
    waiting, finished = list(items), set()
    running: dict[Future, T] = {}
    while waiting or running:
        ready = next((x for x in waiting if needs[x] <= finished), None)
        if ready is not None and len(running) < jobs:
            waiting.remove(ready)
            future = begin(ready)
            if not future.done():
                running[future] = ready
                continue
            done = [(ready, future)]
        elif running:
            futures, _ = wait(running, return_when=FIRST_COMPLETED)
            done = sorted(((running.pop(f), f) for f in futures), key=lambda d: items.index(d[0]))
        else:
            raise ValueError(f"{[str(x) for x in waiting]} wait for each other")
        for item, future in done:
            finished.add(item)
            yield item, future


@contextmanager
def children_stop_with_us(signals: Sequence[int] | None = None) -> Iterator[None]:
    """While inside, a SIGTERM (or SIGHUP) to this process stops every process it started,
    then exits with ``128 + signal``.

    The book's processes nest: notebook workers start kernels, kernels start sweep workers.
    Python's default SIGTERM ends only the process that receives it, so ``make book``
    stopped by ``kill`` or a CI timeout used to leave kernels and workers computing (and
    holding memory) with no parent. Here every descendant (:meth:`psutil.Process.children`,
    recursive) is sent SIGTERM, given 5 s, then killed. Ctrl-C (SIGINT) reaches the whole
    foreground process group from the terminal already and is left alone.
    """
    import signal

    import psutil

    sigs = [signal.SIGTERM, signal.SIGHUP] if signals is None else list(signals)

    def stop(signum, frame) -> None:
        kids = psutil.Process().children(recursive=True)
        for p in kids:
            try:
                p.terminate()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(kids, timeout=5)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        print(f"stopped by signal {signum}: {len(kids)} child process(es) stopped",
              file=sys.stderr, flush=True)
        os._exit(128 + signum)           # no clean-up left: records are saved per notebook

    old = {s: signal.signal(s, stop) for s in sigs}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def default_jobs() -> int:
    """Notebooks at once unless told: two, or one on a single core.

    The light chapters run on one core and the heavy ones have serial phases, so a second
    notebook uses the core that would idle; more would only compete for the same cores.
    """
    return min(2, os.cpu_count() or 1)


def _pool(jobs: int) -> Executor:
    """The processes that execute notebooks when ``jobs > 1`` (one notebook each at a time).

    Spawned, as in :mod:`~fovea_book.build.batch`, but with the environment unchanged: the
    notebooks set their own thread counts, and other counts could change float rounding.
    """
    return ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"))


def _done(result: object) -> Future:
    """A future that already holds ``result`` (for work done without a pool)."""
    future: Future = Future()
    future.set_result(result)
    return future


def kernel_config():
    """Kernel-manager settings for papermill: encrypted (or local-socket) kernel transport.

    ipykernel >= 7 warns "Kernel is running over TCP without encryption" whenever a
    kernel is started over TCP without CurveZMQ keys. jupyter_client >= 8.10 can provision
    the keys itself (``KernelManager.transport_encryption``) for kernelspecs that declare
    ``supported_encryption: curve`` (ipykernel's do); where libzmq lacks CurveZMQ the kernel
    talks over IPC sockets instead. Either way the warning's cause is gone, not hidden.
    """
    import zmq
    from traitlets.config import Config

    from jupyter_client.manager import KernelManager

    km: dict[str, object] = {}
    if zmq.has("curve") and KernelManager.class_traits().get("transport_encryption"):
        km["transport_encryption"] = "auto"
    else:
        km["transport"] = "ipc"
    return Config({"KernelManager": km})


def kernel_manager_class() -> type:
    """papermill's kernel manager, minus the interrupt that jupyter_client sends at shutdown.

    jupyter_client >= 8.9 sends SIGINT to a kernel before asking it to shut down. When the
    signal lands while ipykernel is still inside a message handler (it has just answered
    the last cell), the kernel logs "KeyboardInterrupt caught in kernel." on the terminal;
    that happened for about one notebook per build. A papermill run is over when its kernel
    is shut down, so there is nothing to interrupt: the shutdown request is sent as usual
    and a kernel that does not exit is still killed after ``shutdown_wait_time``.
    """
    global _KM
    if _KM is None:
        from jupyter_client.manager import AsyncKernelManager

        class BookKernelManager(AsyncKernelManager):
            async def _async_interrupt_kernel(self) -> None:
                if self.shutting_down:
                    return
                await super()._async_interrupt_kernel()

        _KM = BookKernelManager
    return _KM


_KM: type | None = None


def hide_injected_cell(path: Path) -> None:
    """Tag papermill's injected-parameters cell ``hide-cell`` in an executed copy."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    changed = False
    for cell in nb["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if INJECTED in tags and HIDE_INJECTED not in tags:
            cell["metadata"]["tags"] = tags + [HIDE_INJECTED]
            changed = True
    if changed:
        path.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n",
                        encoding="utf-8")


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
    for k, v in KERNEL_ENV.items():             # inherited by the kernel and its workers
        os.environ.setdefault(k, v)
    params = {"profile": profile, **(parameters or {})}
    try:
        pm.execute_notebook(str(src), str(dst), parameters=params, kernel_name=kernel,
                            cwd=str(src.parent), progress_bar=False,
                            execution_timeout=timeout, config=kernel_config(),
                            kernel_manager_class=kernel_manager_class())
    except PapermillExecutionError as exc:
        raise NotebookFailed(f"{label or src}: {_describe_failure(dst, exc)}") from None
    hide_injected_cell(dst)


def run_notebook(src: Path, dst: Path, profile: str, parameters: dict | None = None,
                 timeout: int = 1800, label: str | None = None) -> tuple[bool, float, str]:
    """:func:`execute_notebook` as a task for a process pool: ``(ok, seconds, error)``.

    A failing cell comes back as a value (``ok`` False, the :class:`NotebookFailed` text),
    so the caller, which alone writes the cache records, keeps going with the others.
    """
    t0 = time.perf_counter()
    try:
        execute_notebook(src, dst, profile, parameters=parameters, timeout=timeout, label=label)
        return True, time.perf_counter() - t0, ""
    except NotebookFailed as exc:
        return False, time.perf_counter() - t0, str(exc)


def _describe_failure(executed: Path, exc: Exception) -> str:
    """'cell K ('first line') raised E: msg', K being the cell's index in the *source* notebook.

    papermill adds cells to the executed copy (its injected parameters, an error banner);
    they are discounted so that K points at the cell a reader sees in JupyterLab.
    """
    import nbformat

    added = {INJECTED, "papermill-error-cell-tag"}
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


def store_dir(root: Path, profile: str) -> Path:
    """Where the executed copies of one profile and their cache records live."""
    return root / "_build" / "executed" / profile


def _copy_if_changed(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` unless identical: an unchanged page keeps its mtime, so Sphinx
    skips it; a changed one gets a new mtime, so Sphinx re-reads it."""
    if dst.exists() and dst.stat().st_size == src.stat().st_size \
            and file_digest(dst) == file_digest(src):
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def _line(i: int, n: int, run: NotebookRun, width: int) -> str:
    extra = f"  (ran in {run.ran_seconds:.1f} s)" if run.status == "cached" else \
        (f"  [{run.reason}]" if run.reason and run.status == "ran" else "")
    return (f"[{i:>{len(str(n))}}/{n}] {run.notebook:<{width}} {run.status:<6} "
            f"{run.seconds:7.1f} s   total {run.total:7.1f} s{extra}")


def _build_seconds(runs: list[NotebookRun]) -> float:
    """Seconds from the build's start to its last notebook's end."""
    return max((r.total for r in runs), default=0.0)


def summary_table(runs: list[NotebookRun]) -> str:
    """The end-of-build table: one row per notebook, then the counts."""
    width = max([len(r.notebook) for r in runs] + [8])
    rows = [f"{'notebook':<{width}}  status  seconds  executed in", "-" * (width + 32)]
    rows += [f"{r.notebook:<{width}}  {r.status:<6}  {r.seconds:7.1f}  {r.ran_seconds:9.1f} s"
             for r in runs]
    counts = {s: sum(r.status == s for r in runs) for s in ("ran", "cached", "failed")}
    rows.append("-" * (width + 32))
    rows.append(f"{len(runs)} notebooks: {counts['ran']} ran, {counts['cached']} cached, "
                f"{counts['failed']} failed; {_build_seconds(runs):.1f} s")
    return "\n".join(rows)


def run_all(root: Path, profile: str, *, out: Path | None = None,
            only: list[str] | None = None, force: bool = False,
            jobs: int | None = None) -> list[NotebookRun]:
    """Execute the ``_toc.yml`` notebooks of ``root`` whose inputs changed; stage them in ``out``.

    Up to ``jobs`` at once (default :func:`default_jobs`; ``1``: one after another in this
    process), in the order of :func:`schedule` and :func:`notebook_order`; ``only`` selects
    notebooks by name (:func:`select_notebooks`; a key that matches none raises
    :class:`UsageError` before anything runs). Keeps going after
    a failure so that one run reports every broken notebook; the caller decides the exit
    status. Only this process writes the cache records and ``out/timings.json``. One line
    per notebook as it finishes (and, with ``jobs > 1``, one as it starts), a table in TOC
    order at the end; both also go to ``out/timings.json``.
    """
    jobs = default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    out = out or root / "_build" / "src"
    store = store_dir(root, profile)
    toc = toc_notebooks(root)
    notebooks = select_notebooks(toc, only)        # a typo in --only fails before anything runs
    order = notebook_order(root, toc)              # so does a bad constraint
    records = CacheRecords.load(store / ".cache.json")
    shared = Inputs.of(root)
    runs: dict[Path, NotebookRun] = {}
    turns: dict[Path, tuple[float, dict, str]] = {}     # started at, inputs, why it runs
    width = max([len(str(nb)) for nb in notebooks] + [8])
    rel = lambda p: os.path.relpath(p, Path.cwd())  # noqa: E731
    print(f"Executing {len(notebooks)} notebooks (profile={profile}{', forced' if force else ''}"
          f"{f', {jobs} at once' if jobs > 1 else ''}) into {rel(store)}", flush=True)
    pool = _pool(jobs) if jobs > 1 else None
    start = time.perf_counter()

    def begin(nb: Path) -> Future:
        """Resolve a cached notebook at once; else start executing it (in ``pool`` if any)."""
        executed = store / nb
        inputs = notebook_key(root / nb, profile, {}, shared)
        fresh = not force and records.fresh(str(nb), inputs, executed)
        reason = "" if fresh else "forced" if force else \
            ", ".join(records.why_stale(str(nb), inputs, executed))
        turns[nb] = (time.perf_counter(), inputs, reason)
        if fresh:
            return _done(None)
        records.forget(str(nb))
        records.save()
        if pool is None:
            return _done(run_notebook(root / nb, executed, profile, label=str(nb)))
        print(f"started {nb}", flush=True)
        return pool.submit(run_notebook, root / nb, executed, profile, label=str(nb))

    with pool or nullcontext():
        for nb, future in schedule(notebooks, order, jobs, begin):
            t0, inputs, reason = turns[nb]
            if future.result() is None:
                run = NotebookRun(str(nb), "cached", 0.0, 0.0,
                                  records.records[str(nb)].get("seconds", 0.0))
            else:
                ok, seconds, error = future.result()
                if ok:
                    records.record(str(nb), inputs, store / nb, seconds)
                    records.save()
                run = NotebookRun(str(nb), "ran" if ok else "failed", 0.0, 0.0, seconds,
                                  error=error, reason=reason)
            if run.ok:
                _copy_if_changed(store / nb, out / nb)
            now = time.perf_counter()
            run.started, run.seconds, run.total = t0 - start, now - t0, now - start
            runs[nb] = run
            print(_line(len(runs), len(notebooks), run, width), flush=True)
            if run.error:
                print(f"    {run.error}", flush=True)
    ordered = [runs[nb] for nb in notebooks]
    out.mkdir(parents=True, exist_ok=True)
    (out / "timings.json").write_text(json.dumps(
        {"profile": profile, "forced": force, "jobs": jobs,
         "total_seconds": round(_build_seconds(ordered), 2),
         "runs": [{**asdict(r), "ok": r.ok} for r in ordered]}, indent=1))
    if ordered:
        print(summary_table(ordered), flush=True)
    return ordered


def stage(root: Path, out: Path) -> None:
    """Copy the book's configuration and prose next to the executed notebooks."""
    for name in BOOK_FILES:
        src, dst = root / name, out / name
        if src.is_dir():
            for f in sorted(p for p in src.rglob("*") if p.is_file()):
                _copy_if_changed(f, dst / f.relative_to(src))
        else:
            _copy_if_changed(src, dst)


def _html_fingerprint(root: Path) -> str:
    """What Sphinx does not track itself: the locked packages (theme, extensions) and the
    book's own Sphinx extensions. When it changes, every page is written again (``--all``)."""
    from fovea_book.build.cache import LOCK_FILE

    parts = [(p.relative_to(root).as_posix(), file_digest(p))
             for p in sorted((root / "book" / "_ext").glob("*.py"))]
    lock = root / LOCK_FILE
    parts.append((LOCK_FILE, file_digest(lock) if lock.exists() else None))
    return json.dumps(parts)


def build_html(root: Path, src: Path | None = None, *, quiet: bool = True) -> Path:
    """``jupyter-book build -W -n --keep-going`` of the staged tree into ``root/_build/html``.

    Incremental: Sphinx re-reads only pages whose staged file changed. With ``quiet``,
    Sphinx's status lines (``-q``) and Jupyter Book's banner are dropped; warnings and
    errors are still printed (stderr), and the banner too when the build fails.
    """
    src = src or root / "_build" / "src"
    stage(root, src)
    stamp = root / "_build" / "html" / ".tools.json"
    fingerprint = _html_fingerprint(root)
    rebuild = not stamp.exists() or stamp.read_text() != fingerprint
    exe = Path(sys.executable).parent / "jupyter-book"
    cmd = [str(exe if exe.exists() else "jupyter-book"), "build", str(src),
           "--path-output", str(root), "-W", "-n", "--keep-going"] + (["-q"] if quiet else []) \
        + (["--all"] if rebuild else [])
    print("$", " ".join(os.path.relpath(c) if os.path.isabs(c) else c for c in cmd), flush=True)
    t0 = time.perf_counter()
    result = subprocess.run(cmd, stdout=subprocess.PIPE if quiet else None, text=True)
    if result.returncode:
        print(result.stdout or "", end="", flush=True)
        stamp.unlink(missing_ok=True)
        raise subprocess.CalledProcessError(result.returncode, cmd)
    stamp.write_text(fingerprint)
    index = root / "_build" / "html" / "index.html"
    print(f"HTML built in {time.perf_counter() - t0:.1f} s: {index}", flush=True)
    return index
