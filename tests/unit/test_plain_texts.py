"""app.server.plain_texts: the reads the server's fast path takes (whole, final, masked,
uncompressed text frames of valid UTF-8, up to 65,535 bytes each) and every kind it leaves
to websockets' parser (None). tests/faults/test_frames.py sends the same through a server."""

from __future__ import annotations

import pytest

from app.server import plain_texts


def frame(
    payload: bytes, *, first: int = 0x81, masked: bool = True, long_form: int | None = None
) -> bytes:
    n = len(payload)
    flag = 0x80 if masked else 0
    if long_form == 64:
        head = bytes([first, flag | 127]) + n.to_bytes(8, "big")
    elif n >= 126 or long_form == 16:
        head = bytes([first, flag | 126]) + n.to_bytes(2, "big")
    else:
        head = bytes([first, flag | n])
    if not masked:
        return head + payload
    mask = b"\x0f\xf0\x55\xaa"
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def test_whole_text_frames_are_unmasked_and_decoded() -> None:
    texts = ["a", "é" * 100, "x" * 65_535, ""]
    data = b"".join(frame(t.encode()) for t in texts)
    assert plain_texts(data, None) == texts
    assert plain_texts(frame(b"ok", long_form=16), None) == ["ok"]
    assert plain_texts(b"", None) == []  # nothing to hand over: the server's parser is called


@pytest.mark.parametrize(
    ("what", "data"),
    [
        ("a partial header", frame(b"abc")[:1]),
        ("a partial payload", frame(b"abcdef")[:-1]),
        ("a whole frame, then part of one", frame(b"a") + frame(b"bcd")[:4]),
        ("not final (a fragment)", frame(b"a", first=0x01)),
        ("a continuation", frame(b"a", first=0x80)),
        ("binary", frame(b"a", first=0x82)),
        ("ping", frame(b"a", first=0x89)),
        ("close", frame(b"\x03\xe8", first=0x88)),
        ("RSV1 (compressed)", frame(b"a", first=0xC1)),
        ("not masked", frame(b"a", masked=False)),
        ("a 64-bit length", frame(b"a", long_form=64)),
        ("bad UTF-8", frame(b"\xff\xfe")),
        ("text, then binary", frame(b"a") + frame(b"b", first=0x82)),
        ("over max_size", frame(b"x" * 11)),
    ],
)
def test_anything_else_is_left_to_the_parser(what: str, data: bytes) -> None:
    max_size = 10 if what == "over max_size" else None
    assert plain_texts(data, max_size) is None, what
