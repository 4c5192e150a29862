"""JSON read exactly as the stdlib reads it, at orjson's speed where that gives the same value.

orjson reads an integer past 64 bits (above 2**64 - 1 or below -2**63) as a float, and
refuses ``NaN``/``Infinity`` and documents nested deeper than its limit; the stdlib keeps such
integers exact and takes the rest. A document in which orjson found no float at all is
therefore read the same by both; any other is read again by the stdlib. The one rule for
request bodies (api/edge.py), WebSocket frames (api/ws/frames.py), stored bodies
(api/codec.py) and stored headers and properties (storage/fastpath.py).
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads(data: bytes | str, *, strict: bool = False) -> Any:
    """The parsed document; ValueError when ``data`` is not JSON (or nests too deeply).

    ``strict``: only what orjson takes is JSON (no ``NaN``/``Infinity``): WebSocket frames.
    Otherwise what the stdlib takes: request bodies, as FastAPI's routes read them.
    """
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        if strict:
            raise
        return _stdlib(data)
    return _stdlib(data) if _has_float(value) else value


def _stdlib(data: bytes | str) -> Any:
    try:
        return json.loads(data)  # UnicodeDecodeError and JSONDecodeError are ValueErrors
    except RecursionError as exc:
        raise ValueError("nested too deeply") from exc


def _has_float(value: Any) -> bool:
    pending = [value]
    while pending:
        item = pending.pop()
        kind = type(item)
        if kind is float:
            return True
        if kind is dict:
            pending.extend(item.values())
        elif kind is list:
            pending.extend(item)
    return False
