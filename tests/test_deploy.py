"""deploy/ as a user deploys it: Prometheus runs with deploy/prometheus.yml (only the target
and the interval changed) and scrapes a real server that a real profiled Starlette app fills;
every query of the Grafana dashboard then runs against Prometheus and must succeed, the core
ones with data, and its JSON panel's URL must answer a nested-set frame."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from profiler_core.latency import BUCKETS, bucket
from profiler_core.wire import ingest_pb2
from profiler_core.wire.builder import BatchBuilder
from profiler_server.demo import traffic
from profiler_server.loadgen import HostStream, hello
from tests.helpers import eventually, metric_value
from tests.processes import UVICORN, ServerProcess, serve_profiled
from tests.prometheus_server import Prometheus, running_prometheus

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
DASHBOARD = json.loads((DEPLOY / "grafana" / "request-profiler.json").read_text())
SERVICE = "shop-async"
# Grafana's values for the variables the queries use ($service is the app's)
VARIABLES = {
    "service": SERVICE,
    "route": ".*",
    "job": "request-profiler",
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
}
# series that only exist once something went wrong (a drop, a rejection, a truncation)
ONLY_AFTER_TROUBLE = (
    "profiler_host_dropped_requests_total",
    "profiler_ingest_rejected_total",
    "profiler_requests_truncated_total",
)


def substitute(text: str, values: dict[str, str]) -> str:
    """`$name`, `${name}` and `${name:format}` replaced; an unknown variable fails the test."""

    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        assert name in values, f"dashboard variable ${name} has no test value"
        return values[name]

    return re.sub(r"\$\{(\w+)(?::[\w:]+)?\}|\$(\w+)", value, text)


def targets(datasource: str) -> Iterator[tuple[str, dict]]:
    """(panel title, target) for every panel target on that kind of data source."""
    for panel in DASHBOARD["panels"]:
        for target in panel.get("targets", []):
            if target["datasource"]["type"] == datasource:
                yield panel["title"], target


def label_values_query(definition: str) -> str:
    """Grafana's `label_values(SELECTOR, LABEL)` as the PromQL that finds the same values."""
    match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", definition)
    assert match, definition
    return f"group by ({match.group(2)}) ({match.group(1)})"


