"""The web UI in a real headless Chromium against a server filled by the Starlette sample app
under `profiler-host run` (as two services): the routes overview, the list, the slowest
request's timeline,
zoom, the flame graph and its search, lanes of a fan-out, the range comparison, the time
range kept in the URL, paging, the histogram, the time axis, boxes that never overlap.
Screenshots go to test-artifacts/ui/."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import httpx
import pytest
from playwright.sync_api import Page

from tests.browser import chromium_page
from tests.helpers import eventually, stored_requests
from tests.processes import UVICORN, ServerProcess, serve_profiled

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "ui"
PATHS = ["/products/1", "/report?orders=20", "/block?ms=40", "/slow?ms=300", "/orders/1"]
REFUSED = "/products?page=0"  # 400: the handler raises InvalidRequest
SECOND = "shop-second"  # a second service, with one request
SECOND_PATH = "/orders/2"
STORED = len(PATHS) + 2
DASH = "\N{EN DASH}"  # between the pager's first and last
SLOW = "profiling_target.asgi:slow"
SLEEPER = "profiling_target.delays:call_slow_upstream_async"


def served(server: ServerProcess) -> list[dict]:
    return [r for r in stored_requests(server.http) if r["route"] != "/health"]


def counted(server: ServerProcess, service: str) -> int:
    """The requests of `service` its host has reported counts of (sent every few seconds;
    uvicorn ends on SIGTERM without a last report), /health's left out."""
    since = f"{time.time() - 3600:.0f}"
    routes = httpx.get(f"{server.http}/api/routes", params={"service": service, "since": since})
    return sum(r["requests"] for r in routes.json()["routes"] if r["route"] != "/health")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("ui")
    server = ServerProcess(f"sqlite:///{tmp / 'profiles.db'}", tmp / "server.log")
    try:
        app = serve_profiled(server, tmp, "shop-async", *UVICORN)
        try:
            for path in PATHS:
                assert httpx.get(app.url + path, timeout=30).status_code == 200
            assert httpx.get(app.url + REFUSED, timeout=30).status_code == 400
            stored = eventually(lambda: len(served(server)) == STORED - 1, timeout=30)
            assert stored, [(r["route"], r["status"]) for r in served(server)]
            assert eventually(lambda: counted(server, "shop-async") == len(PATHS) + 1, timeout=30)
        finally:
            app.stop(grace=15)
        second = serve_profiled(server, tmp, SECOND, *UVICORN)
        try:
            assert httpx.get(second.url + SECOND_PATH, timeout=30).status_code == 200
            stored = eventually(lambda: len(served(server)) == STORED, timeout=30)
            assert stored, [(r["service"], r["route"]) for r in served(server)]
            assert eventually(lambda: counted(server, SECOND) == 1, timeout=30)
        finally:
            second.stop(grace=15)
        yield server
    finally:
        server.stop(grace=10)


@pytest.fixture
def page() -> Iterator[Page]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with chromium_page() as page:
        yield page
        assert page.errors == []  # type: ignore[attr-defined]
    print(f"screenshots in {ARTIFACTS}")


def shown(page: Page, view: str) -> None:
    page.wait_for_function(f"window.__profilerUI.view === {view!r}", timeout=15_000)
    assert page.inner_text("#status") == ""  # no error


def drawn(page: Page, chart: str) -> list[dict]:
    return page.evaluate(f"window.__profilerUI.drawn[{chart!r}]")


def boxes(page: Page, chart: str, label: str) -> list[dict]:
    return [b for b in drawn(page, chart) if b["label"] == label]


def bars(page: Page) -> list[dict]:
    return [b for b in drawn(page, "histogram") if b.get("bar")]


def cells(page: Page, route: str, service: str = "shop-async") -> dict[str, str]:
    """The routes overview's row of `route`, by column heading."""
    headings = page.locator("thead th").all_inner_texts()
    row = page.locator(f'tbody tr[data-route="{route}"][data-service="{service}"]')
    return dict(zip(headings, row.locator("td").all_inner_texts(), strict=True))


