"""What the shop answers with: read models both web layers render as JSON or HTML."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from profiling_target.shop.models import Customer, Order, Product
from profiling_target.shop.money import Money
from profiling_target.shop.pricing import CartQuote, LineQuote


@dataclass(frozen=True)
class CatalogEntry:
    """A product as a visitor sees it: today's price for one, and whether it can be bought."""

    product: Product
    quote: LineQuote
    stock_status: str

    @property
    def on_sale(self) -> bool:
        return self.quote.discount_bp > 0

    @property
    def sale_price(self) -> Money:
        return self.quote.net

    def to_json(self) -> dict:
        return {
            **self.product.to_json(),
            "sale_price_cents": self.sale_price.cents,
            "discount_bp": self.quote.discount_bp,
            "stock_status": self.stock_status,
        }


@dataclass(frozen=True)
class CatalogPage:
    category: str | None
    sort: str
    number: int
    pages: int
    total: int
    categories: list[str]
    entries: list[CatalogEntry]

    @property
    def previous(self) -> int | None:
        return self.number - 1 if self.number > 1 else None

    @property
    def next(self) -> int | None:
        return self.number + 1 if self.number < self.pages else None

    def to_json(self) -> dict:
        return {
            "category": self.category,
            "sort": self.sort,
            "page": self.number,
            "pages": self.pages,
            "total": self.total,
            "categories": self.categories,
            "products": [entry.to_json() for entry in self.entries],
        }


@dataclass(frozen=True)
class ProductPage:
    entry: CatalogEntry
    recommendations: list[CatalogEntry]

    def to_json(self) -> dict:
        return {
            "product": self.entry.to_json(),
            "recommendations": [entry.to_json() for entry in self.recommendations],
        }


@dataclass(frozen=True)
class OrderDetail:
    order: Order
    customer: Customer
    products: Mapping[int, Product]
    recommendations: list[CatalogEntry]

    def to_json(self) -> dict:
        document = self.order.to_json()
        for line in document["lines"]:
            line["name"] = self.products[line["product_id"]].name
        return {
            **document,
            "customer": self.customer.to_json(),
            "recommendations": [entry.to_json() for entry in self.recommendations],
        }


@dataclass(frozen=True)
class Receipt:
    order_id: int
    customer: Customer
    quote: CartQuote

    def to_json(self) -> dict:
        return {
            "order_id": self.order_id,
            "customer": self.customer.to_json(),
            **self.quote.to_json(),
        }
