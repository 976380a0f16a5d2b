"""A small change's join computed by the driver, in Arrow, exactly as Spark would.

Owns the driver's rendering of a join's delta paths (:func:`join_delta_local`): the plan's
paths (:mod:`ivm.plan.join`) advanced together, each stage's lookup read once per arrangement
and time, each input's own filter and map and the residual predicates evaluated by
:mod:`ops.stateless.driver`; keys compared by ``<=>`` match NULL with NULL. Outer joins add
each preserved input's unmatched rows, padded with NULLs, and semi/anti joins keep an input's
rows with (without) a match: both by the match counts of :mod:`ops.join.spark`, read from the
same arrangements at the old and new times (:func:`_anti_delta_local`); ``NOT IN`` by its
state's row and NULL counts while its mode holds (:func:`_not_in_local`). A change of that
mode, and what Arrow's joins refuse, raise :class:`~ivm.errors.NotOnDriver`: Spark's.

Contract in ``(data, time, diff)`` terms, :func:`ops.join.spark.render_join_delta`'s: given
each changed input's updates and the other inputs' arrangements at the times the paths read,
the result is the join's change, every update at the epoch's time ``new``; an inner match's
diff is the product of the joined diffs (a product past a bigint raises EvaluationError, as
Spark's ANSI mode does).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from ivm.errors import NotOnDriver
from ivm.plan.ir import Join, JoinInput, SemiJoin
from ivm.plan.join import KeyPair, LookupStage, count_stage, key_pairs, plan_paths, shared_lookups
from ivm.plan.reduce import GLOBAL_KEY, not_in_mode, not_in_table
from ops import DIFF, TIME
from ops.arrange import distinct_rows
from ops.rows import null_safe_matches
from ops.stateless.driver import filtered, integral_result, projected


def prepare_local(spark, inp: JoinInput, table: pa.Table) -> pa.Table:
    """:func:`ops.join.spark.prepare` by the driver: a join input's own filter and map."""
    return projected(spark, filtered(spark, table, inp.predicate), inp.outputs)


LookupArrow = Callable[[LookupStage, pa.Table, int, Collection[str]], pa.Table]
"""``(stage, keys, as_of, columns) -> (key and columns..., _diff)``: the stage's arrangement
at ``as_of`` for ``keys`` (named as its key), summed; raises NotOnDriver when the driver
cannot read it."""

_RIGHT_DIFF = "_diff_right"


def _at(table: pa.Table, time: int) -> pa.Table:
    """``table`` with every update at ``time`` (``_time`` before ``_diff``)."""
    if TIME in table.column_names:
        table = table.drop_columns([TIME])
    times = pa.repeat(pa.scalar(time, pa.int64()), table.num_rows)
    return table.add_column(table.column_names.index(DIFF), TIME, times)


def _joinable(t: pa.DataType) -> bool:
    """Whether Arrow's hash join takes a column of type ``t`` (as a key or not)."""
    unsupported = (pa.types.is_string_view, pa.types.is_binary_view, pa.types.is_null)
    return not (pa.types.is_nested(t) or any(f(t) for f in unsupported))


def _diff_product(left: pa.ChunkedArray, right: pa.ChunkedArray) -> pa.ChunkedArray:
    """Two multiplicities multiplied; a product past a bigint raises EvaluationError, as
    Spark's (ANSI) product of the two ``_diff`` columns does."""
    largest = [max(abs(x.as_py() or 0) for x in pc.min_max(d).values()) for d in (left, right)]
    if largest[0] * largest[1] < 2**63:
        return pc.multiply(left, right)
    return integral_result("multiply", left, right, T.LongType())


