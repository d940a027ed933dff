"""Route counts summed over coarser spans beside the per-minute ones (`route_rollups`: whole
days, hours and ten minutes), so a week reads about a hundred rows per route, not ten
thousand: a range is read as its whole days, then whole hours, whole ten minutes at its
ragged ends, and the minutes left from `route_minutes`. The writer adds to both tables in one
transaction and retention cuts both at the same day, so they always hold the same sums."""

from __future__ import annotations

DAY, HOUR, TEN_MINUTES = 1440, 60, 10
SPANS = (DAY, HOUR, TEN_MINUTES)  # minutes, coarsest first, each a multiple of the next
MINUTE = 1  # the span of a piece read from route_minutes


def rollup_rows(minute_rows: list[tuple]) -> list[tuple]:
    """`route_minutes` rows summed per (span, span's first minute, service, route, status
    class), in `route_rollups`' column order, sorted (servers sharing a PostgreSQL lock rows
    in one order)."""
    sums: dict[tuple, list[int]] = {}
    for minute, service, route, _method, status_class, *values in minute_rows:
        for span in SPANS:
            key = (span, minute - minute % span, service, route, status_class)
            row = sums.get(key)
            if row is None:
                sums[key] = list(values)
            else:
                row[:] = [a + b for a, b in zip(row, values, strict=True)]
    return [(*key, *values) for key, values in sorted(sums.items())]


def split(first: int, end: int, spans: tuple[int, ...] = SPANS) -> list[tuple[int, int, int]]:
    """The minutes first..end-1 as pieces (span, start, end): the whole units of the
    coarsest span that fit, the rest of either side split by the next span, and so on down
    to MINUTE."""
    if first >= end:
        return []
    if not spans:
        return [(MINUTE, first, end)]
    span, finer = spans[0], spans[1:]
    start, stop = -(-first // span) * span, end // span * span
    if start >= stop:
        return split(first, end, finer)
    return [*split(first, start, finer), (span, start, stop), *split(stop, end, finer)]


def expired_before(minute: int) -> int:
    """Where retention cuts both tables: the start of `minute`'s day (route counts are kept
    up to a day past the retention period, so no rolled-up row is ever partly expired)."""
    return minute - minute % SPANS[0]
