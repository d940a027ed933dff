"""The server's own health metrics (standard prometheus_client objects)."""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from profiler_core.stacks import cap_label
from profiler_server.assembly import problems as P
from profiler_server.metrics.services import ServiceLabels

# Why access checks refuse, per listener (profiler_server/ingest/service.py for gRPC,
# profiler_server/access/http.py for HTTP): every pair is a series from the start.
DENIED_REASONS = {
    "grpc": ("no_token", "bad_token", "wrong_service"),
    "http": ("bad_host", "no_token", "bad_token", "bad_origin", "no_read_token", "bad_login"),
}

MAX_REASONS = 32  # distinct host drop reasons exported; the rest are "(other)"
MAX_REASON_BYTES = 64
OTHER = "(other)"


class ServerHealth:
    def __init__(self, registry: CollectorRegistry, max_services: int = 100) -> None:
        self.services = ServiceLabels(max_services)
        self._reasons: dict[str, set[str]] = {"requests": set(), "events": set()}
        self.events = Counter(
            "profiler_ingest_events", "Events received from hosts.", registry=registry
        )
        self.batches = Counter(
            "profiler_ingest_batches", "Batches received from hosts.", registry=registry
        )
        self.bytes = Counter(
            "profiler_ingest_bytes", "Bytes of host messages received.", registry=registry
        )
        self.rejected = Counter(
            "profiler_ingest_rejected",
            "Input rejected or repaired, by reason (see docs/how-it-works.md).",
            ["reason"],
            registry=registry,
        )
        self.denied = Counter(
            "profiler_access_denied",
            "Streams and HTTP requests refused by the access checks, by listener and reason.",
            ["listener", "reason"],
            registry=registry,
        )
        self.api_rejected = Counter(
            "profiler_api_rejected",
            "HTTP API requests answered 400, by parameter and reason (see docs/api.md).",
            ["parameter", "reason"],
            registry=registry,
        )
        for listener, reasons in DENIED_REASONS.items():
            for reason in reasons:
                self.denied.labels(listener, reason)
        for reason in P.REASONS:  # every reason is a series from the start, at 0
            self.rejected.labels(reason)
        self.requests_stored = Counter(
            "profiler_requests_stored",
            "Sampled requests stored, by service.",
            ["service"],
            registry=registry,
        )
        self.requests_truncated = Counter(
            "profiler_requests_truncated",
            "Stored requests marked truncated, by service.",
            ["service"],
            registry=registry,
        )
        self.host_dropped_requests = Counter(
            "profiler_host_dropped_requests",
            "Sampled requests the hosts dropped before sending (as reported by them).",
            ["service", "reason"],
            registry=registry,
        )
        self.host_dropped_events = Counter(
            "profiler_host_dropped_events",
            "Events the hosts dropped before sending (as reported by them).",
            ["service", "reason"],
            registry=registry,
        )
        self.open_streams = Gauge(
            "profiler_ingest_open_streams", "Host streams connected now.", registry=registry
        )
        self.backlog = Gauge(
            "profiler_ingest_backlog_messages",
            "Host messages received but not yet assembled and stored.",
            registry=registry,
        )
        self.open_requests = Gauge(
            "profiler_ingest_open_requests",
            "Requests held in memory until their end (or a timeout).",
            registry=registry,
        )
        self.write_seconds = Histogram(
            "profiler_storage_write_seconds",
            "Duration of one storage transaction (a group of batches).",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=registry,
        )
        self.ack_lag = Histogram(
            "profiler_ingest_ack_lag_seconds",
            "Time from receiving a batch to acking it (durably stored).",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )

    def count_stored(self, rows: Iterable[Mapping]) -> None:
        """Counts stored request rows per service: one increment per service and group,
        not per request (a fleet's group holds a request from each of hundreds of hosts)."""
        stored: collections.Counter[str] = collections.Counter()
        truncated: collections.Counter[str] = collections.Counter()
        for row in rows:
            stored[row["service"]] += 1
            truncated[row["service"]] += row["truncated"]
        for service, n in stored.items():
            label = self.services(service)
            self.requests_stored.labels(label).inc(n)
            if truncated[service]:
                self.requests_truncated.labels(label).inc(truncated[service])

    def count_host_drops(
        self, service: str, requests: Mapping[str, int], events: Mapping[str, int]
    ) -> None:
        """Drop counts as hosts report them; their reason labels are capped in number and size."""
        service = self.services(service)
        for reason, n in requests.items():
            self.host_dropped_requests.labels(service, self._reason("requests", reason)).inc(n)
        for reason, n in events.items():
            self.host_dropped_events.labels(service, self._reason("events", reason)).inc(n)

    def _reason(self, kind: str, reason: str) -> str:
        reason = cap_label(reason, MAX_REASON_BYTES)
        known = self._reasons[kind]
        if reason not in known:
            if len(known) >= MAX_REASONS:
                return OTHER
            known.add(reason)
        return reason

    def count_problems(self, problems: Mapping[str, int]) -> None:
        for reason, count in problems.items():
            if count:
                self.rejected.labels(reason).inc(count)
