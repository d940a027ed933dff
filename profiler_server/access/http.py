"""The HTTP listener's access checks, as ASGI middleware in front of the whole app.

- The `Host` header must be on the allow-list (421 otherwise): a page that rebinds its
  own DNS name to this server's address cannot read the API through the victim's browser.
- With a read token, everything but the UI's static files, `/healthz` and the login asks
  for it: `Authorization: Bearer <token>` (scripts, Prometheus, Grafana) or the cookie that
  `POST /api/login` sets (the UI, whose download links carry no header). No token: 401;
  a wrong one: 403. Every refusal is a JSON `{"error": ...}` and is counted.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import Counter

from profiler_server.access.tokens import ReadToken, bearer

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

COOKIE = "profiler_read_token"
LOGIN = "/api/login"
OPEN_PATHS = ("/healthz",)  # answered whatever the Host: load balancers probe by IP
PUBLIC_PREFIXES = ("/ui/",)  # the UI's code holds no profile data
PUBLIC_PATHS = ("/", LOGIN)
MAX_LOGIN_BYTES = 4096
ANY_HOST = "*"
LISTENER = "http"


def host_name(header: str) -> str:
    """The name of a Host header without its port, lower case (`[::1]:80` gives `::1`)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class HttpAccess:
    def __init__(
        self,
        app: ASGIApp,
        allowed_hosts: frozenset[str],
        read_token: ReadToken | None,
        denied: Counter,
    ) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts
        self.read_token = read_token
        self.denied = denied

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        if ANY_HOST not in self.allowed_hosts and host_name(host) not in self.allowed_hosts:
            return await self._refuse(
                send, 421, "bad_host", f"Host {host!r} is not served here (--allowed-hosts)"
            )
        if scope["path"] == LOGIN and scope["method"] == "POST":
            return await self._login(scope, receive, send, headers)
        if self.read_token is None or self._public(scope["path"]):
            return await self.app(scope, receive, send)
        token = bearer(headers.get("authorization")) or _cookie(headers.get("cookie"))
        if token is None:
            return await self._refuse(
                send,
                401,
                "no_token",
                "this server needs its read token: send Authorization: Bearer <token>, "
                "or log in on the UI",
            )
        if not self.read_token.matches(token):
            return await self._refuse(send, 403, "bad_token", "wrong read token")
        return await self.app(scope, receive, send)

    @staticmethod
    def _public(path: str) -> bool:
        return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)

    async def _login(self, scope: Scope, receive: Receive, send: Send, headers: dict) -> None:
        """Takes `{"token": ...}` and answers 204 with the token as an HttpOnly,
        SameSite=Strict cookie (Secure over TLS)."""
        origin = headers.get("origin")
        if origin and urlsplit(origin).netloc.lower() != headers.get("host", "").lower():
            return await self._refuse(send, 403, "bad_origin", "log in from this server's UI")
        if self.read_token is None:
            return await self._refuse(send, 404, "no_read_token", "this server has no read token")
        body = await _body(receive, MAX_LOGIN_BYTES)
        try:
            token = json.loads(body)["token"] if body is not None else None
        except (ValueError, TypeError, KeyError):
            token = None
        if not isinstance(token, str) or not token:
            return await self._refuse(send, 400, "bad_login", 'expected {"token": "..."}')
        if not self.read_token.matches(token):
            return await self._refuse(send, 403, "bad_token", "wrong read token")
        cookie = f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
        if scope.get("scheme") == "https":
            cookie += "; Secure"
        await send(
            {
                "type": "http.response.start",
                "status": 204,
                "headers": [(b"set-cookie", cookie.encode())],
            }
        )
        await send({"type": "http.response.body", "body": b""})

    async def _refuse(self, send: Send, status: int, reason: str, message: str) -> None:
        self.denied.labels(LISTENER, reason).inc()
        body = json.dumps({"error": message}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        if status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="request-profiler"'))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _cookie(header: str | None) -> str | None:
    if not header:
        return None
    cookies = SimpleCookie()
    try:
        cookies.load(header)
    except CookieError:
        return None
    morsel = cookies.get(COOKIE)
    return morsel.value if morsel is not None and morsel.value else None


async def _body(receive: Receive, limit: int) -> bytes | None:
    """The request body, or None once it grows past `limit` bytes."""
    body = b""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        body += message.get("body", b"")
        if len(body) > limit:
            return None
        if not message.get("more_body", False):
            return body
