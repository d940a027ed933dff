"""What every exporter shares: its inputs and the one record that describes a format.

Like pyinstrument's renderers, an output format is one small module with one job: turn a
stored request (its summary and typed lanes, assembly/request_tree.py) or an aggregate (the
stacks of queries.stack_totals, weighed by one value) into the bytes another tool reads. A
module declares a `FORMAT`; the HTTP API looks formats up by name and never knows more than
this record.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from profiler_server.assembly.request_tree import Lane
from profiler_server.assembly.states import WALL, Value

Stacks = Sequence[tuple[str, int, int]]  # (signature "mod:qual;mod:qual", value, calls)
Sources = Callable[[Sequence[str]], Mapping[str, tuple[str, int]]]  # names -> (file, line)


@dataclass(frozen=True)
class RequestProfile:
    """One stored request: its `summary` as the API lists it (docs/api.md) and its lanes."""

    summary: dict
    lanes: list[Lane]


def _no_sources(_: Sequence[str]) -> Mapping[str, tuple[str, int]]:
    return {}


@dataclass(frozen=True)
class Aggregate:
    """Stacks summed over a range, each weighed by `value` (states.VALUES: its own time in
    some states, or its calls); `sources` looks up where functions are defined (only the
    formats that name files ask, so the others cost no query)."""

    stacks: Stacks
    value: Value = WALL
    title: str = "all requests"
    since_ns: int | None = None
    until_ns: int | None = None
    sources: Sources = field(default=_no_sources)


@dataclass(frozen=True)
class Format:
    """An output format: how to serve it and what it can render (a request, an aggregate
    or both)."""

    name: str
    media_type: str
    extension: str
    request: Callable[[RequestProfile], bytes] | None = None
    aggregate: Callable[[Aggregate], bytes] | None = None


def json_bytes(content: Any) -> bytes:
    """Compact UTF-8 JSON by orjson (10x the stdlib on big trees); what orjson refuses (an
    integer beyond 64 bits, say a sum over a very long range, or nesting deeper than its
    255 levels, a deep call tree) is written by `_iterative_json`."""
    try:
        return orjson.dumps(content)
    except orjson.JSONEncodeError:
        return _iterative_json(content)


def _iterative_json(content: Any) -> bytes:
    """Compact JSON of dicts, lists and scalars at any depth: an explicit stack instead of
    recursion (the stdlib's encoder recurses, and a call tree 16,000 calls deep nests
    32,000 levels). Items on the stack are values to encode, or bytes to emit as they are."""
    out: list[bytes] = []
    todo: list[Any] = [content]
    while todo:
        item = todo.pop()
        if isinstance(item, bytes):
            out.append(item)
        elif isinstance(item, dict):
            parts: list[Any] = [b"{"]
            for i, (key, value) in enumerate(item.items()):
                parts += [b"," if i else b"", orjson.dumps(str(key)) + b":", value]
            parts.append(b"}")
            todo.extend(reversed(parts))
        elif isinstance(item, list | tuple):
            parts = [b"["]
            for i, value in enumerate(item):
                parts += [b"," if i else b"", value]
            parts.append(b"]")
            todo.extend(reversed(parts))
        elif type(item) is int:
            out.append(str(item).encode())
        else:
            out.append(orjson.dumps(item))
    return b"".join(out)
