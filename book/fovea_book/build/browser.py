"""Open every page of the built book in headless Chromium and check it as a reader sees it.

``python -m fovea_book.build check-html`` serves ``_build/html`` over HTTP on 127.0.0.1 (a
free port), starts Debian's ``chromium`` headless with a fresh profile, drives it through
the Chrome DevTools protocol (a websocket; ``websocket-client`` is the only dependency) and
fails when a page has

* a JavaScript error: an uncaught exception, ``console.error``, or a browser log entry of
  level *error* (a resource that failed to load, ...) for a URL on the book's server;
* an image that does not load (``img.decode()`` rejects, or it has no pixels);
* a ``Traceback`` or an error output in a cell;
* a missing glue value: fewer pasted values (``{glue:text}``) or figures
  (``{glue:figure}``) than the page's notebook asks for (myst-nb renders a missing key as
  nothing), or a ``{glue`` role left as text;
* content above its title (the first heading of the page must come before any cell);

and when a chapter of ``_toc.yml`` is missing from the sidebar, or the search page
(``search.html?q=cortex``, run by the theme's JavaScript) finds nothing. One screenshot
per page goes to ``_build/screenshots/``. Requests to other hosts (a CDN) cannot succeed
on an offline machine; they are listed, not failed.
"""

from __future__ import annotations

import base64
import functools
import re
import http.server
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                  "--hide-scrollbars", "--mute-audio", "--window-size=1280,900")

#: Evaluated in each page after it has loaded; returns a list of problems.
PAGE_CHECKS_JS = r"""
(async () => {
  const problems = [];
  const main = document.querySelector('main') || document.body;
  // images: force lazy ones to load, then decode every one
  const imgs = [...document.images];
  imgs.forEach(i => { i.loading = 'eager'; });
  const bad = await Promise.all(imgs.map(i => i.decode().then(
      () => (i.naturalWidth > 0 ? null : i.getAttribute('src')),
      () => i.getAttribute('src'))));
  bad.filter(Boolean).forEach(s => problems.push('image does not load: ' + s.slice(0, 120)));
  // tracebacks and error outputs
  const errs = main.querySelectorAll('.cell_output .traceback, .cell_output .output.error, '
                                     + '.output.traceback, div.output_error');
  if (errs.length) problems.push(errs.length + ' error output(s) in cells');
  const text = main.innerText || '';
  if (text.includes('Traceback (most recent call last)')) problems.push('a Traceback is shown');
  // glue
  const missing = main.querySelectorAll('.glue-missing, .pasted-missing');
  if (missing.length) problems.push(missing.length + ' missing glue value(s)');
  const raw = text.match(/\{glue(:\w+)?\}/g);
  if (raw) problems.push('glue role shown as text: ' + raw[0]);
  // the title comes first
  const h1 = main.querySelector('h1');
  const firstCell = main.querySelector('.cell');
  if (h1 && firstCell &&
      (firstCell.compareDocumentPosition(h1) & Node.DOCUMENT_POSITION_FOLLOWING))
    problems.push('a cell comes before the title');
  return {problems, title: h1 ? h1.innerText.replace(/[#¶]/g, '').trim() : null,
          images: imgs.length, pasted: main.querySelectorAll('.pasted-text').length,
          figures: main.querySelectorAll('figure').length};
})()
"""

SIDEBAR_JS = r"""
[...document.querySelectorAll('nav.bd-docs-nav a, .bd-sidebar-primary a, #bd-docs-nav a')]
  .map(a => new URL(a.getAttribute('href'), document.baseURI).pathname)
"""

SEARCH_JS = r"""
(() => {
  const box = document.querySelector('#search-results');
  if (!box) return {done: false, hits: 0, summary: 'no #search-results element'};
  const hits = box.querySelectorAll('ul.search li, li.search-result, ul li').length;
  const summary = (box.querySelector('.search-summary, p') || {}).innerText || '';
  // Sphinx adds the results one by one, then writes "Search finished, found N page(s)"
  const done = /finished|did not match|no documents/i.test(summary);
  return {done, hits, summary};
})()
"""


def find_chromium() -> str | None:
    """The Chromium executable (``$CHROMIUM`` first), or ``None``."""
    for name in ((os.environ.get("CHROMIUM"),) if os.environ.get("CHROMIUM") else ()) + CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # no access log on the terminal
        pass


