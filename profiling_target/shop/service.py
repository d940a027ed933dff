"""The shop's use cases; each method is one unit of work in its own transaction."""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, datetime

from profiling_target.shop import inventory
from profiling_target.shop.checkout import CheckoutRequest
from profiling_target.shop.database import Database, default_path
from profiling_target.shop.errors import NotFound
from profiling_target.shop.models import Customer, Order, Product
from profiling_target.shop.pages import CatalogEntry, CatalogPage, OrderDetail, ProductPage, Receipt
from profiling_target.shop.pricing import CartItem, Pricer
from profiling_target.shop.recommendations import Recommender
from profiling_target.shop.reports import SalesReport, build_report
from profiling_target.shop.repository import Customers, Orders, Products
from profiling_target.shop.seed import populate

PAGE_SIZE = 24
REPORT_ORDERS = 50


class Shop:
    def __init__(self, database: Database, pricer: Pricer) -> None:
        self.database = database
        self.pricer = pricer

    @classmethod
    def from_env(cls) -> Shop:
        return cls(Database(default_path(), populate), Pricer.standard())

    def entry(self, product: Product) -> CatalogEntry:
        quote = self.pricer.quote_item(CartItem(product, 1), customer=None)
        return CatalogEntry(product, quote, inventory.stock_status(product))

    def catalog(
        self, category: str | None = None, sort: str = "name", page: int = 1
    ) -> CatalogPage:
        with self.database.transaction() as conn:
            products = Products(conn)
            categories = products.categories()
            if category is not None and category not in categories:
                raise NotFound(f"no category {category!r}")
            total = products.count(category)
            found = products.page(category, sort, PAGE_SIZE, (page - 1) * PAGE_SIZE)
        pages = max(1, math.ceil(total / PAGE_SIZE))
        if page > pages:
            raise NotFound(f"no page {page} (there are {pages})")
        entries = [self.entry(product) for product in found]
        return CatalogPage(category, sort, page, pages, total, categories, entries)

    def product(self, product_id: int) -> CatalogEntry:
        with self.database.transaction() as conn:
            product = Products(conn).get(product_id)
        return self.entry(product)

    def recommendations(self, product_ids: Iterable[int], limit: int = 4) -> list[CatalogEntry]:
        with self.database.transaction() as conn:
            found = Recommender(Orders(conn), Products(conn)).for_products(product_ids, limit)
        return [self.entry(product) for product in found]

    def product_page(self, product_id: int) -> ProductPage:
        return ProductPage(self.product(product_id), self.recommendations([product_id]))

    def order(self, order_id: int) -> OrderDetail:
        with self.database.transaction() as conn:
            order = Orders(conn).get(order_id)
            customer = Customers(conn).get(order.customer_id)
            products = Products(conn).get_many(line.product_id for line in order.lines)
        recommended = self.recommendations(products)
        return OrderDetail(order, customer, products, recommended)

    def checkout(self, request: CheckoutRequest) -> Receipt:
        """Validates, prices and reserves in one write transaction: all of it happens or none."""
        with self.database.transaction(write=True) as conn:
            customer = Customers(conn).get(request.customer_id)
            products = Products(conn)
            items = request.cart(products.get_many(request.quantities))
            inventory.ensure_available(items)
            quote = self.pricer.quote_cart(items, customer, request.coupon)
            inventory.reserve(products, items)
            order_id = Orders(conn).add(customer.id, datetime.now(UTC), "paid", quote)
        return Receipt(order_id, customer, quote)

    def recent_orders(self, limit: int = REPORT_ORDERS) -> list[Order]:
        with self.database.transaction() as conn:
            return Orders(conn).recent(limit)

    def product_index(self) -> dict[int, Product]:
        with self.database.transaction() as conn:
            return {product.id: product for product in Products(conn).all()}

    def customer_index(self) -> dict[int, Customer]:
        with self.database.transaction() as conn:
            return {customer.id: customer for customer in Customers(conn).all()}

    def report(self, limit: int = REPORT_ORDERS) -> SalesReport:
        return build_report(self.recent_orders(limit), self.product_index(), self.customer_index())
