"""What a user reads back: request lists with filters, one request's tree, flame graphs,
function tables, and clear errors for bad parameters."""

from __future__ import annotations

import json
import socket
import time
import uuid

import httpx
import pytest

from profiler_core.model import EventKind
from profiler_core.wire import tree_pb2
from profiler_core.wire.builder import BatchBuilder
from profiler_server.api import spec, views
from profiler_server.api.http import FastJSONResponse
from profiler_server.api.params import BadParameter
from profiler_server.assembly import request_tree
from profiler_server.loadgen import HostStream, hello
from tests.helpers import metric_value, stored_requests

ENTER, EXIT = EventKind.ENTER, EventKind.EXIT
MS = 1_000_000


def handler_request(builder: BatchBuilder, rid: int, route: str, t0: int, slow_ms: int) -> None:
    """handler -> (load x2 -> query), render; load's query takes `slow_ms` ms each."""
    events = [
        (ENTER, 1, 1, 0),
        (ENTER, 2, 2, 1 * MS),
        (ENTER, 3, 3, 2 * MS),
        (EXIT, 3, 3, (2 + slow_ms) * MS),
        (EXIT, 2, 2, (3 + slow_ms) * MS),
        (ENTER, 2, 4, (4 + slow_ms) * MS),
        (ENTER, 3, 5, (5 + slow_ms) * MS),
        (EXIT, 3, 5, (5 + 2 * slow_ms) * MS),
        (EXIT, 2, 4, (6 + 2 * slow_ms) * MS),
        (ENTER, 4, 6, (7 + 2 * slow_ms) * MS),
        (EXIT, 4, 6, (9 + 2 * slow_ms) * MS),
        (EXIT, 1, 1, (10 + 2 * slow_ms) * MS),
    ]
    builder.start(rid, route, "GET", t0)
    builder.run(
        rid,
        0,
        bytes(e[0] for e in events),
        [e[1] for e in events],
        [e[2] for e in events],
        [t0 + e[3] for e in events],
    )
    builder.end(rid, t0 + (11 + 2 * slow_ms) * MS, 200)


def load(server, service: str = "shop") -> None:
    builder = BatchBuilder()
    for fid, name in enumerate(["handler", "load", "query", "render"], start=1):
        builder.function(fid, "shop.views", name, "views.py", fid * 10)
    t0 = time.monotonic_ns()
    for rid, (route, slow) in enumerate([("/a", 1), ("/a", 5), ("/b", 20)], start=1):
        handler_request(builder, rid, route, t0 + rid * 100 * MS, slow)
    stream = HostStream(server.target)
    stream.send_hello(hello(service, uuid.uuid4()))
    stream.send_batch(builder.build(1))
    assert stream.wait_acked({1})
    stream.close()


def test_request_list_filters_and_orders(server) -> None:
    load(server)
    listed = stored_requests(server.http)
    assert [r["duration_ms"] for r in listed] == [51.0, 21.0, 13.0]  # slowest first
    assert {r["route"] for r in stored_requests(server.http, route="/a")} == {"/a"}
    assert len(stored_requests(server.http, min_duration_ms="20")) == 2
    assert stored_requests(server.http, service="nope") == []
    by_start = stored_requests(server.http, order="start")
    assert [r["duration_ms"] for r in by_start] == [51.0, 21.0, 13.0]  # newest first
    assert len(stored_requests(server.http, limit="1")) == 1
    first = listed[-1]
    assert first["status"] == 200 and first["method"] == "GET" and first["calls"] == 6
    assert first["start"].endswith("Z")
    assert stored_requests(server.http, since=first["start"]) != []
    assert stored_requests(server.http, until="1970-01-02T00:00:00Z") == []


