"""The OpenAPI document: committed, identical to what the app serves, complete."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import pytest

from app.domain.arguments import parse_exchange_arguments, parse_queue_arguments
from app.errors import ValidationFailed
from tests.api.test_queues import assert_problem
from tests.support import LiveServer

COMMITTED = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"
METHODS = {"get", "put", "post", "delete", "patch", "head", "options"}


def _operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, op)
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method in METHODS
    ]


def test_committed_document_equals_the_served_one(server: LiveServer) -> None:
    r = httpx.get(f"{server.base_url}/openapi.json")
    assert r.status_code == 200
    committed = json.loads(COMMITTED.read_text())
    assert committed == r.json(), "openapi/openapi.json is stale: run `make openapi`"


def test_every_operation_has_an_id_a_tag_and_a_summary(server: LiveServer) -> None:
    doc = httpx.get(f"{server.base_url}/openapi.json").json()
    operations = _operations(doc)
    assert len(operations) >= 4
    missing = [
        f"{method} {path}"
        for method, path, op in operations
        if not (op.get("operationId") and op.get("tags") and op.get("summary"))
    ]
    assert missing == []
    ids = [op["operationId"] for _, _, op in operations]
    assert len(ids) == len(set(ids)), "operationIds must be unique"
    declared_tags = {t["name"] for t in doc.get("tags", [])}
    assert {tag for _, _, op in operations for tag in op["tags"]} <= declared_tags


def test_operations_endpoints_are_documented(server: LiveServer) -> None:
    doc = httpx.get(f"{server.base_url}/openapi.json").json()
    ids = {(m, p): op["operationId"] for m, p, op in _operations(doc)}
    assert ids[("GET", "/healthz")] == "healthz"
    assert ids[("GET", "/readyz")] == "readyz"
    assert ids[("GET", "/metrics")] == "metrics"
    assert ids[("GET", "/api/v1/overview")] == "get_overview"
    metrics = doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain; version=0.0.4; charset=utf-8"]


def test_docs_and_the_document_need_no_credentials(server: LiveServer) -> None:
    r = httpx.get(f"{server.base_url}/docs")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert "/openapi.json" in r.text
    assert httpx.get(f"{server.base_url}/openapi.json").status_code == 200


class _KeysRead(dict[str, Any]):
    """An empty arguments object that records every key a parser looks up in it."""

    def __init__(self) -> None:
        super().__init__()
        self.read: set[object] = set()

    def __contains__(self, key: object) -> bool:
        self.read.add(key)
        return super().__contains__(key)

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)


def _keys_read(parse: Callable[[dict[str, Any]], object]) -> set[object]:
    raw = _KeysRead()
    parse(raw)
    return raw.read


def _arguments_schema(doc: dict[str, Any], body: str) -> dict[str, Any]:
    schema: dict[str, Any] = doc["components"]["schemas"][body]["properties"]["arguments"]
    return schema


def test_declare_bodies_document_every_argument_that_takes_effect(server: LiveServer) -> None:
    """The keys the domain's parsers look up, no more and no fewer, are named properties of
    the declare bodies' ``arguments``; other keys stay allowed (stored and ignored)."""
    doc = httpx.get(f"{server.base_url}/openapi.json").json()
    for body, parse in (
        ("QueueDeclare", parse_queue_arguments),
        ("ExchangeDeclare", parse_exchange_arguments),
    ):
        schema = _arguments_schema(doc, body)
        recognised = _keys_read(parse)
        assert recognised, body
        assert set(schema["properties"]) == recognised, body
        assert schema["additionalProperties"] is True, body
        assert all(p.get("description") for p in schema["properties"].values()), body
    assert "alternate-exchange" in _arguments_schema(doc, "ExchangeDeclare")["properties"]


