"""Rendering of joins: from scratch (snapshots joined by Spark) and by delta paths.

From scratch: ``A ⋈ B ⋈ C`` over the inputs' snapshots (diff = multiplicity), joined along
the first path's order. Incremental (seed 001): one path per input; path ``i`` starts from
``ΔI`` and, stage by stage, looks up the next input's arrangement for the keys present in the
stream only, at the new time for inputs before ``i`` and the old time for inputs after it.
The paths advance together, stage by stage, and the stages that read one arrangement at one
time share one lookup for the union of their keys. Diffs multiply; every output update is
stamped with the new time. Both renderings apply each input's own filter and map before it
meets the others, and each residual predicate as soon as all its inputs are joined.

Outer joins add each preserved input's unmatched rows, and semi/anti joins keep an input's
rows with (without) a match. Neither is bilinear, so their change is computed from per-key
match counts (:func:`_anti_delta`): the changed rows checked at the new time, plus the old
rows of keys whose count in the other input crossed zero; counts and rows come from the
same shared arrangements, at the old and new times.

Filters, maps and residual predicates reach Spark as :func:`ops.expressions.spark_sql` text;
:mod:`ops.stateless.spark` dispatches joins here, and this module does not import it back.

Contract in ``(data, time, diff)`` terms: ``render_join_delta(old, new)`` returns exactly
``J(new) - J(old)`` for the join ``J``, as updates at time ``new``, given the inputs' updates
in ``(old, new]`` and arrangements readable at ``old`` and ``new``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from functools import reduce
from typing import Protocol

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ivm.errors import InvariantViolation
from ivm.plan.ir import Join, JoinInput, SemiJoin
from ivm.plan.join import LookupStage, count_stage, key_pairs, plan_paths, shared_lookups
from ivm.plan.reduce import GLOBAL_KEY, not_in_mode, not_in_table
from ops import DIFF, TIME
from ops.expressions import spark_sql
from ops.reduce.spark import StateStore, join_null_safe, materialize


class Lookup(Protocol):
    """``(stage, keys, as_of) -> rows`` of the stage's arrangement whose key is in ``keys``, as
    ``(arrangement columns..., _diff)`` consolidated at ``as_of``; with ``columns``, only the
    key and those columns (the multiset projected, then consolidated)."""

    def __call__(
        self,
        stage: LookupStage,
        keys: DataFrame,
        as_of: int,
        *,
        columns: Collection[str] | None = None,
    ) -> DataFrame: ...


_RIGHT_DIFF = "_diff_right"


def prepare(inp: JoinInput, df: DataFrame) -> DataFrame:
    """An input's own filter and map: collection columns -> the join's names for them."""
    if inp.predicate is not None:
        df = df.where(F.expr(spark_sql(inp.predicate)))
    cols = [F.expr(spark_sql(e)).alias(n) for n, e in inp.outputs]
    return df.select(*cols, TIME, DIFF)


def _condition(left: DataFrame, right: DataFrame, pairs: Sequence[tuple]) -> Column:
    """Each pair ``(left column, right column[, NULL-safe])`` equal: by ``=``, or by ``<=>``
    where the pair says NULL matches NULL."""

    def equal(pair: tuple) -> Column:
        a, b = left[f"`{pair[0]}`"], right[f"`{pair[1]}`"]
        return a.eqNullSafe(b) if len(pair) > 2 and pair[2] else a == b

    return reduce(lambda a, b: a & b, [equal(p) for p in pairs])


def _join_stage(stream: DataFrame, right: DataFrame, stage: LookupStage) -> DataFrame:
    right = right.drop(TIME).withColumnRenamed(DIFF, _RIGHT_DIFF)
    out = stream.join(right, _condition(stream, right, stage.matches()), "inner")
    out = out.withColumn(DIFF, F.col(DIFF) * F.col(_RIGHT_DIFF)).drop(_RIGHT_DIFF)
    for r in stage.residual:
        out = out.where(F.expr(spark_sql(r)))
    return out


def _ordered(df: DataFrame, join: Join) -> DataFrame:
    return df.select(*[F.col(f"`{c}`") for c in join.columns], TIME, DIFF)


def _pad(rows: DataFrame, join: Join, side: int, other_schema: DataFrame) -> DataFrame:
    """Unmatched rows of ``side`` with the other input's columns as typed NULLs."""
    types = {f.name: f.dataType for f in other_schema.schema.fields}
    cols = []
    for c in join.columns:
        if c in join.inputs[side].columns:
            cols.append(F.col(f"`{c}`"))
        else:
            cols.append(F.lit(None).cast(types[c]).alias(c))
    return rows.select(*cols, TIME, DIFF)


