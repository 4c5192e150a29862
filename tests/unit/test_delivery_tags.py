"""Which strings the batched ACK may carry to PostgreSQL (broker/settlement.py, parse_tag).

A tag that reached the statement and failed there (not a bigint, say) would fail every other
ACK of the batch, so anything that cannot be one of ours is refused before.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.broker.settlement import parse_tag

HEX = "0123456789abcdef" * 2


@pytest.mark.parametrize(
    ("tag", "expected"),
    [
        ("1." + HEX, 1),
        ("9223372036854775807." + HEX, 2**63 - 1),
        ("0000000000000000042." + HEX, 42),
        ("9223372036854775808." + HEX, None),  # beyond bigint
        ("10000000000000000000." + HEX, None),  # 20 digits
        ("1." + HEX.upper(), None),
        ("1." + HEX[:-1], None),
        ("1." + HEX + "0", None),
        ("1." + HEX + "\n", None),
        ("-1." + HEX, None),
        ("+1." + HEX, None),
        (" 1." + HEX, None),
        ("1_0." + HEX, None),
        ("\u0663." + HEX, None),  # a digit, but not an ASCII one
        ("." + HEX, None),
        ("1" + HEX, None),
        ("", None),
    ],
)
def test_parse_tag(tag: str, expected: int | None) -> None:
    assert parse_tag(tag) == expected


@given(
    st.integers(min_value=0, max_value=2**63 - 1),
    st.text("0123456789abcdef", min_size=32, max_size=32),
)
def test_every_tag_the_claim_makes_is_read_back(message_id: int, random_part: str) -> None:
    assert parse_tag(f"{message_id}.{random_part}") == message_id
