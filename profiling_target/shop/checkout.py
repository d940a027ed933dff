"""A checkout request as the client sent it, validated before it touches the database."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from profiling_target.shop.errors import InvalidRequest, NotFound
from profiling_target.shop.models import Product
from profiling_target.shop.pricing import CartItem

MAX_LINES = 50
MAX_QUANTITY = 100
MAX_ID = 2**63 - 1  # SQLite's largest integer key


def positive_int(value: object, what: str, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= maximum:
        raise InvalidRequest(f"{what} must be an integer from 1 to {maximum}")
    return value


@dataclass(frozen=True)
class CheckoutRequest:
    customer_id: int
    quantities: dict[int, int]
    coupon: str | None

    @classmethod
    def from_json(cls, payload: object) -> CheckoutRequest:
        """Reads `{"customer_id", "items": [{"product_id", "quantity"}], "coupon"?}`.

        Repeated products are merged into one line, as a cart would show them.
        """
        if not isinstance(payload, dict):
            raise InvalidRequest("body must be a JSON object")
        items = payload.get("items")
        if not isinstance(items, list) or not 0 < len(items) <= MAX_LINES:
            raise InvalidRequest(f"items must be a list of 1 to {MAX_LINES} entries")
        quantities: dict[int, int] = {}
        for item in items:
            product_id, quantity = cls.read_item(item)
            quantities[product_id] = quantities.get(product_id, 0) + quantity
        coupon = payload.get("coupon")
        if coupon is not None and not isinstance(coupon, str):
            raise InvalidRequest("coupon must be a string")
        customer_id = positive_int(payload.get("customer_id"), "customer_id", MAX_ID)
        return cls(customer_id, quantities, coupon)

    @staticmethod
    def read_item(item: object) -> tuple[int, int]:
        if not isinstance(item, dict):
            raise InvalidRequest("each item must be an object")
        return (
            positive_int(item.get("product_id"), "product_id", MAX_ID),
            positive_int(item.get("quantity"), "quantity", MAX_QUANTITY),
        )

    def cart(self, catalog: Mapping[int, Product]) -> list[CartItem]:
        missing = sorted(set(self.quantities) - set(catalog))
        if missing:
            raise NotFound(f"no products {missing}")
        return [CartItem(catalog[pid], quantity) for pid, quantity in self.quantities.items()]
