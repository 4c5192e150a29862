"""The OpenAPI document: committed, identical to what the app serves, complete."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

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
