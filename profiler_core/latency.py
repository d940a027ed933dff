"""The fixed duration buckets every request is counted in (host and server agree on them).

Bounds grow by a factor of √2 from 100 µs to about 105 s, so a percentile read from the
buckets is within one bucket (±41 %) of the true one; the last bucket is open.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

FACTOR = 2**0.5
BOUNDS_NS: tuple[int, ...] = tuple(round(100_000 * FACTOR**i) for i in range(41))
BUCKETS = len(BOUNDS_NS) + 1  # the last holds what is over the largest bound


def bucket(duration_ns: int) -> int:
    """The bucket of a duration: the first whose upper bound (inclusive) it does not pass."""
    return bisect_left(BOUNDS_NS, duration_ns)


def percentile(counts: Sequence[int], q: float) -> float | None:
    """The `q` quantile (0..1) in seconds from bucket counts, interpolated geometrically
    inside its bucket (the open last bucket answers its lower bound); None when empty."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for index, count in enumerate(counts):
        if count <= 0:
            continue
        if seen + count >= rank:
            if index >= len(BOUNDS_NS):
                return BOUNDS_NS[-1] / 1e9
            upper = BOUNDS_NS[index]
            lower = BOUNDS_NS[index - 1] if index else upper / FACTOR
            return lower * (upper / lower) ** ((rank - seen) / count) / 1e9
        seen += count
    return BOUNDS_NS[-1] / 1e9
