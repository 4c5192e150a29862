"""``/static/messagex.js``, the browser client, in headless Chromium against a real broker:
publish with confirm, subscribe with ack/nack, reconnect with backoff and resubscribe."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from playwright.sync_api import Page

from tests.support import ADMIN_PASSWORD, ADMIN_USER, LiveServer, login, wait_for
from tests.wsclient import WsClient

SETUP = """
async ({ token, queue }) => {
  const mx = await import('/static/messagex.js');
  const t = { got: [], states: [], errors: [], cancelled: [] };
  window.__t = t;
  t.client = new mx.Client({ token, minBackoffMs: 50, maxBackoffMs: 200 });
  t.client.addEventListener('state', (e) => t.states.push(e.detail.state));
  t.client.addEventListener('error', (e) => t.errors.push(e.detail.error.code));
  t.client.addEventListener('cancelled', (e) => t.cancelled.push(e.detail));
  const connected = await t.client.connect();
  t.sub = await t.client.subscribe(queue, { prefetch: 5 }, (m) => t.got.push(m));
  return connected.user;
}
"""


@pytest.fixture
def token(ui_server: LiveServer) -> str:
    return login(ui_server.base_url, ADMIN_USER, ADMIN_PASSWORD)


@pytest.fixture
def blank(page: Page, ui_server: LiveServer) -> Page:
    """A page of the broker's origin (the client connects back to it)."""
    page.goto(f"{ui_server.base_url}/static/style.css")
    return page


def queue(rest: httpx.Client, name: str) -> str:
    assert rest.put(f"/queues/{name}", json={}).status_code in (200, 201)
    return name


def got(page: Page) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = page.evaluate(
        "window.__t.got.map((m) => ({body: m.body, tag: m.delivery_tag,"
        " redelivered: m.redelivered, count: m.delivery_count, headers: m.headers}))"
    )
    return result


def test_publish_resolves_on_published_and_ack_settles(
    blank: Page, token: str, rest: httpx.Client
) -> None:
    q = queue(rest, "bc-basic")
    user = blank.evaluate(SETUP, {"token": token, "queue": q})
    assert user == {"username": ADMIN_USER, "role": "admin"}
    result = blank.evaluate(
        "async (q) => window.__t.client.publish({ queue: q, body: { n: 1 }, headers: { h: 'v' } })",
        q,
    )
    assert result["routed"] is True
    assert result["queues"] == [q]
    wait_for(lambda: len(got(blank)) == 1, message="the delivery")
    (delivery,) = got(blank)
    assert delivery["body"] == {"n": 1}
    assert delivery["headers"] == {"h": "v"}
    assert blank.evaluate("async () => window.__t.got[0].ack()") == delivery["tag"]
    assert rest.get(f"/queues/{q}").json()["stats"] == {
        "ready": 0,
        "delayed": 0,
        "in_flight": 0,
        "dead": 0,
        "consumers": 1,
    }
    # A second ACK of the same tag is the broker's error, surfaced as a rejection.
    code = blank.evaluate("async () => window.__t.got[0].ack().then(() => null, (e) => e.code)")
    assert code == "unknown_delivery_tag"
    # NACK without requeue on a queue without a DLQ discards.
    blank.evaluate("async (q) => window.__t.client.publish({ queue: q, body: 2 })", q)
    wait_for(lambda: len(got(blank)) == 2, message="the second delivery")
    assert blank.evaluate("async () => window.__t.got[1].nack({ requeue: false })") == "discarded"
    # Unroutable mandatory publish rejects with the broker's code.
    code = blank.evaluate(
        "async () => window.__t.client.publish({ exchange: 'amq.direct', routing_key: 'nobody',"
        " body: 1, mandatory: true }).then(() => null, (e) => e.code)"
    )
    assert code == "unroutable"


