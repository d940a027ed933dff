"""Bought-together recommendations from recent baskets that share a product."""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping

from profiling_target.shop.inventory import is_available
from profiling_target.shop.models import Product
from profiling_target.shop.repository import Orders, Products

SAME_CATEGORY_BONUS = 0.5


def co_purchases(baskets: Mapping[int, list[int]], seeds: Collection[int]) -> Iterator[int]:
    """Every product bought in a basket with one of `seeds`, once per basket."""
    for products in baskets.values():
        for product_id in set(products):
            if product_id not in seeds:
                yield product_id


def score(
    counts: Counter[int], candidates: Mapping[int, Product], seed_categories: set[str]
) -> Callable[[int], float]:
    """Co-purchase count, nudged towards the categories the shopper is already looking at."""

    def weight(product_id: int) -> float:
        bonus = SAME_CATEGORY_BONUS if candidates[product_id].category in seed_categories else 0
        return counts[product_id] + bonus

    return weight


class Recommender:
    def __init__(self, orders: Orders, products: Products, baskets: int = 150) -> None:
        self.orders = orders
        self.products = products
        self.baskets = baskets

    def for_products(self, product_ids: Iterable[int], limit: int = 4) -> list[Product]:
        seeds = set(product_ids)
        counts = Counter(co_purchases(self.orders.baskets_containing(seeds, self.baskets), seeds))
        candidates = self.products.get_many([*counts, *seeds])
        available = [pid for pid in counts if is_available(candidates[pid])]
        seed_categories = {candidates[pid].category for pid in seeds if pid in candidates}
        weight = score(counts, candidates, seed_categories)
        best = heapq.nlargest(limit, sorted(available), key=weight)
        return [candidates[pid] for pid in best]
