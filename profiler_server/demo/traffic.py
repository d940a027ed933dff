"""Bounded traffic at every route of the sample apps (see the route table in docs/demo.md)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass


@dataclass(frozen=True)
class Call:
    method: str
    path: str  # `{n}` is the round number, so ids vary
    body: dict | None = None


SHARED = [
    Call("GET", "/health"),
    Call("GET", "/products?category=garden"),
    Call("GET", "/products?sort=price&page={page}"),
    Call("GET", "/products/{product}"),
    Call("GET", "/orders/{order}"),
    Call("POST", "/checkout", {"items": [{"product_id": 1, "quantity": 1}]}),
    Call("POST", "/checkout", {"items": [{"product_id": 7, "quantity": 1}]}),  # sold out: 409
    Call("GET", "/report"),
    Call("GET", "/slow?ms=80"),
]
FLASK = SHARED
STARLETTE = [*SHARED, Call("GET", "/products/export"), Call("GET", "/block?ms=40")]


def _request(base: str, call: Call, n: int) -> urllib.request.Request:
    path = call.path.format(page=1 + n % 5, product=1 + 7 * n % 120, order=1 + 13 * n % 1500)
    data = None
    if call.body is not None:
        data = json.dumps({"customer_id": 1 + n % 200, **call.body}).encode()
    return urllib.request.Request(
        base + path, data=data, method=call.method, headers={"content-type": "application/json"}
    )


def _send(request: urllib.request.Request) -> str:
    """The status code, or the error's kind when there is none."""
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            return str(response.status)
    except urllib.error.HTTPError as exc:
        return str(exc.code)
    except OSError as exc:
        return type(exc).__name__


def drive(base: str, calls: list[Call], rounds: int, concurrency: int = 4) -> Counter[str]:
    """Every call once per round, `concurrency` at a time (so slow and loop-blocking
    requests overlap others); returns how many answers had each status."""
    requests = [_request(base, call, n) for n in range(rounds) for call in calls]
    with ThreadPoolExecutor(concurrency) as pool:
        return Counter(pool.map(_send, requests))
