"""The engine's Spark session: what its settings must buy, measured on the session itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from py4j.clientserver import ClientServerConnection
from py4j.protocol import MEMORY_COMMAND_NAME
from pyspark.sql import functions as F

from resources.spark import DATAFRAME_DEBUGGING

pytestmark = pytest.mark.spark


def test_expressions_cost_few_jvm_round_trips(spark, monkeypatch) -> None:
    """A refresh builds thousands of Column expressions; each one's Py4J round trips are
    paid again every epoch. With Spark 4's DataFrame call-site capture on, ``col + lit``
    costs 30 of them (active session, a setting, set and clear the origin, per call); the
    engine's session turns it off."""
    F.col("warm")
    calls = 0
    send = ClientServerConnection.send_command

    def counted(self, command: str, *args, **kwargs):
        nonlocal calls
        # Garbage collection of earlier JVM objects may ride along; it is not the expression's.
        calls += not command.startswith(MEMORY_COMMAND_NAME)
        return send(self, command, *args, **kwargs)

    monkeypatch.setattr(ClientServerConnection, "send_command", counted)
    for _ in range(10):
        F.col("a") + F.lit(1)
    assert calls <= 10 * 10, f"{calls / 10:.0f} Py4J round trips per `col + lit` (7 expected)"
    assert spark.conf.get(DATAFRAME_DEBUGGING) == "false"


def test_jvm_runs_the_throughput_collector(spark) -> None:
    """The engine's JVM collects garbage with the parallel (throughput) collector, not G1:
    builds and recomputes ran 8-10% faster with it (see ``resources.spark.spark_conf``)."""
    jvm = spark.sparkContext._jvm
    beans = jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    names = {beans.get(i).getName() for i in range(beans.size())}
    assert names == {"PS Scavenge", "PS MarkSweep"}, names


def test_python_workers_run_this_interpreter(tmp_path: Path) -> None:
    """PySpark starts its Python workers with ``$PYSPARK_PYTHON``, else ``python3`` from the
    PATH, and ignores the ``spark.pyspark.python`` setting outside spark-submit: a session from
    ``get_spark`` runs them with this interpreter (it has PyArrow and the project: exact float
    sums and wide-decimal averages run there) even when the PATH's ``python3`` is another."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "python3"
    stub.write_text("#!/bin/sh\necho 'not the interpreter Spark should use' >&2\nexit 3\n")
    stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    script = (
        "from resources.spark import get_spark\n"
        "spark = get_spark({'spark.master': 'local[1]', 'spark.ui.enabled': 'false'})\n"
        "rows = spark.range(3).mapInArrow(lambda batches: batches, 'id long').count()\n"
        "print('rows', rows)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rows 3" in proc.stdout


def test_every_session_reads_and_writes_delta_with_deletion_vectors(spark, tmp_path: Path) -> None:
    """delta-spark is part of the engine's session (its jars fetched with Maven, its extension
    and catalog set): Delta SQL works, and a DELETE writes a deletion vector."""
    from delta.tables import DeltaTable

    path = str(tmp_path / "t")
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id BIGINT, g STRING) USING delta TBLPROPERTIES "
        "('delta.enableDeletionVectors' = 'true', 'delta.enableChangeDataFeed' = 'true')"
    )
    spark.range(100).selectExpr("id", "CAST(id % 3 AS STRING) AS g").write.format("delta").mode(
        "append"
    ).save(path)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id < 10")
    assert spark.read.format("delta").load(path).count() == 90
    last = DeltaTable.forPath(spark, path).history(1).collect()[0]
    assert last.operation == "DELETE"
    assert int(last.operationMetrics["numDeletionVectorsAdded"]) >= 1


def test_delta_jars_missing_maven_or_artifact_is_said_plainly(tmp_path: Path, monkeypatch) -> None:
    """Without Maven, the error says how to install it (or where to put the jars); a version
    Maven Central does not serve is quoted from Maven's own error; nothing partial is left."""
    from resources import delta

    monkeypatch.setenv(delta.JARS_ENV, str(tmp_path / "jars"))
    monkeypatch.setattr(delta.shutil, "which", lambda name: None)
    with pytest.raises(delta.DeltaJarsError, match="apt-get install maven"):
        delta.ensure_jars()
    monkeypatch.undo()
    monkeypatch.setenv(delta.JARS_ENV, str(tmp_path / "jars"))
    monkeypatch.setattr(delta, "delta_version", lambda: "0.0.404")
    with pytest.raises(delta.DeltaJarsError, match=r"delta-spark_4\.0_2\.13:0\.0\.404"):
        delta.ensure_jars()
    assert not (tmp_path / "jars").exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # the staging folder is gone too
