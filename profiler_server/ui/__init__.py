"""The web UI: plain HTML, JavaScript modules and CSS (no build step, no CDN) served at `/`
and `/ui/...`; every figure it shows comes from the JSON API."""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"


def routes() -> list[BaseRoute]:
    def index(_: Request) -> FileResponse:
        return FileResponse(STATIC / "index.html")

    return [Route("/", index), Mount("/ui", app=StaticFiles(directory=STATIC), name="ui")]
