"""Query-string values shared by both web layers, refused with InvalidRequest when malformed."""

from __future__ import annotations

from profiling_target.shop.errors import InvalidRequest

MAX_DELAY_MS = 10_000
MAX_PAGE = 10_000
MAX_REPORT_ORDERS = 1_000


def bounded_int(raw: str | None, name: str, default: int, minimum: int, maximum: int) -> int:
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(f"{name} must be an integer") from None
    if not minimum <= value <= maximum:
        raise InvalidRequest(f"{name} must be from {minimum} to {maximum}")
    return value


def delay_ms(raw: str | None, default: int = 50) -> int:
    return bounded_int(raw, "ms", default, 0, MAX_DELAY_MS)


def page_number(raw: str | None) -> int:
    return bounded_int(raw, "page", 1, 1, MAX_PAGE)


def report_orders(raw: str | None, default: int) -> int:
    return bounded_int(raw, "orders", default, 1, MAX_REPORT_ORDERS)
