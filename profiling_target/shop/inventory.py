"""Stock levels: what the catalog shows and what checkout may take."""

from __future__ import annotations

from collections.abc import Sequence

from profiling_target.shop.errors import OutOfStock
from profiling_target.shop.models import Product
from profiling_target.shop.pricing import CartItem
from profiling_target.shop.repository import Products

LOW_STOCK = 10


def stock_status(product: Product) -> str:
    if product.stock == 0:
        return "out_of_stock"
    if product.stock < LOW_STOCK:
        return "low_stock"
    return "in_stock"


def is_available(product: Product) -> bool:
    return product.stock > 0


def ensure_available(items: Sequence[CartItem]) -> None:
    """Refuses the whole cart, naming every short product, before anything is priced or taken."""
    short = [item.product.id for item in items if item.product.stock < item.quantity]
    if short:
        raise OutOfStock(short)


def reserve(products: Products, items: Sequence[CartItem]) -> None:
    """Takes the stock; the caller's transaction rolls back everything if one line loses a race."""
    for item in items:
        if not products.take_stock(item.product.id, item.quantity):
            raise OutOfStock([item.product.id])