def column(page: Page, heading: str) -> list[str]:
    index = page.locator("thead th").all_inner_texts().index(heading)
    return page.locator(f"tbody tr td:nth-child({index + 1})").all_inner_texts()


def test_routes_overview_is_the_landing_page(server, page: Page) -> None:
    calls = api_calls(page, "/api/routes")
    page.goto(server.http + "/")
    shown(page, "routes")
    assert span_s(calls[-1]) == 24 * 3600  # the default preset
    counted = httpx.get(f"{server.http}/api/routes", params=calls[-1]).json()["routes"]
    keys = {(r["service"], r["route"]) for r in counted}
    assert ("shop-async", "/slow") in keys and (SECOND, "/orders/{order_id:int}") in keys
    assert page.locator("tbody tr").count() == len(keys)
    page.screenshot(path=ARTIFACTS / "routes.png", full_page=True)

    slow = cells(page, "/slow")
    assert slow["requests"] == "1" and slow["error %"] == "0.0 %"
    assert slow["p50"].endswith("ms") and slow["p99"].endswith("ms")
    assert slow["sampled (slowest)"].startswith("1")
    refused = cells(page, "/products")  # a 400 is no error: errors are 5xx
    assert refused["requests"] == "1" and refused["error %"] == "0.0 %"

    # sortable: by p99, slowest first, then the other way round
    page.click("thead th:text-is('p99')")
    assert page.locator("tbody tr").first.get_attribute("data-route") == "/slow"
    page.click("thead th:text-is('p99')")
    assert page.locator("tbody tr").last.get_attribute("data-route") == "/slow"
    page.click("thead th:text-is('route')")
    routes = column(page, "route")
    assert routes == sorted(routes, reverse=True)

    # the link opens the route's slowest sampled requests, in the same range
    page.select_option("#range", "1h")
    page.wait_for_function("location.hash.includes('range=1h')")
    shown(page, "routes")
    assert span_s(calls[-1]) == 3600
    page.reload()
    shown(page, "routes")
    assert page.input_value("#range") == "1h"
    page.locator('tr[data-route="/slow"] a.slowest').click()
    shown(page, "requests")
    query = dict(parse_qsl(urlsplit(page.url).fragment.split("?", 1)[1]))
    assert query == {"range": "1h", "service": "shop-async", "route": "/slow", "order": "duration"}
    assert page.locator("tbody tr.link").first.inner_text().count("/slow") == 1

    # a custom range without requests says so; the link keeps it
    page.goto(
        f"{server.http}/#/routes?range=custom&since=2020-01-01T10:00:00Z&until=2020-01-01T11:00:00Z"
    )
    shown(page, "routes")
    assert page.input_value("#range") == "custom"
    assert page.inner_text("#routes-caption") == "no requests counted in this range"
    assert page.locator("tbody tr").count() == 0


