"""Rendering of a Join: from scratch (snapshots joined by Spark) and by delta paths.

From scratch: ``A ⋈ B ⋈ C`` over the inputs' snapshots (diff = multiplicity), joined along
the first path's order. Incremental (seed 001): one path per input; path ``i`` starts from
``ΔI`` and, stage by stage, looks up the next input's arrangement for the keys present in the
stream only, at the new time for inputs before ``i`` and the old time for inputs after it.
Diffs multiply; every output update is stamped with the new time. Both renderings apply each
input's own filter and map before it meets the others, and each residual predicate as soon as
all its inputs are joined.

Contract in ``(data, time, diff)`` terms: ``render_join_delta(old, new)`` returns exactly
``J(new) - J(old)`` for the join ``J``, as updates at time ``new``, given the inputs' updates
in ``(old, new]`` and arrangements readable at ``old`` and ``new``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ivm.plan.ir import Join, JoinInput
from ivm.plan.join import LookupStage, plan_paths
from ops import DIFF, TIME
from ops.stateless import spark_sql

Lookup = Callable[[LookupStage, DataFrame, int], DataFrame]
"""``(stage, keys, as_of) -> rows`` of the stage's arrangement whose key is in ``keys``, as
``(arrangement columns..., _diff)`` consolidated at ``as_of``."""

_RIGHT_DIFF = "_diff_right"


def prepare(inp: JoinInput, df: DataFrame) -> DataFrame:
    """An input's own filter and map: collection columns -> the join's names for them."""
    if inp.predicate is not None:
        df = df.where(F.expr(spark_sql(inp.predicate)))
    cols = [F.expr(spark_sql(e)).alias(n) for n, e in inp.outputs]
    return df.select(*cols, TIME, DIFF)


def _condition(left: DataFrame, right: DataFrame, pairs) -> Column:
    return reduce(lambda a, b: a & b, [left[f"`{lk}`"] == right[f"`{rk}`"] for lk, rk in pairs])


def _join_stage(stream: DataFrame, right: DataFrame, stage: LookupStage) -> DataFrame:
    right = right.drop(TIME).withColumnRenamed(DIFF, _RIGHT_DIFF)
    pairs = list(zip(stage.stream_keys, stage.input_keys, strict=True))
    out = stream.join(right, _condition(stream, right, pairs), "inner")
    out = out.withColumn(DIFF, F.col(DIFF) * F.col(_RIGHT_DIFF)).drop(_RIGHT_DIFF)
    for r in stage.residual:
        out = out.where(F.expr(spark_sql(r)))
    return out


def _ordered(df: DataFrame, join: Join) -> DataFrame:
    return df.select(*[F.col(f"`{c}`") for c in join.columns], TIME, DIFF)


def render_join_snapshot(join: Join, inputs: Mapping[str, DataFrame]) -> DataFrame:
    """The join of the inputs' snapshots (updates all at one time), by Spark."""
    (first, *_) = plan_paths(join)
    stream = prepare(join.inputs[first.source], inputs[join.inputs[first.source].get.collection])
    for stage in first.stages:
        inp = join.inputs[stage.input]
        stream = _join_stage(stream, prepare(inp, inputs[inp.get.collection]), stage)
    return _ordered(stream, join)


def render_join_delta(
    join: Join, deltas: Mapping[str, DataFrame], lookup: Lookup, *, old: int, new: int
) -> DataFrame:
    """The join's updates in ``(old, new]`` by one delta path per input (see module doc)."""
    parts = []
    for path in plan_paths(join):
        inp = join.inputs[path.source]
        stream = prepare(inp, deltas[inp.get.collection]).withColumn(
            TIME, F.lit(new).cast("bigint")
        )
        for stage in path.stages:
            keys = stream.select(
                *[
                    F.col(f"`{s}`").alias(k)
                    for s, k in zip(stage.stream_keys, stage.arrangement.key, strict=True)
                ]
            )
            state = lookup(stage, keys, new if stage.as_of == "new" else old)
            right = prepare(join.inputs[stage.input], state.withColumn(TIME, F.lit(new)))
            stream = _join_stage(stream, right, stage)
        parts.append(_ordered(stream, join))
    return reduce(DataFrame.unionByName, parts)
