"""The engine's Spark session: what its settings must buy, measured on the session itself."""

from __future__ import annotations

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