class StaticServer:
    """``directory`` over HTTP on 127.0.0.1 (a free port), in a background thread."""

    def __init__(self, directory: Path):
        handler = functools.partial(_QuietHandler, directory=str(directory))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "StaticServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Browser:
    """Headless Chromium on a fresh profile, one page target driven over the DevTools protocol."""

    def __init__(self, executable: str | None = None, timeout: float = 30.0):
        self.executable = executable or find_chromium()
        if not self.executable:
            raise FileNotFoundError(
                "Chromium not found: install it (Debian: apt-get install --no-install-recommends "
                "chromium) or set $CHROMIUM")
        self.timeout = timeout
        self.events: list[dict] = []
        self._id = 0

    def __enter__(self) -> "Browser":
        import websocket

        self.profile = tempfile.mkdtemp(prefix="fovea-chromium-")
        self.proc = subprocess.Popen(
            [self.executable, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}",
             "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"{self.executable} did not start (exit {self.proc.poll()})")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list",
                                                    timeout=self.timeout).read())
        page = next(t for t in targets if t.get("type") == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=self.timeout,
                                              suppress_origin=True)
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=1280, height=900,
                  deviceScaleFactor=1, mobile=False)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        ws = getattr(self, "ws", None)
        if ws is not None:
            ws.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def call(self, method: str, **params) -> dict:
        """Send one command; collect events until its reply arrives."""
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def wait_for(self, event: str, timeout: float | None = None) -> dict:
        deadline = time.monotonic() + (timeout or self.timeout)
        for i, e in enumerate(self.events):
            if e["method"] == event:
                return self.events.pop(i)
        while time.monotonic() < deadline:
            self.ws.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                msg = json.loads(self.ws.recv())
            except Exception:  # websocket timeout
                break
            finally:
                self.ws.settimeout(self.timeout)
            if msg.get("method") == event:
                return msg
            if "method" in msg:
                self.events.append(msg)
        raise TimeoutError(f"no {event} within {timeout or self.timeout} s")

    def open(self, url: str) -> None:
        """Navigate and wait for the load event."""
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str):
        res = self.call("Runtime.evaluate", expression=expression, awaitPromise=True,
                        returnByValue=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"page script failed: {res['exceptionDetails'].get('text')}")
        return res["result"].get("value")

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    def drain(self, seconds: float = 0.2) -> None:
        """Collect the events that arrive within ``seconds`` (late console messages)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.ws.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                msg = json.loads(self.ws.recv())
            except Exception:
                break
            finally:
                self.ws.settimeout(self.timeout)
            if "method" in msg:
                self.events.append(msg)

    def console_errors(self, own_origin: str) -> tuple[list[str], list[str]]:
        """``(errors, offline)``: JS/console/log errors; failed requests to other hosts."""
        errors, offline = [], []
        for e in self.events:
            m, p = e["method"], e.get("params", {})
            if m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                errors.append("uncaught " + (d.get("exception", {}).get("description")
                                             or d.get("text", "exception")).splitlines()[0])
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append("console.error: " + " ".join(
                    str(a.get("value", a.get("description", ""))) for a in p.get("args", []))[:200])
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                entry = p["entry"]
                url = entry.get("url", "")
                if url and not url.startswith(own_origin):
                    offline.append(url)
                else:
                    errors.append(f"log: {entry.get('text', '')[:160]} {url}".strip())
            elif m == "Network.loadingFailed" and p.get("type") != "Ping":
                pass  # reported through Log.entryAdded with its URL
        return errors, offline


@dataclass
class Report:
    pages: dict[str, list[str]] = field(default_factory=dict)   # page -> problems
    site: list[str] = field(default_factory=list)                # sidebar, search
    offline: set[str] = field(default_factory=set)
    screenshots: int = 0

    @property
    def ok(self) -> bool:
        return not self.site and not any(self.pages.values())

    def text(self) -> str:
        lines = [f"{page}: {'; '.join(p)}" for page, p in self.pages.items() if p]
        lines += self.site
        return "\n".join(lines)


_GLUE_TEXT = re.compile(r"\{glue:text\}`[^`]+`")
_GLUE_FIGURE = re.compile(r"^[`:]{3,}\{glue:figure\}", re.M)


def glue_expectations(src: Path) -> dict[str, dict[str, int]]:
    """Per page (``notebooks/x.html``): how many ``{glue:text}`` values and ``{glue:figure}``
    figures the markdown of its executed notebook in ``src`` asks for."""
    out = {}
    for nb in sorted(src.rglob("*.ipynb")):
        if "_build" in nb.parts or ".ipynb_checkpoints" in nb.parts:
            continue
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        md = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        out[nb.relative_to(src).with_suffix(".html").as_posix()] = {
            "pasted": len(_GLUE_TEXT.findall(md)), "figures": len(_GLUE_FIGURE.findall(md))}
    return out


def html_pages(html: Path) -> list[str]:
    """Every page of the built book (relative paths), skipping Sphinx's own pages."""
    skip = {"search.html", "genindex.html", "py-modindex.html"}
    return sorted(p.relative_to(html).as_posix() for p in html.rglob("*.html")
                  if p.name not in skip and not p.relative_to(html).parts[0].startswith("_")
                  and 'http-equiv="Refresh"' not in p.read_text(errors="replace")[:2000])


