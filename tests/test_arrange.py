"""Arrangements on real Delta tables: lookups (``ops.arrange.lookup``) and builds.

Both lookup shapes must return the arrangement's state at the time asked for exactly the keys
asked: a few keys pushed down as ``key IN (...)`` (the page index skips pages, and the scan
runs without Parquet's dictionary filter), and many keys read once and semi-joined. A build
must lay out sorted files with disjoint key ranges, by sorting a source already in key order
where it is, or by range-partitioning any other.
"""

from __future__ import annotations

import random
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, WriterProperties, write_deltalake
from pyspark.sql import functions as F

import ivm.policy
import ops.arrange as arrange
from engine.facade import Engine
from engine.oracle import compare_views
from ivm.policy import Policy
from ops import DIFF, TIME
from resources.filecache import FileCache
from resources.lake import (
    DataFile,
    driver_reads,
    key_ordered,
    local_path,
    open_table,
    spark_compatible_schema,
    table_files,
)
from tests.lakegen import parquet_writers
from tests.marks import by_turns

pytestmark = pytest.mark.spark

ROWS = 60_000


DICTIONARY_FILTER = "parquet.filter.dictionary.enabled"


def _dictionary_filter(df) -> list[str | None]:
    """Per Parquet scan ``df`` ran: its dictionary-filter reader option (None: not set)."""
    df.collect()
    scans = [n for n in arrange.executed_nodes(df) if n.nodeName().startswith("Scan parquet")]
    options = [s.relation().options() for s in scans]
    return [o.apply(DICTIONARY_FILTER) if o.contains(DICTIONARY_FILTER) else None for o in options]


@pytest.fixture(
    scope="module", params=[False, True], ids=["written by Spark", "written by the driver"]
)
def arrangement(spark, tmp_path_factory, request) -> tuple[str, Counter, Counter]:
    """An arrangement by ``k`` written at epochs 1 and 2 (epoch 2 deletes rows), and its
    states at epochs 1 and 2 as multisets of ``(k, v)``; its files written by Spark, or by
    the driver (``small``: an epoch's change), which must lay out the same pages."""
    uri = str(Path(tmp_path_factory.mktemp("arr")) / "t__by__k")
    first = spark.range(ROWS).select(
        (F.col("id") % 20_000).alias("k"),
        (F.col("id") * 7 % 13).alias("v"),
        F.lit(1).cast("bigint").alias(TIME),
        F.lit(1).cast("bigint").alias(DIFF),
    )
    small = request.param
    arrange.write_updates(
        first, uri, ["k"], app_id="t", epoch=1, metadata={}, rows_hint=ROWS, small=small
    )
    second = spark.range(0, ROWS, 97).select(
        (F.col("id") % 20_000).alias("k"),
        (F.col("id") * 7 % 13).alias("v"),
        F.lit(2).cast("bigint").alias(TIME),
        F.lit(-1).cast("bigint").alias(DIFF),
    )
    arrange.write_updates(
        second, uri, ["k"], app_id="t", epoch=2, metadata={}, rows_hint=ROWS, small=small
    )
    assert parquet_writers(DeltaTable(uri)) == {"parquet-cpp-arrow" if small else "parquet-mr"}
    state: Counter = Counter()
    for i in range(ROWS):
        state[(i % 20_000, i * 7 % 13)] += 1
    first_state = Counter(state)
    for i in range(0, ROWS, 97):
        state[(i % 20_000, i * 7 % 13)] -= 1
    return uri, first_state, +state


@pytest.fixture
def policy() -> Iterator[Callable[..., Policy]]:
    """``policy(**changes)`` puts those changes to the policy in force for the rest of the
    test (:func:`ivm.policy.using`, left when the test ends)."""
    with ExitStack() as stack:
        yield lambda **changes: stack.enter_context(ivm.policy.using(**changes))


@pytest.fixture(autouse=True)
def no_file_cache(monkeypatch) -> FileCache:
    """Lookups here read files unless a test gives them a cache of their own (the process's
    cache would carry decoded files from one test to the next)."""
    cache = FileCache(0)
    monkeypatch.setattr(arrange, "FILES", cache)
    return cache


