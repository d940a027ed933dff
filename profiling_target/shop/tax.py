"""Sales tax by region, with reduced rates for essentials."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from profiling_target.shop.money import Money

REGIONS = ("north", "south", "east", "west")
REDUCED_CATEGORIES = frozenset({"books", "grocery"})


@dataclass(frozen=True)
class TaxTable:
    """Rates in basis points; an unknown region (or none: a visitor) pays the fallback rate."""

    standard: Mapping[str, int]
    reduced: Mapping[str, int]
    fallback: int = 800
    reduced_categories: frozenset[str] = field(default=REDUCED_CATEGORIES)

    @classmethod
    def default(cls) -> TaxTable:
        return cls(
            standard={"north": 800, "south": 650, "east": 725, "west": 900},
            reduced={"north": 200, "south": 0, "east": 300, "west": 250},
        )

    def rate_for(self, region: str | None, category: str) -> int:
        rates = self.reduced if self.is_reduced(category) else self.standard
        return rates.get(region, self.fallback)

    def is_reduced(self, category: str) -> bool:
        return category in self.reduced_categories

    def tax_on(self, amount: Money, region: str | None, category: str) -> Money:
        return amount.share(self.rate_for(region, category))
