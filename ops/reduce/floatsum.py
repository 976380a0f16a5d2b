"""Exact sums of doubles: the kernel both renderers share for SUM, AVG, VARIANCE and STDDEV
over floating point.

A finite double is ``m * 2^e`` with an integer ``|m| < 2^53`` and ``e`` the lowest bit its
exponent can hold, so values of one exponent add up exactly as integers: this module keeps,
per group, argument and exponent ``e``, the exact sums ``Σ m * diff`` (``_v``) and, for
variances, ``Σ m² * diff`` split in two (``_qh = Σ mh² * diff`` at ``2^(2e + 54)`` and ``_ql
= Σ (2 mh ml 2^27 + ml²) * diff`` at ``2^(2e)``, with ``m = mh 2^27 + ml``), each a
DECIMAL(38, 0) that holds 2^72 rows' worth. Sums of several exponents add up in any order, on
any number of tasks, and retracting a value subtracts what it added, so after any sequence of
inserts and deletes the state holds the exact sums of the values present: ``(data, time,
diff)`` updates contribute ``diff`` times their terms, and the state at ``t`` is the sum of the
contributions up to ``t`` (the accumulable branch's contract, :mod:`ops.reduce.spark`).

Results are rounded once, from the exact value: SUM is the exact sum rounded to the nearest
double (Python's ``math.fsum`` gives the same value), AVG the exact quotient rounded once,
VARIANCE the exact ``(Σx² - (Σx)²/n) / (n - ddof)`` rounded once and STDDEV its square root.
NaN and infinities are counted beside the sums, as Spark combines them: a NaN, or both
infinities, make the SUM and AVG NaN; one infinity makes them that infinity; any of them makes
a VARIANCE or STDDEV NaN. A finite sum past the double range is an infinity of its sign.

A value's terms, for Spark, are :func:`spark_exponent` and :func:`spark_mantissa` (column
expressions, exact); for the driver (and tests), :func:`terms`. This module imports only the
standard library at the top: Spark's Python workers run :func:`arrow_results`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

OFFSET = 2304
"""Sums are computed in units of ``2^-OFFSET``: below the lowest bit of the square of the
smallest double (``2^-2252`` with ``e = -1126``)."""

HALF = 27
"""``m = mh * 2^HALF + ml``: ``mh² < 2^52`` and ``2 mh ml 2^27 + ml² < 2^82``."""


def is_exact(func: str, t: Any) -> bool:
    """Whether an aggregate ``func`` over Spark type ``t`` is kept as exact floating-point
    sums here: SUM and AVG of floating point, and every numeric VARIANCE/STDDEV (Spark
    computes those in double whatever the type, so the exact variance of the values as
    doubles is the exact answer to its SQL). Both renderers ask this one question."""
    from pyspark.sql import types as T

    from ivm.plan.reduce import SUMMED  # here, not at the top: workers unpickle this module

    if func in ("sum", "avg"):
        return isinstance(t, (T.FloatType, T.DoubleType))
    return func in SUMMED and isinstance(t, T.NumericType)


def terms(x: float) -> tuple[int, int, int, int]:
    """``(e, m, qh, ql)`` of a finite non-zero ``x``: ``x == m * 2^e`` (``|m| < 2^53``, ``e``
    the lowest bit a double of this exponent holds) and ``x² == qh * 2^(2e + 54) + ql *
    2^(2e)``."""
    _, f = math.frexp(x)  # x = g * 2^f, 0.5 <= |g| < 1
    e = max(f - 1, -1022) - 52
    m = int(x * 2.0 ** (-e // 2) * 2.0 ** (-e - (-e // 2)))  # two exact scalings
    mh, ml = abs(m) >> HALF, abs(m) & ((1 << HALF) - 1)
    return e, m, mh * mh, ((2 * mh * ml) << HALF) + ml * ml


def fixed(rows: Iterable[tuple[int, int, int, int]]) -> tuple[int, int]:
    """``(Σx, Σx²)`` in units of ``2^-OFFSET`` from ``(e, v, qh, ql)`` sums per exponent."""
    total = squares = 0
    for e, v, qh, ql in rows:
        total += v << (e + OFFSET)
        squares += (qh << (2 * e + 2 * HALF + OFFSET)) + (ql << (2 * e + OFFSET))
    return total, squares


def _divide(numerator: int, denominator: int) -> float:
    """``numerator / denominator`` rounded once to the nearest double (Python's ``int / int``
    is correctly rounded), an infinity past the range."""
    try:
        return numerator / denominator
    except OverflowError:
        return math.inf if (numerator > 0) == (denominator > 0) else -math.inf


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
    ``stddev_samp`` or ``stddev_pop``. Integer arithmetic throughout, one rounding.

    >>> total, _ = fixed([terms(1.0), terms(0.5)])
    >>> exact_result("sum", 2, 0, 0, 0, total, 0)
    1.5
    """
    if n <= 0:
        return None
    if func in ("sum", "avg"):
        special = _special(nan, pinf, ninf)
        if special is not None:
            return special
        return _divide(total, (n if func == "avg" else 1) << OFFSET)
    ddof = 1 if func.endswith("samp") else 0
    if n <= ddof:
        return None
    if nan or pinf or ninf:
        return math.nan
    # Σx² - (Σx)²/n = (n * squares * 2^OFFSET - total²) / (n * 2^(2 * OFFSET)), exactly
    numerator = max(n * (squares << OFFSET) - total * total, 0)
    var = _divide(numerator, (n * (n - ddof)) << (2 * OFFSET))
    return math.sqrt(var) if func.startswith("stddev") else var


