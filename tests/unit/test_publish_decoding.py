"""The publish hot path (app.api.schemas.messages.fast_decode_publish) agrees with the models.

Whatever the shortcut accepts must become exactly the message the pydantic models make of it,
and whatever the models refuse the shortcut must refuse too (give up, so the models raise the
error). Generated bodies mix valid and invalid keys, types and strings.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from app.api.schemas.messages import (
    MAX_BATCH,
    PublishBatch,
    PublishBody,
    decode_publish,
    decode_publish_batch,
    fast_decode_publish,
)
from app.domain.model import MAX_DELAY_MS, OutgoingMessage

text = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["", "a\x00b", "\ud800", "é", "order.created"]),
)
json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    text,
)
json_value = st.recursive(
    json_scalar,
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(text, children, max_size=3)
    ),
    max_leaves=8,
)
loose = st.one_of(json_value, st.just(True), st.just(0))
properties = st.one_of(
    st.dictionaries(
        st.sampled_from(["message_id", "correlation_id", "reply_to", "content_type", "other"]),
        st.one_of(st.none(), text, st.integers()),
        max_size=4,
    ),
    loose,
)
item = st.fixed_dictionaries(
    {},
    optional={
        "routing_key": st.one_of(text, loose),
        "body": json_value,
        "body_base64": st.one_of(st.sampled_from(["", "AA==", "AAA", "+/8=", "!!"]), loose),
        "headers": st.one_of(st.dictionaries(text, json_value, max_size=3), loose),
        "properties": properties,
        "delay_ms": st.one_of(
            st.integers(min_value=-1, max_value=MAX_DELAY_MS + 1),
            st.sampled_from([0, 1.0, True, "5", None]),
        ),
        "mandatory": st.one_of(st.booleans(), st.sampled_from([0, 1, "true", None])),
        "unknown": json_value,
    },
)


def by_models(payload: Any) -> OutgoingMessage | None:
    try:
        return PublishBody.model_validate(payload).to_outgoing()
    except ValidationError:
        return None


@settings(max_examples=1500, deadline=None)
@given(item)
def test_the_shortcut_accepts_only_what_the_models_accept_and_makes_the_same_message(
    payload: dict[str, Any],
) -> None:
    fast = fast_decode_publish(payload)
    if fast is not None:
        assert by_models(payload) == fast


@pytest.mark.parametrize(
    "payload",
    [
        {"body": {"a": 1}},
        {"routing_key": "k", "body": None, "headers": {"x": [1, "é"]}, "delay_ms": 5},
        {"body_base64": "AAE=", "mandatory": True},
        {"body": "x", "properties": {"message_id": "m", "correlation_id": "c", "reply_to": None}},
        {"body": 2**80},
    ],
)
def test_the_common_forms_take_the_shortcut(payload: dict[str, Any]) -> None:
    fast = fast_decode_publish(payload)
    assert fast is not None
    assert fast == by_models(payload)


@pytest.mark.parametrize(
    ("payload", "loc"),
    [
        ({"body": 1, "body_base64": "AA=="}, ("body",)),
        ({}, ("body",)),
        ({"body": 1, "delay_ms": True}, ("delay_ms",)),
        ({"body": 1, "properties": {"message_id": ""}}, ("properties", "message_id")),
        ({"body": 1, "routing_key": "a\x00"}, ("routing_key",)),
        ({"body": 1, "extra": 1}, ("extra",)),
        ({"body": float("nan")}, ("body",)),
    ],
)
def test_what_the_shortcut_gives_up_on_gets_the_models_error(
    payload: dict[str, Any], loc: tuple[str, ...]
) -> None:
    with pytest.raises(ValidationError) as raised:
        decode_publish(payload)
    assert raised.value.errors()[0]["loc"] == loc


def test_a_batch_is_decoded_in_order_and_a_bad_item_gets_its_index() -> None:
    items = [{"body": i, "routing_key": str(i)} for i in range(5)]
    messages = decode_publish_batch({"messages": items})
    assert [m.routing_key for m in messages] == ["0", "1", "2", "3", "4"]
    assert messages == [
        m.to_outgoing() for m in PublishBatch.model_validate({"messages": items}).messages
    ]
    items[3] = {"body": 1, "delay_ms": -1}
    with pytest.raises(ValidationError) as raised:
        decode_publish_batch({"messages": items})
    assert raised.value.errors()[0]["loc"] == ("messages", 3, "delay_ms")
    bad: object
    for bad in ({"messages": []}, {"messages": [{"body": 1}] * (MAX_BATCH + 1)}, [], None):
        with pytest.raises(ValidationError):
            decode_publish_batch(bad)
