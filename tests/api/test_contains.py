"""``?contains=`` on the name lists (contract §20): GET /exchanges, /queues and /users keep the
items whose name contains the text, case-sensitive, with the list's own order and paging.

One server for the module; each test uses names of its own (a prefix no other test shares).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support import LiveServer, client

PASSWORD = "contains-password-1"


def names(r: httpx.Response) -> list[str]:
    assert r.status_code == 200, r.text
    key = "username" if r.url.path.endswith("/users") else "name"
    return [item[key] for item in r.json()["items"]]


def every_page(c: httpx.Client, path: str, **query: Any) -> tuple[list[str], int]:
    """The names over all pages, and how many pages it took."""
    found: list[str] = []
    pages = 0
    params = dict(query)
    while True:
        r = c.get(path, params=params)
        found += names(r)
        pages += 1
        after = r.json()["next_after"]
        if after is None:
            return found, pages
        params["after"] = after


def assert_validation_error(r: httpx.Response) -> None:
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["code"] == "validation_error"


@pytest.fixture(scope="module")
def declared(adm: httpx.Client) -> list[str]:
    """Exchanges and queues of the same names: matches (ct.*) among others, with the
    characters LIKE would treat specially and upper/lower case variants."""
    made = ["ct.a_1", "ct.ab1", "ct.Alpha", "ct.alpha", "ct.b.alpha", "ct.c", "zz.alpha.ct"]
    for name in made:
        assert adm.put(f"/exchanges/{name}", json={"type": "direct"}).status_code == 201
        assert adm.put(f"/queues/{name}", json={}).status_code == 201
    return made


@pytest.mark.parametrize("path", ["/exchanges", "/queues"])
def test_contains_is_a_case_sensitive_substring(
    adm: httpx.Client, declared: list[str], path: str
) -> None:
    assert names(adm.get(path, params={"contains": "alpha"})) == [
        "ct.alpha",
        "ct.b.alpha",
        "zz.alpha.ct",
    ]
    assert names(adm.get(path, params={"contains": "Alpha"})) == ["ct.Alpha"]
    # "_" is a literal here, not LIKE's any-character: ct.ab1 does not match "a_1"
    assert names(adm.get(path, params={"contains": "a_1"})) == ["ct.a_1"]
    assert names(adm.get(path, params={"contains": "ct.alpha"})) == ["ct.alpha"]
    assert names(adm.get(path, params={"contains": "nothing-has-this"})) == []


@pytest.mark.parametrize("path", ["/exchanges", "/queues"])
def test_contains_keeps_the_order_and_the_paging(
    adm: httpx.Client, declared: list[str], path: str
) -> None:
    matching = sorted(n for n in declared if "ct." in n)
    assert len(matching) == 6
    paged, pages = every_page(adm, path, contains="ct.", limit=2)
    assert paged == matching
    assert pages == 3
    first = adm.get(path, params={"contains": "ct.", "limit": 4}).json()
    assert first["next_after"] == matching[3]
    rest = adm.get(path, params={"contains": "ct.", "after": first["next_after"]})
    assert names(rest) == matching[4:]
    assert rest.json()["next_after"] is None


def test_contains_on_queues_keeps_the_stats(adm: httpx.Client, declared: list[str]) -> None:
    assert adm.post("/queues/ct.c/messages", json={"body": 1}).status_code == 200
    [item] = adm.get("/queues", params={"contains": "ct.c"}).json()["items"]
    assert item["name"] == "ct.c"
    assert item["stats"]["ready"] == 1


def test_empty_contains_lists_everything(adm: httpx.Client, declared: list[str]) -> None:
    everything = names(adm.get("/exchanges", params={"limit": 1000}))
    assert names(adm.get("/exchanges", params={"limit": 1000, "contains": ""})) == everything
    assert "amq.direct" in everything


def test_contains_on_users(srv: LiveServer, adm: httpx.Client) -> None:
    for name in ("ctu-Bob", "ctu-bob", "ctu-bobby", "ctu_x", "ctuax"):
        r = adm.put(f"/users/{name}", json={"password": PASSWORD, "role": "user"})
        assert r.status_code == 201, r.text
    assert names(adm.get("/users", params={"contains": "bob"})) == ["ctu-bob", "ctu-bobby"]
    assert names(adm.get("/users", params={"contains": "u_"})) == ["ctu_x"]
    paged, _pages = every_page(adm, "/users", contains="ctu", limit=2)
    assert paged == ["ctu-Bob", "ctu-bob", "ctu-bobby", "ctu_x", "ctuax"]


def test_contains_applies_within_what_a_user_may_see(
    srv: LiveServer, adm: httpx.Client, declared: list[str]
) -> None:
    """A non-admin lists what it has some permission on; contains narrows that further."""
    permissions = {"configure": "", "write": "", "read": r"ct\.a.*"}
    r = adm.put(
        "/users/ctv-reader",
        json={"password": PASSWORD, "role": "user", "permissions": permissions},
    )
    assert r.status_code == 201, r.text
    with client(srv.base_url, auth=("ctv-reader", PASSWORD)) as user:
        for path in ("/exchanges", "/queues"):
            assert names(user.get(path, params={"contains": "a"})) == [
                "ct.a_1",
                "ct.ab1",
                "ct.alpha",
            ]
            paged, _pages = every_page(user, path, contains="1", limit=1)
            assert paged == ["ct.a_1", "ct.ab1"]
        assert user.get("/users", params={"contains": "ct"}).status_code == 403


@pytest.mark.parametrize("path", ["/exchanges", "/queues", "/users"])
@pytest.mark.parametrize("bad", ["a b", "100%", "x" * 256, "é", "a\\b", "*"])
def test_a_contains_that_no_name_can_hold_is_422(
    adm: httpx.Client, declared: list[str], path: str, bad: str
) -> None:
    assert_validation_error(adm.get(path, params={"contains": bad}))