def test_request_pages_count_the_whole_match_and_services_list_their_routes(server) -> None:
    load(server)
    load(server, service="other")

    def page(**params: str) -> dict:
        return httpx.get(f"{server.http}/api/requests", params=params, timeout=30).json()

    first, second = page(limit="4"), page(limit="4", offset="4")
    assert first["total"] == second["total"] == 6 and not first["total_capped"]
    assert len(first["requests"]) == 4 and len(second["requests"]) == 2
    ids = [r["id"] for r in first["requests"] + second["requests"]]
    assert len(set(ids)) == 6  # pages neither overlap nor skip, durations tie across services
    assert page(route="/a", function="shop.views:query")["total"] == 4
    assert page(offset="99")["requests"] == []
    names = httpx.get(f"{server.http}/api/services", timeout=30).json()["services"]
    assert names == [
        {"service": "other", "routes": ["/a", "/b"]},
        {"service": "shop", "routes": ["/a", "/b"]},
    ]
    none = httpx.get(f"{server.http}/api/services", params={"until": "1970-01-02T00:00:00Z"})
    assert none.json() == {"services": []}


def test_status_and_duration_range_filters(server) -> None:
    load(server)
    assert [r["duration_ms"] for r in stored_requests(server.http, max_duration_ms="21")] == [
        21.0,
        13.0,
    ]
    between = stored_requests(server.http, min_duration_ms="15", max_duration_ms="30")
    assert [r["duration_ms"] for r in between] == [21.0]
    assert len(stored_requests(server.http, status="200")) == 3
    assert len(stored_requests(server.http, status="2xx")) == 3
    assert stored_requests(server.http, status="5xx") == []
    assert stored_requests(server.http, status="404") == []
    bad = httpx.get(f"{server.http}/api/requests", params={"status": "oops"})
    assert bad.status_code == 400 and "status" in bad.json()["error"]


def test_slowest_requests_that_called_a_function(server) -> None:
    load(server)
    found = stored_requests(server.http, function="shop.views:query", limit="2")
    assert [r["duration_ms"] for r in found] == [51.0, 21.0]
    assert stored_requests(server.http, function="shop.views:missing") == []


def test_one_request_has_its_whole_tree(server) -> None:
    load(server)
    slowest = stored_requests(server.http)[0]
    body = httpx.get(f"{server.http}/api/requests/{slowest['id']}").json()
    [lane] = body["lanes"]
    assert lane["kind"] == "main" and lane["parent_lane"] is None
    root = lane["root"]
    assert root["function"] == "GET /b" and root["start_ns"] == 0 and root["end_ns"] == 51 * MS
    [handler] = root["children"]
    assert handler["function"] == "shop.views:handler"
    assert [c["function"] for c in handler["children"]] == [
        "shop.views:load",
        "shop.views:load",
        "shop.views:render",
    ]
    query = handler["children"][0]["children"][0]
    assert query["function"] == "shop.views:query"
    assert (query["start_ns"], query["end_ns"], query["self_ns"]) == (2 * MS, 22 * MS, 20 * MS)
    assert handler["self_ns"] == 50 * MS - (22 + 22 + 2) * MS
    assert query["outcome"] == "return"
    sources = {f["function"]: (f["file"], f["line"]) for f in body["functions"]}
    assert sources == {
        "shop.views:handler": ("views.py", 10),
        "shop.views:load": ("views.py", 20),
        "shop.views:query": ("views.py", 30),
        "shop.views:render": ("views.py", 40),
    }


def test_flamegraph_and_functions_aggregate_the_range(server) -> None:
    load(server)
    folded = httpx.get(f"{server.http}/api/flamegraph", params={"format": "folded"}).text
    lines = dict(line.rsplit(" ", 1) for line in folded.splitlines())
    query_stack = "shop.views:handler;shop.views:load;shop.views:query"
    assert int(lines[query_stack]) == 2 * (1 + 5 + 20) * MS
    only_a = httpx.get(f"{server.http}/api/flamegraph", params={"route": "/a"}).text
    assert int(dict(x.rsplit(" ", 1) for x in only_a.splitlines())[query_stack]) == 12 * MS
    as_json = httpx.get(f"{server.http}/api/flamegraph", params={"format": "json"}).json()
    assert {s["stack"]: s["calls"] for s in as_json["stacks"]}[query_stack] == 6

    functions = httpx.get(f"{server.http}/api/functions").json()["functions"]
    query = next(f for f in functions if f["function"] == "shop.views:query")
    assert query["calls"] == 6 and query["self_ns"] == 52 * MS and query["max_ns"] == 20 * MS
    assert query["file"] == "views.py" and query["line"] == 30
    handler = next(f for f in functions if f["function"] == "shop.views:handler")
    assert handler["total_ns"] == (12 + 20 + 50) * MS