def test_reconnects_resubscribes_and_redelivers_what_was_unsettled(
    blank: Page, token: str, rest: httpx.Client
) -> None:
    q = queue(rest, "bc-reconnect")
    blank.evaluate(SETUP, {"token": token, "queue": q})
    assert rest.post(f"/queues/{q}/messages", json={"body": "first"}).status_code == 200
    wait_for(lambda: len(got(blank)) == 1, message="the first delivery")

    # The connection drops (the socket closes under the client's feet).
    blank.evaluate("() => window.__t.client._ws.close(4000, 'test drop')")
    wait_for(lambda: len(got(blank)) == 2, message="the redelivery after resubscribing")
    _, again = got(blank)
    assert again["body"] == "first"
    assert again["redelivered"] is True
    assert again["count"] == 2
    states = blank.evaluate("window.__t.states")
    assert states[-2:] == ["reconnecting", "open"]
    # The old delivery's tag died with its connection: settling it is refused locally.
    code = blank.evaluate("async () => window.__t.got[0].ack().then(() => null, (e) => e.code)")
    assert code == "stale_delivery"
    blank.evaluate("async () => window.__t.got[1].ack()")

    # New messages keep arriving on the resumed subscription.
    assert rest.post(f"/queues/{q}/messages", json={"body": "after"}).status_code == 200
    wait_for(lambda: len(got(blank)) == 3, message="a delivery after the reconnect")
    assert got(blank)[2]["body"] == "after"
    assert rest.get(f"/queues/{q}").json()["stats"]["consumers"] == 1


def test_subscription_cancelled_when_the_queue_is_deleted(
    blank: Page, token: str, rest: httpx.Client
) -> None:
    q = queue(rest, "bc-cancel")
    blank.evaluate(SETUP, {"token": token, "queue": q})
    assert rest.delete(f"/queues/{q}").status_code == 204
    wait_for(lambda: blank.evaluate("window.__t.cancelled.length") == 1, message="the cancel")
    assert blank.evaluate("window.__t.cancelled[0]") == {"queue": q, "reason": "queue_deleted"}
    code = blank.evaluate(
        "async (q) => window.__t.client.subscribe(q, {}, () => {}).then(() => null, (e) => e.code)",
        q,
    )
    assert code == "not_found"


def test_bad_credentials_are_final(blank: Page) -> None:
    result = blank.evaluate(
        """async () => {
          const { Client } = await import('/static/messagex.js');
          const client = new Client({ token: 'not-a-token', minBackoffMs: 10 });
          const code = await client.connect().then(() => null, (e) => e.code);
          await new Promise((r) => setTimeout(r, 200));
          return { code, state: client.state };
        }"""
    )
    assert result == {"code": "unauthorized", "state": "closed"}


def test_username_and_password_work_too(blank: Page, rest: httpx.Client) -> None:
    q = queue(rest, "bc-basic-auth")
    result = blank.evaluate(
        """async ({ username, password, q }) => {
          const { connect } = await import('/static/messagex.js');
          const client = await connect({ username, password });
          const result = await client.publish({ queue: q, body: [1, 2] });
          client.close();
          return { user: client.user.username, routed: result.routed, state: client.state };
        }""",
        {"username": ADMIN_USER, "password": ADMIN_PASSWORD, "q": q},
    )
    assert result == {"user": ADMIN_USER, "routed": True, "state": "closed"}


def test_declare_queue_with_section_13_arguments_through_the_client(
    blank: Page, token: str, rest: httpx.Client
) -> None:
    """§13 from the browser client: declareQueue's named options become the RabbitMQ-named
    arguments; a wrong one is rejected with the broker's code; deleteQueue removes it."""
    result = blank.evaluate(
        """
        async ({ token }) => {
          const { Client } = await import('/static/messagex.js');
          const mx = new Client({ token });
          await mx.connect();
          const q = await mx.declareQueue('bc-args', {
            messageTtl: 60000, maxLength: 1, overflow: 'reject-publish', maxPriority: 3 });
          const first = await mx.publish({ queue: 'bc-args', body: 1 });
          const second = await mx.publish({ queue: 'bc-args', body: 2 });
          let bad = null;
          try { await mx.declareQueue('bc-bad', { maxPriority: 0 }); } catch (e) { bad = e.code; }
          await mx.deleteQueue('bc-args');
          mx.close();
          return { args: q.arguments, first: first.rejected, second: second.rejected, bad };
        }
        """,
        {"token": token},
    )
    assert result["args"] == {
        "x-message-ttl": 60000,
        "x-max-length": 1,
        "x-overflow": "reject-publish",
        "x-max-priority": 3,
    }
    assert result["first"] == []
    assert result["second"] == ["bc-args"]
    assert result["bad"] == "validation_error"
    assert rest.get("/queues/bc-args").status_code == 404


