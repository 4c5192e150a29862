"""Every shortcut of the hot paths agrees with its models (app.api.shortcut.FastDecoder).

One property for all of them: on generated input — valid, nearly valid and invalid — a
decoder's two forms together (``decode``: the shortcut, else the models) give the same result
as the models alone, or the same error. So whatever a shortcut answers is exactly what the
models make of it, and what the models refuse the shortcut leaves to them. A decoder made
without inputs to try here fails the test below it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from app.api.schemas import messages
from app.api.shortcut import FastDecoder
from app.api.ws import frames
from app.errors import BrokerError
from tests.unit.test_ack_frames import TAG, ack_frames
from tests.unit.test_publish_decoding import item, json_value

_FRAME_TYPES = ["AUTH", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK", "PUBLISH", "PING", "ack", ""]
_FRAME_KEYS = ["type", "id", "delivery_tag", "delivery_tags", "queue", "prefetch", "body"]

#: any JSON object that looks more or less like a frame
frame_objects = st.dictionaries(
    st.sampled_from(_FRAME_KEYS),
    st.one_of(st.sampled_from(_FRAME_TYPES), st.just([TAG]), st.just(TAG), json_value),
    max_size=4,
)
frame_messages = st.one_of(
    ack_frames(),  # near the plain ACK: whitespace, key order, ids, escapes, tag lengths
    frame_objects.map(json.dumps),
    st.text(max_size=30),  # not JSON, mostly
    ack_frames().map(str.encode),  # a binary message holding a plain ACK
    st.binary(max_size=30),
)
publish_batches = st.one_of(
    st.fixed_dictionaries({"messages": st.lists(item, max_size=4)}),
    st.fixed_dictionaries({"messages": st.lists(st.just({"body": 1}), min_size=1, max_size=3)}),
    st.fixed_dictionaries({"messages": json_value, "extra": json_value}),
    st.sampled_from([{"messages": [{"body": 1}] * (messages.MAX_BATCH + 1)}, [], None]),
    json_value,
)

#: inputs for each decoder, by its name
INPUTS: dict[str, st.SearchStrategy[Any]] = {
    messages.PUBLISH.name: st.one_of(item, json_value),
    messages.PUBLISH_BATCH.name: publish_batches,
    frames.FRAMES.name: frame_messages,
}

#: an input each shortcut must take (so a shortcut that always gave up would be noticed)
COMMON: dict[str, Any] = {
    messages.PUBLISH.name: {"body": {"a": 1}, "routing_key": "k"},
    messages.PUBLISH_BATCH.name: {"messages": [{"body": 1}, {"body_base64": "AA=="}]},
    frames.FRAMES.name: f'{{"type":"ACK","delivery_tag":"{TAG}"}}',
}


def outcome(decode: Callable[[Any], Any], raw: Any) -> tuple[Any, ...]:
    """What ``decode`` makes of ``raw``: its result, or its error as a client would see it."""
    try:
        return ("result", decode(raw))
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        return ("error", type(exc), errors)
    except BrokerError as exc:
        return ("error", type(exc), exc.message, exc.extra)


def test_every_shortcut_is_tried_here() -> None:
    assert sorted(d.name for d in FastDecoder.ALL) == sorted(INPUTS)
    assert sorted(INPUTS) == sorted(COMMON)


@pytest.mark.parametrize("decoder", FastDecoder.ALL, ids=lambda d: d.name)
@settings(max_examples=800, deadline=None)
@given(data=st.data())
def test_both_forms_give_the_same_result_or_the_same_error(
    decoder: FastDecoder[Any, Any], data: st.DataObject
) -> None:
    raw = data.draw(INPUTS[decoder.name], label="input")
    assert outcome(decoder.decode, raw) == outcome(decoder.model, raw)


@pytest.mark.parametrize("decoder", FastDecoder.ALL, ids=lambda d: d.name)
def test_the_common_form_takes_the_shortcut(decoder: FastDecoder[Any, Any]) -> None:
    raw = COMMON[decoder.name]
    fast = decoder.fast(raw)
    assert fast is not None
    assert fast == decoder.model(raw)
