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

# state -> (its totals column, its stack_buckets column)
STATES = {
    "running": (SELF, "self_ns"),
    "awaiting": (AWAITING, "await_ns"),
    "ready": (READYING, "ready_ns"),
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
            tuple(column for _, column in STATES.values()),
            "running + awaiting + ready: all of the lanes' time",
        ),
        *(
            Value(state, "nanoseconds", (column,), f"time {state}")
            for state, (_, column) in STATES.items()
        ),
        Value("calls", "count", ("calls",), "calls"),
    )
}
WALL = VALUES["wall"]
