"""A view's inputs as updates: a source's change feed, appended files or snapshot, or an
upstream view's diff log, as Spark DataFrames or, when the driver holds them, as Arrow.

Contract in ``(data, time, diff)`` terms: the updates of a collection in ``(done, target]``
carry, for each epoch ``e`` in the range, the source's changes in that epoch's version range
at time ``e`` (or the upstream view's logged updates); with ``done = 0``, the collection's
contents at ``target``, each row ``+1`` at time ``target``. A source read under a contract
gives only the rows that meet it.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from engine.catalog import Catalog
from engine.epochs import Epochs
from engine.session import Session
from ivm import policy
from ivm.errors import InvariantViolation, NotOnDriver, SourceError
from ops import DIFF, TIME
from ops.declines import declined
from ops.ingest import (
    consolidated_on,
    source_change_arrow,
    source_changes_once,
    source_snapshot,
    view_changes,
    view_changes_arrow,
    view_state,
)
from ops.stateless.driver import Evaluator
from resources.lake import spark_compatible


class Inputs:
    """Reading collections' updates (see the module)."""

    def __init__(self, catalog: Catalog, session: Session, epochs: Epochs) -> None:
        self.catalog = catalog
        self.session = session
        self.epochs = epochs

    def updates(
        self, coll: str, done: int, target: int, columns: Sequence[str] | None = None
    ) -> DataFrame:
        """A source's or view's updates in ``(done, target]``; its snapshot at ``target``
        (as updates at ``target``) when ``done`` is 0. ``columns``: what the reader needs of a
        source (see :meth:`source_updates`); a view's updates come with every column."""
        cat, spark = self.catalog, self.session.spark
        if coll in cat.plan.views:
            up_log, up_table = cat.layout.view_log(coll), cat.layout.view_table(coll)
            log_schema = cat.table_schema(up_log)
            if done == 0:
                table_schema, table_epoch = cat.table_schema(up_table), cat.table_epoch(up_table)
                return view_state(
                    spark, up_table, table_schema, up_log, log_schema, target, table_epoch
                )
            return view_changes(spark, up_log, log_schema, done, target)[0]
        checked = None if columns is None else cat.checked_columns(coll, columns)
        df = self.source_updates(coll, done, target, checked)
        valid = cat.contract_predicate(coll)
        return df if valid is None else df.where(valid)

    def source_updates(
        self, coll: str, done: int, target: int, columns: Sequence[str] | None = None
    ) -> DataFrame:
        """A source's updates in ``(done, target]`` as its table has them (no contract).

        ``columns``: the reader needs only these; a change feed kept on the driver then comes
        summed on them there (:func:`ops.ingest.source_changes_once`): an update that rewrote
        other columns only reaches no lookup, join or state. Snapshots and appended files
        come with every column."""
        spark = self.session.spark
        epochs = self.catalog.epoch_map()
        source = self.catalog.sources[coll]
        if done == 0:
            return source_snapshot(spark, source, epochs[target].ranges[coll][1], target)
        if done >= target:  # an empty range: no change
            version = epochs[target].ranges[coll][1]
            return source_changes_once(spark, source, version, version, target, columns)
        parts = []
        for e in range(done + 1, target + 1):
            rng = epochs[e].ranges.get(coll)
            if rng is None:
                raise SourceError(f"source {coll!r} is missing from epoch {e}'s record")
            part = source_changes_once(spark, source, rng[0], rng[1], e, columns)
            # Ranges read otherwise (appended files) come with every column.
            if columns is not None:
                part = part.select(*[F.col(f"`{c}`") for c in columns], TIME, DIFF)
            parts.append(part)
        return reduce(DataFrame.unionByName, parts)

    def arrow(
        self, coll: str, done: int, target: int, columns: Sequence[str] | None = None
    ) -> pa.Table:
        """A collection's updates in ``(done, target]`` as Arrow ``(columns..., _time,
        _diff)``, from what the driver holds or reads: a source's change feeds summed on
        ``columns`` (and the columns its contract checks), the rows breaking its contract
        left out; a view's diff log read from its files (every column, or ``columns``).
        Raises NotOnDriver when the driver does not hold them."""
        cat = self.catalog
        if coll in cat.plan.views:
            log_uri = cat.layout.view_log(coll)
            table = view_changes_arrow(log_uri, cat.table_schema(log_uri), done, target)
            if table is None:
                raise NotOnDriver(f"view {coll!r}'s change is too large to hold")
            return table if columns is None else table.select([*columns, TIME, DIFF])
        if columns is None:
            raise InvariantViolation(f"source {coll!r}: the columns to read are needed")
        read = list(cat.checked_columns(coll, columns))
        table = self._source_arrow(coll, done, target, read)
        contract = cat.contract(coll)
        check = None if contract is None else contract.predicate()
        if check is not None and table.num_rows:
            table = table.filter(Evaluator(self.session.spark, table, [check]).mask(check))
        return table.select([*columns, TIME, DIFF])

    def _source_arrow(self, coll: str, done: int, target: int, read: list[str]) -> pa.Table:
        """A source's change feeds in ``(done, target]`` summed on ``read``, as Arrow."""
        epochs = self.catalog.epoch_map()
        source = self.catalog.sources[coll]
        parts = []
        for e in range(done + 1, target + 1):
            rng = epochs[e].ranges.get(coll) if e in epochs else None
            if rng is None or rng[0] is None:
                raise NotOnDriver(f"source {coll!r} is read whole at epoch {e}")
            if rng[0] == rng[1]:
                continue  # the source kept its version
            net = source_change_arrow(self.session.spark, source, rng[0], rng[1], e, read)
            if net is None:
                raise NotOnDriver(f"source {coll!r}'s change is not held by the driver")
            epoch_times = pa.array(np.full(net.num_rows, e, dtype=np.int64))
            net = spark_compatible(net).select([*read, DIFF])
            parts.append(net.add_column(len(read), TIME, epoch_times))
        if parts:
            return pa.concat_tables(parts)
        schema = source.arrow_schema(epochs[target].ranges[coll][1])
        types = {f.name.lower(): f.type for f in schema}
        return pa.schema(
            [*(pa.field(c, types[c]) for c in read), (TIME, pa.int64()), (DIFF, pa.int64())]
        ).empty_table()

    def held_changes(
        self, coll: str, done: int, target: int, columns: Sequence[str]
    ) -> pa.Table | None:
        """A collection's updates in ``(done, target]`` summed on ``columns`` (``(columns...,
        _time, _diff)``) when the driver holds them all (:meth:`arrow`), at most
        ``policy.driver_change_rows``. None otherwise."""
        chosen = policy.current()
        if not chosen.driver or (
            self.epochs.change_rows(coll, done, target) > chosen.driver_change_rows
        ):
            return None
        try:
            rows = self.arrow(coll, done, target, columns)
        except NotOnDriver as why:
            declined(f"{coll}'s change appended to an arrangement by Spark ({why})")
            return None
        return consolidated_on(rows, [*columns, TIME])
