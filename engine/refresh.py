"""One view's refresh: the protocol of DESIGN sections 2 and 5.

Bring a view to its target epoch in two idempotent steps. The *log step* computes the view's
updates in ``(done, target]`` (incrementally, placed on the driver or Spark by the policy; or,
for a changed definition or a large change, as the difference between a recomputation and the
stored view) and appends them to ``logs/<view>`` with ``txn(log, target)``. The *table step*
applies the log's net change since the table's epoch to ``views/<view>`` with
``txn(table, target)``. Each step checks its transaction first, so a rerun after a crash redoes
exactly the missing steps.

Contract in ``(data, time, diff)`` terms: after a refresh to epoch ``e``, the log's updates up
to ``e`` sum to the view's SQL over the sources at epoch ``e``'s versions, and the readable
table holds exactly those rows.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame

from engine.catalog import Catalog
from engine.compute import Compute
from engine.definitions import LOG_START, Definitions
from engine.epochs import Epochs
from engine.results import ViewResult
from engine.session import Session
from ivm import policy
from ivm.errors import EvaluationError, IvmError
from ivm.plan.ir import Filter, Join, Project, walk
from ivm.plan.planner import ViewPlan
from ops import DIFF, TIME
from ops.consolidate import consolidate
from ops.declines import recorded
from ops.ingest import (
    consolidated_on,
    insertions_only,
    log_files_between,
    single_time,
    view_changes,
    view_changes_by_driver,
)
from ops.sink import TableChange, append_updates, apply_to_table
from ops.stateless.spark import evaluation_error, spark_sql
from resources.delta_ops import register_table
from resources.faults import crash_point
from resources.lake import CommitResult, commit_files

REFRESH_SECONDS = "ivm.refresh_seconds"
"""Commit metadata of a readable table: the seconds its refresh took until that commit began
(the view's updates computed and logged). The next refresh starts costly views first."""


@dataclass
class _Epochs:
    """Where one refresh of a view starts and ends."""

    plan: ViewPlan
    log_done: int
    table_done: int
    target: int
    log_start: int
    metadata: dict[str, str]
    started: float


class ViewRefresh:
    """Refreshing one view (see the module)."""

    def __init__(
        self,
        catalog: Catalog,
        session: Session,
        epochs: Epochs,
        definitions: Definitions,
        compute: Compute,
    ) -> None:
        self.catalog = catalog
        self.session = session
        self.epochs = epochs
        self.definitions = definitions
        self.compute = compute
        self.repairing: set[str] = set()
        """Views being repaired: their diff log, not their table, is the stored truth, and
        the table is rewritten from the log."""

    def refresh_view(self, name: str, *, rebuild: bool = False) -> ViewResult:
        """Bring one view to its target epoch; idempotent per epoch (see the module).

        Its Spark jobs run in a job group of their own (the Spark UI lists them under the
        view's name); the result counts them.

        Raises:
            IvmError: a rebuild is due but no epoch is newer than the view's (mint one).
            EvaluationError: its SQL fails on a row of its change (an overflow, a division
                by zero, as Spark's ANSI mode fails), nothing committed: names the view, and
                the column and expression when known.
        """
        name = self.catalog.view(name).name
        self.session.thread.found = None  # what the driver found failing (Compute)
        with (
            self.session.job_group(f"view {name}", f"ivm: refresh view {name}") as group,
            recorded() as declined,
        ):
            result = self._reporting(name, rebuild)
        result.driver_declined = declined
        if group is not None and group.jobs is None:  # Spark Connect: tagged, not counted
            result.spark_jobs, result.spark_job_group = None, group.id
        elif group is not None and group.jobs:
            result.spark_jobs, result.spark_job_group = group.jobs, group.id
        return result

    def _reporting(self, name: str, rebuild: bool) -> ViewResult:
        """:meth:`_refresh`, Spark's failure evaluating the view's SQL on a row raised as an
        EvaluationError naming the view (and, as the driver found it, the column)."""
        try:
            return self._refresh(name, rebuild)
        except (PySparkException, Py4JJavaError) as error:
            failure = evaluation_error(error)
            if failure is None:
                raise
            found: EvaluationError | None = self.session.found()
            if found is not None and failure.operation in (None, found.operation):
                if found.kind == failure.kind:
                    failure = failure.located(column=found.column, operation=found.operation)
            column = self._column_computing(name, failure.operation)
            raise failure.located(view=name, column=column) from error

    def _column_computing(self, name: str, operation: str | None) -> str | None:
        """The view's column (or ``WHERE``) whose expression holds ``operation`` (Spark SQL
        text), when one of its plan's projections or filters does."""
        if not operation:
            return None
        for node in walk(self.catalog.view(name).root):
            outputs: list[tuple[str, object]] = []
            if isinstance(node, Project):
                outputs = list(node.outputs)
            elif isinstance(node, Filter):
                outputs = [("WHERE", node.predicate)]
            elif isinstance(node, Join):
                outputs = [o for inp in node.inputs for o in inp.outputs]
            for column, e in outputs:
                if e is not None and operation in spark_sql(e):
                    return column
        return None

    def _refresh(self, name: str, rebuild: bool) -> ViewResult:
        cat = self.catalog
        plan = cat.view(name)
        started = time.perf_counter()
        log_uri, table_uri = cat.layout.view_log(name), cat.layout.view_table(name)
        log_done, table_done = cat.table_epoch(log_uri), cat.table_epoch(table_uri)
        target = self.epochs.target(plan)
        result = ViewResult(name, target, table_done)
        reason = "rebuild requested" if rebuild else self.definitions.rebuild_reason(name)
        if reason and log_done >= target:
            raise IvmError(
                f"view {name!r} must be rebuilt ({reason}), which needs an epoch newer than "
                f"{log_done}: run `ivm --project {cat.project.root} refresh` (it mints one) "
                "or materialize ivm/epoch first"
            )
        if target == 0 or (log_done >= target and table_done >= target):
            result.epoch = max(table_done, target)
            result.status = "up-to-date"
            result.seconds = time.perf_counter() - started
            cat.progress(f"{name}: up to date at epoch {result.epoch}")
            return result
        at = _Epochs(
            plan,
            log_done,
            table_done,
            target,
            self.definitions.log_start(log_uri),
            self.definitions.record(plan),
            started,
        )
        logged = None  # the log's updates this call wrote, when the driver wrote them
        if log_done < target:
            logged = self._log_step(at, result, reason)
        self._table_step(at, result, logged)
        return result

    # -- the log step ------------------------------------------------------------------------

    def _log_step(self, at: _Epochs, result: ViewResult, reason: str | None) -> pa.Table | None:
        """Compute the view's updates in ``(log_done, target]`` and append them to its log
        once; returns the updates as written when the driver wrote them for the table step."""
        t0 = time.perf_counter()
        cat = self.catalog
        log_uri = cat.layout.view_log(at.plan.name)
        updates, overwrite, small = self._updates(at, result, reason)
        if overwrite or at.log_done == 0:
            at.log_start = at.target
        metadata = {**at.metadata, LOG_START: str(at.log_start)}
        if updates is None:
            commit = self._epoch_only(log_uri, at.target, metadata)
        else:
            commit = append_updates(
                updates,
                log_uri,
                app_id=cat.app_id(log_uri),
                epoch=at.target,
                metadata=metadata,
                overwrite=overwrite,
                small=small,
            )
        crash_point("log_committed")
        result.timings["log"] = time.perf_counter() - t0
        result.commit_versions["log"] = commit.version
        incremental = not overwrite and at.log_done > 0
        if commit.committed and at.log_done == at.table_done and incremental:
            return commit.staged  # the updates of (log_done, target], as written
        return None

    def _updates(
        self, at: _Epochs, result: ViewResult, reason: str | None
    ) -> tuple[DataFrame | pa.Table | None, bool, bool]:
        """The view's updates for the log, whether they replace its history, and whether the
        change is small (written by the driver): recomputed (a rebuild, or a change too large
        to apply), none (nothing it reads changed), or rendered where the policy places it."""
        plan, done, target, name = at.plan, at.log_done, at.target, at.plan.name
        unchanged: frozenset[str] = frozenset()
        if not reason and done > 0:
            unchanged = self.epochs.unchanged_inputs(plan, done, target)
        quiet = not reason and done > 0 and unchanged >= set(plan.inputs)
        recompute = None
        if not reason and not quiet and done > 0:
            recompute = self.epochs.recompute_reason(plan, done, target)
        if (reason or recompute) and done > 0:
            why = reason or recompute
            verb = "rebuilding" if reason else "recomputing"
            self.catalog.progress(f"{name}: {verb} at epoch {target} ({why})")
            repairing = name in self.repairing
            updates, overwrite = self.compute.difference(plan, done, target, repairing)
            result.status, result.reason = ("rebuilt" if reason else "recomputed"), why
            return updates, overwrite, False
        if quiet:  # nothing it reads changed: no update, no Spark, only the epoch
            result.status, result.inputs_changed, result.computed_by = "refreshed", False, "nothing"
            return None, False, False
        changed = (
            0 if done == 0 else sum(self.epochs.change_rows(c, done, target) for c in plan.inputs)
        )
        placement = policy.current().place(plan.root, changed, build=done == 0)
        result.placement = str(placement)
        lookups: dict = {}
        updates = None
        if placement.where == "driver":
            updates = self.compute.by_driver(plan, done, target, lookups, unchanged)
        if updates is not None:
            result.computed_by = "driver"
        else:
            by_driver: list[str] = []
            updates = self.compute.by_spark(
                plan, done, target, lookups, unchanged, placement.small, by_driver
            )
            if by_driver:
                result.computed_by = "mixed"
        result.lookups = lookups
        result.status = "built" if done == 0 else "refreshed"
        return updates, False, placement.small

    def _epoch_only(self, uri: str, epoch: int, metadata: dict[str, str]) -> CommitResult:
        """A commit of no file that moves a table to ``epoch`` (once: its txn)."""
        cat = self.catalog
        schema = cat.table_schema(uri)
        return commit_files(
            uri, app_id=cat.app_id(uri), epoch=epoch, schema=schema, metadata=metadata
        )

    # -- the table step ----------------------------------------------------------------------

    def _table_step(self, at: _Epochs, result: ViewResult, logged: pa.Table | None) -> None:
        """Apply the log's net change since the table's epoch to the readable table once."""
        cat, name = self.catalog, at.plan.name
        log_uri, table_uri = cat.layout.view_log(name), cat.layout.view_table(name)
        t0 = time.perf_counter()
        table_meta = {**at.metadata, REFRESH_SECONDS: f"{t0 - at.started:.3f}"}
        # A log that started anew after the table's epoch (new columns) rewrites the table.
        stale = 0 < at.table_done < at.log_start or (name in self.repairing and at.table_done > 0)
        if (
            at.table_done > 0
            and not stale
            and not log_files_between(log_uri, at.table_done, at.target)
        ):
            # The log holds no update after the table's epoch: the table only moves its epoch.
            commit = self._epoch_only(table_uri, at.target, table_meta)
            change = TableChange(commit, inserted=0, deleted=0, files_rewritten=0, rows_rewritten=0)
        else:
            change = self._apply(at, result, table_meta, stale, logged)
        crash_point("table_committed")
        database = cat.project.catalog_database
        if database is not None and register_table(self.session.spark, database, name, table_uri):
            cat.progress(f"{name}: registered as {database}.{name} in Spark's catalog")
        result.timings["table"] = time.perf_counter() - t0
        result.commit_versions["table"] = change.commit.version
        result.inserted, result.deleted = change.inserted, change.deleted
        result.rows_changed = change.inserted + change.deleted
        result.files_rewritten = change.files_rewritten
        result.rows_rewritten = change.rows_rewritten
        if change.choice is not None:
            result.table_write = f"{change.choice.strategy.value}: {change.choice.reason}"
        result.seconds = time.perf_counter() - at.started
        cat.progress(
            f"{name}: epoch {at.table_done} -> {at.target}: +{change.inserted} "
            f"-{change.deleted} rows ({result.seconds:.2f}s)"
        )

    def _apply(
        self,
        at: _Epochs,
        result: ViewResult,
        metadata: dict[str, str],
        stale: bool,
        logged: pa.Table | None,
    ) -> TableChange:
        """The log's net change since the table's epoch (all of it when ``stale``) applied to
        the readable table (:func:`ops.sink.apply_to_table`)."""
        cat, plan = self.catalog, at.plan
        table_uri = cat.layout.view_table(plan.name)
        since = -1 if stale else at.table_done
        net, files = self._net_change(plan, since, at.target, at.log_start)
        result.log_files_read = len(files)
        return apply_to_table(
            self.session.spark,
            net,
            table_uri,
            app_id=cat.app_id(table_uri),
            epoch=at.target,
            metadata=metadata,
            label=plan.name,
            overwrite=stale,
            positive=insertions_only(files),  # appended as they are: nothing to size
            rows_hint=_at_most(f.file.num_records for f in files),
            # The log's epochs since the table's, summed per row: a row may come at one
            # epoch and go at the next.
            net_rows=None if stale or logged is None else consolidated_on(logged, plan.columns),
            read_net=lambda most: view_changes_by_driver(
                files, plan.columns, since, at.target, most
            ),
        )

    def _net_change(
        self, plan: ViewPlan, table_done: int, target: int, log_start: int
    ) -> tuple[DataFrame, list]:
        """The net change ``(columns..., _diff)`` the readable table needs, from the log, and
        the log files read (with their ``_time`` and ``_diff`` statistics).

        The log's updates are summed per data unless they need not be: positive diffs only
        (each row is then written ``_diff`` times, whether or not equal rows were summed), or
        one incremental epoch's updates (consolidated when written; ``log_start``, the epoch
        the log starts at, holds a computation from scratch, whose equal rows are not summed).
        """
        cat = self.catalog
        log_uri = cat.layout.view_log(plan.name)
        df, files = view_changes(
            self.session.spark, log_uri, cat.table_schema(log_uri), table_done, target
        )
        if insertions_only(files) or (single_time(files) and files[0].mins[TIME] > log_start):
            return df.select(*[f"`{c}`" for c in plan.columns], DIFF), files
        return consolidate(df, plan.columns, by_time=False), files


def _at_most(counts: Iterable[int | None]) -> int | None:
    """The sum of row counts, or None when one is unknown (so no bound)."""
    total = 0
    for n in counts:
        if n is None:
            return None
        total += n
    return total