@pytest.mark.parametrize(
    ("n_keys", "pushed", "driver"),
    [
        pytest.param(7, True, False, id="pushed down"),
        by_turns(3_000, False, False, id="read once by Spark"),
        pytest.param(3_000, False, True, id="read once by the driver"),
    ],
)
def test_lookup_returns_the_state_of_exactly_the_keys_asked(
    spark, arrangement, n_keys: int, pushed: bool, driver: bool, policy
) -> None:
    if not driver:
        policy(driver_lookup_rows=0)
    uri, first_state, state = arrangement
    before = driver_reads()
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
        page_rows = ivm.policy.current().page_rows
        assert 0 < stats.rows_scanned <= n_keys * 2 * 2 * page_rows, stats
        assert _dictionary_filter(df) == ["false"]
    else:
        assert stats.rows_scanned == stats.rows_total == ROWS + len(range(0, ROWS, 97))
        if driver:  # the bench counts what the driver decoded: epoch 1's file, then both
            reads = driver_reads()
            decoded = sum(reads[f] - before.get(f, 0) for f in reads)
            assert decoded == ROWS + stats.rows_total
        # Read by the driver: Spark scans no file (the rows come as a local relation).
        assert _dictionary_filter(df) == ([] if driver else [None])


def test_the_policy_chooses_each_lookup_strategy(tmp_path, monkeypatch) -> None:
    """``lookup_strategy`` decides from sizes known before reading: pushed down while the
    keys' pages times ``push_ratio`` stay under the live rows, unless the driver holds the
    files (a file of at most ``cold_file_rows`` rows counts as held); else read once, by the
    driver unless a key is NULL or ``driver_lookup_rows`` is 0 (``Policy.spark_only``)."""
    S, choose = arrange.Strategy, arrange.lookup_strategy
    schema = pa.schema([("K", pa.int64()), ("v", pa.int64())])
    default = Policy()
    assert default.push_ratio * 250 * default.page_rows == 1_000_000  # the boundary below
    assert choose(249, False, 1_000_000, [], schema, default)[0] is S.PUSHED_DOWN
    assert choose(250, False, 1_000_000, [], schema, default)[0] is S.DRIVER_READ_ONCE
    assert choose(125, False, 1_000_000, [], schema, default.replace(push_ratio=8))[0] is (
        S.DRIVER_READ_ONCE
    )
    assert choose(250, True, 1_000_000, [], schema, default)[0] is S.SPARK_READ_ONCE
    for off in (default.replace(driver_lookup_rows=0), Policy.spark_only()):
        strategy, why = choose(250, False, 1_000_000, [], schema, off)
        assert strategy is S.SPARK_READ_ONCE and "driver_lookup_rows = 0" in why
    assert choose(0, False, 1_000_000, [], schema, default) == (S.PUSHED_DOWN, "no key")
    assert choose(0, True, 1_000_000, [], schema, default) == (S.PUSHED_DOWN, "no key but NULL")

    small = _parquet(tmp_path / "small.parquet", [list(range(10))])
    assert choose(3, False, 1_000_000, [small], schema, default)[0] is S.PUSHED_DOWN  # no cache
    monkeypatch.setattr(arrange, "FILES", FileCache(1 << 30))
    in_memory = choose(3, False, 1_000_000, [small], schema, default)
    assert in_memory[0] is S.DRIVER_MEMORY, in_memory  # small enough to decode: held
    cold = default.replace(cold_file_rows=0)  # neither held nor small: Spark's scan
    assert choose(3, False, 1_000_000, [small], schema, cold)[0] is S.PUSHED_DOWN
    assert choose(3, True, 1_000_000, [small], schema, default)[0] is S.PUSHED_DOWN
    for off in (default.replace(driver_lookup_rows=0), Policy.spark_only()):
        assert choose(3, False, 1_000_000, [small], schema, off)[0] is S.PUSHED_DOWN


def _stored_with(keys: list[int], as_of: int) -> int:
    """How many updates of the ``arrangement`` fixture up to ``as_of`` hold one of ``keys``."""
    wanted = set(keys)
    ids = [*range(ROWS), *(range(0, ROWS, 97) if as_of == 2 else ())]
    return sum(1 for i in ids if i % 20_000 in wanted)


def _cached(arrangement, monkeypatch) -> tuple[FileCache, pa.Schema, list, int]:
    """A cache of its own for the lookups of a test, and the arrangement's schema, files and
    rows."""
    cache = FileCache(1 << 30)
    monkeypatch.setattr(arrange, "FILES", cache)
    uri = arrangement[0]
    files = table_files(uri)
    schema = pa.schema(open_table(uri).schema().to_arrow())
    return cache, schema, files, sum(f.num_records for f in files)


