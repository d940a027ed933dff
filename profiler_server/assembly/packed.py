"""Protocol Buffers packed varint fields, encoded with NumPy for many values at once (the
protobuf runtime takes ~30 ns per value from a Python list; this takes a few). Framed by
`profiler_core.wire.framing`."""

from __future__ import annotations

import numpy as np

_LIMITS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)


def zigzag(values: np.ndarray) -> np.ndarray:
    """sint32/sint64 encoding: small negative numbers stay short."""
    values = values.astype(np.int64)
    return ((values << 1) ^ (values >> 63)).view(np.uint64)


def varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The values as varints back to back (negative int64 as ten bytes, as protobuf does),
    and the offset where each value's bytes end."""
    rest = values.astype(np.uint64)
    size = np.searchsorted(_LIMITS, rest, side="right") + 1
    ends = np.cumsum(size)
    out = np.empty(int(ends[-1]) if len(ends) else 0, dtype=np.uint8)
    at = ends - size
    while len(rest):
        last = size == 1
        out[at] = (rest & 0x7F).astype(np.uint8) | np.where(last, 0, 0x80).astype(np.uint8)
        more = ~last
        at, rest, size = at[more] + 1, rest[more] >> 7, size[more] - 1
    return out, ends
