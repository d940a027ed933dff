"""Exports a user loads into other tools: one request as speedscope, Chrome trace or folded
stacks; the aggregate as speedscope, pprof and Grafana's flame graph frame; and the stacks
forwarded to Pyroscope's documented `/ingest` API (checked on a local receiver: no
Pyroscope server runs on these machines)."""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import jsonschema
import pytest

from profiler_core.wire import pprof_pb2, tree_pb2
from profiler_server import cli
from profiler_server.assembly import request_tree
from profiler_server.exports import RequestProfile, chrome, speedscope
from tests.helpers import eventually, metric_value, stored_requests
from tests.test_api import MS, load

SCHEMA = json.loads((Path(__file__).parent / "data/speedscope-file-format-schema.json").read_text())
QUERY_STACK = "shop.views:handler;shop.views:load;shop.views:query"


def folded_totals(text: str) -> Counter:
    totals: Counter = Counter()
    for line in text.splitlines():
        stack, value = line.rsplit(" ", 1)
        totals[stack] += int(value)
    return totals


def api_stacks(server, **params: str) -> dict[str, tuple[int, int]]:
    body = server.get("/api/flamegraph", format="json", **params).json()
    return {s["stack"]: (s["value"], s["calls"]) for s in body["stacks"]}


def slowest(server) -> tuple[dict, dict]:
    """The slowest stored request: its summary and its tree as the API shows it."""
    summary = stored_requests(server.http)[0]
    return summary, server.get(f"/api/requests/{summary['id']}").json()


def preorder(node: dict, depth: int = 0) -> Iterator[tuple[dict, int]]:
    yield node, depth
    for child in node["children"]:
        yield from preorder(child, depth + 1)


def replay(profile: dict, frames: list[dict]) -> list[tuple[str, int, int, int]]:
    """An evented profile's calls (name, depth, open, close) in open order; fails unless the
    events are balanced and never go back in time, as speedscope requires."""
    stack: list[int] = []
    calls: list[list] = []
    last = profile["startValue"]
    for event in profile["events"]:
        assert event["at"] >= last, "events must not go back in time"
        last = event["at"]
        if event["type"] == "O":
            stack.append(len(calls))
            calls.append([frames[event["frame"]]["name"], len(stack) - 1, event["at"], None])
        else:
            opened = calls[stack.pop()]
            assert opened[0] == frames[event["frame"]]["name"], "close must match the open frame"
            opened[3] = event["at"]
    assert not stack and last <= profile["endValue"]
    return [tuple(c) for c in calls]


def assert_nested(slices: list[tuple[float, float]]) -> None:
    """Slices of one thread nest like a stack (what Perfetto needs of `X` events)."""
    ends: list[float] = []  # of the enclosing slices, innermost last
    for ts, dur in sorted(slices, key=lambda s: (s[0], -s[1])):
        while ends and ends[-1] <= ts:
            ends.pop()
        assert not ends or ts + dur <= ends[-1], "slices must nest"
        ends.append(ts + dur)


def export(server, request_id: str, fmt: str) -> httpx.Response:
    return server.get(f"/api/requests/{request_id}/export", format=fmt)


# --- one request -----------------------------------------------------------------------------


def test_request_as_speedscope_replays_the_call_tree(server) -> None:
    load(server)
    summary, body = slowest(server)
    response = export(server, summary["id"], "speedscope")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    disposition = response.headers["content-disposition"]
    assert disposition == f'attachment; filename="request-{summary["id"]}.speedscope.json"'
    document = response.json()
    jsonschema.validate(document, SCHEMA)
    [profile] = document["profiles"]
    assert profile["type"] == "evented" and profile["unit"] == "nanoseconds"
    root = body["lanes"][0]["root"]
    assert (profile["startValue"], profile["endValue"]) == (0, root["end_ns"]) == (0, 51 * MS)
    calls = replay(profile, document["shared"]["frames"])
    expected = [(n["function"], d, n["start_ns"], n["end_ns"]) for n, d in preorder(root)]
    assert calls == expected
    names = [f["name"] for f in document["shared"]["frames"]]
    assert len(names) == len(set(names)) == 5  # the lane and 4 functions, each once