def test_lookups_probe_the_files_the_driver_holds(spark, arrangement, monkeypatch) -> None:
    """With a cache, a read-once lookup decodes each file whole once; later lookups, of many
    keys or of few (which would otherwise be pushed down into a Spark scan), probe the
    decoded rows in memory: the same state, no Parquet scan, nothing decoded again."""
    cache, schema, files, total = _cached(arrangement, monkeypatch)
    uri, first_state, state = arrangement
    big = max(f.num_records for f in files)
    assert big > ivm.policy.current().cold_file_rows  # else a few keys would probe it at once

    def look(keys: list[int], as_of: int):
        wanted = spark.createDataFrame([(k,) for k in keys], "k bigint")
        before = driver_reads()
        df, stats = arrange.lookup(spark, uri, schema, ["k"], wanted, as_of, measure=True)
        expected = first_state if as_of == 1 else state
        got = Counter({(r["k"], r["v"]): r[DIFF] for r in df.collect()})
        assert got == Counter({kv: n for kv, n in expected.items() if kv[0] in set(keys)})
        after = driver_reads()
        scans = [n for n in arrange.executed_nodes(df) if n.nodeName().startswith("Scan")]
        return stats, sum(after[f] - before.get(f, 0) for f in after), scans

    few = random.Random(7).sample(range(20_000), 7)
    stats, decoded, scans = look(few, 2)  # files not held: pushed down into Spark's scan
    assert scans and decoded == 0 and cache.stats.misses == 0
    stats, decoded, scans = look(random.Random(8).sample(range(20_000), 3_000), 2)
    assert not scans and decoded == stats.rows_scanned == total and stats.rows_in_memory == 0
    assert cache.stats.misses == len(files) and cache.held_bytes > 0
    for as_of in (1, 2):
        stats, decoded, scans = look(few, as_of)
        assert not scans and decoded == stats.rows_scanned == 0
        # by binary search: the rows holding the keys, not the files' rows
        assert stats.rows_in_memory == _stored_with(few, as_of) < big / 100
    assert cache.stats.misses == len(files)
    cache.set_budget(0)  # nothing held: a few keys go back to Spark's scan
    assert cache.held_bytes == 0
    stats, decoded, scans = look(few, 2)
    assert scans and decoded == 0


@pytest.mark.parametrize("null_safe", [False, True])
def test_repeated_keys_are_made_distinct_on_the_driver(spark, arrangement, null_safe) -> None:
    """A key may come several times (a stream's rows, not its distinct keys): the lookup's
    state is the same, counted once per key, and collecting the keys is one Spark job (a
    Spark-side distinct is a shuffle: a second job per lookup)."""
    from resources.spark import JobGroup

    uri, _, state = arrangement
    keys = random.Random(5).sample(range(20_000), 40)
    rows = [(k,) for k in keys for _ in range(3)] + [(None,), (None,)]
    wanted = spark.createDataFrame(rows, "k bigint")
    schema = pa.schema(open_table(uri).schema().to_arrow())
    group = JobGroup("lookup", "collect a lookup's keys")
    group.open(spark)
    try:
        df, stats = arrange.lookup(spark, uri, schema, ["k"], wanted, 2, null_safe=null_safe)
    finally:
        jobs = group.close(spark)
    assert jobs == 1
    assert stats.keys == len(keys) + (1 if null_safe else 0)
    got = Counter({(r["k"], r["v"]): r[DIFF] for r in df.collect()})
    assert got == Counter({kv: n for kv, n in state.items() if kv[0] in set(keys)})


def test_lookup_before_the_first_epoch_runs_no_job(spark, arrangement) -> None:
    """Nothing is live at an epoch before the arrangement's first (a state table read at the
    build's ``done`` = 0): the lookup is empty without computing the keys' stream."""
    uri, _, _ = arrangement
    schema = pa.schema(open_table(uri).schema().to_arrow())
    failing = spark.range(3).select(F.raise_error(F.lit("keys computed")).cast("bigint").alias("k"))
    for raw in (False, True):
        df, stats = arrange.lookup(spark, uri, schema, ["k"], failing, 0, null_safe=raw, raw=raw)
        assert df.collect() == [] and stats.files_opened == 0 and stats.files_total > 0
    with pytest.raises(Exception, match="keys computed"):  # at a live epoch, they are
        arrange.lookup(spark, uri, schema, ["k"], failing, 1)


