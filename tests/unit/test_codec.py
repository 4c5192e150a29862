"""app.api.codec: bodies in and out, for every transport. No database."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta, timezone

import orjson
import pytest

from app.api import codec
from app.domain.model import BrowseStatus, StoredMessage

BIG = 2**70 + 1  # beyond 64 bits: orjson can neither write nor read it exactly


def stored(body: bytes, binary: bool, **extra: object) -> StoredMessage:
    values: dict[str, object] = {
        "id": 7,
        "queue": "q",
        "message_id": "m-1",
        "status": BrowseStatus.READY,
        "exchange": "x",
        "routing_key": "k",
        "headers": {"h": 1},
        "properties": {"message_id": "m-1"},
        "body": body,
        "binary": binary,
        "delivery_count": 2,
        "created_at": datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
        "available_at": datetime(2026, 1, 2, 3, 4, 6, tzinfo=UTC),
    }
    values.update(extra)
    return StoredMessage(**values)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- encode_body


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, b"null"),
        ({"a": [1, 2.5, "é", True]}, '{"a":[1,2.5,"é",true]}'.encode()),
        ("text", b'"text"'),
        (0, b"0"),
        ([], b"[]"),
    ],
)
def test_json_body_is_compact_utf8_json(value: object, expected: bytes) -> None:
    assert codec.encode_body(body=value) == (expected, False)


def test_json_body_keeps_big_integers_exact() -> None:
    data, binary = codec.encode_body(body={"n": BIG, "m": -(2**64)})
    assert not binary
    assert json.loads(data) == {"n": BIG, "m": -(2**64)}


def test_json_body_deeper_than_orjson_allows_is_still_encoded() -> None:
    deep: object = 1
    for _ in range(400):
        deep = [deep]
    data, _ = codec.encode_body(body=deep)
    assert data == b"[" * 400 + b"1" + b"]" * 400


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_are_refused_wherever_they_hide(bad: float) -> None:
    for value in (bad, [1, bad], {"a": {"b": bad}}, {"big": BIG, "x": bad}):
        with pytest.raises(codec.BodyError) as info:
            codec.encode_body(body=value)
        assert info.value.field == "body"
        assert "NaN" in info.value.message


def test_a_null_token_inside_a_string_is_not_mistaken_for_nan() -> None:
    assert codec.encode_body(body={"s": "null", "v": None}) == (b'{"s":"null","v":null}', False)


def test_unpaired_surrogate_is_refused() -> None:
    with pytest.raises(codec.BodyError, match="surrogate"):
        codec.encode_body(body={"s": "\ud800"})
    with pytest.raises(codec.BodyError, match="surrogate"):
        codec.encode_body(body={"big": BIG, "s": "\udfff"})


def test_nul_characters_are_fine_in_a_body() -> None:
    assert codec.encode_body(body="a\x00b") == (b'"a\\u0000b"', False)


def test_base64_body_is_decoded_to_raw_bytes() -> None:
    raw = bytes(range(256))
    assert codec.encode_body(body_base64=base64.b64encode(raw).decode()) == (raw, True)
    assert codec.encode_body(body_base64="") == (b"", True)


@pytest.mark.parametrize("bad", ["abc", "YW Jj", "YWI==", "YWJj!", "YWI=YWI=", "é", "YW\nJj"])
def test_invalid_base64_is_refused(bad: str) -> None:
    with pytest.raises(codec.BodyError) as info:
        codec.encode_body(body_base64=bad)
    assert info.value.field == "body_base64"


def test_base64_must_be_a_string() -> None:
    with pytest.raises(codec.BodyError, match="string"):
        codec.encode_body(body_base64=None)


def test_exactly_one_of_body_and_body_base64() -> None:
    with pytest.raises(codec.BodyError, match="neither"):
        codec.encode_body()
    with pytest.raises(codec.BodyError, match="both"):
        codec.encode_body(body=None, body_base64="")
    # null is a value, not an absence
    assert codec.encode_body(body=None, body_base64=codec.ABSENT) == (b"null", False)


# ----------------------------------------------------------------------------- json objects


def test_check_json_object_refuses_what_jsonb_cannot_store() -> None:
    codec.check_json_object({"a": [1, {"b": BIG}], "c": "\\u0000 is text here"})
    with pytest.raises(ValueError, match="NUL"):
        codec.check_json_object({"a": ["x\x00"]})
    with pytest.raises(ValueError, match="NUL"):
        codec.check_json_object({"k\x00": 1})
    with pytest.raises(ValueError, match="NaN"):
        codec.check_json_object({"a": float("nan")})


# ----------------------------------------------------------------------------- rendering


def test_body_fields_round_trip_json_and_binary() -> None:
    for value in (None, {"a": [1, 2.5, "é"]}, "s", BIG, [BIG, -BIG]):
        data, binary = codec.encode_body(body=value)
        assert codec.body_fields(data, binary) == {"body": value}
    data, binary = codec.encode_body(body_base64="AAEC/w==")
    assert codec.body_fields(data, binary) == {"body_base64": "AAEC/w=="}


def test_raw_json_embeds_stored_bytes_verbatim() -> None:
    data, _ = codec.encode_body(body={"n": BIG})
    fields = codec.body_fields(data, False, raw_json=True)
    assert isinstance(fields["body"], orjson.Fragment)
    assert orjson.dumps(fields) == b'{"body":{"n":' + str(BIG).encode() + b"}}"


def test_stored_bytes_that_are_not_json_render_as_base64() -> None:
    assert codec.body_fields(b"\xff\x00", False) == {"body_base64": "/wA="}


def test_rfc3339_is_utc_with_microseconds() -> None:
    plus2 = timezone(timedelta(hours=2))
    assert codec.rfc3339(datetime(2026, 1, 2, 5, 0, 0, tzinfo=plus2)) == (
        "2026-01-02T03:00:00.000000Z"
    )
    assert codec.rfc3339(datetime(2026, 1, 2, 3, 0, 0, 5, tzinfo=UTC)) == (
        "2026-01-02T03:00:00.000005Z"
    )


def test_rfc3339_remembers_only_what_it_may() -> None:
    """The one-entry memo (rows of one publish share created_at) never answers for another
    moment; an equal instant in another zone is the same UTC text."""
    a = datetime(2026, 1, 2, 3, 0, 0, 1, tzinfo=UTC)
    b = datetime(2026, 1, 2, 3, 0, 0, 2, tzinfo=UTC)
    for moment, text in [(a, "01"), (a, "01"), (b, "02"), (a, "01"), (b, "02"), (b, "02")]:
        assert codec.rfc3339(moment) == f"2026-01-02T03:00:00.0000{text}Z"
    same_as_b = b.astimezone(timezone(timedelta(hours=-7)))
    assert codec.rfc3339(same_as_b) == "2026-01-02T03:00:00.000002Z"
    assert codec.rfc3339(same_as_b.replace(microsecond=3)) == "2026-01-02T03:00:00.000003Z"


def test_browse_item_shape() -> None:
    item = codec.browse_item(stored(b'{"a":1}', False))
    assert item == {
        "id": 7,
        "status": "ready",
        "message_id": "m-1",
        "exchange": "x",
        "routing_key": "k",
        "headers": {"h": 1},
        "properties": {"message_id": "m-1"},
        "body": {"a": 1},
        "delivery_count": 2,
        "created_at": "2026-01-02T03:04:05.123456Z",
        "available_at": "2026-01-02T03:04:06.000000Z",
    }
    binary = codec.browse_item(stored(b"\x00", True))
    assert "body" not in binary
    assert binary["body_base64"] == "AA=="


def test_render_falls_back_to_the_stdlib_for_big_integers_in_headers() -> None:
    message = stored(b'{"b":' + str(BIG).encode() + b"}", False, headers={"h": BIG})
    out = codec.render(lambda raw: {"items": [codec.browse_item(message, raw_json=raw)]})
    item = json.loads(out)["items"][0]
    assert item["headers"] == {"h": BIG}
    assert item["body"] == {"b": BIG}


def test_render_uses_raw_bodies_on_the_fast_path() -> None:
    seen: list[bool] = []

    def build(raw: bool) -> object:
        seen.append(raw)
        return codec.browse_item(stored(b"[1, 2]", False), raw_json=raw)

    # verbatim: the stored bytes (here with a space) are not re-serialized
    assert b'"body":[1, 2]' in codec.render(build)
    assert seen == [True]


def test_json_field_splices_stored_text_or_parses_it_exactly() -> None:
    stored = '{"big": 1180591620717411303424, "f": 0.0000001, "s": "ü\\n"}'
    document = orjson.dumps({"headers": codec.json_field(stored, raw_json=True)})
    assert document == b'{"headers":' + stored.encode() + b"}"  # verbatim, unparsed
    assert codec.json_field(stored) == {"big": 2**70, "f": 1e-7, "s": "ü\n"}