def test_slowest_request_timeline_zoom_and_flame_graph_search(server, page: Page) -> None:
    page.goto(server.http + "/#/requests")
    shown(page, "requests")
    rows = page.locator("tbody tr.link")
    assert rows.count() >= len(PATHS)
    assert "/slow" in rows.first.inner_text()  # slowest first
    assert sum(bar["count"] for bar in bars(page)) == 1  # the /slow route
    page.screenshot(path=ARTIFACTS / "requests.png", full_page=True)
    page.fill("#f-function", SLEEPER)
    page.fill("#f-status", "2xx")
    page.click("form.filters button[type=submit]")
    page.wait_for_function("location.hash.includes('function=')")
    shown(page, "requests")
    assert [r.split("\t")[3] for r in rows.all_inner_texts()] == ["/slow"]
    [bar] = [b for b in bars(page) if b["count"]]
    page.locator("canvas.chart").click(position={"x": bar["x"] + bar["w"] / 2, "y": 100})
    page.wait_for_function("location.hash.includes('max_duration_ms=')")
    shown(page, "requests")
    assert rows.count() == 1

    rows.first.click()
    shown(page, "request")
    assert page.inner_text("h2") == "GET /slow"
    [handler] = boxes(page, "timeline", SLOW)
    [sleeper] = boxes(page, "timeline", SLEEPER)
    assert sleeper["suspended"] and sleeper["y"] > handler["y"]  # awaited inside the handler
    assert sleeper["waits"] >= 1  # its sleep, drawn as a wait over the box
    assert sleeper["w"] > 0.9 * handler["w"]  # it is most of the request
    assert "delays.py:" in page.inner_text(f'tr[data-function="{SLEEPER}"]')
    canvas = page.locator("canvas.chart").bounding_box()
    assert canvas is not None
    page.mouse.move(canvas["x"] + sleeper["x"] + 40, canvas["y"] + sleeper["y"] + 8)
    tooltip = page.inner_text("#tooltip")
    assert SLEEPER in tooltip and "delays.py:" in tooltip
    assert all(word in tooltip for word in ("wall", "self", "active", "await", "ready"))
    speedscope = json.loads(download(page, "a.export:text('speedscope')"))
    assert speedscope["$schema"].startswith("https://www.speedscope.app/")
    assert SLEEPER in {frame["name"] for frame in speedscope["shared"]["frames"]}

    full = page.evaluate("window.__profilerUI.timelineView")
    page.click("#zoom-in")
    page.click("#zoom-in")
    quarter = (full["t1"] - full["t0"]) / 4
    page.wait_for_function(
        f"(v => v.t1 - v.t0 < {quarter * 1.01})(window.__profilerUI.timelineView)"
    )
    zoomed = page.evaluate("window.__profilerUI.timelineView")
    assert zoomed["t1"] - zoomed["t0"] == pytest.approx(quarter)
    [wide] = boxes(page, "timeline", SLEEPER)
    assert wide["x"] <= 0 and wide["w"] >= sleeper["w"] * 0.95  # now fills the zoomed view
    page.screenshot(path=ARTIFACTS / "timeline.png")
    page.mouse.move(canvas["x"] + 200, canvas["y"] + 30)
    page.mouse.wheel(0, -400)
    page.wait_for_function(f"window.__profilerUI.timelineView.t1 < {zoomed['t1']}")

    page.click("nav a[data-view=flame]")
    shown(page, "flame")
    labels = {b["label"] for b in drawn(page, "flame")}
    assert {"profiling_target.asgi:block", "profiling_target.delays:crunch_numbers"} <= labels
    page.fill("#search", "delays")
    matched = [b for b in drawn(page, "flame") if b["match"]]
    assert matched and all("delays" in b["label"] for b in matched)
    assert "%" in page.inner_text("#search-info")
    assert gzip.decompress(download(page, "a.export:text('pprof')"))  # a gzipped profile
    page.screenshot(path=ARTIFACTS / "flame-search.png")
    [block] = boxes(page, "flame", "profiling_target.asgi:block")
    page.mouse.click(canvas["x"] + block["x"] + 5, page_y(page, block))
    [zoomed_block] = boxes(page, "flame", "profiling_target.asgi:block")
    assert zoomed_block["w"] > block["w"] and zoomed_block["x"] == 0


def download(page: Page, link: str) -> bytes:
    """What clicking an export link downloads."""
    with page.expect_download() as started:
        page.click(link)
    return Path(started.value.path()).read_bytes()


def page_y(page: Page, box: dict) -> float:
    canvas = page.locator("canvas.chart").bounding_box()
    assert canvas is not None
    return canvas["y"] + box["y"] + box["h"] / 2


def test_fan_out_lanes_and_range_comparison(server, page: Page) -> None:
    [report] = stored_requests(server.http, route="/report")
    page.goto(f"{server.http}/#/request/{report['id']}")
    shown(page, "request")
    lanes = [b for b in drawn(page, "timeline") if b.get("root")]
    assert lanes[0]["kind"] == "main"
    assert sum(lane["kind"] == "task" for lane in lanes) >= 3  # the TaskGroup's loads
    assert all(lane["y"] > lanes[0]["y"] for lane in lanes[1:])  # a band each, below main
    page.screenshot(path=ARTIFACTS / "lanes.png")

    page.click("nav a[data-view=diff]")
    shown(page, "diff")
    labels = {b["label"] for b in drawn(page, "diff")}
    assert "profiling_target.asgi:report" in labels  # all traffic is in the "after" hour
    assert page.locator("table.grid tbody tr").count() > 10
    page.screenshot(path=ARTIFACTS / "diff.png")


