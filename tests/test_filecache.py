"""The driver's cache of decoded Parquet files (``resources.filecache``), with no Spark: it
returns a file's rows as they are on disk, keeps the most recently read within its budget,
reads a file rewritten in place again, and decodes a file once for concurrent readers."""

from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from resources import filecache
from resources.filecache import FileCache

SCHEMA = pa.schema([("k", pa.int64()), ("s", pa.string())])


def _file(path: Path, n: int, tag: str = "a") -> str:
    pq.write_table(pa.table({"k": list(range(n)), "s": [f"{tag}{i}" for i in range(n)]}), path)
    return str(path)


def test_rows_come_from_memory_after_the_first_read(tmp_path) -> None:
    path = _file(tmp_path / "f.parquet", 1_000)
    cache = FileCache(1 << 20)
    first, decoded = cache.read(path, SCHEMA)
    assert decoded and first.equals(pq.read_table(path).cast(SCHEMA))
    again, decoded = cache.read(path, SCHEMA)
    assert not decoded and again.equals(first) and cache.holds(path, SCHEMA)
    assert (cache.stats.hits, cache.stats.misses, cache.stats.rows_loaded) == (1, 1, 1_000)
    narrow = pa.schema([("s", pa.string())])  # another projection is another entry
    part, decoded = cache.read(path, narrow)
    assert decoded and part.column_names == ["s"] and part.num_rows == 1_000


def test_the_least_recently_read_idle_files_leave_first_and_nothing_exceeds_the_budget(
    tmp_path,
) -> None:
    paths = [_file(tmp_path / f"f{i}.parquet", 1_000) for i in range(3)]
    size = pq.read_table(paths[0]).cast(SCHEMA).combine_chunks().nbytes
    cache = FileCache(2 * size, idle_seconds=0)  # every entry idle: least recently read out
    cache.read(paths[0], SCHEMA)
    cache.read(paths[1], SCHEMA)
    cache.read(paths[0], SCHEMA)  # now paths[1] is the least recently read
    cache.read(paths[2], SCHEMA)
    assert [cache.holds(p, SCHEMA) for p in paths] == [True, False, True]
    assert cache.held_bytes == 2 * size and cache.stats.evictions == 1
    cache.set_budget(size - 1)  # smaller than any file: nothing stays, reads still answer
    assert cache.held_bytes == 0 and not any(cache.holds(p, SCHEMA) for p in paths)
    table, decoded = cache.read(paths[1], SCHEMA)
    assert decoded and table.num_rows == 1_000 and cache.held_bytes == 0
    off = FileCache(0)
    assert off.read(paths[0], SCHEMA)[1] and off.read(paths[0], SCHEMA)[1]


def test_a_full_cache_keeps_its_recent_files_rather_than_cycle(tmp_path) -> None:
    """Three files read in turn through a cache that fits two: the two first stay, the third
    is decoded on every read; least recently used would have decoded every read."""
    paths = [_file(tmp_path / f"f{i}.parquet", 1_000) for i in range(3)]
    size = pq.read_table(paths[0]).cast(SCHEMA).combine_chunks().nbytes
    cache = FileCache(2 * size)
    decoded = [cache.read(p, SCHEMA)[1] for _ in range(3) for p in paths]
    assert decoded == [True, True, True] + [False, False, True] * 2
    assert cache.held_bytes == 2 * size and cache.stats.evictions == 0
    # The refused file is known: a lookup reads only its matching row groups instead.
    assert [cache.would_keep(p, SCHEMA) for p in paths] == [True, True, False]
    cache.keep_only(str(tmp_path), paths[1:])  # room again: it would be kept
    assert cache.would_keep(paths[2], SCHEMA) and not FileCache(0).would_keep(paths[2], SCHEMA)


def test_files_a_table_no_longer_has_leave(tmp_path) -> None:
    table = tmp_path / "t"
    table.mkdir()
    old, new = _file(table / "a.parquet", 10), _file(table / "b.parquet", 10)
    other = _file(tmp_path / "other.parquet", 10)
    cache = FileCache(1 << 20)
    for p in (old, new, other):
        cache.read(p, SCHEMA)
    cache.keep_only(str(table), [new])  # a compaction replaced a.parquet
    assert [cache.holds(p, SCHEMA) for p in (old, new, other)] == [False, True, True]


def test_a_file_rewritten_in_place_is_read_again(tmp_path) -> None:
    path = _file(tmp_path / "f.parquet", 10, "old")
    cache = FileCache(1 << 20)
    cache.read(path, SCHEMA)
    stat = os.stat(path)
    _file(tmp_path / "f.parquet", 10, "new")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    table, decoded = cache.read(path, SCHEMA)
    assert decoded and table.column("s")[0].as_py() == "new0"