def deploy_config(target: str) -> str:
    """deploy/prometheus.yml scraping `target` every second."""
    text = (DEPLOY / "prometheus.yml").read_text()
    for old, new in (("127.0.0.1:9999", target), ("15s", "1s"), ("10s", "1s")):
        assert old in text, old
        text = text.replace(old, new)
    return text


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server holding the profiles of every route of the Starlette app, run by the host."""
    tmp_path = tmp_path_factory.mktemp("filled")
    server = ServerProcess(f"sqlite:///{tmp_path / 'profiles.db'}", tmp_path / "server.log")
    try:
        app = serve_profiled(server, tmp_path, SERVICE, *UVICORN)
        try:
            statuses = traffic.drive(app.url, traffic.STARLETTE, rounds=3)
            # the counts of every request go out every few seconds (uvicorn ends on SIGTERM
            # without a last report)
            assert eventually(
                lambda: metric_value(server.http, "profiler_requests_total", service=SERVICE),
                timeout=30,
            )
        finally:
            app.stop(grace=15)  # the host flushes its sampled requests at exit
        assert set(statuses) <= {"200", "201", "409"}, statuses
        yield server
    finally:
        server.stop(grace=10)


def wait_scraped(prom: Prometheus, server: ServerProcess) -> None:
    """Until Prometheus holds everything stored, scraped at least twice (for rate())."""
    stored = metric_value(server.http, "profiler_requests_stored_total")
    assert stored > 0
    counter = f'profiler_requests_stored_total{{service="{SERVICE}"}}'
    assert prom.wait_for(lambda: prom.scalar(f"sum({counter})") == stored), prom.log_text()
    assert prom.wait_for(lambda: prom.query(f"rate({counter}[1m])")), prom.log_text()


def test_prometheus_config_is_valid() -> None:
    done = subprocess.run(
        ["promtool", "check", "config", str(DEPLOY / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_dashboard_query_runs_on_real_data(filled: ServerProcess, tmp_path: Path) -> None:
    config = deploy_config(f"127.0.0.1:{filled.http_port}")
    with running_prometheus([], tmp_path / "prom", config=config) as prom:
        wait_scraped(prom, filled)
        (scrape,) = prom.targets()
        assert scrape["labels"]["job"] == "request-profiler" and scrape["health"] == "up"

        variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
        for name in ("service", "route", "job"):
            query = substitute(label_values_query(variables[name]["definition"]), VARIABLES)
            assert prom.query(query), f"variable {name}: no values from {query}"
        services = label_values_query(variables["service"]["definition"])
        assert SERVICE in {r["metric"]["service"] for r in prom.query(services)}

        ran = 0
        for title, target in targets("prometheus"):
            expr = substitute(target["expr"], VARIABLES)
            result = prom.query(expr)  # asserts a successful answer
            if not any(name in expr for name in ONLY_AFTER_TROUBLE):
                assert result, f"{title}: no series for {expr}"
            ran += 1
        assert ran >= 20

        hogs = substitute(
            'max by (function) (profiler_function_max_active_slice_seconds{service=~"$service"})',
            VARIABLES,
        )
        longest = {r["metric"]["function"]: float(r["value"][1]) for r in prom.query(hogs)}
        # the loop hog of /block?ms=40 shows in the "blocking the event loop" panel
        assert longest["profiling_target.delays:crunch_numbers"] >= 0.035

        # every request counted: a host reports requests of a route while Prometheus scrapes
        # (the app's counts stopped before it started, so their rates are 0): a first report
        # makes the series, a second one adds 100 requests, 10 of them 5xx
        report_counts(filled.target, [(2, [0.01]), (5, [0.2])])
        checked = f'profiler_requests_total{{route="{CHECKED}"}}'
        assert prom.wait_for(lambda: prom.scalar(f"sum({checked})") == 2), prom.log_text()
        report_counts(filled.target, [(2, [0.01] * 90), (5, [0.2] * 10)])
        panels = {title: target["expr"] for title, target in targets("prometheus")}

        def per_route(title: str) -> dict[str, float]:
            found = prom.query(substitute(panels[title], VARIABLES))
            return {r["metric"]["route"]: float(r["value"][1]) for r in found}

        assert prom.wait_for(
            lambda: per_route("Requests per second (all requests)").get(CHECKED, 0) > 0
        ), prom.log_text()
        # rate() extrapolates each series from its first sample: near, not exactly, 10 %
        assert per_route("Error rate (5xx, all requests)")[CHECKED] == pytest.approx(0.1, rel=0.2)
        assert 0.1 < per_route("p95 of all requests")[CHECKED] <= 0.4  # bounds double


CHECKED = "/deploy-check"


def report_counts(target: str, counts: list[tuple[int, list[float]]]) -> None:
    """What a host reports of route CHECKED: per status class, the requests' durations (s)."""
    routes = []
    for status_class, durations in counts:
        buckets = [0] * BUCKETS
        for d in durations:
            buckets[bucket(int(d * 1e9))] += 1
        routes.append(
            ingest_pb2.RouteCount(
                route=CHECKED,
                method="GET",
                status_class=status_class,
                count=len(durations),
                duration_ns_sum=int(sum(durations) * 1e9),
                buckets=buckets,
            )
        )
    stream = HostStream(target)
    stream.send_hello(hello(SERVICE))
    builder = BatchBuilder()
    builder.route_counts(ingest_pb2.RouteCounts(wall_ns=time.time_ns(), routes=routes))
    stream.send_batch(builder.build(1))
    assert stream.wait_acked({1})
    stream.close()


def test_dashboard_flame_graph_panel_reads_the_servers_frame(filled: ServerProcess) -> None:
    """The Infinity target's URL and parameters, as Grafana sends them, answer the frame its
    root selector takes apart (fields level, value, self, label of one length)."""
    [(_, target)] = targets("yesoreyeram-infinity-datasource")
    until = str(int(time.time()) + 3600)  # Grafana sends the range's ends as epoch seconds
    values = {**VARIABLES, "profiler_url": filled.http, "__from": "0", "__to": until}
    params = {p["key"]: substitute(p["value"], values) for p in target["url_options"]["params"]}
    response = httpx.get(substitute(target["url"], values), params=params, timeout=30)
    assert response.status_code == 200, response.text
    fields = {field["name"]: field["values"] for field in response.json()["fields"]}
    assert {"level", "value", "self", "label"} <= fields.keys()
    assert len({len(fields[name]) for name in ("level", "value", "self", "label")}) == 1
    assert fields["level"][0] == 0 and fields["value"][0] == sum(fields["self"]) > 0
    assert "profiling_target.delays:crunch_numbers" in fields["label"]
    for field in ("level", "value", "self", "label"):
        assert f'fields[name="{field}"].values' in target["root_selector"]
