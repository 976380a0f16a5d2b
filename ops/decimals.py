"""Spark's decimal arithmetic on integers, written once for every renderer that computes
decimals outside Spark: the driver's expression evaluator (:mod:`ops.stateless.driver`) and the
accumulable aggregates' results (:mod:`ops.reduce.accumulable`, also run in Spark's Python
workers).

Owns the rounding rules of ``org.apache.spark.sql.types.Decimal`` as Spark 4 applies them
(SPARK-45786): a value is an integer ``units`` of ``scale`` places (``units·10^-scale``);
products are truncated to :data:`PRODUCT_DIGITS` significant digits and quotients to
:data:`QUOTIENT_SCALE` places, then rounded once, half away from zero, to the result type's
scale (:func:`to_scale`); a negation of more than :data:`NEGATION_DIGITS` digits is rounded
half even first. Precision is the caller's to check.

Contract: pure functions of integers, no state; in ``(data, time, diff)`` terms they compute
``f(data)`` of one update's values and never see its time or diff. This module needs only the
standard library, so Spark's workers can run it pickled by value
(``cloudpickle.register_pickle_by_value``).
"""

from __future__ import annotations

import decimal
from decimal import Decimal

PRODUCT_DIGITS = 39
"""Spark multiplies decimals in ``java.math.MathContext(39, DOWN)``: a product of more
significant digits is truncated to 39 of them, then rounded half up to the result's scale
``s``. A product that fits its type has at most ``38 - s`` integer digits, so its 39 digits
reach past place ``s`` and the truncation never changes that rounding: the result is the exact
product rounded once, half up. Rounding half up to 38 digits first (Spark before SPARK-45786)
differs: it rounds a product whose digits past place ``s`` read ``4999…9`` to the 38th digit
and 5 or more after it up, where Spark rounds it down."""

QUOTIENT_SCALE = 39
"""Spark divides decimals to 39 places, truncated (``BigDecimal.divide(_, 39, DOWN)``), then
rounds half up to the result's scale, at most 38: the 39th place decides that rounding as the
exact quotient would, so the result is the exact quotient rounded once, half up (an AVG of
eleven DECIMAL(38, 38) values summing to 5E-38 is 0E-38, not 1E-38)."""

NEGATION_DIGITS = 34
"""Spark negates a decimal of more than 18 digits as a Scala ``BigDecimal`` (its
``MathContext.DECIMAL128``): a value of more than 34 significant digits (counted at its type's
scale) is first rounded half even to 34 of them, which may then overflow its type."""


class DecimalOverflow(ArithmeticError):
    """A result with more integer digits than any decimal type holds (its value as text)."""


def half_up(n: int, d: int) -> int:
    """``n / d`` (``d > 0``) rounded half away from zero.

    >>> half_up(5, 2), half_up(-5, 2), half_up(7, 3)
    (3, -3, 2)
    """
    q, r = divmod(abs(n), d)
    q += 2 * r >= d
    return q if n >= 0 else -q


def half_even(n: int, d: int) -> int:
    """``n / d`` (``d > 0``) rounded half to even.

    >>> half_even(5, 2), half_even(7, 2), half_even(-5, 2)
    (2, 4, -2)
    """
    q, r = divmod(abs(n), d)
    q += 2 * r > d or (2 * r == d and q % 2 == 1)
    return q if n >= 0 else -q


def truncated(n: int, d: int) -> int:
    """``n / d`` (``d > 0``) rounded toward zero (``RoundingMode.DOWN``).

    >>> truncated(7, 2), truncated(-7, 2)
    (3, -3)
    """
    q = abs(n) // d
    return q if n >= 0 else -q


def to_scale(units: int, scale: int, target: int) -> int:
    """A decimal's integer of ``scale`` places as one of ``target`` places, half up (Spark's
    ``changePrecision``; the precision is not checked).

    >>> to_scale(999, 2, 1), to_scale(-15, 1, 0), to_scale(3, 0, 2)
    (100, -2, 300)
    """
    if scale >= target:
        return half_up(units, 10 ** (scale - target))
    return units * 10 ** (target - scale)


