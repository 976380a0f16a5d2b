"""A small change's inner join computed by the driver, in Arrow, exactly as Spark would.

Owns the driver's rendering of an inner join's delta paths (:func:`join_delta_local`): the
plan's paths (:mod:`ivm.plan.join`) advanced together, each stage's lookup read once per
arrangement and time, each input's own filter and map and the residual predicates evaluated by
:mod:`ops.stateless.driver`; keys compared by ``<=>`` match NULL with NULL. Outer and
semi-joins, and what Arrow's hash join refuses, raise
:class:`~ivm.errors.NotOnDriver` and are Spark's (:mod:`ops.join.spark`).

Contract in ``(data, time, diff)`` terms, :func:`ops.join.spark.render_join_delta`'s: given
each changed input's updates and the other inputs' arrangements at the times the paths read,
the result is the join's change, every update at the epoch's time ``new`` with the product of
the joined diffs (a product past a bigint raises EvaluationError, as Spark's ANSI mode does).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from ivm.errors import NotOnDriver
from ivm.plan.ir import Join, JoinInput, SemiJoin
from ivm.plan.join import LookupStage, plan_paths, shared_lookups
from ops import DIFF, TIME
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
    for s, r in zip(stage.stream_keys, stage.input_keys, strict=True):
        if stream.schema.field(s).type != right.schema.field(r).type:
            raise NotOnDriver(f"join keys {s} and {r} differ in type: Spark casts them")
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
    Arrow's hash join, or, where a key pair is NULL-safe (``<=>``), the pairs of positions
    of :func:`ops.rows.null_safe_matches`, the rows with a NULL in a key pair compared by
    ``=`` left out first (they match nothing)."""
    if not any(stage.null_safe):
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
    pairs = null_safe_matches(stream, keys, stage.stream_keys)
    left = stream.take(pairs.column("_row"))
    matched = right.take(pairs.column("_key"))
    for name in matched.column_names:
        left = left.append_column(matched.schema.field(name), matched.column(name))
    return left


def join_delta_local(
    spark,
    join: Join,
    deltas: Mapping[str, pa.Table],
    lookup: LookupArrow,
    *,
    old: int,
    new: int,
    unchanged: Collection[str] = (),
) -> pa.Table:
    """:func:`ops.join.spark.render_join_delta` of an inner join, computed by the driver: the same
    delta paths advanced together, stages reading one arrangement at one time sharing one
    lookup, diffs multiplied, every update at ``new``. Outer and semi-joins are Spark's."""
    if isinstance(join, SemiJoin) or join.preserve:
        raise NotOnDriver("outer and semi-joins are computed by Spark")
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
    return pa.concat_tables([s.select([*join.columns, TIME, DIFF]) for s in streams])
