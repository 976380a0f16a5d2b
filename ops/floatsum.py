"""Exact sums of doubles: the kernel both renderers share for SUM, AVG, VARIANCE and STDDEV
over floating point.

A double is ``m * 2^t`` with an integer ``|m| < 2^53``, so a sum of doubles is an integer
multiple of ``2^-OFFSET``. This module keeps such a sum exactly, as integers per 32-bit *bin*
of that fixed-point number: a value adds ``sign * part`` to each of the (at most three) bins
its bits fall in, and bins add up as plain 64-bit integers, in any order, on any number of
tasks. Retracting a value subtracts the same parts, so after any sequence of inserts and
deletes the bins hold the exact sum of the values present: ``(data, time, diff)`` updates
contribute ``diff * part`` and the state at ``t`` is the sum of the contributions up to ``t``
(the accumulable branch's contract, :mod:`ops.reduce`). A square ``x^2 = m^2 * 2^(2t)`` is
kept the same way (``m^2`` split into three integer terms), so ``Σx²`` is exact too and the
variance is computed from exact sums in rational arithmetic.

Results are rounded once, from the exact value: SUM is the exact sum rounded to the nearest
double (Python's ``math.fsum`` gives the same value), AVG the exact quotient rounded once,
VARIANCE the exact ``(Σx² - (Σx)²/n) / (n - ddof)`` rounded once and STDDEV its square root.
NaN and infinities are counted beside the bins, as Spark combines them: a NaN, or both
infinities, make the SUM and AVG NaN; one infinity makes them that infinity; any of them makes
a VARIANCE or STDDEV NaN. A finite sum past the double range is an infinity of its sign.

The bins of one value, for Spark, are :func:`spark_parts` (column expressions only: exact
integer arithmetic on ``m`` and ``t`` from :func:`spark_exponent` and :func:`spark_mantissa`);
for the driver (and tests), :func:`parts`. This module imports
only the standard library at the top: Spark's Python workers run :func:`float_result`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

BIN_BITS = 32
"""Width of a bin: a part is below 2^32, so 2^31 contributions of a bin fit a BIGINT sum."""

OFFSET = 2304
"""Bit position 0 of the fixed-point sums is ``2^-OFFSET``: below the lowest bit of a square of
the smallest double (``2^-2148``), a multiple of :data:`BIN_BITS`."""

TERMS_PER_VALUE = 3
"""A value's integer terms: ``m`` alone for ``x``; ``m²``'s three for ``x²``."""

_HALF = 26  # m = mh * 2^26 + ml with mh < 2^27, ml < 2^26: each term of m² fits 55 bits


SUMMED_EXACTLY = ("sum", "avg", "var_samp", "var_pop", "stddev_samp", "stddev_pop")


def is_exact(func: str, t: Any) -> bool:
    """Whether an aggregate ``func`` over Spark type ``t`` is kept as exact floating-point
    sums here: SUM and AVG of floating point, and every numeric VARIANCE/STDDEV (Spark
    computes those in double whatever the type, so the exact variance of the values as
    doubles is the exact answer to its SQL). Both renderers ask this one question."""
    from pyspark.sql import types as T

    if func in ("sum", "avg"):
        return isinstance(t, (T.FloatType, T.DoubleType))
    return func in SUMMED_EXACTLY and isinstance(t, T.NumericType)


def _frexp_int(x: float) -> tuple[int, int]:
    """``(m, t)`` with ``x == m * 2^t`` exactly and ``|m| < 2^53`` (the lowest bit position
    a double of this exponent can hold: ``t = max(e, -1022) - 52``)."""
    if x == 0:
        return 0, -1074
    _, e = math.frexp(x)  # x = f * 2^e, 0.5 <= |f| < 1
    t = max(e - 1, -1022) - 52
    return int(x * 2.0 ** (-t // 2) * 2.0 ** (-t - (-t // 2))), t


def terms(x: float, squared: bool) -> list[tuple[int, int]]:
    """The integer terms ``(v, position)`` whose ``Σ v * 2^position`` is ``x`` (or ``x²``),
    each ``0 <= v < 2^55`` (signs apart: see :func:`parts`)."""
    m, t = _frexp_int(x)
    m = abs(m)
    if not squared:
        return [(m, t)]
    mh, ml = m >> _HALF, m & ((1 << _HALF) - 1)
    return [(mh * mh, 2 * t + 2 * _HALF), (2 * mh * ml, 2 * t + _HALF), (ml * ml, 2 * t)]


def _split(v: int, position: int) -> list[tuple[int, int]]:
    """``v * 2^position`` as ``(bin, part)`` pairs, parts below ``2^BIN_BITS``."""
    a = position + OFFSET
    b, o = divmod(a, BIN_BITS)
    mask = (1 << BIN_BITS) - 1
    shifted = v << o
    return [(b + i, (shifted >> (BIN_BITS * i)) & mask) for i in range(3)]


def parts(x: float, squared: bool = False) -> dict[int, int]:
    """The signed bin parts of a finite ``x`` (or of ``x²``): ``Σ part * 2^(32 * bin - OFFSET)``
    equals it exactly."""
    sign = -1 if (x < 0 and not squared) else 1
    out: dict[int, int] = {}
    for v, position in terms(x, squared):
        for b, p in _split(v, position):
            if p:
                out[b] = out.get(b, 0) + sign * p
    return out


def fixed(bins: Iterable[tuple[int, int]]) -> int:
    """The exact sum held by ``(bin, part sum)`` pairs, in units of ``2^-OFFSET``."""
    return sum(v << (BIN_BITS * b) for b, v in bins)


def _round(q: Fraction) -> float:
    """``q`` rounded once to the nearest double (an infinity past the range)."""
    try:
        return q.numerator / q.denominator  # int / int: correctly rounded
    except OverflowError:
        return math.inf if q > 0 else -math.inf


def _special(nan: int, pinf: int, ninf: int) -> float | None:
    """The value NaN/infinity counts force on a SUM or AVG, or None for a finite one."""
    if nan > 0 or (pinf > 0 and ninf > 0):
        return math.nan
    if pinf > 0:
        return math.inf
    if ninf > 0:
        return -math.inf
    return None


def exact_result(
    func: str, n: int, nan: int, pinf: int, ninf: int, total: int, squares: int
) -> float | None:
    """An aggregate's value from its exact state: ``n`` non-NULL values (NaN and infinities
    among them, counted apart), ``total`` = Σx and ``squares`` = Σx² of the finite ones in
    units of ``2^-OFFSET``. ``func`` is ``sum``, ``avg``, ``var_samp``, ``var_pop``,
    ``stddev_samp`` or ``stddev_pop``.

    >>> exact_result("sum", 2, 0, 0, 0, fixed(parts(1.0).items()) + fixed(parts(0.5).items()), 0)
    1.5
    """
    if n <= 0:
        return None
    unit = Fraction(1, 1 << OFFSET)
    if func in ("sum", "avg"):
        special = _special(nan, pinf, ninf)
        if special is not None:
            return special
        return _round(total * unit / (n if func == "avg" else 1))
    ddof = 1 if func.endswith("samp") else 0
    if n <= ddof:
        return None
    if nan or pinf or ninf:
        return math.nan
    m2 = squares * unit - (total * unit) ** 2 / n  # exact: Σx² - (Σx)²/n
    var = max(m2, Fraction(0)) / (n - ddof)
    if func.startswith("stddev"):
        return math.sqrt(_round(var))
    return _round(var)


def float_result(
    func: str,
    n: int | None,
    nan: int | None,
    pinf: int | None,
    ninf: int | None,
    bins: Sequence[Mapping[str, Any]] | None,
    sum_term: int,
    square_term: int,
) -> float | None:
    """:func:`exact_result` from a group's collected bins (``{"_t", "_b", "_v"}`` rows: term,
    bin, part sum), as Spark's Python workers evaluate it (see :mod:`ops.reduce`)."""
    total = squares = 0
    for row in bins or ():
        if row["_t"] == sum_term:
            total += row["_v"] << (BIN_BITS * row["_b"])
        elif row["_t"] == square_term:
            squares += row["_v"] << (BIN_BITS * row["_b"])
    return exact_result(func, n or 0, nan or 0, pinf or 0, ninf or 0, total, squares)


