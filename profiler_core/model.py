"""The event and call model both sides agree on (values match the wire enums)."""

from __future__ import annotations

from enum import IntEnum

from profiler_core.wire import ingest_pb2


class EventKind(IntEnum):
    ENTER = ingest_pb2.ENTER
    EXIT = ingest_pb2.EXIT
    EXIT_EXCEPTION = ingest_pb2.EXIT_EXCEPTION
    SUSPEND = ingest_pb2.SUSPEND
    RESUME = ingest_pb2.RESUME
    READY = ingest_pb2.READY
    EXIT_CANCELLED = ingest_pb2.EXIT_CANCELLED


class FunctionKind(IntEnum):
    FUNCTION = ingest_pb2.FUNCTION
    GENERATOR = ingest_pb2.GENERATOR
    COROUTINE = ingest_pb2.COROUTINE
    ASYNC_GENERATOR = ingest_pb2.ASYNC_GENERATOR


class LaneKind(IntEnum):
    MAIN = ingest_pb2.MAIN
    TASK = ingest_pb2.TASK
    THREAD = ingest_pb2.THREAD
    EXECUTOR = ingest_pb2.EXECUTOR

    @property
    def label(self) -> str:
        return self.name.lower()


class Outcome(IntEnum):
    """How a call node ended."""

    RETURN = 0
    EXCEPTION = 1
    CANCELLED = 2
    TRUNCATED = 3

    @property
    def label(self) -> str:
        return self.name.lower()


# the event kinds that end a call, and the outcome each gives its node
EXIT_OUTCOMES = {
    EventKind.EXIT: Outcome.RETURN,
    EventKind.EXIT_EXCEPTION: Outcome.EXCEPTION,
    EventKind.EXIT_CANCELLED: Outcome.CANCELLED,
}

MAIN_LANE = 0


def function_name(module: str, qualname: str) -> str:
    """The `module:qualname` form used in trees, stacks and the API."""
    return f"{module}:{qualname}"
