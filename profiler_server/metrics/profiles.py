"""Aggregated profiles as Prometheus series: stacks, functions, request durations.

Each server exports what *it* ingested, from memory, so counters never decrease (also
when retention deletes rows) and Prometheus can sum the servers sharing one database.
Stack labels are bounded per service: a sticky top-k plus `stack="(other)"`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from profiler_core.stacks import label_value
from profiler_server.assembly.flatten import (
    ACTIVE,
    AWAIT,
    CALLS,
    MAX,
    MAX_SLICE,
    READY,
    SELF,
    TOTAL,
)
from profiler_server.storage.writer import StoredRequest

OTHER = "(other)"
NS = 1e-9
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class TopK:
    """Sticky membership: a key admitted stays; admission ranks candidates by weight."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.members: set[str] = set()
        self.candidates: dict[str, int] = {}

    def admit(self, key: str, weight: int) -> bool:
        """True if `key` is a member; otherwise its weight counts toward admission."""
        if key in self.members:
            return True
        if len(self.members) < self.k:
            self.candidates[key] = self.candidates.get(key, 0) + weight
            if len(self.candidates) > 10 * self.k:
                keep = sorted(self.candidates.items(), key=lambda kv: kv[1], reverse=True)
                self.candidates = dict(keep[: 5 * self.k])
        return False

    def promote(self) -> None:
        room = self.k - len(self.members)
        if room > 0 and self.candidates:
            ranked = sorted(self.candidates.items(), key=lambda kv: kv[1], reverse=True)
            self.members.update(key for key, _ in ranked[:room])
        if len(self.members) >= self.k:
            self.candidates.clear()


class ProfileMetrics(Collector):
    def __init__(
        self, registry: CollectorRegistry, top_k: int, max_functions: int, max_routes: int
    ) -> None:
        self.top_k = top_k
        self.max_functions = max_functions
        self.max_routes = max_routes
        self._lock = threading.Lock()
        self._stack_members: dict[str, TopK] = {}
        self._stacks: dict[tuple[str, str, str], list[int]] = {}  # service, route, stack
        self._function_members: dict[str, TopK] = {}
        self._functions: dict[tuple[str, str], list[int]] = {}  # service, function
        self._routes: dict[str, set[str]] = {}
        self._labels: dict[str, str] = {}
        self.durations = Histogram(
            "profiler_request_duration_seconds",
            "Duration of sampled requests.",
            ["service", "route"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        registry.register(self)

    def record(self, stored: Iterable[StoredRequest], names: dict[int, str]) -> None:
        """Adds stored requests; `names` maps function ids to `module:qualname`."""
        with self._lock:
            for item in stored:
                service = item.row["service"]
                route = self._route(service, item.row["route"])
                self.durations.labels(service, route).observe(item.row["duration_ns"] * NS)
                self._add_stacks(service, route, item.stacks)
                self._add_functions(service, item.functions, names)

    def _route(self, service: str, route: str) -> str:
        routes = self._routes.setdefault(service, set())
        if route in routes:
            return route
        if len(routes) >= self.max_routes:
            return OTHER
        routes.add(route)
        return route

    def _label(self, signature: str) -> str:
        found = self._labels.get(signature)
        if found is None:
            if len(self._labels) > 100_000:
                self._labels.clear()
            found = self._labels[signature] = label_value(signature)
        return found

    def _add_stacks(
        self, service: str, route: str, stacks: list[tuple[int, str, int, int]]
    ) -> None:
        members = self._stack_members.get(service)
        if members is None:
            members = self._stack_members[service] = TopK(self.top_k)
        series = self._stacks
        for _, signature, self_ns, calls in stacks:
            label = self._label(signature)
            key = (service, route, label if members.admit(label, self_ns) else OTHER)
            agg = series.get(key)
            if agg is None:
                series[key] = [self_ns, calls]
            else:
                agg[0] += self_ns
                agg[1] += calls

    def _add_functions(
        self, service: str, totals: dict[int, list[int]], names: dict[int, str]
    ) -> None:
        members = self._function_members.get(service)
        if members is None:
            members = self._function_members[service] = TopK(self.max_functions)
        for fid, t in totals.items():
            name = names.get(fid, f"(function {fid})")
            key = (service, name if members.admit(name, t[SELF]) else OTHER)
            agg = self._functions.get(key)
            if agg is None:
                agg = self._functions[key] = [0] * 8
            for i in (CALLS, TOTAL, SELF, ACTIVE, AWAIT, READY):
                agg[i] += t[i]
            agg[MAX] = max(agg[MAX], t[MAX])
            agg[MAX_SLICE] = max(agg[MAX_SLICE], t[MAX_SLICE])

    def promote(self) -> None:
        with self._lock:
            for members in (*self._stack_members.values(), *self._function_members.values()):
                members.promote()

    def describe(self) -> Iterator[Metric]:
        return iter(self._families({}, {}))

    def collect(self) -> Iterator[Metric]:
        self.promote()
        with self._lock:
            stacks = {k: list(v) for k, v in self._stacks.items()}
            functions = {k: list(v) for k, v in self._functions.items()}
        return iter(self._families(stacks, functions))

    @staticmethod
    def _families(stacks: dict, functions: dict) -> list[Metric]:
        stack_labels = ["service", "route", "stack"]
        stack_self = CounterMetricFamily(
            "profiler_stack_self_seconds",
            "Self time per full stack (root->leaf `module:qualname;...`); sums are true totals.",
            labels=stack_labels,
        )
        stack_calls = CounterMetricFamily(
            "profiler_stack_calls", "Calls per full stack.", labels=stack_labels
        )
        for (service, route, stack), (self_ns, calls) in stacks.items():
            stack_self.add_metric([service, route, stack], self_ns * NS)
            stack_calls.add_metric([service, route, stack], calls)
        fn_labels = ["service", "function"]
        counters = [
            (CALLS, "profiler_function_calls", "Calls per function.", 1),
            (TOTAL, "profiler_function_seconds", "Inclusive wall time (outermost calls).", NS),
            (SELF, "profiler_function_self_seconds", "Self time per function.", NS),
            (
                ACTIVE,
                "profiler_function_active_seconds",
                "Active time: wall time minus suspensions (generators, coroutines).",
                NS,
            ),
            (
                AWAIT,
                "profiler_function_await_seconds",
                "Suspended time while the awaited thing was not done.",
                NS,
            ),
            (
                READY,
                "profiler_function_ready_wait_seconds",
                "Suspended time while runnable but not resumed (event loop busy elsewhere).",
                NS,
            ),
        ]
        gauges = [
            (
                MAX,
                "profiler_function_max_seconds",
                "Longest single call seen by this server since it started.",
                NS,
            ),
            (
                MAX_SLICE,
                "profiler_function_max_active_slice_seconds",
                "Longest single active slice (time holding the event loop) since start.",
                NS,
            ),
        ]
        families: list[Metric] = [stack_self, stack_calls]
        for index, name, doc, scale in counters:
            family = CounterMetricFamily(name, doc, labels=fn_labels)
            for (service, function), agg in functions.items():
                family.add_metric([service, function], agg[index] * scale)
            families.append(family)
        for index, name, doc, scale in gauges:
            family = GaugeMetricFamily(name, doc, labels=fn_labels)
            for (service, function), agg in functions.items():
                family.add_metric([service, function], agg[index] * scale)
            families.append(family)
        return families
