"""The shop for event-loop servers: SQLite blocks, so the work runs in threads, fanned out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from profiling_target.shop.pages import CatalogEntry, ProductPage
from profiling_target.shop.reports import SalesReport, build_report
from profiling_target.shop.service import REPORT_ORDERS, Shop


class AsyncShop:
    def __init__(self, shop: Shop) -> None:
        self.shop = shop

    async def product_page(self, product_id: int) -> ProductPage:
        """The product and its recommendations are independent queries: run them together."""
        entry, recommendations = await asyncio.gather(
            asyncio.to_thread(self.shop.product, product_id),
            asyncio.to_thread(self.shop.recommendations, [product_id]),
        )
        return ProductPage(entry, recommendations)

    async def report(self, limit: int = REPORT_ORDERS) -> SalesReport:
        async with asyncio.TaskGroup() as group:
            orders = group.create_task(asyncio.to_thread(self.shop.recent_orders, limit))
            products = group.create_task(asyncio.to_thread(self.shop.product_index))
            customers = group.create_task(asyncio.to_thread(self.shop.customer_index))
        return build_report(orders.result(), products.result(), customers.result())

    async def catalog_entries(self, sort: str = "name") -> AsyncIterator[CatalogEntry]:
        """The whole catalog, one page per query, so a long export never holds a transaction."""
        page = await asyncio.to_thread(self.shop.catalog, None, sort, 1)
        for number in range(1, page.pages + 1):
            if number > 1:
                page = await asyncio.to_thread(self.shop.catalog, None, sort, number)
            for entry in page.entries:
                yield entry
