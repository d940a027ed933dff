"""A small FastAPI app: `yield` dependencies (sync ones run in anyio's worker threads), an
`HTTPException` leaving them, work handed to the loop's executor, a fast async endpoint
(`/items/{item_id}`, no dependency) for the overhead benchmarks, and a router included
under a prefix and a Starlette app mounted (their routes are named by their full
templates)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, FastAPI, HTTPException
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

app = FastAPI()
versioned = APIRouter()


def sync_resource():
    try:
        yield "sync"
    finally:
        pass


async def async_resource():
    try:
        yield "async"
    finally:
        await asyncio.sleep(0)


@app.get("/health")
def health() -> dict:
    return {"ok": True}


@app.get("/items/{item_id}")
async def item(item_id: int) -> dict:
    return {"id": item_id, "name": f"item {item_id}"}


@app.get("/sync/{item_id}")
def sync_item(item_id: int, resource: str = Depends(sync_resource)) -> dict:
    if item_id == 0:
        raise HTTPException(status_code=404, detail="no such item")
    return {"id": item_id, "resource": resource}


@app.get("/async/{item_id}")
async def async_item(
    item_id: int,
    first: str = Depends(async_resource),
    second: str = Depends(sync_resource),
) -> dict:
    if item_id == 0:
        raise HTTPException(status_code=404, detail="no such item")
    await asyncio.sleep(0.001)
    return {"id": item_id, "resources": [first, second]}


@app.get("/executor")
async def executor() -> dict:
    loop = asyncio.get_running_loop()
    total = await loop.run_in_executor(None, sum, [1, 2, 3])
    return {"total": total, "length": await asyncio.to_thread(len, "abc")}


@versioned.get("/{item_id}")
async def versioned_item(item_id: int) -> dict:
    return {"id": item_id, "version": 1}


async def admin(request: Request) -> PlainTextResponse:
    return PlainTextResponse("admin")


async def admin_user(request: Request) -> PlainTextResponse:
    return PlainTextResponse(f"user {request.path_params['user_id']}")


app.include_router(versioned, prefix="/api/v1/items")
app.mount(
    "/bigger",
    Starlette(routes=[Route("/admin/", admin), Route("/users/{user_id:int}", admin_user)]),
)