def spark_exponent(x: Any, F: Any) -> Any:
    """``floor(log2(|x|))`` of a finite non-zero DOUBLE column, exactly: ``log2`` may be off by
    one next to a power of two, which ``pow(2, e)`` (exact in Java) corrects."""
    ax = F.abs(x)
    e0 = F.floor(F.log2(ax)).cast("int")
    two = F.lit(2.0)
    return (
        e0
        - F.when(F.pow(two, e0) > ax, 1).otherwise(0)
        + F.when(F.pow(two, e0 + 1) <= ax, 1).otherwise(0)
    )


def spark_mantissa(x: Any, e: Any, F: Any) -> tuple[Any, Any]:
    """``(|m|, t)`` of :func:`_frexp_int` for a DOUBLE column ``x`` and its exponent column
    ``e`` (:func:`spark_exponent`): the scaling by ``2^-t`` is two exact multiplications by
    powers of two (one would overflow for the smallest doubles)."""
    two = F.lit(2.0)
    t = F.when(e.isNotNull(), F.greatest(e, F.lit(-1022)) - 52)  # greatest() skips NULLs
    half = F.floor(-t / 2).cast("int")
    m = (F.abs(x) * F.pow(two, half) * F.pow(two, -t - half)).cast("bigint")
    return m, t


def spark_parts(m: Any, t: Any, negative: Any, F: Any, squared: bool) -> list[tuple[Any, Any]]:
    """The ``(bin, signed part)`` column pairs :func:`parts` computes, from a value's
    :func:`spark_mantissa` columns and whether it is negative (``F``:
    ``pyspark.sql.functions``); a bin that holds nothing has a zero part. Exact integer
    expressions: shifts and masks on BIGINTs, a shift of 64 guarded (Java reduces shift
    counts mod 64)."""

    def shl(a: Any, n: Any) -> Any:
        return F.call_function("shiftleft", a, n)

    def shr(a: Any, n: Any) -> Any:
        return F.call_function("shiftright", a, n)

    if squared:
        mh, ml = shr(m, F.lit(_HALF)), m.bitwiseAND(F.lit((1 << _HALF) - 1).cast("bigint"))
        items = [
            (mh * mh, 2 * t + 2 * _HALF),
            (F.lit(2) * mh * ml, 2 * t + _HALF),
            (ml * ml, 2 * t),
        ]
        sign = F.lit(1).cast("bigint")
    else:
        items = [(m, t)]
        sign = F.when(negative, -1).otherwise(1).cast("bigint")
    out = []
    mask = F.lit((1 << BIN_BITS) - 1).cast("bigint")
    one = F.lit(1).cast("bigint")
    for v, position in items:
        a = position + OFFSET
        b = F.floor(a / BIN_BITS).cast("int")
        o = F.pmod(a, F.lit(BIN_BITS))
        low = shl(v.bitwiseAND(shl(one, BIN_BITS - o) - 1), o)
        mid = shr(v, BIN_BITS - o).bitwiseAND(mask)
        high = F.when(o == 0, F.lit(0).cast("bigint")).otherwise(shr(v, 2 * BIN_BITS - o))
        out += [(b, sign * low), (b + 1, sign * mid), (b + 2, sign * high)]
    return out