def test_concurrent_readers_decode_a_file_once(tmp_path) -> None:
    path = _file(tmp_path / "f.parquet", 200_000)
    cache = FileCache(1 << 30)
    start = threading.Barrier(4)
    got: list[pa.Table] = []

    def read() -> None:
        start.wait()
        got.append(cache.read(path, SCHEMA)[0])

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.stats.misses == 1 and cache.stats.hits == 3
    assert all(t.equals(got[0]) for t in got)


def test_default_budget_is_a_quarter_of_memory_within_bounds() -> None:
    """The default budget follows the machine (or container): a quarter of its memory, at
    least 256 MiB, at most 8 GiB, 2 GiB when the platform does not say."""
    gib = 2**30
    assert filecache.default_budget_mb(24 * gib) == 6 * 1024
    assert filecache.default_budget_mb(64 * gib) == 8 * 1024
    assert filecache.default_budget_mb(gib // 2) == 256
    assert filecache.default_budget_mb(None) == 2048
    memory = filecache.memory_bytes()
    assert memory is None or memory > 0
    assert filecache.DEFAULT_BUDGET_MB == filecache.default_budget_mb(memory)


def test_a_container_limit_lowers_the_memory_counted_on(tmp_path, monkeypatch) -> None:
    """A cgroup limit below the machine's memory is what the process can count on; cgroup
    v2's ``max`` (no limit) is not a number and leaves the machine's."""
    limit = tmp_path / "memory.max"
    monkeypatch.setattr(filecache, "CGROUP_LIMITS", (str(limit), str(tmp_path / "absent")))
    limit.write_text("max\n")
    machine = filecache.memory_bytes()
    assert machine is not None and machine > 2**30
    limit.write_text(f"{2**30}\n")
    assert filecache.memory_bytes() == 2**30


def test_a_file_just_written_is_put_and_read_from_memory_then_discarded(tmp_path) -> None:
    """A writer hands over the rows of the file it wrote: the next read decodes nothing;
    a file that does not fit is not kept (and known not to be); discarded files leave."""
    path = _file(tmp_path / "f.parquet", 1_000)
    rows = pq.read_table(path)
    cache = FileCache(1 << 20)
    assert cache.put(path, SCHEMA, rows) and cache.holds(path, SCHEMA)
    held, decoded = cache.read(path, SCHEMA)
    assert not decoded and held.equals(rows.cast(SCHEMA)) and cache.stats.misses == 0
    assert cache.put(path, SCHEMA, rows) and cache.held_bytes == held.nbytes  # once
    big = _file(tmp_path / "big.parquet", 100_000)
    assert not cache.put(big, SCHEMA, pq.read_table(big))
    assert not cache.holds(big, SCHEMA) and not cache.would_keep(big, SCHEMA)
    cache.discard([path])
    assert not cache.holds(path, SCHEMA) and cache.held_bytes == 0
    assert not FileCache(0).put(path, SCHEMA, rows)


def test_files_gone_from_their_table_are_forgotten_refused_ones_too(tmp_path) -> None:
    """``keep_only`` and ``discard`` drop held entries and what the cache knew of files it
    refused: a refused file that left its table is not remembered forever."""
    (tmp_path / "t").mkdir()
    small = _file(tmp_path / "t" / "a.parquet", 100)
    big = _file(tmp_path / "t" / "b.parquet", 100_000)
    cache = FileCache(64 * 1024)
    cache.read(small, SCHEMA)
    cache.read(big, SCHEMA)  # too big to keep: refused, and known to be
    assert cache.holds(small, SCHEMA) and cache._refused
    cache.keep_only(str(tmp_path / "t"), [small])
    assert cache.holds(small, SCHEMA) and not cache._refused
    cache.read(big, SCHEMA)
    cache.discard([small, big])
    assert not cache.holds(small, SCHEMA) and not cache._refused and cache.held_bytes == 0


def test_a_file_is_decoded_into_one_chunk_per_column_in_the_schema_asked(tmp_path) -> None:
    """Lookups find rows by position (binary search, then ``take``), which over a column of
    several chunks costs the column's rows: a decoded file is one chunk per column, whether
    it holds one row group or several."""
    n = 300_000  # more than one batch of Arrow's dataset scan (128Ki rows)
    rows = pa.table({"s": [f"v{i % 977}" for i in range(n)], "k": pa.array(range(n), pa.int32())})
    wanted = pa.schema([("k", pa.int64()), ("s", pa.string())])  # reordered, widened
    for groups in (1, 3):
        path = str(tmp_path / f"g{groups}.parquet")
        pq.write_table(rows, path, row_group_size=-(-n // groups))
        assert pq.ParquetFile(path).metadata.num_row_groups == groups
        assert pq.read_table(path).column("k").num_chunks > 1  # what the scan would hand over
        decoded, fresh = FileCache(1 << 30).read(path, wanted)
        assert fresh and decoded.schema == wanted
        assert [c.num_chunks for c in decoded.columns] == [1, 1]
        assert decoded.equals(rows.select(["k", "s"]).cast(wanted))


def test_a_writers_slices_are_kept_as_they_are_up_to_a_bound(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rewrite hands over slices of the file it replaced: kept without a copy (the same
    buffers), up to ``MAX_CHUNKS`` chunks a column; more are combined into one."""
    path = _file(tmp_path / "f.parquet", 1_000)
    rows = pq.read_table(path).cast(SCHEMA).combine_chunks()
    sliced = pa.concat_tables([rows.slice(0, 10), rows.slice(11, 500), rows.slice(600)])
    cache = FileCache(1 << 20)
    assert cache.put(path, SCHEMA, sliced)
    held, _ = cache.read(path, SCHEMA)
    assert held.equals(sliced) and [c.num_chunks for c in held.columns] == [3, 3]
    first = held.column("k").chunk(0).buffers()[1]
    assert first.address == rows.column("k").chunk(0).buffers()[1].address  # not copied
    monkeypatch.setattr(filecache, "MAX_CHUNKS", 2)
    other = _file(tmp_path / "g.parquet", 1_000)
    assert cache.put(other, SCHEMA, sliced)
    held, _ = cache.read(other, SCHEMA)
    assert held.equals(sliced) and [c.num_chunks for c in held.columns] == [1, 1]


def test_the_budget_is_set_once_by_the_first_project(tmp_path) -> None:
    """``configure`` sets a cache's budget once: the first caller's applies; the same budget
    asked again changes nothing; another is warned about, naming both, and not applied."""
    paths = [_file(tmp_path / f"f{i}.parquet", 1_000) for i in range(2)]
    cache = FileCache(1 << 30)
    assert cache.configured_by is None
    assert cache.configure(1 << 20, "one/ivm.toml") == 1 << 20
    assert cache.budget_bytes == 1 << 20 and cache.configured_by == "one/ivm.toml"
    cache.read(paths[0], SCHEMA)
    assert cache.configure(1 << 20, "two/ivm.toml") == 1 << 20  # the same: no warning
    with pytest.warns(filecache.CacheBudgetWarning, match=r"two/ivm.toml.*set by one/ivm.toml"):
        assert cache.configure(0, "two/ivm.toml") == 1 << 20
    assert cache.budget_bytes == 1 << 20 and cache.holds(paths[0], SCHEMA)
    assert cache.configured_by == "one/ivm.toml"


def test_two_projects_in_one_process_share_the_first_ones_budget(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two engines (no Spark) over projects with different ``cache_mb``: the second does not
    overwrite the process's budget, and says so."""
    from deltalake import write_deltalake

    import engine.inspect
    from engine.facade import Engine

    cache = FileCache(1 << 30)
    monkeypatch.setattr(engine.inspect, "FILES", cache)
    source = str(tmp_path / "t")
    write_deltalake(source, pa.table({"k": pa.array([1, 2], pa.int64())}))
    roots = []
    for name, mb in (("one", 64), ("two", 0)):
        root = tmp_path / name
        (root / "views").mkdir(parents=True)
        (root / "views" / "v.sql").write_text("CREATE VIEW v AS SELECT k FROM t\n")
        (root / "ivm.toml").write_text(
            f'lake = "lake"\nviews = "views"\n[sources]\nt = "{source}"\n'
            f"[refresh]\ncache_mb = {mb}\n"
        )
        roots.append(root)
    Engine(roots[0])
    assert cache.budget_bytes == 64 << 20
    with pytest.warns(filecache.CacheBudgetWarning, match="cache_mb = 0 is not applied"):
        Engine(roots[1])
    assert cache.budget_bytes == 64 << 20
    with warnings.catch_warnings():
        warnings.simplefilter("error", filecache.CacheBudgetWarning)
        Engine(roots[0])  # the first project again: nothing to say
    assert cache.configured_by == str((roots[0] / "ivm.toml").resolve())
