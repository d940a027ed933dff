"""A fast sync endpoint: Flask under gunicorn's sync worker, ~0.2 ms a request, where
whatever the profiler adds per request weighs most. Only this module's functions are
instrumented in the benchmarks; Flask's and Werkzeug's are not."""

from __future__ import annotations

from flask import Flask

PRICES = (199, 450, 1250, 75, 3099)

app = Flask(__name__)


def price_of(item_id: int) -> int:
    return PRICES[item_id % len(PRICES)]


def describe(item_id: int) -> dict:
    return {"id": item_id, "name": f"item {item_id}", "price_cents": price_of(item_id)}


@app.get("/health")
def health() -> dict:
    return {"status": "ok"}


@app.get("/items/<int:item_id>")
def item(item_id: int) -> dict:
    return describe(item_id)
