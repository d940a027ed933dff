"""SQL lives here and only here: one repository per table group, over one connection."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from datetime import datetime

from profiling_target.shop.errors import InvalidRequest, NotFound
from profiling_target.shop.models import Customer, Order, OrderLine, Product
from profiling_target.shop.pricing import CartQuote

PRODUCT_ORDERINGS = {
    "name": "name, id",
    "price": "price_cents, id",
    "rating": "rating DESC, id",
}


def placeholders(count: int) -> str:
    return ", ".join("?" * count)


class Products:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def get(self, product_id: int) -> Product:
        row = self.conn.execute("SELECT * FROM products WHERE id = ?", (product_id,)).fetchone()
        if row is None:
            raise NotFound(f"no product {product_id}")
        return Product.from_row(row)

    def get_many(self, product_ids: Iterable[int]) -> dict[int, Product]:
        ids = list(product_ids)
        rows = self.conn.execute(
            f"SELECT * FROM products WHERE id IN ({placeholders(len(ids))})", ids
        )
        return {product.id: product for product in map(Product.from_row, rows)}

    def all(self) -> list[Product]:
        return [Product.from_row(row) for row in self.conn.execute("SELECT * FROM products")]

    def page(self, category: str | None, sort: str, limit: int, offset: int) -> list[Product]:
        ordering = PRODUCT_ORDERINGS.get(sort)
        if ordering is None:
            raise InvalidRequest(f"sort must be one of {sorted(PRODUCT_ORDERINGS)}")
        rows = self.conn.execute(
            f"SELECT * FROM products WHERE ?1 IS NULL OR category = ?1 "
            f"ORDER BY {ordering} LIMIT ?2 OFFSET ?3",
            (category, limit, offset),
        )
        return [Product.from_row(row) for row in rows]

    def count(self, category: str | None) -> int:
        sql = "SELECT count(*) FROM products WHERE ?1 IS NULL OR category = ?1"
        return self.conn.execute(sql, (category,)).fetchone()[0]

    def categories(self) -> list[str]:
        rows = self.conn.execute("SELECT DISTINCT category FROM products ORDER BY category")
        return [row[0] for row in rows]

    def take_stock(self, product_id: int, quantity: int) -> bool:
        """Takes `quantity` off the shelf only if that many are there; says whether it did."""
        cursor = self.conn.execute(
            "UPDATE products SET stock = stock - ? WHERE id = ? AND stock >= ?",
            (quantity, product_id, quantity),
        )
        return cursor.rowcount == 1

    def add_all(self, products: Iterable[Product]) -> None:
        self.conn.executemany(
            "INSERT INTO products (id, sku, name, category, price_cents, stock, rating) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            ((p.id, p.sku, p.name, p.category, p.price.cents, p.stock, p.rating) for p in products),
        )


class Customers:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def get(self, customer_id: int) -> Customer:
        row = self.conn.execute("SELECT * FROM customers WHERE id = ?", (customer_id,)).fetchone()
        if row is None:
            raise NotFound(f"no customer {customer_id}")
        return Customer.from_row(row)

    def all(self) -> list[Customer]:
        return [Customer.from_row(row) for row in self.conn.execute("SELECT * FROM customers")]

    def add_all(self, customers: Iterable[Customer]) -> None:
        self.conn.executemany(
            "INSERT INTO customers (id, name, email, region, tier) VALUES (?, ?, ?, ?, ?)",
            ((c.id, c.name, c.email, c.region, c.tier) for c in customers),
        )


class Orders:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def get(self, order_id: int) -> Order:
        row = self.conn.execute("SELECT * FROM orders WHERE id = ?", (order_id,)).fetchone()
        if row is None:
            raise NotFound(f"no order {order_id}")
        lines = self.conn.execute(
            "SELECT * FROM order_lines WHERE order_id = ? ORDER BY product_id", (order_id,)
        )
        return Order.from_row(row, tuple(map(OrderLine.from_row, lines)))

    def recent(self, limit: int) -> list[Order]:
        """The latest `limit` orders, newest first, with their lines (two queries in all)."""
        rows = self.conn.execute("SELECT * FROM orders ORDER BY id DESC LIMIT ?", (limit,))
        orders = list(rows)
        lines = self.conn.execute(
            "SELECT * FROM order_lines WHERE order_id >= ? ORDER BY order_id, product_id",
            (orders[-1]["id"] if orders else 0,),
        )
        by_order = dict(group_lines(lines))
        return [Order.from_row(row, by_order.get(row["id"], ())) for row in orders]

    def baskets_containing(self, product_ids: Iterable[int], limit: int) -> dict[int, list[int]]:
        """Product ids of the latest `limit` orders that bought any of `product_ids`."""
        ids = list(product_ids)
        rows = self.conn.execute(
            "SELECT order_id, product_id FROM order_lines WHERE order_id IN ("
            "  SELECT DISTINCT order_id FROM order_lines"
            f"  WHERE product_id IN ({placeholders(len(ids))}) ORDER BY order_id DESC LIMIT ?)",
            (*ids, limit),
        )
        baskets: dict[int, list[int]] = {}
        for order_id, product_id in rows:
            baskets.setdefault(order_id, []).append(product_id)
        return baskets

    def add(self, customer_id: int, created_at: datetime, status: str, quote: CartQuote) -> int:
        cursor = self.conn.execute(
            "INSERT INTO orders (customer_id, created_at, status, shipping_cents)"
            " VALUES (?, ?, ?, ?)",
            (customer_id, created_at.isoformat(), status, quote.shipping.cents),
        )
        order_id = cursor.lastrowid
        self.conn.executemany(
            "INSERT INTO order_lines (order_id, product_id, quantity, unit_price_cents,"
            " discount_cents, tax_cents) VALUES (?, ?, ?, ?, ?, ?)",
            (
                (order_id, line.item.product.id, line.item.quantity,
                 line.item.product.price.cents, line.discount.cents, line.tax.cents)
                for line in quote.lines
            ),
        )  # fmt: skip
        return order_id


def group_lines(rows: Iterable[sqlite3.Row]) -> Iterator[tuple[int, tuple[OrderLine, ...]]]:
    """(order id, its lines) from rows sorted by order id."""
    current: int | None = None
    lines: list[OrderLine] = []
    for row in rows:
        if row["order_id"] != current:
            if current is not None:
                yield current, tuple(lines)
            current, lines = row["order_id"], []
        lines.append(OrderLine.from_row(row))
    if current is not None:
        yield current, tuple(lines)
