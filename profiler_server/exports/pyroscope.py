"""Optional forwarding to Pyroscope (`--pyroscope-url`): every interval, the stacks this
server stored since the last push go to Pyroscope's `POST /ingest`, one profile per service.

Like the Prometheus series (metrics/profiles.py), each server forwards what *it* ingested,
from memory, so several servers sharing a database never send a stack twice and Pyroscope
sums them. Pyroscope is someone else's service: pushes run in their own thread with bounded
timeouts, and failures are dropped, counted in `profiler_pyroscope_push_errors_total{kind}`
and logged once per kind; ingest never waits for them.

Two profile types per service: `wall`, each stack's wall time (running + awaiting + ready,
states.py: all of its lanes' time), and `running`, the time its innermost call ran. Neither
is CPU time, so `cpu` would mislabel them. Pyroscope's ingest turns a profile's values into
nanoseconds by multiplying them with 1e9 / sampleRate; with a sample rate of 1e9 Hz our
nanoseconds are stored exactly.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from urllib.parse import urlencode

from prometheus_client import CollectorRegistry, Counter

from profiler_server.assembly.states import STATES
from profiler_server.exports.folded import lines
from profiler_server.storage.writer import StoredRequests

log = logging.getLogger(__name__)

# profile type -> the states it adds up
PROFILE_TYPES = {"wall": tuple(STATES), "running": ("running",)}
SAMPLE_RATE = 1_000_000_000  # one "sample" per nanosecond: values are ns
SPY_NAME = "request-profiler"
MAX_TIMEOUT = 10.0  # seconds per HTTP request (and never more than the interval)
_NOT_IN_APP_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def application_name(service: str, profile_type: str) -> str:
    """`<service>.<type>{}`: Pyroscope reads the last dot-separated part as the profile type;
    characters its name syntax reserves (`{`, `}`, `,`, `=`, spaces ...) become `_`."""
    return f"{_NOT_IN_APP_NAME.sub('_', service) or '_'}.{profile_type}{{}}"


def ingest_url(base: str, service: str, profile_type: str, since: float, until: float) -> str:
    """The documented query: name, from, until (UNIX seconds), format, sampleRate, spyName."""
    start = math.floor(since)
    query = {
        "name": application_name(service, profile_type),
        "from": start,
        "until": max(math.ceil(until), start + 1),
        "format": "folded",
        "sampleRate": SAMPLE_RATE,
        "spyName": SPY_NAME,
    }
    return f"{base}/ingest?{urlencode(query)}"


def _kind(exc: Exception) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return "http"
    if isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError):
        return "timeout"
    if isinstance(exc, OSError):  # URLError included: refused, unreachable, DNS
        return "connection"
    return "internal"


class PyroscopeExporter:
    def __init__(
        self,
        url: str,
        interval: float,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.interval = interval
        self.timeout = min(MAX_TIMEOUT, interval)
        self.clock = clock
        self._lock = threading.Lock()
        # (service, profile type) -> stack name -> ns
        self._pending: dict[tuple[str, str], dict[str, int]] = {}
        self._since = clock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._logged: set[str] = set()
        self.pushes = Counter(
            "profiler_pyroscope_pushes", "Profiles delivered to Pyroscope.", registry=registry
        )
        self.errors = Counter(
            "profiler_pyroscope_push_errors",
            "Profiles not delivered to Pyroscope, by kind of error (they are dropped).",
            ["kind"],
            registry=registry,
        )

    def record(self, stored: StoredRequests) -> None:
        """Adds stored requests' time per (service, profile type, stack); called by the ingest
        worker after each commit, so it must be quick and must never raise."""
        if not len(stored):
            return
        try:
            services, service_of = stored.regroup(lambda row: (row["service"],))
            columns = [state.column for state in STATES.values()]
            totals = stored.stacks.regroup(service_of).rows(columns)
            with self._lock:
                for s, sid, values in totals:
                    by_state = dict(zip(STATES, values, strict=True))
                    name = None
                    for profile_type, states in PROFILE_TYPES.items():
                        ns = sum(by_state[state] for state in states)
                        if ns > 0:
                            name = name or stored.shown(sid) or f"(stack {sid})"
                            stacks = self._pending.setdefault((services[s][0], profile_type), {})
                            stacks[name] = stacks.get(name, 0) + ns
        except Exception as exc:
            self._failed(exc)

    def start(self) -> None:
        self._since = self.clock()
        self._thread = threading.Thread(target=self._run, name="profiler-pyroscope", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Pushes what the last interval holds (bounded by the timeout), then stops."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(self.timeout + 1)
            self._thread = None

    def _run(self) -> None:
        while not self._stopping.wait(self.interval):
            self.flush()
        self.flush()

    def flush(self) -> None:
        """Sends everything recorded since the last flush, one profile per service and type."""
        with self._lock:
            pending, self._pending = self._pending, {}
            since = self._since
            until = self._since = self.clock()
        profiles = sorted(pending)
        for i, (service, profile_type) in enumerate(profiles):
            stacks = pending[(service, profile_type)]
            body = lines([(sig, n, 0) for sig, n in sorted(stacks.items())])
            url = ingest_url(self.url, service, profile_type, since, until)
            try:
                self._post(url, body.encode())
            except Exception as exc:
                kind = self._failed(exc)
                if kind in ("timeout", "connection"):  # the others would wait as long
                    self.errors.labels(kind).inc(len(profiles) - i - 1)
                    return
            else:
                self.pushes.inc()

    def _post(self, url: str, body: bytes) -> None:
        request = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "text/plain"}
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            response.read()

    def _failed(self, exc: Exception) -> str:
        kind = _kind(exc)
        self.errors.labels(kind).inc()
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning(
                "pyroscope %s: %s error (%s); counted in profiler_pyroscope_push_errors_total, "
                "logged once per kind",
                self.url,
                kind,
                exc,
            )
        return kind
