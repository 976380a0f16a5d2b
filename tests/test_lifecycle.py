"""A view's life on the real stack: exactly-once commits across a crash, reruns that write
nothing, definition changes and rebuilds, sources without CDF or past their retention, and
tables that other readers open."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import engine.refresh as engine_refresh
import ops.sink
from engine.facade import Engine
from engine.oracle import compare_views, log_multiset, table_multiset
from engine.refresh import REFRESH_SECONDS
from ivm import policy
from ivm.errors import ChangeFeedError, SqlError
from resources.lake import (
    commit_files,
    commit_history,
    last_commit_metadata,
    open_table,
    snapshot_rows,
    table_files,
)
from resources.spark import JobGroup

pytestmark = pytest.mark.spark

T = pa.schema([("k", pa.int64()), ("grp", pa.string()), ("v", pa.int64())])


def rows(*triples) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(T.names, t, strict=True)) for t in triples], schema=T)


def cdf_source(path: Path, data: pa.Table) -> str:
    """A Delta source at ``path`` holding ``data``, with its Change Data Feed on."""
    write_deltalake(str(path), data, configuration={"delta.enableChangeDataFeed": "true"})
    return str(path)


@pytest.fixture
def src(tmp_path: Path) -> str:
    return cdf_source(
        tmp_path / "src", rows((1, "a", 10), (2, "a", 20), (3, "b", 30), (3, "b", 30))
    )


VIEWS = {
    "big": "CREATE VIEW big AS SELECT k, grp, v * 2 AS v2 FROM src WHERE v > 10",
    "big_a": "CREATE VIEW big_a AS SELECT k, v2 FROM big WHERE grp = 'a'",
}


def assert_correct(engine: Engine) -> None:
    for c in compare_views(engine):
        assert c.equal, c.describe()
        assert log_multiset(engine, c.view, c.epoch) == table_multiset(engine.read_view(c.view))


def commits_for_epoch(uri: str, epoch: int) -> int:
    history = commit_history(DeltaTable(uri), 1000)  # either writer's commits
    return sum(1 for h in history if h.get("ivm.epoch") == str(epoch))


def test_crash_between_log_and_table_commit_is_exactly_once(
    spark, make_project, src, monkeypatch
) -> None:
    engine = Engine(make_project(VIEWS, {"src": src}), spark=spark)
    assert engine.refresh().ok
    DeltaTable(src).delete("k = 2")
    write_deltalake(src, rows((4, "a", 40)), mode="append")

    real = engine_refresh.apply_to_table

    def crash(*args, **kwargs):
        raise RuntimeError("simulated crash after the log commit")

    monkeypatch.setattr(engine_refresh, "apply_to_table", crash)
    assert engine.mint_epoch() is not None
    with pytest.raises(RuntimeError, match="simulated crash"):
        engine.refresh_view("big")
    assert engine.table_epoch(engine.layout.view_log("big")) == 2
    assert engine.table_epoch(engine.layout.view_table("big")) == 1
    monkeypatch.setattr(engine_refresh, "apply_to_table", real)

    report = Engine(engine.project, spark=spark).refresh()
    assert report.ok and report.minted is None  # the epoch was minted once, before the crash
    assert commits_for_epoch(engine.layout.view_log("big"), 2) == 1
    assert commits_for_epoch(engine.layout.view_table("big"), 2) == 1
    assert_correct(engine)


def test_rerunning_a_committed_epoch_writes_nothing(spark, make_project, src) -> None:
    engine = Engine(make_project(VIEWS, {"src": src}), spark=spark)
    engine.refresh()
    table = engine.layout.view_table("big")
    before = DeltaTable(table).version()
    again = commit_files(
        table, app_id=engine.app_id(table), epoch=1, schema=pa.schema([("k", pa.int64())])
    )
    assert not again.committed and DeltaTable(table).version() == before
    report = engine.refresh()
    assert [v.status for v in report.views] == ["up-to-date", "up-to-date"]
    assert DeltaTable(table).version() == before


def test_view_definition_change_rebuilds_with_changes_downstream(spark, make_project, src) -> None:
    root = make_project(VIEWS, {"src": src})
    engine = Engine(root, spark=spark)
    engine.refresh()
    # Same columns, new filter: the log gets the difference; downstream just consumes it.
    (root / "views" / "big.sql").write_text(
        "CREATE VIEW big AS SELECT k, grp, v * 2 AS v2 FROM src WHERE v > 15"
    )
    engine = Engine(root, spark=spark)
    assert engine.rebuild_reason("big") == "its SQL changed"
    assert engine.rebuild_reason("big_a") == "upstream view 'big' was redefined"
    report = engine.refresh()
    assert report.ok and report.minted is not None
    statuses = {v.view: v.status for v in report.views}
    assert statuses == {"big": "rebuilt", "big_a": "rebuilt"}
    big = next(v for v in report.views if v.view == "big")
    assert (big.inserted, big.deleted) == (0, 0)  # 10 was already filtered out: no change
    assert_correct(engine)
    # New columns: the log starts anew, the table is replaced in one commit.
    (root / "views" / "big.sql").write_text(
        "CREATE VIEW big AS SELECT k, grp, v * 2 AS v2, upper(grp) AS g FROM src WHERE v > 25"
    )
    engine = Engine(root, spark=spark)
    report = engine.refresh()
    assert report.ok, [v.error for v in report.views]
    assert engine.read_view("big").column_names == ["k", "grp", "v2", "g"]
    assert_correct(engine)
    # And it continues incrementally.
    write_deltalake(src, rows((5, "a", 50)), mode="append")
    report = Engine(root, spark=spark).refresh()
    assert {v.view: v.status for v in report.views} == {"big": "refreshed", "big_a": "refreshed"}
    assert_correct(engine)


def test_source_without_cdf_accepts_appends_and_explains_deletes(
    spark, make_project, tmp_path
) -> None:
    path = str(tmp_path / "plain")
    write_deltalake(path, rows((1, "a", 11), (2, "b", 22)))
    engine = Engine(make_project(VIEWS, {"src": path}), spark=spark)
    assert engine.refresh().ok
    write_deltalake(path, rows((3, "a", 33)), mode="append")
    assert engine.refresh().ok
    assert_correct(engine)
    DeltaTable(path).delete("k = 1")
    report = engine.refresh()
    (failure, skipped) = report.views
    assert failure.status == "failed" and skipped.status == "skipped"
    assert "delta.enableChangeDataFeed" in failure.error and "'src'" in failure.error
    assert "versions 2..2" in failure.error


def test_vacuumed_change_range_is_an_error_then_rebuild_recovers(spark, make_project, src) -> None:
    engine = Engine(make_project(VIEWS, {"src": src}), spark=spark)
    engine.refresh()
    write_deltalake(src, rows((7, "a", 70)), mode="append")  # CDF of an append: the file itself
    DeltaTable(src).delete("k = 2")
    DeltaTable(src).optimize.compact()
    DeltaTable(src).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    report = engine.refresh()
    assert not report.ok
    error = report.views[0].error
    assert "no longer readable" in error and "versions 1..5" in error and "--rebuild" in error
    with pytest.raises(ChangeFeedError):
        engine.refresh_view("big")
    report = engine.refresh(rebuild=True)
    assert report.ok, [v.error for v in report.views]
    assert_correct(engine)


def test_view_tables_open_in_other_readers(spark, make_project, src) -> None:
    engine = Engine(make_project(VIEWS, {"src": src}), spark=spark)
    engine.refresh()
    table = DeltaTable(engine.layout.view_table("big"))
    assert table.to_pyarrow_table().num_rows == 3  # k=3 twice: a multiset
    con = duckdb.connect()
    con.register("big", table.to_pyarrow_dataset())
    assert con.sql("SELECT k, count(*) FROM big GROUP BY k ORDER BY k").fetchall() == [
        (2, 1),
        (3, 2),
    ]
    # DuckDB reading the Parquet files the Delta log lists, with the stats we wrote.
    files = table.file_uris()
    assert con.sql(f"SELECT count(*) FROM read_parquet({files!r})").fetchall() == [(3,)]
    stats = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    assert stats["min.k"] == [2] and stats["max.k"] == [3] and stats["num_records"] == [3]
    log = DeltaTable(engine.layout.view_log("big"))
    assert log.transaction_version(engine.app_id(engine.layout.view_log("big"))) == 1


def test_partitioned_source(spark, make_project, tmp_path) -> None:
    path = str(tmp_path / "part")
    write_deltalake(
        path,
        rows((1, "a", 11), (2, "b", 22), (3, None, 33)),
        partition_by=["grp"],
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    engine = Engine(make_project(VIEWS, {"src": path}), spark=spark)
    assert engine.refresh().ok
    write_deltalake(path, rows((4, "a", 44), (5, "c", 55)), mode="append", partition_by=["grp"])
    DeltaTable(path).delete("k = 2")
    assert engine.refresh().ok
    assert_correct(engine)


def test_two_refreshes_started_together_commit_each_epoch_once(spark, make_project, tmp_path):
    """Two ``ivm refresh`` processes on one project at once: each epoch is committed by one of
    them, the other finds it done; views equal the oracle and logs sum to the tables."""
    import subprocess
    import sys

    from tests.lakegen import RandomLake
    from tests.test_oracle import check_all

    lake = RandomLake(tmp_path / "data", 21)
    lake.create()
    root = make_project(
        {
            "per_grp": "CREATE VIEW per_grp AS SELECT grp, count(*) AS n, max(price) AS m "
            "FROM items GROUP BY grp",
            "big": "CREATE VIEW big AS SELECT id, price FROM items WHERE price > 50",
        },
        {"items": lake.items, "events": lake.events},
        extra='[spark]\n"spark.master" = "local[1]"\n"spark.ui.enabled" = "false"\n'
        '"spark.sql.shuffle.partitions" = "1"',
    )
    engine = Engine(root, spark=spark)
    assert engine.refresh().ok
    lake.random_batch()
    cmd = [sys.executable, "-m", "engine.cli", "--project", str(root), "-q", "refresh"]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    failed = [
        f"exit {p.returncode}:\n{out}\n{err[-3000:]}"
        for p, (out, err) in zip(procs, outs, strict=True)
        if p.returncode != 0
    ]
    assert not failed, "\n".join(failed)
    engine = Engine(root, spark=spark)
    assert engine.latest_epoch() == 2  # one epoch minted between them, not two
    check_all(engine)
    for view in ("per_grp", "big"):
        commits = open_table(engine.layout.view_log(view)).history()
        assert len(commits) == 2, (view, commits)  # epochs 1 and 2, each committed once


def test_broken_views_and_sources_do_not_stop_the_others(spark, make_project, src, tmp_path):
    corrupt = str(tmp_path / "corrupt")
    write_deltalake(corrupt, rows((1, "a", 1)))
    (Path(corrupt) / "_delta_log" / "00000000000000000000.json").write_text("{not json\n")
    views = {
        **VIEWS,
        "typo": "CREATE VIEW typo AS\nSELECT k, vv FROM src",
        "after_typo": "CREATE VIEW after_typo AS SELECT k FROM typo",
        "unparsable": "CREATE VIEW unparsable AS SELEC k FROM src",
        "from_missing": "CREATE VIEW from_missing AS SELECT k FROM gone",
        "from_corrupt": "CREATE VIEW from_corrupt AS SELECT k FROM corrupt",
    }
    root = make_project(
        views, {"src": src, "gone": str(tmp_path / "no_such_table"), "corrupt": corrupt}
    )
    engine = Engine(root, spark=spark)
    report = engine.refresh()
    by_view = {v.view: v for v in report.views}
    assert not report.ok
    assert by_view["big"].status == "built" and by_view["big_a"].status == "built"
    assert_correct(engine)
    assert by_view["typo"].status == "failed"
    assert "typo.sql:2:11: unknown column 'vv'" in by_view["typo"].error
    assert by_view["after_typo"].status == "skipped"
    assert "waits for view 'typo'" in by_view["after_typo"].error
    assert by_view["unparsable"].status == "failed"
    assert "unparsable.sql: expected CREATE VIEW" in by_view["unparsable"].error
    assert "source 'gone'" in by_view["from_missing"].error
    assert "no Delta table" in by_view["from_missing"].error
    assert "source 'corrupt'" in by_view["from_corrupt"].error
    assert "Delta log" in by_view["from_corrupt"].error
    assert "unknown column 'vv' in source src" in engine.status()["views"]["typo"]["error"]
    # The good views keep refreshing while the others stay broken; asking only for a broken
    # view is the error itself, with nothing written.
    write_deltalake(src, rows((9, "a", 90)), mode="append")
    report = Engine(root, spark=spark).refresh()
    assert {v.view: v.status for v in report.views}["big_a"] == "refreshed"
    assert_correct(Engine(root, spark=spark))
    with pytest.raises(SqlError, match="unknown column 'vv'"):
        Engine(root, spark=spark).refresh(["typo"])
    # Fixed, the broken view is built at the current epoch, its dependent too.
    (root / "views" / "typo.sql").write_text("CREATE VIEW typo AS SELECT k, v FROM src")
    report = Engine(root, spark=spark).refresh(["typo", "after_typo"])
    assert report.ok, [v.error for v in report.views]
    assert_correct(Engine(root, spark=spark))


def test_a_column_changing_type_rebuilds_the_views_that_read_it(spark, make_project, src):
    views = {
        **VIEWS,
        "keys": "CREATE VIEW keys AS SELECT k, grp FROM src",
        "pairs": "CREATE VIEW pairs AS SELECT a.k, b.v FROM src a JOIN src b ON a.grp = b.grp",
    }
    engine = Engine(make_project(views, {"src": src}), spark=spark)
    assert engine.refresh().ok
    # Overwritten with `v` as double (and one more row): its change feed casts the deleted
    # rows to double, which the stored integer state never held.
    table = rows((1, "a", 10), (2, "a", 20), (3, "b", 30), (3, "b", 30), (4, "b", 40))
    retyped = table.set_column(2, "v", table.column("v").cast(pa.float64()))
    write_deltalake(src, retyped, mode="overwrite", schema_mode="overwrite")
    reason = Engine(engine.project).rebuild_reason("big")
    assert reason == "source 'src' column 'v' changed type from bigint to double"
    report = Engine(engine.project, spark=spark).refresh()
    assert report.ok, [v.error for v in report.views]
    status = {v.view: v.status for v in report.views}
    assert status == {"big": "rebuilt", "big_a": "rebuilt", "keys": "refreshed", "pairs": "rebuilt"}
    assert_correct(Engine(engine.project, spark=spark))
    DeltaTable(src).delete("k = 1")
    report = Engine(engine.project, spark=spark).refresh()
    assert {v.view: v.status for v in report.views}["pairs"] == "refreshed"
    assert_correct(Engine(engine.project, spark=spark))


def test_views_whose_inputs_did_not_change_only_move_their_epoch(
    spark, make_project, src, tmp_path
):
    other = cdf_source(tmp_path / "other", rows((1, "x", 5), (2, "y", 6)))
    views = {
        **VIEWS,
        "other_rows": "CREATE VIEW other_rows AS SELECT k, v FROM other",
        "other_groups": "CREATE VIEW other_groups AS SELECT grp, count(*) AS n, max(v) AS m "
        "FROM other GROUP BY grp",
        "both": "CREATE VIEW both AS SELECT s.k, o.v FROM src s JOIN other o ON o.k = s.k",
    }
    engine = Engine(make_project(views, {"src": src, "other": other}), spark=spark)
    assert engine.refresh().ok
    files = {v: len(DeltaTable(engine.layout.view_log(v)).file_uris()) for v in views}
    write_deltalake(src, rows((7, "a", 70)), mode="append")  # only `src` changes
    report = engine.refresh()
    assert report.ok, [v.error for v in report.views]
    changed = {v.view: v.inputs_changed for v in report.views}
    assert changed == {
        "big": True,
        "big_a": True,
        "both": True,
        "other_rows": False,
        "other_groups": False,
    }
    jobs = {v.view: v.spark_jobs for v in report.views}
    assert jobs["other_rows"] == jobs["other_groups"] == 0, jobs  # no Spark job
    computed = {v.view: v.computed_by for v in report.views}
    assert computed["other_rows"] == computed["other_groups"] == "nothing", computed
    assert computed["big"] == "driver" and computed["both"] == "driver", computed
    for view in ("other_rows", "other_groups"):  # the epoch moved; no file was written
        assert engine.table_epoch(engine.layout.view_log(view)) == 2
        assert engine.table_epoch(engine.layout.view_table(view)) == 2
        assert len(DeltaTable(engine.layout.view_log(view)).file_uris()) == files[view]
    assert_correct(engine)
    # From that epoch on they refresh as usual.
    DeltaTable(other).delete("k = 1")
    report = engine.refresh()
    assert report.ok and {v.view for v in report.views if not v.inputs_changed} == {"big", "big_a"}
    assert_correct(engine)


def test_a_change_to_columns_a_view_does_not_read_costs_it_nothing(
    spark, make_project, src, tmp_path
):
    other = cdf_source(tmp_path / "other", rows((1, "x", 5), (3, "y", 6)))
    views = {
        "keys": "CREATE VIEW keys AS SELECT k, grp FROM src WHERE k > 1",
        "vals": "CREATE VIEW vals AS SELECT k, v FROM src",
        "pairs": "CREATE VIEW pairs AS SELECT s.k, s.grp, o.v FROM src s JOIN other o ON o.k = s.k",
        "mixed": "CREATE VIEW mixed AS SELECT a.k, a.grp FROM other a JOIN other b ON b.k = a.k "
        "UNION ALL SELECT k, grp FROM src",
    }
    engine = Engine(make_project(views, {"src": src, "other": other}), spark=spark)
    assert engine.refresh().ok
    # `src` changes only in `v` (an update, and a row deleted and inserted again); `other`
    # changes in a column `pairs` reads.
    DeltaTable(src).update({"v": "v + 1"}, predicate="k = 3")
    DeltaTable(src).delete("k = 1")
    write_deltalake(src, rows((1, "a", 10)), mode="append")
    DeltaTable(other).update({"v": "v * 10"}, predicate="k = 3")
    report = engine.refresh()
    assert report.ok, [v.error for v in report.views]
    by_view = {v.view: v for v in report.views}
    assert not by_view["keys"].inputs_changed and by_view["keys"].spark_jobs == 0
    assert not by_view["mixed"].inputs_changed and by_view["mixed"].spark_jobs == 0
    assert by_view["vals"].inputs_changed and by_view["vals"].rows_changed == 4
    # `pairs` runs only the path of `other`'s change: it looks `src` up, never `other`.
    assert set(by_view["pairs"].lookups) == {"src[k]"}, by_view["pairs"].lookups
    assert by_view["pairs"].rows_changed == 4
    assert_correct(engine)
    # A change that reaches the columns read runs that input's path (`other` is unchanged
    # now); a join none of whose inputs changed runs no path at all.
    DeltaTable(src).update({"grp": "'c'"}, predicate="k = 3")
    report = engine.refresh()
    by_view = {v.view: v for v in report.views}
    assert report.ok and by_view["keys"].rows_changed == 4
    assert set(by_view["pairs"].lookups) == {"other[k]"}, by_view["pairs"].lookups
    assert by_view["mixed"].lookups == {} and by_view["mixed"].rows_changed == 4
    assert_correct(engine)
    # In one commit range `other` changes a column `pairs` reads on one row and only one it
    # does not read on another: the latter is summed away on the driver, so the path looks
    # up one key, not two.
    DeltaTable(other).update({"v": "v + 1"}, predicate="k = 3")
    DeltaTable(other).update({"grp": "'z'"}, predicate="k = 1")
    report = engine.refresh()
    by_view = {v.view: v for v in report.views}
    assert report.ok and set(by_view["pairs"].lookups) == {"src[k]"}
    assert by_view["pairs"].lookups["src[k]"].keys == 1, by_view["pairs"].lookups
    assert_correct(engine)


def test_a_row_that_comes_and_goes_within_the_epochs_a_refresh_catches_up_on(
    spark, make_project, src
):
    """A view refreshed over two epochs at once logs a row inserted at the first and deleted
    at the second; its readable table receives the epochs' sum (nothing for that row), taken
    from the rows the driver has just logged."""
    view = {"vals": "CREATE VIEW vals AS SELECT k, v FROM src"}
    engine = Engine(make_project(view, {"src": src}), spark=spark)
    assert engine.refresh().ok
    write_deltalake(src, rows((4, "c", 40)), mode="append")
    assert engine.mint_epoch() is not None
    DeltaTable(src).delete("k = 4 OR k = 1")
    assert engine.mint_epoch() is not None
    report = engine.refresh()
    assert report.ok, [v.error for v in report.views]
    (result,) = report.views
    assert (result.previous_epoch, result.epoch) == (1, 3)
    assert (result.inserted, result.deleted) == (0, 1)
    assert_correct(engine)


def test_a_source_created_again_at_the_same_path_is_read_afresh(spark, make_project, tmp_path):
    """A source and lake deleted and created again in the same process (as a benchmark or a
    long-lived code location may do) have the same version and epoch numbers as before but
    other rows: nothing read for the first table may serve the second."""
    path = str(tmp_path / "again")
    project = make_project(VIEWS, {"src": path})
    for grp in ("a", "b"):
        shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(project / "lake", ignore_errors=True)
        write_deltalake(
            path,
            rows((1, grp, 11), (2, grp, 22), (3, grp, 33)),
            configuration={"delta.enableChangeDataFeed": "true"},
        )
        engine = Engine(project, spark=spark)
        assert engine.refresh().ok
        DeltaTable(path).update({"v": "v + 100"}, predicate=f"k = {1 if grp == 'a' else 2}")
        report = engine.refresh()
        assert report.ok and report.minted is not None and report.minted.epoch == 2
        assert_correct(engine)


def test_views_refreshed_at_once_share_arrangements_and_wait_for_their_inputs(
    spark, make_project, src
):
    """With ``[refresh] parallelism = 4`` independent views run side by side: views that
    look up the same arrangement find it written by one of them (no second copy staged), a
    view over views starts only when they are done, and a view that fails leaves the others
    to finish."""
    views = {
        **VIEWS,
        "pairs": "CREATE VIEW pairs AS SELECT a.k, b.v FROM src a JOIN src b ON a.grp = b.grp",
        "ordered": "CREATE VIEW ordered AS SELECT a.k, b.k AS k2 FROM src a JOIN src b "
        "ON a.grp = b.grp WHERE a.v < b.v",
        "pairs_big": "CREATE VIEW pairs_big AS SELECT p.k, b.v2 FROM pairs p "
        "JOIN big b ON p.k = b.k",
        "sums": "CREATE VIEW sums AS SELECT grp, sum(v) AS s FROM src GROUP BY grp",
        "both": "CREATE VIEW both AS SELECT s.grp, s.s, b.v2 FROM sums s JOIN big b "
        "ON b.grp = s.grp",
    }
    engine = Engine(make_project(views, {"src": src}, "[refresh]\nparallelism = 4"), spark=spark)
    assert engine.project.parallelism == 4
    shared = [
        k for k, a in engine.plan.arrangements.items() if {"pairs", "ordered"} <= set(a.users)
    ]
    assert shared, "pairs and ordered share the arrangement of src by grp"
    running: set[str] = set()
    most = [0]
    refresh_view = engine.views.refresh_view

    def counted(name, **kwargs):  # how many views are being refreshed at the same moment
        running.add(name)
        most[0] = max(most[0], len(running))
        try:
            return refresh_view(name, **kwargs)
        finally:
            running.discard(name)

    engine.views.refresh_view = counted
    report = engine.refresh()
    assert report.ok, [v.error for v in report.views]
    assert most[0] >= 2, "independent views were refreshed one at a time"
    for step in range(2):
        DeltaTable(src).update({"v": "v + 1"}, predicate="k = 1")
        write_deltalake(src, rows((10 + step, "a", 5), (20 + step, "c", 50)), mode="append")
        report = engine.refresh()
        assert report.ok, [v.error for v in report.views]
        epoch = report.minted.epoch
        assert {v.view: v.epoch for v in report.views} == dict.fromkeys(views, epoch)
        assert_correct(engine)
        for key in engine.plan.arrangements:
            uri = engine.arrangement_uri(key)
            assert commits_for_epoch(uri, epoch) == 1, key
            on_disk = {str(p) for p in Path(uri).rglob("*.parquet")}
            committed = {u.removeprefix("file://") for u in DeltaTable(uri).file_uris()}
            assert on_disk == committed, f"{key}: a second writer staged files nobody committed"
    # A view that fails at run time: the views that read it are skipped, the rest refresh.
    table = engine.layout.view_table("sums")
    empty = snapshot_rows(DeltaTable(table)).slice(0, 0)  # its rows carry deletion vectors
    write_deltalake(table, empty, mode="overwrite")
    DeltaTable(src).update({"v": "v + 1"}, predicate="grp = 'a'")
    report = engine.refresh()
    status = {v.view: v.status for v in report.views}
    assert status.pop("sums") == "failed" and status.pop("both") == "skipped"
    assert set(status.values()) == {"refreshed"}


def test_a_refresh_starts_the_views_on_its_longest_chains_first(spark, make_project, src):
    """Each table commit records how long the view's refresh took; the next refresh starts
    the views with the most expected work ahead of them (their own and their readers')
    first, and never a view before the views it reads."""
    views = {
        **VIEWS,
        "a_small": "CREATE VIEW a_small AS SELECT k FROM src WHERE grp = 'b'",
        "sums": "CREATE VIEW sums AS SELECT grp, sum(v) AS s FROM src GROUP BY grp",
    }
    engine = Engine(make_project(views, {"src": src}, "[refresh]\nparallelism = 1"), spark=spark)
    started: list[str] = []
    refresh_view = engine.views.refresh_view

    def recorded(name, **kwargs):
        started.append(name)
        return refresh_view(name, **kwargs)

    engine.views.refresh_view = recorded
    # A first build has no seconds recorded: the views start in dependency order.
    assert engine.refresh().ok
    assert started == list(engine.plan.order)
    for name in views:
        info = last_commit_metadata(engine.layout.view_table(name), REFRESH_SECONDS)
        assert info is not None and float(info[REFRESH_SECONDS]) > 0, name
    seconds = {"big": 1.0, "big_a": 5.0, "a_small": 0.5, "sums": 3.0}
    engine.scheduler.last_refresh_seconds = seconds.__getitem__
    started.clear()
    write_deltalake(src, rows((7, "a", 70), (8, "b", 80)), mode="append")
    assert engine.refresh().ok
    # big -> big_a is the longest chain (6s), then sums (3s), then a_small.
    assert started == ["big", "big_a", "sums", "a_small"]
    assert_correct(engine)


def test_a_change_above_recompute_above_recomputes_the_view(spark, make_project, tmp_path):
    """A change to more than ``recompute_above`` of a view's input rows (and to at least
    policy.recompute_min_rows of them) recomputes the view from its inputs' state, with its reason;
    a smaller one is applied incrementally; both give the same rows."""
    n = 3 * policy.current().recompute_min_rows
    path = str(tmp_path / "wide")
    wide = [(k, "ab"[k % 2], k % 97) for k in range(n)]
    write_deltalake(path, rows(*wide), configuration={"delta.enableChangeDataFeed": "true"})
    views = {
        **VIEWS,
        "sums": "CREATE VIEW sums AS SELECT grp, sum(v) AS s, count(*) AS n, max(v) AS m "
        "FROM src GROUP BY grp",
    }
    project = make_project(views, {"src": path}, "[refresh]\nrecompute_above = 0.4")
    engine = Engine(project, spark=spark)
    assert engine.refresh().ok
    # 200 updates (an update is a pre- and a post-image): incremental.
    DeltaTable(path).update({"v": "v + 1000"}, predicate="k < 100")
    report = engine.refresh()
    assert report.ok and {v.status for v in report.views} == {"refreshed"}
    assert_correct(engine)
    # Half the rows replaced: 2 * n / 2 updates of n rows, over the 0.4 limit.
    DeltaTable(path).delete(f"k < {n // 2}")
    write_deltalake(path, rows(*[(k + n, "c", k % 89) for k in range(n // 2)]), mode="append")
    report = engine.refresh()
    assert report.ok, [v.error for v in report.views]
    statuses = {v.view: v.status for v in report.views}
    assert statuses == {"big": "recomputed", "big_a": "recomputed", "sums": "recomputed"}
    sums = next(v for v in report.views if v.view == "sums")
    assert f"{n:,} updates to its inputs' {n:,} rows (100.0%)" in sums.reason
    assert "recompute_above = 0.4" in sums.reason
    assert sums.metadata()["reason"] == sums.reason
    assert_correct(engine)
    # With recompute_above = 1 the same kind of change is applied incrementally.
    DeltaTable(path).delete(f"k >= {n} AND k < {n + n // 2}")
    write_deltalake(path, rows(*[(k, "d", k % 83) for k in range(n // 2)]), mode="append")
    never = Engine(replace(engine.project, recompute_above=1.0), spark=spark)
    report = never.refresh()
    assert report.ok and {v.status for v in report.views} == {"refreshed"}
    assert_correct(never)


def test_a_change_of_insertions_only_is_appended_without_a_counting_pass(
    spark, make_project, src, monkeypatch, use_policy
) -> None:
    """A first build and an epoch that only adds rows are known from the log files' ``_diff``
        statistics to delete nothing: the table gets new files and no pass counts the change
        first. An epoch that deletes still counts, and marks deletion vectors (or, with them off,
    rewrites). A build does not sum equal rows
        (it would shuffle the whole view to merge duplicates): its log holds each row once."""
    counted: list[str] = []
    for name in ("_summary", "_summary_local"):  # by Spark, or on the driver
        real = getattr(ops.sink, name)

        def summary(net, columns, real=real, name=name):
            counted.append(name)
            return real(net, columns)

        monkeypatch.setattr(ops.sink, name, summary)
    engine = Engine(make_project(VIEWS, {"src": src}), spark=spark)
    assert engine.refresh().ok and counted == []
    assert_correct(engine)
    built = DeltaTable(engine.layout.view_log("big")).to_pyarrow_table(filters=[("k", "=", 3)])
    assert built.column("_diff").to_pylist() == [1, 1]  # the source's duplicate, twice
    table = engine.layout.view_table("big")
    before = set(DeltaTable(table).file_uris())
    write_deltalake(src, rows((5, "a", 50), (5, "a", 50), (6, "b", 60)), mode="append")
    report = engine.refresh()
    assert report.ok and counted == []
    big = next(v for v in report.views if v.view == "big")
    assert (big.inserted, big.deleted, big.files_rewritten) == (3, 0, 0)
    assert before < set(DeltaTable(table).file_uris())  # the old files stay as they were
    assert_correct(engine)
    held = _file_rows(table)
    DeltaTable(src).delete("k = 5")
    write_deltalake(src, rows((7, "a", 70)), mode="append")
    report = engine.refresh()
    # Deletions: counted (on the driver: the log files' row counts bound the change), and
    # marked in deletion vectors: no file rewritten, and the result says so.
    assert report.ok and counted and set(counted) == {"_summary_local"}
    big = next(v for v in report.views if v.view == "big")
    assert (big.inserted, big.deleted) == (1, 2)
    assert set(held) <= set(_file_rows(table))
    assert (big.files_rewritten, big.rows_rewritten) == (0, 0)
    assert big.metadata()["table_rows_rewritten"] == 0
    assert sum(f.deleted for f in table_files(table)) == 2
    assert_correct(engine)
    # Without deletion vectors their files are rewritten: how many, and the rows they held.
    use_policy(deletion_vectors=False)
    held = _file_rows(table)
    DeltaTable(src).delete("k = 7")  # in a file without a vector (one with is Delta's)
    report = engine.refresh()
    big = next(v for v in report.views if v.view == "big")
    replaced = set(held) - set(_file_rows(table))
    assert replaced and big.files_rewritten == len(replaced)
    assert big.rows_rewritten == sum(held[f] for f in replaced) >= 1
    assert big.metadata()["table_rows_rewritten"] == big.rows_rewritten
    assert_correct(engine)


def _file_rows(uri: str) -> dict[str, int]:
    """A Delta table's current files and the rows each holds."""
    adds = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
    return {a["path"]: a["num_records"] for a in adds}