def render_join_snapshot(join: Join | SemiJoin, inputs: Mapping[str, DataFrame]) -> DataFrame:
    """The join of the inputs' snapshots (updates all at one time), by Spark; for an outer
    join, plus each preserved input's rows without a match, padded with NULLs; for a
    semi-join, the input's rows with (anti: without) a match."""
    if isinstance(join, SemiJoin):
        mine = prepare(join.input, inputs[join.input.get.collection])
        other = prepare(join.other, inputs[join.other.get.collection])
        keys = other.select(*[F.col(f"`{b}`") for _, b in join.keys]).distinct()
        how = "left_anti" if join.anti else "left_semi"
        return mine.join(keys, _condition(mine, keys, list(join.keys)), how)
    (first, *_) = plan_paths(join)
    stream = prepare(join.inputs[first.source], inputs[join.inputs[first.source].get.collection])
    for stage in first.stages:
        inp = join.inputs[stage.input]
        stream = _join_stage(stream, prepare(inp, inputs[inp.get.collection]), stage)
    out = _ordered(stream, join)
    for side in join.preserve:
        mine = prepare(join.inputs[side], inputs[join.inputs[side].get.collection])
        other = prepare(join.inputs[1 - side], inputs[join.inputs[1 - side].get.collection])
        pairs = key_pairs(join, side)
        keys = other.select(*[F.col(f"`{p[1]}`") for p in pairs]).distinct()
        unmatched = mine.join(keys, _condition(mine, keys, pairs), "left_anti")
        out = out.unionByName(_pad(unmatched, join, side, other))
    return out


def render_join_delta(
    join: Join | SemiJoin,
    deltas: Mapping[str, DataFrame],
    lookup: Lookup,
    *,
    old: int,
    new: int,
    store: StateStore | None = None,
    snapshot: Callable[[str, int], DataFrame] | None = None,
    unchanged: Collection[str] = (),
) -> DataFrame:
    """The join's updates in ``(old, new]`` by one delta path per input (see module doc).

    ``old`` 0 (a build: ``deltas`` are the inputs' snapshots) joins from scratch. ``store``
    and ``snapshot`` serve ``NOT IN`` (:func:`render_not_in`). The paths of inputs whose
    collection is in ``unchanged`` are not run: their change sums to nothing on the columns
    the input reads, so their terms do too (no lookup, no Spark job).
    """
    if isinstance(join, SemiJoin) and join.null_aware:
        if store is None or snapshot is None:
            raise InvariantViolation("NOT IN needs its state store and input snapshots")
        return render_not_in(join, deltas, lookup, store, snapshot)
    if old == 0:
        return render_join_snapshot(join, deltas)
    if isinstance(join, SemiJoin):
        anti = _anti_delta(join.input, join.other, list(join.keys), deltas, lookup, old, new)
        if join.anti:
            return anti
        # semi(A, B) = A - anti(A, B), so Δsemi = ΔA - Δanti.
        changes = prepare(join.input, deltas[join.input.get.collection]).withColumn(
            TIME, F.lit(new).cast("bigint")
        )
        return changes.unionByName(anti.withColumn(DIFF, -F.col(DIFF)))
    paths = plan_paths(join)
    paths = tuple(p for p in paths if join.inputs[p.source].get.collection not in unchanged)
    if not paths:  # every input's change is nothing: the join's is empty (shaped as a build's)
        return render_join_snapshot(join, {c: d.limit(0) for c, d in deltas.items()})
    streams = []
    for path in paths:
        inp = join.inputs[path.source]
        delta = prepare(inp, deltas[inp.get.collection])
        streams.append(delta.withColumn(TIME, F.lit(new).cast("bigint")))
    for depth in range(len(join.inputs) - 1):
        # Stages reading one arrangement at one time share a single lookup (one scan).
        for (_, at), users in shared_lookups(paths, depth, old, new).items():
            keys = [_stage_keys(streams[i], paths[i].stages[depth]) for i in users]
            # Only the columns these inputs read: the scan decodes no other column.
            read = {c for i in users for c in join.inputs[paths[i].stages[depth].input].get.columns}
            stages = [paths[i].stages[depth] for i in users]  # a NULL-safe one keeps NULL keys
            state = lookup(
                next((st for st in stages if any(st.null_safe)), stages[0]),
                reduce(DataFrame.unionByName, keys),
                at,
                columns=read,
            )
            if len(users) > 1:
                state = materialize(state)
            for i in users:
                stage = paths[i].stages[depth]
                right = prepare(join.inputs[stage.input], state.withColumn(TIME, F.lit(new)))
                streams[i] = _join_stage(streams[i], right, stage)
                if depth < len(paths[i].stages) - 1:
                    # The next lookup collects this stream's keys, and the view's updates read
                    # it again: compute it (and the lookup scans behind it) once.
                    streams[i] = materialize(streams[i])
    parts = [_ordered(stream, join) for stream in streams]
    for side in join.preserve:
        pairs = key_pairs(join, side)
        mine, other = join.inputs[side], join.inputs[1 - side]
        unmatched = _anti_delta(mine, other, pairs, deltas, lookup, old, new)
        other_schema = prepare(other, deltas[other.get.collection])
        parts.append(_pad(unmatched, join, side, other_schema))
    return reduce(DataFrame.unionByName, parts)


