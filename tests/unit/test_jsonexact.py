"""app.jsonexact: JSON read as the stdlib reads it (the one rule for bodies, frames, rows)."""

from __future__ import annotations

import json

import pytest

from app import jsonexact

DOCS = [
    '{"a": 1, "b": [true, null, "x"], "c": {"d": "é"}}',
    '{"big": 1237940039285380274899124225, "neg": -9223372036854775809, "f": 2.5}',
    "[18446744073709551615, 18446744073709551616, 1e3, -0.0]",
    '"12345678901234567890123"',
]


@pytest.mark.parametrize("doc", DOCS)
@pytest.mark.parametrize("strict", [False, True])
def test_reads_what_the_stdlib_reads_with_integers_exact(doc: str, strict: bool) -> None:
    for data in (doc, doc.encode()):
        value = jsonexact.loads(data, strict=strict)
        assert value == json.loads(doc)
        assert repr(value) == repr(json.loads(doc))  # ints stay ints, floats floats


def test_nan_is_json_only_when_not_strict() -> None:
    value = jsonexact.loads('{"x": NaN}')
    assert value["x"] != value["x"]
    with pytest.raises(ValueError, match=r"."):
        jsonexact.loads('{"x": NaN}', strict=True)


@pytest.mark.parametrize("data", ["{not json", "", b"\xff\xfe{", "[" * 100_000 + "]" * 100_000])
@pytest.mark.parametrize("strict", [False, True])
def test_what_is_not_json_is_a_value_error(data: str | bytes, strict: bool) -> None:
    with pytest.raises(ValueError, match=r"."):
        jsonexact.loads(data, strict=strict)