def api_calls(page: Page, path: str) -> list[dict[str, str]]:
    """The query of each call the page makes to `path` from now on (a live list)."""
    calls: list[dict[str, str]] = []

    def seen(request) -> None:
        url = urlsplit(request.url)
        if url.path == path:
            calls.append(dict(parse_qsl(url.query)))

    page.on("request", seen)
    return calls


def span_s(query: dict[str, str]) -> float:
    since, until = (datetime.fromisoformat(query[k]) for k in ("since", "until"))
    return (until - since).total_seconds()


def test_time_range_presets_and_custom_kept_in_the_url(server, page: Page) -> None:
    calls = api_calls(page, "/api/requests")
    page.goto(server.http + "/#/requests")
    shown(page, "requests")
    assert page.input_value("#range") == "24h"  # the default preset
    assert span_s(calls[-1]) == 24 * 3600
    page.select_option("#range", "15m")
    page.wait_for_function("location.hash.includes('range=15m')")
    shown(page, "requests")
    assert span_s(calls[-1]) == 15 * 60
    everything = len(stored_requests(server.http))  # the served ones and /health
    assert page.locator("tbody tr.link").count() == everything  # all made minutes ago
    page.reload()
    shown(page, "requests")
    assert page.input_value("#range") == "15m" and span_s(calls[-1]) == 15 * 60

    # a custom range that ends before any request: the link keeps it, a reload shows it
    page.select_option("#range", "custom")
    page.fill("#range-since", "2020-01-01T10:00")
    page.fill("#range-until", "2020-01-01T11:30")
    page.click("#range-apply")
    page.wait_for_function("location.hash.includes('since=')")
    shown(page, "requests")
    link = page.url
    assert "range=custom" in link
    assert page.locator("tbody tr.link").count() == 0
    assert page.inner_text("#page-info") == "0 of 0 requests"
    assert span_s(calls[-1]) == 90 * 60
    page.screenshot(path=ARTIFACTS / "range-custom.png")
    page.goto("about:blank")
    page.goto(link)
    shown(page, "requests")
    assert page.input_value("#range") == "custom"
    assert page.input_value("#range-since") == "2020-01-01T10:00"
    assert page.input_value("#range-until") == "2020-01-01T11:30"
    # the menu carries the range to the other views
    page.click("nav a[data-view=flame]")
    shown(page, "flame")
    assert "since=" in page.url and page.input_value("#range") == "custom"
    assert not [b for b in drawn(page, "flame") if b["label"] != "all"]  # nothing in 2020


