"""Schemathesis hooks for test_schemathesis.py (loaded through SCHEMATHESIS_HOOKS).

- The run authenticates as the bootstrap admin, whose password and existence the fuzzer could
  otherwise change (``PUT``/``DELETE /users/admin``) halfway through, leaving every later case
  an uninteresting 401: cases aimed at that one name are skipped.
- Five rules of the contract that JSON Schema cannot say are left out of the positive cases:
  an integer field written as an integral float (``76.0``) is refused (§12: integers are
  integers; in ``arguments``, for the ones the document types as integers, §13), a length
  limit is at most 2**63 - 1 (§13; the document says so in words, as a double cannot hold
  it), a queue may not be its own dead-letter queue (§5), a user's permission patterns must
  be regular expressions RE2 compiles (§3; a generator does not honour ``format: regex``),
  and a password has at least ``MESSAGEX_MIN_PASSWORD_LENGTH`` characters (§3; a setting,
  so the schema says only 1).
"""

from __future__ import annotations

import json
from typing import Any

import schemathesis

from app.auth.permissions import check_pattern
from app.config import Settings
from app.domain.arguments import MAX_LENGTH
from tests.faults.harness import REPO
from tests.support import ADMIN_USER

MIN_PASSWORD_LENGTH = Settings.model_fields["min_password_length"].default


def _integer_arguments() -> frozenset[str]:
    """The declare bodies' ``arguments`` documented as integers (x-max-length, ...)."""
    schemas = json.loads((REPO / "openapi" / "openapi.json").read_text())["components"]["schemas"]
    return frozenset(
        key
        for body in ("QueueDeclare", "ExchangeDeclare")
        for key, prop in schemas[body]["properties"]["arguments"]["properties"].items()
        if prop.get("type") == "integer"
    )


INTEGER_ARGUMENTS = _integer_arguments()


@schemathesis.hook
def filter_path_parameters(context: Any, path_parameters: dict[str, Any] | None) -> bool:
    return not path_parameters or path_parameters.get("name") != ADMIN_USER


def _has_integral_float(value: Any) -> bool:
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, float) and item.is_integer():
            return True
        if isinstance(item, dict):
            pending.extend(v for k, v in item.items() if k not in ("headers", "arguments", "body"))
            arguments = item.get("arguments")
            if isinstance(arguments, dict):
                pending.extend(v for k, v in arguments.items() if k in INTEGER_ARGUMENTS)
        elif isinstance(item, list):
            pending.extend(item)
    return False


def _has_unstorable_argument(body: Any) -> bool:
    arguments = body.get("arguments") if isinstance(body, dict) else None
    if not isinstance(arguments, dict):
        return False
    return any(
        type(value) is int and value > MAX_LENGTH
        for key, value in arguments.items()
        if key in INTEGER_ARGUMENTS
    )


def _has_invalid_pattern(body: Any) -> bool:
    permissions = body.get("permissions") if isinstance(body, dict) else None
    if not isinstance(permissions, dict):
        return False
    return any(
        isinstance(pattern, str) and check_pattern(pattern) is not None
        for pattern in permissions.values()
    )


def _has_short_password(body: Any) -> bool:
    password = body.get("password") if isinstance(body, dict) else None
    return isinstance(password, str) and len(password) < MIN_PASSWORD_LENGTH


@schemathesis.hook
def filter_case(context: Any, case: Any) -> bool:
    body = case.body if isinstance(case.body, (dict, list)) else None
    if body is None:
        return True
    if _has_integral_float(body) or _has_unstorable_argument(body):
        return False
    if _has_invalid_pattern(body) or _has_short_password(body):
        return False
    name = (case.path_parameters or {}).get("name")
    return not (isinstance(body, dict) and name and body.get("dead_letter_queue") == name)
