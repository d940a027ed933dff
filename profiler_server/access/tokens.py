"""Bearer tokens: ingest tokens, each scoped to services, and the one read token.

Tokens live in files (never on a command line, where `ps` shows them). They are compared
by their SHA-256 digests with `hmac.compare_digest`, so neither a lookup nor a comparison
leaks how much of a guess was right.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

MIN_TOKEN_CHARS = 16
ANY_SERVICE = "*"
# what a header, gRPC metadata and a cookie all carry as is (base64, hex, URL-safe)
_TOKEN = re.compile(r"[A-Za-z0-9._~+/=-]+")


class TokenFileError(ValueError):
    """A token file that cannot be used; the message names the file and the line."""


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def bearer(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` value (the scheme in any case)."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def _checked(token: str, where: str) -> str:
    if len(token) < MIN_TOKEN_CHARS:
        raise TokenFileError(f"{where}: a token needs at least {MIN_TOKEN_CHARS} characters")
    if not _TOKEN.fullmatch(token):
        raise TokenFileError(f"{where}: a token is letters, digits and . _ ~ + / = - only")
    return token


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenFileError(f"cannot read token file {path}: {exc}") from None


@dataclass(frozen=True)
class IngestTokens:
    """What each ingest token may send: its services by the token's digest."""

    services: Mapping[bytes, frozenset[str]]

    @classmethod
    def load(cls, path: str) -> IngestTokens:
        """`SERVICE TOKEN` per line (`*` for any service; `#` starts a comment). A token
        on several lines may send for each of their services."""
        services: dict[bytes, set[str]] = {}
        for number, line in enumerate(_read(path).splitlines(), 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            where = f"{path} line {number}"
            if len(words) != 2:
                raise TokenFileError(f"{where}: expected SERVICE TOKEN")
            service, token = words
            services.setdefault(digest(_checked(token, where)), set()).add(service)
        if not services:
            raise TokenFileError(f"{path}: no tokens in it (lines of SERVICE TOKEN)")
        return cls({key: frozenset(names) for key, names in services.items()})

    def services_for(self, token: str | None) -> frozenset[str] | None:
        """The services `token` may send for; None for no token or an unknown one."""
        return None if token is None else self.services.get(digest(token))


def permits(services: frozenset[str], service: str) -> bool:
    return ANY_SERVICE in services or service in services


@dataclass(frozen=True)
class ReadToken:
    """The token the API, the UI and /metrics ask for."""

    _digest: bytes

    @classmethod
    def load(cls, path: str) -> ReadToken:
        return cls(digest(_checked(_read(path).strip(), path)))

    def matches(self, token: str) -> bool:
        return hmac.compare_digest(digest(token), self._digest)
