"""The §17 filter's SQL agrees with routing's own matching (real PostgreSQL): the topic
pattern (storage/filters.py's regular expression over domain.filters.topic_subject) with
``routing.topic_matches`` on every short pattern and key, and on random ones with regex
metacharacters; the headers condition with ``routing.headers_match`` (x-match all)."""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from app.domain.filters import build_filter, topic_subject
from app.domain.routing import headers_match, topic_matches
from app.storage.database import Database
from app.storage.filters import where
from tests.unit.test_routing import _PATHOLOGICAL_TOPIC_CASES


def _keys(alphabet: tuple[str, ...], most: int) -> list[str]:
    keys: dict[str, None] = {}
    for n in range(most + 1):
        for words in itertools.product(alphabet, repeat=n):
            keys[".".join(words)] = None
    return list(keys)


async def _sql_matches(db: Database, patterns: list[str], keys: list[str]) -> set[tuple[str, str]]:
    """The (pattern, key) pairs that the filter's own condition matches: each key a ready
    copy in a table shaped like ``messages``, each pattern's ``where`` run over them."""
    found: set[tuple[str, str]] = set()
    async with db.transaction() as conn:
        await conn.execute(
            text(
                "CREATE TEMP TABLE fk ON COMMIT DROP AS SELECT 'ready'::text AS status, "
                "now() - interval '1 s' AS available_at, k AS routing_key "
                "FROM unnest(CAST(:keys AS text[])) AS k"
            ),
            {"keys": keys},
        )
        for pattern in dict.fromkeys(patterns):
            condition, params = where(build_filter(routing_key=pattern))
            rows = await conn.execute(
                text(f"SELECT m.routing_key FROM fk AS m WHERE {condition}"), params
            )
            found |= {(pattern, r[0]) for r in rows}
    return found


async def test_topic_patterns_agree_with_routing_on_every_short_case(db: Database) -> None:
    patterns = _keys(("a", "b", "", "*", "#"), 4)
    keys = _keys(("a", "b", ""), 4)
    assert len(patterns) * len(keys) > 50_000
    found = await _sql_matches(db, patterns, keys)
    expected = {(p, k) for p in patterns for k in keys if topic_matches(p, k)}
    assert found == expected
    assert ("a.#", "a") in found
    assert ("*", "") not in found
    # the cases the contract names
    assert topic_matches("#", "")
    assert topic_matches("#.#", "")
    assert not topic_matches("*", "")
    assert topic_subject("") == ""
    assert topic_subject("a.") == ".a."


_WORD = st.one_of(
    st.sampled_from(["*", "#", "", "a", "a*", "#b", ".", "\\", "^$", "(x)|y", "[.]", "{1}+?"]),
    st.text(alphabet="ab.*#\\^$|?+()[]{}é\n", max_size=4),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(st.lists(_WORD, max_size=4), st.lists(_WORD, max_size=5)),
        min_size=1,
        max_size=40,
    )
)
async def test_topic_patterns_agree_with_routing_on_random_text(
    db: Database, cases: list[tuple[list[str], list[str]]]
) -> None:
    patterns = [".".join(p) for p, _ in cases]
    keys = list(dict.fromkeys(".".join(k) for _, k in cases))
    found = await _sql_matches(db, patterns, keys)
    assert found == {(p, k) for p in patterns for k in keys if topic_matches(p, k)}


_VALUES: list[Any] = [
    1, 1.0, 2, "1", True, False, 0, None, "", "x", [], [1], [1.0], [1, 2], [2, 1],
    {}, {"a": 1}, {"a": 1.0}, {"a": 1, "b": 2}, {"a": [1]}, "é",
]  # fmt: skip


async def test_headers_condition_agrees_with_headers_match(db: Database) -> None:
    """Every (filter value, header value) pair, present or absent, as jsonb equality in the
    filter's own NOT EXISTS condition versus routing's x-match all."""
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for wanted, have in itertools.product(_VALUES, repeat=2):
        cases.append(({"k": wanted}, {"k": have}))
        cases.append(({"k": wanted}, {"other": have}))
    cases.append(({"k": 1, "j": "x"}, {"k": 1.0, "j": "x", "more": True}))
    cases.append(({"k": 1, "j": "x"}, {"k": 1}))
    condition_of = [where(build_filter(headers=w)) for w, _ in cases]
    async with db.connect() as conn:
        found = []
        for (condition, params), (_, have) in zip(condition_of, cases, strict=True):
            header_part = condition.split(" AND ", 1)[1]
            row = await conn.execute(
                text(f"SELECT {header_part} FROM (SELECT CAST(:h AS jsonb) AS headers) AS m"),
                params | {"h": json.dumps(have)},
            )
            found.append(bool(row.scalar_one()))
    expected = [headers_match(w, h) for w, h in cases]
    assert found == expected
    assert sum(expected) > len(_VALUES)  # equal pairs exist, and 1 = 1.0 among them


async def test_pathological_topic_patterns_stay_fast_in_sql(db: Database) -> None:
    """Routing's pathological cases (many # and * against long keys) through the filter's
    regular expression: right, and bounded by a 5 s statement timeout (PostgreSQL's regex
    engine runs them as a DFA, without backtracking)."""
    async with db.transaction() as conn:
        await conn.execute(text("SET LOCAL statement_timeout = '5s'"))
        for pattern, key, expected in _PATHOLOGICAL_TOPIC_CASES:
            condition, params = where(build_filter(routing_key=pattern))
            row = await conn.execute(
                text(
                    "SELECT count(*) FROM (SELECT 'ready'::text AS status, now() AS available_at, "
                    f"CAST(:key AS text) AS routing_key) AS m WHERE {condition}"
                ),
                params | {"key": key},
            )
            assert bool(row.scalar_one()) is expected, pattern[:40]
