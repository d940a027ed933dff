"""Every request counted on the host, by the C table and its Python twin alike, and the
bucket percentiles both sides read."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import pytest

from profiler_core.latency import BOUNDS_NS, BUCKETS, FACTOR, bucket, percentile
from profiler_host import native, request_counts
from profiler_host.request_counts import (
    MAX_METHOD_CHARS,
    MAX_METHODS,
    MAX_ROUTE_CHARS,
    MAX_ROUTES,
    OTHER,
    CountTable,
    Table,
)

_counts = native.extension("_counts")
LINES = ("200 OK", "404", "", " 200", "20x OK", "\u0662\u0660\u0660 OK", "1234567890 X", "099 Hm")
LINES += ("600 X", "+200 OK", "123456789 Long", "201 Created \u00e9")
LIMITS = (MAX_ROUTES, MAX_ROUTE_CHARS, MAX_METHODS, MAX_METHOD_CHARS, OTHER)
TWINS: dict[str, Callable[..., Table]] = {"python": CountTable}
if _counts is not None:
    TWINS["c"] = _counts.CountTable


def _table(twin: str, wake: Callable[[], None] = lambda: None) -> Table:
    return TWINS[twin](BOUNDS_NS, *LIMITS, wake)


def test_buckets_hold_their_bounds():
    assert bucket(0) == 0
    assert bucket(BOUNDS_NS[0]) == 0
    assert bucket(BOUNDS_NS[0] + 1) == 1
    assert bucket(BOUNDS_NS[-1] + 1) == BUCKETS - 1


def test_percentile_within_a_bucket_of_the_truth():
    durations = [1_000_000 * (i + 1) for i in range(100)]  # 1..100 ms
    counts = [0] * BUCKETS
    for d in durations:
        counts[bucket(d)] += 1
    for q in (0.5, 0.95, 0.99):
        truth = sorted(durations)[int(q * len(durations)) - 1] / 1e9
        got = percentile(counts, q)
        assert got is not None
        assert truth / FACTOR <= got <= truth * FACTOR
    assert percentile([0] * BUCKETS, 0.5) is None


@pytest.mark.parametrize("twin", list(TWINS))
def test_counts_per_route_method_and_status_class_then_start_again(twin: str):
    woken = []
    counts = _table(twin, lambda: woken.append(1))
    for status in (200, 201, 404, 500, 503, 0):
        counts.add("/a", "GET", status, 2_000_000)
    counts.add("/b", "POST", 200, 5_000_000)
    assert woken == [1]  # once per report, not per request
    assert counts.pending
    message = request_counts.message(counts.take())
    assert message is not None and message.wall_ns > 0
    rows = {(r.route, r.method, r.status_class): r for r in message.routes}
    assert {k: r.count for k, r in rows.items()} == {
        ("/a", "GET", 2): 2,
        ("/a", "GET", 4): 1,
        ("/a", "GET", 5): 2,
        ("/a", "GET", 0): 1,
        ("/b", "POST", 2): 1,
    }
    b = rows[("/b", "POST", 2)]
    assert b.duration_ns_sum == 5_000_000
    assert list(b.buckets) == [1 if i == bucket(5_000_000) else 0 for i in range(BUCKETS)]
    assert counts.take() == [] and not counts.pending
    assert request_counts.message([]) is None
    counts.waiting = True  # as the transport does before it sleeps
    counts.add("/a", "GET", 200, 1)
    assert woken == [1, 1]


@pytest.mark.parametrize("twin", list(TWINS))
def test_routes_and_methods_past_their_limits_count_as_other(twin: str):
    counts = _table(twin)
    for i in range(MAX_ROUTES + 50):
        counts.add(f"/r{i}", "GET", 200, 1)
    counts.add("/" + "x" * (MAX_ROUTE_CHARS + 1), "GET", 200, 1)
    counts.add("/r0", "A-VERY-LONG-HTTP-METHOD", 200, 1)
    for i in range(MAX_METHODS + 3):
        counts.add("/r1", f"M{i}", 200, 1)
    rows = counts.take()
    routes = {(r[0], r[1]): r[3] for r in rows}
    assert routes[(OTHER, "GET")] == 51
    assert routes[("/r0", OTHER)] == 1
    assert routes[("/r1", OTHER)] == MAX_METHODS + 3 - (MAX_METHODS - 1)  # GET took a place
    assert len({r for r, _ in routes}) == MAX_ROUTES + 1
    assert sum(r[3] for r in rows) == MAX_ROUTES + 51 + 1 + MAX_METHODS + 3


@pytest.mark.parametrize("twin", list(TWINS))
def test_what_is_not_a_request_of_strings_and_ints_is_lost_counted_never_raised(twin: str):
    class Route(str):
        def __hash__(self) -> int:
            raise AssertionError("a str subclass' own hash is never called")

    counts = _table(twin)
    counts.add(Route("/sub"), "GET", 200, 10)
    counts.add(None, "GET", 200, 10)  # type: ignore[arg-type]
    counts.add("/big", "GET", 10**30, -(10**30))
    counts.add("/bad", "GET", 200.0, 10)  # type: ignore[arg-type]
    counts.add("/bad", "GET", 200, 10.0)  # type: ignore[arg-type]
    rows = sorted(counts.take())
    assert [(r[0], r[1], r[2], r[3], r[4], r[5][0]) for r in rows] == [
        ("(other)", "GET", 2, 1, 10, 1),
        ("/big", "GET", 0, 1, 0, 1),
        ("/sub", "GET", 2, 1, 10, 1),
    ]
    assert type(rows[2][0]) is str
    assert counts.lost == 2


STATUSES = (0, 99, 100, 200, 302, 404, 599, 600, 2**40, True, *LINES)


def test_a_status_line_counts_by_its_leading_ascii_digits():
    assert [request_counts.status_of(line) for line in LINES] == [
        200,
        404,
        0,
        0,
        0,
        0,
        0,
        99,
        600,
        0,
        123456789,
        201,
    ]


@pytest.mark.skipif(_counts is None, reason="the C table is not built or not wanted")
def test_the_c_table_counts_what_its_python_twin_counts():
    """Random requests, many routes and methods past the limits, durations on and around
    every bucket bound, runs of one endpoint's requests (the C table's last-entry shortcut,
    with the same names as equal copies too), and takes in between."""
    rng = random.Random(7)
    routes = [f"/r/{i}" for i in range(MAX_ROUTES + 40)] + ["/" + "y" * (MAX_ROUTE_CHARS + 1)]
    methods = ["GET", "POST", "PUT"] + [f"X{i}" for i in range(MAX_METHODS + 2)] + ["Z" * 17]
    durations = [
        0,
        -5,
        2**63 - 1,
        *BOUNDS_NS,
        *(b + 1 for b in BOUNDS_NS),
        *(b - 1 for b in BOUNDS_NS),
    ]
    tables = [_table("python"), _table("c")]
    route, method, status = routes[0], methods[0], STATUSES[0]
    for step in range(20_000):
        if rng.random() < 0.4:  # the previous endpoint again, its names as copies or not
            route, method = (route + ".")[:-1], (method + ".")[:-1]
        else:
            route, method, status = rng.choice(routes), rng.choice(methods), rng.choice(STATUSES)
        request = (
            route,
            method,
            status,
            rng.choice(durations) if rng.random() < 0.5 else rng.randrange(0, 10**12),
        )
        for table in tables:
            table.add(*request)
        if step % 3000 == 0:
            python, c = (sorted(table.take()) for table in tables)
            assert python == c
    python, c = (sorted(table.take()) for table in tables)
    assert python == c and python


def test_the_transport_uses_the_c_table_where_it_is_built():
    expected = CountTable if _counts is None else _counts.CountTable
    assert type(request_counts.new_table()) is expected


@pytest.mark.parametrize("twin", list(TWINS))
def test_threads_lose_no_count(twin: str):
    counts = _table(twin)
    taken = []

    def serve():
        for _ in range(2000):
            counts.add("/t", "GET", 200, 1000)

    def report():
        for _ in range(50):
            taken.extend(row[3] for row in counts.take())

    threads = [threading.Thread(target=serve) for _ in range(4)] + [threading.Thread(target=report)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report()
    assert sum(taken) == 8000


@pytest.mark.parametrize("twin", list(TWINS))
def test_a_counted_wsgi_request_passes_start_response_through_and_counts_once(twin: str):
    counts = _table(twin)
    calls = []

    def start_response(*args, **kwargs):
        calls.append((args, kwargs))
        return "write"

    def route_of(environ):
        if environ.get("broken"):
            raise LookupError("a framework we do not know")
        return environ.get("route")

    environ = {"route": "/items/<int:id>"}
    counted = counts.counted(start_response, "/items/7", "GET", environ, route_of)
    assert counted("404 Not Found", [("a", "b")]) == "write"
    assert counted("500 Oops", [], ("exc", "info", None)) == "write"  # exc_info passed as given
    counted.end()
    counted.end()  # once
    broken = counts.counted(start_response, "/raw/path", "POST", {"broken": True}, route_of)
    broken("201 Created", [], exc_info=None)
    broken.end()
    failed = counts.counted(start_response, "/failed", "GET", {}, route_of)
    failed.fail()
    failed.end()
    assert calls == [
        (("404 Not Found", [("a", "b")]), {}),
        (("500 Oops", [], ("exc", "info", None)), {}),
        (("201 Created", []), {"exc_info": None}),
    ]
    rows = {(r[0], r[1], r[2]): r[3] for r in counts.take()}
    assert rows == {
        ("/items/<int:id>", "GET", 5): 1,
        ("/raw/path", "POST", 2): 1,
        ("/failed", "GET", 5): 1,
    }


@pytest.mark.parametrize("twin", list(TWINS))
def test_a_counted_asgi_request_passes_send_through_and_keeps_the_status(twin: str):
    counts = _table(twin)
    sent = []

    def send(message):
        sent.append(message)
        return "awaitable"

    counted = counts.counted(send, "/ws", "WEBSOCKET")
    assert counted({"type": "websocket.accept"}) == "awaitable"
    counted.end()
    http = counts.counted(send, "/raw/1", "GET")
    http({"type": "http.response.start", "status": 418})
    http({"type": "http.response.body", "body": b""})
    http({"type": "http.response.start", "status": 500})  # after the start: its status stands
    http("not a message")
    http.end("/raw/{id}")
    started_then_failed = counts.counted(send, "/late", "GET")
    started_then_failed({"type": "http.response.start", "status": 200})
    started_then_failed.fail()  # the response had started: its status stands
    started_then_failed.end()
    silent = counts.counted(send, "/silent", "GET")
    silent.end()
    assert len(sent) == 6
    rows = {(r[0], r[1], r[2]): r[3] for r in counts.take()}
    assert rows == {
        ("/ws", "WEBSOCKET", 1): 1,
        ("/raw/{id}", "GET", 4): 1,
        ("/late", "GET", 2): 1,
        ("/silent", "GET", 0): 1,
    }


# --- an ASGI request awaited: Counted.run (C's Awaiting and its Python twin, a coroutine) ---


class _Waits:
    """What an app awaits that is not done: yields itself to whoever steps the request."""

    def __await__(self):
        return (yield self)


class _OldStyle:
    """An awaitable that is not a coroutine: its `__await__` is a generator."""

    def __init__(self, send):
        self.send = send

    def __await__(self):
        yield "old"
        yield from self.send({"type": "http.response.start", "status": 204}).__await__()
        return "done"


def _scenario(twin: str, name: str) -> tuple[list, list]:
    """Steps one request of `name` the way a loop would, and says what each step gave
    (a yield, a return, an exception's type and text) and what was counted."""
    counts = _table(twin)
    seen: list = []
    steps: list = []

    async def send(message):
        seen.append(message.get("type"))

    async def app(scope, receive, send):
        try:
            got = await _Waits()
        except KeyError:
            if scope.get("swallow"):
                return "swallowed"
            raise
        if got == "boom":
            raise ValueError("the app failed")
        await send({"type": "http.response.start", "status": 201})
        await send({"type": "http.response.body"})
        return got

    async def app_raises_before_awaiting(scope, receive, send):
        raise LookupError("at once")

    def app_not_a_coroutine(scope, receive, send):
        return _OldStyle(send)

    def app_raises_when_called(scope, receive, send):
        raise OSError("called")

    def route_of(scope):
        if scope.get("route") == "fails":
            raise RuntimeError("no route")
        return scope.get("route")

    def step(call):
        try:
            steps.append(("yield", type(call()).__name__))
        except StopIteration as stop:
            steps.append(("return", stop.value))
        except BaseException as exc:
            steps.append((type(exc).__name__, str(exc)))

    scope = {"type": "http", "route": "/r/{id}"}
    chosen = {
        "old style": app_not_a_coroutine,
        "raises at once": app_raises_before_awaiting,
        "raises when called": app_raises_when_called,
    }.get(name, app)
    if name == "swallows a throw":
        scope["swallow"] = True
    if name == "route fails":
        scope["route"] = "fails"
    counted = counts.counted(send, "/r/1", "GET")
    request = counted.run(chosen, scope, None, route_of)
    iterator = request.__await__()
    if name == "close before start":
        request.close()
        step(lambda: iterator.send(None))
    elif name == "throw before start":
        step(lambda: iterator.throw(KeyError("early")))
        step(lambda: iterator.send(None))
    elif name == "non-None first":
        step(lambda: iterator.send(1))
    else:
        step(lambda: iterator.send(None))
        if name in ("returns", "route fails", "old style"):
            step(lambda: iterator.send("value"))
            step(lambda: iterator.send(None))  # reused after its end
        elif name == "fails":
            step(lambda: iterator.send("boom"))
        elif name in ("throw", "swallows a throw"):
            step(lambda: iterator.throw(KeyError("thrown")))
        elif name == "close":
            step(iterator.close)
            step(iterator.close)
        elif name == "dropped":
            del request, iterator
    rows = sorted((r[0], r[1], r[2], r[3]) for r in counts.take())
    return [*steps, ("sent", seen)], rows


SCENARIOS = (
    "returns",
    "fails",
    "throw",
    "swallows a throw",
    "close",
    "close before start",
    "throw before start",
    "dropped",
    "non-None first",
    "old style",
    "raises at once",
    "raises when called",
    "route fails",
)


NEVER_AWAITED = "ignore:coroutine 'Counted.run' was never awaited"


@pytest.mark.parametrize("name", SCENARIOS)
@pytest.mark.filterwarnings(NEVER_AWAITED)
@pytest.mark.skipif(_counts is None, reason="the C table is not built or not wanted")
def test_an_awaited_asgi_request_behaves_as_its_python_twin(name: str):
    """`Counted.run` in C steps the app as the Python twin's coroutine does: the same
    yields, returns and exceptions at each step, and the same count."""
    assert _scenario("c", name) == _scenario("python", name)


@pytest.mark.parametrize("twin", list(TWINS))
@pytest.mark.filterwarnings(NEVER_AWAITED)
def test_an_awaited_asgi_request_is_counted_once_as_it_ended(twin: str):
    steps = {name: _scenario(twin, name) for name in SCENARIOS}
    assert steps["returns"] == (
        [
            ("yield", "_Waits"),
            ("return", "value"),
            ("RuntimeError", "cannot reuse already awaited coroutine"),
            ("sent", ["http.response.start", "http.response.body"]),
        ],
        [("/r/{id}", "GET", 2, 1)],
    )
    assert steps["fails"][0][1] == ("ValueError", "the app failed")
    assert steps["raises at once"][1] == [("/r/{id}", "GET", 5, 1)]
    assert steps["raises when called"][0][0] == ("OSError", "called")
    assert steps["raises when called"][1] == [("/r/{id}", "GET", 5, 1)]
    assert steps["swallows a throw"][0][1] == ("return", "swallowed")
    assert steps["swallows a throw"][1] == [("/r/{id}", "GET", 0, 1)]  # no response, no failure
    for failed in ("fails", "throw", "close", "dropped"):
        assert steps[failed][1] == [("/r/{id}", "GET", 5, 1)], failed  # no response started
    for never_ran in ("close before start", "throw before start", "non-None first"):
        assert steps[never_ran][1] == [], never_ran  # the app was never called
    assert steps["old style"][0][:2] == [("yield", "str"), ("return", "done")]
    assert steps["old style"][1] == [("/r/{id}", "GET", 2, 1)]
    assert steps["route fails"][1] == [("/r/1", "GET", 2, 1)]  # the path stands in
