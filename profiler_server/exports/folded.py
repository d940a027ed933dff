"""Folded stacks for flamegraph.pl, inferno and Pyroscope: `frame;frame;frame <self_ns>` per
line, root first; stacks without self time are left out (they add nothing to a flame graph)."""

from __future__ import annotations

from profiler_core.stacks import SEPARATOR
from profiler_server.exports.base import Aggregate, Format, RequestProfile, Stacks


def lines(stacks: Stacks) -> str:
    return "".join(f"{sig} {self_ns}\n" for sig, self_ns, _ in stacks if self_ns > 0)


def request_stacks(profile: RequestProfile) -> list[tuple[str, int, int]]:
    """(signature, self ns, calls) per distinct stack of one request, in first-seen order;
    every lane's stacks start with the lane's root (its name, e.g. `GET /items/{id}`)."""
    totals: dict[str, list[int]] = {}
    for lane in profile.lanes:
        todo = [(lane["root"], "")]
        while todo:
            node, prefix = todo.pop()
            sig = prefix + node["function"]
            found = totals.setdefault(sig, [0, 0])
            found[0] += node["self_ns"]
            found[1] += 1
            todo.extend((child, sig + SEPARATOR) for child in reversed(node["children"]))
    return [(sig, self_ns, calls) for sig, (self_ns, calls) in totals.items()]


def render_request(profile: RequestProfile) -> bytes:
    return lines(request_stacks(profile)).encode()


def render_aggregate(aggregate: Aggregate) -> bytes:
    return lines(aggregate.stacks).encode()


FORMAT = Format(
    "folded",
    "text/plain",
    "folded",
    request=render_request,
    aggregate=render_aggregate,
)
