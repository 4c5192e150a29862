"""How a delivery looks on the wire: MESSAGE_DELIVERED frames and pull results alike."""

from __future__ import annotations

from typing import Any

from app.api.codec import body_field, json_field, rfc3339
from app.domain.model import Delivery as Claimed


def delivery_fields(queue: str, item: Claimed, *, raw_json: bool = False) -> dict[str, Any]:
    """The fields of a MESSAGE_DELIVERED frame (without ``type``) or of a pulled message, built
    as one dict: this runs once per delivery."""
    body_key, body = body_field(item.body, item.binary, raw_json=raw_json)
    return {
        "queue": queue,
        "exchange": item.exchange,
        "routing_key": item.routing_key,
        body_key: body,
        "headers": json_field(item.headers, raw_json=raw_json),
        "properties": json_field(item.properties, raw_json=raw_json),
        "message_id": item.message_id,
        "delivery_tag": item.delivery_tag,
        "delivery_count": item.delivery_count,
        "redelivered": item.delivery_count > 1,
        "created_at": rfc3339(item.created_at),
    }
