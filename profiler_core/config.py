"""Options declared once, read from flags, `PROFILER_*` env vars and defaults (in that order)."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ENV_PREFIX = "PROFILER_"


@dataclass(frozen=True)
class Option:
    name: str  # flag without dashes, e.g. "top-k"
    default: str  # as a user would write it; parsed like a given value
    help: str
    parse: Callable[[str], Any] = str

    @property
    def flag(self) -> str:
        return f"--{self.name}"

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper().replace("-", "_")

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def duration(text: str) -> float:
    """Seconds from `500ms`, `30s`, `5m`, `12h`, `7d` or a plain number of seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (examples: 30s, 5m, 7d)")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]


_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|K|M|G)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kib": 1024, "m": 1024**2, "mib": 1024**2}
_SIZE_UNITS |= {"g": 1024**3, "gib": 1024**3}


def size(text: str) -> int:
    """Bytes from `4MiB`, `512KiB`, `1G` or a plain number of bytes."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r} (examples: 4MiB, 512KiB)")
    return int(match.group(1)) * _SIZE_UNITS[(match.group(2) or "").lower()]


def address(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return text


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("", "0", "false", "no", "off")


def flag(text: str) -> bool:
    """A switch's value (on the command line a switch may also stand alone: `explicit`)."""
    lowered = text.strip().lower()
    if lowered in TRUE_WORDS:
        return True
    if lowered in FALSE_WORDS:
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise ValueError(f"must not be negative: {text}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(f"must be positive: {text}")
    return value


class InvalidOption(ValueError):
    """A flag, env var or default that does not parse; the message names which."""


def build_parser(prog: str, description: str, options: Sequence[Option]) -> argparse.ArgumentParser:
    """One value per option; the arguments go through `explicit` first."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    for option in options:
        switch = option.parse is flag
        parser.add_argument(
            option.flag,
            dest=option.dest,
            default=None,
            metavar="[true|false]" if switch else None,
            help=f"{option.help} [env {option.env}; default {option.default}"
            + ("; alone: true]" if switch else "]"),
        )
    return parser


def explicit(argv: Sequence[str], options: Sequence[Option]) -> list[str]:
    """`argv` with each switch given alone written `--name=true`. The options end at `--` or
    at the first word that is no option nor an option's value, so in `--whole-process
    python job.py` the switch stands alone and `python` begins the command; a truth value
    right after a switch is its value, as before (`--whole-process false`)."""
    args = list(argv)
    at = 0
    while at < len(args) and args[at] != "--" and args[at].startswith("-"):
        option = _named(args[at], options)
        at += 1
        if option is None or "=" in args[at - 1]:
            continue
        if option.parse is not flag:
            at += 1  # its value
        elif at < len(args) and _is_truth_value(args[at]):
            at += 1
        else:
            args[at - 1] = f"{option.flag}=true"
    return args


def _named(text: str, options: Sequence[Option]) -> Option | None:
    """The option a flag names, as argparse reads flags (a unique prefix will do)."""
    named = [option for option in options if option.flag.startswith(text)]
    exact = [option for option in named if option.flag == text]
    return (exact or named)[0] if len(exact or named) == 1 else None


def _is_truth_value(text: str) -> bool:
    return text.strip().lower() in TRUE_WORDS + FALSE_WORDS


def resolve(
    options: Sequence[Option],
    args: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Values by dest: flag if given, else env var, else default; InvalidOption names the
    source of a value that does not parse."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for option in options:
        raw = getattr(args, option.dest, None)
        source = option.flag
        if raw is None and option.env in environ:
            raw, source = environ[option.env], option.env
        if raw is None:
            raw, source = option.default, f"the default of {option.flag}"
        try:
            values[option.dest] = option.parse(raw)
        except ValueError as exc:
            raise InvalidOption(f"invalid value for {source}: {exc}") from None
    return values
