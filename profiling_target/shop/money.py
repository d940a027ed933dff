"""Money as integer cents, so totals add up exactly and rounding happens in one place."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

BASIS_POINTS = 10_000


@dataclass(frozen=True, slots=True, order=True)
class Money:
    cents: int

    @classmethod
    def zero(cls) -> Money:
        return cls(0)

    @staticmethod
    def total(amounts: Iterable[Money]) -> Money:
        cents = 0
        for amount in amounts:
            cents += amount.cents
        return Money(cents)

    def __add__(self, other: Money) -> Money:
        return Money(self.cents + other.cents)

    def __sub__(self, other: Money) -> Money:
        return Money(self.cents - other.cents)

    def times(self, quantity: int) -> Money:
        return Money(self.cents * quantity)

    def share(self, basis_points: int) -> Money:
        """`basis_points`/10,000 of this amount, rounded half up to the cent."""
        return Money((self.cents * basis_points + BASIS_POINTS // 2) // BASIS_POINTS)

    def __str__(self) -> str:
        return f"${self.cents // 100:,}.{self.cents % 100:02d}"