@pytest.mark.parametrize("driver", [False, True], ids=["by Spark", "by the driver"])
def test_lookup_of_some_columns_projects_then_sums(spark, arrangement, driver, policy) -> None:
    """With ``columns``, the rows are the state projected to the key and those columns (their
    multiplicities summed), and the scans read no other column."""
    if not driver:
        policy(driver_lookup_rows=0)
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
    assert bool(scans) != driver  # the driver's rows come as a local relation
    for scan in scans:
        assert sorted(scan.requiredSchema().fieldNames()) == sorted(["k", TIME, DIFF])


def _parquet(path: Path, groups: list[list], kind: pa.DataType | None = None) -> DataFile:
    """A Parquet file with one row group per list (rows in the order given)."""
    writer = pq.ParquetWriter(path, pa.schema([("K", kind or pa.int64()), ("v", pa.int64())]))
    for keys in groups:
        writer.write_table(pa.table({"K": keys, "v": [0] * len(keys)}, schema=writer.schema))
    writer.close()
    return DataFile(str(path), {}, sum(len(g) for g in groups))


def test_key_ordered_reads_row_group_ranges_from_footers(tmp_path) -> None:
    """Files are in key order when, within each, row groups start at non-decreasing keys and
    all their ranges overlap little (strings: not at all); the rows inside a row group may
    be in any order."""
    low = _parquet(tmp_path / "low.parquet", [[3, 1, 2], [6, 4, 5]])
    high = _parquet(tmp_path / "high.parquet", [[9, 6, 7], [12, 10]])
    assert key_ordered([high, low], "k") == [low, high]
    late = _parquet(tmp_path / "late.parquet", [[6, 4, 5], [3, 1, 2]])  # groups out of order
    assert key_ordered([late], "k") is None
    everywhere = _parquet(tmp_path / "everywhere.parquet", [[12, 1]])  # spans every key
    assert key_ordered([low, high, everywhere], "k") is None
    edges = [  # 1..100 and 95..200: ranges summing to 1.02x the whole, as TPC-H's files
        _parquet(tmp_path / "e1.parquet", [list(range(100, 0, -1))]),
        _parquet(tmp_path / "e2.parquet", [list(range(95, 201))]),
    ]
    assert key_ordered(edges[::-1], "k") == edges
    nulls = _parquet(tmp_path / "nulls.parquet", [[20, None]])
    assert key_ordered([nulls], "k") is None
    assert key_ordered([low], "missing") is None
    text = [
        _parquet(tmp_path / "s1.parquet", [["b", "a"]], pa.string()),
        _parquet(tmp_path / "s2.parquet", [["c", "d"]], pa.string()),
        _parquet(tmp_path / "s3.parquet", [["bb", "e"]], pa.string()),
    ]
    assert key_ordered(text[1::-1], "k") == text[:2]
    assert key_ordered(text, "k") is None  # no width to measure overlap by: none allowed