def check_site(html: Path, *, toc: list[str] | None = None, root_page: str | None = None,
               search: str | None = "cortex", glue: dict[str, dict[str, int]] | None = None,
               screenshots: Path | None = None, pages: list[str] | None = None,
               echo=print) -> Report:
    """Run every check on ``html``.

    ``toc``: the chapters (``_toc.yml`` files, no suffix) that must appear in the sidebar of
    ``root_page`` (default ``index.html``); ``pages``: the pages to check (default: all);
    ``glue``: :func:`glue_expectations` of the executed notebooks.
    """
    report = Report()
    pages = pages if pages is not None else html_pages(html)
    with StaticServer(html) as server, Browser() as browser:
        origin = server.url.rstrip("/")
        for page in pages:
            t0 = time.perf_counter()
            problems: list[str] = []
            try:
                browser.open(server.url + page)
                result = browser.evaluate(PAGE_CHECKS_JS)
                browser.drain()
                problems += result["problems"]
                want = (glue or {}).get(page, {})
                for what, label in (("pasted", "{glue:text} value"), ("figures", "glued figure")):
                    if result[what] < want.get(what, 0):
                        problems.append(f"missing glue value(s): {result[what]} of "
                                        f"{want[what]} {label}(s) shown")
                errors, offline = browser.console_errors(origin)
                problems += errors
                report.offline.update(offline)
                if screenshots is not None:
                    browser.screenshot(screenshots / (page[:-len(".html")].replace("/", "__") + ".png"))
                    report.screenshots += 1
            except (TimeoutError, RuntimeError) as exc:
                problems.append(f"could not check: {exc}")
            report.pages[page] = problems
            echo(f"  {page:<52} {'ok' if not problems else 'FAILED'} "
                 f"({time.perf_counter() - t0:.1f} s)")
        if toc:
            browser.open(server.url + (root_page or "index.html"))
            listed = set(browser.evaluate(SIDEBAR_JS) or [])
            missing = [f for f in toc if f"/{f}.html" not in listed]
            if missing:
                report.site.append(f"sidebar: chapters missing: {missing}")
        if search:
            browser.open(server.url + f"search.html?q={search}")
            deadline = time.monotonic() + 30
            state = browser.evaluate(SEARCH_JS)
            while not state["done"] and time.monotonic() < deadline:
                time.sleep(0.25)
                state = browser.evaluate(SEARCH_JS)
            browser.drain()
            errors, offline = browser.console_errors(origin)
            report.offline.update(offline)
            if screenshots is not None:
                browser.screenshot(screenshots / "search.png")
            if not state["done"]:
                report.site.append(f"search for {search!r} did not finish in 30 s "
                                   f"({state['hits']} result(s) so far)")
            elif state["hits"] == 0:
                report.site.append(f"search for {search!r} found nothing ({state['summary']!r})")
            if errors:
                report.site.append(f"search page: {'; '.join(errors)}")
            echo(f"  search.html?q={search:<38} {state['hits']} result(s)")
    return report
