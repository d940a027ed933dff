"""Host options: `profiler-host run` flags, `PROFILER_*` env vars, `start(**options)`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from profiler_core.config import (
    Option,
    address,
    duration,
    flag,
    non_negative_float,
    positive_int,
    resolve,
    size,
)
from profiler_host.filters import parse_globs
from profiler_host.security import ChannelSecurity, check_files

OPTIONS = [
    Option("server", "127.0.0.1:50051", "profiling server's gRPC address (HOST:PORT)", address),
    Option("service", "", "service name shown on the server [default: the program's name]"),
    Option(
        "include",
        "",
        "comma-separated modules or globs to instrument, each with its submodules, e.g. "
        "'myapp' [default: for a gunicorn/uvicorn app, its package and the packages and "
        "modules beside it; else __main__]",
        parse_globs,
    ),
    Option(
        "exclude",
        "",
        "comma-separated modules or globs never to instrument, each with its submodules",
        parse_globs,
    ),
    Option(
        "sample-rate",
        "10",
        "sampled requests per second per process (0: only forced requests)",
        non_negative_float,
    ),
    Option(
        "route-interval",
        "60s",
        "the first request of each route in every interval is sampled",
        duration,
    ),
    Option(
        "whole-process",
        "false",
        "record the whole process as one request (scripts, jobs, test suites)",
        flag,
    ),
    Option(
        "propagate",
        "true",
        "carry sampled requests into the asyncio tasks, threads and thread-pool work they "
        "start, each as a lane",
        flag,
    ),
    Option("buffer", "32MiB", "unacked profile data kept for the server; over it, drop", size),
    Option("flush-interval", "1s", "how often recorded events are sent, at most", duration),
    Option("flush-timeout", "2s", "longest wait at exit for the server to store", duration),
    Option(
        "max-request-events",
        "200000",
        "events recorded per request before it is marked truncated",
        positive_int,
    ),
    Option(
        "code-cache",
        "",
        "directory for rewritten code, so warm starts skip rewriting; 'off' disables "
        "[default: $XDG_CACHE_HOME/request-profiler or ~/.cache/request-profiler]",
    ),
    Option(
        "token",
        "",
        "ingest token the server asks for (set it through the env var, which ps does not show)",
    ),
    Option(
        "tls",
        "false",
        "connect over TLS, checking the server's certificate against the system's CAs "
        "(implied by --tls-ca and --tls-cert)",
        flag,
    ),
    Option("tls-ca", "", "PEM file of the CA that signed the server's certificate"),
    Option("tls-cert", "", "PEM client certificate for a server that asks for one (mutual TLS)"),
    Option("tls-key", "", "PEM private key of --tls-cert"),
    Option(
        "force-secret",
        "",
        "when set, requests with header X-Profiler-Force: <secret> are always sampled",
    ),
]

BY_NAME = {option.dest: option for option in OPTIONS}


@dataclass(frozen=True)
class HostSettings:
    server: str
    service: str
    include: tuple[str, ...]
    exclude: tuple[str, ...]
    sample_rate: float
    route_interval: float
    whole_process: bool
    propagate: bool
    buffer: int
    flush_interval: float
    flush_timeout: float
    max_request_events: int
    code_cache: str
    token: str
    tls: bool
    tls_ca: str
    tls_cert: str
    tls_key: str
    force_secret: str

    @classmethod
    def load(
        cls, overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
    ) -> HostSettings:
        """Keyword options (already typed or as text) over env vars over defaults."""
        overrides = dict(overrides or {})
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown profiler option(s): {', '.join(sorted(unknown))}")
        typed = {
            k: tuple(v) if isinstance(v, list) else v
            for k, v in overrides.items()
            if v is not None and not isinstance(v, str)
        }
        texts = {k: v for k, v in overrides.items() if isinstance(v, str)}
        given = argparse.Namespace(**{option.dest: texts.get(option.dest) for option in OPTIONS})
        values = resolve(OPTIONS, given, environ) | typed
        if not values["service"]:
            values["service"] = os.path.basename(sys.argv[0] if sys.argv else "") or "python"
        settings = cls(**values)
        check_files(settings.security)
        return settings

    @property
    def security(self) -> ChannelSecurity:
        return ChannelSecurity(self.token, self.tls, self.tls_ca, self.tls_cert, self.tls_key)