def test_bad_parameters_get_clear_errors(server) -> None:
    for params in ({"since": "yesterday"}, {"min_duration_ms": "x"}, {"order": "size"}):
        response = httpx.get(f"{server.http}/api/requests", params=params)
        assert response.status_code == 400
        assert next(iter(params)) in response.json()["error"]
    missing = httpx.get(f"{server.http}/api/requests/nope")
    assert missing.status_code == 404 and missing.json() == {"error": "no such request"}
    assert httpx.get(f"{server.http}/api/flamegraph", params={"format": "x"}).status_code == 400
    assert httpx.get(f"{server.http}/healthz").text == "ok\n"


# Each answered 500 once (issue 17): overflows, a lone superscript digit, a NUL on PostgreSQL.
BAD_URLS = [
    ("/api/requests?limit=inf", "limit", "not_an_integer"),
    ("/api/requests?limit=1001", "limit", "out_of_range"),
    ("/api/requests?limit=0", "limit", "out_of_range"),
    ("/api/requests?offset=-1", "offset", "out_of_range"),
    ("/api/services?since=yesterday", "since", "not_a_time"),
    ("/api/requests?min_duration_ms=1e15", "min_duration_ms", "out_of_range"),
    ("/api/requests?max_duration_ms=nan", "max_duration_ms", "not_a_number"),
    ("/api/requests?min_duration_ms=1e999", "min_duration_ms", "out_of_range"),
    ("/api/requests?since=9999-12-31T23:59:59Z", "since", "out_of_range"),
    ("/api/requests?until=0001-01-01T00:00:00%2B14:00", "until", "out_of_range"),
    ("/api/requests?since=2026-11-22T10:00:00", "since", "no_time_zone"),
    ("/api/requests?status=%C2%B2", "status", "malformed"),
    ("/api/requests?status=404%0A", "status", "malformed"),
    ("/api/requests?service=a%00b", "service", "nul_character"),
    ("/api/requests?route=" + "r" * 501, "route", "too_long"),
    ("/api/requests?limit=" + "9" * 5000, "limit", "too_long"),
    ("/api/flamegraph?format=pprof&since=1e20", "since", "out_of_range"),
    ("/api/functions?until=-1", "until", "out_of_range"),
    ("/api/requests/%00", "request_id", "nul_character"),
    ("/api/requests/a%00b/export", "request_id", "nul_character"),
    ("/api/requests/" + "x" * 65, "request_id", "too_long"),
]


def test_bad_urls_get_a_400_naming_the_parameter_and_are_counted(server) -> None:
    load(server)
    for url, name, reason in BAD_URLS:
        before = metric_value(
            server.http, "profiler_api_rejected_total", parameter=name, reason=reason
        )
        response = httpx.get(server.http + url)
        assert response.status_code == 400, url
        assert response.json()["error"].startswith(f"{name}: "), url
        after = metric_value(
            server.http, "profiler_api_rejected_total", parameter=name, reason=reason
        )
        assert after == before + 1, url
    blank = {"service": "", "route": "", "since": "", "limit": "", "order": "", "status": ""}
    assert len(stored_requests(server.http, **blank)) == 3  # blank: as if absent
    invalid_utf8 = httpx.get(f"{server.http}/api/requests/%ff%fe")
    assert invalid_utf8.status_code == 404
    assert httpx.get(f"{server.http}/api/requests?route=%ed%b3%bf%ff").status_code == 200


