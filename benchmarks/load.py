"""The load client: batches serialized before timing, streamed by several host sessions,
each keeping a window of unacked batches, so the server's ack rate is what is measured."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from profiler_core.wire.builder import BatchBuilder
from profiler_server.loadgen import CallShape, HostStream, hello, synthetic_batch

SERVICE = "bench"
ROUTES = tuple(f"/api/v1/resource{i}/{{id}}" for i in range(8))
ACK_TIMEOUT = 60.0


@dataclass(frozen=True)
class Feed:
    """One session's messages: serialized HostMessages for batch seq 1..n (function
    definitions in seq 1, request ids unique), and the events each batch carries. The same
    feed can be replayed by any number of sessions: ids only need to be unique per session."""

    batches: list[bytes]
    events: list[int]
    clock: tuple[int, int] | None = None  # (wall_ns, monotonic_ns) for Hello; None: now

    @property
    def total_events(self) -> int:
        return sum(self.events)


def serialize(builder: BatchBuilder, seq: int) -> tuple[bytes, int]:
    events = builder.event_count
    return builder.payload(seq), events


def build_feed(shape: CallShape, requests_per_batch: int, batches: int) -> Feed:
    """Whole synthetic requests (start, events, end), a route per batch."""
    out, events = [], []
    for seq in range(1, batches + 1):
        builder = BatchBuilder()
        first = (seq - 1) * requests_per_batch + 1
        synthetic_batch(
            builder,
            shape,
            range(first, first + requests_per_batch),
            route=ROUTES[seq % len(ROUTES)],
            define_functions=seq == 1,
        )
        raw, count = serialize(builder, seq)
        out.append(raw)
        events.append(count)
    return Feed(out, events)


@dataclass
class LoadResult:
    events: int = 0
    batches: int = 0
    rejected: int = 0
    sessions: list[str] = field(default_factory=list)
    seconds: float = 0.0  # from start to the last ack
    errors: list[str] = field(default_factory=list)

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


class Load:
    """One thread per feed. With `repeat`, each thread replays its feed in new sessions until
    `seconds` have passed; without, it sends the feed once (`seconds` is then a cap). Either
    way it stops sending at the deadline and waits (bounded) for the acks still due."""

    def __init__(
        self,
        target: str,
        feeds: Sequence[Feed],
        window: int = 16,
        seconds: float = 30.0,
        repeat: bool = True,
    ) -> None:
        self.target = target
        self.feeds = list(feeds)
        self.window = window
        self.seconds = seconds
        self.repeat = repeat
        self.result = LoadResult()
        self._lock = threading.Lock()
        self._live: dict[int, tuple[Feed, HostStream]] = {}
        self._last_ack = 0.0
        self._threads: list[threading.Thread] = []
        self._started = 0.0
        self._deadline = 0.0

    def start(self) -> None:
        self._started = time.monotonic()
        self._deadline = self._started + self.seconds
        for i, feed in enumerate(self.feeds):
            thread = threading.Thread(target=self._drive, args=(i, feed), daemon=True)
            thread.start()
            self._threads.append(thread)

    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def acked_events(self) -> int:
        """Events acked so far (finished sessions plus the live ones), for sampling."""
        with self._lock:
            live = list(self._live.values())
            done = self.result.events
        return done + sum(_acked_events(feed, stream) for feed, stream in live)

    def join(self) -> LoadResult:
        # A thread past the deadline waits at most ACK_TIMEOUT for acks, then 10 s in close().
        give_up = self._deadline + 2 * ACK_TIMEOUT + 10
        for thread in self._threads:
            thread.join(max(0.0, give_up - time.monotonic()))
            if thread.is_alive():
                self.result.errors.append("a stream thread did not finish in time")
        self.result.seconds = max(0.0, self._last_ack - self._started)
        return self.result

    def _drive(self, index: int, feed: Feed) -> None:
        while time.monotonic() < self._deadline:
            if not self._session(index, feed) or not self.repeat:
                return

    def _session(self, index: int, feed: Feed) -> bool:
        """Streams one session; returns False if it failed (the error is recorded)."""
        session_id = uuid.uuid4()
        message = hello(SERVICE, session_id)
        if feed.clock is not None:
            message.wall_ns, message.monotonic_ns = feed.clock
        stream = HostStream(self.target)
        with self._lock:
            self._live[index] = (feed, stream)
            self.result.sessions.append(str(session_id))
        stream.send_hello(message)
        sent = 0
        ok = True
        for seq, raw in enumerate(feed.batches, 1):
            if time.monotonic() >= self._deadline:
                break
            if seq > self.window and not stream.wait_acked({seq - self.window}, ACK_TIMEOUT):
                ok = False
                break
            stream.send_raw(raw)
            sent = seq
        ok = stream.wait_acked(set(range(1, sent + 1)), ACK_TIMEOUT) and ok
        acked_at = time.monotonic()
        stream.close()
        with self._lock:
            del self._live[index]
            self._last_ack = max(self._last_ack, acked_at)
            self.result.events += _acked_events(feed, stream)
            self.result.batches += len(stream.stored)
            self.result.rejected += len(stream.rejected)
            if not ok:
                self.result.errors.append(
                    f"session {session_id}: acks missing after {ACK_TIMEOUT:.0f} s "
                    f"(stream error: {stream.error})"
                )
        return ok


def _acked_events(feed: Feed, stream: HostStream) -> int:
    return sum(feed.events[seq - 1] for seq in stream.stored.copy())
