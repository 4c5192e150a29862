"""Schemathesis hooks for test_schemathesis.py (loaded through SCHEMATHESIS_HOOKS).

- The run authenticates as the bootstrap admin, whose password and existence the fuzzer could
  otherwise change (``PUT``/``DELETE /users/admin``) halfway through, leaving every later case
  an uninteresting 401: cases aimed at that one name are skipped.
- Four rules of the contract that JSON Schema cannot say are left out of the positive cases:
  an integer field written as an integral float (``76.0``) is refused (§12: integers are
  integers), a queue may not be its own dead-letter queue (§5), a user's permission
  patterns must be regular expressions RE2 compiles (§3; a generator does not honour
  ``format: regex``), and a password has at least ``MESSAGEX_MIN_PASSWORD_LENGTH``
  characters (§3; a setting, so the schema says only 1).
"""

from __future__ import annotations

from typing import Any

import schemathesis

from app.auth.permissions import check_pattern
from app.config import Settings
from tests.support import ADMIN_USER

MIN_PASSWORD_LENGTH = Settings.model_fields["min_password_length"].default


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
        elif isinstance(item, list):
            pending.extend(item)
    return False


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
    if _has_integral_float(body) or _has_invalid_pattern(body) or _has_short_password(body):
        return False
    name = (case.path_parameters or {}).get("name")
    return not (isinstance(body, dict) and name and body.get("dead_letter_queue") == name)
