"""JupyterLab works: the server lists the `fovea` kernel and runs 00_quickstart's first cells.

Starts ``jupyter lab --no-browser`` exactly as ``make lab`` does (same command line,
``fovea_book.build.cli.lab_command``) on a free localhost port with a token, talks to it
through the REST API and the kernel websocket, and shuts it down.
"""

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from fovea_book.build.browser import free_port
from fovea_book.build.cli import lab_command
from fovea_book.build.tidy import KERNEL_NAME

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = "notebooks/00_quickstart.ipynb"
FIRST_CELLS = 3          # the parameters cell, the imports and the pyramid


class Lab:
    def __init__(self, tmp: Path):
        self.port, self.token = free_port(), uuid.uuid4().hex
        self.base = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
               "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces")}
        self.log = open(tmp / "lab.log", "w")
        self.proc = subprocess.Popen(lab_command(ROOT, self.port, self.token), env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.tmp = tmp

    def api(self, path: str, method: str = "GET", body: dict | None = None) -> object:
        req = urllib.request.Request(
            f"{self.base}{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read()
        return json.loads(text) if text else None

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                self.api("/api/status")
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.5)
        raise RuntimeError("JupyterLab did not start:\n" + (self.tmp / "lab.log").read_text()[-3000:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.api("/api/shutdown", "POST")
            except (urllib.error.URLError, ConnectionError):
                pass
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def execute(ws, code: str, timeout: float = 120) -> dict:
    """Send one execute_request over the kernel websocket; return the reply's content."""
    msg_id = uuid.uuid4().hex
    ws.send(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test",
                   "session": uuid.uuid4().hex, "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": True,
                    "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}))
    deadline = time.monotonic() + timeout
    errors, reply, idle = [], None, False
    # the reply (shell) and the outputs (iopub) travel on two channels: an error output can
    # arrive after the reply, so wait for both the reply and iopub's "idle", which the kernel
    # sends after the request's last output
    while time.monotonic() < deadline:
        msg = json.loads(ws.recv())
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "error":
            errors.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")
        if msg["channel"] == "shell" and msg["msg_type"] == "execute_reply":
            reply = msg["content"]
        if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
            idle = True
        if reply is not None and idle:
            return {**reply, "errors": errors}
    raise TimeoutError(f"no execute_reply and idle status within {timeout} s")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    server = Lab(tmp_path_factory.mktemp("lab"))
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_fovea_kernel_is_listed(lab):
    specs = lab.api("/api/kernelspecs")
    assert KERNEL_NAME in specs["kernelspecs"], sorted(specs["kernelspecs"])


def test_notebooks_ask_for_a_listed_kernel(lab):
    """No missing-kernel dialog: every notebook's kernelspec names a kernel the server has."""
    listed = set(lab.api("/api/kernelspecs")["kernelspecs"])
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        model = lab.api(f"/api/contents/notebooks/{path.name}?content=1")
        assert model["content"]["metadata"]["kernelspec"]["name"] in listed, path.name


def test_quickstart_first_cells_run_in_the_servers_kernel(lab):
    import websocket

    model = lab.api(f"/api/contents/{NOTEBOOK}?content=1")
    cells = [c for c in model["content"]["cells"] if c["cell_type"] == "code"][:FIRST_CELLS]
    assert "parameters" in cells[0]["metadata"]["tags"]
    session = lab.api("/api/sessions", "POST", {"path": NOTEBOOK, "type": "notebook",
                                                "name": "00_quickstart.ipynb",
                                                "kernel": {"name": KERNEL_NAME}})
    kernel = session["kernel"]
    assert kernel["name"] == KERNEL_NAME
    ws = websocket.create_connection(
        f"ws://127.0.0.1:{lab.port}/api/kernels/{kernel['id']}/channels?token={lab.token}",
        timeout=120, suppress_origin=True)
    try:
        sources = ["".join(c["source"]) for c in cells]
        sources[0] += '\nprofile = "smoke"'          # what papermill would inject
        for i, src in enumerate(sources):
            reply = execute(ws, src)
            assert reply["status"] == "ok", (i, reply["errors"])
        check = execute(ws, "assert pyramid.num_levels >= 2 and gh * gw > budget > 0")
        assert check["status"] == "ok", check["errors"]
        # the cells did run there: a wrong assertion fails in the same kernel
        wrong = execute(ws, "assert pyramid.num_levels == -1")
        assert wrong["status"] == "error" and wrong["errors"]
    finally:
        ws.close()
        lab.api(f"/api/sessions/{session['id']}", "DELETE")
