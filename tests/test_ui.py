"""The web UI in a real headless Chromium against a server filled by the Starlette sample app
under `profiler-host run`: the list, the slowest request's timeline, zoom, the flame graph
and its search, lanes of a fan-out, the range comparison. Screenshots go to
test-artifacts/ui/."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page

from tests.browser import chromium_page
from tests.helpers import eventually, stored_requests
from tests.processes import UVICORN, ServerProcess, serve_profiled

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "ui"
PATHS = ["/products/1", "/report?orders=20", "/block?ms=40", "/slow?ms=300", "/orders/1"]
SLOW = "profiling_target.asgi:slow"
SLEEPER = "profiling_target.delays:call_slow_upstream_async"


def served(server: ServerProcess) -> list[dict]:
    return [r for r in stored_requests(server.http) if r["route"] != "/health"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("ui")
    server = ServerProcess(f"sqlite:///{tmp / 'profiles.db'}", tmp / "server.log")
    try:
        app = serve_profiled(server, tmp, "shop-async", *UVICORN)
        try:
            for path in PATHS:
                assert httpx.get(app.url + path, timeout=30).status_code == 200
            stored = eventually(lambda: len(served(server)) == len(PATHS), timeout=30)
            assert stored, stored_requests(server.http)
        finally:
            app.stop(grace=15)
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


def test_slowest_request_timeline_zoom_and_flame_graph_search(server, page: Page) -> None:
    page.goto(server.http + "/")
    shown(page, "requests")
    rows = page.locator("tbody tr.link")
    assert rows.count() >= len(PATHS)
    assert "/slow" in rows.first.inner_text()  # slowest first
    assert sum(bar["count"] for bar in drawn(page, "histogram")) == 1  # the /slow route
    page.screenshot(path=ARTIFACTS / "requests.png", full_page=True)
    page.fill("#f-function", SLEEPER)
    page.fill("#f-status", "2xx")
    page.click("form.filters button[type=submit]")
    page.wait_for_function("location.hash.includes('function=')")
    shown(page, "requests")
    assert [r.split("\t")[3] for r in rows.all_inner_texts()] == ["/slow"]
    [bar] = [b for b in drawn(page, "histogram") if b["count"]]
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
