"""Rows the driver holds (Arrow tables): matching them NULL-safely against other rows.

Contract: :func:`null_safe_matches` pairs each row of ``rows`` with the rows of ``keys``
whose ``columns`` equal it, NULL equal to NULL (the grouping semantics Spark's ``<=>`` and
``GROUP BY`` share), so an update ``(data, time, diff)`` can be found among stored rows by its
data however many NULLs it holds. :class:`SortedKey` finds the rows holding given keys in a
file stored sorted by them (an arrangement's, a state table's) by binary search, in time
proportional to the keys and the rows found, not to the file. Neither reads time or diff:
callers filter, sum or check those. :func:`cast_loss` says, from the types alone, whether rows
convert to another schema without losing or refusing a value (so the driver decides before it
writes anything whether it holds them as Spark would).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def null_safe_matches(rows: pa.Table, keys: pa.Table, columns: Sequence[str]) -> pa.Table:
    """Every pair ``(_row, _key)`` of a row of ``rows`` and a row of ``keys`` whose
    ``columns`` are equal, NULL equal to NULL, as positions (int64), ordered by ``_row``.

    Arrow's joins never match NULLs, so each column is compared as (is null, value with NULLs
    filled by one value both sides share). The rows whose first column holds one of the
    keys' values (a hash lookup per row) are kept first, and only those joined.

    >>> a = pa.table({"k": [1, None, 2, None]})
    >>> null_safe_matches(a, pa.table({"k": [None, 2]}), ["k"]).to_pydict()
    {'_row': [1, 2, 3], '_key': [0, 1, 0]}
    """
    if rows.num_rows == 0 or keys.num_rows == 0:
        return pa.table({"_row": pa.array([], pa.int64()), "_key": pa.array([], pa.int64())})
    first = keys.column(columns[0])
    hit = pc.is_in(rows.column(columns[0]), value_set=pc.unique(first), skip_nulls=True)
    if first.null_count:
        hit = pc.or_(hit, pc.is_null(rows.column(columns[0])))
    positions = pc.indices_nonzero(hit).cast(pa.int64())
    pairs = _pairs(rows.select(list(columns)).take(positions), keys, columns)
    return pa.table({"_row": positions.take(pairs.column("_row")), "_key": pairs.column("_key")})


def _pairs(rows: pa.Table, keys: pa.Table, columns: Sequence[str]) -> pa.Table:
    """:func:`null_safe_matches` by a join of every row."""
    if rows.num_rows == 0:
        return pa.table({"_row": pa.array([], pa.int64()), "_key": pa.array([], pa.int64())})
    left, right, on = {}, {}, []
    for i, c in enumerate(columns):
        a, b = rows.column(c), keys.column(c)
        left[f"_n{i}"], right[f"_n{i}"] = pc.is_null(a), pc.is_null(b)
        on.append(f"_n{i}")
        present = pc.drop_null(pa.concat_arrays([*a.chunks, *b.chunks]))
        if len(present):
            fill = present[0]
            left[f"_k{i}"], right[f"_k{i}"] = pc.fill_null(a, fill), pc.fill_null(b, fill)
            on.append(f"_k{i}")
    probe = pa.table(left).append_column("_row", pa.array(np.arange(rows.num_rows)))
    build = pa.table(right).append_column("_key", pa.array(np.arange(keys.num_rows)))
    pairs = probe.join(build, keys=on, join_type="inner", use_threads=False)
    return pairs.select(["_row", "_key"]).sort_by("_row")


def semi_join_null_safe(rows: pa.Table, keys: pa.Table, columns: Sequence[str]) -> pa.Table:
    """The rows of ``rows`` whose ``columns`` equal a row of ``keys``, NULL equal to NULL,
    each once (however many keys it matches), in their order."""
    if rows.num_rows == 0 or keys.num_rows == 0:
        return rows.slice(0, 0)
    return rows.take(pc.unique(null_safe_matches(rows, keys, columns).column("_row")))


@dataclass(frozen=True)
class SortedKey:
    """Key columns stored in ascending order, each with its NULLs first within equal values
    of the columns before it, as every file of an arrangement or a state table holds its
    key (Spark's and the driver's writes sort by the key): :meth:`positions` finds the rows
    holding given keys by binary search, column after column. Build it with :meth:`of`,
    which checks the order (once per file: the driver's cache keeps it with the decoded
    rows, :meth:`resources.filecache.FileCache.derived`)."""

    columns: tuple[pa.Array, ...]
    numbers: tuple[np.ndarray | None, ...]  # each column as numpy (integers, dates), or None
    nulls: tuple[np.ndarray | None, ...]  # each column's NULLs before each row, or None: none

    @staticmethod
    def of(table: pa.Table, key: Sequence[str]) -> SortedKey | None:
        """The index of ``table``'s ``key`` columns, or None when they are not in that
        order or a column's type is not ordered alike by Arrow and numpy (floating point:
        NaN, -0.0)."""
        columns = tuple(table.column(c).combine_chunks() for c in key)
        if not all(_ordered_alike(c.type) for c in columns):
            return None
        if table.num_rows > 1 and not _ascending(columns):
            return None
        numbers = tuple(_numbers(c) for c in columns)
        nulls = tuple(_nulls_before(c) for c in columns)
        return SortedKey(columns, numbers, nulls)

    def positions(self, wanted: pa.Table) -> np.ndarray:
        """Ascending positions (int64) of the rows whose key equals a row of ``wanted`` (its
        columns in the key's order, NULL equal to NULL): column after column, every wanted
        key's range narrowed at once by a binary search of all of them together, in
        vectorized steps as many as the range's length has bits."""
        n = len(self.columns[0])
        wanted = self._in_range(wanted)
        alive = np.arange(wanted.num_rows)  # the wanted keys whose range is not empty
        lo = np.zeros(wanted.num_rows, dtype=np.int64)
        hi = np.full(wanted.num_rows, n, dtype=np.int64)
        for j, column in enumerate(self.columns):
            if not len(lo):
                break
            values = wanted.column(j).combine_chunks().cast(column.type).take(alive)
            lo, hi = self._within(j, lo, hi, values)
            found = hi > lo
            alive, lo, hi = alive[found], lo[found], hi[found]
        if not len(lo):
            return np.zeros(0, dtype=np.int64)
        lo, first = np.unique(lo, return_index=True)
        return _ranges(lo, hi[first])

    def _in_range(self, wanted: pa.Table) -> pa.Table:
        """The rows of ``wanted`` whose first column lies within the first key column's
        range here (NULL: if the file holds NULLs there), cheaply: a lookup hands every file
        of an arrangement all its keys (thousands, over files of disjoint ranges), and each
        file's searches then cost its own keys only."""
        first = self.columns[0]
        nulls = first.null_count
        if wanted.num_rows < 2 or len(first) == nulls:
            return wanted
        values = wanted.column(0).cast(first.type)
        inside = pc.and_(
            pc.greater_equal(values, first[nulls]), pc.less_equal(values, first[len(first) - 1])
        )
        inside = pc.fill_null(inside, nulls > 0)
        if pc.all(inside).as_py():
            return wanted
        return wanted.filter(inside)

    def _within(
        self, j: int, lo: np.ndarray, hi: np.ndarray, values: pa.Array
    ) -> tuple[np.ndarray, np.ndarray]:
        """The range of each of ``values`` among rows ``[lo, hi)`` of key column ``j``
        (sorted there, NULLs first): a NULL's is the range's leading NULLs, a value's the
        rows equal to it after them."""
        nulls = self.nulls[j]
        start = lo if nulls is None else lo + nulls[hi] - nulls[lo]
        valid = np.asarray(values.is_valid())
        out_lo = np.where(valid, _bisect(self, j, start, hi, values, valid, right=False), lo)
        out_hi = np.where(valid, _bisect(self, j, out_lo, hi, values, valid, right=True), start)
        return out_lo, out_hi


def _bisect(
    index: SortedKey,
    j: int,
    lo: np.ndarray,
    hi: np.ndarray,
    values: pa.Array,
    valid: np.ndarray,
    *,
    right: bool,
) -> np.ndarray:
    """For each ``i`` where ``valid``, the first row ``p`` of ``[lo[i], hi[i])`` of key
    column ``j`` (sorted, no NULL there) whose value is at least ``values[i]`` (past it when
    ``right``), every key's search stepping at once; elsewhere ``lo[i]``."""
    lo, hi = lo.copy(), np.where(valid, hi, lo)
    numbers = index.numbers[j]
    keys = _numbers(values) if numbers is not None else None
    while True:
        active = np.flatnonzero(lo < hi)
        if not len(active):
            return lo
        mid = (lo[active] + hi[active]) // 2
        if numbers is not None and keys is not None:
            here, there = numbers[mid], keys[active]
            before = here <= there if right else here < there
        else:
            here_a, there_a = index.columns[j].take(mid), values.take(active)
            compare = pc.less_equal if right else pc.less
            before = np.asarray(compare(here_a, there_a).to_numpy(zero_copy_only=False))
        lo[active[before]] = mid[before] + 1
        hi[active[~before]] = mid[~before]


def _nulls_before(column: pa.Array) -> np.ndarray | None:
    """How many of ``column``'s rows before each row (and before its end) are NULL, or None
    when none is."""
    if not column.null_count:
        return None
    counts = np.zeros(len(column) + 1, dtype=np.int64)
    np.cumsum(np.asarray(column.is_null()), out=counts[1:])
    return counts


def _ordered_alike(t: pa.DataType) -> bool:
    """Whether ``t``'s values are ordered by Arrow's comparisons (and, integers and dates,
    by numpy's) as the key's writers sort them."""
    return (
        pa.types.is_integer(t)
        or pa.types.is_decimal(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_date(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_boolean(t)
    )


def _ascending(columns: Sequence[pa.Array]) -> bool:
    """Whether every row's key is at most the next row's: column by column, NULL first."""
    ok = None
    for column in reversed(columns):
        a, b = column.slice(0, len(column) - 1), column.slice(1)
        a_null, b_null = pc.is_null(a), pc.is_null(b)
        both = pc.and_(pc.invert(a_null), pc.invert(b_null))
        less = pc.or_(
            pc.and_(a_null, pc.invert(b_null)), pc.fill_null(pc.and_(both, pc.less(a, b)), False)
        )
        equal = pc.or_(pc.and_(a_null, b_null), pc.fill_null(pc.and_(both, pc.equal(a, b)), False))
        ok = pc.or_(less, equal) if ok is None else pc.or_(less, pc.and_(equal, ok))
    return ok is None or bool(pc.all(ok).as_py())


def _numbers(values: pa.Array) -> np.ndarray | None:
    """``values`` as a numpy array of integers ordered as Arrow orders them (NULLs as 0:
    never searched, they lead each range), or None for types that are not integers."""
    t = values.type
    if pa.types.is_date32(t):
        values = values.cast(pa.int32())
    elif pa.types.is_date64(t) or pa.types.is_timestamp(t):
        values = values.cast(pa.int64())
    elif not pa.types.is_integer(t):
        return None
    if values.null_count:
        values = values.fill_null(0)
    return values.to_numpy(zero_copy_only=False)


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The positions ``lo[i] <= p < hi[i]`` of every ``i``, in order (ranges disjoint and
    ascending)."""
    counts = (hi - lo).astype(np.int64)
    total = int(counts.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    starts = np.repeat(lo.astype(np.int64) - (np.cumsum(counts) - counts), counts)
    return starts + np.arange(total, dtype=np.int64)


_UNITS = ("s", "ms", "us", "ns")
_INTEGER_DIGITS = {8: 3, 16: 5, 32: 10, 64: 19}


def lossless(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether every value of type ``source`` converts to ``target`` exactly, so Arrow's
    (safe) cast of it cannot fail: the same type, a wider integer, float or decimal, another
    layout of strings or bytes, a finer timestamp unit in the same zone, and nested types
    made of those."""
    if source == target or pa.types.is_null(source):
        return True
    if pa.types.is_dictionary(source):
        return lossless(source.value_type, target)
    if pa.types.is_integer(source):
        return _integer_fits(source, target)
    if pa.types.is_decimal(source) and pa.types.is_decimal(target):
        whole = source.precision - source.scale
        return target.scale >= source.scale and target.precision - target.scale >= whole
    if pa.types.is_floating(source) and pa.types.is_floating(target):
        return target.bit_width >= source.bit_width
    for kind in (_is_text, _is_bytes):
        if kind(source) and kind(target):
            return True
    if pa.types.is_timestamp(source) and pa.types.is_timestamp(target):
        finer = _UNITS.index(target.unit) >= _UNITS.index(source.unit)
        return source.tz == target.tz and finer
    if pa.types.is_date32(source):
        return pa.types.is_date64(target)
    return _nested_lossless(source, target)


def in_range(table: pa.Table, target: pa.Schema) -> pa.Table:
    """``table`` without the rows whose integer (decimal) in a column of ``target`` (matched
    by name) lies past that column's narrower integer type (does not fit its decimal type
    exactly: more fractional digits than its scale, or more integral digits), those columns
    cast to it: a key that cannot be stored there matches no stored key. NULLs are kept."""
    for field in target:
        source = table.schema.field(field.name).type
        if pa.types.is_decimal(source) and pa.types.is_decimal(field.type):
            table = _decimals_in_range(table, field)
            continue
        if not (pa.types.is_integer(source) and pa.types.is_integer(field.type)):
            continue
        if _integer_fits(source, field.type):
            continue
        info, own = (np.iinfo(t.to_pandas_dtype()) for t in (field.type, source))
        column = table.column(field.name)
        inside = pa.array([True] * table.num_rows)
        if info.min > own.min:
            inside = pc.and_(inside, pc.greater_equal(column, pa.scalar(int(info.min), source)))
        if info.max < own.max:
            inside = pc.and_(inside, pc.less_equal(column, pa.scalar(int(info.max), source)))
        table = table.filter(pc.fill_null(inside, True))
        index = table.schema.get_field_index(field.name)
        table = table.set_column(index, field.name, table.column(field.name).cast(field.type))
    return table


def _decimals_in_range(table: pa.Table, field: pa.Field) -> pa.Table:
    """:func:`in_range` of one decimal column: the values ``field``'s decimal holds exactly,
    cast to it."""
    source, target = table.schema.field(field.name).type, field.type
    if lossless(source, target):
        return table
    column = table.column(field.name)
    inside = pa.array([True] * table.num_rows)
    if source.scale > target.scale:  # no fractional digit past the target's scale
        rounded = pc.round(column, ndigits=target.scale, round_mode="towards_zero")
        inside = pc.and_(inside, pc.equal(rounded, column))
    digits = target.precision - target.scale
    if source.precision - source.scale > digits:  # |v| < 10 ** digits
        bound = pa.scalar(Decimal(10) ** digits, source)
        inside = pc.and_(inside, pc.less(pc.abs(column), bound))
    table = table.filter(pc.fill_null(inside, True))
    index = table.schema.get_field_index(field.name)
    return table.set_column(index, field.name, table.column(field.name).cast(target))


def _integer_fits(source: pa.DataType, target: pa.DataType) -> bool:
    signed = pa.types.is_signed_integer(source)
    if pa.types.is_integer(target):
        if pa.types.is_signed_integer(target):
            return target.bit_width >= source.bit_width + (0 if signed else 1)
        return not signed and target.bit_width >= source.bit_width
    if pa.types.is_decimal(target):
        digits = _INTEGER_DIGITS[source.bit_width] + (0 if signed or source.bit_width < 64 else 1)
        return target.precision - target.scale >= digits
    return False


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _is_bytes(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t)


def _nested_lossless(source: pa.DataType, target: pa.DataType) -> bool:
    if pa.types.is_map(source) and pa.types.is_map(target):
        return lossless(source.key_type, target.key_type) and lossless(
            source.item_type, target.item_type
        )
    lists = (pa.types.is_list, pa.types.is_large_list)
    if any(f(source) for f in lists) and any(f(target) for f in lists):
        return lossless(source.value_type, target.value_type)
    if pa.types.is_struct(source) and pa.types.is_struct(target):
        names = [source.field(i).name for i in range(source.num_fields)]
        if names != [target.field(i).name for i in range(target.num_fields)]:
            return False
        return all(
            lossless(source.field(i).type, target.field(i).type) for i in range(source.num_fields)
        )
    return False


def cast_loss(source: pa.Schema, target: pa.Schema) -> str | None:
    """Why rows of ``source`` do not convert to ``target`` (matched by name) without loss
    (:func:`lossless`), or None when they do."""
    for field in target:
        if source.get_field_index(field.name) < 0:
            return f"no column {field.name}"
        found = source.field(field.name).type
        if not lossless(found, field.type):
            return f"column {field.name}: {found} does not convert to {field.type} exactly"
    return None
