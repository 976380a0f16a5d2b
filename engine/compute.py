"""A view's updates for one refresh, rendered from its plan by Spark's renderer or the driver's
(Arrow), as the policy placed it; and the difference a recomputation makes (rebuilds).

Contract in ``(data, time, diff)`` terms: the updates of view ``V`` in ``(done, target]`` sum,
with the view's updates up to ``done``, to ``V`` evaluated over its inputs at ``target``. Both
renderers give the same multiset for the same plan; the driver's declines (before writing
anything) hand the work, or the part it cannot do, to Spark, each reason recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from engine.arrangements import Arrangements
from engine.catalog import Catalog
from engine.columns import analysed_schema, check_columns
from engine.definitions import Definitions
from engine.inputs import Inputs
from engine.session import Session
from engine.state import ViewState
from ivm import policy
from ivm.errors import EvaluationError, NotOnDriver
from ivm.plan.driver import driver_support
from ivm.plan.ir import Join, SemiJoin, collections
from ivm.plan.planner import ViewPlan
from ivm.sql.lower import referenced_tables
from ivm.sql.parse import parse_view
from ops import DIFF, TIME
from ops.consolidate import consolidate
from ops.declines import declined
from ops.ingest import consolidated_on, view_state
from ops.join.driver import join_delta_local
from ops.join.spark import render_join_delta
from ops.reduce.driver import stateful_local
from ops.reduce.spark import render_stateful
from ops.sink import arrow_schema, same_columns
from ops.stateless.driver import normalized_floats, render_local, types_recorded
from ops.stateless.spark import constants, render
from resources.faults import crash_point


class Compute:
    """Rendering a view's updates (see the module)."""

    def __init__(
        self,
        catalog: Catalog,
        session: Session,
        inputs: Inputs,
        arrangements: Arrangements,
        definitions: Definitions,
        *,
        measure_lookups: bool = False,
    ) -> None:
        self.catalog = catalog
        self.session = session
        self.inputs = inputs
        self.arrangements = arrangements
        self.definitions = definitions
        self.measure_lookups = measure_lookups

    def _state(self, plan: ViewPlan, done: int, target: int, stats: dict, small: bool):
        state = ViewState(
            self.catalog,
            self.session,
            self.inputs,
            plan,
            done,
            target,
            stats,
            small=small,
            measure_lookups=self.measure_lookups,
        )
        return state.store()

    def _refresh_arrangements(self, plan: ViewPlan) -> None:
        for arrangement in self.catalog.plan.arrangements_of(plan.name):
            self.arrangements.refresh(arrangement.key)

    # -- Spark's renderer --------------------------------------------------------------------

    def by_spark(
        self,
        plan: ViewPlan,
        done: int,
        target: int,
        stats: dict | None = None,
        unchanged: frozenset[str] = frozenset(),
        small: bool = False,
        by_driver: list[str] | None = None,
    ) -> DataFrame:
        """The view's updates in ``(done, target]`` rendered by Spark, consolidated per
        (data, time) unless computed from scratch. Joins skip the delta paths of the
        ``unchanged`` inputs; ``small``: the inputs' change is small, so the state's is too,
        and the driver computes the inner joins under the view's reductions where it can
        (each one marked in ``by_driver``).

        From scratch (``done`` = 0) joins are computed from the inputs' snapshots; otherwise
        by delta paths whose lookups read the shared arrangements (refreshed first). From
        scratch, the updates are the view's rows, each ``+1`` at ``target``, equal rows not
        summed: readers sum what they read.
        """
        self._refresh_arrangements(plan)
        stats = stats if stats is not None else {}
        store = self._state(plan, done, target, stats, small)
        inputs = {
            coll: self.inputs.updates(coll, done, target, self.catalog.input_columns(plan, coll))
            for coll in plan.inputs
        }
        inputs.update(constants(self.session.spark, plan.root, done, target))
        crash_point("ingest")
        delta_join = None
        if plan.joins and (done > 0 or plan.has_state):  # NOT IN keeps state from the build on
            delta_join = partial(
                render_join_delta,
                lookup=partial(self.arrangements.lookup, stats=stats),
                old=done,
                new=target,
                store=store,
                snapshot=lambda coll, at: self.inputs.updates(coll, 0, at),
                unchanged=unchanged,
            )
            if small and plan.has_state and policy.current().driver:
                delta_join = self._join_handed_to_spark(
                    plan, done, target, stats, unchanged, delta_join, by_driver, store
                )
        stateful = partial(render_stateful, store=store)
        updates = render(plan.root, inputs, delta_join, stateful)
        if done == 0:  # a build: its columns must be Spark's (they become the tables')
            self._check_columns(plan, target, inputs, updates)
        return updates if done == 0 else consolidate(updates, plan.columns)

    def _check_columns(
        self, plan: ViewPlan, epoch: int, inputs: Mapping[str, DataFrame], updates: DataFrame
    ) -> None:
        """Raise unless a build's ``updates`` have the columns Spark's analysis of the view's
        SQL gives over the same inputs at ``epoch`` (:func:`engine.columns.check_columns`);
        a table the plan does not read (an input a constant join condition never matches) is
        given to Spark as no row of its columns at ``epoch``. Analysis only, no job."""
        cat, spark = self.catalog, self.session.spark
        frames = dict(inputs)
        for coll in referenced_tables(parse_view(plan.sql, plan.file)) - set(frames):
            if coll in cat.sources:
                schema = cat.sources[coll].arrow_schema(cat.epoch_map()[epoch].ranges[coll][1])
            elif coll in cat.plan.views:
                schema = cat.table_schema(cat.layout.view_table(coll))
            else:
                continue  # not a table: Spark's analysis names it
            lowered = pa.schema([f.with_name(f.name.lower()) for f in schema])
            frames[coll] = spark.createDataFrame([], from_arrow_schema(lowered))
        expected = analysed_schema(spark, plan.sql, plan.file, frames)
        ours = [f for f in updates.schema.fields if f.name not in (TIME, DIFF)]
        check_columns(plan.name, plan.file, expected, StructType(ours))

    # -- the driver's renderer ---------------------------------------------------------------

    def by_driver(
        self,
        plan: ViewPlan,
        done: int,
        target: int,
        stats: dict | None = None,
        unchanged: frozenset[str] = frozenset(),
    ) -> pa.Table | None:
        """The view's updates in ``(done, target]`` rendered by the driver in Arrow
        (:mod:`ops.stateless.driver`, :mod:`ops.reduce.driver`), consolidated per (data, time) and
        laid out as its log's rows; None when Spark computes them: an input's change or a lookup's
        rows are not held by the driver, an expression or aggregate is not one the driver
        evaluates exactly as Spark (each reason recorded, :meth:`declined`), or its SQL fails
        on a row (Spark's plan decides whether it evaluates that row: :meth:`driver_failed`).

        The policy placed the view here (its plan is one the driver renders, its change
        small)."""
        self._refresh_arrangements(plan)
        stats = stats if stats is not None else {}
        stateful, store = None, None
        if plan.has_state:
            store = self._state(plan, done, target, stats, small=True)
            stateful = partial(stateful_local, store=store)
        join = self._driver_join(done, target, stats, unchanged, store)
        spark = self.session.spark
        try:
            with types_recorded(spark, self.catalog.layout.root):
                inputs = {
                    coll: self.inputs.arrow(
                        coll, done, target, self.catalog.input_columns(plan, coll)
                    )
                    for coll in plan.inputs
                }
                crash_point("ingest")
                updates = render_local(spark, plan.root, inputs, join, stateful)
            updates = normalized_floats(updates)
        except NotOnDriver as why:
            self.declined(plan.name, f"computed by Spark ({why})")
            return None
        except EvaluationError as found:
            self.driver_failed(plan.name, found)
            return None
        summed = consolidated_on(updates, [*plan.columns, TIME])
        log_schema = self.catalog.table_schema(self.catalog.layout.view_log(plan.name))
        if summed is None or not same_columns(summed.schema, log_schema):
            self.declined(plan.name, "computed by Spark (its updates' types are Spark's)")
            return None
        return summed.cast(log_schema)

    def declined(self, view: str, reason: str) -> None:
        """The driver handed part of ``view``'s refresh to Spark: said in the progress log and
        recorded on its result (:func:`ops.declines.declined`)."""
        declined(reason)
        self.catalog.progress(f"{view}: {reason}")

    def driver_failed(self, view: str, found: EvaluationError) -> None:
        """The driver found the view's SQL failing on a row of its change. Spark's plan may
        not evaluate that row (it pushes filters below projections): Spark computes the
        change, and raises if it fails too (the refresh then names the column the driver
        found)."""
        self.session.thread.found = found.located(view=view)
        self.declined(view, f"computed by Spark, which decides whether it fails ({found})")

    def _driver_join(
        self, done: int, target: int, stats: dict, unchanged: frozenset[str], store: Any
    ) -> Callable[[Any, Mapping[str, pa.Table]], pa.Table]:
        """How the driver renders a join's updates in ``(done, target]`` from its inputs'
        Arrow updates (:func:`ops.join.driver.join_delta_local`), its lookups read by the
        driver, a NOT IN's state in ``store``; raises NotOnDriver when it cannot."""

        def lookup(stage, keys: pa.Table, as_of: int, columns) -> pa.Table:
            rows = self.arrangements.lookup_arrow(stage, keys, as_of, columns=columns, stats=stats)
            if rows is None:
                raise NotOnDriver(f"{stage.arrangement}'s lookup is Spark's")
            return rows

        return partial(
            join_delta_local,
            self.session.spark,
            lookup=lookup,
            old=done,
            new=target,
            unchanged=unchanged,
            store=store,
        )

    def _join_handed_to_spark(
        self,
        plan: ViewPlan,
        done: int,
        target: int,
        stats: dict,
        unchanged: frozenset[str],
        by_spark: Callable,
        by_driver: list[str] | None = None,
        store: Any = None,
    ) -> Callable:
        """A join renderer for Spark's plan (:func:`ops.stateless.spark.render`) of a small change:
        a join's updates computed by the driver (:meth:`_driver_join`) and handed to
        Spark as a local relation, for the reduction above it (each one marked in
        ``by_driver``); ``by_spark`` renders the joins the driver cannot."""
        local = self._driver_join(done, target, stats, unchanged, store)
        spark = self.session.spark

        def render_join(node: Join | SemiJoin, deltas: Any) -> DataFrame:
            if driver_support(node) is None:
                try:
                    with types_recorded(spark, self.catalog.layout.root):
                        colls = {get.collection for get in collections(node)}
                        inputs = {
                            c: self.inputs.arrow(
                                c, done, target, self.catalog.input_columns(plan, c)
                            )
                            for c in colls
                        }
                        table = local(node, inputs)
                    if by_driver is not None:
                        by_driver.append("join")
                    return spark.createDataFrame(table, schema=from_arrow_schema(table.schema))
                except NotOnDriver as why:
                    self.declined(plan.name, f"a join computed by Spark ({why})")
                except EvaluationError as found:
                    self.driver_failed(plan.name, found)
            return by_spark(node, deltas)

        return render_join

    # -- recomputation -----------------------------------------------------------------------

    def difference(
        self, plan: ViewPlan, log_done: int, target: int, repairing: bool = False
    ) -> tuple[DataFrame, bool]:
        """Updates that take the stored view (at ``log_done``) to a fresh computation at
        ``target``.

        Returns:
            ``(updates, overwrite)``: with unchanged columns, the difference ``fresh - stored``
            at time ``target`` (appended to the log); with changed columns, the fresh contents
            alone, to replace the log's history. ``repairing``: the log, not the table, is the
            stored truth.
        """
        cat = self.catalog
        fresh = self.by_spark(plan, 0, target)
        log_uri, table_uri = cat.layout.view_log(plan.name), cat.layout.view_table(plan.name)
        stored_schema = cat.table_schema(log_uri)
        if not same_columns(arrow_schema(fresh), stored_schema):
            cat.progress(f"{plan.name}: columns changed; the diff log starts anew")
            return fresh, True
        table_epoch = cat.table_epoch(table_uri)
        current = table_epoch >= self.definitions.log_start(log_uri) and not repairing
        stored = view_state(
            self.session.spark,
            table_uri,
            cat.table_schema(table_uri),
            log_uri,
            stored_schema,
            log_done,
            table_epoch if current else -1,
        )
        retract = stored.withColumn(DIFF, -F.col(DIFF)).withColumn(
            TIME, F.lit(target).cast("bigint")
        )
        return consolidate(fresh.unionByName(retract), plan.columns), False
