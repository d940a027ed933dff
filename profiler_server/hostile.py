"""Hostile host messages, for fuzzing a server over the real wire: random bytes, valid
batches with bits flipped, cut short or spliced, and well-formed batches that push every
limit (long names, made-up function ids, request starts without events, many lanes, many
functions, a second Hello). Seeded, so a failing campaign can be replayed."""

from __future__ import annotations

import random
from collections.abc import Callable

from profiler_core.wire import ingest_pb2
from profiler_core.wire.builder import BatchBuilder
from profiler_server.loadgen import CallShape, hello, synthetic_batch

SHAPE = CallShape(calls=30, depth=6, functions=8)


class HostileMessages:
    """Serialized HostMessages (each with the seq it carries, 0 for none), one at a time."""

    def __init__(self, seed: int, max_bytes: int = 64 * 1024) -> None:
        self.random = random.Random(seed)
        self.max_bytes = max_bytes
        self.seq = 0
        self._kinds: list[Callable[[], bytes]] = [
            self.noise,
            self.flipped,
            self.cut,
            self.spliced,
            self.long_names,
            self.made_up_functions,
            self.starts_without_events,
            self.many_lanes,
            self.many_functions,
            self.second_hello,
            self.valid,
        ]

    def next(self) -> bytes:
        return self.random.choice(self._kinds)()

    # --- bytes -------------------------------------------------------------------------------
    def noise(self) -> bytes:
        return self.random.randbytes(self.random.randrange(0, 4096))

    def flipped(self) -> bytes:
        data = bytearray(self.valid())
        for _ in range(self.random.randint(1, 8)):
            data[self.random.randrange(len(data))] ^= 1 << self.random.randrange(8)
        return bytes(data)

    def cut(self) -> bytes:
        data = self.valid()
        return data[: self.random.randrange(len(data))]

    def spliced(self) -> bytes:
        data = self.valid()
        at = self.random.randrange(len(data))
        return data[:at] + self.random.randbytes(self.random.randrange(1, 64)) + data[at:]

    # --- well-formed, at the limits ----------------------------------------------------------
    def _batch(self, builder: BatchBuilder) -> bytes:
        self.seq += 1
        seq = self.seq if self.random.random() < 0.9 else self.random.randrange(1, 2**63)
        return builder.payload(seq)

    def valid(self) -> bytes:
        builder = BatchBuilder()
        first = self.seq * 4 + 1
        synthetic_batch(builder, SHAPE, range(first, first + self.random.randint(1, 4)))
        return self._batch(builder)

    def _text(self, most: int) -> str:
        size = self.random.randrange(most)
        return self.random.choice(("x" * size, "\0" * size, "ß" * size))

    def long_names(self) -> bytes:
        builder = BatchBuilder()
        most = self.max_bytes // 8
        for fid in range(1, 4):
            builder.function(fid, self._text(most), self._text(most), self._text(most), fid)
        rid = self.random.randrange(1, 2**40)
        builder.start(rid, self._text(most), self._text(64), 1_000)
        builder.lane(rid, 1, 2, self._text(most))
        return self._batch(builder)

    def made_up_functions(self) -> bytes:
        builder = BatchBuilder()
        rid = self.random.randrange(1, 2**40)
        calls = self.random.randint(1, 500)
        fids = [self.random.randrange(2**32) for _ in range(calls)]
        builder.start(rid, "/made-up", "GET", 1_000)
        builder.run(
            rid,
            0,
            bytes([0] * calls + [1] * calls),
            fids + fids[::-1],
            list(range(1, calls + 1)) + list(range(calls, 0, -1)),
            list(range(1_001, 1_001 + 2 * calls)),
        )
        builder.end(rid, 1_001 + 2 * calls, 200)
        return self._batch(builder)

    def starts_without_events(self) -> bytes:
        builder = BatchBuilder()
        base = self.random.randrange(1, 2**40)
        for rid in range(base, base + self.random.randint(1, 2000)):
            builder.start(rid, "/open", "GET", 1_000)
        return self._batch(builder)

    def many_lanes(self) -> bytes:
        builder = BatchBuilder()
        rid = self.random.randrange(1, 2**40)
        builder.start(rid, "/lanes", "GET", 1_000)
        for lane in range(1, self.random.randint(2, 2000)):
            builder.lane(rid, lane, self.random.randrange(6), "lane" * self.random.randrange(50))
        return self._batch(builder)

    def many_functions(self) -> bytes:
        builder = BatchBuilder()
        base = self.random.randrange(2**32 - 5000)
        for fid in range(base, base + self.random.randint(1, 3000)):
            builder.function(fid, "made.up", f"f{fid}", "made_up.py", fid % 100_000)
        return self._batch(builder)

    def second_hello(self) -> bytes:
        return ingest_pb2.HostMessage(hello=hello("second")).SerializeToString()
