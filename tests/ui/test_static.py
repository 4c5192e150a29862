"""How the UI is served: from the package, without credentials, with a strict CSP, and
outside the OpenAPI document."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from app.api.ui import STATIC_DIR
from tests.support import LiveServer

COMMITTED = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"


def test_index_is_served_at_root_with_a_strict_policy(ui_server: LiveServer) -> None:
    r = httpx.get(f"{ui_server.base_url}/")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/static/app.js">' in r.text
    csp = {
        d.split(" ", 1)[0]: d.split(" ", 1)[1]
        for d in (p.strip() for p in r.headers["content-security-policy"].split(";"))
    }
    assert csp["default-src"] == "'self'"
    assert csp["script-src"] == "'self'"  # no 'unsafe-inline', no 'unsafe-eval'
    assert csp["connect-src"] == "'self'"  # WebSockets to this origin only (issue 18)
    assert csp["frame-ancestors"] == "'none'"
    assert csp["object-src"] == "'none'"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert "set-cookie" not in r.headers


def test_assets_are_served_from_the_package(ui_server: LiveServer) -> None:
    for name, kind in [
        ("messagex.js", "javascript"),
        ("app.js", "javascript"),
        ("style.css", "text/css"),
    ]:
        r = httpx.get(f"{ui_server.base_url}/static/{name}")
        assert r.status_code == 200, name
        assert kind in r.headers["content-type"], name
        assert r.content == (STATIC_DIR / name).read_bytes()
        assert "content-security-policy" in r.headers
    assert httpx.get(f"{ui_server.base_url}/static/nope.js").status_code == 404
    assert httpx.get(f"{ui_server.base_url}/static/../main.py").status_code == 404


def test_no_external_resources_and_no_html_parsing_of_data() -> None:
    """Everything is local (no CDN), and no script assigns HTML from strings."""
    sources = {p.name: p.read_text() for p in STATIC_DIR.iterdir() if p.is_file()}
    assert {"index.html", "app.js", "messagex.js", "style.css"} <= set(sources)
    for name, source in sources.items():
        # the SVG namespace (charts.js: createElementNS) names no resource and loads nothing
        text = source.replace('"http://www.w3.org/2000/svg"', "")
        assert "http://" not in text, name
        assert "https://" not in text, name
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in text, f"{name} uses {sink}"


def test_ui_routes_are_not_api_operations(ui_server: LiveServer) -> None:
    served = httpx.get(f"{ui_server.base_url}/openapi.json").json()
    committed = json.loads(COMMITTED.read_text())
    for doc in (served, committed):
        assert "/" not in doc["paths"]
        assert not any(path.startswith("/static") for path in doc["paths"])
