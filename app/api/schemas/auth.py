"""Request and response models of /auth and /users. No model ever carries a password hash,
and no response model carries a password."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator

from app.api.schemas.common import Page, StrictModel
from app.auth.permissions import check_pattern
from app.domain.model import Permissions, Role, User


class LoginRequest(StrictModel):
    # Any string: a name no user could have is an authentication failure (401, counted),
    # not a validation error.
    username: str
    password: str


class LoginResponse(BaseModel):
    token: Annotated[str, Field(description="Send as `Authorization: Bearer <token>`")]
    token_type: Literal["bearer"]
    expires_at: datetime


Pattern = Annotated[
    str,
    Field(
        description="A regular expression matched in full against a resource name; "
        '"" allows nothing'
    ),
]


class PermissionsModel(StrictModel):
    """RabbitMQ-style permissions: regular expressions matched in full; "" allows nothing."""

    configure: Pattern = ""
    write: Pattern = ""
    read: Pattern = ""

    @field_validator("configure", "write", "read")
    @classmethod
    def _valid_pattern(cls, value: str) -> str:
        if "\x00" in value:  # PostgreSQL text cannot hold it
            raise ValueError("must not contain NUL (\\u0000) characters")
        problem = check_pattern(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    def to_domain(self) -> Permissions:
        return Permissions(self.configure, self.write, self.read)


class PermissionsOut(BaseModel):
    configure: str
    write: str
    read: str

    @classmethod
    def from_domain(cls, permissions: Permissions) -> PermissionsOut:
        return cls(configure=permissions.configure, write=permissions.write, read=permissions.read)


class UserPut(StrictModel):
    password: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=1024,
            description="Required to create a user; omit on update to keep the current one. "
            "At least MESSAGEX_MIN_PASSWORD_LENGTH (default 8) characters.",
        ),
    ] = None
    role: Role = Role.USER
    permissions: PermissionsModel = Field(default_factory=PermissionsModel)


class UserOut(BaseModel):
    username: str
    role: Role
    permissions: PermissionsOut

    @classmethod
    def from_domain(cls, user: User) -> UserOut:
        return cls(
            username=user.username,
            role=user.role,
            permissions=PermissionsOut.from_domain(user.permissions),
        )


class UserPage(Page[UserOut]):
    """A page of users ordered by name (byte order)."""
