"""Compaction on the real stack: after several epochs of random changes, ``ivm compact``
advances every update table's ``since`` and consolidates, leaving every view, diff log and
lookup unchanged (DuckDB oracle before and after, and through later refreshes), with fewer
rows and files; a table another writer committed to meanwhile is left alone."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from engine.cli import main
from engine.compact import compact, storage_report, targets
from engine.facade import Engine
from resources.lake import replace_files, table_files
from tests.test_oracle import built_random_lake, check_all

pytestmark = pytest.mark.spark

VIEWS = {
    "per_grp": "CREATE VIEW per_grp AS SELECT grp, count(*) AS n, sum(price) AS s, "
    "min(qty) AS q FROM items GROUP BY grp",
    "big_grp": "CREATE VIEW big_grp AS SELECT grp, s FROM per_grp WHERE n > 3",
    "item_events": "CREATE VIEW item_events AS SELECT i.id, i.grp, e.kind FROM items i "
    "JOIN events e ON e.id = i.id",
    "grp_events": "CREATE VIEW grp_events AS SELECT p.grp, p.n, x.kind FROM per_grp p "
    "JOIN item_events x ON x.grp = p.grp",
}


def test_compaction_keeps_every_view_and_shrinks_the_tables(spark, make_project, tmp_path, capsys):
    lake, engine = built_random_lake(spark, make_project, tmp_path, VIEWS, 11)
    for _ in range(2):
        lake.random_batch()
        assert engine.refresh().ok
    before = {t.uri: (t.kind, t.since) for t in targets(engine)}
    kinds = {kind for kind, _ in before.values()}
    assert kinds == {"arrangement", "log", "state", "table"}, kinds
    assert {since for kind, since in before.values() if kind != "table"} == {3}

    tracker = spark.sparkContext.statusTracker()
    ungrouped = set(tracker.getJobIdsForGroup())
    code = main(["--project", str(engine.project.root), "compact", "--json", "--hours", "0"])
    assert code == 0
    # Its Spark jobs run in one job group per table (the Spark UI names the table).
    assert set(tracker.getJobIdsForGroup()) <= ungrouped
    report = json.loads(capsys.readouterr().out)
    by_kind: dict[str, list[dict]] = {}
    for t in report["tables"]:
        assert t["skipped"] in (None, "nothing to do"), t
        by_kind.setdefault(t["kind"], []).append(t)
    for kind in ("arrangement", "log", "state"):
        assert all(t["since_after"] == 3 for t in by_kind[kind]), by_kind[kind]
        assert sum(t["rows_after"] for t in by_kind[kind]) < sum(
            t["rows_before"] for t in by_kind[kind]
        ), kind
    assert report["totals"]["files_after"] < report["totals"]["files_before"]
    assert report["files_vacuumed"] > 0
    views = {s["what"]: s for s in report["storage"]}
    assert views["view per_grp"]["ratio"] >= 1
    assert any(w.startswith("arrangement items") for w in views), views

    engine = Engine(engine.project, spark=spark)
    check_all(engine)  # views, logs summed to their epoch, tables: unchanged
    # A second compaction finds nothing to do; refreshes go on from the compacted tables.
    again = compact(engine, retention_hours=0)
    assert all(t.skipped == "nothing to do" for t in again.tables), again.tables
    lake.random_batch()
    report = engine.refresh()
    assert report.ok, [v.error for v in report.views]
    check_all(engine)
    assert storage_report(engine)


def test_compaction_leaves_a_table_another_writer_moved(spark, make_project, tmp_path):
    _, engine = built_random_lake(spark, make_project, tmp_path, VIEWS, 5)
    uri = engine.layout.view_log("per_grp")
    dt = DeltaTable(uri)
    version = dt.version()
    schema = pa.schema(dt.schema().to_arrow())
    rows = dt.to_pyarrow_table().num_rows
    # Someone commits after the compactor read the table: its commit must not land.
    DeltaTable(uri).create_write_transaction([], mode="append", schema=schema)
    done = replace_files(
        uri, app_id="x", expected_version=version, schema=schema, adds=[], metadata={}
    )
    assert done is None
    assert DeltaTable(uri).to_pyarrow_table().num_rows == rows


def test_compaction_purges_deletion_vectors(spark, make_project, tmp_path, use_policy):
    """View tables that took deletions as deletion vectors are compacted by Delta (OPTIMIZE,
    REORG ... APPLY (PURGE)): afterwards no file has deleted rows, the rows and the tables'
    epochs are the same, and refreshes go on; Delta's VACUUM keeps what the tables need."""
    use_policy(rewrite_copy_rows=0)
    views = {
        "per_grp": VIEWS["per_grp"],
        "item_rows": "CREATE VIEW item_rows AS SELECT id, grp, qty FROM items",
    }
    lake, engine = built_random_lake(spark, make_project, tmp_path, views, 23)
    lake.random_batch()
    assert engine.refresh().ok
    tables = {v: engine.layout.view_table(v) for v in views}
    epochs = {v: engine.table_epoch(t) for v, t in tables.items()}
    assert any(f.deleted for t in tables.values() for f in table_files(t))
    report = compact(engine, retention_hours=0)
    compacted = {t.table: t for t in report.tables if t.kind == "table"}
    assert all(t.rows_after == t.rows_before for t in compacted.values()), compacted
    assert not [f for t in tables.values() for f in table_files(t) if f.deleted]
    assert {v: engine.table_epoch(t) for v, t in tables.items()} == epochs
    check_all(engine)
    lake.random_batch()
    assert engine.refresh().ok
    check_all(engine)
