"""The charts of the overview and of a queue's page (charts.js): inline SVG drawn from the
history API, one path per series, showing what was published, delivered and acked."""

from __future__ import annotations

import httpx
from playwright.sync_api import Page, expect

from tests.support import LiveServer
from tests.ui.support import go, log_in
from tests.wsclient import declare_queue, publish

RATES = ["published", "delivered", "acked"]
DEPTHS = ["ready", "delayed", "in_flight", "dead"]


def series(page: Page, name: str) -> list[str | None]:
    paths = page.get_by_role("img", name=name).locator("path.series")
    return [paths.nth(i).get_attribute("data-series") for i in range(paths.count())]


def test_queue_page_charts_show_its_rates_and_depth(
    page: Page, ui_server: LiveServer, rest: httpx.Client
) -> None:
    q = "charts-orders"
    declare_queue(rest, q)
    for n in range(4):
        publish(rest, q, {"n": n})
    r = rest.post(f"/queues/{q}/get", json={"max_messages": 2})
    tags = [m["delivery_tag"] for m in r.json()["messages"]]
    assert len(tags) == 2
    assert rest.post(f"/deliveries/{tags[0]}/ack").status_code == 204

    log_in(page, ui_server)
    page.goto(f"{ui_server.base_url}/#/queues/{q}")
    rates = page.get_by_role("img", name="Message rates (per second)")
    depth = page.get_by_role("img", name="Queue depth (messages)")
    expect(rates).to_be_visible()
    expect(depth).to_be_visible()
    assert series(page, "Message rates (per second)") == RATES
    assert series(page, "Queue depth (messages)") == DEPTHS
    # the page redraws as samples arrive (every second on this broker)
    for key, count in [("published", "4"), ("delivered", "2"), ("acked", "1")]:
        expect(rates.locator(f'path[data-series="{key}"]')).to_have_attribute(
            "data-count", count, timeout=15_000
        )
    for key, last in [("ready", "2"), ("in_flight", "1"), ("delayed", "0"), ("dead", "0")]:
        expect(depth.locator(f'path[data-series="{key}"]')).to_have_attribute("data-last", last)
    legend = page.locator("figure", has=depth).locator('li[data-series="in_flight"]')
    expect(legend).to_have_text("In flight 1")
    # a drawn line: the ready series has points, not the empty placeholder
    d = depth.locator('path[data-series="ready"]').get_attribute("d") or ""
    assert d.startswith("M")
    assert d.count("L") >= 1
    # settle the copy still in flight: other tests of this broker wait for none
    assert rest.post(f"/deliveries/{tags[1]}/ack").status_code == 204


def test_overview_charts_are_broker_wide(
    page: Page, ui_server: LiveServer, rest: httpx.Client
) -> None:
    declare_queue(rest, "charts-overview")
    publish(rest, "charts-overview", "x")
    log_in(page, ui_server)
    go(page, "Overview")
    rates = page.get_by_role("img", name="Message rates (per second)")
    expect(rates).to_be_visible()
    assert series(page, "Message rates (per second)") == RATES
    assert series(page, "Queue depth (messages)") == DEPTHS
    expect(rates.locator('path[data-series="published"]')).not_to_have_attribute(
        "data-count", "0", timeout=15_000
    )
    depth = page.get_by_role("img", name="Queue depth (messages)")
    expect(depth.locator('path[data-series="ready"]')).not_to_have_attribute("data-last", "")