def test_a_source_in_key_order_is_arranged_without_a_shuffle(
    spark, make_project, tmp_path, policy
) -> None:
    """A source loaded in key order (its row groups hold disjoint key ranges, rows shuffled
    inside them) is arranged by sorting each partition where it is: the files come out
    sorted with disjoint ranges, as with the range-partitioned path the other source takes,
    and the join over both stays equal to DuckDB's through a change."""
    policy(
        arrangement_file_rows=100,  # the engine's "large source" floor
        driver_build_rows=0,  # Spark's build, not the driver's
        driver_sort_rows=0,
    )
    rng = random.Random(5)
    ordered, scattered = str(tmp_path / "data" / "big"), str(tmp_path / "data" / "small")
    cdf = {"delta.enableChangeDataFeed": "true"}
    for start in (0, 2_000, 4_000):  # three appends, two row groups each
        ids = list(range(start, start + 2_000))
        halves = [ids[:1_000], ids[1_000:]]
        for half in halves:
            rng.shuffle(half)
        table = pa.table({"id": halves[0] + halves[1], "v": [i % 7 for i in range(2_000)]})
        write_deltalake(
            ordered,
            table,
            mode="append",
            configuration=cdf,
            writer_properties=WriterProperties(max_row_group_size=1_000),
        )
    for seed in (1, 2):  # each file spans the whole key range
        ids = random.Random(seed).sample(range(6_000), 1_500)
        write_deltalake(
            scattered,
            pa.table({"id": ids, "w": [i % 5 for i in ids]}),
            mode="append",
            configuration=cdf,
        )
    view = "CREATE VIEW joined AS SELECT b.id, b.v, s.w FROM big b JOIN small s ON b.id = s.id"
    root = make_project({"joined": view}, {"big": ordered, "small": scattered})
    messages: list[str] = []
    engine = Engine(root, spark=spark, progress=messages.append)
    assert engine.refresh().ok
    built = {m.split(":")[0]: m for m in messages if m.startswith("arrangement ")}
    assert "from a source in key order, without a shuffle" in built["arrangement big[id]"]
    assert "key order" not in built["arrangement small[id]"]
    for name, rows in (("big__by__id", 6_000), ("small__by__id", 3_000)):
        uri = str(root / "lake" / "arrangements" / name)
        ranges, held = [], Counter()
        for f in table_files(uri):
            keys = pq.read_table(local_path(f.uri), columns=["id"]).column("id").to_pylist()
            assert keys == sorted(keys), f"{name}: {f.uri} is not sorted"
            ranges.append((keys[0], keys[-1], len(keys)))
            held.update(keys)
        ranges.sort()
        assert sum(r[2] for r in ranges) == rows
        # Disjoint, but for a key the collection holds twice (``small``'s two appends share
        # ids) cut between two files of ``arrangement_file_rows`` rows.
        assert all(
            a[1] < b[0] or (a[1] == b[0] and held[a[1]] > 1)
            for a, b in zip(ranges, ranges[1:], strict=False)
        ), ranges
    dt = DeltaTable(ordered)
    dt.delete("id % 97 = 0")
    write_deltalake(ordered, pa.table({"id": [6_001, 6_002], "v": [1, 2]}), mode="append")
    write_deltalake(scattered, pa.table({"id": [6_001, 12], "w": [3, 4]}), mode="append")
    assert engine.refresh().ok
    for c in compare_views(engine):
        assert c.equal, c.describe()


def test_a_small_change_feed_is_arranged_by_the_driver(spark, make_project, tmp_path) -> None:
    """An arrangement's epoch from a change feed the driver holds is summed on the columns
    its readers use, sorted by key (NULLs first, as Spark sorts) and written there: no Spark
    job, and the file reads as the Spark-written ones do; the join stays equal to DuckDB's."""
    from resources.spark import JobGroup

    cdf = {"delta.enableChangeDataFeed": "true"}
    left, right = str(tmp_path / "data" / "left"), str(tmp_path / "data" / "right")
    write_deltalake(
        left,
        pa.table({"k": [3, 1, 2, 5], "name": ["c", "a", "b", "e"], "note": ["x"] * 4}),
        configuration=cdf,
    )
    write_deltalake(right, pa.table({"k": [1, 2, 3], "w": [10, 20, 30]}), configuration=cdf)
    view = "CREATE VIEW joined AS SELECT l.k, l.name, r.w FROM left l JOIN right r ON r.k = l.k"
    root = make_project({"joined": view}, {"left": left, "right": right})
    engine = Engine(root, spark=spark, progress=lambda m: None)
    assert engine.refresh().ok
    dt = DeltaTable(left)
    dt.update({"note": "'y'"})  # no reader's column: sums to nothing
    dt.update({"name": "'b2'"}, predicate="k = 2")
    dt.delete("k = 5")
    write_deltalake(
        left, pa.table({"k": [None, 4], "name": ["n", "d"], "note": ["z", "z"]}), mode="append"
    )
    engine.mint_epoch()
    (key,) = [k for k in engine.plan.arrangements if k.collection == "left"]
    uri = engine.arrangement_uri(key)
    before = set(DeltaTable(uri).file_uris())
    group = JobGroup("probe", "arrange left")
    group.open(spark)
    try:
        result = engine.arrangements.refresh_now(key)
    finally:
        jobs = group.close(spark)
    assert jobs == 0 and result is not None and result.staged is not None
    (added,) = set(DeltaTable(uri).file_uris()) - before
    got = pq.read_table(local_path(added)).to_pylist()
    rows = [(r["k"], r["name"], r[DIFF]) for r in got]
    # Sorted by (key, _time), NULLs first; rows tying on both come in no particular order.
    assert [k for k, _, _ in rows] == [None, 2, 2, 4, 5]
    assert sorted(rows, key=repr) == sorted(
        [(None, "n", 1), (2, "b", -1), (2, "b2", 1), (4, "d", 1), (5, "e", -1)], key=repr
    )
    assert {r[TIME] for r in got} == {2}
    assert engine.refresh().ok
    for c in compare_views(engine):
        assert c.equal, c.describe()


