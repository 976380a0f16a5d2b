"""Shared arrangements: each collection's updates sorted by a join key, one Delta table per
(collection, key) read by every view that joins on it, and the lookups that read them.

Contract in ``(data, time, diff)`` terms: after :meth:`Arrangements.refresh`, the arrangement
holds the collection's updates from its ``since`` epoch (the snapshot then, as updates at
``since``) up to the collection's epoch; a lookup at time ``t >= since`` sums, per key, the
updates with time ``<= t``, which is the collection at ``t`` restricted to those keys.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from engine.catalog import Catalog
from engine.definitions import Definitions
from engine.epochs import Epochs
from engine.inputs import Inputs
from engine.session import Session
from ivm import policy
from ivm.errors import InvariantViolation
from ivm.plan.join import ArrangementKey, LookupStage
from ops import DIFF, TIME
from ops.arrange import (
    LookupStats,
    build_by_driver,
    lookup,
    lookup_arrow,
    write_held_updates,
    write_updates,
)
from ops.consolidate import consolidate
from ops.ingest import source_snapshot, source_snapshot_in_order
from ops.sink import arrow_schema
from resources.faults import crash_point
from resources.lake import CommitResult, last_commit_metadata, spark_compatible_schema


@dataclass(frozen=True)
class _Step:
    """What one refresh of an arrangement writes: a build (from ``since``) or an append."""

    rebuild: bool
    since: int
    retyped: bool
    metadata: dict[str, str]


class Arrangements:
    """Writing shared arrangements and reading them (see the module)."""

    def __init__(
        self,
        catalog: Catalog,
        session: Session,
        epochs: Epochs,
        inputs: Inputs,
        definitions: Definitions,
        *,
        measure_lookups: bool = False,
    ) -> None:
        self.catalog = catalog
        self.session = session
        self.epochs = epochs
        self.inputs = inputs
        self.definitions = definitions
        self.measure_lookups = measure_lookups
        self._lock = threading.Lock()
        self._locks: dict[ArrangementKey, threading.Lock] = {}
        self.rebuilding: frozenset[ArrangementKey] = frozenset()
        """Arrangements every reader of which the current refresh rebuilds: built again from
        their collection's state at the target epoch, never from its change (which may be
        unreadable: the reason a user asks for a rebuild)."""

    def refresh(self, key: ArrangementKey) -> CommitResult | None:
        """Bring an arrangement up to its collection's epoch; idempotent per epoch.

        A new arrangement, or one whose readers now need other columns, is (re)built from
        the collection's snapshot at ``since`` = the oldest epoch any existing reader still
        reads at (its "old" time), plus the updates after it, so every reader's lookups at
        its old and new times stay exact.
        """
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # views refreshed at once share it: one writes, the others find it done
            with self.session.job_group(f"arrangement {key.name}", f"ivm: arrangement {key.name}"):
                return self.refresh_now(key)

    def refresh_now(self, key: ArrangementKey) -> CommitResult | None:
        """:meth:`refresh` without the lock and job group (the caller holds them)."""
        cat = self.catalog
        uri = cat.arrangement_uri(key)
        target = cat.collection_epoch(key.collection)
        done = cat.table_epoch(uri)
        if target == 0 or done >= target:
            return None
        step = self._step(key, uri, target)
        started = time.perf_counter()
        how = ""
        result = None
        if step.rebuild and step.since == target and key.collection in cat.sources:
            result = self._build_by_driver(key, target, step.metadata, overwrite=done > 0)
            how = " from its source's files, by the driver" if result is not None else ""
        if result is None and not step.rebuild:
            result = self._append_held(key, uri, done, target, step.metadata)
            how = " (summed and written by the driver)" if result is not None else ""
        if result is None:
            result, in_ranges = self._write_by_spark(key, uri, done, target, step)
            how = " from a source in key order, without a shuffle" if in_ranges else ""
        crash_point("arrangement_committed")
        self.catalog.progress(
            f"arrangement {key}: {'built' if step.rebuild else 'appended'} {result.rows} "
            f"updates at epoch {target}{how} ({time.perf_counter() - started:.2f}s)"
        )
        return result

    def _step(self, key: ArrangementKey, uri: str, target: int) -> _Step:
        """Whether the arrangement is (re)built, from which epoch, and its commit metadata."""
        cat, aplan = self.catalog, self.catalog.plan.arrangements[key]
        info = last_commit_metadata(uri, "ivm.columns")
        contract = json.dumps(self.definitions.contract_hashes([key.collection]))
        in_sources = key.collection in cat.sources
        types = json.dumps(
            self.definitions.source_types(key.collection, aplan.columns) if in_sources else {},
            sort_keys=True,
        )
        retyped = info is not None and info.get("ivm.types", types) != types
        rebuild = (
            info is None
            or json.loads(info["ivm.columns"]) != list(aplan.columns)
            or info.get("ivm.contract", "{}") != contract
            or retyped
            or key in self.rebuilding
        )
        if not rebuild:
            since = int(info["ivm.since"])
        elif retyped or key in self.rebuilding:
            # Every reader is rebuilt from snapshots (the types changed), so none reads before
            # ``target``, and older updates would have the old types.
            since = target
        else:
            readers = [cat.table_epoch(cat.layout.view_log(v)) for v in aplan.users]
            since = min([r for r in readers if r > 0] + [target])
        metadata = {
            "ivm.arrangement": key.name,
            "ivm.columns": json.dumps(list(aplan.columns)),
            "ivm.since": str(since),
            "ivm.contract": contract,
            "ivm.types": types,
        }
        return _Step(rebuild, since, retyped, metadata)

    def _append_held(
        self, key: ArrangementKey, uri: str, done: int, target: int, metadata: dict[str, str]
    ) -> CommitResult | None:
        """An epoch's small change the driver holds, summed, sorted and written by it."""
        columns = self.catalog.plan.arrangements[key].columns
        held = self.inputs.held_changes(key.collection, done, target, columns)
        if held is None:
            return None
        return write_held_updates(
            held,
            uri,
            key.key,
            spark_compatible_schema(self.catalog.table_schema(uri)),
            app_id=self.catalog.app_id(uri),
            epoch=target,
            metadata=metadata,
        )

    def _write_by_spark(
        self, key: ArrangementKey, uri: str, done: int, target: int, step: _Step
    ) -> tuple[CommitResult, bool]:
        """The arrangement's updates written by Spark, and whether they came from a source
        read in key order (no shuffle)."""
        cat, aplan = self.catalog, self.catalog.plan.arrangements[key]
        _ = self.session.spark  # Column expressions need a live session
        cols = [F.col(f"`{c}`") for c in aplan.columns]
        in_ranges = False
        if step.rebuild:
            # A snapshot's rows are already updates (d, since, +1): summing equal ones would
            # only merge duplicate rows, at the price of shuffling the whole collection.
            # Lookups consolidate what they read.
            ordered = None
            if step.since == target and key.collection in cat.sources:
                ordered = self._snapshot_in_order(key.collection, step.since, key.key[0])
            in_ranges = ordered is not None
            snapshot = ordered if in_ranges else self.inputs.updates(key.collection, 0, step.since)
            updates = snapshot.select(*cols, TIME, DIFF)
            if step.since < target:
                changes = self.inputs.updates(key.collection, step.since, target, aplan.columns)
                updates = updates.unionByName(
                    consolidate(changes.select(*cols, TIME, DIFF), aplan.columns)
                )
        else:
            changes = self.inputs.updates(key.collection, done, target, aplan.columns)
            updates = consolidate(changes.select(*cols, TIME, DIFF), aplan.columns)
        result = write_updates(
            updates,
            uri,
            key.key,
            app_id=cat.app_id(uri),
            epoch=target,
            metadata=step.metadata,
            overwrite=step.rebuild and done > 0,
            rows_hint=cat.rows_hint(key.collection) if step.rebuild else None,
            in_ranges=step.rebuild and in_ranges,
            small=not step.rebuild and self.epochs.small_change([key.collection], done, target),
        )
        return result, in_ranges

    def _build_by_driver(
        self, key: ArrangementKey, epoch: int, metadata: dict[str, str], overwrite: bool
    ) -> CommitResult | None:
        """Build ``key``'s arrangement from its source's snapshot at ``epoch`` by the driver
        (:func:`ops.arrange.build_by_driver`), or None: a contract to check (Spark evaluates
        it), a partition column among the arrangement's, a table only Delta's reader reads (column
        mapping, deletion vectors), or what that function declines."""
        cat = self.catalog
        source = cat.sources[key.collection]
        columns = cat.plan.arrangements[key].columns
        version = cat.epoch_map()[epoch].ranges[key.collection][1]
        partitioned = {c.lower() for c in source.partition_columns(version)}
        if cat.contract_predicate(key.collection) is not None or partitioned & set(columns):
            return None
        if source.needs_delta_reader(version) is not None:  # its files are not its rows
            return None
        files = source.files(version)
        # The types Spark's read of the snapshot gives (a plan, no job), as its build has.
        snapshot = source_snapshot(self.session.spark, source, version, epoch, files)
        schema = arrow_schema(snapshot.select(*[f"`{c}`" for c in columns], TIME, DIFF))
        uri = cat.arrangement_uri(key)
        return build_by_driver(
            files,
            uri,
            key.key,
            schema,
            app_id=cat.app_id(uri),
            epoch=epoch,
            metadata=metadata,
            overwrite=overwrite,
        )

    def _snapshot_in_order(self, source: str, epoch: int, column: str) -> DataFrame | None:
        """A large source's snapshot at ``epoch`` read so that each Spark partition holds its
        own range of ``column`` (contract applied), or None: see
        :func:`ops.ingest.source_snapshot_in_order`. Small sources are not worth the footer
        reads: their shuffle is cheap."""
        cat = self.catalog
        if (cat.rows_hint(source) or 0) < policy.current().arrangement_file_rows:
            return None
        version = cat.epoch_map()[epoch].ranges[source][1]
        df = source_snapshot_in_order(
            self.session.spark, cat.sources[source], version, epoch, column
        )
        valid = cat.contract_predicate(source)
        return df if df is None or valid is None else df.where(valid)

    # -- reading ----------------------------------------------------------------------------

    def lookup(
        self,
        stage: LookupStage,
        keys: DataFrame,
        as_of: int,
        *,
        stats: dict,
        columns: Iterable[str] | None = None,
    ) -> DataFrame:
        """Read an arrangement's state at ``as_of`` for the keys in ``keys`` (see ops.arrange),
        only ``columns`` (and the key) when given."""
        uri = self.catalog.arrangement_uri(stage.arrangement)
        self._check_since(uri, stage.arrangement, as_of)
        df, st = lookup(
            self.session.spark,
            uri,
            self.catalog.table_schema(uri),
            stage.arrangement.key,
            keys,
            as_of,
            measure=self.measure_lookups,
            null_safe=any(stage.null_safe),
            columns=columns,
        )
        stats.setdefault(str(stage.arrangement), LookupStats()).add(st)
        return df

    def lookup_arrow(
        self, stage: LookupStage, keys: pa.Table, as_of: int, *, stats: dict, columns: Iterable[str]
    ) -> pa.Table | None:
        """:meth:`lookup` answered by the driver in Arrow (:func:`ops.arrange.lookup_arrow`),
        or None when Spark should read it."""
        uri = self.catalog.arrangement_uri(stage.arrangement)
        self._check_since(uri, stage.arrangement, as_of)
        return lookup_arrow(
            uri,
            self.catalog.table_schema(uri),
            stage.arrangement.key,
            keys,
            as_of,
            columns=set(columns),
            stats=stats.setdefault(str(stage.arrangement), LookupStats()),
            null_safe=any(stage.null_safe),
        )

    def _check_since(self, uri: str, arrangement: ArrangementKey, as_of: int) -> None:
        info = last_commit_metadata(uri, "ivm.since")
        since = int(info["ivm.since"]) if info else 0
        if as_of < since:
            raise InvariantViolation(
                f"arrangement {arrangement} holds updates since epoch {since}; a lookup "
                f"at epoch {as_of} cannot be answered"
            )
