"""The sample apps as a user runs them: gunicorn and uvicorn on loopback, real HTTP requests."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.processes import HttpProcess, free_port

BOOK, GARDEN_ITEM, SOLD_OUT = 1, 45, 7  # ids in the deterministic seed data
CUSTOMER = 5
PRODUCTS = 120


def gunicorn(port: int) -> list[str]:
    return [
        sys.executable, "-m", "gunicorn", "-w", "2", "-b", f"127.0.0.1:{port}",
        "profiling_target.wsgi:app",
    ]  # fmt: skip


def uvicorn(port: int) -> list[str]:
    return [
        sys.executable, "-m", "uvicorn", "profiling_target.asgi:app",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip


def serve(command, directory: Path) -> Iterator[httpx.Client]:
    """Runs the app on its own fresh database; SIGTERM at the end (gunicorn reaps its workers)."""
    port = free_port()
    env = {**os.environ, "PROFILING_TARGET_DB": str(directory / "shop.sqlite3")}
    server = HttpProcess(command(port), directory / "server.log", port, "/health", env=env)
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            yield client
    finally:
        server.stop(grace=10)


@pytest.fixture(scope="module")
def wsgi(tmp_path_factory) -> Iterator[httpx.Client]:
    yield from serve(gunicorn, tmp_path_factory.mktemp("wsgi"))


@pytest.fixture(scope="module")
def asgi(tmp_path_factory) -> Iterator[httpx.Client]:
    yield from serve(uvicorn, tmp_path_factory.mktemp("asgi"))


@pytest.fixture(params=["wsgi", "asgi"])
def app(request) -> httpx.Client:
    """Each shared route is checked on both apps: they serve the same shop."""
    return request.getfixturevalue(request.param)


def share(cents: int, basis_points: int) -> int:
    return (cents * basis_points + 5_000) // 10_000


def test_health(app: httpx.Client) -> None:
    response = app.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_product_page_prices_and_recommends(app: httpx.Client) -> None:
    page = app.get(f"/products/{GARDEN_ITEM}").json()
    product = page["product"]
    assert product["id"] == GARDEN_ITEM and product["category"] == "garden"
    assert product["discount_bp"] == 1_500  # the garden sale
    expected = product["price_cents"] - share(product["price_cents"], 1_500)
    assert product["sale_price_cents"] == expected
    recommended = page["recommendations"]
    assert 1 <= len(recommended) <= 4
    assert GARDEN_ITEM not in [entry["id"] for entry in recommended]
    assert all(entry["stock_status"] != "out_of_stock" for entry in recommended)


def test_unknown_things_are_404(app: httpx.Client) -> None:
    assert app.get("/products/999999").status_code == 404
    response = app.get("/orders/999999")
    assert response.status_code == 404
    assert response.json() == {"error": "no order 999999"}


def test_stored_order_adds_up(app: httpx.Client) -> None:
    order = app.get("/orders/42").json()
    assert order["id"] == 42 and order["customer"]["id"] == order["customer_id"]
    assert order["lines"] and all(line["name"] for line in order["lines"])
    for line in order["lines"]:
        assert line["subtotal_cents"] == line["unit_price_cents"] * line["quantity"]
        expected = line["subtotal_cents"] - line["discount_cents"] + line["tax_cents"]
        assert line["total_cents"] == expected
    lines_total = sum(line["total_cents"] for line in order["lines"])
    assert order["total_cents"] == lines_total + order["shipping_cents"]


def without_stock(order: dict) -> dict:
    """An order page minus what checkouts change (stock levels of the recommendations)."""
    ids = [entry["id"] for entry in order["recommendations"]]
    return {**order, "recommendations": ids}


def test_both_apps_serve_the_same_seeded_history(wsgi: httpx.Client, asgi: httpx.Client) -> None:
    served = [without_stock(client.get("/orders/42").json()) for client in (wsgi, asgi)]
    assert served[0] == served[1]


def stock(client: httpx.Client, product_id: int) -> int:
    return client.get(f"/products/{product_id}").json()["product"]["stock"]


def test_checkout_charges_what_it_quotes_and_takes_stock(app: httpx.Client) -> None:
    before = {pid: stock(app, pid) for pid in (BOOK, GARDEN_ITEM)}
    cart = {
        "customer_id": CUSTOMER,
        "items": [
            {"product_id": BOOK, "quantity": 2},
            {"product_id": GARDEN_ITEM, "quantity": 1},
            {"product_id": BOOK, "quantity": 1},
        ],
        "coupon": "WELCOME10",
    }
    response = app.post("/checkout", json=cart)
    assert response.status_code == 201, response.text
    receipt = response.json()
    lines = {line["product_id"]: line for line in receipt["lines"]}
    assert lines[BOOK]["quantity"] == 3  # repeated items merged into one line
    assert lines[BOOK]["discount_bp"] == 1_000  # the coupon
    assert lines[GARDEN_ITEM]["discount_bp"] == 1_500  # the sale beats the coupon; no stacking
    assert lines[BOOK]["tax_bp"] < lines[GARDEN_ITEM]["tax_bp"]  # books pay the reduced rate
    for line in lines.values():
        subtotal = line["unit_price_cents"] * line["quantity"]
        discount = share(subtotal, line["discount_bp"])
        tax = share(subtotal - discount, line["tax_bp"])
        assert (line["subtotal_cents"], line["discount_cents"], line["tax_cents"]) == (
            subtotal,
            discount,
            tax,
        )
        assert line["total_cents"] == subtotal - discount + tax
    net = receipt["subtotal_cents"] - receipt["discount_cents"]
    assert receipt["shipping_cents"] == (0 if net >= 5_000 else 499)
    assert receipt["total_cents"] == net + receipt["tax_cents"] + receipt["shipping_cents"]

    stored = app.get(f"/orders/{receipt['order_id']}").json()
    assert stored["status"] == "paid" and stored["customer_id"] == CUSTOMER
    assert stored["total_cents"] == receipt["total_cents"]
    assert {line["product_id"]: line["quantity"] for line in stored["lines"]} == {
        BOOK: 3,
        GARDEN_ITEM: 1,
    }
    assert stock(app, BOOK) == before[BOOK] - 3
    assert stock(app, GARDEN_ITEM) == before[GARDEN_ITEM] - 1


def test_checkout_refusals_take_nothing(app: httpx.Client) -> None:
    before = stock(app, BOOK)
    items = [{"product_id": BOOK, "quantity": 1}, {"product_id": SOLD_OUT, "quantity": 1}]
    response = app.post("/checkout", json={"customer_id": CUSTOMER, "items": items})
    assert response.status_code == 409
    assert str(SOLD_OUT) in response.json()["error"]
    assert stock(app, BOOK) == before
    book = [{"product_id": BOOK, "quantity": 1}]
    refusals = [
        ({"customer_id": CUSTOMER, "items": book, "coupon": "NOPE"}, 400),
        ({"customer_id": CUSTOMER, "items": book, "coupon": "BIG20"}, 400),  # subtotal too low
        ({"customer_id": CUSTOMER, "items": [{"product_id": BOOK, "quantity": 0}]}, 400),
        ({"customer_id": CUSTOMER, "items": []}, 400),
        ({"customer_id": 999_999, "items": book}, 404),
        ({"customer_id": CUSTOMER, "items": [{"product_id": 999_999, "quantity": 1}]}, 404),
    ]
    for body, status in refusals:
        assert app.post("/checkout", json=body).status_code == status, body
    garbage = app.post("/checkout", content=b"{not json", headers={"content-type": "text/plain"})
    assert garbage.status_code == 400
    assert stock(app, BOOK) == before


def test_report_aggregates_agree(app: httpx.Client) -> None:
    report = app.get("/report").json()
    assert report["orders"] == 50
    revenue = report["revenue_cents"]
    assert revenue > 0
    assert sum(row["cents"] for row in report["by_category"]) == revenue
    assert sum(row["cents"] for row in report["by_month"]) == revenue
    assert sum(row["cents"] for row in report["tax_by_region"]) == report["tax_cents"]
    assert report["average_order_cents"] == round(revenue / (50 - report["refunded"]))
    top = [row["cents"] for row in report["top_products"]]
    assert len(top) == 5 and top == sorted(top, reverse=True)
    assert app.get("/report", params={"orders": 200}).json()["orders"] == 200


def test_slow_takes_at_least_the_asked_time(app: httpx.Client) -> None:
    started = time.perf_counter()
    response = app.get("/slow", params={"ms": 120})
    assert time.perf_counter() - started >= 0.12
    assert response.json() == {"slept_ms": 120}
    assert app.get("/slow", params={"ms": "soon"}).status_code == 400


def test_wsgi_catalog_page_renders_products(wsgi: httpx.Client) -> None:
    response = wsgi.get("/products", params={"category": "garden"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    assert html.count('<li class="product"') == 20
    assert html.count("<del>") == 20  # every garden product is on sale
    product = wsgi.get(f"/products/{GARDEN_ITEM}").json()["product"]
    cents = product["sale_price_cents"]
    assert product["name"] in html
    assert f"{cents // 100}.{cents % 100:02d}" in html
    second = wsgi.get("/products", params={"page": 2}).text
    assert f"{PRODUCTS} products, page 2 of 5" in second
    assert second.count('<li class="product"') == 24


def test_asgi_catalog_and_stream(asgi: httpx.Client) -> None:
    page = asgi.get("/products", params={"sort": "price", "page": 5}).json()
    assert (page["total"], page["pages"], page["page"]) == (PRODUCTS, 5, 5)
    prices = [entry["price_cents"] for entry in page["products"]]
    assert len(prices) == 24 and prices == sorted(prices)
    with asgi.stream("GET", "/products/export") as response:
        assert response.headers["content-type"] == "application/x-ndjson"
        entries = [json.loads(line) for line in response.iter_lines() if line]
    assert sorted(entry["id"] for entry in entries) == list(range(1, PRODUCTS + 1))


def timed_get(client: httpx.Client, path: str, results: dict, key: str) -> None:
    started = time.perf_counter()
    client.get(path).raise_for_status()
    results[key] = time.perf_counter() - started


def test_asgi_block_holds_the_event_loop_and_slow_does_not(asgi: httpx.Client) -> None:
    """A /health sent while /block spins waits for it; one sent during /slow does not."""
    for route, health_waits in (("/block", True), ("/slow", False)):
        results: dict[str, float] = {}
        busy = threading.Thread(target=timed_get, args=(asgi, f"{route}?ms=600", results, "busy"))
        busy.start()
        time.sleep(0.15)
        timed_get(asgi, "/health", results, "health")
        busy.join(10)
        assert results["busy"] >= 0.6
        if health_waits:
            assert results["health"] >= 0.25, results
        else:
            assert results["health"] < results["busy"] - 0.15, results
