"""Spark's decimal rounding, written once (``ops.decimals``): checked against exact rational
arithmetic here, and against Spark itself in ``test_evaluation`` and ``test_local``."""

from __future__ import annotations

import doctest
import random
from fractions import Fraction

import pytest

from ops import decimals
from ops.reduce import accumulable


def _half_up(q: Fraction) -> int:
    whole = abs(q.numerator) // q.denominator
    if 2 * (abs(q.numerator) - whole * q.denominator) >= q.denominator:
        whole += 1
    return whole if q >= 0 else -whole


def _digits(rng: random.Random, most: int) -> int:
    return rng.choice((-1, 1)) * rng.randrange(10 ** rng.randint(0, most))


@pytest.mark.parametrize("module", [decimals, accumulable])
def test_the_documented_examples_hold(module) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_products_and_quotients_round_once_from_the_exact_value() -> None:
    """A product that fits 38 digits is the exact product rounded once, half up, to the
    result's scale (the 39-digit truncation never changes it); a quotient is the exact quotient
    truncated to 39 places, then rounded half up."""
    rng = random.Random(45786)
    for _ in range(20_000):
        sx, sy = rng.randint(0, 38), rng.randint(0, 38)
        x, y = _digits(rng, 38), _digits(rng, 38)
        scale = rng.randint(0, 38)
        exact = Fraction(x * y, 10 ** (sx + sy))
        expected = _half_up(exact * 10**scale)
        if abs(expected) < 10**38:
            assert decimals.product(x, sx, y, sy, scale) == expected, (x, sx, y, sy, scale)
        if y:
            q = Fraction(x, 10**sx) / Fraction(y, 10**sy)
            at_39 = Fraction(int(q * 10**39), 10**39)  # int() truncates toward zero
            assert decimals.quotient(x, sx, y, sy, scale) == _half_up(at_39 * 10**scale)
        sums = Fraction(x, 10**sx) + Fraction(y, 10**sy)
        assert decimals.total(x, sx, y, sy, scale) == _half_up(sums * 10**scale)


def test_the_truncation_differs_from_rounding_twice() -> None:
    """Places past the result's scale reading 4999...9 then 5: Spark (truncate to 39, then
    round) rounds down; rounding to 38 places first would round up."""
    x = (5 * 10**38 - 1) * 10 + 5  # 0.4 (38 nines) 5, of scale 40
    assert decimals.quotient(x, 40, 1, 0, 0) == 0
    assert decimals.quotient(5, 38, 11, 0, 38) == 0  # 5E-38 / 11 = 0.4545...E-38


def test_overflow_and_division_by_zero_are_raised_for_the_caller_to_name() -> None:
    with pytest.raises(decimals.DecimalOverflow, match=r"E\+"):
        decimals.product(10**38, 0, 10**38, 0, 0)
    with pytest.raises(ZeroDivisionError, match=r"1.50 / 0"):
        decimals.quotient(150, 2, 0, 0, 2)
