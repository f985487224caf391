"""Sphinx extension: emit each JavaScript asset of a page once.

With Jupyter Book 1.0.4 (Sphinx 7.4, sphinx-thebe 0.3, sphinx-togglebutton 0.4) the inline
configuration scripts of sphinx-thebe and sphinx-togglebutton are added twice to every
page; the second ``const THEBE_JS_URL = ...`` throws "Identifier 'THEBE_JS_URL' has
already been declared" in every reader's console (found by ``make test``'s browser check).
This keeps the first of identical script entries (same file or body, same attributes).
"""

from __future__ import annotations


def _key(js: object) -> tuple:
    attrs = getattr(js, "attributes", {}) or {}
    # the same inline script can come once with filename None and once with ""
    return (getattr(js, "filename", None) or "",
            tuple(sorted((k, str(v)) for k, v in attrs.items())))


def dedupe(app, pagename, templatename, context, doctree) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen: set[tuple] = set()
    unique = []
    for js in scripts:
        key = _key(js)
        if key not in seen:
            seen.add(key)
            unique.append(js)
    scripts[:] = unique


def setup(app):
    app.connect("html-page-context", dedupe, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
