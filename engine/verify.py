"""Verification and repair: a view compared with Spark's evaluation of its SQL from scratch at
the view's epoch, and, when they differ, rebuilt at a new epoch.

Contract in ``(data, time, diff)`` terms: a view is correct at epoch ``e`` when its log's
updates up to ``e``, summed per row, equal (as a multiset, every multiplicity non-negative) the
SQL evaluated over its inputs at ``e``, and its readable table holds exactly those rows. A
repair logs the difference ``fresh - stored`` at a new epoch, so downstream views receive it.
"""

from __future__ import annotations

import time

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from engine.catalog import Catalog
from engine.columns import spark_query
from engine.inputs import Inputs
from engine.oracle import SparkBackend, column_rules, tolerant_differences
from engine.results import VerifyResult
from engine.schedule import Scheduler
from engine.session import Session
from ivm.errors import IvmError
from ivm.sql.lower import referenced_tables
from ivm.sql.parse import parse_view
from ops import DIFF, TIME
from ops.ingest import read_table, view_changes


def _rows(df: DataFrame) -> DataFrame:
    """Updates with positive diffs as rows, each repeated ``_diff`` times."""
    return df.where(F.col(DIFF) > 0).withColumn(
        "_copy", F.explode(F.sequence(F.lit(1), F.col(DIFF).cast("int")))
    )


class Verifier:
    """Verifying and repairing views (see the module)."""

    def __init__(
        self, catalog: Catalog, session: Session, inputs: Inputs, scheduler: Scheduler
    ) -> None:
        self.catalog = catalog
        self.session = session
        self.inputs = inputs
        self.scheduler = scheduler

    def from_scratch(self, name: str, epoch: int) -> DataFrame:
        """The view's SQL evaluated by Spark from scratch over its inputs at ``epoch`` (sources
        at that epoch's versions, upstream views' contents at that epoch): no state, no updates.
        """
        cat = self.catalog
        plan = cat.view(name)
        # Every table the SQL names: the plan may not read one (a constant join condition).
        named = referenced_tables(parse_view(plan.sql, plan.file))
        known = set(cat.plan.views) | set(cat.sources)
        for coll in dict.fromkeys([*plan.inputs, *sorted(named & known)]):
            rows = _rows(self.inputs.updates(coll, 0, epoch))
            rows.drop(TIME, DIFF, "_copy").createOrReplaceTempView(coll)
        return spark_query(self.session.spark, plan.sql, plan.file)  # the SQL as written

    def verify(self, name: str, *, examples: int = 3) -> VerifyResult:
        """Compare a view with :meth:`from_scratch` at its epoch: its diff log summed up to
        that epoch, and its readable table; also count negative multiplicities in the log.
        Columns are compared exactly but for floating-point ones, equal within the oracle's
        stated tolerance (:mod:`engine.oracle`; the result lists it). A table behind its log
        (a refresh stopped between the two commits) is reported."""
        with self.session.job_group(f"verify {name}", f"ivm: verify view {name}"):
            return self._verify(name, examples)

    def _verify(self, name: str, examples: int) -> VerifyResult:
        cat, spark = self.catalog, self.session.spark
        started = time.perf_counter()
        plan = cat.view(name)
        table_uri, log_uri = cat.layout.view_table(name), cat.layout.view_log(name)
        epoch, table_epoch = cat.table_epoch(log_uri), cat.table_epoch(table_uri)
        result = VerifyResult(name, epoch)
        if epoch == 0:
            raise IvmError(f"view {name!r} has not been materialized yet: nothing to verify")

        def named(df: DataFrame) -> DataFrame:
            cols = zip(df.schema.fields, plan.columns, strict=True)
            return df.select(*[F.col(f"`{f.name}`").alias(c) for f, c in cols])

        log, _ = view_changes(spark, log_uri, cat.table_schema(log_uri), -1, epoch)
        summed = log.groupBy(*[F.col(f"`{c}`") for c in plan.columns]).agg(F.sum(DIFF).alias(DIFF))
        result.negative = summed.where(F.col(DIFF) < 0).count()
        log_rows = _rows(summed).select(*[F.col(f"`{c}`") for c in plan.columns])
        expected = named(self.from_scratch(name, epoch))
        actual = named(log_rows)
        if table_epoch == epoch:  # the table must hold exactly the log's rows
            table = named(read_table(spark, table_uri, cat.table_schema(table_uri)))
            actual = actual.unionByName(table.exceptAll(actual)).exceptAll(actual.exceptAll(table))
        else:
            result.examples.append(f"table at epoch {table_epoch} is behind its log: refresh")
            result.extra += 1
        # Each side is computed once (the from-scratch one can be a large job), then compared.
        expected, actual = expected.persist(), actual.persist()
        try:
            result.expected_rows, result.actual_rows = expected.count(), actual.count()
            floating = (T.DoubleType, T.FloatType)
            if any(isinstance(f.dataType, floating) for f in expected.schema.fields):
                self._tolerant(result, expected, actual, examples)
            else:
                self._exact(result, expected, actual, examples)
        finally:
            expected.unpersist()
            actual.unpersist()
        result.seconds = time.perf_counter() - started
        cat.progress(result.describe())
        return result

    @staticmethod
    def _exact(result: VerifyResult, expected: DataFrame, actual: DataFrame, examples: int) -> None:
        """Every column exact: Spark's EXCEPT ALL, both ways."""
        missing = expected.exceptAll(actual).persist()
        extra = actual.exceptAll(expected).persist()
        result.missing, result.extra = missing.count(), result.extra + extra.count()
        for label, df in (("missing", missing), ("extra", extra)):
            for row in df.limit(examples).collect():
                result.examples.append(f"{label} {tuple(row)}")
            df.unpersist()

    def _tolerant(
        self, result: VerifyResult, expected: DataFrame, actual: DataFrame, examples: int
    ) -> None:
        """``expected`` against ``actual``, both persisted, with a floating-point column,
        compared in Spark under the oracle's rules (:func:`engine.oracle.tolerant_differences`):
        counts into ``result``, with examples and the rule of each column not compared
        exactly."""
        rules = column_rules(to_arrow_schema(expected.schema), to_arrow_schema(actual.schema))
        backend = SparkBackend(self.session.spark)
        try:
            e, a = backend.register(expected), backend.register(actual)
            diff = tolerant_differences(
                backend, e, expected.columns, a, actual.columns, rules, collect=False
            )
        finally:
            backend.close()
        result.missing, result.extra = diff.missing_rows, result.extra + diff.extra_rows
        for label, rows in (("missing", diff.missing), ("extra", diff.extra)):
            result.examples += [f"{label} {row}" for row in list(rows)[:examples]]
        result.tolerances = [*diff.tolerances("Spark"), *diff.notes]

    def repair(self, name: str) -> VerifyResult:
        """Rebuild a view (its state and contents) at a new epoch, writing the correcting
        updates to its diff log so downstream views receive them, then verify again. Its
        table is rewritten from the log (the log is what downstream views consumed)."""
        self.scheduler.views.repairing = {name}
        try:  # every view moves to the new epoch: upstream ones so this one can reach it
            self.scheduler.refresh(rebuild=[name])
        finally:
            self.scheduler.views.repairing = set()
        result = self.verify(name)
        result.repaired = True
        return result
