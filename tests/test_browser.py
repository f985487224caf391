"""The headless-Chromium check behind `make test` (`python -m fovea_book.build check-html`).

The real book is checked by `make test` after its HTML build; here the checker itself is
tested on a small synthetic site: a clean page passes, and each fault it must catch (a
JavaScript error, a broken image, a traceback, a missing glue value, a cell above the
title, a chapter missing from the sidebar, a search without results) is reported.
"""

import base64
from pathlib import Path

import pytest

from fovea_book.build.browser import check_site, find_chromium, glue_expectations, html_pages

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="Chromium not installed (apt-get install -y --no-install-recommends chromium; "
           ".ci/run installs it)")

PNG = base64.b64decode(  # a 1 x 1 PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")
SIDEBAR = """<nav class="bd-docs-nav"><a href="good.html">Good</a>
<a href="notebooks/bad.html">Bad</a></nav>"""
PAGE = """<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,">
<title>{title}</title></head><body>{sidebar}<main><article>{body}</article></main>{script}</body></html>"""
GOOD = """<section><h1>A good page</h1><div class="cell"><div class="cell_input">x = 1</div>
<div class="cell_output"><img src="ok.png" alt="ok"></div></div>
<p>The value is <span class="pasted-text">42</span>.</p></section>"""
BAD = """<div class="cell"><div class="cell_input">profile = "x"</div></div>
<section><h1>A bad page</h1>
<div class="cell"><div class="cell_output"><img src="missing.png" alt="gone">
<div class="output traceback"><pre>Traceback (most recent call last):
ValueError: boom</pre></div></div></div>
<p>A value that was never glued: {glue:text}`nope`.</p></section>"""
SEARCH = """<h1>Search</h1><div id="search-results"></div>
<script>
const q = new URLSearchParams(location.search).get('q');
setTimeout(() => {
  const box = document.getElementById('search-results');
  const hits = q === 'cortex' ? ['<li><a href="good.html">Good</a></li>'] : [];
  box.innerHTML = '<p class="search-summary">Search finished, found ' + hits.length +
                  ' page(s).</p><ul class="search">' + hits.join('') + '</ul>';
}, 300);
</script>"""


def make_site(root: Path) -> Path:
    (root / "notebooks").mkdir(parents=True)
    (root / "ok.png").write_bytes(PNG)
    (root / "notebooks" / "ok.png").write_bytes(PNG)
    page = lambda title, body, script="": PAGE.format(  # noqa: E731
        title=title, sidebar=SIDEBAR, body=body, script=script)
    (root / "good.html").write_text(page("Good", GOOD))
    (root / "notebooks" / "bad.html").write_text(page("Bad", BAD, (
        "<script>console.error('deliberate console error');"
        "undefinedFunction();</script>")))
    (root / "search.html").write_text(page("Search", SEARCH))
    (root / "index.html").write_text('<meta http-equiv="Refresh" content="0; url=good.html" />')
    return root


def test_pages_are_found_without_redirects_and_sphinx_pages(tmp_path):
    site = make_site(tmp_path)
    assert html_pages(site) == ["good.html", "notebooks/bad.html"]


def test_a_clean_site_passes_and_each_fault_is_reported(tmp_path):
    site = make_site(tmp_path / "html")
    shots = tmp_path / "shots"
    glue = {"good.html": {"pasted": 1, "figures": 0},
            "notebooks/bad.html": {"pasted": 1, "figures": 1}}
    report = check_site(site, toc=["good", "notebooks/bad"], root_page="good.html",
                        search="cortex", screenshots=shots, glue=glue, echo=lambda *a: None)
    assert report.pages["good.html"] == [], report.text()
    bad = "\n".join(report.pages["notebooks/bad.html"])
    for fault in ("image does not load: missing.png", "error output(s) in cells",
                  "a Traceback is shown", "glue role shown as text", "a cell comes before the title",
                  "console.error: deliberate console error", "uncaught ReferenceError",
                  "404", "missing glue value(s): 0 of 1 {glue:text} value(s)",
                  "missing glue value(s): 0 of 1 glued figure(s)"):
        assert fault in bad, (fault, bad)
    assert report.site == [], report.site
    assert sorted(p.name for p in shots.glob("*.png")) == ["good.png", "notebooks__bad.png",
                                                           "search.png"]
    assert report.screenshots == 2


def test_missing_chapter_and_empty_search_fail(tmp_path):
    site = make_site(tmp_path / "html")
    report = check_site(site, toc=["good", "notebooks/bad", "notebooks/lost"],
                        root_page="good.html", search="retina", pages=["good.html"],
                        echo=lambda *a: None)
    assert not report.ok
    text = "\n".join(report.site)
    assert "sidebar: chapters missing: ['notebooks/lost']" in text
    assert "search for 'retina' found nothing" in text


def test_glue_expectations_count_the_roles_of_each_notebook(tmp_path):
    import json

    (tmp_path / "notebooks").mkdir()
    md = ("Two values {glue:text}`a` and {glue:text}`b:.1f`, one markdown {glue:md}`c`.\n\n"
          "```{glue:figure} fig_x\n:name: f\nA caption.\n```\n")
    nb = {"cells": [{"cell_type": "markdown", "source": [md], "metadata": {}},
                    {"cell_type": "code", "source": ["glue('a', 1)"], "metadata": {},
                     "outputs": []}]}
    (tmp_path / "notebooks" / "n.ipynb").write_text(json.dumps(nb))
    assert glue_expectations(tmp_path) == {"notebooks/n.html": {"pasted": 2, "figures": 1}}