def _join_stage_local(spark, stream: pa.Table, right: pa.Table, stage: LookupStage) -> pa.Table:
    """One stage of a delta path: the stream joined with the rows looked up, diffs
    multiplied, then the residual predicates that stage can check."""
    right = right.drop_columns([TIME])
    right = right.rename_columns([_RIGHT_DIFF if c == DIFF else c for c in right.column_names])
    for field in [*stream.schema, *right.schema]:
        if not _joinable(field.type):
            raise NotOnDriver(
                f"a join of {field.name} ({field.type}) is Spark's: Arrow's refuses it"
            )
    out = _joined(stream, right, stage)
    diff = _diff_product(out.column(DIFF), out.column(_RIGHT_DIFF))
    out = out.drop_columns([DIFF, _RIGHT_DIFF]).append_column(DIFF, diff)
    for r in stage.residual:
        out = filtered(spark, out, r)
    return out


def _strict_keys_present(
    table: pa.Table, keys: Sequence[str], null_safe: Sequence[bool]
) -> pa.Table:
    """``table``'s rows whose keys compared by ``=`` (not NULL-safe) are not NULL."""
    for key, safe in zip(keys, null_safe, strict=True):
        if not safe:
            table = table.filter(pc.is_valid(table.column(key)))
    return table


def _joined(stream: pa.Table, right: pa.Table, stage: LookupStage) -> pa.Table:
    """Each row of ``stream`` beside each row of ``right`` whose ``stage`` keys equal its own:
    Arrow's hash join where the key pairs are plain (``=``) and of one type that is not
    floating point; else the pairs of positions of :func:`_matches`, the rows with a NULL in
    a key pair compared by ``=`` left out first (they match nothing)."""
    pairs = list(zip(stage.stream_keys, stage.input_keys, strict=True))
    same = all(stream.schema.field(s).type == right.schema.field(r).type for s, r in pairs)
    floating = any(pa.types.is_floating(stream.schema.field(s).type) for s, _ in pairs)
    if same and not floating and not any(stage.null_safe):
        return stream.join(
            right,
            keys=list(stage.stream_keys),
            right_keys=list(stage.input_keys),
            join_type="inner",
            coalesce_keys=False,
            use_threads=False,
        )
    flags = [safe for _, _, safe in stage.matches()]
    stream = _strict_keys_present(stream, stage.stream_keys, flags)
    right = _strict_keys_present(right, stage.input_keys, flags)
    keys = right.select(list(stage.input_keys)).rename_columns(list(stage.stream_keys))
    found = _matches(stream, keys, stage.stream_keys)
    left = stream.take(found.column("_row"))
    matched = right.take(found.column("_key"))
    for name in matched.column_names:
        left = left.append_column(matched.schema.field(name), matched.column(name))
    return left


_INTEGER_DIGITS = {8: 3, 16: 5, 32: 10, 64: 19}


def _common_type(a: pa.Field, b: pa.Field) -> pa.DataType:
    """The type in which Spark compares key columns ``a`` and ``b`` exactly: their own, the
    wider integer, or a decimal holding both (an integer as a decimal of its digits). Raises
    NotOnDriver for floating point (Spark's joins make -0.0 equal 0.0 and NaN equal NaN,
    Arrow's do not) and for other pairs of types (Spark casts them as the driver does not)."""
    x, y = a.type, b.type
    if pa.types.is_floating(x) or pa.types.is_floating(y):
        raise NotOnDriver(f"floating-point keys ({a.name}, {b.name}) are compared by Spark")
    if x == y and _joinable(x):
        return x
    if pa.types.is_signed_integer(x) and pa.types.is_signed_integer(y):
        return x if x.bit_width >= y.bit_width else y
    exact = [
        (t.precision, t.scale)
        if pa.types.is_decimal128(t)
        else (_INTEGER_DIGITS[t.bit_width], 0)
        if pa.types.is_signed_integer(t)
        else None
        for t in (x, y)
    ]
    if None in exact:
        raise NotOnDriver(f"keys {a.name} ({x}) and {b.name} ({y}): Spark casts them")
    scale = max(s for _, s in exact)
    whole = max(p - s for p, s in exact)
    if whole + scale > 38:
        raise NotOnDriver(f"keys {a.name} ({x}) and {b.name} ({y}) exceed 38 digits together")
    return pa.decimal128(whole + scale, scale)


