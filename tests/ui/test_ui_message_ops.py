"""Contract §17 in the browser: the queue page's by-filter form (dry-run count, confirmation,
move, redrive, delete) and messagex.js's queryMessages / moveMessages / deleteMessages."""

from __future__ import annotations

import httpx
from playwright.sync_api import Page, expect

from tests.support import ADMIN_PASSWORD, ADMIN_USER, LiveServer, login
from tests.ui.support import log_in, stat


def _fill(rest: httpx.Client, queue: str, **declaration: object) -> None:
    assert rest.put(f"/queues/{queue}", json=declaration).status_code == 201


def test_the_queue_page_counts_moves_and_deletes_by_filter(
    page: Page, ui_server: LiveServer, rest: httpx.Client
) -> None:
    _fill(rest, "ui-ops-src")
    _fill(rest, "ui-ops-dst")
    for n in range(4):
        headers = {"tenant": "acme" if n % 2 else "zeta"}
        r = rest.post("/queues/ui-ops-src/messages", json={"body": n, "headers": headers})
        assert r.status_code == 200
    questions: list[str] = []
    page.on("dialog", lambda dialog: questions.append(dialog.message))
    log_in(page, ui_server)
    page.goto(f"{ui_server.base_url}/#/queues/ui-ops-src")
    form = page.get_by_role("form", name="Operations by filter")
    form.get_by_label("Headers (JSON object)").fill('{"tenant": "acme"}')
    form.get_by_label("Target queue").fill("ui-ops-dst")
    form.get_by_role("button", name="Count (dry run)").click()
    expect(form.get_by_role("status")).to_have_text("2 copies match; up to 2 would be moved.")
    assert rest.get("/queues/ui-ops-dst").json()["stats"]["ready"] == 0  # a dry run
    form.get_by_role("button", name="Apply…").click()
    expect(form.get_by_role("status")).to_have_text("Moved 2 copies of 2 matching.")
    assert questions == ["Move up to 2 of 2 matching copies of ui-ops-src to ui-ops-dst?"]
    expect(stat(page, "queue-ready")).to_have_text("2")
    assert rest.get("/queues/ui-ops-dst").json()["stats"]["ready"] == 2
    # delete what is left, one at most
    form.get_by_label("Headers (JSON object)").fill("")
    form.get_by_label("Action").select_option("delete")
    expect(form.get_by_label("Target queue")).to_be_hidden()
    form.get_by_label("At most").fill("1")
    form.get_by_role("button", name="Apply…").click()
    expect(form.get_by_role("status")).to_have_text("Deleted 1 copy of 2 matching.")
    assert rest.get("/queues/ui-ops-src").json()["stats"]["ready"] == 1
    # a bad filter is reported and nothing is sent
    form.get_by_label("Headers (JSON object)").fill("[1]")
    form.get_by_role("button", name="Count (dry run)").click()
    expect(form.get_by_role("status")).to_have_text("Headers: give a JSON object.")


def test_the_browser_client_queries_moves_and_deletes(
    page: Page, ui_server: LiveServer, rest: httpx.Client
) -> None:
    _fill(rest, "bc-ops-dlq")
    _fill(rest, "bc-ops-work", dead_letter_queue="bc-ops-dlq")
    for n in range(3):
        rest.post("/queues/bc-ops-work/messages", json={"body": n})
    got = rest.post("/queues/bc-ops-work/get", json={"max_messages": 3}).json()["messages"]
    for m in got:
        rest.post(f"/deliveries/{m['delivery_tag']}/nack", json={"requeue": False})
    token = login(ui_server.base_url, ADMIN_USER, ADMIN_PASSWORD)
    page.goto(f"{ui_server.base_url}/static/style.css")
    result = page.evaluate(
        """
        async ({ token }) => {
          const { Client } = await import('/static/messagex.js');
          const mx = new Client({ token });
          const rejected = { death_reason: 'rejected' };
          const page = await mx.queryMessages('bc-ops-dlq', rejected, { limit: 2 });
          const dry = await mx.moveMessages('bc-ops-dlq', rejected, { to: null, dryRun: true });
          const moved = await mx.moveMessages('bc-ops-dlq', {}, { to: null, limit: 2 });
          const deleted = await mx.deleteMessages('bc-ops-dlq');
          let missing = null;
          try { await mx.moveMessages('bc-ops-dlq'); } catch (e) { missing = e.name; }
          return { bodies: page.items.map((i) => i.body), next: page.next_after !== null,
                   dry, moved, deleted, missing };
        }
        """,
        {"token": token},
    )
    assert result == {
        "bodies": [0, 1],
        "next": True,
        "dry": {"matched": 3, "moved": 0, "skipped": 0},
        "moved": {"matched": 3, "moved": 2, "skipped": 0},
        "deleted": {"matched": 1, "deleted": 1},
        "missing": "TypeError",
    }
