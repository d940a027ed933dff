"""A request too big to draw whole (200,000 calls, each on its own call path, stored through
the real ingest path) in a real headless Chromium: it opens as a summary that says it is
one, and double-clicking a node with calls left out draws them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page

from profiler_core.wire.builder import BatchBuilder
from profiler_server.loadgen import HostStream, hello, wide_run
from tests.browser import chromium_page

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "ui"
TOPS, WIDTH = 400, 499  # 200,000 calls, as many call paths


def send_wide(target: str) -> str:
    builder = BatchBuilder()
    for fid in range(1, TOPS + WIDTH + 1):
        builder.function(fid, "app.wide", f"f{fid}", "app.py", fid)
    start = time.monotonic_ns()
    kinds, functions, calls, times, end = wide_run(TOPS, WIDTH, 1, start)
    builder.start(1, "/wide", "GET", start)
    builder.run(1, 0, kinds, functions, calls, times)
    builder.end(1, end, 200)
    session = uuid.uuid4()
    stream = HostStream(target)
    stream.send_hello(hello("wide", session))
    stream.send_batch(builder.build(1))
    assert stream.wait_acked({1}, timeout=120), stream.error
    stream.close()
    return f"{session}-1"


@pytest.fixture
def page() -> Iterator[Page]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with chromium_page() as page:
        yield page
        assert page.errors == []  # type: ignore[attr-defined]


def timeline_boxes(page: Page) -> list[dict]:
    return page.evaluate("window.__profilerUI.drawn.timeline")


def test_a_200k_call_request_opens_summarised_and_expands_a_node(
    start_server, tmp_path: Path, page: Page
) -> None:
    server = start_server(f"sqlite:///{tmp_path / 'p.db'}")
    rid = send_wide(server.target)
    page.goto(f"{server.http}/#/request/{rid}")
    page.wait_for_function("window.__profilerUI.view === 'request'", timeout=60_000)
    assert page.inner_text("#status") == ""
    assert "Summarised: 200,000 calls" in page.inner_text("#request-summarised")
    page.screenshot(path=ARTIFACTS / "big-request-summary.png")
    assert page.locator(".side tr[data-function]").count() == 500  # of 899 functions
    assert page.inner_text(".side tr.more") == "399 more: sort by a column to see others"
    folded = [b for b in timeline_boxes(page) if b.get("hidden")]
    assert folded and all(b["label"].endswith(" ▸") for b in folded)
    target = max(folded, key=lambda b: b["w"])
    assert target["hidden"] == WIDTH
    canvas = page.locator("canvas.chart").bounding_box()
    assert canvas is not None
    x, y = canvas["x"] + target["x"] + target["w"] / 2, canvas["y"] + target["y"] + 5
    page.mouse.dblclick(x, y)
    page.wait_for_function(
        f"window.__profilerUI.drawn.timeline.every(b => b.id !== {target['id']} || !b.hidden)",
        timeout=30_000,
    )
    after = timeline_boxes(page)
    [now] = [b for b in after if b.get("id") == target["id"]]  # zoomed in on it
    under = [
        b
        for b in after
        if b.get("depth") == now["depth"] + 1 and now["x"] <= b["x"] < now["x"] + now["w"]
    ]
    assert len(under) > 10  # its calls drawn beneath it
    page.screenshot(path=ARTIFACTS / "big-request-expanded.png")


def test_a_request_too_big_to_export_is_refused_with_its_size(start_server, tmp_path) -> None:
    server = start_server(f"sqlite:///{tmp_path / 'p.db'}")
    rid = send_wide(server.target)
    refused = httpx.get(f"{server.http}/api/requests/{rid}/export", timeout=60)
    assert refused.status_code == 422
    assert refused.json()["error"] == "200,001 nodes: over 200,000, too big to export"