def _matches(rows: pa.Table, keys: pa.Table, columns: Sequence[str]) -> pa.Table:
    """:func:`ops.rows.null_safe_matches` of ``rows`` and ``keys`` by ``columns`` (named
    alike in both), each pair compared in Spark's common type (:func:`_common_type`)."""
    left, right = rows.select(list(columns)), keys.select(list(columns))
    for i, c in enumerate(columns):
        t = _common_type(left.schema.field(c), right.schema.field(c))
        left = left.set_column(i, c, left.column(c).cast(t))
        right = right.set_column(i, c, right.column(c).cast(t))
    return null_safe_matches(left, right, columns)


def join_delta_local(
    spark,
    join: Join | SemiJoin,
    deltas: Mapping[str, pa.Table],
    lookup: LookupArrow,
    *,
    old: int,
    new: int,
    unchanged: Collection[str] = (),
    store: Any = None,
) -> pa.Table:
    """:func:`ops.join.spark.render_join_delta` computed by the driver: the same delta paths
    advanced together, stages reading one arrangement at one time sharing one lookup, diffs
    multiplied, every update at ``new``; an outer join's unmatched rows and a semi-join's by
    match counts (:func:`_anti_delta_local`); ``NOT IN`` with its state in ``store`` (the
    view's :class:`ops.reduce.spark.StateStore`, :func:`_not_in_local`)."""
    if isinstance(join, SemiJoin) and join.null_aware:
        return _not_in_local(spark, join, deltas, lookup, store)
    if isinstance(join, SemiJoin):
        return _semi_delta_local(spark, join, deltas, lookup, old, new)
    paths = [p for p in plan_paths(join) if join.inputs[p.source].get.collection not in unchanged]
    if not paths:
        raise NotOnDriver("no input of the join changed")
    streams = []
    for path in paths:
        inp = join.inputs[path.source]
        streams.append(_at(prepare_local(spark, inp, deltas[inp.get.collection]), new))
    for depth in range(len(join.inputs) - 1):
        for (arrangement, at), users in shared_lookups(paths, depth, old, new).items():
            keys = pa.concat_tables(
                [
                    streams[i]
                    .select(list(paths[i].stages[depth].stream_keys))
                    .rename_columns(list(arrangement.key))
                    for i in users
                ],
                promote_options="permissive",
            )
            read = {c for i in users for c in join.inputs[paths[i].stages[depth].input].get.columns}
            state = _at(lookup(paths[users[0]].stages[depth], keys, at, read), new)
            for i in users:
                stage = paths[i].stages[depth]
                right = prepare_local(spark, join.inputs[stage.input], state)
                streams[i] = _join_stage_local(spark, streams[i], right, stage)
    parts = [s.select([*join.columns, TIME, DIFF]) for s in streams]
    for side in join.preserve:
        mine, other = join.inputs[side], join.inputs[1 - side]
        unmatched = _anti_delta_local(
            spark, mine, other, key_pairs(join, side), deltas, lookup, old, new
        )
        padding = prepare_local(spark, other, deltas[other.get.collection]).schema
        parts.append(_padded(unmatched, join.columns, padding))
    return pa.concat_tables(parts)


def _padded(rows: pa.Table, columns: Sequence[str], padding: pa.Schema) -> pa.Table:
    """``rows`` as the join's ``columns``: those ``rows`` lacks are NULLs of ``padding``'s
    types (an outer join's unmatched rows)."""
    arrays = [
        rows.column(c) if c in rows.column_names else pa.nulls(rows.num_rows, padding.field(c).type)
        for c in columns
    ]
    return pa.Table.from_arrays(
        [*arrays, rows.column(TIME), rows.column(DIFF)], names=[*columns, TIME, DIFF]
    )