_TEXT = decimal.Context(prec=200)


def text(units: int, scale: int) -> str:
    """``units·10^-scale`` as a decimal's text, every digit kept.

    >>> text(150, 2), text(-7, 0), text(3, -2)
    ('1.50', '-7', '3E+2')
    """
    return str(Decimal(units).scaleb(-scale, context=_TEXT))


def product(x: int, sx: int, y: int, sy: int, scale: int) -> int:
    """``x·10^-sx · y·10^-sy`` as Spark's ``Decimal *``: the exact product truncated to
    :data:`PRODUCT_DIGITS` significant digits, then rounded half up to ``scale`` places.

    Raises:
        DecimalOverflow: more than 39 integer digits, past any decimal type.
    """
    units, places = x * y, sx + sy
    excess = len(str(abs(units))) - PRODUCT_DIGITS
    if excess > 0:
        units, places = truncated(units, 10**excess), places - excess
        if places < 0:
            raise DecimalOverflow(text(units, places))
    return to_scale(units, places, scale)


def total(x: int, sx: int, y: int, sy: int, scale: int) -> int:
    """``x·10^-sx + y·10^-sy`` as Spark's ``Decimal +``: exact, then rounded half up to
    ``scale`` places."""
    places = max(sx, sy)
    return to_scale(x * 10 ** (places - sx) + y * 10 ** (places - sy), places, scale)


def difference(x: int, sx: int, y: int, sy: int, scale: int) -> int:
    """``x·10^-sx - y·10^-sy`` as Spark's ``Decimal -`` (:func:`total`)."""
    return total(x, sx, -y, sy, scale)


def quotient(x: int, sx: int, y: int, sy: int, scale: int) -> int:
    """``x·10^-sx / y·10^-sy`` as Spark's ``Decimal /``: the exact quotient truncated to
    :data:`QUOTIENT_SCALE` places, then rounded half up to ``scale`` places (also how
    ``Average`` divides a decimal sum by its count: ``y`` the count, ``sy`` 0).

    >>> quotient(5, 38, 11, 0, 38)
    0
    >>> quotient(-5, 2, 2, 0, 2)
    -3

    Raises:
        ZeroDivisionError: ``y`` is 0 (Spark's ANSI mode raises too).
    """
    if y == 0:
        raise ZeroDivisionError(f"{text(x, sx)} / 0")
    shift = QUOTIENT_SCALE + sy - sx
    num, den = (x * 10**shift, y) if shift >= 0 else (x, y * 10**-shift)
    return to_scale(truncated(num if den > 0 else -num, abs(den)), QUOTIENT_SCALE, scale)


def remainder(x: int, sx: int, y: int, sy: int, scale: int) -> int:
    """``x·10^-sx % y·10^-sy`` as Spark's ``Decimal %`` (Java's ``BigDecimal.remainder``):
    exact, of the dividend's sign, as an integer of ``scale`` places (at least both scales).

    >>> remainder(-75, 1, 2, 0, 1), remainder(75, 1, -200, 2, 2)
    (-15, 150)

    Raises:
        ZeroDivisionError: ``y`` is 0 (Spark's ANSI mode raises too).
        ValueError: the integer quotient has more than 38 digits (Java's remainder in
            Spark's 38-digit context refuses it).
    """
    if y == 0:
        raise ZeroDivisionError(f"{text(x, sx)} % 0")
    a, b = abs(x) * 10 ** (scale - sx), abs(y) * 10 ** (scale - sy)
    if len(str(a // b)) > 38:
        raise ValueError(f"{text(x, sx)} % {text(y, sy)}: a quotient past 38 digits")
    return -(a % b) if x < 0 else a % b


def negation(x: int, precision: int) -> int:
    """``-x`` for a decimal of ``precision`` digits, as Spark's ``Decimal`` negates it
    (:data:`NEGATION_DIGITS`), as an integer of the same scale."""
    excess = len(str(abs(x))) - NEGATION_DIGITS
    if precision > 18 and excess > 0:
        x = half_even(x, 10**excess) * 10**excess
    return -x
