"""The management UI end to end in headless Chromium: log in, declare, bind, publish, browse,
consume over the WebSocket, ACK, and watch the counts change."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
from playwright.sync_api import Locator, Page, Route, expect

from tests.support import ADMIN_PASSWORD, ADMIN_USER, LiveServer, login, wait_for
from tests.ui.support import go, log_in, stat
from tests.wsclient import WsClient, browse


def test_declare_bind_publish_browse_consume_ack(
    page: Page, ui_server: LiveServer, rest: httpx.Client
) -> None:
    # Other tests share this broker: the counts are compared with what they were, once the
    # WebSockets of earlier tests are gone and their deliveries released.
    def quiet() -> dict[str, Any] | None:
        o: dict[str, Any] = rest.get("/overview").json()
        return o if o["messages"]["in_flight"] == 0 and o["subscriptions"] == 0 else None

    before = wait_for(quiet, message="earlier tests' consumers to go")

    def count(status: str, delta: int) -> str:
        return str(before["messages"][status] + delta)

    log_in(page, ui_server)

    # Declare a queue from the form; it appears in the live list.
    go(page, "Queues")
    page.get_by_label("Name", exact=True).fill("e2e-orders")
    page.get_by_label("Maximum deliveries").fill("5")
    page.get_by_role("button", name="Declare queue").click()
    expect(page.get_by_text("Queue e2e-orders declared")).to_be_visible()
    assert rest.get("/queues/e2e-orders").json()["max_delivery_count"] == 5

    # Bind it to amq.topic from the queue page.
    page.get_by_role("link", name="e2e-orders", exact=True).click()
    expect(page.get_by_role("heading", name="Queue e2e-orders")).to_be_visible()
    page.get_by_label("Exchange", exact=True).fill("amq.topic")
    page.get_by_label("Routing key").fill("order.*")
    page.get_by_role("button", name="Bind").click()
    bindings = page.get_by_role("table", name="Bindings")
    expect(bindings.get_by_role("link", name="amq.topic")).to_be_visible()
    expect(bindings).to_contain_text("order.*")
    (binding,) = rest.get("/bindings", params={"queue": "e2e-orders"}).json()["items"]
    assert (binding["exchange"], binding["routing_key"]) == ("amq.topic", "order.*")

    # Publish from the form (over the WebSocket; the answer comes after the commit).
    go(page, "Publish")
    page.get_by_label("Exchange", exact=True).fill("amq.topic")
    page.get_by_label("Routing key").fill("order.created")
    page.get_by_label("Headers (JSON object)").fill('{"source": "ui-test"}')
    page.get_by_label("Body (any JSON value)").fill('{"order": 42, "total": "19.90"}')
    page.get_by_role("button", name="Publish").click()
    expect(page.get_by_text("Published: routed to e2e-orders")).to_be_visible()

    # The overview counts it as ready.
    go(page, "Overview")
    expect(stat(page, "messages-ready")).to_have_text(count("ready", 1))
    expect(stat(page, "messages-in_flight")).to_have_text(count("in_flight", 0))

    # Browse shows it, headers and body included.
    go(page, "Queues")
    page.get_by_role("link", name="e2e-orders", exact=True).click()
    expect(stat(page, "queue-ready")).to_have_text("1")
    message = page.locator("li.message")
    expect(message).to_have_count(1)
    expect(message).to_contain_text("order.created")
    expect(message.get_by_label("Headers")).to_have_text('{"source":"ui-test"}')
    body = message.get_by_label("Body")
    assert json.loads(body.inner_text()) == {"order": 42, "total": "19.90"}

    # Consume it in the live panel.
    page.get_by_role("link", name="Consume from this queue").click()
    expect(page.get_by_role("heading", name="Consume")).to_be_visible()
    expect(page.get_by_label("Queue", exact=True)).to_have_value("e2e-orders")
    page.get_by_label("Prefetch").fill("1")
    page.get_by_role("button", name="Subscribe").click()
    delivery = page.locator("li.delivery")
    expect(delivery).to_have_count(1)
    expect(delivery).to_contain_text('"order": 42')
    expect(delivery).to_contain_text("order.created")

    # While it is held, the counts say in flight, with one consumer.
    go(page, "Overview")
    expect(stat(page, "messages-in_flight")).to_have_text(count("in_flight", 1))
    expect(stat(page, "messages-ready")).to_have_text(count("ready", 0))
    expect(stat(page, "overview-subscriptions")).to_have_text(str(before["subscriptions"] + 1))

    # Back on the panel (the subscription and the delivery are still there): ACK it.
    go(page, "Consume")
    delivery = page.locator("li.delivery")
    delivery.get_by_role("button", name=re.compile("^ACK ")).click()
    expect(delivery).to_contain_text("Settled: acked")

    go(page, "Overview")
    expect(stat(page, "messages-in_flight")).to_have_text(count("in_flight", 0))
    expect(stat(page, "messages-ready")).to_have_text(count("ready", 0))
    stats = rest.get("/queues/e2e-orders").json()["stats"]
    assert stats == {"ready": 0, "delayed": 0, "in_flight": 0, "dead": 0, "consumers": 1}


def test_nack_requeues_and_the_panel_gets_it_again(
    page: Page, ui_server: LiveServer, rest: httpx.Client
) -> None:
    assert rest.put("/queues/e2e-nack", json={}).status_code == 201
    r = rest.post("/queues/e2e-nack/messages", json={"body": "again"})
    assert r.status_code == 200
    log_in(page, ui_server)
    page.goto(f"{ui_server.base_url}/#/consume?queue=e2e-nack")
    page.get_by_role("button", name="Subscribe").click()
    first = page.locator("li.delivery").first
    expect(first).to_contain_text('"again"')
    first.get_by_role("button", name="NACK (requeue)").click()
    expect(first).to_contain_text("Settled: requeued")
    # Redelivered at once to the same subscriber, marked as such.
    second = page.locator("li.delivery").nth(1)
    expect(second).to_contain_text("redelivered (2)")
    second.get_by_role("button", name="Reject").click()
    expect(second).to_contain_text("Settled: discarded")
    assert rest.get("/queues/e2e-nack").json()["stats"]["ready"] == 0


def test_purge_and_delete_a_message_from_the_queue_page(
    page: Page, ui_server: LiveServer, rest: httpx.Client
) -> None:
    assert rest.put("/queues/e2e-purge", json={}).status_code == 201
    for n in range(3):
        rest.post("/queues/e2e-purge/messages", json={"body": {"n": n}})
    log_in(page, ui_server)
    page.goto(f"{ui_server.base_url}/#/queues/e2e-purge")
    messages = page.locator("li.message")
    expect(messages).to_have_count(3)
    messages.first.get_by_role("button", name="Delete message").click()
    expect(messages).to_have_count(2)
    expect(stat(page, "queue-ready")).to_have_text("2")
    page.get_by_role("button", name="Purge").click()
    expect(page.get_by_text("Purged 2 messages")).to_be_visible()
    expect(page.get_by_text("No messages.")).to_be_visible()
    assert rest.get("/queues/e2e-purge").json()["stats"]["ready"] == 0


def test_browse_paginates_and_filters_by_status(
    page: Page, ui_server: LiveServer, rest: httpx.Client
) -> None:
    assert rest.put("/queues/e2e-pages", json={}).status_code == 201
    for n in range(12):
        rest.post("/queues/e2e-pages/messages", json={"body": {"n": n}})
    rest.post("/queues/e2e-pages/messages", json={"body": "later", "delay_ms": 600_000})
    assert rest.get("/queues/e2e-pages").json()["stats"]["ready"] == 12
    log_in(page, ui_server)
    page.goto(f"{ui_server.base_url}/#/queues/e2e-pages")
    page.get_by_label("Per page").select_option("10")
    messages = page.locator("li.message")
    expect(messages).to_have_count(10)
    page.get_by_role("button", name="Next page").click()
    expect(messages).to_have_count(3)
    expect(page.get_by_role("button", name="Next page")).to_be_disabled()
    page.get_by_role("button", name="Previous page").click()
    expect(messages).to_have_count(10)
    page.get_by_label("Status").select_option("delayed")
    expect(messages).to_have_count(1)
    expect(messages).to_contain_text('"later"')


def test_a_slow_first_page_does_not_overwrite_a_newer_one(
    page: Page, ui_server: LiveServer, rest: httpx.Client
) -> None:
    # The page loads 25 per page, and the user picks 10 before that answer arrived: the late
    # answer must not replace the newer page (it did: 13 items shown, "Next page" disabled).
    assert rest.put("/queues/e2e-race", json={}).status_code == 201
    for n in range(13):
        assert rest.post("/queues/e2e-race/messages", json={"body": n}).status_code == 200
    held: list[Route] = []
    first_page = re.compile(r".*/api/v1/queues/e2e-race/messages\?.*limit=25.*")

    def hold(route: Route) -> None:  # answered later, by hand
        held.append(route)

    page.route(first_page, hold)
    log_in(page, ui_server)
    with page.expect_request(first_page):
        page.goto(f"{ui_server.base_url}/#/queues/e2e-race")
    page.get_by_label("Per page").select_option("10")
    messages = page.locator("li.message")
    expect(messages).to_have_count(10)
    assert len(held) == 1  # the first page is still unanswered
    with page.expect_response(first_page):
        held[0].continue_()
    expect(messages).to_have_count(10)
    expect(page.get_by_role("button", name="Next page")).to_be_enabled()
    page.get_by_role("button", name="Next page").click()
    expect(messages).to_have_count(3)


def test_exchange_page_declares_binds_and_deletes(
    page: Page, ui_server: LiveServer, rest: httpx.Client
) -> None:
    assert rest.put("/queues/e2e-x-q", json={}).status_code == 201
    log_in(page, ui_server)
    go(page, "Exchanges")
    page.get_by_label("Name", exact=True).fill("e2e-events")
    page.get_by_label("Type").select_option("fanout")
    page.get_by_role("button", name="Declare exchange").click()
    expect(page.get_by_text("Exchange e2e-events declared")).to_be_visible()
    assert rest.get("/exchanges/e2e-events").json()["type"] == "fanout"
    page.get_by_role("link", name="e2e-events", exact=True).click()
    page.get_by_label("Queue", exact=True).fill("e2e-x-q")
    page.get_by_role("button", name="Bind").click()
    expect(
        page.get_by_role("table", name="Bindings").get_by_role("link", name="e2e-x-q")
    ).to_be_visible()
    page.get_by_role("button", name="Delete binding").click()
    expect(page.get_by_text("No bindings.")).to_be_visible()
    page.get_by_role("button", name="Delete exchange").click()
    expect(page.get_by_role("heading", name="Exchanges", exact=True)).to_be_visible()
    assert rest.get("/exchanges/e2e-events").status_code == 404


def test_admin_manages_users_and_a_user_sees_no_admin_pages(
    page: Page, ui_server: LiveServer, rest: httpx.Client
) -> None:
    log_in(page, ui_server)
    go(page, "Users")
    page.get_by_label("Username").fill("e2e-alice")
    page.get_by_label("Password").fill("alice-password-1")
    page.get_by_label("Configure").fill("alice\\..*")
    page.get_by_label("Write").fill("alice\\..*")
    page.get_by_label("Read").fill(".*")
    page.get_by_role("button", name="Save user").click()
    expect(page.get_by_text("User e2e-alice created")).to_be_visible()
    row = page.get_by_role("row").filter(has_text="e2e-alice")
    expect(row).to_contain_text("alice\\..*")
    assert rest.get("/users/e2e-alice").json()["permissions"]["read"] == ".*"

    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_role("heading", name="Log in to MessageX")).to_be_visible()
    log_in(page, ui_server, "e2e-alice", "alice-password-1")
    nav = page.get_by_role("navigation", name="Main")
    expect(nav.get_by_role("link", name="Queues")).to_be_visible()
    expect(nav.get_by_role("link", name="Users")).to_have_count(0)
    expect(page.get_by_text("the broker-wide overview is for admins")).to_be_visible()
    # A queue outside alice's configure permission: the broker's 403 shows as text.
    go(page, "Queues")
    page.get_by_label("Name", exact=True).fill("bob.queue")
    page.get_by_role("button", name="Declare queue").click()
    expect(page.get_by_role("alert")).to_contain_text("forbidden")


def test_the_session_token_is_in_session_storage_and_logout_revokes_it(
    page: Page, ui_server: LiveServer
) -> None:
    log_in(page, ui_server)
    token = page.evaluate("sessionStorage.getItem('messagex.token')")
    assert token
    assert page.context.cookies() == []
    headers = {"Authorization": f"Bearer {token}"}
    assert httpx.get(f"{ui_server.base_url}/api/v1/auth/me", headers=headers).status_code == 200
    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_role("heading", name="Log in to MessageX")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('messagex.token')") is None
    assert httpx.get(f"{ui_server.base_url}/api/v1/auth/me", headers=headers).status_code == 401


def test_a_bad_password_shows_the_error_and_stays_on_login(
    page: Page, ui_server: LiveServer
) -> None:
    page.goto(f"{ui_server.base_url}/")
    page.get_by_label("Username").fill(ADMIN_USER)
    page.get_by_label("Password").fill("not-the-password")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_contain_text("Login failed")
    expect(page.get_by_role("heading", name="Log in to MessageX")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('messagex.token')") is None
    # A valid token still works afterwards (nothing global broke).
    assert login(ui_server.base_url, ADMIN_USER, ADMIN_PASSWORD)


def test_the_queue_form_declares_limits_and_priority_by_their_rabbitmq_names(
    page: Page, ui_server: LiveServer, rest: httpx.Client
) -> None:
    log_in(page, ui_server)
    go(page, "Queues")
    page.get_by_label("Name", exact=True).fill("e2e-limited")
    page.get_by_label("Max length (x-max-length)").fill("1")
    page.get_by_label("Overflow (x-overflow)").select_option("reject-publish")
    page.get_by_label("Max priority (x-max-priority)").fill("5")
    page.get_by_role("button", name="Declare queue").click()
    expect(page.get_by_text("Queue e2e-limited declared")).to_be_visible()
    arguments = rest.get("/queues/e2e-limited").json()["arguments"]
    assert arguments == {"x-max-length": 1, "x-overflow": "reject-publish", "x-max-priority": 5}
    # The queue page shows them; a copy shows its priority; a full queue's refusal shows.
    for body in (1, 2):
        r = rest.post(
            "/queues/e2e-limited/messages", json={"body": body, "properties": {"priority": 3}}
        )
        assert r.status_code == 200, r.text
    page.get_by_role("link", name="e2e-limited", exact=True).click()
    expect(page.get_by_role("heading", name="Queue e2e-limited")).to_be_visible()
    expect(page.get_by_text("x-max-length)")).to_be_visible()
    expect(page.locator("dd", has_text=re.compile(r"^reject-publish$"))).to_be_visible()
    expect(page.locator(".message dd", has_text=re.compile(r"^3$"))).to_have_count(1)
    go(page, "Publish")
    page.get_by_label("a queue (the default exchange)").check()
    page.get_by_label("Queue", exact=True).fill("e2e-limited")
    page.get_by_label("Body (any JSON value)").fill("3")
    page.get_by_label("Priority (optional)").fill("4")
    page.get_by_role("button", name="Publish").click()
    expect(page.get_by_text("rejected by e2e-limited (full)")).to_be_visible()


def test_lifecycle_arguments_from_the_form_and_a_copys_expiry_on_the_queue_page(
    page: Page, ui_server: LiveServer, rest: httpx.Client
) -> None:
    log_in(page, ui_server)
    go(page, "Queues")
    page.get_by_label("Name", exact=True).fill("e2e-ttl")
    page.get_by_label("Message TTL (ms) — x-message-ttl").fill("600000")
    page.get_by_label("Dead-letter exchange — x-dead-letter-exchange").fill("amq.fanout")
    page.get_by_label("Dead-letter routing key — x-dead-letter-routing-key").fill("expired")
    page.get_by_role("button", name="Declare queue").click()
    expect(page.get_by_text("Queue e2e-ttl declared")).to_be_visible()
    arguments = rest.get("/queues/e2e-ttl").json()["arguments"]
    assert arguments == {
        "x-message-ttl": 600000,
        "x-dead-letter-exchange": "amq.fanout",
        "x-dead-letter-routing-key": "expired",
    }
    rest.post(
        "/queues/e2e-ttl/messages", json={"body": "soon", "properties": {"expiration": "300000"}}
    )
    page.goto(f"{ui_server.base_url}/#/queues/e2e-ttl")
    expect(page.get_by_text("600000 ms")).to_be_visible()
    message = page.locator("li.message")
    expect(message).to_have_count(1)
    # the smaller of the queue's TTL and the message's expiration: 5 minutes after available
    (stored,) = rest.get("/queues/e2e-ttl/messages").json()["items"]
    shown = page.evaluate(
        "(iso) => new Date(Date.parse(iso) + 300000).toLocaleString()", stored["available_at"]
    )
    expires = message.locator("div", has=page.get_by_text("Expires", exact=True))
    expect(expires.locator("dd")).to_have_text(shown)


def test_publish_form_expiration_and_a_copys_priority_and_expiry_on_the_queue_page(
    page: Page, ui_server: LiveServer, rest: httpx.Client
) -> None:
    """The publish form's expiration (contract §13: a string of decimal digits), and the copy
    cards: the priority the broker claims by (capped at x-max-priority, 0 when none is set),
    an expiry for a ready copy, and none for an in-flight one, which never expires while
    held."""
    r = rest.put("/queues/e2e-expiring", json={"arguments": {"x-max-priority": 2}})
    assert r.status_code == 201, r.text
    log_in(page, ui_server)
    go(page, "Publish")
    page.get_by_label("a queue (the default exchange)").check()
    page.get_by_label("Queue", exact=True).fill("e2e-expiring")
    expiration = page.get_by_label("Expiration (ms, optional)")
    publish = page.get_by_role("button", name="Publish")
    published = page.get_by_text("Published: routed to e2e-expiring")
    # Out of range, as the priority field: the browser marks it and keeps the form.
    expiration.fill("4294967296")
    publish.click()
    assert expiration.evaluate("(el) => el.validity.rangeOverflow") is True
    expect(page.locator("input[name=expiration]:invalid")).to_have_count(1)
    expect(published).to_have_count(0)
    # The expiration is honoured: with 0 and no subscriber the copy expires within 1 s.
    expiration.fill("0")
    publish.click()
    expect(published).to_be_visible()
    wait_for(lambda: not browse(rest, "e2e-expiring"), message="the copy to expire")
    # Two lasting copies: the first above the queue's maximum priority, the second with none.
    expiration.fill("300000")
    page.get_by_label("Priority (optional)").fill("9")
    publish.click()
    wait_for(lambda: len(browse(rest, "e2e-expiring")) == 1)
    expiration.fill("600000")
    page.get_by_label("Priority (optional)").fill("")
    publish.click()
    wait_for(lambda: len(browse(rest, "e2e-expiring")) == 2)
    capped, unset = browse(rest, "e2e-expiring")
    assert capped["properties"]["expiration"] == "300000"
    assert capped["properties"]["priority"] == 9
    assert unset["properties"]["expiration"] == "600000"
    assert "priority" not in unset["properties"]

    def at(item: dict[str, Any], ms: int) -> str:
        shown: str = page.evaluate(
            "([iso, ms]) => new Date(Date.parse(iso) + ms).toLocaleString()",
            [item["available_at"], ms],
        )
        return shown

    def row(card: Locator, term: str) -> Locator:
        return card.locator("div", has=page.get_by_text(term, exact=True)).locator("dd")

    with WsClient.admin(ui_server.ws_url) as consumer:
        consumer.subscribe("e2e-expiring")
        # claimed first: priority 9 counts as the maximum, 2, above the other's 0
        assert consumer.delivery()["message_id"] == capped["message_id"]
        page.goto(f"{ui_server.base_url}/#/queues/e2e-expiring")
        held = page.locator('li.message[data-status="in_flight"]')
        ready = page.locator('li.message[data-status="ready"]')
        expect(held).to_have_count(1)
        expect(ready).to_have_count(1)
        expect(row(held, "Priority")).to_have_text("2 (set 9, capped at x-max-priority 2)")
        expect(held.get_by_text("Expires", exact=True)).to_have_count(0)
        expect(row(held, "Expiry")).to_have_text(
            f"None while in flight; returned to the queue after {at(capped, 300000)}, "
            "it expires instead of being requeued"
        )
        expect(row(ready, "Priority")).to_have_text("0 (none set)")
        expect(row(ready, "Expires")).to_have_text(at(unset, 600000))


def test_exchange_page_shows_its_alternate_and_exchange_bindings_both_ways(
    page: Page, ui_server: LiveServer, rest: httpx.Client
) -> None:
    """§14 in the UI: the declare form's alternate-exchange field, the exchange page's
    alternate, a binding to another exchange made from the form, seen from both ends."""
    assert rest.put("/exchanges/ui-alt", json={"type": "fanout"}).status_code == 201
    assert rest.put("/exchanges/ui-down", json={"type": "fanout"}).status_code == 201
    log_in(page, ui_server)
    go(page, "Exchanges")
    page.get_by_label("Name", exact=True).fill("ui-main")
    page.get_by_label("Type").select_option("direct")
    page.get_by_label("Alternate exchange (alternate-exchange)").fill("ui-alt")
    page.get_by_role("button", name="Declare exchange").click()
    expect(page.get_by_text("Exchange ui-main declared")).to_be_visible()
    assert rest.get("/exchanges/ui-main").json()["arguments"] == {"alternate-exchange": "ui-alt"}
    page.get_by_role("link", name="ui-main", exact=True).click()
    expect(page.get_by_role("link", name="ui-alt", exact=True)).to_be_visible()
    page.get_by_label("Bind to").select_option("exchange")
    page.get_by_label("Destination exchange", exact=True).fill("ui-down")
    page.get_by_label("Routing key").fill("k")
    page.get_by_role("button", name="Bind").click()
    expect(
        page.get_by_role("table", name="Bindings", exact=True).get_by_role("link", name="ui-down")
    ).to_be_visible()
    listed = rest.get("/bindings", params={"destination_exchange": "ui-down"}).json()["items"]
    assert [(b["exchange"], b["queue"], b["routing_key"]) for b in listed] == [
        ("ui-main", None, "k")
    ]
    page.get_by_role("link", name="ui-down", exact=True).click()
    expect(
        page.get_by_role("table", name="Bindings to this exchange").get_by_role(
            "link", name="ui-main"
        )
    ).to_be_visible()
    expect(page.get_by_text("No bindings.")).to_be_visible()  # none from ui-down itself


def test_single_active_consumer_from_the_form_to_the_queue_page(
    page: Page, ui_server: LiveServer, rest: httpx.Client
) -> None:
    """The declare form's x-single-active-consumer field, and the queue page's active and
    waiting consumers (contract §13)."""
    log_in(page, ui_server)
    go(page, "Queues")
    page.get_by_label("Name", exact=True).fill("e2e-sac")
    page.get_by_label("Single active consumer (x-single-active-consumer)").check()
    page.get_by_role("button", name="Declare queue").click()
    expect(page.get_by_text("Queue e2e-sac declared")).to_be_visible()
    assert rest.get("/queues/e2e-sac").json()["arguments"] == {"x-single-active-consumer": True}
    with WsClient.admin(ui_server.ws_url) as a, WsClient.admin(ui_server.ws_url) as b:
        assert a.subscribe("e2e-sac")["active"] is True
        assert b.subscribe("e2e-sac")["active"] is False
        page.get_by_role("link", name="e2e-sac", exact=True).click()
        expect(page.get_by_role("heading", name="Queue e2e-sac")).to_be_visible()
        expect(stat(page, "queue-consumers")).to_have_text("2")
        expect(stat(page, "queue-consumers-active")).to_have_text("1")
        expect(stat(page, "queue-consumers-waiting")).to_have_text("1")
        settings = page.get_by_text("Single active consumer (x-single-active-consumer)")
        expect(settings).to_be_visible()
        # The consume panel's subscription waits behind the two, then takes over.
        page.get_by_role("link", name="Consume from this queue").click()
        page.get_by_role("button", name="Subscribe").click()
        expect(
            page.get_by_text("another subscription is the single active consumer")
        ).to_be_visible()
    expect(page.get_by_text("e2e-sac is now the single active consumer")).to_be_visible()
    expect(page.get_by_text("another subscription is the single active consumer")).to_have_count(0)


def test_message_groups_from_the_forms_to_the_queue_page(
    page: Page, ui_server: LiveServer, rest: httpx.Client
) -> None:
    """The declare form's x-message-groups field, the publish form's group id, and a copy's
    group on the queue page (contract §16)."""
    log_in(page, ui_server)
    go(page, "Queues")
    page.get_by_label("Name", exact=True).fill("e2e-groups")
    page.get_by_label("Ordered message groups (x-message-groups)").check()
    page.get_by_role("button", name="Declare queue").click()
    expect(page.get_by_text("Queue e2e-groups declared")).to_be_visible()
    assert rest.get("/queues/e2e-groups").json()["arguments"] == {"x-message-groups": True}
    go(page, "Publish")
    page.get_by_label("a queue (the default exchange)").check()
    page.get_by_label("Queue", exact=True).fill("e2e-groups")
    page.get_by_label("Body (any JSON value)").fill("1")
    page.get_by_label("Group id (optional)").fill("order-42")
    page.get_by_role("button", name="Publish").click()
    wait_for(lambda: rest.get("/queues/e2e-groups").json()["stats"]["ready"] == 1)
    (item,) = rest.get("/queues/e2e-groups/messages").json()["items"]
    assert item["properties"]["group_id"] == "order-42"
    go(page, "Queues")
    page.get_by_role("link", name="e2e-groups", exact=True).click()
    expect(page.get_by_role("heading", name="Queue e2e-groups")).to_be_visible()
    expect(page.get_by_text("Ordered message groups (x-message-groups)")).to_be_visible()
    expect(page.get_by_label("Group id", exact=True)).to_have_text("order-42")
