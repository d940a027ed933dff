"""Every request the hosts served (sampled or not) as Prometheus series:
`profiler_requests_total{service,route,status_class}` and the all-requests duration
histogram `profiler_all_request_duration_seconds{service,route}`.

Built from the `route_minutes` rows this server stored, from memory, so the counters never
decrease. Routes are bounded per service as for the sampled series (`--max-routes`, then
`(other)`); the histogram's bounds are every other bound of `profiler_core.latency` (a
factor of 2 from 100 µs), so its counts are exact, not re-bucketed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from profiler_core.latency import BOUNDS_NS, BUCKETS
from profiler_server.metrics.services import RouteLabels, ServiceLabels

STEP = 2  # latency buckets per exported bucket
STATUS_CLASSES = {0: "none", 1: "1xx", 2: "2xx", 3: "3xx", 4: "4xx", 5: "5xx"}


class RequestMetrics(Collector):
    def __init__(self, services: ServiceLabels, routes: RouteLabels) -> None:
        """`services` and `routes` bound the labels (shared with the sampled series)."""
        self.services = services
        self.routes = routes
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str, str], int] = {}  # service, route, status class
        self._durations: dict[tuple[str, str], list[int]] = {}  # sum ns, then the buckets

    def record(self, rows: list[tuple]) -> None:
        """Adds stored `route_minutes` rows (the increments of one storage group)."""
        with self._lock:
            for row in rows:
                self.services.count(row[1], row[5])  # ranks the services (top-N)
                service = self.services(row[1])
                route = self.routes(service, row[2])
                status = STATUS_CLASSES.get(row[4], "none")
                key = (service, route, status)
                self._counts[key] = self._counts.get(key, 0) + row[5]
                durations = self._durations.setdefault((service, route), [0] * (1 + BUCKETS))
                for index, value in enumerate(row[6:]):  # the sum, then the buckets
                    durations[index] += value

    def describe(self) -> Iterator[Metric]:
        return iter(self._families({}, {}))

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            counts = dict(self._counts)
            durations = {key: list(values) for key, values in self._durations.items()}
        return iter(self._families(counts, durations))

    @staticmethod
    def _families(counts: dict, durations: dict) -> list[Metric]:
        total = CounterMetricFamily(
            "profiler_requests",
            "Every request the hosts served, sampled or not, per route and status class.",
            labels=["service", "route", "status_class"],
        )
        for labels, value in counts.items():
            total.add_metric(list(labels), value)
        histogram = HistogramMetricFamily(
            "profiler_all_request_duration_seconds",
            "Duration of every request, sampled or not.",
            labels=["service", "route"],
        )
        for labels, (sum_ns, *buckets) in durations.items():
            cumulative, seen = [], 0
            for index, count in enumerate(buckets):
                seen += count
                if index % STEP == 0 and index < len(BOUNDS_NS):
                    cumulative.append((repr(BOUNDS_NS[index] / 1e9), seen))
            cumulative.append(("+Inf", seen))
            histogram.add_metric(list(labels), cumulative, sum_ns / 1e9)
        return [total, histogram]