def _stage_keys(stream: DataFrame, stage: LookupStage) -> DataFrame:
    """The stream's columns a stage matches, named as the arrangement's key."""
    return stream.select(
        *[
            F.col(f"`{s}`").alias(k)
            for s, k in zip(stage.stream_keys, stage.arrangement.key, strict=True)
        ]
    )


def _anti_delta(
    mine_inp: JoinInput,
    other_inp: JoinInput,
    pairs: Sequence[tuple],
    deltas: Mapping[str, DataFrame],
    lookup: Lookup,
    old: int,
    new: int,
) -> DataFrame:
    """The change of ``mine``'s rows without a match in ``other`` (anti-join), by match counts:

    ``U(new) - U(old) = ΔM ▷ O(new) + M(old) ⋈ flip``, where ``flip(k) = [c_new(k) = 0] -
    [c_old(k) = 0]`` for the keys the other input's change touched, and ``c(k)`` counts the
    other input's rows with key ``k`` (looked up in its arrangement at old and new). Rows of
    ``mine`` whose key is NULL never match, but on a NULL-safe pair (``(mine, other, True)``),
    where NULL matches NULL. Returns ``mine``'s columns at time ``new``.
    """
    mine_keys = [p[0] for p in pairs]
    other_keys = [p[1] for p in pairs]
    safe = [len(p) > 2 and p[2] for p in pairs]
    other_stage = count_stage(other_inp, other_keys, safe)
    mine_stage = count_stage(mine_inp, mine_keys, safe)

    def other_rows(keys: DataFrame, at: int) -> DataFrame:
        return prepare(other_inp, lookup(other_stage, keys, at).withColumn(TIME, F.lit(new)))

    def renamed(df: DataFrame, cols: list[str], names: tuple[str, ...]) -> DataFrame:
        return df.select(*[F.col(f"`{c}`").alias(k) for c, k in zip(cols, names, strict=True)])

    # 1. Changed rows of `mine` that match nothing at the new time.
    d_mine = prepare(mine_inp, deltas[mine_inp.get.collection])
    matches_new = other_rows(renamed(d_mine, mine_keys, other_stage.arrangement.key), new)
    present = matches_new.select(*[F.col(f"`{o}`") for o in other_keys]).distinct()
    part1 = d_mine.join(present, _condition(d_mine, present, pairs), "left_anti")

    # 2. Keys whose match count crossed zero: `mine`'s old rows with those keys flip.
    d_other = prepare(other_inp, deltas[other_inp.get.collection])
    touched = renamed(d_other, other_keys, other_stage.arrangement.key)  # lookups only

    def counts(at: int, name: str) -> DataFrame:
        rows = other_rows(touched, at)
        return rows.groupBy(*[F.col(f"`{o}`") for o in other_keys]).agg(F.sum(DIFF).alias(name))

    plain = [o for o, same in zip(other_keys, safe, strict=True) if not same]
    keyed = d_other.select(*[F.col(f"`{o}`") for o in other_keys])
    keyed = (keyed.dropna(subset=plain) if plain else keyed).distinct()
    # NULL-safe: keyed holds no NULL in a plain key, so only NULL-safe keys match NULL
    flips = (
        join_null_safe(
            join_null_safe(keyed, counts(new, "_c_new"), other_keys, "left"),
            counts(old, "_c_old"),
            other_keys,
            "left",
        )
        .select(
            *[F.col(f"`{o}`") for o in other_keys],
            (
                F.when(F.coalesce(F.col("_c_new"), F.lit(0)) == 0, 1).otherwise(0)
                - F.when(F.coalesce(F.col("_c_old"), F.lit(0)) == 0, 1).otherwise(0)
            ).alias("_flip"),
        )
        .where(F.col("_flip") != 0)
    )
    flip_keys = renamed(flips, other_keys, mine_stage.arrangement.key)
    old_rows = prepare(mine_inp, lookup(mine_stage, flip_keys, old).withColumn(TIME, F.lit(new)))
    part2 = (
        old_rows.join(flips, _condition(old_rows, flips, pairs), "inner")
        .withColumn(DIFF, F.col(DIFF) * F.col("_flip"))
        .select(*[F.col(f"`{c}`") for c in mine_inp.columns], TIME, DIFF)
    )
    return part1.unionByName(part2).withColumn(TIME, F.lit(new).cast("bigint"))


