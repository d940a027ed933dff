"""Aggregated profiles as Prometheus series: stacks, functions, request durations.

Each server exports what *it* ingested, from memory, so counters never decrease (also
when retention deletes rows) and Prometheus can sum the servers sharing one database.
Stack labels are bounded per service: a sticky top-k plus `stack="(other)"`. Stacks are
tracked by id; a stack's label (its name, bounded) is built only for candidates and
members, so stacks that go to `(other)` cost no name, however deep.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator
from operator import add

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from profiler_core.stacks import cap_label, label_value
from profiler_server.assembly.states import STATES
from profiler_server.assembly.totals import (
    ACTIVE,
    AWAIT,
    CALLS,
    MAX,
    MAX_SLICE,
    READY,
    SELF,
    TOTAL,
)
from profiler_server.metrics.requests import RequestMetrics
from profiler_server.metrics.services import RouteLabels, ServiceLabels
from profiler_server.storage.writer import StoredRequests

OTHER = "(other)"
NS = 1e-9
FUNCTION_MAXIMA = (MAX, MAX_SLICE)  # per-function values that are maxima, not sums
# Per stack: running (self) ns, calls, then the ns of each waiting state
WAIT_STATES = ("awaiting", "ready")
_STACK_VALUES = (SELF, CALLS, *(STATES[state].column for state in WAIT_STATES))
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class TopK:
    """Sticky membership per service. While there is room, a new key is a candidate: its
    values are held back (not exported) until the next `promote()` (at each scrape), which
    admits the heaviest candidates; the others' values then go to `(other)`. A member stays
    a member; once all k places are taken, every other key goes to `(other)` directly.
    Nothing exported ever moves, so counters never decrease and sums are true totals."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.members: set[Hashable] = set()
        self.candidates: dict[Hashable, int] = {}  # key -> weight since the last promote()

    def admit(self, key: Hashable, weight: int) -> bool | None:
        """True: a member; None: a candidate (hold its values); False: goes to `(other)`."""
        if key in self.members:
            return True
        if len(self.members) >= self.k:
            return False
        self.candidates[key] = self.candidates.get(key, 0) + weight
        return None

    def prune(self) -> set[Hashable]:
        """Bounds the candidates: drops the lightest when too many wait; returns them."""
        if len(self.candidates) <= 10 * self.k:
            return set()
        keep = sorted(self.candidates.items(), key=lambda kv: kv[1], reverse=True)
        self.candidates = dict(keep[: 5 * self.k])
        return {key for key, _ in keep[5 * self.k :]}

    def promote(self) -> None:
        room = self.k - len(self.members)
        if room > 0 and self.candidates:
            ranked = sorted(self.candidates.items(), key=lambda kv: kv[1], reverse=True)
            self.members.update(key for key, _ in ranked[:room])
        # Every candidate is now settled (a member or `(other)`); stale ones must not take
        # the remaining places later (they used to, which kept membership below k forever).
        self.candidates.clear()


def _merge(series: dict, key: tuple, values: list[int], maxima: tuple[int, ...] = ()) -> None:
    agg = series.get(key)
    if agg is None:
        series[key] = list(values)
        return
    highs = [max(agg[i], values[i]) for i in maxima]
    agg[:] = map(add, agg, values)
    for i, high in zip(maxima, highs, strict=True):
        agg[i] = high


