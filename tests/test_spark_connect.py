"""Spark Connect: a run in a fresh process computes on a warm server's JVM (``ivm
spark-server``; here the shared test session serves it) and gets the same answers as DuckDB.

The unit tests need no Spark: settings a client sends, a server that does not answer, the
optimized plan read from EXPLAIN text (all a client sees of a plan)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.facade import Engine
from ops.reduce.spark import plan_nodes
from resources.spark import (
    CONNECT_PLUGIN,
    JobGroup,
    SparkConnectError,
    check_spark,
    free_port,
    remote_address,
    spark_conf,
)
from tests.lakegen import JoinLake
from tests.test_joins import VIEWS as JOIN_VIEWS
from tests.test_oracle import check_all
from tests.test_reduce import JOIN_VIEWS as REDUCE_VIEWS

REPO = Path(__file__).resolve().parent.parent

EXPLAINED = """== Parsed Logical Plan ==
'Union false, false
:- 'Project ['a]
+- LocalRelation [a#1L]

== Optimized Logical Plan ==
Union false, false
:- Project [a#1L, (b#2L + 1) AS c#3L]
:  +- Filter (isnotnull(b#2L) AND (b#2L > 0))
:     +- Relation [a#1L,b#2L] parquet
+- LocalRelation [a#4L, c#5L]

== Physical Plan ==
Union
:- *(1) Project [a#1L]
"""


def test_plan_nodes_are_the_optimized_plans() -> None:
    assert plan_nodes(EXPLAINED) == {
        "Union",
        "Project",
        "Filter",
        "LogicalRelation",
        "LocalRelation",
    }


def test_a_client_sends_its_session_settings_only(monkeypatch) -> None:
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    local = spark_conf({})
    assert local["spark.master"] == "local[*]" and "spark.remote" not in local
    for overrides, env in [({"spark.remote": "sc://h:1"}, None), ({}, "sc://h:1")]:
        if env:
            monkeypatch.setenv("SPARK_REMOTE", env)
        conf = spark_conf(overrides)
        assert "spark.master" not in conf and "spark.driver.memory" not in conf
        assert "spark.sql.codegen.cache.maxEntries" not in conf  # static: the server's
        assert conf["spark.sql.shuffle.partitions"] == local["spark.sql.shuffle.partitions"]
        assert set(conf) <= {"spark.remote"} | {k for k in local if k.startswith("spark.sql.")}


def test_a_server_that_does_not_answer_is_named() -> None:
    port = free_port()  # nothing listens on it
    url = f"sc://localhost:{port}"
    with pytest.raises(SparkConnectError, match=f"{url}.*ivm spark-server --port {port}"):
        check_spark({"spark.remote": url})


def test_remote_addresses() -> None:
    assert remote_address("sc://h:15010") == ("h", 15010)
    assert remote_address("sc://h/;token=x") == ("h", 15002)
    assert remote_address("sc://127.0.0.1:1/;use_ssl=true") == ("127.0.0.1", 1)


def test_job_group_names_are_valid_tags() -> None:
    assert "," not in JobGroup("view a,b", "d").id


@pytest.mark.spark
def test_plan_nodes_agree_with_the_jvm(spark, tmp_path) -> None:
    from pyspark.sql import functions as F

    from ops.reduce.spark import scan_only

    spark.range(10).write.parquet(str(tmp_path / "t"))
    scan = spark.read.parquet(str(tmp_path / "t"))
    local = spark.createDataFrame([(1,)], "id long")
    frames = {
        "scan": scan.where(F.col("id") > 2).select((F.col("id") * 2).alias("x")),
        "union of scans": scan.unionByName(scan.where("id < 3")),
        "aggregate": scan.groupBy((F.col("id") % 2).alias("k")).count(),
        "join": scan.join(local, "id"),
        "local": local,
    }
    for name, df in frames.items():
        explained = df._jdf.queryExecution().toString()
        assert (plan_nodes(explained) <= {"LogicalRelation", "Project", "Filter", "Union"}) == (
            scan_only(df)
        ), name


VIEWS = {
    **{k: REDUCE_VIEWS[k] for k in ("agg_join", "top_orders", "top_lines")},
    **{k: JOIN_VIEWS[k] for k in ("cust_order_lines", "orders_left_customers")},
}


@pytest.mark.slow
@pytest.mark.spark
def test_dagster_run_in_a_fresh_process_computes_on_the_server(
    spark, spark_connect_url, make_project, tmp_path
) -> None:
    """The refresh job in a new process (as Dagster's run launcher starts each run), then
    ``ivm refresh``, with no Java they could start: they must compute on the server. After the
    build and each batch of changes every view equals DuckDB's result and its diff log sums
    to its table, and the server holds no session of the finished process."""
    assert CONNECT_PLUGIN in spark.conf.get("spark.plugins")
    lake = JoinLake(tmp_path / "data", 11)
    root = make_project(VIEWS, lake.create(), f'[spark]\n"spark.remote" = "{spark_connect_url}"')
    home = tmp_path / "dagster_home"
    home.mkdir()
    no_java = os.pathsep.join(
        d for d in os.environ.get("PATH", "").split(os.pathsep) if not shutil.which("java", path=d)
    )
    env = {
        **os.environ,
        "IVM_PROJECT": str(root / "ivm.toml"),
        "DAGSTER_HOME": str(home),
        "JAVA_HOME": str(tmp_path / "no-java"),
        "PATH": no_java,
    }
    cmd = [
        sys.executable, "-m", "dagster", "job", "execute",
        "-m", "dagster_project.definitions", "-j", "ivm_refresh", "--tags", json.dumps({}),
    ]  # fmt: skip
    ivm = [str(Path(sys.executable).parent / "ivm"), "-q", "--project", str(root), "refresh"]
    engine = Engine(root, spark=spark)
    for epoch, run in ((1, cmd), (2, cmd), (3, cmd), (4, ivm)):
        if epoch > 1:
            lake.random_batch()
        proc = subprocess.run(run, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        if run is cmd:  # the run's log says where it computed
            where = spark_connect_url.removeprefix("sc://")
            assert f"on the Spark Connect server {where}" in proc.stdout + proc.stderr
        status = engine.status()
        assert status["epoch"] == epoch
        assert {v["epoch"] for v in status["views"].values()} == {epoch}
        check_all(engine)
        # The run released its session: the server keeps nothing of it.
        assert connect_sessions(spark) == 0


def connect_sessions(spark) -> int:
    """Client sessions the test session's Spark Connect server holds (an internal API)."""
    service = getattr(spark._jvm.org.apache.spark.sql.connect.service, "SparkConnectService$")
    return service.__getattr__("MODULE$").sessionManager().listActiveSessions().size()


@pytest.mark.spark
def test_warm_up_verifies_every_view_and_writes_nothing(spark, make_project, tmp_path) -> None:
    """``ivm spark-server --warm-up``: every built view verified on the server's session; a
    view not built yet is skipped; not one table of the lake gets a new version."""
    from deltalake import DeltaTable

    from engine.cli import warm_up

    lake = JoinLake(tmp_path / "data", 3)
    root = make_project(VIEWS, lake.create())
    engine = Engine(root, spark=spark)
    built = [v for v in engine.plan.order if v != "top_lines"]
    assert engine.refresh(built).ok
    versions = {uri: DeltaTable(uri).version() for uri in engine.lake_tables()}
    results = warm_up(engine.project, spark)
    assert sorted(r.view for r in results) == sorted(built)
    assert all(r.ok for r in results), [r.describe() for r in results]
    assert {uri: DeltaTable(uri).version() for uri in engine.lake_tables()} == versions