def test_exchange_bindings_and_alternates_through_the_client(
    blank: Page, token: str, rest: httpx.Client
) -> None:
    """§14 from the browser client: declareExchange with alternateExchange, bind to an
    exchange, bindings() by destination, a mandatory publish caught by the alternate."""
    caught = queue(rest, "bc-caught")
    reached = queue(rest, "bc-reached")
    result = blank.evaluate(
        """
        async ({ token, caught, reached }) => {
          const { Client } = await import('/static/messagex.js');
          const mx = new Client({ token });
          await mx.connect();
          await mx.declareExchange('bc-alt', { type: 'fanout' });
          await mx.bind({ exchange: 'bc-alt', queue: caught });
          const main = await mx.declareExchange(
            'bc-main', { type: 'direct', alternateExchange: 'bc-alt' });
          await mx.declareExchange('bc-down', { type: 'fanout' });
          await mx.bind({ exchange: 'bc-down', queue: reached });
          const link = await mx.bind(
            { exchange: 'bc-main', destination_exchange: 'bc-down', routing_key: 'k' });
          const listed = await mx.bindings({ destination_exchange: 'bc-down' });
          const viaLink = await mx.publish({ exchange: 'bc-main', routing_key: 'k', body: 1 });
          const viaAlt = await mx.publish(
            { exchange: 'bc-main', routing_key: 'z', body: 2, mandatory: true });
          let missing = null;
          try {
            await mx.declareExchange('bc-bad', { type: 'direct', alternateExchange: 'bc-none' });
          } catch (e) { missing = e.code; }
          await mx.unbind(link.id);
          const after = await mx.bindings({ destination_exchange: 'bc-down' });
          mx.close();
          return { args: main.arguments, link, listed: listed.map((b) => b.id),
                   viaLink: viaLink.queues,
                   viaAlt: viaAlt.queues, missing, after: after.length };
        }
        """,
        {"token": token, "caught": caught, "reached": reached},
    )
    assert result["args"] == {"alternate-exchange": "bc-alt"}
    assert result["link"]["queue"] is None
    assert result["link"]["destination_exchange"] == "bc-down"
    assert result["listed"] == [result["link"]["id"]]
    assert result["viaLink"] == [reached]
    assert result["viaAlt"] == [caught]
    assert result["missing"] == "not_found"
    assert result["after"] == 0


def test_a_waiting_single_active_subscription_is_activated(
    blank: Page, token: str, rest: httpx.Client, ui_server: LiveServer
) -> None:
    """Subscription.waiting and the "activated" event (contract §13)."""
    q = "bc-sac"
    r = rest.put(f"/queues/{q}", json={"arguments": {"x-single-active-consumer": True}})
    assert r.status_code in (200, 201), r.text
    with WsClient.admin(ui_server.ws_url) as ws:
        assert ws.subscribe(q)["active"] is True
        blank.evaluate(SETUP, {"token": token, "queue": q})
        blank.evaluate(
            "() => window.__t.client.addEventListener('activated',"
            " (e) => { window.__t.activated = e.detail.queue; })"
        )
        assert blank.evaluate("() => window.__t.sub.waiting") is True
    wait_for(lambda: blank.evaluate("() => window.__t.activated || null"), message="activated")
    assert blank.evaluate("() => window.__t.activated") == q
    assert blank.evaluate("() => window.__t.sub.waiting") is False
    blank.evaluate("async (q) => window.__t.client.publish({ queue: q, body: 'now' })", q)
    wait_for(lambda: len(got(blank)) == 1, message="the delivery")
    assert got(blank)[0]["body"] == "now"


