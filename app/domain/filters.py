"""Filters over a queue's stored copies (contract §17): what one is, and the two pieces of
matching that SQL must do exactly as routing does — pure, no I/O.

``storage/filters.py`` turns a :class:`MessageFilter` into one SQL condition. The topic
pattern becomes a POSIX regular expression (:func:`topic_regex`) matched against
:func:`topic_subject` of the routing key: each word of the key prefixed by a ``.``, so the
empty key ``""`` (no words) and the key ``"."`` (two empty words) stay apart, and ``*`` can
match one empty word but never zero words. Tests check it against
``routing.topic_matches`` on every short pattern and key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from app.domain.arguments import DeathReason
from app.domain.model import BrowseStatus
from app.domain.routing import all_match_conditions
from app.errors import ValidationFailed

#: The statuses a filter may name. ``in_flight`` is accepted by query only: move and delete
#: never touch a copy in flight (contract §17).
MOVABLE = frozenset({BrowseStatus.READY, BrowseStatus.DELAYED, BrowseStatus.DEAD})
DEFAULT_STATUSES = (BrowseStatus.READY, BrowseStatus.DELAYED, BrowseStatus.DEAD)

#: Characters with a meaning in a PostgreSQL advanced regular expression (ARE). A backslash
#: before any of them makes it literal; a backslash before a letter or digit would start an
#: escape (``\d``), so only these are escaped.
_ARE_SPECIAL = frozenset("\\^$.|?*+()[]{}")


@dataclass(frozen=True, slots=True)
class MessageFilter:
    """Every given condition must hold; an empty filter matches every copy of the statuses.

    ``headers`` is the (key, value) pairs a headers binding with ``x-match: all`` compares
    (JSON value and type); ``death_reason`` is the newest ``x-death`` entry's reason;
    ``published_after`` / ``published_before`` bound ``created_at`` (the first publish,
    kept by dead-lettering and moves), both exclusive.
    """

    statuses: tuple[BrowseStatus, ...] = DEFAULT_STATUSES
    routing_key: str | None = None
    headers: tuple[tuple[str, Any], ...] = ()
    message_ids: tuple[str, ...] | None = None
    published_after: datetime | None = None
    published_before: datetime | None = None
    min_delivery_count: int | None = None
    death_reason: DeathReason | None = None
    #: the JSON object the headers came from (for logs and echoes)
    raw_headers: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def movable(self) -> MessageFilter:
        """This filter for a move or delete: ValidationFailed when it names ``in_flight``."""
        if BrowseStatus.IN_FLIGHT in self.statuses:
            raise ValidationFailed.on_field(
                "filter",
                "filter.status: move and delete never touch in-flight copies; "
                "name ready, delayed or dead",
            )
        return self


def build_filter(
    *,
    statuses: Sequence[BrowseStatus] | None = None,
    routing_key: str | None = None,
    headers: Mapping[str, Any] | None = None,
    message_ids: Sequence[str] | None = None,
    published_after: datetime | None = None,
    published_before: datetime | None = None,
    min_delivery_count: int | None = None,
    death_reason: DeathReason | None = None,
) -> MessageFilter:
    """A checked filter. ValidationFailed (422) for an empty status list, a header key
    starting with ``x-`` (a headers binding ignores those: a filter would silently match
    more than asked). Time bounds that exclude every instant are a filter that matches
    nothing, not an error: every condition given must hold, and the document can't say
    otherwise (schemathesis holds the API to its schema)."""
    if statuses is not None and not statuses:
        raise ValidationFailed.on_field("filter", "filter.status: name at least one status")
    given = dict(headers or {})
    ignored = sorted(key for key in given if key.startswith("x-"))
    if ignored:
        raise ValidationFailed.on_field(
            "filter",
            f"filter.headers: keys starting with 'x-' are not compared ({ignored[0]!r}); "
            "use death_reason for x-death",
        )
    return MessageFilter(
        statuses=tuple(dict.fromkeys(statuses)) if statuses else DEFAULT_STATUSES,
        routing_key=routing_key,
        headers=tuple(all_match_conditions(given)),
        message_ids=tuple(dict.fromkeys(message_ids)) if message_ids is not None else None,
        published_after=published_after,
        published_before=published_before,
        min_delivery_count=min_delivery_count,
        death_reason=death_reason,
        raw_headers=given,
    )


# --------------------------------------------------------------------------- topic in SQL


def topic_subject(routing_key: str) -> str:
    """What :func:`topic_regex` is matched against: ``""`` for the empty key (no words),
    else the key with a ``.`` before its first word (so every word is ``.`` + word)."""
    return "." + routing_key if routing_key else ""


def is_wildcard_free(pattern: str) -> bool:
    """A pattern without ``*`` or ``#`` words matches exactly the equal key."""
    return not any(word in ("*", "#") for word in pattern.split("."))


def topic_regex(pattern: str) -> str:
    """An anchored ARE matching :func:`topic_subject` of exactly the keys ``pattern``
    matches (contract §4): a literal word is ``\\.word``; ``*`` one word, ``\\.[^.]*``;
    ``#`` zero or more, ``(\\.[^.]*)*`` (runs of ``#`` collapsed, as routing does)."""
    parts: list[str] = []
    previous = None
    for word in pattern.split(".") if pattern else ():
        if word == "#":
            if previous != "#":
                parts.append(r"(\.[^.]*)*")
        elif word == "*":
            parts.append(r"\.[^.]*")
        else:
            parts.append(r"\." + "".join("\\" + c if c in _ARE_SPECIAL else c for c in word))
        previous = word
    return "^" + "".join(parts) + "$"
