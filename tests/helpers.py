"""Small helpers shared by tests: polling with a deadline, counting what the API shows."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

T = TypeVar("T")


def eventually(probe: Callable[[], T], timeout: float = 15.0, interval: float = 0.05) -> T:
    """Polls until probe() is truthy (bounded); returns its last value."""
    deadline = time.monotonic() + timeout
    value = probe()
    while not value and time.monotonic() < deadline:
        time.sleep(interval)
        value = probe()
    return value


def stored_requests(http: str, **params: str) -> list[dict]:
    params.setdefault("limit", "1000")
    return httpx.get(http + "/api/requests", params=params, timeout=30).json()["requests"]


def metric_value(http: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` (0 if none)."""
    text = httpx.get(http + "/metrics", timeout=30).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def count_nodes(node: dict) -> int:
    return 1 + sum(count_nodes(child) for child in node["children"])


def nodes(node: dict) -> list[dict]:
    """Every node of a call tree (API shape), depth first."""
    found = [node]
    for child in node["children"]:
        found += nodes(child)
    return found
