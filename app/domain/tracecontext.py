"""W3C trace context (https://www.w3.org/TR/trace-context/) carried by messages.

A publish may give ``traceparent`` (and ``tracestate``) as HTTP headers or in the message's
own headers; either way they travel in the message's headers, so every delivery of it (and
every dead-lettered copy) carries them. Headers the message already has win over the HTTP
request's; an invalid ``traceparent`` is not copied (the W3C rule: ignore it).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from app.domain.model import OutgoingMessage

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

# version "00" (and, read as 00, any later version but "ff"), 32 hex trace id not all zeros,
# 16 hex parent id not all zeros, 2 hex flags
_TRACEPARENT = re.compile(
    r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}(-.*)?"
)
#: tracestate: at most 32 list members, 512 characters is what W3C asks vendors to keep
MAX_TRACESTATE = 512


def valid_traceparent(value: object) -> bool:
    if not isinstance(value, str) or len(value) < 55:
        return False
    match = _TRACEPARENT.fullmatch(value)
    # version 00 has exactly four fields
    return match is not None and (value[:2] != "00" or match.group(1) is None)


def with_trace_context(
    messages: Sequence[OutgoingMessage], traceparent: str | None, tracestate: str | None
) -> Sequence[OutgoingMessage]:
    """``messages`` with the request's trace context in the headers of those that carry none.

    Returns ``messages`` itself when there is nothing to add (the common case costs nothing).
    """
    if not valid_traceparent(traceparent):
        return messages
    extra = {TRACEPARENT: traceparent}
    if tracestate and len(tracestate) <= MAX_TRACESTATE:
        extra[TRACESTATE] = tracestate
    return [
        m
        if TRACEPARENT in m.headers
        else dataclasses.replace(m, headers={**m.headers, **extra}, stored_json=None)
        for m in messages
    ]
