"""A fast async endpoint: Starlette under uvicorn (uvloop, httptools), ~0.1-0.2 ms a request,
where whatever the profiler adds per request weighs most. Only this module's functions
are instrumented in the benchmarks; Starlette's are not."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

PRICES = (199, 450, 1250, 75, 3099)


def price_of(item_id: int) -> int:
    return PRICES[item_id % len(PRICES)]


def describe(item_id: int) -> dict:
    return {"id": item_id, "name": f"item {item_id}", "price_cents": price_of(item_id)}


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def item(request: Request) -> JSONResponse:
    return JSONResponse(describe(request.path_params["item_id"]))


app = Starlette(routes=[Route("/health", health), Route("/items/{item_id:int}", item)])
