"""How a delivery looks on the wire: MESSAGE_DELIVERED frames and pull results alike."""

from __future__ import annotations

from typing import Any

import orjson

from app.api.codec import body_fields, rfc3339
from app.domain.model import Delivery as Claimed


def delivery_fields(queue: str, item: Claimed, *, raw_json: bool = False) -> dict[str, Any]:
    """The fields of a MESSAGE_DELIVERED frame (without ``type``) or of a pulled message, built
    as one dict: this runs once per delivery."""
    if raw_json and not item.binary:
        body_key, body = "body", orjson.Fragment(item.body)  # what body_fields would give
    else:
        [(body_key, body)] = body_fields(item.body, item.binary, raw_json=raw_json).items()
    return {
        "queue": queue,
        "exchange": item.exchange,
        "routing_key": item.routing_key,
        body_key: body,
        "headers": item.headers,
        "properties": item.properties,
        "message_id": item.message_id,
        "delivery_tag": item.delivery_tag,
        "delivery_count": item.delivery_count,
        "redelivered": item.delivery_count > 1,
        "created_at": rfc3339(item.created_at),
    }
