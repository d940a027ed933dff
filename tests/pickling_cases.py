"""Functions to pickle by value, and how to call them (shared by `test_host_pickling` and
the interpreter it loads them in, which must not import the profiler itself)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

SOURCE = """
import asyncio

def make_closure(k):
    def scaled(x):
        return x * k
    return scaled

square = lambda x: x * x  # noqa: E731

def countdown(n):
    while n:
        yield n
        n -= 1

async def later(x):
    await asyncio.sleep(0)
    return x + 1

def fails(x):
    return {"present": x}["missing"]
"""

# case -> (the function, read from the source's namespace; how a caller uses it)
CASES: dict[str, tuple[Callable[[dict], Callable], Callable[[Callable], Any]]] = {
    "closure": (lambda ns: ns["make_closure"](3), lambda f: f(7)),
    "lambda": (lambda ns: ns["square"], lambda f: f(9)),
    "generator": (lambda ns: ns["countdown"], lambda f: list(f(4))),
    "coroutine": (lambda ns: ns["later"], lambda f: asyncio.run(f(41))),
    "raises": (lambda ns: ns["fails"], lambda f: f(1)),
}


def outcome(case: str, function: Callable) -> list:
    """What a caller sees: the value, or the exception's type and message."""
    try:
        return ["value", CASES[case][1](function)]
    except Exception as exc:
        return ["raised", type(exc).__name__, str(exc)]