def test_parameters_parse_to_exact_values() -> None:
    since, status, limit = spec.SINCE, spec.STATUS, spec.LIMIT
    ten = since.parse("2026-11-22T10:00:00Z")
    assert ten == 1_795_341_600 * 10**9
    assert since.parse("2026-11-22T11:00:00+01:00") == ten
    assert since.parse("2026-11-22T10:00:00.000001Z") == ten + 1000
    assert since.parse("1795341600.5") == ten + 500_000_000
    assert since.parse(None) is None
    assert status.parse("5XX") == (500, 600) and status.parse("404") == (404, 405)
    assert limit.parse(None) == 100 and limit.parse("+7") == 7
    for param, raw in ((since, "2200-01-01T00:00:00Z"), (limit, "1e3"), (status, "6xx")):
        with pytest.raises(BadParameter):
            param.parse(raw)


def raw_get(server, target: bytes) -> bytes:
    """A request line as sent, bytes no HTTP client would send unescaped included."""
    with socket.create_connection(("127.0.0.1", server.server.http_port), timeout=30) as conn:
        conn.sendall(
            b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer.split(b"\r\n", 1)[0]


def test_raw_bytes_in_the_request_line_are_refused_by_the_http_server(server) -> None:
    load(server)
    for target in (b"/api/requests/\xff\xfe", b"/api/requests?service=\xed\xb3\xbf"):
        assert raw_get(server, target) == b"HTTP/1.1 400 Bad Request"
    assert raw_get(server, b"/api/requests?limit=1") == b"HTTP/1.1 200 OK"


def test_limit_beyond_its_maximum_is_refused_not_capped(server) -> None:
    load(server)
    assert len(stored_requests(server.http, limit="1000")) == 3
    refused = httpx.get(f"{server.http}/api/requests", params={"limit": "1001"})
    assert refused.json() == {"error": "limit: from 1 to 1,000, got 1,001"}


def test_stored_columns_become_the_documented_tree_shape() -> None:
    """Two lanes (the task hangs under the handler that spawned it), a coroutine that
    suspended and raised: every field of docs/api.md's node shape, exactly."""
    main = tree_pb2.StoredLane(id="0", kind=0, name="GET /x", root=0, parent_lane=-1)
    task = tree_pb2.StoredLane(id="1", kind=1, name="worker", root=2, parent_lane=0)
    main.parent_node, task.parent_node = -1, 1
    tree = tree_pb2.StoredTree(
        functions=["GET /x", "shop:handler", "worker", "shop:job"],
        lanes=[main, task],
        parent=[-1, 0, -1, 2],
        function=[0, 1, 2, 3],
        start_delta_ns=[0, 5, 15, 5],
        duration_ns=[100, 90, 30, 20],
        self_ns=[10, 60, 10, 20],
        suspended_node=[3],
        active_ns=[8],
        await_ns=[10],
        ready_ns=[2],
        max_slice_ns=[5],
        suspensions=[2],
        outcome_node=[3],
        outcome=bytes([1]),
        wait_node=[3],
        wait_start_ns=[28],
        wait_ready_ns=[5],
        wait_ns=[10],
        charged_node=[3],
        charged_await_ns=[7],
        charged_ready_ns=[2],
    )

    def node(i: int, function: str, start: int, end: int, self_ns: int, *children, **extra):
        return {
            "id": i,
            "function": function,
            "start_ns": start,
            "end_ns": end,
            "self_ns": self_ns,
            "self_await_ns": 0,
            "self_ready_ns": 0,
            "active_ns": end - start,
            "await_ns": 0,
            "ready_ns": 0,
            "max_slice_ns": end - start,
            "suspensions": 0,
            "outcome": "return",
            "children": list(children),
        } | extra

    job = node(
        3, "shop:job", 25, 45, 20,
        active_ns=8, await_ns=10, ready_ns=2, max_slice_ns=5, suspensions=2, outcome="exception",
        self_await_ns=7, self_ready_ns=2,
        waits=[{"start_ns": 28, "ready_ns": 33, "end_ns": 38}],
    )  # fmt: skip
    expected = [
        {
            "id": "0",
            "kind": "main",
            "name": "GET /x",
            "parent_lane": None,
            "parent_node": None,
            "root": node(0, "GET /x", 0, 100, 10, node(1, "shop:handler", 5, 95, 60)),
        },
        {
            "id": "1",
            "kind": "task",
            "name": "worker",
            "parent_lane": "0",
            "parent_node": 1,
            "root": node(2, "worker", 20, 50, 10, job),
        },
    ]
    read = request_tree.read(tree)
    assert views.lanes(read.whole()) == expected
    assert FastJSONResponse(views.whole_lanes(read)).body == FastJSONResponse(expected).body
    body = {"lanes": expected, "duration_ms": 0.1, "note": "é", "status": None}
    encoded = FastJSONResponse(body).body
    assert encoded == json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    huge = {"total_ns": 2**70}  # beyond orjson's 64 bits: the stdlib encodes it
    assert json.loads(FastJSONResponse(huge).body) == huge


def test_whole_lanes_answers_what_lanes_of_whole_does() -> None:
    """The request API's columns-to-JSON path and the Node path the summaries and exports
    share give the same bytes, on a random tree of many lanes, waits and outcomes."""
    import random

    rng = random.Random(7)
    size = 3_000
    parent = [-1 if i in (0, 1000, 2000) else rng.randrange(i) for i in range(size)]
    waited = sorted(rng.sample(range(size), 300))
    tree = tree_pb2.StoredTree(
        functions=["(lane)", *(f"app:f{i}" for i in range(40))],
        parent=parent,
        function=[rng.randrange(41) for _ in range(size)],
        start_delta_ns=[rng.randrange(100) for _ in range(size)],
        duration_ns=[rng.randrange(10_000) for _ in range(size)],
        self_ns=[rng.randrange(1_000) for _ in range(size)],
        suspended_node=waited,
        active_ns=[rng.randrange(100) for _ in waited],
        await_ns=[rng.randrange(100) for _ in waited],
        ready_ns=[rng.randrange(100) for _ in waited],
        max_slice_ns=[rng.randrange(100) for _ in waited],
        suspensions=[1 for _ in waited],
        outcome_node=waited[:50],
        outcome=bytes(rng.randrange(4) for _ in range(50)),
        wait_node=[i for i in waited for _ in range(2)],
        wait_start_ns=[rng.randrange(100) for _ in range(600)],
        wait_ready_ns=[rng.randrange(-1, 50) for _ in range(600)],
        wait_ns=[rng.randrange(100) for _ in range(600)],
    )
    for lane_id, root, parent_lane in (("0", 0, -1), ("1", 1000, 0), ("2", 2000, 1)):
        tree.lanes.add(
            id=lane_id, kind=1, name=f"lane {lane_id}", root=root, parent_lane=parent_lane
        )
    read = request_tree.read(tree)
    expected = FastJSONResponse(views.lanes(read.whole())).body
    assert FastJSONResponse(views.whole_lanes(read)).body == expected
    assert expected.count(b'"waits"') == 300


def test_lanes_that_recorded_nothing_are_not_shown() -> None:
    """A pool thread or a task that ran nothing instrumented is noise; an empty lane that
    spawned a lane with calls stays, so that lane still hangs where it was spawned."""
    tree = tree_pb2.StoredTree(
        functions=["(lane)", "app:f", "app:g"],
        parent=[-1, 0, -1, -1, -1, 4],
        function=[0, 1, 0, 0, 0, 2],
        start_delta_ns=[0] * 6,
        duration_ns=[10] * 6,
        self_ns=[0] * 6,
    )
    for lane_id, root, parent in (("0", 0, -1), ("1", 2, 0), ("2", 3, 0), ("3", 4, 2)):
        tree.lanes.add(id=lane_id, kind=0, name=f"lane {lane_id}", root=root, parent_lane=parent)
    shown = views.lanes(request_tree.read(tree).whole())
    assert [lane["id"] for lane in shown] == ["0", "2", "3"]