def _jobs_run_by(spark, block) -> int:
    """How many Spark jobs ``block()`` ran (job ids are numbered in order): two probe jobs,
    each in a group of its own (closed: the thread's job properties are restored), bracket it."""
    ids = []
    for _ in range(2):
        probe = JobGroup("test probe", "test probe")
        probe.open(spark)
        spark.range(1).collect()
        probe.close(spark)
        ids.append(max(spark.sparkContext.statusTracker().getJobIdsForGroup(probe.id)))
        if len(ids) == 1:
            block()
    return ids[1] - ids[0] - 1


def test_each_views_spark_jobs_run_in_a_group_of_their_own(spark, make_project, src):
    """A view's refresh runs its Spark jobs in a job group named for the view (the Spark UI
    lists them so) and reports how many it ran. Views refreshed side by side keep their jobs
    apart: every job of the refresh is in one view's group, and each view counts the same
    jobs as when the same change is refreshed one view at a time."""
    views = {
        **VIEWS,
        "pairs": "CREATE VIEW pairs AS SELECT a.k, b.v FROM src a JOIN src b ON a.grp = b.grp",
        "sums": "CREATE VIEW sums AS SELECT reverse(grp) AS g, sum(v) AS s, max(v) AS top, "
        "median(v) AS mid FROM src GROUP BY reverse(grp)",  # reverse(): Spark's (ivm.plan.driver)
    }
    root = make_project(views, {"src": src})
    base = Engine(root, spark=spark).project
    alone, together = (
        Engine(replace(base, lake=str(root / f"lake{n}"), parallelism=n), spark=spark)
        for n in (1, 3)
    )
    for engine in (alone, together):
        assert engine.refresh().ok
    DeltaTable(src).update({"v": "v + 1"}, predicate="k = 1")
    write_deltalake(src, rows((4, "a", 5), (5, "c", 50)), mode="append")
    sc = spark.sparkContext
    counts = []
    for engine in (alone, together):
        assert engine.mint_epoch() is not None
        for key in engine.plan.arrangements:  # written now: no view writes one below
            engine.refresh_arrangement(key)
        ungrouped = set(sc.statusTracker().getJobIdsForGroup())
        reports: list = []
        ran = _jobs_run_by(spark, lambda e=engine, out=reports: out.append(e.refresh()))
        (report,) = reports
        assert report.ok and report.minted is None
        assert set(sc.statusTracker().getJobIdsForGroup()) <= ungrouped, "a job ran ungrouped"
        assert sum(v.spark_jobs for v in report.views) == ran
        for v in report.views:
            if v.spark_jobs:
                assert v.view in v.spark_job_group, v
                assert len(sc.statusTracker().getJobIdsForGroup(v.spark_job_group)) == v.spark_jobs
            else:  # only a refresh the driver computed (ops.stateless.driver) runs no Spark job
                assert v.computed_by == "driver", v
            assert v.metadata()["spark_jobs"] == v.spark_jobs
        assert {v.view for v in report.views if v.computed_by == "spark"} >= {"sums"}
        # the types Spark gave the driver's expressions, kept for the next process
        assert (Path(engine.layout.root) / "_ivm" / "expression_types.json").exists()
        counts.append({v.view: v.spark_jobs for v in report.views})
        assert_correct(engine)
    assert counts[0] == counts[1]
