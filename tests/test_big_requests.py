"""Requests too big to send whole: the API answers a bounded summary (calls on the same call
path merged, heaviest expanded first), says it is one, and expands a node on demand; the
parameters are checked like every other."""

from __future__ import annotations

import time
import uuid
from collections import Counter

import httpx

from profiler_core.wire import tree_pb2
from profiler_core.wire.builder import BatchBuilder
from profiler_server.api import views
from profiler_server.assembly import request_tree, summary
from profiler_server.loadgen import CallShape, HostStream, hello, synthetic_run
from tests.helpers import stored_requests

SHAPE = CallShape(calls=5000, depth=12, functions=30)


def fan_out(calls: int) -> tree_pb2.StoredTree:
    """A root calling app:f `calls` times, each f calling app:g twice; then app:h once."""
    parent, function, starts, durations, own = [-1], [0], [0], [10 * calls + 20], [0]
    for i in range(calls):
        f = len(parent)
        parent += [0, f, f]
        function += [1, 2, 2]
        starts += [10 * i, 10 * i + 1, 10 * i + 4]
        durations += [8, 2, 3]
        own += [3, 2, 3]
    parent.append(0)
    function.append(3)
    starts.append(10 * calls + 5)
    durations.append(10)
    own.append(10)
    deltas = [b - a for a, b in zip([0, *starts], starts, strict=False)]
    tree = tree_pb2.StoredTree(
        functions=["GET /x", "app:f", "app:g", "app:h"],
        parent=parent,
        function=function,
        start_delta_ns=deltas,
        duration_ns=durations,
        self_ns=own,
    )
    tree.lanes.add(id="0", kind=0, name="GET /x", root=0, parent_lane=-1, parent_node=-1)
    return tree


def shown_nodes(node: dict) -> list[dict]:
    found, todo = [], [node]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(current["children"])
    return found


def test_siblings_on_one_call_path_merge_with_counts_and_summed_times() -> None:
    tree = request_tree.read(fan_out(1000))
    [lane] = summary.summarise(tree, max_nodes=10)
    root = views.node(lane.root)
    f, h = root["children"]
    assert (f["function"], f["calls"], f["self_ns"], f["wall_ns"]) == ("app:f", 1000, 3000, 8000)
    assert (f["start_ns"], f["end_ns"]) == (0, 9998)
    [g] = f["children"]
    assert (g["function"], g["calls"], g["self_ns"], g["wall_ns"]) == ("app:g", 2000, 5000, 5000)
    assert (h["function"], h["calls"], h["hidden"]) == ("app:h", 1, 0)
    assert root["hidden"] == 0 and f["hidden"] == 0 and g["hidden"] == 0


def test_the_budget_bounds_the_answer_and_hidden_calls_say_what_is_left_out() -> None:
    tree = request_tree.read(fan_out(1000))
    [lane] = summary.summarise(tree, max_nodes=3)
    root = views.node(lane.root)
    assert len(shown_nodes(root)) == 3
    f = root["children"][0]
    assert f["children"] == [] and f["hidden"] == 2000
    below = views.node(summary.subtree(tree, f["id"], max_nodes=10))
    assert below["calls"] == 1000 and [c["calls"] for c in below["children"]] == [2000]


def test_a_deep_chain_is_cut_at_its_depth_bound_and_expands_level_by_level() -> None:
    depth = 20_000
    tree = tree_pb2.StoredTree(
        functions=["GET /deep", "app:recurse"],
        parent=[-1, *range(depth)],
        function=[0] + [1] * depth,
        start_delta_ns=[0] + [1] * depth,
        duration_ns=[3 * depth - i for i in range(depth + 1)],
        self_ns=[1] * (depth + 1),
    )
    tree.lanes.add(id="0", kind=0, name="GET /deep", root=0, parent_lane=-1, parent_node=-1)
    read = request_tree.read(tree)
    [lane] = summary.summarise(read, max_nodes=100)
    nodes = shown_nodes(views.node(lane.root))
    assert len(nodes) == 100  # the budget first
    assert [n["hidden"] for n in nodes if not n["children"]] == [1]
    [lane] = summary.summarise(read, max_nodes=1000)
    nodes = shown_nodes(views.node(lane.root))
    assert len(nodes) == summary.MAX_DEPTH + 1  # then the depth bound
    [last] = [n for n in nodes if not n["children"]]
    assert last["hidden"] == 1
    below = shown_nodes(views.node(summary.subtree(read, last["id"], max_nodes=1000)))
    assert len(below) == summary.MAX_DEPTH + 1 and below[0]["id"] == last["id"]
    assert summary.lane_of(read, depth) == "0"


