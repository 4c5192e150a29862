"""The filter box of each list page (Exchanges, Queues, Users): it asks the broker for
``?contains=`` (contract §20) and shows only the names that contain the text, case-sensitive."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.support import LiveServer
from tests.ui.support import go, log_in

PASSWORD = "filter-password-1"


def declare(rest: httpx.Client, page_name: str, name: str) -> None:
    if page_name == "Queues":
        r = rest.put(f"/queues/{name}", json={})
    elif page_name == "Exchanges":
        r = rest.put(f"/exchanges/{name}", json={"type": "fanout"})
    else:
        r = rest.put(f"/users/{name}", json={"password": PASSWORD, "role": "user"})
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    ("page_name", "path", "label"),
    [
        ("Queues", "/api/v1/queues", "Filter queues by name"),
        ("Exchanges", "/api/v1/exchanges", "Filter exchanges by name"),
        ("Users", "/api/v1/users", "Filter users by name"),
    ],
)
def test_the_filter_box_lists_the_names_containing_the_text(
    page: Page, ui_server: LiveServer, rest: httpx.Client, page_name: str, path: str, label: str
) -> None:
    prefix = f"uif-{page_name.lower()}"
    for suffix in ("Quokka", "quokka", "redquokka", "banana"):
        declare(rest, page_name, f"{prefix}-{suffix}")
    log_in(page, ui_server)
    go(page, page_name)
    table = page.get_by_role("table").first
    expect(table).to_contain_text(f"{prefix}-banana")

    with page.expect_request(lambda r: path in r.url and "contains=quokka" in r.url):
        page.get_by_label(label).fill("quokka")
    expect(table).to_contain_text(f"{prefix}-redquokka")
    expect(table).to_contain_text(f"{prefix}-quokka")
    expect(table).not_to_contain_text(f"{prefix}-Quokka")
    expect(table).not_to_contain_text(f"{prefix}-banana")
    expect(table.get_by_role("row")).to_have_count(3)  # the header and two names

    page.get_by_label(label).fill(f"{prefix}-Q")
    expect(table.get_by_role("row")).to_have_count(2)
    expect(table).to_contain_text(f"{prefix}-Quokka")

    # A text no name can hold is the broker's 422, shown as the error it is.
    page.get_by_label(label).fill("a b")
    expect(page.get_by_role("alert")).to_contain_text("validation_error")

    page.get_by_label(label).fill("")
    expect(table).to_contain_text(f"{prefix}-banana")


def test_a_filter_with_no_match_says_so(page: Page, ui_server: LiveServer) -> None:
    log_in(page, ui_server)
    go(page, "Queues")
    page.get_by_label("Filter queues by name").fill("no-queue-has-this-name")
    expect(page.get_by_text("No queue names contain this text.")).to_be_visible()
