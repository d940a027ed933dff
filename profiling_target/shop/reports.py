"""The sales report: revenue, tax and rankings over the latest orders."""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from profiling_target.shop.models import Customer, Order, OrderLine, Product
from profiling_target.shop.money import Money

K = TypeVar("K", bound=Hashable)


def sum_by(pairs: Iterable[tuple[K, Money]]) -> dict[K, Money]:
    totals: dict[K, Money] = {}
    for key, amount in pairs:
        totals[key] = totals.get(key, Money.zero()) + amount
    return totals


def top(totals: Mapping[K, Money], count: int) -> list[tuple[K, Money]]:
    """The `count` largest totals, ties broken by key so the report is stable."""
    return heapq.nlargest(count, sorted(totals.items()), key=lambda pair: pair[1])


def sold_lines(orders: Iterable[Order]) -> Iterator[OrderLine]:
    """Lines that count as revenue (refunded orders do not)."""
    for order in orders:
        if order.counts_as_revenue:
            yield from order.lines


def money_rows(totals: Iterable[tuple[str, Money]]) -> list[dict]:
    return [{"key": key, "cents": amount.cents} for key, amount in totals]


@dataclass(frozen=True)
class SalesReport:
    orders: int
    refunded: int
    revenue: Money
    tax: Money
    by_category: dict[str, Money]
    by_month: dict[str, Money]
    tax_by_region: dict[str, Money]
    top_products: list[tuple[str, Money]]
    top_customers: list[tuple[str, Money]]

    @property
    def average_order(self) -> Money:
        sold = self.orders - self.refunded
        return Money(round(self.revenue.cents / sold)) if sold else Money.zero()

    def to_json(self) -> dict:
        return {
            "orders": self.orders,
            "refunded": self.refunded,
            "revenue_cents": self.revenue.cents,
            "tax_cents": self.tax.cents,
            "average_order_cents": self.average_order.cents,
            "by_category": money_rows(sorted(self.by_category.items())),
            "by_month": money_rows(sorted(self.by_month.items())),
            "tax_by_region": money_rows(sorted(self.tax_by_region.items())),
            "top_products": money_rows(self.top_products),
            "top_customers": money_rows(self.top_customers),
        }


def build_report(
    orders: Sequence[Order],
    products: Mapping[int, Product],
    customers: Mapping[int, Customer],
    ranked: int = 5,
) -> SalesReport:
    """Revenue is what was charged for goods (net of discounts, before tax and shipping)."""
    sold = [order for order in orders if order.counts_as_revenue]
    by_product = sum_by((products[line.product_id].name, line.net) for line in sold_lines(orders))
    by_customer = sum_by((customers[order.customer_id].name, order.total) for order in sold)
    return SalesReport(
        orders=len(orders),
        refunded=len(orders) - len(sold),
        revenue=Money.total(order.net for order in sold),
        tax=Money.total(order.tax for order in sold),
        by_category=sum_by(
            (products[line.product_id].category, line.net) for line in sold_lines(orders)
        ),
        by_month=sum_by((order.created_at.strftime("%Y-%m"), order.net) for order in sold),
        tax_by_region=sum_by((customers[order.customer_id].region, order.tax) for order in sold),
        top_products=top(by_product, ranked),
        top_customers=top(by_customer, ranked),
    )
