"""Arrangement lookups (``ops.arrange.lookup``) on a real Delta arrangement.

Both lookup shapes must return the arrangement's state at the time asked for exactly the keys
asked: a few keys pushed down as ``key IN (...)`` (the page index skips pages, and the scan
runs without Parquet's dictionary filter), and many keys read once and semi-joined.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

import ops.arrange as arrange
from ops import DIFF, TIME
from resources.lake import open_table

pytestmark = pytest.mark.spark

ROWS = 60_000


DICTIONARY_FILTER = "parquet.filter.dictionary.enabled"


def _dictionary_filter(df) -> list[str | None]:
    """Per Parquet scan ``df`` ran: its dictionary-filter reader option (None: not set)."""
    df.collect()
    scans = [n for n in arrange.executed_nodes(df) if n.nodeName().startswith("Scan parquet")]
    options = [s.relation().options() for s in scans]
    return [o.apply(DICTIONARY_FILTER) if o.contains(DICTIONARY_FILTER) else None for o in options]


@pytest.fixture(scope="module")
def arrangement(spark, tmp_path_factory) -> tuple[str, Counter, Counter]:
    """An arrangement by ``k`` written at epochs 1 and 2 (epoch 2 deletes rows), and its
    states at epochs 1 and 2 as multisets of ``(k, v)``."""
    uri = str(Path(tmp_path_factory.mktemp("arr")) / "t__by__k")
    first = spark.range(ROWS).select(
        (F.col("id") % 20_000).alias("k"),
        (F.col("id") * 7 % 13).alias("v"),
        F.lit(1).cast("bigint").alias(TIME),
        F.lit(1).cast("bigint").alias(DIFF),
    )
    arrange.write_updates(first, uri, ["k"], app_id="t", epoch=1, metadata={}, rows_hint=ROWS)
    second = spark.range(0, ROWS, 97).select(
        (F.col("id") % 20_000).alias("k"),
        (F.col("id") * 7 % 13).alias("v"),
        F.lit(2).cast("bigint").alias(TIME),
        F.lit(-1).cast("bigint").alias(DIFF),
    )
    arrange.write_updates(second, uri, ["k"], app_id="t", epoch=2, metadata={}, rows_hint=ROWS)
    state: Counter = Counter()
    for i in range(ROWS):
        state[(i % 20_000, i * 7 % 13)] += 1
    first_state = Counter(state)
    for i in range(0, ROWS, 97):
        state[(i % 20_000, i * 7 % 13)] -= 1
    return uri, first_state, +state


@pytest.mark.parametrize(("n_keys", "pushed"), [(7, True), (3_000, False)])
def test_lookup_returns_the_state_of_exactly_the_keys_asked(
    spark, arrangement, n_keys: int, pushed: bool
) -> None:
    uri, first_state, state = arrangement
    keys = random.Random(n_keys).sample(range(20_000), n_keys)
    wanted = spark.createDataFrame([(k,) for k in keys], "k bigint")
    schema = pa.schema(open_table(uri).schema().to_arrow())
    for as_of, expected in ((1, first_state), (2, state)):
        df, stats = arrange.lookup(spark, uri, schema, ["k"], wanted, as_of, measure=True)
        got = Counter({(r["k"], r["v"]): r[DIFF] for r in df.collect()})
        assert got == Counter({kv: n for kv, n in expected.items() if kv[0] in set(keys)})
    assert stats.keys == n_keys
    if pushed:
        # Pushed down: the page index leaves a few pages per key, and the scan skips
        # Parquet's dictionary filter.
        assert 0 < stats.rows_scanned <= n_keys * 2 * 2 * arrange.PAGE_ROWS, stats
        assert _dictionary_filter(df) == ["false"]
    else:
        assert stats.rows_scanned == stats.rows_total == ROWS + len(range(0, ROWS, 97))
        assert _dictionary_filter(df) == [None]


def test_lookup_of_some_columns_projects_then_sums(spark, arrangement) -> None:
    """With ``columns``, the rows are the state projected to the key and those columns (their
    multiplicities summed), and the scans read no other column."""
    uri, _, state = arrangement
    keys = random.Random(3).sample(range(20_000), 50)
    wanted = spark.createDataFrame([(k,) for k in keys], "k bigint")
    schema = pa.schema(open_table(uri).schema().to_arrow())
    df, _ = arrange.lookup(spark, uri, schema, ["k"], wanted, 2, columns=())
    assert df.columns == ["k", DIFF]
    expected: Counter = Counter()
    for (k, _v), n in state.items():
        if k in set(keys):
            expected[k] += n
    assert Counter({r["k"]: r[DIFF] for r in df.collect()}) == expected
    scans = [n for n in arrange.executed_nodes(df) if n.nodeName().startswith("Scan parquet")]
    assert scans
    for scan in scans:
        assert sorted(scan.requiredSchema().fieldNames()) == sorted(["k", TIME, DIFF])