def send_big(target: str, shape: CallShape) -> str:
    """One request of `shape` through the real ingest path; its id."""
    builder = BatchBuilder()
    for fid in range(1, shape.functions + 1):
        builder.function(fid, f"app.m{fid % 5}", f"f{fid}", "app.py", fid)
    start = time.monotonic_ns()
    kinds, functions, calls, times, end = synthetic_run(shape, 1, start)
    builder.start(1, "/big", "GET", start)
    builder.run(1, 0, kinds, functions, calls, times)
    builder.end(1, end, 200)
    session = uuid.uuid4()
    stream = HostStream(target)
    stream.send_hello(hello("big", session))
    stream.send_batch(builder.build(1))
    assert stream.wait_acked({1}), stream.error
    stream.close()
    return f"{session}-1"


def path_counts(root: dict) -> Counter[tuple[str, ...]]:
    """Calls per call path, from a whole tree or a summary (merged nodes count `calls`)."""
    counts: Counter[tuple[str, ...]] = Counter()
    todo = [(root, ())]
    while todo:
        node, above = todo.pop()
        path = (*above, node["function"])
        counts[path] += node.get("calls", 1)
        todo.extend((child, path) for child in node["children"])
    return counts


def test_a_big_request_comes_summarised_and_expands_a_node(server) -> None:
    rid = send_big(server.target, SHAPE)
    assert [r["calls"] for r in stored_requests(server.http, service="big")] == [SHAPE.calls]
    url = f"{server.http}/api/requests/{rid}"
    whole = httpx.get(url, timeout=60).json()
    assert whole["summarised"] is False and "calls" not in whole["lanes"][0]["root"]
    assert len(shown_nodes(whole["lanes"][0]["root"])) == SHAPE.calls + 1

    small = httpx.get(url, params={"max_nodes": "8"}, timeout=60).json()
    assert small["summarised"] is True and small["calls"] == SHAPE.calls
    root = small["lanes"][0]["root"]
    shown = shown_nodes(root)
    assert len(shown) <= 8
    expected = path_counts(whole["lanes"][0]["root"])
    assert all(expected[p] == n for p, n in path_counts(root).items())  # exact counts
    folded = next(n for n in shown if n["hidden"] > 0)
    assert folded["children"] == []

    expanded = httpx.get(url, params={"node": str(folded["id"])}, timeout=60).json()
    assert expanded["lane"] == "0" and expanded["summarised"] is True
    node = expanded["node"]
    assert (node["function"], node["calls"]) == (folded["function"], folded["calls"])
    assert sum(c["calls"] for c in node["children"]) == folded["hidden"]


def test_summary_parameters_are_checked(server) -> None:
    rid = send_big(server.target, CallShape(calls=50, depth=4, functions=5))
    url = f"{server.http}/api/requests/{rid}"
    for params, word in (
        ({"max_nodes": "0"}, "max_nodes"),
        ({"max_nodes": "200001"}, "max_nodes"),
        ({"max_nodes": "many"}, "max_nodes"),
        ({"node": "-1"}, "node"),
        ({"node": str(2**31)}, "node"),
    ):
        refused = httpx.get(url, params=params, timeout=30)
        assert refused.status_code == 400 and word in refused.json()["error"], params
    missing = httpx.get(url, params={"node": "51"}, timeout=30)  # 50 calls + the lane's root
    assert missing.status_code == 404 and "no node 51" in missing.json()["error"]
    assert httpx.get(url, params={"node": "50"}, timeout=30).status_code == 200
