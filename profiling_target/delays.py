"""Known amounts of waiting and of CPU in named functions, so profiles can be checked."""

from __future__ import annotations

import asyncio
import time


def call_slow_upstream(ms: float) -> None:
    """Stands for a blocking call to a slow service (payment provider, search cluster)."""
    time.sleep(ms / 1000)


async def call_slow_upstream_async(ms: float) -> None:
    """The same wait as an await: the event loop stays free."""
    await asyncio.sleep(ms / 1000)


def crunch_numbers(ms: float) -> int:
    """Keeps the CPU busy for `ms` of wall time on the calling thread; returns the rounds done."""
    deadline = time.perf_counter() + ms / 1000
    rounds = 0
    while time.perf_counter() < deadline:
        rounds += 1
    return rounds