def _semi_delta_local(
    spark, join: SemiJoin, deltas: Mapping[str, pa.Table], lookup: LookupArrow, old: int, new: int
) -> pa.Table:
    """A semi-join's (anti-join's) change: ``Δanti`` by match counts, and
    ``Δsemi = ΔA - Δanti`` since ``semi(A, B) = A - anti(A, B)``."""
    pairs = [(a, b, False) for a, b in join.keys]
    anti = _anti_delta_local(spark, join.input, join.other, pairs, deltas, lookup, old, new)
    if join.anti:
        return anti
    changes = _at(prepare_local(spark, join.input, deltas[join.input.get.collection]), new)
    retracted = anti.set_column(anti.column_names.index(DIFF), DIFF, pc.negate(anti[DIFF]))
    return pa.concat_tables([changes.select(anti.column_names), retracted])


def _not_in_local(
    spark, join: SemiJoin, deltas: Mapping[str, pa.Table], lookup: LookupArrow, store: Any
) -> pa.Table:
    """:func:`ops.join.spark.render_not_in` by the driver while its mode holds: with the
    subquery's row and NULL counts (state, read at ``old`` and appended at ``new``), every
    changed row of the input while the subquery has no row, none while it holds a NULL, else
    the anti-join's change on a non-NULL ``x``. A change of mode recomputes the result from
    the inputs' snapshots: NotOnDriver before anything is written, and Spark does it."""
    if store is None or store.read_rows is None or store.write_rows is None or store.old <= 0:
        raise NotOnDriver("NOT IN's state is not the driver's to read")
    old, new = store.old, store.new
    ((mine, theirs),) = join.keys
    other = prepare_local(spark, join.other, deltas[join.other.get.collection])
    table = not_in_table(join)
    probe = pa.table({GLOBAL_KEY: pa.array([0], pa.int32())})
    state = store.read_rows(table, [GLOBAL_KEY], probe, old)
    if state is None:
        raise NotOnDriver("NOT IN's state is Spark's to read")
    held = state.filter(pc.less_equal(state[TIME], old))
    rows, nulls = (sum(held[c].to_pylist()) for c in ("_rows", "_nulls"))
    diffs = other[DIFF].to_pylist()
    more = sum(diffs)
    more_nulls = sum(n for n, v in zip(diffs, other[theirs].to_pylist(), strict=True) if v is None)
    before, after = not_in_mode(rows, nulls), not_in_mode(rows + more, nulls + more_nulls)
    if before != after:
        raise NotOnDriver(f"NOT IN turns from {before!r} to {after!r}: recomputed by Spark")
    changes = _at(prepare_local(spark, join.input, deltas[join.input.get.collection]), new)
    if after == "anti":
        pairs = [(mine, theirs, False)]
        out = _anti_delta_local(spark, join.input, join.other, pairs, deltas, lookup, old, new)
        out = out.filter(pc.is_valid(out[mine]))
    else:
        out = changes if after == "all" else changes.slice(0, 0)
    counts = {GLOBAL_KEY: [0], "_rows": [more], "_nulls": [more_nulls], TIME: [new]}
    store.write_rows(table, pa.table(counts).select(state.schema.names).cast(state.schema))
    return out.select(changes.column_names)