def test_diagnosis_and_connections_through_the_client(
    blank: Page, token: str, rest: httpx.Client
) -> None:
    """§19 and §20 through messagex.js: the queue's diagnosis names this client's connection
    as the holder; it is listed; closing it gives 1008 and the client reconnects."""
    q = queue(rest, "bc-diag")
    blank.evaluate(SETUP, {"token": token, "queue": q})
    rest.post(f"/queues/{q}/messages", json={"body": 1})
    wait_for(lambda: len(got(blank)) == 1, message="the delivery")
    found = blank.evaluate(
        """async (queue) => {
          const d = await window.__t.client.diagnoseQueue(queue);
          const db = await window.__t.client.diagnoseDatabase();
          const page = await window.__t.client.connections({ limit: 1000 });
          let missing = null;
          try { await window.__t.client.closeConnection('00000000-0000-0000-0000-000000000000'); }
          catch (e) { missing = e.code; }
          return { d, processes: db.processes.length, ids: page.items.map((c) => c.connection_id),
                   missing };
        }""",
        q,
    )
    holder = found["d"]["oldest_in_flight"]["holder"]
    assert holder["kind"] == "websocket"
    assert holder["connection_id"] in found["ids"]
    assert found["processes"] >= 1
    assert found["missing"] == "not_found"
    blank.evaluate("(id) => window.__t.client.closeConnection(id)", holder["connection_id"])
    wait_for(
        lambda: "reconnecting" in blank.evaluate("window.__t.states"),
        message="the client to see its connection closed",
    )


def test_lists_by_name_with_contains_through_the_client(
    blank: Page, token: str, rest: httpx.Client
) -> None:
    """§20 from the browser client: exchanges(), queues() and users() with `contains`."""
    for name in ("bcl-Owl", "bcl-owl", "bcl-barnowl", "bcl-hen"):
        assert rest.put(f"/exchanges/{name}", json={"type": "fanout"}).status_code == 201
        queue(rest, name)
    result = blank.evaluate(
        """
        async ({ token }) => {
          const { Client } = await import('/static/messagex.js');
          const mx = new Client({ token });
          const exchanges = await mx.exchanges({ contains: 'owl' });
          const queues = await mx.queues({ contains: 'bcl-' });
          const all = await mx.exchanges();
          const users = await mx.users({ contains: 'admi' });
          let bad = null;
          try { await mx.queues({ contains: 'a b' }); } catch (e) { bad = e.code; }
          return { exchanges: exchanges.map((x) => x.name), queues: queues.map((q) => q.name),
                   builtin: all.some((x) => x.name === 'amq.topic'),
                   users: users.map((u) => u.username), bad };
        }
        """,
        {"token": token},
    )
    assert result["exchanges"] == ["bcl-barnowl", "bcl-owl"]
    assert result["queues"] == ["bcl-Owl", "bcl-barnowl", "bcl-hen", "bcl-owl"]
    assert result["builtin"] is True
    assert result["users"] == [ADMIN_USER]
    assert result["bad"] == "validation_error"


def test_history_through_the_client(blank: Page, token: str, rest: httpx.Client) -> None:
    """overviewHistory() and queueHistory(name): the charts' history, sampled every second
    on this broker; a missing queue rejects with not_found."""
    name = queue(rest, "bc-history")
    assert rest.post(f"/queues/{name}/messages", json={"body": 1}).status_code == 200
    result = blank.evaluate(
        """
        async ({ token, name }) => {
          const { Client } = await import('/static/messagex.js');
          const mx = new Client({ token });
          const deadline = Date.now() + 15000;
          let q;
          do {
            q = await mx.queueHistory(name);
            if (q.samples.some((s) => s.published === 1)) break;
            await new Promise((resolve) => setTimeout(resolve, 200));
          } while (Date.now() < deadline);
          const o = await mx.overviewHistory();
          let missing = null;
          try { await mx.queueHistory('bc-history-none'); } catch (e) { missing = e.code; }
          return { interval: q.interval_seconds, count: q.samples.length,
                   published: q.samples.reduce((n, s) => n + s.published, 0),
                   overview: o.samples.length, missing };
        }
        """,
        {"token": token, "name": name},
    )
    assert result == {
        "interval": 1,
        "count": 600,
        "published": 1,
        "overview": 600,
        "missing": "not_found",
    }
