"""Take the screenshots of docs/screenshots/ (run: ``python -m tests.ui.screenshots``).

Starts a broker on a fresh database (MESSAGEX_TEST_DATABASE_URL, or an embedded
PostgreSQL), fills it with a small but realistic topology, and photographs the main pages
in headless Chromium.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
from playwright.sync_api import Page, expect, sync_playwright

from tests.support import ADMIN_PASSWORD, ADMIN_USER, PgCluster, client, running_server
from tests.support import test_settings as settings_for
from tests.ui.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.ui.support import go, log_in, stat

OUT = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def seed(rest: httpx.Client) -> None:
    rest.put("/exchanges/orders", json={"type": "topic"})
    rest.put("/exchanges/audit", json={"type": "fanout"})
    rest.put("/queues/invoices.failed", json={})
    rest.put(
        "/queues/invoices",
        json={"max_delivery_count": 5, "dead_letter_queue": "invoices.failed"},
    )
    rest.put("/queues/shipping", json={"ack_timeout_seconds": 60})
    rest.put("/queues/audit.log", json={})
    for exchange, queue, key in [
        ("orders", "invoices", "order.*"),
        ("orders", "shipping", "order.paid"),
        ("audit", "audit.log", ""),
    ]:
        rest.post("/bindings", json={"exchange": exchange, "queue": queue, "routing_key": key})
    for n, key in enumerate(["order.created", "order.paid", "order.created", "order.paid"]):
        body = {"order": 1040 + n, "total": f"{19.9 + n * 7:.2f}", "currency": "EUR"}
        rest.post(
            "/exchanges/orders/publish",
            json={"routing_key": key, "body": body, "headers": {"source": "shop"}},
        )
    rest.post(
        "/exchanges/orders/publish",
        json={"routing_key": "order.created", "body": {"order": 1050}, "delay_ms": 3_600_000},
    )
    rest.post("/queues/invoices.failed/messages", json={"body": {"order": 1001, "error": "tax"}})
    for n in range(3):
        rest.post("/exchanges/audit/publish", json={"body": {"event": "login", "n": n}})


def traffic(rest: httpx.Client, seconds: float) -> None:
    """Publish, consume and ack for ``seconds`` at changing rates, so that the charts of the
    overview and of the queue pages have lines to draw (the broker samples every second)."""
    deadline = time.monotonic() + seconds
    tick = 0
    while time.monotonic() < deadline:
        tick += 1
        burst = 3 + (tick * 7) % 11
        rest.post(
            "/exchanges/orders/publish-batch",
            json={
                "messages": [
                    {"routing_key": "order.created", "body": {"order": 2000 + tick * 20 + i}}
                    for i in range(burst)
                ]
            },
        )
        for queue, share in (("invoices", 0.6), ("audit.log", 1.0)):
            got = rest.post(
                f"/queues/{queue}/get", json={"max_messages": max(1, int(burst * share))}
            ).json()["messages"]
            tags = [m["delivery_tag"] for m in got]
            for tag in tags[: max(0, len(tags) - 1)]:  # one of each pull stays in flight
                rest.post(f"/deliveries/{tag}/ack")
        time.sleep(0.5)


def shoot(page: Page, name: str) -> None:
    page.wait_for_timeout(300)  # let the last paint land
    page.screenshot(path=str(OUT / f"{name}.png"), full_page=False)
    print("wrote", OUT / f"{name}.png")


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    cluster = PgCluster(None)
    template = cluster.template()
    db = cluster.create_database(template)
    try:
        settings = settings_for(cluster.url_for(db), history_interval_seconds=1)
        with running_server(settings) as server:
            with client(server.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as rest:
                seed(rest)
                rest.post(
                    "/bindings",
                    json={"exchange": "orders", "queue": "audit.log", "routing_key": "order.#"},
                )
                traffic(rest, 25)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 860})
                page.goto(f"{server.base_url}/")
                expect(page.get_by_label("Username")).to_be_visible()
                page.get_by_label("Username").fill(ADMIN_USER)
                shoot(page, "login")
                log_in(page, server)
                expect(stat(page, "messages-ready")).not_to_have_text("0")
                page.wait_for_timeout(2200)  # a second /metrics sample for the rates
                page.set_viewport_size({"width": 1280, "height": 1150})
                expect(page.get_by_role("img", name="Message rates (per second)")).to_be_visible()
                shoot(page, "overview")
                page.set_viewport_size({"width": 1280, "height": 860})
                go(page, "Queues")
                expect(page.get_by_role("link", name="invoices", exact=True)).to_be_visible()
                shoot(page, "queues")
                page.get_by_role("link", name="invoices", exact=True).click()
                page.locator("li.message").first.wait_for()
                expect(page.get_by_role("img", name="Queue depth (messages)")).to_be_visible()
                page.set_viewport_size({"width": 1280, "height": 1900})
                shoot(page, "queue")
                page.set_viewport_size({"width": 1280, "height": 860})
                page.goto(f"{server.base_url}/#/consume?queue=invoices")
                page.get_by_label("Prefetch").fill("2")
                page.get_by_role("button", name="Subscribe").click()
                expect(page.locator("li.delivery")).to_have_count(2)
                page.locator("li.delivery").first.get_by_role("button", name="ACK").first.click()
                expect(page.locator("li.delivery").first).to_contain_text("Settled: acked")
                expect(page.locator("li.delivery")).to_have_count(3)
                page.get_by_role("heading", name="Subscriptions").evaluate(
                    "(el) => window.scrollTo(0, el.getBoundingClientRect().top + scrollY - 16)"
                )
                shoot(page, "consume")
                go(page, "Publish")
                page.get_by_label("Exchange", exact=True).fill("orders")
                page.get_by_label("Routing key").fill("order.created")
                page.get_by_role("button", name="Publish").click()
                expect(page.get_by_text("Published: routed to invoices")).to_be_visible()
                shoot(page, "publish")
                browser.close()
    finally:
        cluster.drop_database(db)
        cluster.drop_database(template)
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
