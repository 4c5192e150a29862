"""Trace context (issue 24): a publish's traceparent reaches every delivery; with
MESSAGEX_TRACING and the otel extra the broker emits linked publish/receive/settle spans."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind

from tests.support import ADMIN_PASSWORD, ADMIN_USER, LiveServer, client, running_server, wait_for
from tests.support import test_settings as settings_for
from tests.wsclient import WsClient, declare_queue

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
STATE = "congo=t61rcWkgMzE"

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    """The process's tracer provider (set once; other tests never trace)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    return _EXPORTER


@pytest.fixture
def traced(database_url: str, exporter: InMemorySpanExporter) -> Iterator[LiveServer]:
    with running_server(settings_for(database_url, tracing=True)) as live:
        exporter.clear()
        yield live


def _admin(live: LiveServer) -> httpx.Client:
    return client(live.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD))


def _ctx(span: Any) -> SpanContext:
    ctx = span.get_span_context()
    assert isinstance(ctx, SpanContext)
    return ctx


def _attr(span: ReadableSpan, key: str) -> Any:
    return dict(span.attributes or {}).get(key)


def _traceparent(span: Any) -> str:
    ctx = _ctx(span)
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01"


def _spans(exporter: InMemorySpanExporter, name: str, count: int) -> list[ReadableSpan]:
    found: list[ReadableSpan] = []

    def enough() -> bool:
        found[:] = [s for s in exporter.get_finished_spans() if s.name == name]
        return len(found) >= count

    wait_for(enough, timeout=10, message=f"{count} {name!r} spans")
    return found


def test_http_traceparent_reaches_websocket_and_pull_deliveries(
    server: LiveServer, admin: httpx.Client
) -> None:
    declare_queue(admin, "traced-ws")
    declare_queue(admin, "traced-pull")
    for r in (
        # the edge's fast path, and a body it leaves to the route (a priority property)
        admin.post(
            "/queues/traced-ws/messages",
            json={"body": 1},
            headers={"traceparent": PARENT, "tracestate": STATE},
        ),
        admin.post(
            "/queues/traced-pull/messages",
            json={"body": 2, "properties": {"priority": 3}},
            headers={"traceparent": PARENT},
        ),
        # the message's own trace context wins; an invalid header is ignored
        admin.post(
            "/queues/traced-pull/messages",
            json={"body": 3, "headers": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-00"}},
            headers={"traceparent": PARENT},
        ),
        admin.post("/queues/traced-pull/messages", json={"body": 4}, headers={"traceparent": "x"}),
    ):
        assert r.status_code == 200, r.text
    with WsClient.admin(server.ws_url) as ws:
        ws.subscribe("traced-ws")
        headers = ws.delivery()["headers"]
    assert headers == {"traceparent": PARENT, "tracestate": STATE}
    got = admin.post("/queues/traced-pull/get", json={"max_messages": 10}).json()["messages"]
    assert [m["headers"].get("traceparent") for m in got] == [
        PARENT,
        "00-" + "1" * 32 + "-" + "2" * 16 + "-00",
        None,
    ]


def test_spans_link_consumer_to_producer_and_settlement_to_delivery(
    traced: LiveServer, exporter: InMemorySpanExporter
) -> None:
    producer = trace.get_tracer("test").start_span("order service", kind=SpanKind.PRODUCER)
    producer.end()
    with _admin(traced) as admin, WsClient.admin(traced.ws_url) as ws:
        declare_queue(admin, "spans")
        ws.subscribe("spans", 2)
        r = admin.post(
            "/queues/spans/messages",
            json={"body": "given"},
            headers={"traceparent": _traceparent(producer)},
        )
        assert r.status_code == 200, r.text
        assert admin.post("/queues/spans/messages", json={"body": "none"}).status_code == 200
        first, second = ws.deliveries_n(2)
        ws.ack(first["delivery_tag"])
        ws.nack(second["delivery_tag"], requeue=False)
    publishes = _spans(exporter, "publish spans", 2)
    receives = _spans(exporter, "receive spans", 2)
    acks = _spans(exporter, "ack spans", 1)
    nacks = _spans(exporter, "nack spans", 1)
    assert all(s.kind == SpanKind.PRODUCER for s in publishes)
    assert all(s.kind == SpanKind.CONSUMER for s in receives)
    assert {_attr(s, "messaging.system") for s in publishes + receives} == {"messagex"}
    # a message with a trace context keeps it; the publish span links to it
    assert first["headers"]["traceparent"] == _traceparent(producer)
    given = next(s for s in publishes if s.links)
    assert given.links[0].context.span_id == _ctx(producer).span_id
    # a message without one carries the broker's publish span's
    plain = next(s for s in publishes if not s.links)
    assert second["headers"]["traceparent"][:-3] == _traceparent(plain)[:-3]  # flags aside
    # each receive span links to the producer side of its message
    linked = {s.links[0].context.span_id for s in receives}
    assert linked == {_ctx(producer).span_id, _ctx(plain).span_id}
    # settlement spans are children of their delivery's receive span
    receive_ids = {_ctx(s).span_id for s in receives}
    assert acks[0].parent is not None
    assert acks[0].parent.span_id in receive_ids
    assert _attr(nacks[0], "messaging.messagex.outcome") in {"dead", "discarded"}


def test_pull_deliveries_and_acks_are_traced(
    traced: LiveServer, exporter: InMemorySpanExporter
) -> None:
    with _admin(traced) as admin:
        declare_queue(admin, "pulled")
        assert admin.post("/queues/pulled/messages", json={"body": 1}).status_code == 200
        (message,) = admin.post("/queues/pulled/get", json={}).json()["messages"]
        assert admin.post(f"/deliveries/{message['delivery_tag']}/ack").status_code == 204
    (receive,) = _spans(exporter, "receive pulled", 1)
    (ack,) = _spans(exporter, "ack pulled", 1)
    assert ack.parent is not None
    assert ack.parent.span_id == _ctx(receive).span_id


BLOCK_OPENTELEMETRY = """
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter")):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Absent())
"""


def test_the_broker_runs_without_the_otel_extra(database_url: str) -> None:
    """As if the extra (the SDK and the OTLP exporter) were not installed: tracing off works;
    on, it says what to install. (opentelemetry-api comes with FastAPI itself.)"""
    code = BLOCK_OPENTELEMETRY + (
        "from fastapi.testclient import TestClient\n"
        "from app.main import create_app\n"
        "from tests.support import test_settings\n"
        "url = 'http://127.0.0.1'\n"
        f"with TestClient(create_app(test_settings({database_url!r})), base_url=url) as c:\n"
        "    assert c.get('/healthz').status_code == 200\n"
        "try:\n"
        f"    with TestClient(create_app(test_settings({database_url!r}, tracing=True))):\n"
        "        pass\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "pip install 'messagex[otel]'" in out.stdout
