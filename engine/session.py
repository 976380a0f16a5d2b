"""The engine's Spark session: started on first need (planning and status run none, nor does a
refresh that finds nothing to compute), shared by the threads of one refresh, each thread's
jobs labelled by a job group (the Spark UI lists a view's jobs under its name, and its result
counts them). The session is the one given, or one a given factory builds on first need (a
Dagster resource's), or the project's own."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pyspark.sql import SparkSession

from engine.catalog import Catalog
from resources.spark import JobGroup, describe_session, get_spark, release, release_at_exit


class Session:
    """The Spark session of one engine, and its threads' job groups."""

    def __init__(
        self,
        catalog: Catalog,
        spark: SparkSession | Callable[[], SparkSession] | None = None,
    ) -> None:
        self._catalog = catalog
        self._factory = None if spark is None or isinstance(spark, SparkSession) else spark
        self._spark = spark if isinstance(spark, SparkSession) else None
        self._announced = False  # progress says once where Spark computes
        if self._spark is not None:
            release_at_exit(self._spark)  # a Spark Connect session: released on its server at exit
        self._lock = threading.Lock()
        self.thread = threading.local()
        """Per thread: ``group``, the JobGroup its jobs go to; ``found``, what the driver
        found failing in the view it refreshes (an EvaluationError, see engine.compute)."""

    @property
    def spark(self) -> SparkSession:
        with self._lock:  # views refreshed at once start it once
            if self._spark is None and self._factory is not None:
                self._spark = self._factory()
                release_at_exit(self._spark)
            elif self._spark is None:
                self._spark = get_spark(self._catalog.project.spark_conf)
            if not self._announced:
                self._announced = True
                self._catalog.progress(f"computing on {describe_session(self._spark)}")
        group = getattr(self.thread, "group", None)
        if group is not None and not group.opened:  # the session started inside the group
            group.open(self._spark)
        return self._spark

    def release(self) -> None:
        """Release a Spark Connect session on its server now (nothing for a classic session,
        whose JVM ends with this process)."""
        if self._spark is not None:
            release(self._spark)

    @contextmanager
    def job_group(self, name: str, description: str) -> Iterator[JobGroup | None]:
        """Put the Spark jobs this thread starts inside in one job group (see
        :class:`~resources.spark.JobGroup`); yields None inside another group, which then
        counts them. The session is not started for it: a step that needs no Spark runs none."""
        if getattr(self.thread, "group", None) is not None:
            yield None
            return
        group = self.thread.group = JobGroup(name, description)
        try:
            if self._spark is not None:
                group.open(self._spark)
            yield group
        finally:
            self.thread.group = None
            group.close(self._spark)

    def found(self) -> Any:
        """What the driver found failing in this thread's view (None: nothing)."""
        return getattr(self.thread, "found", None)