def test_the_driver_reads_a_small_tables_rows_for_keys_null_equal_to_null(tmp_path):
    """``lookup_rows`` (a buffered TopK's state read by the driver) returns the same rows as
    a lookup would before summing: keys of several columns, NULL equal to NULL, rows after
    ``as_of`` left out, and nothing when the files it must open hold too many rows."""
    uri = str(tmp_path / "state")
    schema = pa.schema(
        [
            ("g", pa.string()),
            ("n", pa.int32()),
            ("v", pa.int64()),
            (TIME, pa.int64()),
            (DIFF, pa.int64()),
        ]
    )
    rows = [
        {"g": g, "n": n, "v": v, TIME: t, DIFF: d}
        for t in (1, 2)
        for g in ("a", "b", None)
        for n in (1, None)
        for v, d in ((10 * t, 1), (10 * t + 1, -1))
    ]
    for t in (1, 2):  # one file per epoch, as the engine writes them
        part = [r for r in rows if r[TIME] == t]
        write_deltalake(uri, pa.Table.from_pylist(part, schema=schema), mode="append")
    keys = pa.table({"g": ["a", None, "b", "a"], "n": [None, 1, 1, None]})
    found, stats = arrange.lookup_rows(uri, schema, ["g", "n"], keys, 1, max_rows=1_000)
    wanted = {("a", None), (None, 1), ("b", 1)}
    expected = [r for r in rows if (r["g"], r["n"]) in wanted and r[TIME] <= 1]
    key = lambda r: tuple((v is None, v) for v in r.values())  # noqa: E731
    assert found is not None and found.schema == schema
    assert sorted(found.to_pylist(), key=key) == sorted(expected, key=key)
    assert stats.keys == 3 and stats.rows_scanned == 12
    only_b, stats = arrange.lookup_rows(uri, schema, ["g", "n"], keys.slice(2, 1), 2, 1_000)
    assert only_b is not None and {(r["g"], r["n"]) for r in only_b.to_pylist()} == {("b", 1)}
    assert only_b.num_rows == 4
    # A file is opened only if its range of the first key column admits a key.
    beyond = pa.table({"g": ["c"], "n": [1]})
    none, stats = arrange.lookup_rows(uri, schema, ["g", "n"], beyond, 2, 1_000)
    assert none is not None and none.num_rows == 0 and stats.files_opened == 0
    too_many, stats = arrange.lookup_rows(uri, schema, ["g", "n"], keys, 2, max_rows=10)
    assert too_many is None and stats.rows_in_opened_files == 24


def _arrangement_rows(uri: str) -> tuple[pa.Schema, Counter, list[list]]:
    """An arrangement's schema, its rows as a multiset, and each file's keys in file order."""
    dt = DeltaTable(uri)
    schema = pa.schema(dt.schema().to_arrow())
    rows: Counter = Counter()
    keys = []
    for f in table_files(uri):
        table = pq.read_table(local_path(f.uri))
        rows.update(tuple(sorted(r.items())) for r in table.to_pylist())
        keys.append(table.column("id").to_pylist())
    return schema, rows, keys


