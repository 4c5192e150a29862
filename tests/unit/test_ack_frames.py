"""The plain-ACK shortcut of app.api.ws.frames.parse agrees with the models.

Whatever frame the shortcut takes must be the ACK the models make of it (same tags, no id),
and anything the models refuse must reach the models, so that the client gets their error.
Generated frames vary the whitespace, the keys, their order, the tag's characters and length.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.api.schemas.common import MAX_ACK_TAGS, MAX_TAG
from app.api.ws import frames
from app.errors import BadFrame

TAG = "123456.0123456789abcdef0123456789abcdef"

blank = st.text(alphabet=" \t\n\r\x0b\x0c\xa0", max_size=3)
tag_text = st.one_of(
    st.text(max_size=MAX_TAG + 2),
    st.sampled_from(["", TAG, "x" * MAX_TAG, "x" * (MAX_TAG + 1), 'a"b', "a\\b", "é"]),
)


def outcome(
    parse: Callable[[str], tuple[Any, str | int | None]], text: str
) -> tuple[list[str], str | int | None] | str:
    """What ``parse`` makes of a frame: an ACK's tags and id, another frame's kind, or the
    error's message."""
    try:
        frame, frame_id = parse(text)
    except BadFrame as exc:
        return str(exc)
    if isinstance(frame, frames.AckFrame | frames.PlainAck | frames.PlainAcks):
        return frame.tags, frame_id
    return type(frame).__name__


@st.composite
def tag_json(draw: st.DrawFn) -> str:
    tag = draw(tag_text)
    escaped = draw(st.booleans())
    return json.dumps(tag, ensure_ascii=escaped) if draw(st.booleans()) else f'"{tag}"'


@st.composite
def ack_frames(draw: st.DrawFn) -> str:
    """An ACK of one tag (``delivery_tag``) or of a list (``delivery_tags``: empty, one,
    several, or one more than allowed), near the form a consumer sends."""
    if draw(st.booleans()):
        field = f'"delivery_tag"{draw(blank)}:{draw(tag_json())}'
    else:
        count = draw(st.sampled_from([0, 1, 2, 5, MAX_ACK_TAGS + 1]))
        tags = [draw(tag_json()) for _ in range(min(count, 5))]
        tags += [f'"t{i}"' for i in range(count - len(tags))]
        inside = f"{draw(blank)},{draw(blank)}".join(tags)
        field = f'"delivery_tags"{draw(blank)}:{draw(blank)}[{draw(blank)}{inside}{draw(blank)}]'
    keys = [f'"type"{draw(blank)}:{draw(blank)}"ACK"', field]
    if draw(st.booleans()):
        keys.reverse()
    if draw(st.booleans()):
        keys.append('"id":' + draw(st.sampled_from(["1", '"x"', "null", "1.5"])))
    inner = f"{draw(blank)},{draw(blank)}".join(keys)
    return f"{draw(blank)}{{{draw(blank)}{inner}{draw(blank)}}}{draw(blank)}"


@settings(max_examples=400, deadline=None)
@given(ack_frames())
def test_the_shortcut_takes_only_what_the_models_take_and_reads_it_the_same(text: str) -> None:
    assert outcome(frames.parse, text) == outcome(frames.parse_with_models, text)


@pytest.mark.parametrize(
    "text",
    [
        f'{{"type":"ACK","delivery_tag":"{TAG}"}}',
        f'{{ "type": "ACK", "delivery_tag": "{TAG}" }}\n',
        '{"type":"ACK","delivery_tag":"' + "x" * MAX_TAG + '"}',
    ],
)
def test_the_plain_ack_a_consumer_sends_takes_the_shortcut(text: str) -> None:
    frame, frame_id = frames.parse(text)
    assert isinstance(frame, frames.PlainAck)
    assert frame_id is None
    assert frame.tags == [json.loads(text)["delivery_tag"]]


@pytest.mark.parametrize(
    "text",
    [
        f'{{"type":"ACK","delivery_tags":["{TAG}"]}}',
        f'{{ "type": "ACK", "delivery_tags": [ "{TAG}", "{TAG}x" ] }}\n',
        '{"type":"ACK","delivery_tags":[' + ",".join(['"t"'] * MAX_ACK_TAGS) + "]}",
    ],
)
def test_the_grouped_ack_a_consumer_sends_takes_the_shortcut(text: str) -> None:
    frame, frame_id = frames.parse(text)
    assert isinstance(frame, frames.PlainAcks)
    assert frame_id is None
    assert frame.tags == json.loads(text)["delivery_tags"]
    assert frame == frames.parse_with_models(text)[0]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"type":"ACK","delivery_tag":""}', "at least 1 character"),
        ('{"type":"ACK","delivery_tag":"' + "x" * (MAX_TAG + 1) + '"}', "at most 128"),
        ('{"type":"ACK","delivery_tag":"a"} x', "not valid JSON"),
        ('{"type":"ACK","delivery_tag":"a\x01"}', "not valid JSON"),
        ('{"type":"ACK","delivery_tags":[]}', "at least 1 item"),
        ('{"type":"ACK","delivery_tags":[""]}', "at least 1 character"),
        ('{"type":"ACK","delivery_tags":[' + ",".join(['"t"'] * 1001) + "]}", "at most 1000"),
    ],
)
def test_what_the_shortcut_leaves_gets_the_models_error(text: str, error: str) -> None:
    with pytest.raises(BadFrame, match=error):
        frames.parse(text)


def test_an_ack_with_an_id_goes_through_the_models_and_keeps_its_id() -> None:
    frame, frame_id = frames.parse(f'{{"type":"ACK","delivery_tag":"{TAG}","id":7}}')
    assert isinstance(frame, frames.AckFrame)
    assert frame_id == 7
