"""Bad arguments and properties of contract §13-§14 through the real server: 422 naming the
argument (an ERROR frame naming it on the WebSocket), and nothing stored."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.test_queues import assert_problem
from tests.support import LiveServer
from tests.wsclient import WsClient, bind, browse, declare_queue

#: the last key of each is the wrong one; a key before it is a valid companion
BAD_QUEUE_ARGUMENTS: list[dict[str, Any]] = [
    {"x-message-ttl": -1},
    {"x-message-ttl": "60000"},
    {"x-message-ttl": 4_294_967_296},  # one past AMQP's unsigned 32 bits of ms
    {"x-expires": 10},
    {"x-expires": "1000"},
    {"x-expires": 1000.0},
    {"x-max-length": 1.5},
    {"x-max-length": -1},
    {"x-max-length-bytes": -1},
    {"x-max-length-bytes": "1"},
    {"x-max-length-bytes": 1.0},
    {"x-overflow": "drop-tail"},
    {"x-overflow": 1},
    {"x-overflow": None},
    {"x-max-priority": 300},
    {"x-max-priority": 0},
    {"x-max-priority": "5"},
    {"x-max-priority": True},
    {"x-single-active-consumer": "yes"},
    {"x-dead-letter-exchange": "no such name!"},
    {"x-dead-letter-exchange": 5},
    {"x-dead-letter-exchange": ["amq.direct"]},
    {"x-dead-letter-routing-key": "k"},
    {"x-dead-letter-exchange": "amq.direct", "x-dead-letter-routing-key": 1},
    {"x-dead-letter-exchange": "amq.direct", "x-dead-letter-routing-key": None},
    {"x-dead-letter-exchange": "amq.direct", "x-dead-letter-routing-key": "a\x00b"},
]


@pytest.mark.parametrize("arguments", BAD_QUEUE_ARGUMENTS)
def test_bad_queue_argument_is_422_naming_it(
    admin: httpx.Client, arguments: dict[str, Any]
) -> None:
    problem = assert_problem(
        admin.put("/queues/q", json={"arguments": arguments}), 422, "validation_error"
    )
    key = [*arguments][-1]
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


@pytest.mark.parametrize("alternate", [1, None, ["ae"], "", "no such name!", "a" * 256])
def test_bad_alternate_exchange_is_422(admin: httpx.Client, alternate: Any) -> None:
    body = {"type": "direct", "arguments": {"alternate-exchange": alternate}}
    problem = assert_problem(admin.put("/exchanges/e", json=body), 422, "validation_error")
    assert "alternate-exchange" in problem["detail"]
    assert problem["errors"][0]["loc"] == ["body", "arguments", "alternate-exchange"]
    assert admin.get("/exchanges/e").status_code == 404


BAD_PROPERTIES: list[dict[str, Any]] = [
    {"priority": -1},
    {"priority": 256},
    {"priority": "1"},
    {"priority": 1.0},
    {"priority": True},
    {"expiration": 1000},
    {"expiration": "1e3"},
    {"expiration": "-1"},
    {"expiration": ""},
    {"expiration": "4294967296"},
]


@pytest.mark.parametrize("properties", BAD_PROPERTIES)
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


@pytest.mark.parametrize("properties", BAD_PROPERTIES)
def test_bad_priority_or_expiration_on_a_publish_frame_is_an_error(
    server: LiveServer, admin: httpx.Client, properties: dict[str, Any]
) -> None:
    declare_queue(admin, "q")
    bind(admin, "amq.direct", "q", "q")
    (key,) = properties
    with WsClient.admin(server.ws_url) as ws:
        for target in ({"queue": "q"}, {"exchange": "amq.direct", "routing_key": "q"}):
            frame = {"type": "PUBLISH", **target, "body": 1, "properties": properties}
            reply = ws.request(frame)
            assert (reply["type"], reply["code"]) == ("ERROR", "bad_frame"), reply
            assert f"properties.{key}" in reply["message"], reply
        # the connection goes on, and the same frame with a good value is published
        good = {"queue": "q", "body": 1, "properties": {"priority": 1, "expiration": "60000"}}
        assert ws.request({"type": "PUBLISH", **good})["type"] == "PUBLISHED"
    [stored] = browse(admin, "q")
    assert stored["properties"]["priority"] == 1
    assert stored["properties"]["expiration"] == "60000"


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