def _valid_and_invalid(schema: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """Values at the edges of what ``schema`` allows, and just past them."""
    kind = schema["type"]
    if kind == "integer":
        low = int(schema["minimum"])
        if "maximum" in schema:
            high = int(schema["maximum"])
        else:  # a bound a double cannot hold (2**63 - 1) is stated in the description only
            stated = re.search(r"At most (\d+)\.$", schema["description"])
            assert stated, schema
            high = int(stated.group(1))
        return [low, high], [low - 1, high + 1, float(low), str(low), True]
    if kind == "boolean":
        return [True, False], [1, "true", None]
    if "enum" in schema:
        return list(schema["enum"]), ["x" + schema["enum"][0], 1, None]
    assert kind == "string"
    if "pattern" in schema:  # an exchange name
        return ["a", "a" * schema["maxLength"]], ["", "a" * (schema["maxLength"] + 1), "a b", 1]
    return ["", "k"], [1, None]


def test_documented_ranges_are_the_ones_the_broker_checks(server: LiveServer) -> None:
    """Each documented argument's edges parse, and one step past them is the 422 naming it;
    a property's ``dependentRequired`` companions are what the parser needs with it."""
    doc = httpx.get(f"{server.base_url}/openapi.json").json()
    for body, parse in (
        ("QueueDeclare", parse_queue_arguments),
        ("ExchangeDeclare", parse_exchange_arguments),
    ):
        schema = _arguments_schema(doc, body)
        needs = schema.get("dependentRequired", {})
        for key, prop in schema["properties"].items():
            companions = {other: "e" for other in needs.get(key, [])}
            valid, invalid = _valid_and_invalid(prop)
            for value in valid:
                parse({key: value, **companions})
                if companions:
                    with pytest.raises(ValidationFailed, match=key):
                        parse({key: value})
            for value in invalid:
                with pytest.raises(ValidationFailed) as caught:
                    parse({key: value, **companions})
                assert caught.value.errors[0]["loc"] == ["body", "arguments", key], (key, value)


#: (path, body, whether the broker takes it). Not here: what the schema says in words only,
#: an integral float such as 1.0 (§12) and a length limit above 2**63 - 1.
DECLARES: list[tuple[str, dict[str, Any], bool]] = [
    ("/queues/a", {"arguments": {"x-max-length": 5, "x-overflow": "reject-publish"}}, True),
    ("/queues/b", {"arguments": {"x-custom": [1, {"k": None}], "x-queue-type": "quorum"}}, True),
    ("/queues/c", {"arguments": {"x-max-length": -1}}, False),
    ("/queues/c", {"arguments": {"x-overflow": "drop-tail"}}, False),
    ("/queues/c", {"arguments": {"x-expires": 999}}, False),
    ("/queues/c", {"arguments": {"x-max-priority": 256}}, False),
    ("/queues/c", {"arguments": {"x-single-active-consumer": 1}}, False),
    ("/queues/c", {"arguments": {"x-dead-letter-exchange": "no such name!"}}, False),
    ("/queues/c", {"arguments": {"x-dead-letter-routing-key": "k"}}, False),
    (
        "/queues/d",
        {"arguments": {"x-dead-letter-exchange": "amq.direct", "x-dead-letter-routing-key": "k"}},
        True,
    ),
    (
        "/queues/c",
        {"dead_letter_queue": "d", "arguments": {"x-dead-letter-exchange": "amq.direct"}},
        False,
    ),
    (
        "/queues/e",
        {"dead_letter_queue": None, "arguments": {"x-dead-letter-exchange": "amq.direct"}},
        True,
    ),
    ("/exchanges/f", {"type": "direct", "arguments": {"alternate-exchange": "amq.fanout"}}, True),
    ("/exchanges/g", {"type": "direct", "arguments": {"alternate-exchange": "a b"}}, False),
]


def test_declare_schemas_refuse_what_the_broker_refuses(
    server: LiveServer, admin: httpx.Client
) -> None:
    """A declare body the document's schema allows is taken; one it refuses is the broker's
    own 422 naming the argument (the domain checks, not a model: its problem+json)."""
    doc = httpx.get(f"{server.base_url}/openapi.json").json()
    validators = {
        kind: jsonschema_rs.Draft202012Validator(
            {"$ref": f"#/components/schemas/{body}", "components": doc["components"]}
        )
        for kind, body in (("queues", "QueueDeclare"), ("exchanges", "ExchangeDeclare"))
    }
    for path, body, taken in DECLARES:
        assert validators[path.split("/")[1]].is_valid(body) is taken, body
        r = admin.put(path, json=body)
        if taken:
            assert r.status_code == 201, (body, r.text)
            continue
        problem = assert_problem(r, 422, "validation_error")
        (key,) = problem["errors"][0]["loc"][2:]
        assert problem["detail"].startswith(f"arguments.{key}: "), problem
    assert admin.get("/queues/c").status_code == 404
    assert admin.get("/exchanges/g").status_code == 404