def test_request_as_chrome_trace_for_perfetto(server) -> None:
    load(server)
    summary, body = slowest(server)
    response = export(server, summary["id"], "chrome")
    assert response.status_code == 200
    assert response.headers["content-disposition"].endswith('.trace.json"')
    events = response.json()["traceEvents"]
    metadata = {(e["name"], e["tid"]): e["args"] for e in events if e["ph"] == "M"}
    assert metadata[("process_name", 0)] == {"name": "shop GET /b"}
    assert metadata[("thread_name", 1)] == {"name": "GET /b (main)"}
    slices = [e for e in events if e["ph"] == "X"]
    assert {(e["pid"], e["tid"]) for e in slices} == {(1, 1)}
    nodes = [n for n, _ in preorder(body["lanes"][0]["root"])]
    assert [e["name"] for e in slices] == [n["function"] for n in nodes]
    for event, node in zip(slices, nodes, strict=True):
        assert event["ts"] == node["start_ns"] / 1000
        assert event["dur"] == (node["end_ns"] - node["start_ns"]) / 1000
        assert event["args"]["self_ns"] == node["self_ns"]
        for key in ("active_ns", "await_ns", "ready_ns", "outcome"):
            assert event["args"][key] == node[key]
    assert_nested([(e["ts"], e["dur"]) for e in slices])
    query = next(e for e in slices if e["name"] == "shop.views:query")
    assert (query["ts"], query["dur"]) == (2000.0, 20000.0)  # µs


def test_request_as_folded_stacks(server) -> None:
    load(server)
    summary, _ = slowest(server)
    response = export(server, summary["id"], "folded")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    assert response.headers["content-disposition"].endswith('.folded"')
    totals = folded_totals(response.text)
    assert totals == {
        "GET /b": 1 * MS,
        "GET /b;shop.views:handler": 4 * MS,
        "GET /b;shop.views:handler;shop.views:load": 4 * MS,
        f"GET /b;{QUERY_STACK}": 40 * MS,
        "GET /b;shop.views:handler;shop.views:render": 2 * MS,
    }
    assert sum(totals.values()) == 51 * MS  # every ns of the request, once


def test_export_errors_are_clear(server) -> None:
    load(server)
    summary, _ = slowest(server)
    missing = server.get("/api/requests/nope/export", format="chrome")
    assert missing.status_code == 404 and missing.json() == {"error": "no such request"}
    bad = export(server, summary["id"], "pdf")
    assert bad.status_code == 400
    assert bad.json() == {"error": "format: expected one of speedscope, chrome, folded"}
    default = export(server, summary["id"], "")
    assert default.status_code == 200 and default.json()["profiles"][0]["type"] == "evented"
    not_aggregate = server.get("/api/flamegraph", format="chrome")
    assert not_aggregate.status_code == 400
    assert "grafana" in not_aggregate.json()["error"]


def overlapping_tree() -> tree_pb2.StoredTree:
    """Two lanes; in the main one a generator (`gen`, 10-60) spans a sibling call (`work`,
    20-30) that its caller made while it was suspended."""
    main = tree_pb2.StoredLane(id="0", kind=0, name="GET /x", root=0, parent_lane=-1)
    task = tree_pb2.StoredLane(id="1", kind=1, name="worker", root=4, parent_lane=0)
    main.parent_node, task.parent_node = -1, 1
    return tree_pb2.StoredTree(
        functions=["GET /x", "shop:handler", "shop:gen", "shop:work", "worker", "shop:job"],
        lanes=[main, task],
        parent=[-1, 0, 1, 1, -1, 4],
        function=[0, 1, 2, 3, 4, 5],
        start_delta_ns=[0, 5, 5, 10, 0, 5],
        duration_ns=[100, 90, 50, 10, 30, 20],
        self_ns=[10, 30, 50, 10, 10, 20],
        suspended_node=[2],
        active_ns=[20],
        await_ns=[0],
        ready_ns=[0],
        max_slice_ns=[10],
        suspensions=[2],
    )


