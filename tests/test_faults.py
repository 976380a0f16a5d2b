"""Exactly-once under crashes: a refresh killed with SIGKILL at each point where it can die
(``resources.faults``), then rerun, leaves every view equal to the oracle with each epoch
committed once to every diff log; files of the commit that never happened are vacuumed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from engine.facade import Engine
from resources.faults import ENV
from resources.lake import open_table, table_files
from tests.lakegen import JoinLake
from tests.marks import by_turns
from tests.test_oracle import check_all

pytestmark = pytest.mark.spark

VIEWS = {
    "per_cust": "CREATE VIEW per_cust AS SELECT o_cust, count(*) AS n, max(o_total) AS m "
    "FROM orders GROUP BY o_cust",
    "cust_lines": "CREATE VIEW cust_lines AS SELECT o.o_id, o.o_cust, l.l_no, l.l_qty "
    "FROM orders o JOIN lines l ON l.l_order = o.o_id",
    "open_orders": "CREATE VIEW open_orders AS SELECT o_id, o_total FROM orders "
    "WHERE o_status = 'O'",
}
POINTS = [
    "ingest",  # inputs read, nothing written
    "staged",  # files written, commit not made (the first is an arrangement's)
    "state_committed",  # one table committed (a reduction's state), the next not
    "log_committed",  # a view's diff log committed, its table not
    "table_committed",  # all committed; a Dagster run would not have recorded it yet
]


SPARK = '[spark]\n"spark.master" = "local[1]"\n"spark.ui.enabled" = "false"\n'
SPARK += '"spark.sql.shuffle.partitions" = "1"\n'


@pytest.mark.parametrize(
    ("policy", "points"),
    [
        ("deletion_vectors = false", POINTS),
        # the table's deletions marked by the driver: killed after the feature was enabled,
        # and with the inserted rows staged (after its commit is table_committed, above)
        by_turns(
            "deletion_vectors = true",
            ["vectors_enabled", "vectors_staged"],
            id="deletion vectors by the driver",
        ),
        # by one delta-spark MERGE: killed before it (after it is table_committed, above)
        by_turns(
            "rewrite_copy_rows = 0\ndriver_rewrite_rows = 0",
            ["vectors_enabled"],
            id="deletion vectors by delta-spark",
        ),
    ],
    ids=["files rewritten", "deletion vectors by the driver", "deletion vectors by delta-spark"],
)
def test_killed_refreshes_rerun_exactly_once(spark, make_project, tmp_path, policy, points):
    lake = JoinLake(tmp_path / "data", 8)
    root = make_project(VIEWS, lake.create(), extra=f"{SPARK}[policy]\n{policy}\n")
    engine = Engine(root, spark=spark)
    assert engine.refresh().ok
    for point in points:
        lake.random_batch()
        proc = subprocess.run(
            [sys.executable, "-m", "engine.cli", "--project", str(root), "-q", "refresh"],
            env={**os.environ, ENV: point},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == -9, (point, proc.returncode, proc.stderr[-2000:])
        engine = Engine(root, spark=spark)
        report = engine.refresh()
        assert report.ok, (point, [v.error for v in report.views])
        check_all(engine)
        epochs = engine.latest_epoch()
        for view in VIEWS:
            commits = open_table(engine.layout.view_log(view)).history()
            assert len(commits) == epochs, (point, view, len(commits), epochs)
            table = engine.layout.view_table(view)
            assert open_table(table).transaction_version(engine.app_id(table)) == epochs
    if "staged" not in points:
        assert any(f.deleted for v in VIEWS for f in table_files(engine.layout.view_table(v))), (
            "the view tables should have deletion vectors"
        )
        check_all(engine)
        return
    # The files the "staged" crash wrote were never committed: vacuum removes them.
    orphans = [p for p in (root / "lake").rglob("*.parquet") if not _referenced(engine, p)]
    assert orphans, "the staged crash should have left uncommitted files"
    deleted = engine.vacuum(retention_hours=0)
    assert sum(deleted.values()) >= len(orphans)
    assert not [p for p in orphans if p.exists()]
    check_all(engine)


def _referenced(engine: Engine, path) -> bool:
    """Whether a Parquet file belongs to the current version of its table."""
    for uri in engine.lake_tables():
        if str(path).startswith(uri + "/"):
            return str(path) in set(open_table(uri).file_uris())
    return True


DAGSTER_RUN = """
import os, sys
import dagster as dg
from dagster_project.definitions import build_definitions
from dagster_project.jobs import REFRESH_JOB

result = build_definitions(sys.argv[1]).resolve_job_def(REFRESH_JOB).execute_in_process(
    instance=dg.DagsterInstance.get(), raise_on_error=False
)
print("success" if result.success else "failure", flush=True)
os._exit(0)
"""


def test_dagster_run_killed_before_recording_materializations(spark, make_project, tmp_path):
    """Killed after the views' commits, before Dagster records their materializations: the
    next run records them (the views are up to date at that epoch) and applies nothing twice."""
    import dagster as dg

    from assets.views import view_key

    lake = JoinLake(tmp_path / "data", 9)
    root = make_project(VIEWS, lake.create(), extra='[spark]\n"spark.master" = "local[1]"')
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(home)}

    def run(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", DAGSTER_RUN, str(root)],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=600,
        )

    killed = run(**{ENV: "before_materialization"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    engine = Engine(root, spark=spark)
    # Every view committed epoch 1 (then the process died); Dagster has no record of them.
    assert all(engine.table_epoch(engine.layout.view_table(v)) == 1 for v in VIEWS)
    instance = dg.DagsterInstance.from_config(str(home))
    assert all(instance.get_latest_materialization_event(view_key(v)) is None for v in VIEWS)
    rerun = run()
    assert rerun.stdout.strip().endswith("success"), rerun.stderr[-2000:]
    instance = dg.DagsterInstance.from_config(str(home))
    for view in VIEWS:
        event = instance.get_latest_materialization_event(view_key(view))
        assert event is not None, view
        meta = event.asset_materialization.metadata
        assert meta["epoch"].value == 1
        assert meta["status"].value == "up-to-date", view
        assert len(open_table(engine.layout.view_log(view)).history()) == 1, view
    check_all(Engine(root, spark=spark))
