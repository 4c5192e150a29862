"""Keyboard use and labels: the UI works without a mouse and every control is labelled."""

from __future__ import annotations

import httpx
from playwright.sync_api import Page, expect

from tests.support import ADMIN_PASSWORD, ADMIN_USER, LiveServer
from tests.ui.support import log_in

UNLABELLED = """
() => {
  const named = (el) => (el.labels && el.labels.length > 0) || el.getAttribute('aria-label')
    || el.getAttribute('aria-labelledby');
  const controls = [...document.querySelectorAll('input, select, textarea')]
    .filter((el) => el.type !== 'hidden' && !named(el))
    .map((el) => el.outerHTML.slice(0, 80));
  const buttons = [...document.querySelectorAll('button, a')]
    .filter((el) => !(el.textContent.trim() || el.getAttribute('aria-label')))
    .map((el) => el.outerHTML.slice(0, 80));
  return controls.concat(buttons);
}
"""


def test_log_in_and_navigate_with_the_keyboard_only(page: Page, ui_server: LiveServer) -> None:
    page.goto(f"{ui_server.base_url}/")
    username = page.get_by_label("Username")
    expect(username).to_be_focused()
    page.keyboard.type(ADMIN_USER)
    page.keyboard.press("Tab")
    expect(page.get_by_label("Password")).to_be_focused()
    page.keyboard.type(ADMIN_PASSWORD)
    page.keyboard.press("Enter")
    heading = page.get_by_role("heading", name="Overview", exact=True)
    expect(heading).to_be_focused()

    # Tab from the top reaches the skip link first, then the navigation.
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    nav = page.get_by_role("navigation", name="Main")
    for _ in range(10):
        page.keyboard.press("Tab")
        if nav.get_by_role("link", name="Queues").evaluate("(el) => el === document.activeElement"):
            break
    expect(nav.get_by_role("link", name="Queues")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Queues", exact=True)).to_be_focused()
    expect(nav.get_by_role("link", name="Queues")).to_have_attribute("aria-current", "page")

    # Declare a queue from the keyboard: type the name, Enter submits the form.
    page.get_by_label("Name", exact=True).focus()
    page.keyboard.type("kbd-queue")
    page.keyboard.press("Enter")
    expect(page.get_by_role("link", name="kbd-queue", exact=True)).to_be_visible()


def test_every_control_on_every_page_is_labelled(
    page: Page, ui_server: LiveServer, rest: httpx.Client
) -> None:
    assert rest.put("/queues/a11y-q", json={}).status_code in (200, 201)
    rest.post("/queues/a11y-q/messages", json={"body": 1, "headers": {"h": 1}})
    page.goto(f"{ui_server.base_url}/")
    assert page.evaluate(UNLABELLED) == []
    log_in(page, ui_server)
    for route, heading in [
        ("overview", "Overview"),
        ("exchanges", "Exchanges"),
        ("exchanges/amq.topic", "Exchange amq.topic"),
        ("queues", "Queues"),
        ("queues/a11y-q", "Queue a11y-q"),
        ("publish", "Publish a message"),
        ("consume?queue=a11y-q", "Consume"),
        ("users", "Users"),
        ("health", "Health"),
        ("connections", "Connections"),
    ]:
        page.goto(f"{ui_server.base_url}/#/{route}")
        expect(page.get_by_role("heading", name=heading, exact=True)).to_be_visible()
        if route.startswith("queues/"):
            expect(page.locator("li.message")).to_have_count(1)
        if route.startswith("consume"):
            page.get_by_role("button", name="Subscribe").click()
            expect(page.locator("li.delivery")).to_have_count(1)
        assert page.evaluate(UNLABELLED) == [], route
