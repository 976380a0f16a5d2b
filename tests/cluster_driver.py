"""The driver process of tests/test_cluster.py: the engine refreshing a project whose
``[spark]`` names a standalone cluster, in a process of its own, as ``ivm refresh`` or a
Dagster run would (the test's process already holds the suite's local SparkContext, and a
process has one).

Usage: ``python tests/cluster_driver.py PROJECT OUT STEPS``. For each of STEPS steps it
refreshes every view with the project's own session and policy (its ``[spark]`` and
``[policy]``), compares every view and its diff log with DuckDB
(:func:`engine.oracle.compare_views`) and writes ``OUT/step-<i>.json`` (written whole, then
renamed); before the next step it waits for a line on stdin (the test changes the sources
meanwhile); end of input ends it. The first step's report also says what the executors' Python
sees, from a probe run as a Spark task: which of the project's packages it could import.

Contract: none in ``(data, time, diff)`` terms; it reports, and only the engine writes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from engine.facade import Engine
from engine.oracle import compare_views

PROJECT_PACKAGES = ("ivm", "ops", "engine", "resources")


def executor_probe(batches: Iterable[Any]) -> Iterator[Any]:
    """A ``mapInArrow`` function (pickled by value: it is ``__main__``'s) reporting, from the
    Python worker that runs it, whether it started without ``site`` and which project packages it can import."""
    import importlib.util
    import os

    import pyarrow as pa

    for _ in batches:
        pass
    found = [p for p in PROJECT_PACKAGES if importlib.util.find_spec(p) is not None]
    yield pa.RecordBatch.from_pylist(
        [{"pid": os.getpid(), "no_site": bool(sys.flags.no_site), "importable": found}]
    )


def probe(spark: Any) -> list[dict[str, Any]]:
    """Run :func:`executor_probe` as one Spark task."""
    schema = "pid long, no_site boolean, importable array<string>"
    rows = spark.range(1, numPartitions=1).mapInArrow(executor_probe, schema).collect()
    return [r.asDict() for r in rows]


def step(root: Path, first: bool) -> dict[str, Any]:
    """Refresh the project, compare its views with DuckDB; what the test checks."""
    engine = Engine(root)
    report = engine.refresh()
    spark = engine.session.spark
    sc = spark.sparkContext
    out: dict[str, Any] = {
        "master": sc.master,
        "app_id": sc.applicationId,
        "seconds": round(report.seconds, 2),
        "views": [
            {
                "view": v.view,
                "status": v.status,
                "computed_by": v.computed_by,
                "error": v.error,
                "spark_jobs": v.spark_jobs,
            }
            for v in report.views
        ],
        "comparisons": [
            {"view": c.view, "equal": c.equal, "describe": c.describe()}
            for c in compare_views(engine, log=True)
        ],
    }
    if first:
        out["probe"] = probe(spark)
    return out


def main(argv: list[str]) -> None:
    from pyspark.sql import SparkSession

    root, out, steps = Path(argv[1]), Path(argv[2]), int(argv[3])
    for i in range(steps):
        if i and not sys.stdin.readline():
            break  # the test ended
        result = step(root, first=i == 0)
        partial = out / f"step-{i}.json.part"
        partial.write_text(json.dumps(result, indent=1))
        partial.rename(out / f"step-{i}.json")
    spark = SparkSession.getActiveSession()
    if spark is not None:
        spark.stop()  # the application ends FINISHED on the master


if __name__ == "__main__":
    main(sys.argv)