def render_not_in(
    join: SemiJoin,
    deltas: Mapping[str, DataFrame],
    lookup: Lookup,
    store: StateStore,
    snapshot: Callable[[str, int], DataFrame],
) -> DataFrame:
    """``a.x NOT IN (SELECT b.y ...)`` with SQL's NULL rules, from the inputs' updates.

    With ``n`` the subquery's rows and ``z`` its NULL keys (state, summed per epoch), the
    result is every row of ``a`` when ``n = 0``, none when ``z > 0``, and otherwise the rows
    whose ``x`` is not NULL and matches nothing (the anti-join, maintained by match counts).
    While that mode holds the change is proportional; when it flips (the subquery empties,
    gains or loses its last NULL) the result is recomputed from the inputs' states.
    """
    old, new = store.old, store.new
    (mine, theirs) = join.keys[0]
    other = prepare(join.other, deltas[join.other.get.collection])
    table = not_in_table(join)
    counts = other.agg(
        F.coalesce(F.sum(DIFF), F.lit(0)).cast("bigint").alias("_rows"),
        F.coalesce(F.sum(F.when(F.col(f"`{theirs}`").isNull(), F.col(DIFF))), F.lit(0))
        .cast("bigint")
        .alias("_nulls"),
    ).select(
        F.lit(0).cast("int").alias(GLOBAL_KEY),
        "_rows",
        "_nulls",
        F.lit(new).cast("bigint").alias(TIME),
    )
    store.write(table, counts)
    probe = store.spark.range(1).select(F.lit(0).cast("int").alias(GLOBAL_KEY))
    state = store.read(table, [GLOBAL_KEY], probe, new).collect()

    def mode(at: int) -> str | None:
        if at <= 0:
            return None
        rows = sum(r["_rows"] for r in state if r[TIME] <= at)
        return not_in_mode(rows, sum(r["_nulls"] for r in state if r[TIME] <= at))

    def stamped(df: DataFrame, sign: int = 1) -> DataFrame:
        cols = [F.col(f"`{c}`") for c in join.input.columns]
        return df.select(
            *cols, F.lit(new).cast("bigint").alias(TIME), (F.col(DIFF) * sign).alias(DIFF)
        )

    def full(at: int, how: str | None) -> DataFrame:
        if how is None or how == "none":  # before the view existed, or a NULL in the subquery
            return prepare(join.input, deltas[join.input.get.collection]).limit(0)
        rows = prepare(join.input, snapshot(join.input.get.collection, at))
        if how == "all":
            return rows
        keys = (
            prepare(join.other, snapshot(join.other.get.collection, at))
            .select(F.col(f"`{theirs}`"))
            .dropna()
            .distinct()
        )
        return rows.where(F.col(f"`{mine}`").isNotNull()).join(
            keys, _condition(rows, keys, [(mine, theirs)]), "left_anti"
        )

    before, after = mode(old), mode(new)
    if before == after == "anti":
        delta = _anti_delta(join.input, join.other, list(join.keys), deltas, lookup, old, new)
        return stamped(delta.where(F.col(f"`{mine}`").isNotNull()))
    if before == after == "all":
        return stamped(prepare(join.input, deltas[join.input.get.collection]))
    if before == after == "none":
        return stamped(prepare(join.input, deltas[join.input.get.collection]).limit(0))
    return stamped(full(new, after)).unionByName(stamped(full(old, before), -1))
