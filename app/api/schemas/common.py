"""Models shared by every resource: problem details, pages, names."""

from __future__ import annotations

from typing import Annotated, Any, Generic, TypeVar

from fastapi import Query
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from app.domain.model import NAME_PATTERN

T = TypeVar("T")

#: A name of an exchange, queue or user (contract §1).
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN, min_length=1, max_length=255)]
#: ``?contains=`` of GET /exchanges, /queues, /users and /connections (§20): a case-sensitive
#: substring of the name (connections: the username). Only name characters can occur in a
#: name, so any other is refused (422) rather than silently matching nothing; "" matches all.
Contains = Annotated[
    str | None,
    Query(
        pattern=r"^[A-Za-z0-9_.:\-]*$",
        max_length=255,
        description=(
            "Only the items whose name contains this text (case-sensitive), in the same "
            "order and with the same paging"
        ),
    ),
]
#: the longest delivery tag a request may carry (ours are at most 52 characters)
MAX_TAG = 128
DeliveryTag = Annotated[str, Field(min_length=1, max_length=MAX_TAG)]
#: at most this many tags in one acknowledgement of several (prefetch is at most 1000 too)
MAX_ACK_TAGS = 1000
JsonObject = dict[str, Any]


class StrictModel(BaseModel):
    """Request models refuse unknown fields, so typos are 422 and not silently ignored."""

    model_config = ConfigDict(extra="forbid")


class Problem(BaseModel):
    """RFC 9457 problem details."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    code: str
    errors: list[dict[str, Any]] | None = None


class Page(BaseModel, Generic[T]):
    items: list[T]
    next_after: Annotated[
        str | int | None,
        Field(description="Cursor for the next page (`?after=`); null on the last page"),
    ] = None
