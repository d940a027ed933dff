"""Rewritten code objects carry tables that describe exactly their code (issue 14).

CPython trusts `co_linetable` and the exception table: a line table longer than the code
corrupts the heap at the first trace event. These tests check the location encoder against
CPython's own decoder, the checker against the table `bytecode` 0.19 writes, and a traced
call of rewritten code under `PYTHONMALLOC=debug`, beside a control that shows the same
harness catches the corruption.
"""

from __future__ import annotations

import dis
import os
import random
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from bytecode import Bytecode

from profiler_host import codetables, hooks, rewriter

ROOT = Path(__file__).resolve().parents[1]


def wide(a):
    msg = f"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx{a!r}"  # noqa: E501
    return msg


def _code_with_units(units: int) -> types.CodeType:
    """A code object of exactly `units` code units (NOPs, then RETURN_VALUE's prefix)."""
    source = "def f():\n" + "    pass\n" * units + "    return None\n"
    module = compile(source, "<units>", "exec")
    return next(c for c in module.co_consts if isinstance(c, types.CodeType))


def _random_location(rng: random.Random, line: int) -> tuple:
    kind = rng.random()
    if kind < 0.1:
        return (None, None, None, None)
    start = max(1, line + rng.choice((-3, -1, 0, 0, 0, 1, 2, 3, 40)))
    if kind < 0.2:
        return (start, start, None, None)
    column = rng.choice((0, 5, 79, 80, 127, 128, 200, 255, 256, 1000, rng.randrange(300)))
    end_line = start + rng.choice((0, 0, 0, 1, 5))
    end_column = column + rng.choice((0, 1, 15, 16, 100, 200)) if end_line == start else 3
    return (start, end_line, column, end_column)


@pytest.mark.parametrize("seed", range(20))
def test_location_entries_read_back_through_cpython(seed: int) -> None:
    """Random locations (every form: no location, no column, short, one-line, long; wide
    columns; lines going back), encoded by `location_entry`, decode in CPython to themselves."""
    rng = random.Random(seed)
    code = _code_with_units(40)
    units = len(code.co_code) // 2
    expected: list[tuple] = []
    table: list[int] = []
    line = previous = code.co_firstlineno
    while len(expected) < units:
        count = min(rng.randint(1, 8), units - len(expected))
        location = _random_location(rng, line)
        start, end_line, column, end_column = location
        delta = 0 if start is None else start - previous
        table += codetables.location_entry(count, delta, end_line, column, end_column, start)
        if start is not None:
            previous = line = start
        expected += [location] * count
    rebuilt = code.replace(co_linetable=bytes(table))
    codetables.check(rebuilt)
    assert list(rebuilt.co_positions()) == expected


def test_checker_rejects_what_bytecode_writes_for_wide_columns() -> None:
    """The class of defect: `bytecode`'s own round trip of a wide f-string gives a line table
    of more code units than the code has; the checker says so, the rewriter's output passes
    and keeps every original location."""
    broken = Bytecode.from_code(wide.__code__).to_code()
    with pytest.raises(codetables.CodeTablesError, match="line table"):
        codetables.check(broken)
    rewritten = rewriter.rewrite(wide.__code__, 1, hooks.HOOKS)
    codetables.check(rewritten)
    assert set(wide.__code__.co_positions()) <= set(rewritten.co_positions())


def test_checker_rejects_a_table_that_is_cut_short() -> None:
    code = _code_with_units(3)
    with pytest.raises(codetables.CodeTablesError):
        codetables.check(code.replace(co_linetable=code.co_linetable[:-1]))
    with pytest.raises(codetables.CodeTablesError):
        codetables.check(code.replace(co_linetable=code.co_linetable + bytes([0x80 | 15 << 3])))


def _entry(start: int, length: int, target: int) -> bytes:
    """One exception-table entry (offsets in code units, each below 64), depth 0."""
    return bytes([0x80 | start, length, target, 0])


def test_exception_table_entries_must_cover_code_and_land_on_instructions() -> None:
    def guarded() -> int:
        try:
            return len([])
        except TypeError:
            return -1

    code = guarded.__code__
    codetables.check(code)
    units = len(code.co_code) // 2
    starts = {i.offset for i in dis.get_instructions(code)}
    cache = next(offset for offset in range(0, units * 2, 2) if offset not in starts)
    with pytest.raises(codetables.CodeTablesError, match="out of place"):
        codetables.check(code.replace(co_exceptiontable=_entry(0, units + 5, 0)))
    with pytest.raises(codetables.CodeTablesError, match="no instruction"):
        codetables.check(code.replace(co_exceptiontable=_entry(0, 1, cache // 2)))


TRACED_CALL = textwrap.dedent(
    """
    import gc, sys
    from bytecode import Bytecode
    from profiler_host import hooks, rewriter
    from tests.test_host_code_tables import wide

    if sys.argv[1] == "bytecode":
        wide.__code__ = Bytecode.from_code(wide.__code__).to_code()
    else:
        wide.__code__ = rewriter.rewrite(wide.__code__, 1, hooks.HOOKS)
    sys.settrace(lambda *args: None)
    result = wide(1)
    sys.settrace(None)
    del wide
    gc.collect()
    print(result[-3:])
    """
)


def _traced_under_debug_malloc(way: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONMALLOC": "debug"}
    return subprocess.run(
        [sys.executable, "-c", TRACED_CALL, way],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(
    sys.version_info >= (3, 12),
    reason="from 3.12 (sys.monitoring) a traced call reads no line table past the code",
)
def test_the_harness_catches_an_overlong_line_table() -> None:
    """The control of the test below: `bytecode`'s own round trip, traced, corrupts the heap
    on 3.11, and the harness sees it."""
    control = _traced_under_debug_malloc("bytecode")
    assert control.returncode != 0 and "Debug memory block" in control.stderr, control


def test_traced_rewritten_code_leaves_the_heap_intact() -> None:
    """A tracer on rewritten code under PYTHONMALLOC=debug: no damaged block, no abort."""
    done = _traced_under_debug_malloc("rewriter")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "xx1" and "Debug memory block" not in done.stderr
