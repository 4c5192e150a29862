"""Hostile input renders as text: names, routing keys, headers, properties, arguments and
bodies holding <script> and <img onerror> never become markup.

Names of queues, exchanges and users are restricted to ``A-Z a-z 0-9 _ . : -`` (contract
§1), so markup can never be a stored name: the UI is offered one anyway, through the
declare form and through the page's URL, and must show the rejection and the name as text.
Everything else that carries free text is stored and then shown in every view that shows it.
"""

from __future__ import annotations

from urllib.parse import quote

import httpx
import pytest
from playwright.sync_api import BrowserContext, Page, expect

from tests.support import LiveServer
from tests.ui.support import go, log_in

# No double quotes in them, so they read the same inside JSON shown as text.
SCRIPT = "<script>window.__pwned=1</script>"
IMG = "<img src=x onerror=window.__pwned=2>"
HOSTILE = f"{SCRIPT}{IMG}"

#: Recorded before any page script runs: CSP violations, and whether anything executed.
WATCH = """
window.__pwned = null;
window.__csp = [];
document.addEventListener('securitypolicyviolation', (e) => window.__csp.push(e.violatedDirective));
"""


@pytest.fixture
def watched(context: BrowserContext, page: Page) -> Page:
    context.add_init_script(WATCH)
    return page


def assert_inert(page: Page) -> None:
    """Nothing ran, nothing was parsed into elements, nothing even tried (no CSP report)."""
    assert page.evaluate("window.__pwned") is None
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    scripts = page.evaluate("[...document.scripts].map((s) => s.src)")
    assert [s.rsplit("/", 1)[-1] for s in scripts] == ["app.js"]
    assert page.evaluate("document.querySelectorAll('[onerror], [onload], iframe').length") == 0
    assert page.evaluate("window.__csp") == []


@pytest.fixture(scope="module")
def hostile_queue(rest: httpx.Client) -> str:
    """A queue whose arguments, binding, and message hold markup everywhere text may go."""
    name = "inj-q"
    r = rest.put(f"/queues/{name}", json={"arguments": {SCRIPT: IMG}})
    assert r.status_code == 201, r.text
    r = rest.post(
        "/bindings",
        json={
            "exchange": "amq.topic",
            "queue": name,
            "routing_key": "#",
            "arguments": {IMG: SCRIPT},
        },
    )
    assert r.status_code == 201, r.text
    r = rest.post(
        "/exchanges/amq.topic/publish",
        json={
            "routing_key": IMG,
            "body": {"html": HOSTILE, SCRIPT: [IMG]},
            "headers": {IMG: SCRIPT},
            "properties": {"message_id": IMG, "correlation_id": SCRIPT},
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["queues"] == [name]
    return name


def test_queue_page_and_browse_show_markup_as_text(
    watched: Page, ui_server: LiveServer, hostile_queue: str
) -> None:
    page = watched
    log_in(page, ui_server)
    page.goto(f"{ui_server.base_url}/#/queues/{hostile_queue}")
    message = page.locator("li.message")
    expect(message).to_have_count(1)
    # The very characters, visible as text: routing key, message id, headers and body.
    expect(message).to_contain_text(f"Routing key{IMG}")
    expect(message).to_contain_text(f"Message id{IMG}")
    expect(message.get_by_label("Headers")).to_contain_text(SCRIPT)
    expect(message.get_by_label("Body")).to_contain_text(f'"html": "{HOSTILE}"')
    expect(message.get_by_label("Properties")).to_contain_text(SCRIPT)
    # The queue's arguments and its binding's arguments.
    expect(page.get_by_label("Arguments").first).to_contain_text(SCRIPT)
    expect(page.get_by_role("table", name="Bindings")).to_contain_text(IMG)
    assert_inert(page)


def test_live_consume_panel_shows_markup_as_text(
    watched: Page, ui_server: LiveServer, hostile_queue: str, rest: httpx.Client
) -> None:
    page = watched
    log_in(page, ui_server)
    page.goto(f"{ui_server.base_url}/#/consume?queue={hostile_queue}")
    page.get_by_role("button", name="Subscribe").click()
    delivery = page.locator("li.delivery")
    expect(delivery).to_have_count(1)
    expect(delivery).to_contain_text(IMG)
    expect(delivery.get_by_label(f"Body of {hostile_queue} #1")).to_contain_text(HOSTILE)
    assert_inert(page)
    # Leave it unacked: closing the page releases it for the next test module's reader.


def test_markup_offered_as_a_name_is_refused_and_shown_as_text(
    watched: Page, ui_server: LiveServer, rest: httpx.Client
) -> None:
    page = watched
    log_in(page, ui_server)
    go(page, "Queues")
    page.get_by_label("Name", exact=True).fill(IMG)
    page.get_by_role("button", name="Declare queue").click()
    expect(page.get_by_role("alert")).to_contain_text("Declare queue")
    assert_inert(page)
    # Straight into the URL: the heading shows the would-be name as text.
    page.goto(f"{ui_server.base_url}/#/queues/{IMG}")
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Queue {IMG}")
    expect(page.get_by_role("alert")).to_be_visible()
    page.goto(f"{ui_server.base_url}/#/exchanges/{quote(SCRIPT, safe='')}")
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Exchange {SCRIPT}")
    assert_inert(page)
    # Publishing markup from the form stores it verbatim (and shows the result as text).
    page.goto(f"{ui_server.base_url}/#/publish?queue=inj-pub")
    assert rest.put("/queues/inj-pub", json={}).status_code in (200, 201)
    page.get_by_label("Body (any JSON value)").fill(f'"{IMG}"')
    page.get_by_role("button", name="Publish").click()
    expect(page.get_by_text("Published: routed to inj-pub")).to_be_visible()
    (stored,) = rest.get("/queues/inj-pub/messages").json()["items"]
    assert stored["body"] == IMG
    assert_inert(page)
