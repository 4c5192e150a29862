"""The plain-ACK shortcut of app/api/ws/frames.parse (one tag or several) gives exactly what
the TypeAdapter does."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from app.api.ws import frames
from app.errors import BadFrame

TAG = "12." + "a" * 32

CASES: list[Any] = [
    {"type": "ACK", "delivery_tag": TAG},
    {"type": "ACK", "delivery_tag": TAG, "id": "a-1"},
    {"type": "ACK", "delivery_tag": TAG, "id": 7},
    {"type": "ACK", "delivery_tag": TAG, "id": None},
    {"type": "ACK", "delivery_tag": TAG, "id": True},
    {"type": "ACK", "delivery_tag": TAG, "id": 1.5},
    {"type": "ACK", "delivery_tag": TAG, "id": "x" * 65},
    {"type": "ACK", "delivery_tag": "t" * 128},
    {"type": "ACK", "delivery_tag": "t" * 129},
    {"type": "ACK", "delivery_tag": ""},
    {"type": "ACK", "delivery_tag": 12},
    {"type": "ACK", "delivery_tag": None},
    {"type": "ACK"},
    {"type": "ACK", "delivery_tag": TAG, "requeue": True},
    {"type": "ACK", "delivery_tag": "é€😀"},
    {"type": "ACK", "delivery_tags": [TAG, "t" * 128]},
    {"type": "ACK", "delivery_tags": [TAG], "id": "m"},
    {"type": "ACK", "delivery_tags": [TAG], "id": False},
    {"type": "ACK", "delivery_tags": ["t"] * 1000},
    {"type": "ACK", "delivery_tags": ["t"] * 1001},
    {"type": "ACK", "delivery_tags": []},
    {"type": "ACK", "delivery_tags": [TAG, ""]},
    {"type": "ACK", "delivery_tags": [TAG, None]},
    {"type": "ACK", "delivery_tags": [TAG, "t" * 129]},
    {"type": "ACK", "delivery_tags": TAG},
    {"type": "ACK", "delivery_tags": None},
    {"type": "ACK", "delivery_tags": [TAG], "delivery_tag": TAG},
    {"type": "ACK", "delivery_tags": [TAG], "requeue": False},
]


def _slow(raw: Any) -> tuple[Any, Any]:
    """What the TypeAdapter alone makes of it: (frame dump, id) or the BadFrame's text."""
    frame_id = frames.frame_id_of(raw)
    try:
        return frames.FRAME.validate_python(raw).model_dump(), frame_id
    except Exception:
        return "BadFrame", frame_id


@pytest.mark.parametrize("raw", CASES, ids=range(len(CASES)))
def test_plain_ack_shortcut_matches_the_type_adapter(raw: Any) -> None:
    try:
        frame, frame_id = frames.parse(orjson.dumps(raw))
        fast: tuple[Any, Any] = (frame.model_dump(), frame_id)
    except BadFrame as exc:
        fast = ("BadFrame", exc.extra.get("frame_id"))
    assert fast == _slow(raw)
    if fast[0] != "BadFrame":
        assert isinstance(frame, frames.AckFrame)
