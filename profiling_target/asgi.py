"""The shop as a Starlette app: `uvicorn profiling_target.asgi:app`.

Routes show the shapes async services have: fan-out with gather and TaskGroup, blocking work
sent to threads, a plain sync endpoint, a streamed response, and a handler that hogs the loop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from profiling_target import delays, params
from profiling_target.shop.async_service import AsyncShop
from profiling_target.shop.checkout import CheckoutRequest
from profiling_target.shop.errors import InvalidRequest, ShopError
from profiling_target.shop.pages import CatalogEntry
from profiling_target.shop.service import REPORT_ORDERS, Shop


def current_shop(request: Request) -> AsyncShop:
    return request.app.state.shop


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def products(request: Request) -> JSONResponse:
    page = await run_in_threadpool(
        current_shop(request).shop.catalog,
        request.query_params.get("category"),
        request.query_params.get("sort", "name"),
        params.page_number(request.query_params.get("page")),
    )
    return JSONResponse(page.to_json())


async def product(request: Request) -> JSONResponse:
    page = await current_shop(request).product_page(request.path_params["product_id"])
    return JSONResponse(page.to_json())


def order(request: Request) -> JSONResponse:
    """A plain def endpoint: Starlette runs it in its thread pool."""
    detail = current_shop(request).shop.order(request.path_params["order_id"])
    return JSONResponse(detail.to_json())


async def checkout(request: Request) -> JSONResponse:
    try:
        payload = await request.json()
    except ValueError:
        raise InvalidRequest("body must be JSON") from None
    checkout_request = CheckoutRequest.from_json(payload)
    receipt = await run_in_threadpool(current_shop(request).shop.checkout, checkout_request)
    return JSONResponse(receipt.to_json(), status_code=201)


async def report(request: Request) -> JSONResponse:
    orders = params.report_orders(request.query_params.get("orders"), REPORT_ORDERS)
    return JSONResponse((await current_shop(request).report(orders)).to_json())


async def ndjson(entries: AsyncIterator[CatalogEntry]) -> AsyncIterator[bytes]:
    async for entry in entries:
        yield json.dumps(entry.to_json()).encode() + b"\n"


async def export(request: Request) -> StreamingResponse:
    """The catalog as newline-delimited JSON, streamed a page of queries at a time."""
    entries = current_shop(request).catalog_entries(request.query_params.get("sort", "name"))
    return StreamingResponse(ndjson(entries), media_type="application/x-ndjson")


async def slow(request: Request) -> JSONResponse:
    ms = params.delay_ms(request.query_params.get("ms"))
    await delays.call_slow_upstream_async(ms)
    return JSONResponse({"slept_ms": ms})


async def block(request: Request) -> JSONResponse:
    """Busy for `ms` without awaiting: every other request on this loop waits meanwhile."""
    ms = params.delay_ms(request.query_params.get("ms"))
    rounds = delays.crunch_numbers(ms)
    return JSONResponse({"blocked_ms": ms, "rounds": rounds})


async def refuse(request: Request, error: ShopError) -> JSONResponse:
    return JSONResponse({"error": str(error)}, status_code=error.status)


def create_app(shop: Shop | None = None) -> Starlette:
    async_shop = AsyncShop(shop or Shop.from_env())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        """Builds the database before the first request, off the event loop."""
        await asyncio.to_thread(async_shop.shop.database.ensure)
        yield

    app = Starlette(
        routes=[
            Route("/health", health),
            Route("/products", products),
            Route("/products/export", export),
            Route("/products/{product_id:int}", product),
            Route("/orders/{order_id:int}", order),
            Route("/checkout", checkout, methods=["POST"]),
            Route("/report", report),
            Route("/slow", slow),
            Route("/block", block),
        ],
        exception_handlers={ShopError: refuse},
        lifespan=lifespan,
    )
    app.state.shop = async_shop
    return app


app = create_app()
