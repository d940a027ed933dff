"""What the demo reads back from the server's API to say where to look."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from profiler_server.exports.folded import WALL_FIELDS


def fetch(base: str, path: str, **params: object) -> bytes:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(base + path + query, timeout=30) as response:
        return response.read()


def stored_per_service(base: str) -> Counter[str]:
    """Requests stored by this server since it started, per service (from /metrics)."""
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(fetch(base, "/metrics").decode()):
        for sample in family.samples:
            if sample.name == "profiler_requests_stored_total":
                counts[sample.labels["service"]] += int(sample.value)
    return counts


def wait_settled(base: str, services: list[str], timeout: float = 30) -> Counter[str]:
    """Polls until every service has stored requests and the counts held still for a second
    (hosts send every 200 ms); returns the counts, settled or not by the deadline."""
    deadline = time.monotonic() + timeout
    counts = stored_per_service(base)
    while time.monotonic() < deadline:
        time.sleep(1)
        previous, counts = counts, stored_per_service(base)
        if counts == previous and all(counts[s] for s in services):
            break
    return counts


def save_flamegraph(base: str, path: Path, since: str) -> int:
    """The folded stacks (`a;b;c <wall ns>` lines) of everything since `since`; returns lines."""
    folded = fetch(base, "/api/flamegraph", format="folded", since=since).decode()
    path.write_text(folded)
    return len(folded.splitlines())


def _own_times(node: dict, into: Counter[str]) -> None:
    """Each function's own share of the wall time: running, awaiting and ready (states.py),
    as the flame graph's default value counts it (an awaited `asyncio.sleep` shows in the
    innermost profiled coroutine that awaits it, not in its callers)."""
    todo = list(node["children"])  # iteratively: a call tree may be thousands deep
    while todo:
        child = todo.pop()
        into[child["function"]] += sum(child[field] for field in WALL_FIELDS)
        todo.extend(child["children"])


def top_functions(request: dict, n: int = 3) -> list[tuple[str, int]]:
    """The functions one stored request spent most of its time in (lane roots left out)."""
    own_ns: Counter[str] = Counter()
    for lane in request["lanes"]:
        _own_times(lane["root"], own_ns)
    return own_ns.most_common(n)


def slowest(base: str, service: str, since: str, n: int = 3) -> list[dict]:
    """The `n` slowest requests of `service` stored since `since`, each with its call tree."""
    listed = json.loads(
        fetch(base, "/api/requests", service=service, order="duration", since=since, limit=n)
    )
    return [json.loads(fetch(base, f"/api/requests/{r['id']}")) for r in listed["requests"]]


def slowest_lines(base: str, requests: list[dict]) -> list[str]:
    lines = []
    for r in requests:
        lines.append(
            f"  {r['duration_ms']:8.1f} ms  {r['service']}  {r['method']} {r['route']}"
            f"  {r['calls']} calls  {base}/api/requests/{r['id']}"
        )
        top = ", ".join(
            f"{name} {ns / 1e6:.1f} ms" for name, ns in top_functions(r) if ns >= 50_000
        )
        lines.append(f"             most time in: {top}")
    return lines
