"""An ASGI app whose requests schedule loop callbacks while they await: a plain function
through `call_soon`, `call_later` and, from a thread, `call_soon_threadsafe`. Each runs in
the request's context, where no frame of the request is running."""

from __future__ import annotations

import asyncio
import threading
from typing import Any


def on_the_loop(log: list[str]) -> None:
    log.append("ran")


async def app(scope: dict, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    loop = asyncio.get_running_loop()
    log: list[str] = []
    loop.call_soon(on_the_loop, log)
    loop.call_later(0.001, on_the_loop, log)
    thread = threading.Thread(target=loop.call_soon_threadsafe, args=(on_the_loop, log))
    thread.start()
    thread.join()
    await asyncio.sleep(0.05)
    body = f"{len(log)} {type(loop).__module__}".encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})
