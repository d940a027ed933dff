"""What the shop refuses, each with the HTTP status the web layers answer with."""

from __future__ import annotations


class ShopError(Exception):
    status = 400


class InvalidRequest(ShopError):
    status = 400


class NotFound(ShopError):
    status = 404


class OutOfStock(ShopError):
    status = 409

    def __init__(self, product_ids: list[int]) -> None:
        super().__init__(f"not enough stock for products {product_ids}")
        self.product_ids = product_ids
