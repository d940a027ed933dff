"""Reasons for rejected or repaired input. Each is counted in `profiler_ingest_rejected_total`."""

from __future__ import annotations

from collections import Counter

# Whole messages
GARBAGE = "garbage"  # bytes that do not decode as a HostMessage
OVERSIZED = "oversized"  # larger than --max-message-bytes
NO_HELLO = "no_hello"  # a batch before the session's Hello
BAD_HELLO = "bad_hello"  # Hello without a 16-byte session id or a service
MALFORMED_BATCH = (
    "malformed_batch"  # columns that disagree; the batch is dropped and acked as rejected
)
DUPLICATE_BATCH = "duplicate_batch"  # same session and seq again; stored once
OUT_OF_ORDER_BATCH = "out_of_order_batch"  # arrived after a later seq
GAP = "gap"  # a seq that never arrived within --gap-timeout
# Events and requests
UNKNOWN_FUNCTION = "unknown_function"
# an undefined function id past a session's names (2 x --max-session-functions): one frame
UNKNOWN_FUNCTION_LIMIT = "unknown_function_limit"
EXIT_WITHOUT_ENTER = "exit_without_enter"
EXIT_MISMATCH = "exit_mismatch"  # exit of another function than the call it closes
MISSING_EXIT = "missing_exit"  # closed by the request's end or by an outer exit
SUSPEND_WHILE_SUSPENDED = "suspend_while_suspended"
RESUME_WITHOUT_SUSPEND = "resume_without_suspend"
EVENTS_AFTER_END = "events_after_end"
MISSING_START = "missing_start"  # a request whose start record never came
STREAM_DIED = "stream_died"  # request stored truncated: its stream ended before its end record
REQUEST_TIMEOUT = "request_timeout"  # request stored truncated: open longer than --request-timeout
MEMORY_LIMIT = "memory_limit"  # request stored truncated early: open events over --max-open-events
EVENT_CAP = "event_cap"  # events beyond --max-request-events dropped
BAD_ROUTE_COUNT = "bad_route_count"  # a request count that breaks the wire's rules; dropped
# Text and limits
UNSTORABLE_TEXT = "unstorable_text"  # NUL or lone surrogates in a string, replaced by U+FFFD
LONG_NAME = "long_name"  # a string longer than --max-name-length (or its column), cut with "…"
FUNCTION_LIMIT = "function_limit"  # function defined beyond --max-session-functions: unknown
OPEN_REQUEST_LIMIT = "open_request_limit"  # stored truncated early: --max-open-requests
SECOND_HELLO = "second_hello"  # another Hello on a stream that has a session: the stream ends
UNSTORABLE_BATCH = "unstorable_batch"  # the store refused it alone: acked as rejected

REASONS = tuple(
    value for name, value in dict(globals()).items() if name.isupper() and isinstance(value, str)
)

Problems = Counter  # reason -> count