def test_requests_pickers_paging_and_histogram(server, page: Page) -> None:
    total = len(stored_requests(server.http))
    page.goto(server.http + "/#/requests?limit=3")
    shown(page, "requests")
    services = page.locator("#f-service option").all_inner_texts()
    assert services == ["(all)", "shop-async", SECOND]
    routes = set(page.locator("#f-route option").all_inner_texts())
    assert {"/slow", "/report", "/products", "/orders/{order_id:int}"} <= routes
    histogram_routes = set(page.locator("#histogram-route option").all_inner_texts())
    assert histogram_routes == routes - {"(all)"}  # every route of the range, not the page's
    page.select_option("#f-service", SECOND)
    its_routes = ["(all)", "/health", "/orders/{order_id:int}"]  # its readiness probe too
    assert page.locator("#f-route option").all_inner_texts() == its_routes

    # paging: three a page, with the total
    assert page.inner_text("#page-info") == f"1{DASH}3 of {total} requests"
    assert page.locator("#prev").is_disabled()
    first = page.locator("tbody tr.link").evaluate_all("rows => rows.map(r => r.dataset.id)")
    page.click("#next")
    page.wait_for_function("location.hash.includes('offset=3')")
    shown(page, "requests")
    assert page.inner_text("#page-info") == f"4{DASH}6 of {total} requests"
    second = page.locator("tbody tr.link").evaluate_all("rows => rows.map(r => r.dataset.id)")
    assert len(second) == 3 and not set(first) & set(second)
    page.goto(f"{server.http}/#/requests?limit=3&offset={total - 2}")
    shown(page, "requests")
    assert page.inner_text("#page-info") == f"{total - 1}{DASH}{total} of {total} requests"
    assert page.locator("#next").is_disabled() and not page.locator("#prev").is_disabled()

    # one sample: a visible bar with its count, and duration ticks under the bars
    page.goto(server.http + "/#/requests?route=/slow")
    shown(page, "requests")
    [bar] = [b for b in bars(page) if b["count"]]
    assert bar["count"] == 1 and bar["h"] >= 3
    ticks = [b for b in drawn(page, "histogram") if b.get("tick")]
    assert len(ticks) >= 2 and all(t["label"].endswith(("ms", "s")) for t in ticks)
    assert [t["ms"] for t in ticks] == sorted(t["ms"] for t in ticks)
    assert page.inner_text("#histogram-caption") == "1 request"

    # 10,000 samples over four decades: more bins, each non-empty one still visible
    page.evaluate(
        """async () => {
            const { histogram } = await import('/ui/histogram.js');
            const box = document.createElement('div');
            box.id = 'many';
            document.getElementById('view').prepend(box);
            let seed = 7;
            const random = () => ((seed = (seed * 16807) % 2147483647) / 2147483647);
            const durations = Array.from({ length: 10000 }, () => 10 ** (4 * random() ** 3));
            histogram(box, durations, () => {});
        }"""
    )
    many = bars(page)
    assert 20 <= len(many) <= 40 and sum(b["count"] for b in many) == 10_000
    assert all(b["h"] >= 3 for b in many if b["count"])
    assert max(b["x"] + b["w"] for b in many) <= page.evaluate("many.clientWidth") + 1
    page.locator("#many").screenshot(path=ARTIFACTS / "histogram-many.png")


def no_overlaps(boxes: list[dict]) -> int:
    """Asserts no two boxes on one row overlap; how many rows were checked."""
    rows: dict[float, list[dict]] = {}
    for b in boxes:
        rows.setdefault(b["y"], []).append(b)
    for row in rows.values():
        row.sort(key=lambda b: b["x"])
        for left, right in pairwise(row):
            assert right["x"] >= left["x"] + left["w"] - 1e-6, (left, right)
    return len(rows)


def axis_follows(page: Page) -> list[dict]:
    view, ticks, width = page.evaluate(
        """() => [window.__profilerUI.timelineView, window.__profilerUI.drawn.axis,
                  document.querySelector('canvas.chart').clientWidth]"""
    )  # one read: a draw may come between two
    assert len(ticks) >= 3
    for tick in ticks:
        assert view["t0"] <= tick["t"] <= view["t1"]
        assert tick["x"] == pytest.approx(
            (tick["t"] - view["t0"]) * width / (view["t1"] - view["t0"])
        )
    return ticks


