"""The location and exception tables of a rewritten code object: written and checked.

CPython trusts both tables. On the first trace or profile event it builds a per-code-unit
line array from `co_linetable`; a table describing more code units than `co_code` has
makes it write past that array and corrupts the heap. `bytecode` 0.19 writes such tables
for instructions past column 127 (its one-line form stores columns as raw bytes, and a
byte with the high bit set reads as the start of the next entry). So the rewriter writes
locations with `location_entry` below, and refuses any code object that `check` rejects.

The format is CPython's `Objects/locations.md` (3.11 to 3.13): an entry is a header byte
(bit 7 set, a 4-bit form code, the number of code units minus one) and the form's data,
varints in 6-bit chunks whose bit 6 says another chunk follows.
"""

from __future__ import annotations

import dis
from types import CodeType

_SHORT_FORMS = 10  # codes 0-9: same line, column < 80, width < 16
_ONE_LINE = 10  # codes 10-12: line delta 0-2, both columns < 128
_NO_COLUMN = 13
_LONG = 14
_NO_LOCATION = 15
_MAX_UNITS = 8


class CodeTablesError(ValueError):
    """A table of the code object does not describe its `co_code` exactly."""


def _varint(value: int) -> list[int]:
    chunks = []
    while True:
        chunk, value = value & 0x3F, value >> 6
        chunks.append(chunk | (0x40 if value else 0))
        if not value:
            return chunks


def _svarint(value: int) -> list[int]:
    return _varint(-value << 1 | 1 if value < 0 else value << 1)


def location_entry(
    units: int,
    line_delta: int,
    end_line: int | None,
    column: int | None,
    end_column: int | None,
    line: int | None,
) -> list[int]:
    """One table entry for 1-8 code units at `line` (`line_delta` after the previous
    entry's line), in the smallest form that holds it, as CPython's compiler chooses."""
    if not 1 <= units <= _MAX_UNITS:
        raise CodeTablesError(f"an entry covers 1 to {_MAX_UNITS} code units, not {units}")

    def header(code: int) -> int:
        return 0x80 | code << 3 | (units - 1)

    if line is None:
        return [header(_NO_LOCATION)]
    if column is None or end_column is None or end_line is None:
        return [header(_NO_COLUMN), *_svarint(line_delta)]
    width = end_column - column
    if end_line == line and line_delta == 0 and column < 80 and 0 <= width < 16:
        return [header(column // 8), (column % 8) << 4 | width]
    if end_line == line and 0 <= line_delta <= 2 and column < 128 and end_column < 128:
        return [header(_ONE_LINE + line_delta), column, end_column]
    return [
        header(_LONG),
        *_svarint(line_delta),
        *_varint(end_line - line),
        *_varint(column + 1),
        *_varint(end_column + 1),
    ]


def _read_varint(table: bytes, at: int) -> int:
    """Skips one varint starting at `at`; where the next field starts."""
    while True:
        if at >= len(table):
            raise CodeTablesError("the line table ends inside an entry")
        byte = table[at]
        if byte & 0x80:
            raise CodeTablesError(f"a header byte inside an entry at {at}")
        at += 1
        if not byte & 0x40:
            return at


def linetable_units(table: bytes) -> int:
    """How many code units the location table describes, read strictly."""
    units = at = 0
    while at < len(table):
        byte = table[at]
        if not byte & 0x80:
            raise CodeTablesError(f"no entry header at byte {at} of the line table")
        units += (byte & 7) + 1
        code = byte >> 3 & 15
        at += 1
        if code < _SHORT_FORMS:
            fields = 1
        elif code < _NO_COLUMN:
            fields = 2
        elif code == _NO_COLUMN:
            at = _read_varint(table, at)
            continue
        elif code == _LONG:
            for _ in range(4):
                at = _read_varint(table, at)
            continue
        else:
            continue
        for _ in range(fields):
            if at >= len(table) or table[at] & 0x80:
                raise CodeTablesError(f"entry at byte {at} of the line table is cut short")
            at += 1
    return units


def check(code: CodeType) -> None:
    """Raises CodeTablesError unless the line table covers exactly `co_code` and every
    exception-table entry covers code inside it and jumps to an instruction there."""
    units = len(code.co_code) // 2
    described = linetable_units(code.co_linetable)
    if described != units:
        raise CodeTablesError(f"the line table describes {described} code units, not {units}")
    starts = {ins.offset for ins in dis.get_instructions(code)}
    end_of_previous = 0
    for entry in dis._parse_exception_table(code):  # type: ignore[attr-defined]  # the only parser
        if not end_of_previous <= entry.start < entry.end <= units * 2:
            raise CodeTablesError(f"exception entry {entry.start}-{entry.end} out of place")
        if entry.target not in starts:
            raise CodeTablesError(f"exception entry's target {entry.target} is no instruction")
        end_of_previous = entry.end
