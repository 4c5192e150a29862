"""Diagnosis (contract §19) and connections (§20) in headless Chromium: a queue page shows
its findings first, the head and the oldest delivery with its holder; the admin Health page
the database's side; the admin Connections page lists a WebSocket connection and closes it.
"""

from __future__ import annotations

import time

import httpx
from playwright.sync_api import Page, expect
from websockets.exceptions import ConnectionClosed

from tests.support import LiveServer
from tests.ui.support import go, log_in
from tests.wsclient import WsClient, declare_queue, publish


def test_queue_page_shows_findings_head_and_holder(
    page: Page, ui_server: LiveServer, rest: httpx.Client
) -> None:
    declare_queue(rest, "ui-diag", arguments={"x-max-length": 2})
    publish(rest, "ui-diag", "held")
    with WsClient.admin(ui_server.ws_url) as ws:
        ws.subscribe("ui-diag", 1)
        ws.delivery()
        for i in range(3):  # the limit: 2 ready, and the subscriber's prefetch is full
            publish(rest, "ui-diag", i)
        assert ws.connected is not None
        holder = ws.connected["connection_id"]
        log_in(page, ui_server)
        page.goto(f"{ui_server.base_url}/#/queues/ui-diag")
        diagnosis = page.get_by_role("region", name="Diagnosis")
        finding = diagnosis.locator('[data-code="length_limit_reached"]')
        expect(finding).to_contain_text("x-max-length 2")
        expect(finding).to_contain_text("raise the limit")
        expect(diagnosis).to_contain_text("no_subscriber_with_credit")
        expect(diagnosis).to_contain_text(f"connection {holder}")
        expect(diagnosis.get_by_role("table", name="Subscriptions")).to_contain_text(holder)


def test_health_page_shows_processes_and_findings(page: Page, ui_server: LiveServer) -> None:
    log_in(page, ui_server)
    go(page, "Health")
    expect(page.get_by_role("heading", name="Health")).to_be_visible()
    processes = page.get_by_role("table", name="Broker processes")
    expect(processes).to_contain_text(ui_server.services.delivery.process_id)
    expect(processes).to_contain_text("up")
    expect(page.get_by_role("region", name="Database")).to_contain_text("NOTIFY queue use")


def test_connections_page_closes_a_connection(page: Page, ui_server: LiveServer) -> None:
    with WsClient.admin(ui_server.ws_url) as ws:
        assert ws.connected is not None
        cid = ws.connected["connection_id"]
        log_in(page, ui_server)
        go(page, "Connections")
        row = page.get_by_role("row").filter(has_text=cid)
        expect(row).to_contain_text("127.0.0.1:")
        # the filter box (?contains=, contract §20) keeps only the users it names
        page.get_by_label("Filter connections by user").fill("nobody-such")
        expect(page.get_by_text("No WebSocket connection.")).to_be_visible()
        page.get_by_label("Filter connections by user").fill("")
        expect(row).to_contain_text("127.0.0.1:")
        row.get_by_role("button", name=f"Close connection {cid}").click()
        expect(page.get_by_text(f"Connection {cid} closed")).to_be_visible()
        deadline = time.monotonic() + 5
        code = None
        while code is None and time.monotonic() < deadline:
            try:
                ws.recv_json(deadline - time.monotonic())
            except TimeoutError:
                continue
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd else -1
        assert code == 1008
