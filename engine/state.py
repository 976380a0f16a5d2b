"""A view's state tables (``state/<view>/<table>``) as its reduce operators see them for one
refresh: the :class:`ops.reduce.spark.StateStore` the engine implements.

Contract in ``(data, time, diff)`` terms: each state table is an update log keyed by its sort
key; a refresh from epoch ``old`` to ``new`` reads it at ``old`` (the sum of updates with time
``<= old`` for the keys asked) and appends the updates of time ``new`` once
(``txn(table, new)``): a rerun after a crash finds them written and writes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame

from engine.catalog import Catalog
from engine.inputs import Inputs
from engine.session import Session
from ivm import policy
from ivm.errors import InvariantViolation
from ivm.plan.ir import Node, collections
from ivm.plan.planner import ViewPlan
from ivm.plan.reduce import StateTable
from ops.arrange import LookupStats, lookup, lookup_rows, write_held_updates, write_updates
from ops.reduce.spark import StateStore
from ops.sink import arrow_schema, collect_flat
from ops.stateless.spark import constants, render
from resources.faults import crash_point
from resources.lake import CommitResult, open_table, spark_compatible_schema

Commit = Callable[[str, dict[str, str]], CommitResult]


class ViewState:
    """One refresh's access to one view's state tables (see the module).

    Args:
        small: the inputs' change is small (``policy.driver_change_rows``), so the state's
            is too: written by the driver unless a write's known size says otherwise.
        stats: per state table, the lookups' statistics (added to the view's result).
    """

    def __init__(
        self,
        catalog: Catalog,
        session: Session,
        inputs: Inputs,
        plan: ViewPlan,
        done: int,
        target: int,
        stats: dict,
        *,
        small: bool = False,
        measure_lookups: bool = False,
    ) -> None:
        self.catalog, self.session, self.inputs = catalog, session, inputs
        self.plan, self.done, self.target = plan, done, target
        self.stats, self.small, self.measure_lookups = stats, small, measure_lookups

    def store(self) -> StateStore:
        """The operators' view of these tables."""
        return StateStore(
            self.session.spark,
            self.done,
            self.target,
            write=self.write,
            read=self.read,
            progress=self.progress,
            snapshot=self.snapshot,
            small=self.small,
            read_rows=self.read_rows,
            write_rows=self.write_rows,
            row_schema=self.row_schema,
        )

    def uri(self, table: StateTable) -> str:
        return self.catalog.state_uri(self.plan.name, table.name)

    def progress(self, message: str) -> None:
        self.catalog.progress(f"{self.plan.name}: {message}")

    def _committed(self, table: StateTable, by_driver: bool, commit: Commit) -> int | None:
        """Commit one epoch of a state table once: ``commit(uri, metadata)``; None when an
        earlier attempt wrote this epoch."""
        uri = self.uri(table)
        if self.catalog.table_epoch(uri) >= self.target:
            return None
        started = time.perf_counter()
        result = commit(uri, {"ivm.state": table.name, "ivm.view": self.plan.name})
        crash_point("state_committed")
        how = ", written by the driver" if by_driver else ""
        self.progress(
            f"state {table.name}: {result.rows} rows at epoch {self.target}{how} "
            f"({time.perf_counter() - started:.2f}s)"
        )
        return result.rows

    def write(
        self, table: StateTable, updates: DataFrame, rows_hint: int | None = None
    ) -> int | None:
        """Append an epoch's updates (a Spark DataFrame) to a state table once. A build's
        state of known, moderate size (``policy.driver_sort_rows``) is collected, sorted and
        written by the driver as Spark lays it out (no sampling pass, no shuffle); by Spark if
        a type does not carry over."""
        chosen = policy.current()
        small = self.small and (rows_hint or 0) <= chosen.driver_change_rows

        def by_spark(uri: str, metadata: dict[str, str]) -> CommitResult:
            return write_updates(
                updates,
                uri,
                table.key,
                app_id=self.catalog.app_id(uri),
                epoch=self.target,
                metadata=metadata,
                overwrite=self.done == 0 and open_table(uri) is not None,
                rows_hint=rows_hint,
                small=small,
            )

        def by_driver(uri: str, metadata: dict[str, str]) -> CommitResult:
            rows = collect_flat(updates)
            result = None
            if rows is not None:
                result = write_held_updates(
                    rows,
                    uri,
                    table.key,
                    arrow_schema(updates),
                    app_id=self.catalog.app_id(uri),
                    epoch=self.target,
                    metadata=metadata,
                    overwrite=open_table(uri) is not None,
                )
            return result or by_spark(uri, metadata)

        driver = self.done == 0 and rows_hint is not None and rows_hint <= chosen.driver_sort_rows
        return self._committed(table, driver, by_driver if driver else by_spark)

    def write_rows(self, table: StateTable, rows: pa.Table) -> int | None:
        """:meth:`write` of updates the driver holds (Arrow, the table's types)."""

        def commit(uri: str, metadata: dict[str, str]) -> CommitResult:
            # A build's rows come with the schema Spark's write would give the table.
            schema = (
                rows.schema
                if self.done == 0
                else spark_compatible_schema(self.catalog.table_schema(uri))
            )
            result = write_held_updates(
                rows,
                uri,
                table.key,
                schema,
                app_id=self.catalog.app_id(uri),
                epoch=self.target,
                metadata=metadata,
                overwrite=self.done == 0 and open_table(uri) is not None,
            )
            if result is None:
                raise InvariantViolation(
                    f"view {self.plan.name!r}: state {table.name}: rows of columns "
                    f"{rows.column_names} do not fit the table's {schema}"
                )
            return result

        return self._committed(table, True, commit)

    def read(self, table: StateTable, key: Sequence[str], keys: DataFrame, as_of: int) -> DataFrame:
        """The table's raw rows (``_time <= as_of``) whose key equals (NULL-safe) a key row."""
        uri = self.uri(table)
        df, st = lookup(
            self.session.spark,
            uri,
            self.catalog.table_schema(uri),
            list(key),
            keys,
            as_of,
            measure=self.measure_lookups,
            null_safe=True,
            raw=True,
        )
        self.stats.setdefault(f"state {table.name}", LookupStats()).add(st)
        return df

    def row_schema(self, table: StateTable) -> pa.Schema:
        """The table's columns and types as the driver reads them (:meth:`read_rows`)."""
        return spark_compatible_schema(self.catalog.table_schema(self.uri(table)))

    def read_rows(
        self, table: StateTable, key: Sequence[str], keys: pa.Table, as_of: int
    ) -> pa.Table | None:
        """:meth:`read` by the driver, in Arrow; None when its files hold too many rows
        (``policy.driver_state_rows``)."""
        uri = self.uri(table)
        schema = self.row_schema(table)
        most = policy.current().driver_state_rows
        rows, st = lookup_rows(uri, schema, list(key), keys, as_of, most)
        self.stats.setdefault(f"state {table.name}", LookupStats()).add(st)
        return rows

    def snapshot(self, node: Node) -> DataFrame:
        """A stateless plan node's whole collection at the target epoch, as updates."""
        names = {get.collection for get in collections(node)}
        inputs = {c: self.inputs.updates(c, 0, self.target) for c in names}
        return render(
            node, {**inputs, **constants(self.inputs.session.spark, node, 0, self.target)}
        )
