"""``/docs`` works offline and under a strict policy (issue 18, finding 12), and the UI's
WebSocket still connects now that ``connect-src`` is this origin only.

Before: /docs loaded Swagger UI from cdn.jsdelivr.net (no integrity, no CSP; blank offline),
and the UI's policy allowed ``connect-src ws: wss:`` to any host.
"""

from __future__ import annotations

import httpx
from playwright.sync_api import BrowserContext, Page, Route

from app.api.docs import ASSETS, integrity
from tests.support import LiveServer

WATCH = """
window.__csp = [];
document.addEventListener('securitypolicyviolation',
  (e) => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));
"""


def test_docs_page_names_only_local_assets_with_integrity(ui_server: LiveServer) -> None:
    r = httpx.get(f"{ui_server.base_url}/docs")
    assert r.status_code == 200
    assert "https://" not in r.text
    assert "http://" not in r.text
    csp = r.headers["content-security-policy"]
    assert "script-src 'self';" in csp
    assert "connect-src 'self';" in csp
    for url, path in ASSETS:
        assert f'"{url}" integrity="{integrity(path)}"' in r.text
        asset = httpx.get(f"{ui_server.base_url}{url}")
        assert asset.status_code == 200, url


def test_docs_render_offline(context: BrowserContext, page: Page, ui_server: LiveServer) -> None:
    outside: list[str] = []

    def only_the_broker(route: Route) -> None:
        if route.request.url.startswith(ui_server.base_url):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.route("**/*", only_the_broker)
    context.add_init_script(WATCH)
    page.goto(f"{ui_server.base_url}/docs")
    page.wait_for_selector(".swagger-ui .info .title")
    assert "MessageX" in page.inner_text(".swagger-ui .info .title")
    page.wait_for_selector(".opblock-tag-section")
    assert page.locator(".opblock").count() > 10
    assert outside == []
    assert page.evaluate("window.__csp") == []


def test_the_ui_websocket_connects_under_connect_src_self(
    context: BrowserContext, page: Page, ui_server: LiveServer
) -> None:
    context.add_init_script(WATCH)
    page.goto(f"{ui_server.base_url}/")
    port = ui_server.port
    opened = page.evaluate(
        """(port) => new Promise((resolve) => {
             const ws = new WebSocket(`ws://127.0.0.1:${port}/api/v1/ws`);
             ws.onopen = () => { ws.close(); resolve('open'); };
             ws.onerror = () => resolve('error');
           })""",
        port,
    )
    assert opened == "open"
    elsewhere = page.evaluate(
        """() => new Promise((resolve) => {
             try {
               const ws = new WebSocket('ws://127.0.0.2:9/');
               ws.onerror = () => resolve('error');
             } catch (e) { resolve('blocked'); }
           })"""
    )
    assert elsewhere in ("blocked", "error")
    violations = page.evaluate("window.__csp")
    assert [v for v in violations if "127.0.0.2" in v], violations  # refused by the policy