class ProfileMetrics(Collector):
    def __init__(
        self,
        registry: CollectorRegistry,
        top_k: int,
        max_functions: int,
        max_routes: int,
        services: ServiceLabels | None = None,
    ) -> None:
        """`services` bounds the service label (shared with the health metrics)."""
        self.services = services or ServiceLabels(100)
        self.top_k = top_k
        self.max_functions = max_functions
        self.routes = RouteLabels(max_routes)
        self._lock = threading.Lock()
        self._stack_members: dict[str, TopK] = {}
        self._stacks: dict[tuple[str, str, int | str], list[int]] = {}  # service, route, stack
        self._function_members: dict[str, TopK] = {}
        self._functions: dict[tuple[str, str], list[int]] = {}  # service, function
        # Values of candidates (see TopK), held back until the next promote()
        self._pending_stacks: dict[tuple[str, str, int | str], list[int]] = {}
        self._pending_functions: dict[tuple[str, str], list[int]] = {}
        self._stack_labels: dict[str, dict[int, str]] = {}  # service -> stack id -> label
        self._function_labels: dict[int, str] = {}
        self.durations = Histogram(
            "profiler_request_duration_seconds",
            "Duration of sampled requests.",
            ["service", "route"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        registry.register(self)
        self.requests = RequestMetrics(self.services, self.routes)  # every request, sampled or not
        registry.register(self.requests)

    def record(self, stored: StoredRequests) -> None:
        """Adds stored requests."""
        with self._lock:
            routes, route_of = stored.regroup(self._labels_of)
            durations = [self.durations.labels(*route) for route in routes]  # once a route
            for row, r in zip(stored.rows, route_of.tolist(), strict=True):
                durations[r].observe(row["duration_ns"] * NS)
            stacks = stored.stacks.regroup(route_of).rows(_STACK_VALUES)
            for r, sid, values in stacks:
                self._add_stack(*routes[r], sid, values, stored.shown)
            services, service_of = stored.regroup(lambda row: (self.services(row["service"]),))
            for s, fid, totals in stored.functions.regroup(service_of).rows():
                label = self._function_label(fid, stored.function_names)
                self._add_function(services[s][0], label, totals)
            self._prune()

    def _labels_of(self, row: dict) -> tuple[str, str]:
        service = self.services(row["service"])
        return service, self.routes(service, row["route"])

    def _function_label(self, fid: int, names: dict[int, str]) -> str:
        found = self._function_labels.get(fid)
        if found is None:
            if len(self._function_labels) > 100_000:
                self._function_labels.clear()
            found = cap_label(names.get(fid, f"(function {fid})"))
            self._function_labels[fid] = found
        return found

    def _add_stack(
        self,
        service: str,
        route: str,
        sid: int,
        values: list[int],
        shown: Callable[[int], str | None],
    ) -> None:
        """values: _STACK_VALUES; `shown` names the stack (stacktree.py) if it needs a label.
        The top-k ranks stacks by wall time (all states), so a stack that mostly waits
        keeps its own series."""
        members = self._stack_members.get(service)
        if members is None:
            members = self._stack_members[service] = TopK(self.top_k)
            self._stack_labels[service] = {}
        admitted = members.admit(sid, values[0] + sum(values[2:]))
        if admitted is None:
            labels = self._stack_labels[service]
            if sid not in labels:
                labels[sid] = label_value(shown(sid) or f"(stack {sid})")
            _merge(self._pending_stacks, (service, route, sid), values)
        else:
            _merge(self._stacks, (service, route, sid if admitted else OTHER), values)

    def _forget_labels(self) -> None:
        """Keeps the labels of members and candidates only."""
        for service, top in self._stack_members.items():
            labels = self._stack_labels[service]
            if len(labels) > len(top.members) + len(top.candidates):
                self._stack_labels[service] = {
                    sid: label
                    for sid, label in labels.items()
                    if sid in top.members or sid in top.candidates
                }

    def _add_function(self, service: str, name: str, totals: list[int]) -> None:
        members = self._function_members.get(service)
        if members is None:
            members = self._function_members[service] = TopK(self.max_functions)
        admitted = members.admit(name, totals[SELF])
        if admitted is None:
            _merge(self._pending_functions, (service, name), totals, FUNCTION_MAXIMA)
        else:
            _merge(self._functions, (service, name if admitted else OTHER), totals, FUNCTION_MAXIMA)

    def _tables(self) -> tuple:
        return (
            (self._stack_members, self._pending_stacks, self._stacks, ()),
            (self._function_members, self._pending_functions, self._functions, FUNCTION_MAXIMA),
        )

    def _prune(self) -> None:
        """Candidates dropped to bound memory: their held-back values go to `(other)`."""
        for tops, pending, series, maxima in self._tables():
            dropped = {service: top.prune() for service, top in tops.items()}
            if any(dropped.values()):
                for key in [k for k in pending if k[-1] in dropped[k[0]]]:
                    _merge(series, (*key[:-1], OTHER), pending.pop(key), maxima)
                self._forget_labels()

    def _settle(self) -> None:
        for tops, pending, series, maxima in self._tables():
            for top in tops.values():
                top.promote()
            for key, values in pending.items():
                member = key[-1] in tops[key[0]].members
                _merge(series, key if member else (*key[:-1], OTHER), values, maxima)
            pending.clear()
        self._forget_labels()

    def promote(self) -> None:
        """Settles the candidates: the heaviest become members, the rest go to `(other)`."""
        with self._lock:
            self._settle()

    def describe(self) -> Iterator[Metric]:
        return iter(self._families({}, {}))

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            self._settle()
            stacks: dict[tuple[str, str, str], list[int]] = {}
            for (service, route, sid), values in self._stacks.items():
                label = OTHER if sid == OTHER else self._stack_labels[service][sid]
                _merge(stacks, (service, route, label), values)  # alike once elided: one
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
        stack_wait = CounterMetricFamily(
            "profiler_stack_wait_seconds",
            "Time a lane waited with this stack as its innermost suspended await chain, by "
            "state (awaiting: what it awaits is not done; ready: woken, not resumed yet); "
            "with the self time, sums are the lanes' wall time.",
            labels=[*stack_labels, "state"],
        )
        for (service, route, stack), (self_ns, calls, *waits) in stacks.items():
            stack_self.add_metric([service, route, stack], self_ns * NS)
            stack_calls.add_metric([service, route, stack], calls)
            for state, ns in zip(WAIT_STATES, waits, strict=True):
                if ns:
                    stack_wait.add_metric([service, route, stack, state], ns * NS)
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
        families: list[Metric] = [stack_self, stack_calls, stack_wait]
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
