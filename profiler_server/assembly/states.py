"""The states a lane's time is in, and the values a flame graph can weigh stacks by.

Every nanosecond of a lane is charged to one stack in one state: running (a call of the
stack runs: its self time), awaiting (the lane waits on the stack's call, its innermost
suspended await chain, and what it awaits is not done) or ready (woken, but not resumed
yet: the event loop is busy elsewhere). A stack's wall time is the three together; over a
lane's stacks it adds up to the lane's duration. Each export reads these definitions, so
every format weighs stacks the same way."""

from __future__ import annotations

from dataclasses import dataclass

from profiler_server.assembly.totals import AWAITING, READYING, SELF


@dataclass(frozen=True)
class State:
    """Where a state's time is kept: totals column, stack_buckets column, API node field."""

    column: int
    stored: str
    node: str


STATES = {
    "running": State(SELF, "self_ns", "self_ns"),
    "awaiting": State(AWAITING, "await_ns", "self_await_ns"),
    "ready": State(READYING, "ready_ns", "self_ready_ns"),
}


@dataclass(frozen=True)
class Value:
    """What a flame graph's stacks are weighed by: the sum of some stack_buckets columns."""

    name: str
    unit: str  # as pprof names units
    columns: tuple[str, ...]
    description: str


VALUES = {
    value.name: value
    for value in (
        Value(
            "wall",
            "nanoseconds",
            tuple(state.stored for state in STATES.values()),
            "running + awaiting + ready: all of the lanes' time",
        ),
        *(
            Value(name, "nanoseconds", (state.stored,), f"time {name}")
            for name, state in STATES.items()
        ),
        Value("calls", "count", ("calls",), "calls"),
    )
}
WALL = VALUES["wall"]
