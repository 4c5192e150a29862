"""OpenTelemetry spans for publish, delivery and settlement (issue 24; optional).

Off unless ``MESSAGEX_TRACING=true``, and then it needs the ``messagex[otel]`` extra (the SDK
and the OTLP exporter; the API comes with FastAPI). Off, nothing here imports OpenTelemetry
and the broker's hot paths test one attribute for ``None``. The spans follow the
OpenTelemetry messaging semantic conventions (``messaging.system = "messagex"``):

- ``publish {exchange}`` (PRODUCER, ``messaging.operation.type = send``), one per publish call,
  a child of the caller's current context. A message that carries no ``traceparent`` gets
  this span's context in its headers; one that carries its own (its producer's span, from the
  HTTP header or the message headers) keeps it and the span links to it.
- ``receive {queue}`` (CONSUMER, ``receive``), one per delivery (WebSocket or pull), linked
  to the message's ``traceparent``: the consumer's span is linked to the producer's.
- ``ack {queue}`` / ``nack {queue}`` (``settle``), one per settlement the broker applies for
  a consumer, a child of that delivery's ``receive`` span when this process delivered it
  (a bounded map of delivery tag → span context; a pull delivery settled through another
  process has no parent).

Spans go to the global tracer provider. When the application has not set one (``messagex
serve``), an SDK provider with the OTLP/HTTP exporter is installed, configured by the
standard ``OTEL_*`` variables (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME``, ...).
"""

from __future__ import annotations

import dataclasses
import os
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from app import __version__
from app.domain.model import OutgoingMessage
from app.domain.tracecontext import TRACEPARENT, TRACESTATE, valid_traceparent

#: delivery tags whose receive span context is kept for their settlement's span
REMEMBERED_DELIVERIES = 65_536
SYSTEM = "messagex"


class Tracing:
    """The broker's spans. Built by ``load_tracing`` only when tracing is on."""

    def __init__(self, tracer_provider: Any = None) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._trace = trace
        self._tracer = trace.get_tracer("messagex", __version__, tracer_provider=tracer_provider)
        self._propagator = TraceContextTextMapPropagator()
        self._delivered: OrderedDict[str, Any] = OrderedDict()

    def _link(self, headers: Any) -> list[Any]:
        """A link to the span context a message's ``traceparent`` names, if valid."""
        if not isinstance(headers, dict) or not valid_traceparent(headers.get(TRACEPARENT)):
            return []
        carrier = {TRACEPARENT: headers[TRACEPARENT]}
        if isinstance(headers.get(TRACESTATE), str):
            carrier[TRACESTATE] = headers[TRACESTATE]
        ctx = self._trace.get_current_span(self._propagator.extract(carrier)).get_span_context()
        return [self._trace.Link(ctx)] if ctx.is_valid else []

    @contextmanager
    def publishing(
        self, destination: str, messages: Sequence[OutgoingMessage]
    ) -> Iterator[Sequence[OutgoingMessage]]:
        """The ``publish`` span around a publish call; yields the messages to publish (those
        without a trace context carry the span's)."""
        links = [link for m in messages for link in self._link(m.headers)]
        with self._tracer.start_as_current_span(
            f"publish {destination}",
            kind=self._trace.SpanKind.PRODUCER,
            links=links,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "send",
                "messaging.operation.name": "publish",
                "messaging.destination.name": destination,
                "messaging.batch.message_count": len(messages),
            },
        ) as span:
            carrier: dict[str, str] = {}
            self._propagator.inject(carrier)
            yield [
                m
                if TRACEPARENT in m.headers
                else dataclasses.replace(m, headers={**m.headers, **carrier}, stored_json=None)
                for m in messages
            ]
            span.set_attribute("messaging.message.id", messages[0].message_id)

    def delivered(self, queue: str, deliveries: Iterable[Any]) -> None:
        """One ``receive`` span per delivery (each has ``headers``, ``message_id``,
        ``delivery_tag`` and ``delivery_count``); remembers each for its settlement."""
        for item in deliveries:
            headers = item.headers
            if isinstance(headers, (bytes, str)):  # raw JSON as stored
                headers = _headers_of(headers)
            span = self._tracer.start_span(
                f"receive {queue}",
                kind=self._trace.SpanKind.CONSUMER,
                links=self._link(headers),
                attributes={
                    "messaging.system": SYSTEM,
                    "messaging.operation.type": "receive",
                    "messaging.operation.name": "deliver",
                    "messaging.destination.name": queue,
                    "messaging.message.id": item.message_id,
                    "messaging.messagex.delivery_count": item.delivery_count,
                },
            )
            span.end()
            self._remember(item.delivery_tag, queue, span.get_span_context())

    def _remember(self, tag: str, queue: str, ctx: Any) -> None:
        delivered = self._delivered
        delivered[tag] = (queue, ctx)
        if len(delivered) > REMEMBERED_DELIVERIES:
            delivered.popitem(last=False)

    def settled(self, operation: str, tags: Iterable[str], outcome: str | None = None) -> None:
        """One ``ack``/``nack`` span per settled delivery tag."""
        for tag in tags:
            queue, ctx = self._delivered.pop(tag, (None, None))
            parent = None
            if ctx is not None:
                parent = self._trace.set_span_in_context(self._trace.NonRecordingSpan(ctx))
            attributes: dict[str, Any] = {
                "messaging.system": SYSTEM,
                "messaging.operation.type": "settle",
                "messaging.operation.name": operation,
            }
            if queue is not None:
                attributes["messaging.destination.name"] = queue
            if outcome is not None:
                attributes["messaging.messagex.outcome"] = outcome
            span = self._tracer.start_span(
                f"{operation} {queue}" if queue else operation,
                context=parent,
                kind=self._trace.SpanKind.INTERNAL,
                attributes=attributes,
            )
            span.end()


def _headers_of(raw: bytes | str) -> Any:
    import orjson

    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def load_tracing(enabled: bool, tracer_provider: Any = None) -> Tracing | None:
    """The broker's ``Tracing``, or None when tracing is off. Raises ImportError (with what
    to install) when it is on without the ``messagex[otel]`` extra."""
    if not enabled:
        return None
    try:
        from opentelemetry import trace

        if tracer_provider is None and _unset(trace.get_tracer_provider()):
            _install_sdk_provider()
    except ImportError:
        raise ImportError(
            "MESSAGEX_TRACING=true needs the OpenTelemetry SDK and OTLP exporter: "
            "pip install 'messagex[otel]'"
        ) from None
    return Tracing(tracer_provider)


def _unset(provider: Any) -> bool:
    from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider

    return isinstance(provider, (ProxyTracerProvider, NoOpTracerProvider))


def _install_sdk_provider() -> None:
    """An SDK provider exporting over OTLP/HTTP, configured by the ``OTEL_*`` variables."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "messagex")})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
