"""Bad arguments and properties of contract §13-§14 through the real server: 422 naming the
argument, and nothing stored."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.test_queues import assert_problem


@pytest.mark.parametrize(
    "arguments",
    [
        {"x-message-ttl": -1},
        {"x-message-ttl": "60000"},
        {"x-expires": 10},
        {"x-max-length": 1.5},
        {"x-max-length-bytes": -1},
        {"x-overflow": "drop-tail"},
        {"x-max-priority": 300},
        {"x-single-active-consumer": "yes"},
        {"x-dead-letter-exchange": "no such name!"},
        {"x-dead-letter-routing-key": "k"},
    ],
)
def test_bad_queue_argument_is_422_naming_it(
    admin: httpx.Client, arguments: dict[str, Any]
) -> None:
    problem = assert_problem(
        admin.put("/queues/q", json={"arguments": arguments}), 422, "validation_error"
    )
    (key,) = arguments
    assert key in problem["detail"]
    assert problem["errors"][0]["loc"] == ["body", "arguments", key]
    assert admin.get("/queues").json()["items"] == []


def test_dead_letter_queue_and_exchange_together_is_422(admin: httpx.Client) -> None:
    assert admin.put("/queues/dlq").status_code == 201
    assert admin.put("/exchanges/dlx", json={"type": "fanout"}).status_code == 201
    body = {"dead_letter_queue": "dlq", "arguments": {"x-dead-letter-exchange": "dlx"}}
    problem = assert_problem(admin.put("/queues/q", json=body), 422, "validation_error")
    assert "dead_letter_queue" in problem["detail"]
    assert admin.get("/queues/q").status_code == 404


def test_bad_alternate_exchange_is_422(admin: httpx.Client) -> None:
    body = {"type": "direct", "arguments": {"alternate-exchange": 1}}
    problem = assert_problem(admin.put("/exchanges/e", json=body), 422, "validation_error")
    assert "alternate-exchange" in problem["detail"]
    assert admin.get("/exchanges/e").status_code == 404


@pytest.mark.parametrize(
    "properties",
    [
        {"priority": -1},
        {"priority": 256},
        {"priority": "1"},
        {"priority": 1.0},
        {"expiration": 1000},
        {"expiration": "1e3"},
        {"expiration": "-1"},
        {"expiration": "4294967296"},
    ],
)
def test_bad_priority_or_expiration_is_422(admin: httpx.Client, properties: dict[str, Any]) -> None:
    assert admin.put("/queues/q").status_code == 201
    message = {"routing_key": "q", "body": 1, "properties": properties}
    for path, body in (
        ("/exchanges/amq.direct/publish", message),
        ("/exchanges/amq.direct/publish-batch", {"messages": [message]}),
    ):
        problem = assert_problem(admin.post(path, json=body), 422, "validation_error")
        (key,) = properties
        assert key in str(problem["errors"]), problem
    assert admin.get("/queues/q").json()["stats"]["ready"] == 0


def test_priority_and_expiration_are_stored_as_given(admin: httpx.Client) -> None:
    assert admin.put("/queues/q").status_code == 201
    binding = {"exchange": "amq.direct", "queue": "q", "routing_key": "q"}
    assert admin.post("/bindings", json=binding).status_code == 201
    properties = {"priority": 7, "expiration": "60000"}
    r = admin.post(
        "/exchanges/amq.direct/publish",
        json={"routing_key": "q", "body": 1, "properties": properties},
    )
    assert r.status_code == 200, r.text
    got = admin.post("/queues/q/get", json={"max_messages": 1}).json()
    assert got["messages"][0]["properties"]["priority"] == 7
    assert got["messages"][0]["properties"]["expiration"] == "60000"