def test_timeline_axis_boxes_apart_status_and_exception(server, page: Page) -> None:
    for request in served(server):
        page.goto(f"{server.http}/#/request/{request['id']}")
        shown(page, "request")
        assert no_overlaps(drawn(page, "timeline")) >= 2
        assert page.inner_text("#request-status") == str(request["status"])
    [refused] = stored_requests(server.http, route="/products")
    page.goto(f"{server.http}/#/request/{refused['id']}")
    shown(page, "request")
    assert page.get_attribute("#request-status", "class") == "status-error"
    exception = page.inner_text("#request-exception")
    assert "profiling_target.asgi:products" in exception
    assert "raised in profiling_target.params:bounded_int" in exception
    page.screenshot(path=ARTIFACTS / "timeline-exception.png")

    [slow] = stored_requests(server.http, route="/slow")
    page.goto(f"{server.http}/#/request/{slow['id']}")
    shown(page, "request")
    assert page.get_attribute("#request-status", "class") == "status-ok"
    assert page.locator("#request-exception").count() == 0
    assert "null" not in page.inner_text("main")
    whole = axis_follows(page)
    full = page.evaluate("window.__profilerUI.timelineView")
    page.click("#zoom-in")
    page.click("#zoom-in")
    quarter = (full["t1"] - full["t0"]) / 4
    page.wait_for_function(
        f"(v => v.t1 - v.t0 < {quarter * 1.01})(window.__profilerUI.timelineView)"
    )  # both zooms drawn
    zoomed = axis_follows(page)
    assert zoomed[0]["step"] < whole[0]["step"]
    canvas = page.locator("canvas.chart").bounding_box()
    assert canvas is not None
    t0 = page.evaluate("window.__profilerUI.timelineView.t0")
    page.mouse.move(canvas["x"] + 600, canvas["y"] + 8)
    page.mouse.down()
    page.mouse.move(canvas["x"] + 400, canvas["y"] + 8, steps=5)
    page.mouse.up()
    page.wait_for_function(f"window.__profilerUI.timelineView.t0 > {t0}")  # panned later
    panned = axis_follows(page)
    assert [t["t"] for t in panned] != [t["t"] for t in zoomed]
    no_overlaps(drawn(page, "timeline"))
    page.screenshot(path=ARTIFACTS / "timeline-axis.png")


def test_interleaved_and_tiny_calls_never_overlap(server, page: Page) -> None:
    """A generator resumed between the calls of the loop consuming it, and 2,000 calls far
    under a pixel each: drawn apart, row by row."""

    def node(i: int, start: int, end: int, children=()) -> dict:
        return {
            "id": i, "function": f"m:f{i % 7}", "start_ns": start, "end_ns": end,
            "self_ns": 0, "active_ns": end - start, "await_ns": 0, "ready_ns": 0,
            "max_slice_ns": 0, "suspensions": 0, "outcome": "return",
            "children": list(children),
        }  # fmt: skip

    generator = node(1, 0, 1000, [node(2, 5, 9), node(3, 21, 29), node(4, 41, 49)])
    consumer = [node(10 + i, 10 + 20 * i, 20 + 20 * i, [node(20 + i, 11 + 20 * i, 19 + 20 * i)])
                for i in range(3)]  # fmt: skip
    tiny = [node(100 + i, 2000 + 10 * i, 2009 + 10 * i) for i in range(2000)]
    root = node(0, 0, 30_000, [generator, *consumer, *tiny])
    lanes = [{"id": "0", "kind": "main", "name": "main", "parent_lane": None,
              "parent_node": None, "root": root}]  # fmt: skip
    page.goto(server.http + "/#/requests")
    shown(page, "requests")
    page.evaluate(
        """async (lanes) => {
            const { FlameChart } = await import('/ui/timeline.js');
            const box = document.createElement('div');
            document.getElementById('view').replaceChildren(box);
            new FlameChart(box, lanes, new Map(), () => {}).draw();
        }""",
        lanes,
    )
    boxes_drawn = drawn(page, "timeline")
    assert no_overlaps(boxes_drawn) >= 3  # the generator's calls and the loop's take rows
    assert len(boxes_drawn) > 100
    ys = {b["label"]: b["y"] for b in boxes_drawn if b.get("id") in (1, 10)}
    assert len(set(ys.values())) == 2  # the generator and the loop's call on two rows


