"""The AsyncAPI document of the WebSocket protocol: committed, served, self-consistent.

That it describes every frame is checked by the WebSocket tests themselves: their client
validates each frame against it (tests/asyncapi_check.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.api.asyncapi import CLIENT, SERVER, document
from tests.asyncapi_check import check_client_frame, check_server_frame
from tests.support import LiveServer

COMMITTED = Path(__file__).resolve().parents[2] / "openapi" / "asyncapi.json"


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in _refs(value)]
    return []


def _resolve(doc: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = doc
    for part in ref[2:].split("/"):
        node = node[part]
    return node


def test_committed_document_equals_the_served_one(server: LiveServer) -> None:
    r = httpx.get(f"{server.base_url}/asyncapi.json")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert json.loads(COMMITTED.read_text()) == r.json(), (
        "openapi/asyncapi.json is stale: run `make openapi`"
    )


def test_every_reference_resolves_and_every_frame_is_described() -> None:
    doc = document()
    assert doc["asyncapi"] == "3.0.0"
    refs = _refs(doc)
    assert len(refs) > 50
    for ref in refs:
        _resolve(doc, ref)
    messages = doc["channels"]["ws"]["messages"]
    assert set(messages) == set(CLIENT) | set(SERVER)
    actions = {op["messages"][0]["$ref"].rsplit("/", 1)[1]: op for op in doc["operations"].values()}
    for kind, (_, replies) in CLIENT.items():
        assert actions[kind]["action"] == "receive"
        answered = {r["$ref"].rsplit("/", 1)[1] for r in actions[kind]["reply"]["messages"]}
        assert answered == {*replies, "ERROR"}


def test_a_server_frame_with_an_undocumented_field_fails_the_check() -> None:
    check_server_frame({"type": "PONG", "id": 7})
    with pytest.raises(AssertionError, match="does not match"):
        check_server_frame({"type": "PONG", "extra": 1})
    with pytest.raises(AssertionError, match=r"not in openapi/asyncapi\.json"):
        check_server_frame({"type": "NO_SUCH_FRAME"})


def test_client_frames_the_broker_accepts_match_and_refused_ones_are_not_checked() -> None:
    check_client_frame({"type": "ACK", "delivery_tags": ["a", "b"], "id": "x"})
    check_client_frame({"type": "PUBLISH", "queue": "q", "body": {"n": 1}})
    check_client_frame({"type": "SUBSCRIBE", "queue": "q", "prefetch": 5000})  # refused: fine
    doc = document()
    ack = doc["components"]["schemas"]["AckFrame"]
    assert ack["oneOf"] == [{"required": ["delivery_tag"]}, {"required": ["delivery_tags"]}]
