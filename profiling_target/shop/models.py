"""The shop's records as immutable values, built from database rows."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime

from profiling_target.shop.money import Money


@dataclass(frozen=True, slots=True)
class Product:
    id: int
    sku: str
    name: str
    category: str
    price: Money
    stock: int
    rating: float

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Product:
        return cls(
            id=row["id"],
            sku=row["sku"],
            name=row["name"],
            category=row["category"],
            price=Money(row["price_cents"]),
            stock=row["stock"],
            rating=row["rating"],
        )

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "sku": self.sku,
            "name": self.name,
            "category": self.category,
            "price_cents": self.price.cents,
            "stock": self.stock,
            "rating": self.rating,
        }


@dataclass(frozen=True, slots=True)
class Customer:
    id: int
    name: str
    email: str
    region: str
    tier: str

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Customer:
        return cls(row["id"], row["name"], row["email"], row["region"], row["tier"])

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "name": self.name,
            "email": self.email,
            "region": self.region,
            "tier": self.tier,
        }


@dataclass(frozen=True, slots=True)
class OrderLine:
    """A line as it was charged: prices are kept, so later price changes do not rewrite history."""

    product_id: int
    quantity: int
    unit_price: Money
    discount: Money
    tax: Money

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> OrderLine:
        return cls(
            product_id=row["product_id"],
            quantity=row["quantity"],
            unit_price=Money(row["unit_price_cents"]),
            discount=Money(row["discount_cents"]),
            tax=Money(row["tax_cents"]),
        )

    @property
    def subtotal(self) -> Money:
        return self.unit_price.times(self.quantity)

    @property
    def net(self) -> Money:
        return self.subtotal - self.discount

    @property
    def total(self) -> Money:
        return self.net + self.tax

    def to_json(self) -> dict:
        return {
            "product_id": self.product_id,
            "quantity": self.quantity,
            "unit_price_cents": self.unit_price.cents,
            "subtotal_cents": self.subtotal.cents,
            "discount_cents": self.discount.cents,
            "tax_cents": self.tax.cents,
            "total_cents": self.total.cents,
        }


class PricedLines:
    """Sums shared by a priced cart and a stored order: both are lines plus shipping."""

    __slots__ = ()
    lines: tuple
    shipping: Money

    @property
    def subtotal(self) -> Money:
        return Money.total(line.subtotal for line in self.lines)

    @property
    def discount(self) -> Money:
        return Money.total(line.discount for line in self.lines)

    @property
    def net(self) -> Money:
        return self.subtotal - self.discount

    @property
    def tax(self) -> Money:
        return Money.total(line.tax for line in self.lines)

    @property
    def total(self) -> Money:
        return Money.total(line.total for line in self.lines) + self.shipping

    def totals_json(self) -> dict:
        return {
            "subtotal_cents": self.subtotal.cents,
            "discount_cents": self.discount.cents,
            "tax_cents": self.tax.cents,
            "shipping_cents": self.shipping.cents,
            "total_cents": self.total.cents,
        }


@dataclass(frozen=True, slots=True)
class Order(PricedLines):
    id: int
    customer_id: int
    created_at: datetime
    status: str
    shipping: Money
    lines: tuple[OrderLine, ...]

    @classmethod
    def from_row(cls, row: sqlite3.Row, lines: tuple[OrderLine, ...]) -> Order:
        return cls(
            id=row["id"],
            customer_id=row["customer_id"],
            created_at=datetime.fromisoformat(row["created_at"]),
            status=row["status"],
            shipping=Money(row["shipping_cents"]),
            lines=lines,
        )

    @property
    def counts_as_revenue(self) -> bool:
        return self.status != "refunded"

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "customer_id": self.customer_id,
            "created_at": self.created_at.isoformat(),
            "status": self.status,
            "lines": [line.to_json() for line in self.lines],
            **self.totals_json(),
        }