def test_flame_graph_roots_per_service_search_zoom_and_reset(server, page: Page) -> None:
    page.goto(server.http + "/#/flame")
    shown(page, "flame")
    roots = sorted(b["label"] for b in drawn(page, "flame") if b["depth"] == 1)
    assert roots == ["service shop-async", f"service {SECOND}"]
    page.fill("#search", "asgi:order")
    matched = {b["label"] for b in drawn(page, "flame") if b["match"]}
    assert matched == {"profiling_target.asgi:order"}  # found under both services' roots
    assert len([b for b in drawn(page, "flame") if b["match"]]) == 2
    page.screenshot(path=ARTIFACTS / "flame-services.png")
    page.fill("#search", "")
    [root] = [b for b in drawn(page, "flame") if b["label"] == f"service {SECOND}"]
    page.mouse.click(
        page.locator("canvas.chart").bounding_box()["x"] + root["x"] + 2, page_y(page, root)
    )
    [zoomed] = [b for b in drawn(page, "flame") if b["label"] == f"service {SECOND}"]
    assert zoomed["x"] == 0 and zoomed["w"] > root["w"]
    assert "profiling_target.asgi:report" not in {b["label"] for b in drawn(page, "flame")}
    page.click("#zoom-reset")
    assert [b for b in drawn(page, "flame") if b["label"] == f"service {SECOND}"] == [root]

    page.goto(server.http + "/#/flame?service=shop-async")
    shown(page, "flame")
    assert not [b for b in drawn(page, "flame") if b["label"].startswith("service ")]


def share_of(page: Page, label: str) -> float:
    """The share of the flame graph's width the frames named `label` take."""
    [root] = boxes(page, "flame", "all")
    return sum(b["w"] for b in boxes(page, "flame", label)) / root["w"]


def test_flame_graph_value_picker_sizes_frames_by_wall_or_one_state(server, page: Page) -> None:
    """The 300 ms awaited sleep is most of the wall time, and next to none of the running."""
    calls = api_calls(page, "/api/flamegraph")
    page.goto(server.http + "/#/flame?service=shop-async")
    shown(page, "flame")
    assert calls[-1]["value"] == "wall" and page.input_value("#f-value") == "wall"
    wall = share_of(page, SLEEPER)
    assert wall > 0.3
    page.screenshot(path=ARTIFACTS / "flame-wall.png")
    for value in ("running", "awaiting"):
        before = page.evaluate("window.__profilerUI.loaded.flame")
        page.select_option("#f-value", value)
        page.click("form.filters button[type=submit]")
        page.wait_for_function(f"window.__profilerUI.loaded.flame > {before}")
        assert f"value={value}" in page.evaluate("location.hash")
        assert calls[-1]["value"] == value
        page.screenshot(path=ARTIFACTS / f"flame-{value}.png")
        if value == "running":
            assert share_of(page, SLEEPER) < wall / 10
        else:
            assert share_of(page, SLEEPER) > wall  # the sleep is nearly all of the waits
    assert "value=awaiting" in page.get_attribute("a:text('pprof')", "href")


def test_compare_defaults_to_the_preceding_window_and_names_an_empty_side(
    server, page: Page
) -> None:
    calls = api_calls(page, "/api/flamegraph")
    page.goto(server.http + "/#/diff?range=1h&service=shop-async")
    shown(page, "diff")
    before, after = sorted((c for c in calls), key=lambda c: c["since"])
    assert span_s(before) == span_s(after) == 3600
    assert before["until"] == after["since"]  # the window just before, as long
    empty = page.inner_text("#empty-side")
    assert "The before range" in empty and "nothing to compare" in empty
    assert "The after range" not in empty
    assert "null" not in page.inner_text("main")
    assert "profiling_target.asgi:report" in {b["label"] for b in drawn(page, "diff")}
    page.screenshot(path=ARTIFACTS / "diff-empty-before.png")

    # a range after all traffic: now "after" is the empty one, and the preceding hour holds it
    start = (int(time.time()) // 60 + 5) * 60
    since, until = (
        datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")
        for t in (start, start + 3600)
    )
    calls.clear()
    page.goto(f"{server.http}/#/diff?range=custom&since={since}&until={until}")
    shown(page, "diff")
    empty = page.inner_text("#empty-side")
    assert "The after range" in empty and "The before range" not in empty
    ends = {datetime.fromisoformat(c["until"]) for c in calls}
    assert ends == {datetime.fromisoformat(since), datetime.fromisoformat(until)}
    assert page.locator("table.grid tbody tr").count() > 10  # the before side's functions
