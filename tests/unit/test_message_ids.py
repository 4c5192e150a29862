"""Message ids the broker makes (app.broker.publisher._uuid4_strings) are RFC 4122 v4 UUIDs."""

from __future__ import annotations

import uuid

from app.broker.publisher import _uuid4_strings


def test_generated_ids_are_distinct_canonical_version_4_uuids() -> None:
    ids = list(_uuid4_strings(2000))
    assert len(ids) == len(set(ids)) == 2000
    for text in ids:
        parsed = uuid.UUID(text)
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
        assert str(parsed) == text


def test_zero_ids() -> None:
    assert list(_uuid4_strings(0)) == []
