"""Server options: each flag has a PROFILER_* env var; flags win over env, env over defaults."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from urllib.parse import urlsplit

from profiler_core.config import Option, address, duration, flag, positive_int, resolve, size


def optional_url(text: str) -> str:
    """An http(s) URL with a host, or empty (the feature stays off)."""
    text = text.strip()
    parts = urlsplit(text)
    if text and (parts.scheme not in ("http", "https") or not parts.netloc):
        raise ValueError(f"expected an http:// or https:// URL, got {text!r}")
    return text.rstrip("/")


def host_list(text: str) -> frozenset[str]:
    """Comma-separated host names, lower case, without ports (`*`: any)."""
    return frozenset(name.strip().strip("[]").lower() for name in text.split(",") if name.strip())


def positive_duration(text: str) -> float:
    """A duration above zero: an interval of zero would spin."""
    value = duration(text)
    if value <= 0:
        raise ValueError(f"must be positive: {text}")
    return value


OPTIONS = [
    Option("listen", "127.0.0.1:50051", "gRPC ingest address (HOST:PORT)", address),
    Option("http", "127.0.0.1:9999", "HTTP address for /metrics, /api and the UI", address),
    Option(
        "db",
        "sqlite:///profiler.db",
        "SQLAlchemy database URL (sqlite:///FILE, postgresql+psycopg://USER@HOST:PORT/DB)",
    ),
    Option("retention", "7d", "delete requests and aggregates older than this", duration),
    Option(
        "top-k",
        "200",
        'stack series exported per service (the rest: stack="(other)")',
        positive_int,
    ),
    Option("top-functions", "1000", "function series exported per service", positive_int),
    Option("max-routes", "500", "route label values per service", positive_int),
    Option("max-message-bytes", "16MiB", "largest host message accepted", size),
    Option(
        "stream-timeout",
        "60s",
        "a session whose stream ended is finished (open requests "
        "stored truncated) after this, unless the host reconnects",
        duration,
    ),
    Option("gap-timeout", "10s", "wait this long for a missing batch before going on", duration),
    Option(
        "request-timeout",
        "10m",
        "store a request truncated if it gets no event for this long",
        duration,
    ),
    Option(
        "max-request-events",
        "1000000",
        "events kept per request (the rest are dropped and the request marked truncated)",
        positive_int,
    ),
    Option(
        "max-open-events",
        "2000000",
        "events held in memory for unfinished requests; over it the oldest are stored truncated",
        positive_int,
    ),
    Option(
        "max-open-requests",
        "10000",
        "unfinished requests held per session (a start without events counts); over it the "
        "oldest is stored truncated",
        positive_int,
    ),
    Option(
        "max-session-functions",
        "100000",
        "functions a session may define; calls to later ones are stored as unknown functions",
        positive_int,
    ),
    Option(
        "max-name-length",
        "1000",
        "characters kept of each name a host sends (route, function, file, lane, hostname); "
        "longer ones are cut with …",
        positive_int,
    ),
    Option(
        "max-services", "100", "service label values in /metrics (the rest: (other))", positive_int
    ),
    Option(
        "pyroscope-url",
        "",
        "push the aggregated stacks to this Pyroscope server (http://HOST:4040); empty: off",
        optional_url,
    ),
    Option("pyroscope-interval", "15s", "how often to push to Pyroscope", positive_duration),
    Option(
        "tls-cert",
        "",
        "PEM certificate chain of the server, for gRPC and HTTP (with --tls-key); empty: plaintext",
    ),
    Option("tls-key", "", "PEM private key of --tls-cert"),
    Option(
        "tls-client-ca",
        "",
        "PEM CA certificates: hosts must present a certificate one of them signed (mutual "
        "TLS on gRPC); empty: no client certificate asked",
    ),
    Option(
        "ingest-tokens-file",
        "",
        "file of 'SERVICE TOKEN' lines: a host must send one of these tokens, and only for "
        "its services ('*': any); empty: hosts need no token",
    ),
    Option(
        "read-token-file",
        "",
        "file holding the token the API, the UI and /metrics ask for; empty: no token asked",
    ),
    Option(
        "allowed-hosts",
        "",
        "comma-separated names the HTTP Host header may carry ('*': any) [default: the "
        "loopback names and the bound address; beyond loopback also this machine's names]",
        host_list,
    ),
    Option(
        "insecure",
        "false",
        "serve on a non-loopback address without TLS and tokens (anyone on the network "
        "can write and read profiles)",
        flag,
    ),
    Option("log-level", "info", "debug, info, warning or error"),
]


@dataclass(frozen=True)
class Settings:
    listen: str
    http: str
    db: str
    retention: float
    top_k: int
    top_functions: int
    max_routes: int
    max_message_bytes: int
    stream_timeout: float
    gap_timeout: float
    request_timeout: float
    max_request_events: int
    max_open_events: int
    max_open_requests: int
    max_session_functions: int
    max_name_length: int
    max_services: int
    pyroscope_url: str
    pyroscope_interval: float
    tls_cert: str
    tls_key: str
    tls_client_ca: str
    ingest_tokens_file: str
    read_token_file: str
    allowed_hosts: frozenset[str]
    insecure: bool
    log_level: str

    @classmethod
    def from_values(cls, values: dict) -> Settings:
        return cls(**values)


DEFAULTS = Settings.from_values(resolve(OPTIONS, argparse.Namespace(), environ={}))
