"""Schemathesis hooks for test_schemathesis.py (loaded through SCHEMATHESIS_HOOKS).

- The run authenticates as the bootstrap admin, whose password and existence the fuzzer could
  otherwise change (``PUT``/``DELETE /users/admin``) halfway through, leaving every later case
  an uninteresting 401: cases aimed at that one name are skipped.
- Three rules of the contract that JSON Schema cannot say are left out of the positive cases:
  an integer field written as an integral float (``76.0``) is refused (§12: integers are
  integers), a queue may not be its own dead-letter queue (§5), and a user's permission
  patterns must be regular expressions (§3; a generator does not honour ``format: regex``).
"""

from __future__ import annotations

import re
from typing import Any

import schemathesis

from tests.support import ADMIN_USER


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
    for pattern in permissions.values():
        if isinstance(pattern, str):
            try:
                re.compile(pattern)
            except re.error:
                return True
    return False


@schemathesis.hook
def filter_case(context: Any, case: Any) -> bool:
    body = case.body if isinstance(case.body, (dict, list)) else None
    if body is None:
        return True
    if _has_integral_float(body) or _has_invalid_pattern(body):
        return False
    name = (case.path_parameters or {}).get("name")
    return not (isinstance(body, dict) and name and body.get("dead_letter_queue") == name)
