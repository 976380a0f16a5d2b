"""Rows Spark's Parquet scans returned, by part of the lake, read from Spark's own SQL metrics.

A benchmark's measure, not the engine's: :class:`ScanRows` reads Spark's SQL status store (an
internal API, as :func:`bench.overhead.busy_seconds` does) for the queries that ran since
:meth:`ScanRows.mark`, and sums the ``number of output rows`` of every ``Scan parquet`` node by
where its files live: ``arrangements``, ``state``, ``logs`` and ``views`` under the lake root,
``sources`` for anything else (the sources' snapshots and appended files; a change feed comes
from the driver, not from a scan). Spark cuts a scan's file list in plan descriptions to
``spark.sql.maxMetadataStringLength`` characters (100 by default, shorter than many a lake
path): :class:`ScanRows` raises it for the session, which changes nothing but plan strings.
The count is after Parquet's row-group and page skipping, before any filter, so it is what a
query read, without the extra pass of ``Engine(measure_lookups=True)``. Queries the status
store no longer keeps (``spark.sql.ui.retainedExecutions``, 1,000 by default) are not
counted: a refresh of the bench's views runs under a hundred. The rows the driver decodes
itself (files of a readable table it rewrites, row groups a lookup reads once, small state
tables it reads: :func:`resources.lake.count_driver_read`) are added to their part, as Spark
never sees them.
"""

from __future__ import annotations

import re
from collections import Counter

from resources.lake import driver_reads

AREAS = ("arrangements", "state", "views", "logs", "sources")
"""The parts of the lake rows are counted by, in report order."""

METADATA_LENGTH = "spark.sql.maxMetadataStringLength"

_LOCATION = re.compile(r"Location: \w+\([^)]*\)\[([^,\]]+)")


def area_of(path: str, lake_root: str) -> str:
    """Which part of the lake a scanned file belongs to (see :data:`AREAS`)."""
    path = path.removeprefix("file:").removeprefix("//")
    root = lake_root.removeprefix("file:").removeprefix("//").rstrip("/") + "/"
    if not path.startswith(root):
        return "sources"
    first = path[len(root) :].split("/", 1)[0]
    return first if first in AREAS else "sources"


class ScanRows:
    """Counts the rows Parquet scans returned in the queries run after :meth:`mark`."""

    def __init__(self, spark, lake_root: str) -> None:
        spark.conf.set(METADATA_LENGTH, str(max(10_000, len(lake_root) + 200)))
        self._store = spark._jsparkSession.sharedState().statusStore()
        self._root = lake_root
        self._since = -1
        self._driver: dict[str, int] = {}

    def mark(self) -> None:
        """Count only the queries that start from now on (and the driver's reads)."""
        self._driver = driver_reads()
        executions = self._store.executionsList()
        ids = [executions.apply(i).executionId() for i in range(executions.size())]
        self._since = max(ids, default=-1)

    def rows(self) -> Counter[str]:
        """Rows returned by scans per area (:data:`AREAS`) in the queries since the mark."""
        out: Counter[str] = Counter()
        executions = self._store.executionsList()
        for i in range(executions.size()):
            execution_id = executions.apply(i).executionId()
            if execution_id <= self._since:
                continue
            graph = self._store.planGraph(execution_id)
            values = self._store.executionMetrics(execution_id)
            nodes = graph.allNodes()
            for j in range(nodes.size()):
                node = nodes.apply(j)
                found = _LOCATION.search(node.desc()) if node.name().startswith("Scan ") else None
                if found is None:
                    continue
                metrics = node.metrics()
                for k in range(metrics.size()):
                    metric = metrics.apply(k)
                    if metric.name() != "number of output rows":
                        continue
                    value = values.get(metric.accumulatorId())
                    if value.isDefined():
                        out[area_of(found.group(1), self._root)] += int(
                            str(value.get()).replace(",", "")
                        )
        for path, rows in driver_reads().items():
            if rows > self._driver.get(path, 0):
                out[area_of(path, self._root)] += rows - self._driver.get(path, 0)
        return out