def test_overlapping_calls_stay_nested_in_timeline_formats() -> None:
    summary = {"id": "r-1", "service": "shop", "method": "GET", "route": "/x"}
    summary["start"] = "2026-11-23T10:00:00.000000Z"
    profile = RequestProfile(summary, request_tree.read(overlapping_tree()).whole())
    document = json.loads(speedscope.render_request(profile))
    jsonschema.validate(document, SCHEMA)
    frames = document["shared"]["frames"]
    main, task = (replay(p, frames) for p in document["profiles"])
    assert main == [
        ("GET /x", 0, 0, 100),
        ("shop:handler", 1, 5, 95),
        ("shop:gen", 2, 10, 60),
        ("shop:work", 2, 60, 60),  # moved after the generator it overlapped
    ]
    assert task == [("worker", 0, 20, 50), ("shop:job", 1, 25, 45)]
    events = json.loads(chrome.render_request(profile))["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    for tid in (1, 2):
        assert_nested([(e["ts"], e["dur"]) for e in slices if e["tid"] == tid])
    gen = next(e for e in slices if e["name"] == "shop:gen")
    assert gen["args"]["active_ns"] == 20 and gen["args"]["suspensions"] == 2
    assert [e["args"]["name"] for e in events if e["name"] == "thread_name"] == [
        "GET /x (main)",
        "worker (task)",
    ]


# --- the aggregate ---------------------------------------------------------------------------


def test_flamegraph_as_speedscope_sampled_profile(server) -> None:
    load(server)
    document = server.get("/api/flamegraph", format="speedscope", service="shop").json()
    jsonschema.validate(document, SCHEMA)
    [profile] = document["profiles"]
    assert profile["type"] == "sampled" and profile["unit"] == "nanoseconds"
    assert document["name"] == "shop" and profile["name"] == "shop (wall)"
    frames = [f["name"] for f in document["shared"]["frames"]]
    got = {
        ";".join(frames[i] for i in sample): weight
        for sample, weight in zip(profile["samples"], profile["weights"], strict=True)
    }
    expected = {stack: n for stack, (n, _) in api_stacks(server).items() if n > 0}
    assert got == expected
    assert got[QUERY_STACK] == 2 * (1 + 5 + 20) * MS
    assert profile["endValue"] - profile["startValue"] == sum(profile["weights"])


def test_flamegraph_as_gzipped_pprof(server) -> None:
    load(server)
    response = server.get("/api/flamegraph", format="pprof")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.headers["content-disposition"] == 'attachment; filename="flamegraph.pb.gz"'
    profile = pprof_pb2.Profile.FromString(gzip.decompress(response.content))
    strings = profile.string_table
    assert strings[0] == ""
    assert [(strings[t.type], strings[t.unit]) for t in profile.sample_type] == [
        ("calls", "count"),
        ("wall", "nanoseconds"),
    ]
    assert strings[profile.default_sample_type] == "wall"
    functions = {f.id: f for f in profile.function}
    locations = {loc.id: loc for loc in profile.location}
    got = {}
    for sample in profile.sample:
        # the leaf is location_id[0]
        names = [
            strings[functions[locations[i].line[0].function_id].name] for i in sample.location_id
        ]
        got[";".join(reversed(names))] = (sample.value[1], sample.value[0])
    stored = api_stacks(server)
    assert got == stored
    assert sum(s.value[1] for s in profile.sample) == sum(n for n, _ in stored.values())
    assert sum(s.value[0] for s in profile.sample) == 3 * 6  # 3 requests of 6 calls
    query = next(f for f in functions.values() if strings[f.name] == "shop.views:query")
    assert (strings[query.filename], query.start_line) == ("views.py", 30)


def test_every_flamegraph_format_follows_the_value(server) -> None:
    load(server)
    for value in ("running", "awaiting", "ready", "calls"):
        stored = api_stacks(server, value=value)
        body = server.get("/api/flamegraph", format="json", value=value).json()
        assert (body["value"], body["unit"]) == (
            value,
            "count" if value == "calls" else "nanoseconds",
        )
        folded = server.get("/api/flamegraph", format="folded", value=value).text
        assert folded_totals(folded) == {s: n for s, (n, _) in stored.items() if n > 0}
        response = server.get("/api/flamegraph", format="pprof", value=value)
        profile = pprof_pb2.Profile.FromString(gzip.decompress(response.content))
        strings = profile.string_table
        types = [(strings[t.type], strings[t.unit]) for t in profile.sample_type]
        assert strings[profile.default_sample_type] == value
        assert types == [("calls", "count")] + ([(value, "nanoseconds")] * (value != "calls"))
        assert sum(s.value[-1] for s in profile.sample) == sum(n for n, _ in stored.values())
        document = server.get("/api/flamegraph", format="speedscope", value=value).json()
        jsonschema.validate(document, SCHEMA)
        [sampled] = document["profiles"]
        assert sampled["unit"] == ("none" if value == "calls" else "nanoseconds")
        assert sum(sampled["weights"]) == sum(n for n, _ in stored.values())
    calls = api_stacks(server, value="calls")
    assert all(n == c for n, c in calls.values())
    wall = api_stacks(server)
    running = api_stacks(server, value="running")
    assert wall == running  # these requests are plain calls: they never wait
    bad = server.get("/api/flamegraph", value="self")
    assert bad.status_code == 400 and "wall, running, awaiting, ready, calls" in bad.text


def test_flamegraph_as_grafana_nested_set(server) -> None:
    load(server)
    frame = server.get("/api/flamegraph", format="grafana", route="/a").json()
    assert frame["meta"]["preferredVisualisationType"] == "flamegraph"
    fields = {f["name"]: f["values"] for f in frame["fields"]}
    assert list(fields) == ["level", "value", "self", "label"]
    levels, values, selfs, labels = (fields[k] for k in ("level", "value", "self", "label"))
    assert levels[0] == 0 and labels[0] == "total" and levels.count(0) == 1
    stored = api_stacks(server, route="/a")
    assert values[0] == sum(n for n, _ in stored.values())
    # preorder: a row's parent is the nearest earlier row one level up
    children_total = [0] * len(levels)
    path: list[str] = []  # labels from the root's child down to this row
    stacks: dict[str, int] = {}
    for i in range(1, len(levels)):
        level = levels[i]
        assert 1 <= level <= levels[i - 1] + 1, "a child's level is its parent's + 1"
        parent = max(j for j in range(i) if levels[j] == level - 1)
        children_total[parent] += values[i]
        path[level - 1 :] = [labels[i]]
        if selfs[i]:
            stacks[";".join(path)] = selfs[i]
    assert values == [s + c for s, c in zip(selfs, children_total, strict=True)]
    assert stacks == {s: n for s, (n, _) in stored.items() if n > 0}
    assert stacks[QUERY_STACK] == 12 * MS


# --- Pyroscope -------------------------------------------------------------------------------


@dataclass
class Receiver:
    """A local HTTP server standing in for Pyroscope: records every request."""

    status: int = 200
    delay: float = 0.0
    received: list[dict] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            parts = urlsplit(self.path)
            state.received.append(
                {"path": parts.path, "query": parse_qs(parts.query), "body": body.decode()}
            )
            time.sleep(state.delay)
            self.send_response(state.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    state.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.server.daemon_threads = True
    thread = threading.Thread(target=state.server.serve_forever, daemon=True)
    thread.start()
    yield state
    state.server.shutdown()
    state.server.server_close()


def pushed_stacks(receiver: Receiver, name: str) -> Counter:
    totals: Counter = Counter()
    for push in receiver.received:
        if push["query"]["name"] == [name]:
            totals += folded_totals(push["body"])
    return totals


def test_stacks_are_pushed_to_pyroscope_ingest(start_server, tmp_path, receiver) -> None:
    server = start_server(
        f"sqlite:///{tmp_path / 'p.db'}", pyroscope_url=receiver.url, pyroscope_interval=0.2
    )
    load(server, "shop")
    load(server, "shop {eu}")
    for service, app in (("shop", "shop"), ("shop {eu}", "shop__eu_")):
        for value in ("wall", "running"):  # `.wall` is true wall; running its own type
            stored = {
                s: n
                for s, (n, _) in api_stacks(server, service=service, value=value).items()
                if n > 0
            }
            assert stored
            name = f"{app}.{value}{{}}"
            assert eventually(lambda n=name, s=stored: pushed_stacks(receiver, n) == s)
    for push in receiver.received:
        assert push["path"] == "/ingest"
        query = {k: v[0] for k, v in push["query"].items()}
        assert set(query) == {"name", "from", "until", "format", "sampleRate", "spyName"}
        assert query["format"] == "folded" and query["spyName"] == "request-profiler"
        assert query["sampleRate"] == "1000000000"  # values are ns: Pyroscope's period is 1 ns
        since, until = int(query["from"]), int(query["until"])
        assert until > since and abs(until - time.time()) < 60
        assert all(int(line.rsplit(" ", 1)[1]) > 0 for line in push["body"].splitlines())
    assert metric_value(server.http, "profiler_pyroscope_pushes_total") >= 2
    assert metric_value(server.http, "profiler_pyroscope_push_errors_total") == 0


def test_pyroscope_failures_are_counted_and_never_stop_ingest(
    start_server, tmp_path, receiver
) -> None:
    receiver.status = 500
    server = start_server(
        f"sqlite:///{tmp_path / 'p.db'}", pyroscope_url=receiver.url, pyroscope_interval=0.2
    )
    load(server)
    errors = "profiler_pyroscope_push_errors_total"
    assert eventually(lambda: metric_value(server.http, errors, kind="http") >= 1)
    receiver.status, receiver.delay = 200, 5.0  # answers after the 0.2 s timeout
    load(server, "slow")
    assert eventually(lambda: metric_value(server.http, errors, kind="timeout") >= 1)
    started = time.monotonic()
    load(server, "meanwhile")  # stored and acked while pushes time out
    assert time.monotonic() - started < 5
    assert len(stored_requests(server.http, service="meanwhile")) == 3


def test_unreachable_pyroscope_is_a_connection_error(start_server, tmp_path) -> None:
    server = start_server(
        f"sqlite:///{tmp_path / 'p.db'}",
        pyroscope_url="http://127.0.0.1:9",  # discard port: nothing listens
        pyroscope_interval=0.2,
    )
    load(server)
    errors = "profiler_pyroscope_push_errors_total"
    assert eventually(lambda: metric_value(server.http, errors, kind="connection") >= 1)
    assert server.get("/healthz").text == "ok\n"


def test_pyroscope_options(monkeypatch) -> None:
    monkeypatch.delenv("PROFILER_PYROSCOPE_URL", raising=False)
    assert cli.parse([]).pyroscope_url == ""  # off by default
    monkeypatch.setenv("PROFILER_PYROSCOPE_URL", "http://pyroscope:4040/")
    settings = cli.parse(["--pyroscope-interval", "30s"])
    assert settings.pyroscope_url == "http://pyroscope:4040"
    assert settings.pyroscope_interval == 30
    with pytest.raises(SystemExit, match="--pyroscope-url"):
        cli.parse(["--pyroscope-url", "pyroscope:4040"])
    with pytest.raises(SystemExit, match="--pyroscope-interval"):
        cli.parse(["--pyroscope-interval", "0s"])
