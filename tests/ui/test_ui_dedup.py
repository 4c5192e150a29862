"""Idempotent publish (contract §15) in the management UI and messagex.js: the queue form
declares the deduplication window by its RabbitMQ-style name, the queue page shows it, the
publish page says which queue took a repeated message_id as a duplicate, and the browser
client declares it by option and resolves a publish with its ``duplicates``."""

from __future__ import annotations

import httpx
from playwright.sync_api import Page, expect

from tests.support import LiveServer
from tests.ui.support import go, log_in
from tests.ui.test_browser_client import blank, token

__all__ = ["blank", "token"]  # the browser client's fixtures


def test_the_queue_form_declares_a_window_and_publish_shows_the_duplicate(
    page: Page, ui_server: LiveServer, rest: httpx.Client
) -> None:
    log_in(page, ui_server)
    go(page, "Queues")
    page.get_by_label("Name", exact=True).fill("e2e-dedup")
    page.get_by_label("Deduplication window (s) — x-deduplication-window-seconds").fill("600")
    page.get_by_role("button", name="Declare queue").click()
    expect(page.get_by_text("Queue e2e-dedup declared")).to_be_visible()
    assert rest.get("/queues/e2e-dedup").json()["arguments"] == {
        "x-deduplication-window-seconds": 600
    }
    page.get_by_role("link", name="e2e-dedup", exact=True).click()
    expect(page.get_by_role("heading", name="Queue e2e-dedup")).to_be_visible()
    expect(page.locator("dd", has_text="600 s")).to_be_visible()
    go(page, "Publish")
    page.get_by_label("a queue (the default exchange)").check()
    page.get_by_label("Queue", exact=True).fill("e2e-dedup")
    page.get_by_label("Body (any JSON value)").fill("1")
    page.get_by_label("Message id (optional)").fill("order-7")
    page.get_by_role("button", name="Publish").click()
    expect(page.get_by_text("Published: routed to e2e-dedup (message id order-7)")).to_be_visible()
    page.get_by_role("button", name="Publish").click()
    expect(page.get_by_text("duplicate in e2e-dedup")).to_be_visible()
    assert rest.get("/queues/e2e-dedup").json()["stats"]["ready"] == 1


def test_the_browser_client_declares_a_window_and_reports_duplicates(
    blank: Page, token: str, rest: httpx.Client
) -> None:
    result = blank.evaluate(
        """
        async ({ token }) => {
          const { Client } = await import('/static/messagex.js');
          const mx = new Client({ token });
          await mx.connect();
          const q = await mx.declareQueue('bc-dedup', { deduplicationWindowSeconds: 60 });
          const message = { queue: 'bc-dedup', body: 1, properties: { message_id: 'x-1' } };
          const first = await mx.publish(message);
          const again = await mx.publish(message);
          let bad = null;
          try {
            await mx.declareQueue('bc-dedup-bad', { deduplicationWindowSeconds: 0 });
          } catch (e) { bad = e.code; }
          mx.close();
          return { args: q.arguments, first, again, bad };
        }
        """,
        {"token": token},
    )
    assert result["args"] == {"x-deduplication-window-seconds": 60}
    assert (result["first"]["queues"], result["first"]["duplicates"]) == (["bc-dedup"], [])
    assert (result["again"]["queues"], result["again"]["duplicates"]) == ([], ["bc-dedup"])
    assert result["again"]["routed"] is True
    assert result["bad"] == "validation_error"
    assert rest.get("/queues/bc-dedup").json()["stats"]["ready"] == 1
    assert rest.get("/queues/bc-dedup-bad").status_code == 404
