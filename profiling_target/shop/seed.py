"""Deterministic sample data: the same catalog, customers and order history on every machine."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta

from profiling_target.shop.inventory import LOW_STOCK
from profiling_target.shop.models import Customer, Product
from profiling_target.shop.money import Money
from profiling_target.shop.pricing import CartItem, Pricer
from profiling_target.shop.repository import Customers, Orders, Products
from profiling_target.shop.tax import REGIONS

SEED = 20261122
HISTORY_START = datetime(2026, 1, 1, tzinfo=UTC)
CUSTOMERS = 200
ORDERS = 1500

ADJECTIVES = ("Classic", "Compact", "Deluxe", "Everyday", "Handmade", "Modern", "Rustic", "Smart")
CATALOG = {
    "books": (("Cookbook", "Novel", "Atlas", "Field Guide", "Poetry Collection"), (800, 4500)),
    "electronics": (("Headphones", "Charger", "Speaker", "Keyboard", "Webcam"), (1500, 25000)),
    "garden": (("Trowel", "Planter", "Hose", "Seed Kit", "Lantern"), (600, 9000)),
    "grocery": (("Coffee", "Olive Oil", "Tea Tin", "Honey", "Pasta"), (300, 2500)),
    "kitchen": (("Skillet", "Knife", "Kettle", "Cutting Board", "Mixing Bowl"), (900, 12000)),
    "toys": (("Puzzle", "Kite", "Robot", "Board Game", "Plush Bear"), (500, 6000)),
}
FIRST_NAMES = ("Ada", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hugo", "Iris", "Jonas")
LAST_NAMES = ("Novak", "Okafor", "Park", "Quinn", "Rossi", "Silva", "Tanaka", "Ueda", "Vogel")
TIERS = (("bronze", 6), ("silver", 3), ("gold", 1))
STATUSES = (("delivered", 12), ("shipped", 4), ("paid", 3), ("refunded", 1))


def stock_level(rng: random.Random, index: int) -> int:
    """Mostly plenty (so benchmarks can check out for hours); a few sold out, a few nearly."""
    if index % 23 == 7:
        return 0
    if index % 17 == 3:
        return rng.randint(3, LOW_STOCK - 1)
    return rng.randint(20_000, 60_000)


def products(rng: random.Random) -> Iterator[Product]:
    index = 0
    for category, (nouns, (low, high)) in CATALOG.items():
        for noun in nouns:
            for adjective in rng.sample(ADJECTIVES, 4):
                index += 1
                yield Product(
                    id=index,
                    sku=f"{category[:3].upper()}-{index:04d}",
                    name=f"{adjective} {noun}",
                    category=category,
                    price=Money(rng.randrange(low, high, 5) - 1),
                    stock=stock_level(rng, index),
                    rating=round(rng.uniform(2.5, 5.0), 1),
                )


def weighted(rng: random.Random, choices: Sequence[tuple[str, int]]) -> str:
    values, weights = zip(*choices, strict=True)
    return rng.choices(values, weights)[0]


def customers(rng: random.Random) -> Iterator[Customer]:
    for index in range(1, CUSTOMERS + 1):
        first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
        yield Customer(
            id=index,
            name=f"{first} {last}",
            email=f"{first}.{last}.{index}@example.com".lower(),
            region=rng.choice(REGIONS),
            tier=weighted(rng, TIERS),
        )


def carts(rng: random.Random, catalog: Sequence[Product]) -> Iterator[list[CartItem]]:
    """Carts of 1-4 products, leaning towards the cheaper end of each category."""
    popular = sorted(catalog, key=lambda product: product.price)
    weights = [len(popular) - rank for rank in range(len(popular))]
    for _ in range(ORDERS):
        picked = rng.choices(popular, weights, k=rng.randint(1, 4))
        distinct = {product.id: product for product in picked}
        yield [CartItem(product, rng.choice((1, 1, 1, 2, 3, 6))) for product in distinct.values()]


def populate(conn: sqlite3.Connection) -> None:
    """Fills an empty database; orders are priced by the same Pricer checkout uses."""
    rng = random.Random(SEED)
    Products(conn).add_all(products(rng))
    Customers(conn).add_all(customers(rng))
    catalog = Products(conn).all()
    buyers = Customers(conn).all()
    pricer = Pricer.standard()
    orders = Orders(conn)
    created_at = HISTORY_START
    for items in carts(rng, catalog):
        created_at += timedelta(minutes=rng.randint(20, 400))
        customer = rng.choice(buyers)
        coupon = rng.choice((None, None, None, "WELCOME10"))
        quote = pricer.quote_cart(items, customer, coupon)
        orders.add(customer.id, created_at, weighted(rng, STATUSES), quote)
