"""A call-heavy script for the overhead benchmark: prices carts with the shop's own pricing
code (`profiling_target.shop`: small functions, properties, closures, dataclasses; about
460 calls per cart as cProfile counts them), in memory, no I/O.

`python benchmarks/call_heavy.py CARTS`: imports, prints `ready`, waits for a line on
stdin (so a profiler attached from outside sees all the work), prices CARTS carts, prints
the total and the CPU seconds the pricing took (all threads: a profiler's own count).
"""

from __future__ import annotations

import sys
import time

from profiling_target.shop.models import Customer, Product
from profiling_target.shop.money import Money
from profiling_target.shop.pricing import CartItem, Pricer

CATEGORIES = ("garden", "toys", "kitchen", "books", "tools")
TIERS = ("bronze", "silver", "gold")
REGIONS = ("EU", "US", "UK")


def catalog() -> list[Product]:
    return [
        Product(i, f"SKU-{i}", f"Product {i}", CATEGORIES[i % 5], Money(199 + 37 * i), 100, 4.0)
        for i in range(50)
    ]


def customers() -> list[Customer]:
    return [
        Customer(i, f"Customer {i}", f"c{i}@example.com", REGIONS[i % 3], TIERS[i % 3])
        for i in range(9)
    ]


def price_carts(count: int) -> int:
    """Quotes `count` carts of 1-6 lines; returns the total charged, so nothing is skipped."""
    pricer = Pricer.standard()
    products = catalog()
    people = customers()
    charged = 0
    for n in range(count):
        items = [
            CartItem(products[(n * 7 + k * 13) % len(products)], 1 + (n + k) % 6)
            for k in range(1 + n % 6)
        ]
        quote = pricer.quote_cart(items, people[n % len(people)], "WELCOME10" if n % 4 else None)
        charged += quote.to_json()["total_cents"]
    return charged


def main() -> None:
    carts = int(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()
    started = time.process_time()
    charged = price_carts(carts)
    print(charged, time.process_time() - started, flush=True)


if __name__ == "__main__":
    main()
