"""The shop as a Flask app: `gunicorn profiling_target.wsgi:app`.

The catalog is an HTML page rendered with Jinja2; everything else answers JSON.
"""

from __future__ import annotations

from flask import Blueprint, Flask, current_app, render_template, request

from profiling_target import delays, params
from profiling_target.shop.checkout import CheckoutRequest
from profiling_target.shop.errors import ShopError
from profiling_target.shop.service import REPORT_ORDERS, Shop

routes = Blueprint("shop", __name__)


def current_shop() -> Shop:
    return current_app.extensions["shop"]


@routes.get("/health")
def health() -> dict:
    return {"status": "ok"}


@routes.get("/products")
def products() -> str:
    page = current_shop().catalog(
        category=request.args.get("category"),
        sort=request.args.get("sort", "name"),
        page=params.page_number(request.args.get("page")),
    )
    return render_template("products.html", page=page)


@routes.get("/products/<int:product_id>")
def product(product_id: int) -> dict:
    return current_shop().product_page(product_id).to_json()


@routes.get("/orders/<int:order_id>")
def order(order_id: int) -> dict:
    return current_shop().order(order_id).to_json()


@routes.post("/checkout")
def checkout() -> tuple[dict, int]:
    payload = request.get_json(silent=True)
    receipt = current_shop().checkout(CheckoutRequest.from_json(payload))
    return receipt.to_json(), 201


@routes.get("/report")
def report() -> dict:
    orders = params.report_orders(request.args.get("orders"), REPORT_ORDERS)
    return current_shop().report(orders).to_json()


@routes.get("/slow")
def slow() -> dict:
    ms = params.delay_ms(request.args.get("ms"))
    delays.call_slow_upstream(ms)
    return {"slept_ms": ms}


def refuse(error: ShopError) -> tuple[dict, int]:
    return {"error": str(error)}, error.status


def create_app(shop: Shop | None = None) -> Flask:
    """Builds the app and its database now, so no visitor's request pays for the first build."""
    app = Flask(__name__)
    app.extensions["shop"] = shop or Shop.from_env()
    app.extensions["shop"].database.ensure()
    app.register_blueprint(routes)
    app.register_error_handler(ShopError, refuse)
    return app


app = create_app()