def test_the_driver_builds_an_arrangement_as_spark_does(
    spark, make_project, tmp_path, monkeypatch
) -> None:
    """A source's snapshot is arranged by the driver, with no Spark job: the rows, types and
    layout (sorted files of ``arrangement_file_rows`` rows, disjoint key ranges) are those
    Spark's build writes, for a source laid out by the key (file by file) and one that is not
    (sorted whole); a column's case in the files does not matter; the files written are in
    the driver's cache as lookups read them; above the bounds Spark builds; the join stays
    equal to DuckDB's through a change."""
    from resources.spark import JobGroup

    cdf = {"delta.enableChangeDataFeed": "true"}
    ordered, scattered = str(tmp_path / "data" / "items"), str(tmp_path / "data" / "dims")
    rng = random.Random(11)
    for start in (0, 1_000, 2_000):  # three files in key order, rows shuffled in each
        ids = list(range(start, start + 1_000))
        rng.shuffle(ids)
        write_deltalake(
            ordered,
            pa.table(
                {
                    "ID": pa.array(ids, pa.int64()),
                    "Name": [None if i % 9 == 0 else f"n{i % 13}" for i in ids],
                    "amount": pa.array(
                        [Decimal(i * 7 % 1000) / 100 for i in ids], pa.decimal128(12, 2)
                    ),
                    "day": pa.array([i % 400 for i in ids], pa.int32()).cast(pa.date32()),
                    "at": pa.array([i * 1_000_003 for i in ids], pa.timestamp("us", tz="UTC")),
                }
            ),
            mode="append",
            configuration=cdf,
        )
    for seed in (1, 2):  # each file spans the whole key range
        ids = random.Random(seed).sample(range(3_000), 700)
        write_deltalake(
            scattered,
            pa.table({"id": ids, "w": [i % 5 for i in ids]}),
            mode="append",
            configuration=cdf,
        )
    view = (
        "CREATE VIEW joined AS SELECT i.id, i.name, i.amount, i.day, i.at, d.w "
        "FROM items i JOIN dims d ON d.id = i.id"
    )
    root = make_project({"joined": view}, {"items": ordered, "dims": scattered})
    cache = FileCache(256 * 1024 * 1024)
    monkeypatch.setattr(arrange, "FILES", cache)

    def build(**changes: int) -> tuple[dict[str, str], dict[str, tuple], int]:
        """Every arrangement built anew, in files of 300 rows, under the policy's
        ``changes``."""
        messages: list[str] = []
        with ivm.policy.using(arrangement_file_rows=300, **changes):
            engine = Engine(root, spark=spark, progress=messages.append)
            engine.mint_epoch()
            group = JobGroup("probe", "arrange")
            group.open(spark)
            try:
                for key in engine.plan.arrangements:  # in this thread's job group
                    engine.arrangements.refresh_now(key)
            finally:
                jobs = group.close(spark)
        built = {m.split(":")[0]: m for m in messages if m.startswith("arrangement ")}
        tables = {
            k.name: _arrangement_rows(engine.arrangement_uri(k)) for k in engine.plan.arrangements
        }
        return built, tables, jobs

    by_driver, driven, jobs = build()
    assert jobs == 0, "the driver's build runs no Spark job"
    assert set(by_driver) == {"arrangement items[id]", "arrangement dims[id]"}
    assert all("by the driver" in m for m in by_driver.values()), by_driver
    for name, rows in (("items__by__id", 3_000), ("dims__by__id", 1_400)):
        uri = str(root / "lake" / "arrangements" / name)
        _, found, keys = driven[name]
        assert sum(found.values()) == rows
        assert all(k == sorted(k) and len(k) <= 300 for k in keys), name
        spans = sorted((k[0], k[-1]) for k in keys)
        assert all(a[1] < b[0] for a, b in zip(spans, spans[1:], strict=False)), spans
        types = spark_compatible_schema(pa.schema(DeltaTable(uri).schema().to_arrow()))
        assert all(cache.holds(local_path(f.uri), types) for f in table_files(uri)), name

    shutil.rmtree(root / "lake")
    by_spark, sparked, jobs = build(driver_build_rows=0, driver_sort_rows=0)
    assert jobs > 0 and not any("by the driver" in m for m in by_spark.values()), by_spark
    for name in driven:
        assert driven[name][0] == sparked[name][0], f"{name}: the two builds' types differ"
        assert driven[name][1] == sparked[name][1], f"{name}: the two builds' rows differ"

    # The driver's builds again, in files of the default size, then a change through the join.
    monkeypatch.setattr(arrange, "FILES", FileCache(0))
    shutil.rmtree(root / "lake")
    engine = Engine(root, spark=spark, progress=lambda m: None)
    assert engine.refresh().ok
    DeltaTable(ordered).delete("ID % 7 = 0")
    write_deltalake(scattered, pa.table({"id": [14, 2_999], "w": [3, 4]}), mode="append")
    assert engine.refresh().ok
    for c in compare_views(engine):
        assert c.equal, c.describe()