def arrow_results(batches: Iterable[Any], specs: Sequence[tuple]) -> Iterator[Any]:
    """Spark's ``mapInArrow`` over a branch's per-group state: each batch gets a column ``_fr``
    holding, per row, :func:`exact_result` of each spec ``(func, n column, nan column, pinf
    column, ninf column, argument)`` from the row's ``_fb`` sums (a list of ``(_t argument,
    _b exponent, _v, _qh, _ql)``). Runs in Spark's Python workers."""
    import pyarrow as pa

    for batch in batches:
        sums = batch.column("_fb")
        valid = sums.is_valid().to_pylist()
        offsets = sums.offsets.to_pylist()  # into sums.values, slices included
        arg, e, v, qh, ql = (a.to_pylist() for a in sums.values.flatten())
        counts = {c: batch.column(c).to_pylist() for spec in specs for c in spec[1:5]}
        out = []
        for row in range(batch.num_rows):
            per_arg: dict[int, list] = {}
            if valid[row]:
                for j in range(offsets[row], offsets[row + 1]):
                    per_arg.setdefault(arg[j], []).append((e[j], int(v[j]), int(qh[j]), int(ql[j])))
            exact = {a: fixed(rows) for a, rows in per_arg.items()}
            out.append(
                [
                    exact_result(
                        func,
                        *[counts[c][row] or 0 for c in (n, nan, pinf, ninf)],
                        *exact.get(a, (0, 0)),
                    )
                    for func, n, nan, pinf, ninf, a in specs
                ]
            )
        yield pa.RecordBatch.from_arrays(
            [*batch.columns, pa.array(out, pa.list_(pa.float64()))],
            names=[*batch.schema.names, "_fr"],
        )


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


def spark_mantissa(x: Any, e: Any, F: Any) -> tuple[Any, Any, Any, Any]:
    """``(e, m, qh, ql)`` of :func:`terms` as columns, for a DOUBLE column ``x`` and its
    :func:`spark_exponent` ``e`` (NULL for a zero or non-finite ``x``): ``m`` a BIGINT (the
    scaling by ``2^-e`` is two exact multiplications by powers of two: one would overflow for
    the smallest doubles), ``qh`` and ``ql`` DECIMAL(38, 0)."""
    two = F.lit(2.0)
    low = F.when(e.isNotNull(), F.greatest(e, F.lit(-1022)) - 52)  # greatest() skips NULLs
    half = F.floor(-low / 2).cast("int")
    m = (x * F.pow(two, half) * F.pow(two, -low - half)).cast("bigint")
    am = F.abs(m)
    mh = F.call_function("shiftright", am, F.lit(HALF))
    ml = am.bitwiseAND(F.lit((1 << HALF) - 1).cast("bigint"))
    dec = "decimal(38,0)"
    qh = (mh * mh).cast(dec)
    ql = (F.lit(2) * mh * ml).cast(dec) * F.lit(1 << HALF).cast(dec) + (ml * ml).cast(dec)
    return low, m, qh, ql.cast(dec)
