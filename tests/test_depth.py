"""Deep call trees: a request 16,000 calls deep goes through real gRPC into SQLite and
PostgreSQL, and comes back whole from the API and every export; what is stored for its
stacks grows with its depth, not with the depth squared (stacks are a prefix tree)."""

from __future__ import annotations

import gzip
import json
import json.scanner
import sqlite3
import sys
import time
from typing import Any

from profiler_core.model import EventKind
from profiler_core.stacks import ELISION, SEPARATOR
from profiler_core.wire import pprof_pb2
from profiler_core.wire.builder import BatchBuilder
from profiler_server.assembly.stacktree import SHOWN_FRAMES, StackTree
from profiler_server.exports import AGGREGATE_FORMATS, REQUEST_FORMATS
from profiler_server.loadgen import HostStream, hello

DEEP = 16_000
FUNCTION = "deep:f"
ENTER, EXIT = int(EventKind.ENTER), int(EventKind.EXIT)


def send_chain(server, service: str, fids: list[int], rid: int = 1) -> None:
    """One request of one call chain (fids[0] calls fids[1] ...) over a real stream, acked.
    Every call enters at t0 and leaves at t0 + 1 µs, so only the innermost has self time."""
    builder = BatchBuilder()
    for fid in sorted(set(fids)):
        builder.function(fid, "deep", "f" if fid == 1 else f"f{fid}", "deep.py", fid)
    t0 = time.monotonic_ns()
    depth = len(fids)
    calls = list(range(1, depth + 1))
    builder.start(rid, "/deep", "GET", t0)
    builder.run(
        rid,
        0,
        bytes([ENTER] * depth + [EXIT] * depth),
        fids + fids[::-1],
        calls + calls[::-1],
        [t0] * depth + [t0 + 1_000] * depth,
    )
    builder.end(rid, t0 + 2_000, 200)
    stream = HostStream(server.target)
    try:
        stream.send_hello(hello(service))
        batch = builder.build(1)
        stream.send_batch(batch)
        assert stream.wait_acked({1}, timeout=120)
        assert 1 in stream.stored
    finally:
        stream.close()


def deep_json(text: str) -> Any:
    """json.loads for nesting deeper than the C scanner takes: the pure-Python scanner,
    with room for its recursion."""
    decoder = json.JSONDecoder()
    decoder.scan_once = json.scanner.py_make_scanner(decoder)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * DEEP))
    try:
        return decoder.decode(text)
    finally:
        sys.setrecursionlimit(limit)


def chain_depth(root: dict) -> int:
    depth, node = 0, root
    while node["children"]:
        (node,) = node["children"]
        depth += 1
    return depth


def test_a_request_16000_calls_deep_round_trips(server) -> None:
    send_chain(server, "deep", [1] * DEEP)
    (row,) = server.get("/api/requests", service="deep").json()["requests"]
    assert row["calls"] == DEEP

    body = server.get(f"/api/requests/{row['id']}")
    assert body.status_code == 200
    (lane,) = deep_json(body.text)["lanes"]
    assert chain_depth(lane["root"]) == DEEP

    exported = {}
    for fmt in REQUEST_FORMATS:
        response = server.get(f"/api/requests/{row['id']}/export", format=fmt)
        assert response.status_code == 200, (fmt, response.text[:200])
        exported[fmt] = response
    chrome = exported["chrome"].json()["traceEvents"]
    assert sum(1 for e in chrome if e["ph"] == "X" and e["name"] == FUNCTION) == DEEP
    opened = [e for e in exported["speedscope"].json()["profiles"][0]["events"] if e["type"] == "O"]
    assert len(opened) == DEEP + 1  # the lane's root too
    root, leaf = exported["folded"].text.splitlines()  # the stacks with self time
    assert root == "GET /deep 1000"
    frames = leaf.rpartition(" ")[0].split(SEPARATOR)
    assert frames.count(ELISION) == 1 and len(frames) == 2 * SHOWN_FRAMES + 1

    for fmt in AGGREGATE_FORMATS:
        response = server.get("/api/flamegraph", format=fmt, service="deep")
        assert response.status_code == 200, (fmt, response.text[:200])
        exported[fmt] = response
    stacks = exported["json"].json()["stacks"]
    # every stack of up to 2 * SHOWN_FRAMES frames whole, the deeper ones alike once elided;
    # and the lane's time outside the chain (its root's 1,000 ns)
    assert stacks[0] == {"stack": "(outside profiled calls)", "value": 1_000, "calls": 0}
    assert len(stacks) == 2 * SHOWN_FRAMES + 2
    assert sum(s["calls"] for s in stacks) == DEEP
    assert sum(s["value"] for s in stacks) == 2 * 1_000
    levels = exported["grafana"].json()["fields"][0]["values"]
    assert max(levels) == 2 * SHOWN_FRAMES + 1  # under the `total` root
    profile = pprof_pb2.Profile.FromString(gzip.decompress(exported["pprof"].content))
    assert sum(sample.value[0] for sample in profile.sample) == DEEP
    assert max(len(sample.location_id) for sample in profile.sample) == 2 * SHOWN_FRAMES + 1
    sampled = exported["speedscope"].json()["profiles"][0]
    assert sampled["weights"] == [1_000, 1_000]


