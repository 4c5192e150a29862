"""docs/grafana/messagex.json queries only metrics the broker exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from app.metrics import Metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "messagex.json"
#: the sample names each family type exposes (prometheus_client, with _created disabled)
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum")}


def _exported() -> set[str]:
    names: set[str] = set()
    for family in Metrics().registry.collect():
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return names


def _queried(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = set(re.findall(r"messagex_\w+", node.get("expr", "")))
        query = node.get("query")
        if isinstance(query, dict):
            found |= set(re.findall(r"messagex_\w+", query.get("query", "")))
        for value in node.values():
            found |= _queried(value)
        return found
    if isinstance(node, list):
        return set().union(*map(_queried, node)) if node else set()
    return set()


def test_every_metric_the_dashboard_queries_exists() -> None:
    queried = _queried(json.loads(DASHBOARD.read_text()))
    assert len(queried) >= 15, queried
    assert queried - _exported() == set()


def test_a_missing_metric_would_be_found() -> None:
    panel = {"targets": [{"expr": "rate(messagex_no_such_thing_total[1m])"}]}
    assert _queried(panel) - _exported() == {"messagex_no_such_thing_total"}
