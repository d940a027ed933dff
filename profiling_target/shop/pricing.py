"""Prices a cart: the best single discount per line (they do not stack), tax, shipping."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from profiling_target.shop.errors import InvalidRequest
from profiling_target.shop.models import Customer, PricedLines, Product
from profiling_target.shop.money import Money
from profiling_target.shop.tax import TaxTable


@dataclass(frozen=True, slots=True)
class CartItem:
    product: Product
    quantity: int

    @property
    def subtotal(self) -> Money:
        return self.product.price.times(self.quantity)


# A discount rule answers how many basis points off a line gets (0: not eligible).
DiscountRule = Callable[[CartItem, Customer | None], int]


def category_sale(category: str, basis_points: int) -> DiscountRule:
    def rule(item: CartItem, customer: Customer | None) -> int:
        return basis_points if item.product.category == category else 0

    return rule


def bulk_buy(min_quantity: int, basis_points: int) -> DiscountRule:
    def rule(item: CartItem, customer: Customer | None) -> int:
        return basis_points if item.quantity >= min_quantity else 0

    return rule


def loyalty(by_tier: Mapping[str, int]) -> DiscountRule:
    def rule(item: CartItem, customer: Customer | None) -> int:
        return by_tier.get(customer.tier, 0) if customer else 0

    return rule


@dataclass(frozen=True, slots=True)
class Coupon:
    code: str
    basis_points: int
    min_subtotal: Money

    def accepts(self, subtotal: Money) -> bool:
        return subtotal >= self.min_subtotal


@dataclass(frozen=True, slots=True)
class LineQuote:
    item: CartItem
    discount_bp: int
    tax_bp: int

    @property
    def subtotal(self) -> Money:
        return self.item.subtotal

    @property
    def discount(self) -> Money:
        return self.subtotal.share(self.discount_bp)

    @property
    def net(self) -> Money:
        return self.subtotal - self.discount

    @property
    def tax(self) -> Money:
        return self.net.share(self.tax_bp)

    @property
    def total(self) -> Money:
        return self.net + self.tax

    def to_json(self) -> dict:
        return {
            "product_id": self.item.product.id,
            "name": self.item.product.name,
            "quantity": self.item.quantity,
            "unit_price_cents": self.item.product.price.cents,
            "subtotal_cents": self.subtotal.cents,
            "discount_bp": self.discount_bp,
            "discount_cents": self.discount.cents,
            "tax_bp": self.tax_bp,
            "tax_cents": self.tax.cents,
            "total_cents": self.total.cents,
        }


@dataclass(frozen=True, slots=True)
class CartQuote(PricedLines):
    lines: tuple[LineQuote, ...]
    shipping: Money
    coupon: str | None

    def to_json(self) -> dict:
        return {
            "lines": [line.to_json() for line in self.lines],
            "coupon": self.coupon,
            **self.totals_json(),
        }


@dataclass(frozen=True)
class ShippingPolicy:
    flat: Money
    free_from: Money

    def cost(self, net: Money) -> Money:
        return Money.zero() if net >= self.free_from else self.flat


class Pricer:
    """The pricing rules in one place, so the catalog shows what checkout charges."""

    def __init__(
        self,
        rules: Sequence[DiscountRule],
        coupons: Mapping[str, Coupon],
        taxes: TaxTable,
        shipping: ShippingPolicy,
    ) -> None:
        self.rules = tuple(rules)
        self.coupons = dict(coupons)
        self.taxes = taxes
        self.shipping = shipping

    @classmethod
    def standard(cls) -> Pricer:
        return cls(
            rules=[
                category_sale("garden", 1500),
                category_sale("toys", 1000),
                bulk_buy(5, 500),
                loyalty({"silver": 300, "gold": 800}),
            ],
            coupons={
                "WELCOME10": Coupon("WELCOME10", 1000, Money.zero()),
                "BIG20": Coupon("BIG20", 2000, Money(20_000)),
            },
            taxes=TaxTable.default(),
            shipping=ShippingPolicy(flat=Money(499), free_from=Money(5_000)),
        )

    def quote_item(
        self, item: CartItem, customer: Customer | None, coupon: Coupon | None = None
    ) -> LineQuote:
        region = customer.region if customer else None
        return LineQuote(
            item=item,
            discount_bp=self.best_discount(item, customer, coupon),
            tax_bp=self.taxes.rate_for(region, item.product.category),
        )

    def best_discount(
        self, item: CartItem, customer: Customer | None, coupon: Coupon | None
    ) -> int:
        best = coupon.basis_points if coupon else 0
        for rule in self.rules:
            best = max(best, rule(item, customer))
        return best

    def quote_cart(
        self, items: Sequence[CartItem], customer: Customer, coupon_code: str | None = None
    ) -> CartQuote:
        coupon = self.coupon_for(coupon_code, Money.total(item.subtotal for item in items))
        lines = tuple(self.quote_item(item, customer, coupon) for item in items)
        net = Money.total(line.net for line in lines)
        return CartQuote(lines=lines, shipping=self.shipping.cost(net), coupon=coupon_code)

    def coupon_for(self, code: str | None, subtotal: Money) -> Coupon | None:
        if code is None:
            return None
        coupon = self.coupons.get(code)
        if coupon is None:
            raise InvalidRequest(f"unknown coupon {code!r}")
        if not coupon.accepts(subtotal):
            raise InvalidRequest(
                f"coupon {code!r} needs a subtotal of at least {coupon.min_subtotal}"
            )
        return coupon
