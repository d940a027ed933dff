"""The API's parameters, one typed parser per kind: each range-checks its value so a bad
one is a 400 naming the parameter (never a database error, an overflow or a 500), and
each describes itself for the OpenAPI document, so the checks and the published API are
one definition."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

MAX_RAW_CHARS = 64  # a number, time, status or choice longer than this is not one
_NUMBER = re.compile(r"[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?", re.ASCII)
_INTEGER = re.compile(r"[-+]?[0-9]+", re.ASCII)
_STATUS = re.compile(r"[0-9]{1,3}|[1-5][xX][xX]", re.ASCII)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_TIME = datetime(2200, 1, 1, tzinfo=UTC)  # nanoseconds since 1970 fit 64 bits to 2262


class BadParameter(Exception):
    """A parameter the API cannot take: `reason` is one of a few fixed words (a metric
    label), `message` tells the user what was expected."""

    def __init__(self, name: str, reason: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.reason = reason


@dataclass(frozen=True, kw_only=True)
class Param:
    # what parse() may refuse a value for: the `reason` labels of profiler_api_rejected_total,
    # each a series at 0 from the start
    REASONS: ClassVar[tuple[str, ...]] = ("nul_character",)
    name: str
    description: str
    location: str = "query"  # or "path"

    def parse(self, raw: str | None) -> Any:
        """The typed value, or the default when the parameter is absent or empty (what an
        HTML form sends for a field left blank)."""
        if raw is None or raw == "":
            return self.default()
        if "\x00" in raw:
            raise self.bad("nul_character", "must not contain a NUL character")
        return self.convert(raw)

    def default(self) -> Any:
        return None

    def convert(self, raw: str) -> Any:
        raise NotImplementedError

    def schema(self) -> dict:
        raise NotImplementedError

    def bad(self, reason: str, message: str) -> BadParameter:
        return BadParameter(self.name, reason, message)

    def openapi(self) -> dict:
        if self.location == "path":
            return {"name": self.name, "in": "path", "required": True} | self._described()
        return {"name": self.name, "in": "query", "allowEmptyValue": True} | self._described()

    def _described(self) -> dict:
        return {"description": self.description, "schema": self.schema()}

    def bounded(self, raw: str, expected: str) -> str:
        """raw, unless too long to be a number, time, status or choice (and costly to parse)."""
        if len(raw) > MAX_RAW_CHARS:
            raise self.bad("too_long", f"expected {expected}, got {len(raw)} characters")
        return raw


@dataclass(frozen=True, kw_only=True)
class Text(Param):
    """A name matched exactly (service, route, function, request id)."""

    REASONS = (*Param.REASONS, "too_long")

    max_chars: int
    examples: tuple[str, ...] = ()

    def convert(self, raw: str) -> str | None:
        if len(raw) > self.max_chars:
            raise self.bad("too_long", f"at most {self.max_chars:,} characters")
        return raw

    def schema(self) -> dict:
        schema = {"type": "string", "maxLength": self.max_chars, "pattern": "^[^\\x00]*$"}
        return schema | ({"examples": list(self.examples)} if self.examples else {})


@dataclass(frozen=True, kw_only=True)
class IntRange(Param):
    """An integer in [low, high]; absent: default_value (None: the parameter is optional)."""

    REASONS = (*Param.REASONS, "too_long", "not_an_integer", "out_of_range")
    low: int = 1
    high: int
    default_value: int | None

    def default(self) -> int | None:
        return self.default_value

    def convert(self, raw: str) -> int:
        if not _INTEGER.fullmatch(self.bounded(raw, "an integer")):
            raise self.bad("not_an_integer", f"expected an integer, got {raw!r}")
        value = int(raw)
        if not self.low <= value <= self.high:
            raise self.bad("out_of_range", f"from {self.low:,} to {self.high:,}, got {value:,}")
        return value

    def schema(self) -> dict:
        schema = {"type": "integer", "minimum": self.low, "maximum": self.high}
        return schema if self.default_value is None else schema | {"default": self.default_value}


def _finite(param: Param, raw: str, expected: str) -> float:
    if not _NUMBER.fullmatch(param.bounded(raw, expected)):
        raise param.bad("not_a_number", f"expected {expected}, got {raw!r}")
    value = float(raw)
    if not math.isfinite(value):
        raise param.bad("out_of_range", f"expected {expected}, got {raw!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class FloatRange(Param):
    REASONS = (*Param.REASONS, "too_long", "not_a_number", "out_of_range")
    low: float = 0.0
    high: float

    def convert(self, raw: str) -> float:
        value = _finite(self, raw, "a number")
        if not self.low <= value <= self.high:
            raise self.bad("out_of_range", f"from {self.low:g} to {self.high:g}, got {raw}")
        return value

    def schema(self) -> dict:
        return {"type": "number", "minimum": self.low, "maximum": self.high}


@dataclass(frozen=True, kw_only=True)
class Timestamp(Param):
    """ISO-8601 with a zone (`2026-11-22T10:00:00Z`) or epoch seconds, as ns since 1970."""

    REASONS = (*Param.REASONS, "too_long", "out_of_range", "not_a_time", "no_time_zone")

    def convert(self, raw: str) -> int:
        expected = "ISO-8601 with a zone or epoch seconds"
        if _NUMBER.fullmatch(self.bounded(raw, expected)):
            seconds = _finite(self, raw, expected)
            if not 0 <= seconds < (LATEST_TIME - EPOCH).total_seconds():
                raise self.bad("out_of_range", self._range(raw))
            return int(seconds * 1e9)
        try:
            parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError:
            raise self.bad("not_a_time", f"expected {expected}, got {raw!r}") from None
        if parsed.tzinfo is None:
            raise self.bad("no_time_zone", "give a time zone (e.g. a trailing Z for UTC)")
        try:
            in_range = EPOCH <= parsed < LATEST_TIME
        except OverflowError:
            in_range = False
        if not in_range:
            raise self.bad("out_of_range", self._range(raw))
        return (parsed - EPOCH) // timedelta(microseconds=1) * 1000

    def _range(self, raw: str) -> str:
        return f"from {EPOCH:%Y-%m-%d} to before {LATEST_TIME:%Y-%m-%d} (UTC), got {raw!r}"

    def schema(self) -> dict:
        return {
            "anyOf": [
                {
                    "type": "number",
                    "minimum": 0,
                    "exclusiveMaximum": int((LATEST_TIME - EPOCH).total_seconds()),
                },
                {"type": "string", "format": "date-time"},
            ]
        }


@dataclass(frozen=True, kw_only=True)
class Choice(Param):
    """One of a fixed list; the first is the default."""

    REASONS = (*Param.REASONS, "not_allowed")

    choices: tuple[str, ...]

    def default(self) -> str:
        return self.choices[0]

    def convert(self, raw: str) -> str:
        if raw not in self.choices:
            raise self.bad("not_allowed", f"expected one of {', '.join(self.choices)}")
        return raw

    def schema(self) -> dict:
        return {"type": "string", "enum": list(self.choices), "default": self.choices[0]}


@dataclass(frozen=True, kw_only=True)
class Status(Param):
    """`404` (exactly) or a class like `5xx`, as a [low, high) range."""

    REASONS = (*Param.REASONS, "too_long", "malformed")

    def convert(self, raw: str) -> tuple[int, int]:
        if not _STATUS.fullmatch(self.bounded(raw, "a status")):
            raise self.bad(
                "malformed", f"expected a code like 404 or a class like 5xx, got {raw!r}"
            )
        if raw[1:].lower() == "xx":
            low = int(raw[0]) * 100
            return low, low + 100
        return int(raw), int(raw) + 1

    def schema(self) -> dict:
        return {"type": "string", "pattern": "^([0-9]{1,3}|[1-5][xX][xX])$"}


def parse_all(params: tuple[Param, ...], query: Mapping[str, str], path: Mapping[str, str]) -> dict:
    """Every declared parameter, parsed; parameters not declared are ignored."""
    return {p.name: p.parse((path if p.location == "path" else query).get(p.name)) for p in params}
