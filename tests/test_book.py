"""The papermill runner behind `make book` / `make test`: fails loudly on a raising cell,
re-executes only what changed, reports quietly, hides papermill's injected cell."""

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fovea_book.build import toc_files, toc_notebooks

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"


def make_project(tmp_path: Path, *notebooks: str) -> Path:
    """A minimal book: the real _config.yml and book/ assets, an intro page, fixture notebooks."""
    shutil.copytree(ROOT / "book", tmp_path / "book",
                    ignore=shutil.ignore_patterns("*.md", "__pycache__"))
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "data").mkdir()
    shutil.copy(ROOT / "_config.yml", tmp_path)
    (tmp_path / "book" / "intro.md").write_text("# Fixture book\n\nA page.\n")
    chapters = ""
    for notebook in notebooks:
        shutil.copy(FIXTURES / notebook, tmp_path / "notebooks" / notebook)
        chapters += f"  - file: notebooks/{Path(notebook).stem}\n"
    (tmp_path / "_toc.yml").write_text(f"format: jb-book\nroot: book/intro\nchapters:\n{chapters}")
    return tmp_path


def run_book(root: Path, command: str = "all", *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FOVEA_DATA": str(root / "datasets")}
    return subprocess.run([sys.executable, "-m", "fovea_book.build", command, "--profile", "smoke",
                           "--root", str(root), *extra], capture_output=True, text=True,
                          timeout=600, env=env, cwd=root)


def run_here(root: Path, monkeypatch, *, force: bool = False) -> list:
    """``run`` in this process (no interpreter start-up): the runs, as the CLI would print."""
    from fovea_book.build.runner import run_all

    monkeypatch.setenv("FOVEA_DATA", str(root / "datasets"))
    return run_all(root, "smoke", force=force)


def statuses(root: Path) -> dict[str, str]:
    timings = json.loads((root / "_build" / "src" / "timings.json").read_text())
    return {Path(r["notebook"]).name: r["status"] for r in timings["runs"]}


def test_raising_cell_fails_the_run_and_names_notebook_and_cell(tmp_path):
    result = run_book(make_project(tmp_path, "raises.ipynb"))
    assert result.returncode == 1, result.stdout + result.stderr
    report = result.stderr
    # the raising cell is cell 3 (0-based) of the source notebook, whatever papermill injects
    assert re.search(r"notebooks/raises\.ipynb: cell 3 \('raise ValueError.*\) raised "
                     r"ValueError: deliberate failure", report), report
    assert not (tmp_path / "_build" / "html" / "index.html").exists()


def test_working_notebook_is_executed_with_the_profile_and_built(tmp_path):
    root = make_project(tmp_path, "ok.ipynb")
    result = run_book(root)
    assert result.returncode == 0, result.stdout + result.stderr
    executed = json.loads((root / "_build" / "src" / "notebooks" / "ok.ipynb").read_text())
    stdout = "".join("".join(o.get("text", "")) for c in executed["cells"]
                     for o in c.get("outputs", []))
    assert "PROFILE=smoke" in stdout
    # the kernel runs with the runner's malloc settings (a value already set would be kept)
    want = os.environ.get("MALLOC_MMAP_THRESHOLD_", str(128 * 2**20))
    assert f"MALLOC_MMAP_THRESHOLD_={want}" in stdout
    html = (root / "_build" / "html" / "notebooks" / "ok.html").read_text()
    assert "PROFILE=smoke" in html          # the page shows papermill's outputs
    timings = json.loads((root / "_build" / "src" / "timings.json").read_text())
    assert [r["ok"] for r in timings["runs"]] == [True]
    assert [r["status"] for r in timings["runs"]] == ["ran"]
    # the page starts with its title; papermill's injected cell is collapsed, not removed
    cells = json.loads((root / "_build" / "src" / "notebooks" / "ok.ipynb").read_text())["cells"]
    injected = [c for c in cells if "injected-parameters" in c["metadata"].get("tags", [])]
    assert len(injected) == 1 and "hide-cell" in injected[0]["metadata"]["tags"]
    assert 'profile = "smoke"' in "".join(injected[0]["source"])
    assert "toggle-details" in html or "tag_hide-cell" in html


def test_progress_is_one_quiet_line_per_notebook_and_a_summary(tmp_path):
    """No kernel transport warning, one status line per notebook, a table at the end."""
    result = run_book(make_project(tmp_path, "ok.ipynb"), "run")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "without encryption" not in out
    assert "WARNING" not in out, out
    line = re.search(r"^\[1/1\] notebooks/ok\.ipynb\s+ran\s+[\d.]+ s\s+total\s+[\d.]+ s", out, re.M)
    assert line, out
    assert re.search(r"^1 notebooks: 1 ran, 0 cached, 0 failed", out, re.M), out


def test_the_transport_warning_is_real_without_the_runners_kernel_settings(tmp_path):
    """The check above can fail: plain papermill on this ipykernel prints the warning."""
    code = ("import papermill as pm; pm.execute_notebook({src!r}, {dst!r}, kernel_name='fovea', "
            "progress_bar=False, parameters={{'profile': 'smoke'}})")
    result = subprocess.run([sys.executable, "-c", code.format(
        src=str(FIXTURES / "ok.ipynb"), dst=str(tmp_path / "out.ipynb"))],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Kernel is running over TCP without encryption" in result.stderr


def test_second_run_is_cached_and_reuses_the_executed_copy(tmp_path, monkeypatch, capsys):
    root = make_project(tmp_path, "ok.ipynb")
    assert [r.status for r in run_here(root, monkeypatch)] == ["ran"]
    executed = root / "_build" / "executed" / "smoke" / "notebooks" / "ok.ipynb"
    staged = root / "_build" / "src" / "notebooks" / "ok.ipynb"
    before = (executed.read_bytes(), executed.stat().st_mtime_ns, staged.stat().st_mtime_ns)
    capsys.readouterr()
    assert [r.status for r in run_here(root, monkeypatch)] == ["cached"]
    assert statuses(root) == {"ok.ipynb": "cached"}
    assert re.search(r"notebooks/ok\.ipynb\s+cached", capsys.readouterr().out)
    assert (executed.read_bytes(), executed.stat().st_mtime_ns, staged.stat().st_mtime_ns) == before
    # an executed copy changed since it was recorded is not trusted
    executed.write_text(executed.read_text().replace("PROFILE=smoke", "PROFILE=edited"))
    assert [r.status for r in run_here(root, monkeypatch)] == ["ran"]
    # FORCE=1 re-executes it
    assert [r.status for r in run_here(root, monkeypatch, force=True)] == ["ran"]


def test_changing_one_notebook_reruns_only_it(tmp_path, monkeypatch, capsys):
    root = make_project(tmp_path, "ok.ipynb", "raises.ipynb")
    (root / "notebooks" / "raises.ipynb").unlink()
    shutil.copy(FIXTURES / "ok.ipynb", root / "notebooks" / "raises.ipynb")   # a second ok one
    run_here(root, monkeypatch)
    assert statuses(root) == {"ok.ipynb": "ran", "raises.ipynb": "ran"}
    nb = json.loads((root / "notebooks" / "ok.ipynb").read_text())
    nb["cells"].append({"cell_type": "markdown", "id": "new", "metadata": {}, "source": ["More."]})
    (root / "notebooks" / "ok.ipynb").write_text(json.dumps(nb, indent=1))
    capsys.readouterr()
    run_here(root, monkeypatch)
    out = capsys.readouterr().out
    assert statuses(root) == {"ok.ipynb": "ran", "raises.ipynb": "cached"}, out
    assert re.search(r"notebooks/ok\.ipynb\s+ran .*\[notebook\]", out), out
    # a new dataset file changes every notebook's inputs
    (root / "datasets").mkdir()
    (root / "datasets" / "new.csv").write_text("a,b\n1,2\n")
    run_here(root, monkeypatch)
    assert statuses(root) == {"ok.ipynb": "ran", "raises.ipynb": "ran"}


def test_a_failed_notebook_is_not_cached(tmp_path, monkeypatch):
    root = make_project(tmp_path, "raises.ipynb")
    assert [r.status for r in run_here(root, monkeypatch)] == ["failed"]
    assert [r.status for r in run_here(root, monkeypatch)] == ["failed"]


@pytest.mark.parametrize("target", ["book", "test"])
def test_both_make_targets_use_the_failing_runner(target):
    """`make book` and `make test` both go through `fovea_book.build all` (tested above)."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(rf"^{target}:.*?\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "-m fovea_book.build all" in recipe


def test_ci_runs_exactly_make_test():
    lines = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert "set -euo pipefail" in lines
    assert lines[-1] == "make test"


def test_toc_lists_root_first_and_notebooks_in_order():
    files = toc_files(ROOT)
    assert files[0] == "book/intro"
    nbs = [p.stem for p in toc_notebooks(ROOT)]

    def number(stem: str) -> tuple[int, int]:      # "14_5_receipts_and_forms" -> (14, 5)
        m = re.match(r"(\d+)(?:_(\d+)_)?", stem)
        return int(m.group(1)), int(m.group(2) or 0)

    assert nbs == sorted(nbs, key=number), "notebooks should appear in the TOC in numeric order"


def test_the_cache_key_covers_every_input_and_nothing_else(tmp_path, monkeypatch):
    """Notebook, fovea_core, cuda/, parameters, profile, datasets, data/, lock file."""
    from fovea_book.build.cache import Inputs, notebook_key

    root = tmp_path
    files = {"fovea_core/a.py": "x = 1\n", "book/fovea_book/build/tool.py": "y = 1\n",
             "cuda/k.cu": "// kernel\n", "data/biology/t.csv": "a\n1\n",
             "data/cache/sweeps/s.csv": "r\n", "datasets/sroie-dev/img/1.jpg": "jpg",
             "requirements.lock": "numpy==2.0.0 \\\n    --hash=sha256:00\n",
             "notebooks/n.ipynb": json.dumps({"cells": []})}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    monkeypatch.setenv("FOVEA_DATA", str(root / "datasets"))
    nb = root / "notebooks" / "n.ipynb"

    def key(profile="smoke", params=None):
        return notebook_key(nb, profile, params or {}, Inputs.of(root))["key"]

    base = key()
    assert key() == base
    assert key("default") != base
    assert key(params={"budget": 64}) != base
    for rel, changes in [("fovea_core/a.py", True), ("cuda/k.cu", True),
                         ("data/biology/t.csv", True), ("datasets/sroie-dev/img/1.jpg", True),
                         ("requirements.lock", True), ("notebooks/n.ipynb", True),
                         ("book/fovea_book/build/tool.py", False), ("data/cache/sweeps/s.csv", False)]:
        path = root / rel
        old = path.read_text()
        path.write_text(old + " ")
        assert (key() != base) == changes, rel
        path.write_text(old)
        if rel.startswith("datasets/"):
            base = key()          # datasets are listed with mtimes: a rewrite is a change
        assert key() == base, rel
    os.utime(root / "data/biology/t.csv", ns=(0, 0))      # project data: content, not mtime
    assert key() == base
    (root / "datasets" / "osie-dev").mkdir()
    (root / "datasets" / "osie-dev" / "new.jpg").write_text("x")
    assert key() != base


def test_kernels_are_not_interrupted_at_shutdown():
    """jupyter_client interrupts a kernel before shutting it down; the runner's manager does not
    (the interrupt made ipykernel log "KeyboardInterrupt caught in kernel." on the terminal)."""
    import asyncio
    import signal

    from jupyter_client.manager import AsyncKernelManager

    from fovea_book.build.runner import kernel_config, kernel_manager_class

    async def signals_sent(cls) -> list:
        km = cls(kernel_name="fovea", config=kernel_config())
        sent, original = [], km._async_signal_kernel

        async def record(signum):
            sent.append(signum)
            await original(signum)

        km._async_signal_kernel = record
        await km.start_kernel()
        await km.shutdown_kernel()
        return sent

    assert signal.SIGINT in asyncio.run(signals_sent(AsyncKernelManager))   # the cause
    assert signal.SIGINT not in asyncio.run(signals_sent(kernel_manager_class()))


# --- several notebooks at once (runner.schedule, runner.notebook_order) -------------------
# The scheduler takes a begin(item) -> Future, so its order is tested with threads that sleep
# instead of kernels; run_all is tested with the pool and the execution swapped the same way.


class FakeNotebooks:
    """A ``begin`` for :func:`schedule`: item ``x`` works ``seconds[x]`` s in a thread.

    Records ``("start", x)`` / ``("end", x)`` events and the most items working at once;
    the thread pool is larger than any ``jobs``, so only the scheduler limits concurrency.
    """

    def __init__(self, seconds: dict):
        self.seconds, self.events, self.working, self.peak = seconds, [], 0, 0
        self.lock, self.pool = threading.Lock(), ThreadPoolExecutor(max_workers=8)

    def begin(self, item):
        with self.lock:
            self.events.append(("start", item))
            self.working += 1
            self.peak = max(self.peak, self.working)
        return self.pool.submit(self._work, item)

    def _work(self, item):
        time.sleep(self.seconds[item])
        with self.lock:
            self.working -= 1
            self.events.append(("end", item))
        return item

    def at(self, kind: str, item) -> int:
        return self.events.index((kind, item))


def scheduled(items, after, jobs, seconds) -> tuple[FakeNotebooks, list]:
    """Run ``items`` through :func:`schedule` with fakes; the fakes and the yield order."""
    from fovea_book.build.runner import schedule

    fake = FakeNotebooks(seconds)
    try:
        order = [item for item, future in schedule(items, after, jobs, fake.begin)
                 if future.result() == item]
    finally:
        fake.pool.shutdown()
    return fake, order


def order_project(tmp_path: Path, after: dict) -> Path:
    """A book whose notebooks (``{stem: after or None}``, in TOC order) are metadata only."""
    (tmp_path / "notebooks").mkdir(parents=True)
    for stem, value in after.items():
        meta = {"kernelspec": {"name": "fovea"}, **({"fovea": {"after": value}}
                                                    if value is not None else {})}
        nb = {"cells": [], "metadata": meta, "nbformat": 4, "nbformat_minor": 5}
        (tmp_path / "notebooks" / f"{stem}.ipynb").write_text(json.dumps(nb, indent=1))
    chapters = "".join(f"  - file: notebooks/{stem}\n" for stem in after)
    (tmp_path / "_toc.yml").write_text(f"format: jb-book\nroot: intro\nchapters:\n{chapters}")
    return tmp_path


def test_never_more_than_jobs_notebooks_at_once():
    items = list("abcdef")
    for jobs in (2, 3):
        fake, order = scheduled(items, {}, jobs, dict.fromkeys(items, 0.03))
        assert fake.peak == jobs, fake.events         # the slots are used, and no more
        assert sorted(order) == items


def test_a_notebook_waits_for_its_after_but_does_not_hold_back_a_ready_one():
    # c comes after a (slow); d, later in the TOC, is ready and takes the free slot
    fake, order = scheduled(list("abcd"), {"c": ["a"]}, 2,
                            {"a": 0.3, "b": 0.02, "c": 0.02, "d": 0.02})
    assert fake.at("start", "c") > fake.at("end", "a"), fake.events
    assert fake.at("start", "d") < fake.at("end", "a"), fake.events
    assert order == ["b", "d", "a", "c"]
    # a notebook outside this build (--only) is not waited for; a cycle is an error
    _, order = scheduled(list("cd"), {"c": ["a"]}, 2, dict.fromkeys("cd", 0.01))
    assert sorted(order) == ["c", "d"]
    with pytest.raises(ValueError, match="wait for each other"):
        scheduled(list("ab"), {"a": ["b"], "b": ["a"]}, 2, dict.fromkeys("ab", 0.01))


def test_star_waits_for_every_earlier_notebook(tmp_path):
    from fovea_book.build.runner import notebook_order

    root = order_project(tmp_path, {"a": None, "b": None, "c": "*", "d": None})
    toc = toc_notebooks(root)
    order = notebook_order(root, toc)
    a, b, c, d = toc
    assert order == {a: [], b: [], c: [a, b], d: []}
    fake, _ = scheduled(toc, order, 2, {a: 0.02, b: 0.2, c: 0.02, d: 0.02})
    assert fake.at("start", c) > max(fake.at("end", a), fake.at("end", b)), fake.events
    assert fake.at("start", d) < fake.at("end", b), fake.events     # d took the free slot


def test_an_unknown_or_later_after_is_an_error_before_anything_runs(tmp_path, monkeypatch):
    from fovea_book.build import runner

    monkeypatch.setattr(runner, "run_notebook", lambda *a, **k: pytest.fail("ran"))
    root = order_project(tmp_path, {"a": None, "b": ["a", "07_typo"]})
    with pytest.raises(ValueError, match=r"notebooks/b\.ipynb.*'07_typo'"):
        runner.run_all(root, "smoke", jobs=2)
    assert not (root / "_build").exists()
    root = order_project(tmp_path / "later", {"a": ["b"], "b": None})
    with pytest.raises(ValueError, match=r"notebooks/a\.ipynb.*'b'.*not come before"):
        runner.run_all(root, "smoke", jobs=2)


def test_one_job_runs_in_toc_order_one_at_a_time_in_this_process(tmp_path, monkeypatch):
    from fovea_book.build import runner

    items = list("abcd")
    fake, order = scheduled(items, {"c": ["a"]}, 1, {"a": 0.05, "b": 0.01, "c": 0.01, "d": 0.01})
    assert fake.events == [(kind, x) for x in items for kind in ("start", "end")]
    assert order == items and fake.peak == 1
    # run_all(jobs=1): no pool, each notebook executed in this thread, in TOC order
    ran = []

    def fake_run(src: Path, dst: Path, profile: str, label: str) -> tuple[bool, float, str]:
        ran.append((src.stem, threading.current_thread() is threading.main_thread()))
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        return True, 0.0, ""

    monkeypatch.setattr(runner, "run_notebook", fake_run)
    monkeypatch.setattr(runner, "_pool", lambda jobs: pytest.fail("a pool for one job"))
    monkeypatch.setenv("FOVEA_DATA", str(tmp_path / "datasets"))
    root = order_project(tmp_path, {"a": None, "b": None, "c": "*", "d": ["a"]})
    runner.run_all(root, "smoke", jobs=1)
    assert ran == [(x, True) for x in items]


def test_a_failure_does_not_stop_the_others_and_is_reported(tmp_path, monkeypatch, capsys):
    """run_all with two jobs, threads for processes and a fake papermill: b's cell raises;
    c (after b) and d still run, the failure is printed, returned and in timings.json, and
    only the notebooks that ran get a cache record."""
    from fovea_book.build import runner

    def fake_run(src: Path, dst: Path, profile: str, label: str) -> tuple[bool, float, str]:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        if src.stem == "b":
            return False, 0.01, f"{label}: cell 1 ('boom') raised ValueError: deliberate"
        return True, 0.01, ""

    monkeypatch.setattr(runner, "run_notebook", fake_run)
    monkeypatch.setattr(runner, "_pool", lambda jobs: ThreadPoolExecutor(max_workers=jobs))
    monkeypatch.setenv("FOVEA_DATA", str(tmp_path / "datasets"))
    root = order_project(tmp_path, {"a": None, "b": None, "c": ["b"], "d": None})
    runs = runner.run_all(root, "smoke", jobs=2)
    assert [(Path(r.notebook).stem, r.status) for r in runs] == [
        ("a", "ran"), ("b", "failed"), ("c", "ran"), ("d", "ran")]     # TOC order
    assert "deliberate" in runs[1].error
    out = capsys.readouterr().out
    assert re.search(r"^started notebooks/c\.ipynb$", out, re.MULTILINE), out
    assert re.search(r"^\[\d/4\] notebooks/b\.ipynb\s+failed .*\n    notebooks/b\.ipynb: cell 1",
                     out, re.MULTILINE), out
    assert re.search(r"^4 notebooks: 3 ran, 0 cached, 1 failed", out, re.MULTILINE), out
    timings = json.loads((root / "_build" / "src" / "timings.json").read_text())
    assert timings["jobs"] == 2
    assert [r["ok"] for r in timings["runs"]] == [True, False, True, True]
    assert all(0 <= r["started"] <= r["total"] for r in timings["runs"])
    records = json.loads((root / "_build" / "executed" / "smoke" / ".cache.json").read_text())
    assert sorted(records) == ["notebooks/a.ipynb", "notebooks/c.ipynb", "notebooks/d.ipynb"]
    assert [r.status for r in runner.run_all(root, "smoke", jobs=2)] == [
        "cached", "failed", "cached", "cached"]


def test_only_with_a_name_that_matches_no_notebook_fails_before_anything_runs(
        tmp_path, monkeypatch, capsys):
    """`book run --only typo` once ran nothing and exited 0; now it exits 2 naming the typo
    and listing the notebooks, and a valid --only still selects by name."""
    from fovea_book.build import runner
    from fovea_book.build.cli import main

    monkeypatch.setattr(runner, "run_notebook", lambda *a, **k: pytest.fail("ran"))
    root = order_project(tmp_path, {"07_v1_grid_topk": None, "08_v2_pyramid": None})
    with pytest.raises(runner.UsageError, match=r"'typo'.*07_v1_grid_topk\.ipynb, "
                                                r"08_v2_pyramid\.ipynb"):
        runner.run_all(root, "smoke", only=["07", "typo"], jobs=1)
    assert not (root / "_build").exists()
    assert main(["run", "--root", str(root), "--profile", "smoke", "--only", "typo"]) == 2
    err = capsys.readouterr().err
    assert "--only 'typo' matches no notebook" in err and "08_v2_pyramid.ipynb" in err
    assert runner.select_notebooks(runner.toc_notebooks(root), ["08"]) == [
        Path("notebooks/08_v2_pyramid.ipynb")]
    assert len(runner.select_notebooks(runner.toc_notebooks(root), None)) == 2


def test_a_terminated_run_stops_the_processes_it_started(tmp_path):
    """SIGTERM to a process inside children_stop_with_us stops its children and their
    children (as make book's kernels and sweep workers), and exits 128 + 15."""
    import signal
    import textwrap

    import psutil

    pids = tmp_path / "pids"
    script = textwrap.dedent(f"""
        import subprocess, sys, time
        from fovea_book.build.runner import children_stop_with_us
        with children_stop_with_us():
            # a child that starts a grandchild, both sleeping
            child = subprocess.Popen([sys.executable, "-c",
                "import subprocess, sys, time; g = subprocess.Popen(['sleep', '120']); "
                "open({str(pids)!r}, 'w').write(str(g.pid)); time.sleep(120)"])
            time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 30
    while not (pids.exists() and pids.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    kids = psutil.Process(proc.pid).children(recursive=True)
    assert len(kids) == 2                                   # the child and the grandchild
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    gone, alive = psutil.wait_procs(kids, timeout=10)
    for p in alive:                                          # leave nothing behind either way
        p.kill()
    assert not alive
    assert "2 child process(es) stopped" in proc.stderr.read()   # (the children held it open)
