"""Route counts per hour beside the per-minute ones (`route_hours`), so a range of days reads
hundreds of rows per route, not thousands: its whole hours come from `route_hours`, its
ragged ends from `route_minutes`. The writer adds to both in one transaction and retention
cuts both at the same hour, so the two always hold the same sums."""

from __future__ import annotations

HOUR = 60  # minutes


def hour_rows(minute_rows: list[tuple]) -> list[tuple]:
    """`route_minutes` rows summed per (hour, service, route, status class), in
    `route_hours`' column order, sorted (servers sharing a PostgreSQL lock rows in one order)."""
    sums: dict[tuple, list[int]] = {}
    for minute, service, route, _method, status_class, *values in minute_rows:
        key = (minute - minute % HOUR, service, route, status_class)
        row = sums.get(key)
        if row is None:
            sums[key] = list(values)
        else:
            row[:] = [a + b for a, b in zip(row, values, strict=True)]
    return [(*key, *values) for key, values in sorted(sums.items())]


def split(first: int, last: int) -> tuple[tuple[int, int] | None, list[tuple[int, int]]]:
    """The minutes first..last as the half-open minute range of its whole hours (None when
    it holds none) and the half-open minute ranges left at either end."""
    whole_first = -(-first // HOUR) * HOUR
    whole_end = (last + 1) // HOUR * HOUR
    if whole_first >= whole_end:
        return None, [(first, last + 1)]
    ends = [(a, b) for a, b in ((first, whole_first), (whole_end, last + 1)) if a < b]
    return (whole_first, whole_end), ends


def expired_before(minute: int) -> int:
    """Where retention cuts both tables: the start of `minute`'s hour (route counts are kept
    up to an hour past the retention period, so no hour is ever partly expired)."""
    return minute - minute % HOUR
