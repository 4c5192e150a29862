"""Every frame the suite's WebSocket client sends or receives, checked against the committed
AsyncAPI document (openapi/asyncapi.json; issue 24, contract §8).

A server frame must be one the document names and must match its schema. A client frame the
server's own parser accepts (``app.api.ws.frames.FRAME``) must match its schema too: the
document may not refuse what the broker takes. Frames the parser refuses (the suite sends
many on purpose) are counted, not checked. ``COUNTS`` is printed at the end of the run.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema_rs
from pydantic import ValidationError

from app.api.ws.frames import FRAME

DOCUMENT = Path(__file__).resolve().parents[1] / "openapi" / "asyncapi.json"
COUNTS: Counter[str] = Counter()


@cache
def _document() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DOCUMENT.read_text())
    return doc


@cache
def _validator(kind: str) -> Any:
    doc = _document()
    message = doc["channels"]["ws"]["messages"].get(kind)
    assert message is not None, f"{kind} frames are not in openapi/asyncapi.json"
    schema = {"$ref": message["payload"]["$ref"], "components": doc["components"]}
    return jsonschema_rs.Draft202012Validator(schema)


def _errors(kind: str, frame: dict[str, Any]) -> list[str]:
    try:
        return [f"{e.instance_path}: {e.message}" for e in _validator(kind).iter_errors(frame)]
    except (ValueError, OverflowError):
        # jsonschema-rs holds numbers in 64 bits: a frame with a bigger integer (a body the
        # suite uses to prove exact JSON) is checked without its body and headers.
        big: dict[str, Any] = {"body": None, "headers": {}, "properties": {}}
        slim = {k: big.get(k, v) if k in big else v for k, v in frame.items()}
        return [f"{e.instance_path}: {e.message}" for e in _validator(kind).iter_errors(slim)]


def check_server_frame(frame: dict[str, Any]) -> None:
    kind = frame["type"]
    problems = _errors(kind, frame)
    assert not problems, f"{kind} frame does not match openapi/asyncapi.json: {problems} {frame}"
    COUNTS["server frames checked"] += 1


def check_client_frame(frame: Any) -> None:
    try:
        FRAME.validate_python(frame)
    except ValidationError:
        COUNTS["client frames the broker refuses (not checked)"] += 1
        return
    kind = frame["type"]
    problems = _errors(kind, frame)
    assert not problems, f"{kind} frame the broker accepts is refused by asyncapi.json: {problems}"
    COUNTS["client frames checked"] += 1