def _anti_delta_local(
    spark,
    mine_inp: JoinInput,
    other_inp: JoinInput,
    pairs: Sequence[KeyPair],
    deltas: Mapping[str, pa.Table],
    lookup: LookupArrow,
    old: int,
    new: int,
) -> pa.Table:
    """:func:`ops.join.spark._anti_delta` by the driver: the change of ``mine``'s rows without
    a match in ``other``, ``ΔM ▷ O(new) + M(old) ⋈ flip`` with ``flip(k) = [c_new(k) = 0] -
    [c_old(k) = 0]`` over the keys ``other``'s change touched, ``c(k)`` read from its
    arrangement at each time. A NULL in a key matches nothing, but where the pair is NULL-safe.
    ``mine``'s columns at time ``new``."""
    mine_keys, other_keys = [p[0] for p in pairs], [p[1] for p in pairs]
    safe = [p[2] for p in pairs]
    other_stage = count_stage(other_inp, other_keys, safe)
    mine_stage = count_stage(mine_inp, mine_keys, safe)

    def other_rows(keys: pa.Table, at: int) -> pa.Table:
        probe = keys.rename_columns(list(other_stage.arrangement.key))
        rows = _at(lookup(other_stage, probe, at, other_inp.get.columns), new)
        rows = prepare_local(spark, other_inp, rows)
        return rows.filter(pc.not_equal(rows[DIFF], 0))

    d_mine = _at(prepare_local(spark, mine_inp, deltas[mine_inp.get.collection]), new)
    d_other = prepare_local(spark, other_inp, deltas[other_inp.get.collection])
    for m, o in zip(mine_keys, other_keys, strict=True):
        _common_type(d_mine.schema.field(m), d_other.schema.field(o))

    # 1. Changed rows of `mine` that match nothing at the new time.
    part1 = d_mine
    if d_mine.num_rows:
        present = other_rows(_keys_of(d_mine, mine_keys, safe), new)
        present = _keys_of(present, other_keys, safe).rename_columns(mine_keys)
        part1 = d_mine.filter(pc.invert(_matching(d_mine, mine_keys, present)))

    # 2. Keys whose match count crossed zero: `mine`'s old rows with those keys flip.
    touched = _keys_of(d_other, other_keys, safe)
    if not touched.num_rows:
        return part1
    before = _counts(other_rows(touched, old), other_keys)
    after = _counts(other_rows(touched, new), other_keys)
    flipped, flips = [], []
    for k in map(tuple, zip(*touched.to_pydict().values(), strict=True)):
        flip = int(after.get(k, 0) == 0) - int(before.get(k, 0) == 0)
        if flip:
            flipped.append(k)
            flips.append(flip)
    if not flips:
        return part1
    keys = pa.Table.from_pylist(
        [dict(zip(mine_keys, k, strict=True)) for k in flipped],
        schema=touched.rename_columns(mine_keys).schema,
    )
    probe = keys.rename_columns(list(mine_stage.arrangement.key))
    old_rows = _at(lookup(mine_stage, probe, old, mine_inp.get.columns), new)
    old_rows = prepare_local(spark, mine_inp, old_rows)
    matched = _matches(old_rows, keys, mine_keys)
    part2 = old_rows.take(matched["_row"])
    sign = pa.array(flips, pa.int64()).take(matched["_key"])
    part2 = part2.set_column(part2.column_names.index(DIFF), DIFF, pc.multiply(part2[DIFF], sign))
    return pa.concat_tables([part1, part2.select(part1.column_names)])


def _keys_of(rows: pa.Table, keys: Sequence[str], safe: Sequence[bool]) -> pa.Table:
    """The distinct values of ``rows``' ``keys`` that can match: no NULL in a key compared
    by ``=``."""
    return distinct_rows(_strict_keys_present(rows.select(list(keys)), keys, safe))


def _matching(rows: pa.Table, keys: Sequence[str], values: pa.Table) -> pa.Array:
    """Per row of ``rows``, whether its ``keys`` equal a row of ``values`` (NULL equal to
    NULL: ``values`` holds NULLs only where they match)."""
    hit = np.zeros(rows.num_rows, dtype=bool)
    hit[_matches(rows, values, keys)["_row"].to_numpy()] = True
    return pa.array(hit)


def _counts(rows: pa.Table, keys: Sequence[str]) -> dict[tuple, int]:
    """Per value of ``keys`` (NULL a value), the sum of ``rows``' diffs."""
    summed = rows.group_by(list(keys), use_threads=False).aggregate([(DIFF, "sum")])
    columns = [summed[k].to_pylist() for k in keys]
    return dict(zip(zip(*columns, strict=True), summed[f"{DIFF}_sum"].to_pylist(), strict=True))