def stack_bytes(path: str) -> int:
    """Bytes SQLite uses for the stacks table (its pages)."""
    with sqlite3.connect(path) as conn:
        query = "SELECT SUM(pgsize) FROM dbstat WHERE name = 'stack_nodes'"
        return conn.execute(query).fetchone()[0]


def test_stored_stacks_grow_linearly_with_depth(tmp_path, start_server) -> None:
    path = tmp_path / "profiler.db"
    server = start_server(f"sqlite:///{path}")
    base = stack_bytes(str(path))
    sizes = []
    for service, first, depth in (("one", 1, 2_000), ("two", 10_000, 4_000)):
        before = stack_bytes(str(path))
        send_chain(server, service, list(range(first, first + depth)))
        sizes.append(stack_bytes(str(path)) - before)
        (row,) = server.get("/api/requests", service=service).json()["requests"]
        assert row["calls"] == depth
    assert base < sizes[0]
    # twice the depth: twice the bytes (each stack is one row), not four times
    assert 1.7 < sizes[1] / sizes[0] < 2.3, sizes


def test_a_deep_stack_is_named_by_its_outer_and_inner_frames() -> None:
    tree = StackTree()
    index, names = 0, [f"m:f{i}" for i in range(3 * SHOWN_FRAMES)]
    shown = []
    for depth, name in enumerate(names, 1):
        index = tree.add(index, name)
        shown.append(tree.frames(index))
        assert tree.depth[index] == depth
    whole = 2 * SHOWN_FRAMES
    assert shown[whole - 1] == names[:whole]
    assert shown[whole] == [
        *names[:SHOWN_FRAMES],
        ELISION,
        *names[whole + 1 - SHOWN_FRAMES : whole + 1],
    ]
    assert shown[-1] == [*names[:SHOWN_FRAMES], ELISION, *names[-SHOWN_FRAMES:]]
    assert tree.name(index) == SEPARATOR.join(shown[-1])


def test_a_deep_chain_that_lost_half_its_exits_is_repaired(tmp_path, start_server) -> None:
    """Every other exit lost: the request takes the general (repairing) path, where each
    exit finds its call just below the one that lost its exit, at any depth."""
    server = start_server(f"sqlite:///{tmp_path / 'profiler.db'}")
    builder = BatchBuilder()
    builder.function(1, "deep", "f", "deep.py", 1)
    t0 = time.monotonic_ns()
    calls = list(range(1, DEEP + 1))
    kept = calls[::2][::-1]  # exits of calls 1, 3, 5 ... only, innermost first
    builder.start(1, "/lossy", "GET", t0)
    builder.run(
        1,
        0,
        bytes([ENTER] * DEEP + [EXIT] * len(kept)),
        [1] * (DEEP + len(kept)),
        calls + kept,
        [t0 + i for i in range(DEEP)] + [t0 + DEEP + i for i in range(len(kept))],
    )
    builder.end(1, t0 + 2 * DEEP, 200)
    stream = HostStream(server.target)
    try:
        stream.send_hello(hello("lossy"))
        stream.send_batch(builder.build(1))
        assert stream.wait_acked({1}, timeout=120)
    finally:
        stream.close()
    (row,) = server.get("/api/requests", service="lossy").json()["requests"]
    assert row["calls"] == DEEP and row["truncated"]
    (lane,) = deep_json(server.get(f"/api/requests/{row['id']}").text)["lanes"]
    assert chain_depth(lane["root"]) == DEEP
    missing = server.get("/metrics").text
    assert f'profiler_ingest_rejected_total{{reason="missing_exit"}} {DEEP // 2}.0' in missing
