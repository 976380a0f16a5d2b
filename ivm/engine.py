"""The engine: epochs, and refreshing views from their inputs' changes. No Dagster here.

Owns the refresh protocol of DESIGN sections 2 and 5:

1. *Mint an epoch* (:meth:`Engine.mint_epoch`): when some source has a version newer than the
   last epoch's, record epoch ``e`` with, per source, the range ``(lower, upper]`` it covers.
   The record is committed before any view reads it and never changes afterwards.
2. *Refresh a view* (:meth:`Engine.refresh_view`) to the newest epoch its inputs have reached:
   compute its updates from the inputs' updates in ``(done, target]`` (or from their snapshot
   when the view is new), append them to the view's diff log with ``txn(log, target)``, then
   apply the net change to the readable table with ``txn(table, target)``. Each step checks its
   transaction first, so a rerun after a crash redoes exactly the missing steps. When the
   inputs' updates exceed ``[refresh] recompute_above`` of their rows, the updates are
   instead the difference between the view recomputed at ``target`` and the stored view
   (the rebuild path), which is cheaper for large changes and logs the same net change.

Contract in ``(data, time, diff)`` terms: after ``refresh_view(v)`` returns with epoch ``e``,
the log of ``v`` holds updates whose sum up to ``e`` equals the view's SQL evaluated over the
sources at the versions of epoch ``e``, and the readable table holds exactly those rows.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any

import pyarrow as pa

from ivm.config import Project, load_project
from ivm.errors import (
    ConfigError,
    EvaluationError,
    InvariantViolation,
    IvmError,
    NotOnDriver,
    SourceError,
    SqlError,
    UpstreamBroken,
    ViewNotFoundError,
)
from ivm.plan.explain import explain
from ivm.plan.join import ArrangementKey
from ivm.plan.planner import ProjectPlan, ViewPlan, plan_views
from ivm.plan.reduce import state_tables
from ivm.sql.parse import parse_view_file
from resources.contracts import Contract
from resources.faults import crash_point
from resources.filecache import FILES
from resources.lake import (
    CommitResult,
    EpochRecord,
    LakeLayout,
    SourceTable,
    append_epoch,
    commit_files,
    last_commit_metadata,
    now_utc,
    open_for_write,
    open_table,
    read_epochs,
    table_files,
)
from resources.spark import JobGroup

log = logging.getLogger("ivm")

RECOMPUTE_MIN_ROWS = 10_000
"""A change of fewer input updates is always applied incrementally, whatever its share of
the inputs: on small tables both ways cost Spark's fixed overhead, and the incremental one
is the one the diff log's history is made of."""

LOG_START = "ivm.log_start"
"""Commit metadata of a diff log: the epoch since which it holds the view's whole history."""

REFRESH_SECONDS = "ivm.refresh_seconds"
"""Commit metadata of a readable table: the seconds its refresh took until that commit began
(the view's updates computed and logged). The next refresh starts costly views first."""

BUILD_ROWS_PER_SECOND = 1_000_000
"""How fast a first build reads its sources, to rank the views of a refresh that has no
seconds recorded yet (:meth:`Engine._build_seconds_guess`): SF1, one view at a time
(``python -m bench.build``), ``revenue_by_segment`` read 7.65M rows in 10.5s,
``pricing_summary`` 6M in 5.3s, ``order_events`` 1.5M in 1.0s. Ranked in plan order, the
costliest view of the demo's SF1 build (4 views at once) started last, 19s in, and ended the
build 23s later; ranked by this guess it starts first. On 2 cores the build is bound by CPU
either way: 34.5s and 37.1s against 34.4-42.9s, within this machine's noise."""

Progress = Callable[[str], None]


@dataclass
class ViewResult:
    """What refreshing one view did. ``rows_changed`` counts updates (inserts + deletes)."""

    view: str
    epoch: int
    previous_epoch: int
    rows_changed: int = 0
    inserted: int = 0
    deleted: int = 0
    seconds: float = 0.0
    # refreshed | up-to-date | built | rebuilt | recomputed | failed | skipped
    status: str = "refreshed"
    reason: str | None = None  # why it was rebuilt or recomputed
    error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    log_files_read: int = 0
    # The readable table's files that held deleted rows, rewritten without them (copy on
    # write), and the rows those files held: the part of a refresh that grows with the table.
    files_rewritten: int = 0
    rows_rewritten: int = 0
    commit_versions: dict[str, int | None] = field(default_factory=dict)
    lookups: dict[str, Any] = field(default_factory=dict)  # arrangement -> LookupStats
    inputs_changed: bool = True  # False: nothing it reads changed; only its epoch moved
    # Spark jobs its refresh ran (arrangements it wrote included); None: not counted (Spark
    # Connect, whose server's UI lists them by the operation tag ``spark_job_group``)
    spark_jobs: int | None = 0
    spark_job_group: str | None = None  # their job group in the Spark UI (None: no Spark)
    # Who computed its updates: "spark"; "driver" (a small change evaluated in Arrow,
    # ops.local); "mixed": the driver computed the joins, Spark the reductions above them;
    # "nothing": no input changed what it reads
    computed_by: str = "spark"
    # Why the driver handed parts of a small change to Spark (ops.declines), in order
    driver_declined: list[str] = field(default_factory=list)

    def metadata(self) -> dict[str, Any]:
        """Flat metadata (for Dagster and JSON output)."""
        return {
            "epoch": self.epoch,
            "previous_epoch": self.previous_epoch,
            "rows_changed": self.rows_changed,
            "rows_inserted": self.inserted,
            "rows_deleted": self.deleted,
            "seconds": round(self.seconds, 3),
            "status": self.status,
            **({"reason": self.reason} if self.reason else {}),
            "inputs_changed": self.inputs_changed,
            "computed_by": self.computed_by,
            "driver_declined": list(self.driver_declined),
            "files_rewritten": self.files_rewritten,
            "table_rows_rewritten": self.rows_rewritten,
            "log_files_read": self.log_files_read,
            **({"spark_jobs": self.spark_jobs} if self.spark_jobs is not None else {}),
            **({"spark_job_group": self.spark_job_group} if self.spark_job_group else {}),
            **{f"delta_version_{k}": v for k, v in self.commit_versions.items()},
            **{f"seconds_{k}": round(v, 3) for k, v in self.timings.items()},
            **{
                f"arrangement {name}: {k}": v
                for name, st in self.lookups.items()
                for k, v in st.as_dict().items()
            },
        }


@dataclass
class QuarantineResult:
    """Rows of a source's new updates that broke its contract, set aside at an epoch."""

    source: str
    epoch: int
    rows: int
    table: str
    example: dict[str, Any] | None = None

    def describe(self) -> str:
        if not self.rows:
            return f"source {self.source}: every new row meets its contract"
        example = ", ".join(f"{k}={v!r}" for k, v in (self.example or {}).items())
        return (
            f"source {self.source}: {self.rows} updates quarantined at epoch {self.epoch} in "
            f"{self.table} (e.g. {example})"
        )


@dataclass
class RefreshReport:
    """What one ``refresh`` did: the epoch minted (if any) and every view's result."""

    minted: EpochRecord | None
    views: list[ViewResult]
    seconds: float
    quarantined: list[QuarantineResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(v.status not in ("failed", "skipped") for v in self.views)


@dataclass
class VerifyResult:
    """A view compared with Spark's from-scratch evaluation of its SQL at the view's epoch."""

    view: str
    epoch: int
    expected_rows: int = 0
    actual_rows: int = 0
    missing: int = 0  # rows from scratch has and the view lacks (with multiplicity)
    extra: int = 0  # rows the view has and from scratch lacks
    negative: int = 0  # rows whose summed diff in the view's log is negative
    examples: list[str] = field(default_factory=list)
    repaired: bool = False
    seconds: float = 0.0
    tolerances: list[str] = field(default_factory=list)  # columns not compared exactly: how

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.negative)

    def describe(self) -> str:
        rules = f"; compared: {'; '.join(self.tolerances)}" if self.tolerances else ""
        if self.ok:
            return f"{self.view}: OK at epoch {self.epoch} ({self.actual_rows} rows){rules}"
        parts = [f"{self.missing} rows missing", f"{self.extra} extra"]
        if self.negative:
            parts.append(f"{self.negative} negative multiplicities in its log")
        ex = f" (e.g. {'; '.join(self.examples)})" if self.examples else ""
        return f"{self.view}: DIFFERENT at epoch {self.epoch}: {', '.join(parts)}{ex}{rules}"

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {"ok": self.ok}


@dataclass(frozen=True)
class ViewStatus:
    view: str
    log_epoch: int
    table_epoch: int
    rows: int | None


def _state_layout(plan: ViewPlan) -> str:
    """The names, sort keys and formats (after the first) of a view's state tables, as its
    commits record them: state laid out another way (another planner's) cannot be continued."""
    return json.dumps(
        {
            t.name: [
                *t.key,
                *([f"format {t.format}"] if t.format > 1 else []),
                *([f"hash {t.hash}"] if t.hash else []),
            ]
            for t in state_tables(plan.root)
        },
        sort_keys=True,
    )


def costliest_first(
    order: Sequence[str], inputs: Mapping[str, Iterable[str]], seconds: Mapping[str, float]
) -> list[str]:
    """``order`` (a dependency order) re-ranked so that the views on the longest chains start
    first: a view's rank is its own expected seconds plus the largest rank among the views
    reading it. Still a dependency order (a view ranks at least as high as its readers; ties
    keep ``order``), so a refresh running several views at once does not leave its costliest
    view, or the head of a long chain, for last."""
    readers: dict[str, list[str]] = {n: [] for n in order}
    for name in order:
        for up in inputs.get(name, ()):
            if up in readers:
                readers[up].append(name)
    rank: dict[str, float] = {}
    for name in reversed(order):
        rank[name] = seconds.get(name, 0.0) + max((rank[r] for r in readers[name]), default=0.0)
    return sorted(order, key=lambda n: -rank[n])


class Engine:
    """A project's engine. Planning and status need no Spark; refreshing does.

    Args:
        project: the loaded project (or a path to its ``ivm.toml``).
        spark: the Spark session to compute with; created on first need if None.
        progress: called with a one-line message as work proceeds.
        measure_lookups: record the rows Spark's scans actually read in each arrangement
            lookup (an extra pass per lookup: for benchmarks and notes).
    """

    def __init__(
        self,
        project: Project | str,
        spark: Any | None = None,
        progress: Progress | None = None,
        *,
        measure_lookups: bool = False,
    ) -> None:
        self.project = project if isinstance(project, Project) else load_project(project)
        self.layout = LakeLayout(self.project.lake)
        # One cache per process, its budget set by the first project opened (a warning else).
        FILES.configure(self.project.cache_mb * 1024 * 1024, str(self.project.config_file))
        self._spark = spark
        self._spark_announced = False  # progress says once where Spark computes
        if spark is not None:
            from resources.spark import release_at_exit

            release_at_exit(spark)  # a Spark Connect session: released on its server at exit
        self.progress: Progress = progress or (lambda msg: log.info(msg))
        self.measure_lookups = measure_lookups
        self._contracts: dict[str, Contract] = {}
        self._lock = threading.Lock()  # creating the Spark session and arrangement locks once
        self._arranging: dict[ArrangementKey, threading.Lock] = {}
        self._thread = threading.local()  # .group: the JobGroup this thread's jobs go to
        self._repairing: set[str] = set()
        """Views being repaired: their diff log, not their table, is the stored truth, and
        the table is rewritten from the log."""

    # -- planning (no Spark) ------------------------------------------------------------------

    @cached_property
    def _opened_sources(self) -> tuple[dict[str, SourceTable], dict[str, IvmError]]:
        good: dict[str, SourceTable] = {}
        bad: dict[str, IvmError] = {}
        for name, uri in self.project.sources.items():
            try:
                source = SourceTable(name, uri)
                schema = source.check()
                contract = self._contract(name)
                if contract is not None:
                    contract.check_schema(schema)
                good[name] = source
            except (SourceError, ConfigError) as e:
                bad[name] = e
        return good, bad

    def _contract(self, source: str) -> Contract | None:
        """The pandera schema declared for ``source`` in ``[contracts]``, or None."""
        ref = self.project.contracts.get(source)
        if ref is None:
            return None
        if source not in self._contracts:
            from resources.contracts import load_contract

            self._contracts[source] = load_contract(self.project.root, source, ref)
        return self._contracts[source]

    def contract_predicate(self, source: str, dialect: str = "spark") -> str | None:
        """The SQL predicate a source's valid rows satisfy (None: no contract or no row check)."""
        contract = self._contract(source)
        return None if contract is None else contract.predicate_sql(dialect)

    @property
    def sources(self) -> dict[str, SourceTable]:
        """The sources that can be opened (see :attr:`broken_sources` for the others)."""
        return self._opened_sources[0]

    @property
    def broken_sources(self) -> dict[str, IvmError]:
        """Sources that cannot be opened (missing, corrupt log, unreadable), with why."""
        return self._opened_sources[1]

    @cached_property
    def plan(self) -> ProjectPlan:
        parsed, broken = [], {}
        for f in self.project.view_files():
            try:
                parsed.append(parse_view_file(f))
            except SqlError as e:
                broken[f.stem.lower()] = e
        columns = {name: s.column_names() for name, s in self.sources.items()}
        append_only = {name for name, s in self.sources.items() if s.append_only()}
        return plan_views(
            parsed,
            columns,
            append_only,
            broken=broken,
            broken_sources=self.broken_sources,
        )

    def view(self, name: str) -> ViewPlan:
        """The plan of a view.

        Raises:
            ViewNotFoundError: no such view.
            IvmError: the view is broken (its SQL, or an input): the error that says why.
        """
        key = name.lower()
        if key in self.plan.broken:
            raise self.plan.broken[key]
        try:
            return self.plan.views[key]
        except KeyError:
            known = ", ".join(sorted([*self.plan.views, *self.plan.broken])) or "none"
            raise ViewNotFoundError(f"unknown view {name!r} (views: {known})") from None

    def explain(self, name: str) -> str:
        return explain(self.view(name), self.plan)

    # -- state (no Spark) ---------------------------------------------------------------------

    def app_id(self, uri: str) -> str:
        return LakeLayout.app_id(uri, self.layout.root)

    def epochs(self) -> list[EpochRecord]:
        return read_epochs(self.layout)

    def latest_epoch(self) -> int:
        epochs = self.epochs()
        return epochs[-1].epoch if epochs else 0

    def table_epoch(self, uri: str) -> int:
        dt = open_table(uri)
        if dt is None:
            return 0
        return dt.transaction_version(self.app_id(uri)) or 0

    def view_status(self, name: str) -> ViewStatus:
        table = self.layout.view_table(name)
        dt = open_table(table)
        rows = None
        if dt is not None:
            actions = pa.table(dt.get_add_actions(flatten=True))
            rows = int(sum(r or 0 for r in actions.column("num_records").to_pylist()))
        return ViewStatus(
            name, self.table_epoch(self.layout.view_log(name)), self.table_epoch(table), rows
        )

    def read_view(self, name: str) -> pa.Table:
        """The view's current rows, read with delta-rs (no Spark)."""
        self.view(name)
        dt = open_table(self.layout.view_table(name))
        if dt is None:
            raise IvmError(
                f"view {name!r} has not been materialized yet: run `ivm --project "
                f"{self.project.root} refresh`"
            )
        return dt.to_pyarrow_table()

    # -- epochs ---------------------------------------------------------------------------------

    def source_versions(self) -> dict[str, int]:
        return {name: s.version() for name, s in self.sources.items()}

    def pending_changes(self, *, allow_reset: bool = False) -> dict[str, tuple[int | None, int]]:
        """Sources whose current version is past the last epoch: name -> (recorded, current).

        Raises:
            SourceError: a source's version went backwards, unless ``allow_reset``.
        """
        epochs = self.epochs()
        last = epochs[-1].ranges if epochs else {}
        out: dict[str, tuple[int | None, int]] = {}
        for name, version in self.source_versions().items():
            recorded = last.get(name, (None, None))[1] if name in last else None
            if recorded is None or version > recorded:
                out[name] = (recorded, version)
            elif version < recorded and allow_reset:
                out[name] = (recorded, version)
            elif version < recorded:
                raise SourceError(
                    f"source {name!r} ({self.project.sources[name]}) is at version {version}, "
                    f"older than version {recorded} already consumed: was it re-created or "
                    "restored? Rebuild with `ivm refresh --rebuild`"
                )
        return out

    def mint_epoch(self, *, force: bool = False) -> EpochRecord | None:
        """Record a new epoch if any source advanced (or is new); None when nothing changed.

        Args:
            force: mint one even if no source changed (a rebuild needs a new epoch to write
                at). A source whose version went backwards (re-created, restored) then
                re-enters from its snapshot instead of raising.
        """
        while True:
            epochs = self.epochs()
            last = epochs[-1] if epochs else None
            pending = self.pending_changes(allow_reset=force)
            if not pending and not (force and last is not None):
                return None
            ranges: dict[str, tuple[int | None, int]] = {}
            versions = self.source_versions()
            for name, version in versions.items():
                prev = last.ranges.get(name) if last else None
                lower = prev[1] if prev else None
                ranges[name] = (None if lower is not None and version < lower else lower, version)
            for name in self.broken_sources:  # unreadable now: no change until it is back
                if last is not None and name in last.ranges:
                    ranges[name] = (last.ranges[name][1], last.ranges[name][1])
            record = EpochRecord((last.epoch if last else 0) + 1, ranges, now_utc())
            if append_epoch(self.layout, record):
                changed = ", ".join(
                    f"{s} {'new' if lo is None else lo}->{up}"
                    for s, (lo, up) in ranges.items()
                    if lo != up
                )
                self.progress(
                    f"epoch {record.epoch} minted ({changed or 'no source changed: for rebuilds'})"
                )
                return record
            # Another refresher minted this epoch first: look again.

    # -- refresh (Spark) ---------------------------------------------------------------------

    @property
    def spark(self):  # -> SparkSession
        with self._lock:  # views refreshed at once start it once
            if self._spark is None:
                from resources.spark import get_spark

                self._spark = get_spark(self.project.spark_conf)
            if not self._spark_announced:
                from resources.spark import describe_session

                self._spark_announced = True
                self.progress(f"computing on {describe_session(self._spark)}")
        group = getattr(self._thread, "group", None)
        if group is not None and not group.opened:  # the session started inside the group
            group.open(self._spark)
        return self._spark

    def release_spark(self) -> None:
        """Release a Spark Connect session on its server now (nothing for a classic session,
        whose JVM ends with this process); for a process that ends without running ``atexit``
        handlers."""
        if self._spark is not None:
            from resources.spark import release

            release(self._spark)

    @contextmanager
    def job_group(self, name: str, description: str) -> Iterator[JobGroup | None]:
        """Put the Spark jobs this thread starts inside in one job group (see
        :class:`~resources.spark.JobGroup`); yields None inside another group, which then
        counts them. The session is not started for it: a step that needs no Spark runs none."""
        if getattr(self._thread, "group", None) is not None:
            yield None
            return
        group = self._thread.group = JobGroup(name, description)
        try:
            if self._spark is not None:
                group.open(self._spark)
            yield group
        finally:
            self._thread.group = None
            group.close(self._spark)

    def refresh(
        self,
        views: Iterable[str] | None = None,
        *,
        mint: bool = True,
        rebuild: bool | Iterable[str] = False,
    ) -> RefreshReport:
        """Mint an epoch if sources changed, then bring views (default: all) up to it.

        Args:
            views: the views to refresh (default: all).
            mint: mint a new epoch first when sources changed (or a rebuild needs one).
            rebuild: ``True`` to rebuild every selected view from its inputs' current state,
                or the names of views to rebuild. Views whose definition changed are rebuilt
                without being asked. A rebuild writes, at a new epoch, the difference between
                the fresh result and the stored one, so downstream still receives changes.

        One failing view does not stop the others; views that read it are skipped (they wait
        rather than read partial data) and the report says why.
        """
        started = time.perf_counter()
        plan = self.plan  # plan first: invalid SQL must fail before anything is written
        if views is None:
            names, unplanned = list(plan.order), sorted(plan.broken)
        else:
            wanted = [v.lower() for v in views]
            unplanned = [v for v in wanted if v in plan.broken]
            names = [self.view(v).name for v in wanted if v not in plan.broken]
        if unplanned and not names:  # nothing to refresh: the error itself, nothing written
            raise plan.broken[unplanned[0]]
        if rebuild is True:
            asked = set(names)
        else:
            asked = {self.view(v).name for v in (rebuild or [])}
        needs = {n for n in names if n in asked or self.rebuild_reason(n)}
        with self.job_group("epoch", "ivm: mint an epoch, quarantine"):
            minted = self.mint_epoch(force=bool(needs)) if mint else None
            quarantined = self.quarantine()
        chosen = set(names)
        results = self._refresh_views([n for n in plan.order if n in chosen], asked)
        for name in unplanned:
            error = plan.broken[name]
            status = "skipped" if isinstance(error, UpstreamBroken) else "failed"
            results.append(ViewResult(name, 0, 0, status=status, error=str(error)))
            self.progress(f"{name}: {status.upper()}: {error}")
        return RefreshReport(minted, results, time.perf_counter() - started, quarantined)

    def _refresh_views(self, order: list[str], asked: set[str]) -> list[ViewResult]:
        """Refresh ``order`` (dependency order) with up to ``parallelism`` views at once.

        A view starts once every selected view it reads has finished, the views on the
        longest chains of expected work first (:func:`costliest_first`, from the seconds the
        last refresh recorded); if one of those it reads failed it is skipped. Views share
        arrangements through :meth:`refresh_arrangement`, which lets one of them write each
        arrangement. An error that is not an :class:`IvmError` (a bug, a lost Spark) stops
        new starts and is raised once the running views end.
        """
        # PySpark's modules imported whole on this thread first: threads importing parts of
        # them at once (a view's refresh reading pyspark.errors while another's reads
        # pyspark.sql) found a partially initialised module.
        import py4j.protocol  # noqa: F401
        import pyspark.errors  # noqa: F401
        import pyspark.sql  # noqa: F401

        views = self.plan.views
        selected = set(order)
        results: dict[str, ViewResult] = {}
        failed: dict[str, str] = {}
        pending = costliest_first(
            order,
            {n: views[n].view_inputs for n in order},
            {n: self._last_refresh_seconds(n) or self._build_seconds_guess(n) for n in order},
        )
        running: dict[Future, str] = {}
        unexpected: BaseException | None = None
        with ThreadPoolExecutor(self.project.parallelism, thread_name_prefix="ivm") as pool:
            while (pending and unexpected is None) or running:
                busy = set(running.values())
                for name in list(pending) if unexpected is None else []:
                    if len(running) >= self.project.parallelism:
                        break  # queue nothing: a view that becomes ready may rank higher
                    ups = [u for u in views[name].view_inputs if u in selected]
                    if any(u in busy or u in pending for u in ups):
                        continue
                    pending.remove(name)
                    blocked = [u for u in ups if u in failed]
                    if blocked:
                        r = ViewResult(name, 0, 0, status="skipped")
                        r.error = f"waits for view {blocked[0]!r}, which failed"
                        failed[name] = r.error
                        results[name] = r
                        self.progress(f"{name}: skipped ({r.error})")
                        continue
                    future = pool.submit(self.refresh_view, name, rebuild=name in asked)
                    running[future] = name
                    busy.add(name)
                if not running:
                    continue
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    name = running.pop(future)
                    try:
                        results[name] = future.result()
                    except IvmError as e:
                        failed[name] = str(e)
                        results[name] = ViewResult(name, 0, 0, status="failed", error=str(e))
                        self.progress(f"{name}: FAILED: {e}")
                    except BaseException as e:  # noqa: BLE001 - re-raised below, once
                        unexpected = unexpected or e
        if unexpected is not None:
            raise unexpected
        return [results[n] for n in order if n in results]

    def _last_refresh_seconds(self, name: str) -> float:
        """How long the view's last refresh took until its table commit (0 if unknown)."""
        info = last_commit_metadata(self.layout.view_table(name), REFRESH_SECONDS)
        try:
            return float(info[REFRESH_SECONDS]) if info else 0.0
        except ValueError:  # written by hand or by another tool: no estimate
            return 0.0

    def _build_seconds_guess(self, name: str) -> float:
        """A view with no refresh recorded (its first build) expects to read its sources
        whole: their rows (Delta statistics) at :data:`BUILD_ROWS_PER_SECOND`. Views it reads
        count through their own rank (:func:`costliest_first`)."""
        rows = sum(self._rows_hint(c) or 0 for c in self.view(name).source_inputs)
        return rows / BUILD_ROWS_PER_SECOND

    def quarantine_uri(self, source: str) -> str:
        """Where a source's rows that break its contract are kept: ``quarantine/<source>``."""
        return f"{self.layout.root}/quarantine/{source}"

    def quarantine(self) -> list[QuarantineResult]:
        """Set aside, up to the latest epoch, the updates of each source that break its
        contract: appended to ``quarantine/<source>`` (the source's columns, ``_violations``
        naming the failed checks, ``_time``, ``_diff``) once per epoch (txn), so a rerun adds
        nothing. Views never read these rows (see :meth:`_collection_updates`).
        """
        if not self.project.contracts:
            return []
        from pyspark.sql import functions as F

        from ops import DIFF, TIME
        from ops.sink import append_updates

        out = []
        target = self.latest_epoch()
        for name in self.sources:
            contract = self._contract(name)
            valid = self.contract_predicate(name)
            if contract is None or valid is None:
                continue
            uri = self.quarantine_uri(name)
            done = self.table_epoch(uri)
            if done >= target:
                continue
            started = time.perf_counter()
            anew = done > 0 and self._quarantine_schema(uri) != self._source_types(
                name, self.sources[name].column_names()
            )
            if anew:  # the source's schema changed: keep its invalid rows as of now
                self.progress(f"source {name}: schema changed; the quarantine starts anew")
                done = 0
            bad = self._source_updates(name, done, target).where(f"NOT ({valid})")
            bad = bad.withColumn("_violations", F.expr(contract.reasons_sql("spark")))
            cols = [c for c in bad.columns if c not in (TIME, DIFF)]
            bad = bad.select(*cols, TIME, DIFF).coalesce(1)
            commit = append_updates(
                bad,
                uri,
                app_id=self.app_id(uri),
                epoch=target,
                metadata={"ivm.quarantine": name},
                description=f"ivm quarantine: updates of source {name} that break its contract",
                overwrite=anew,
                small=self.small_change([name], done, target),
            )
            result = QuarantineResult(name, target, commit.rows, uri)
            if commit.rows:  # one row of this epoch's, read from the files (not all of them)
                import pyarrow.dataset as ds

                dataset = open_table(uri).to_pyarrow_dataset()
                first = dataset.head(1, filter=ds.field(TIME) == target).to_pylist()
                result.example = first[0] if first else None
            out.append(result)
            self.progress(f"{result.describe()} ({time.perf_counter() - started:.2f}s)")
        return out

    def _quarantine_schema(self, uri: str) -> dict[str, str]:
        from resources.contracts import spark_type_name

        return {
            f.name: spark_type_name(f.type)
            for f in self.table_schema(uri)
            if f.name not in ("_violations", "_time", "_diff")
        }

    def target_epoch(self, view: ViewPlan) -> int:
        """The newest epoch a view can reach: the latest epoch, bounded by its input views."""
        target = self.latest_epoch()
        for upstream in view.view_inputs:
            target = min(target, self.table_epoch(self.layout.view_table(upstream)))
        return target

    def _definition(self, plan: ViewPlan) -> dict[str, str]:
        """What a view's commits record about the definition they were computed with."""
        inputs = {u: self._upstream_identity(u) for u in plan.view_inputs}
        return {
            "ivm.view": plan.name,
            "ivm.sql_hash": plan.sql_hash,
            "ivm.inputs": json.dumps(inputs, sort_keys=True),
            "ivm.contracts": json.dumps(self._contract_hashes(plan.source_inputs), sort_keys=True),
            "ivm.input_types": json.dumps(self._input_types(plan), sort_keys=True),
            "ivm.state_tables": _state_layout(plan),
        }

    def _upstream_identity(self, view: str) -> str:
        """``sql_hash@log_start`` of an upstream view: a downstream view computed from
        another definition, or from a history that has since started anew, is rebuilt."""
        return f"{self.plan.views[view].sql_hash}@{self._log_start(self.layout.view_log(view))}"

    def _contract_hashes(self, collections: Iterable[str]) -> dict[str, str]:
        """Per source among ``collections`` read under a contract, a hash of its predicate."""
        import hashlib

        out = {}
        for source in collections:
            if source not in self.sources:
                continue
            valid = self.contract_predicate(source)
            if valid is not None:
                out[source] = hashlib.sha256(valid.encode()).hexdigest()[:16]
        return out

    def _stale_definition(self, uri: str, plan: ViewPlan) -> str | None:
        """Why the table at ``uri`` was computed with another definition, or None."""
        info = last_commit_metadata(uri, "ivm.sql_hash")
        if info is None:
            return None
        if info["ivm.sql_hash"] != plan.sql_hash:
            return "its SQL changed"
        layout = info.get("ivm.state_tables")
        if layout != _state_layout(plan) and (layout is not None or plan.has_state):
            return "its state tables changed (written by another version of the planner)"
        recorded = json.loads(info.get("ivm.inputs", "{}"))
        for upstream in plan.view_inputs:
            was_hash, _, was_start = str(recorded.get(upstream)).partition("@")
            now_hash, _, now_start = self._upstream_identity(upstream).partition("@")
            if was_hash != now_hash:
                return f"upstream view {upstream!r} was redefined"
            if was_start and was_start != now_start:
                return (
                    f"upstream view {upstream!r} started its history anew at epoch {now_start} "
                    "(its columns changed)"
                )
        contracts = json.loads(info.get("ivm.contracts", "{}"))
        current = self._contract_hashes(plan.source_inputs)
        for source in sorted(set(contracts) | set(current)):
            if contracts.get(source) != current.get(source):
                return f"the row checks of source {source!r}'s contract changed"
        types = json.loads(info.get("ivm.input_types", "{}"))
        for source, now in self._input_types(plan).items():
            for column, was in types.get(source, {}).items():
                if column in now and now[column] != was:
                    return (
                        f"source {source!r} column {column!r} changed type from {was} to "
                        f"{now[column]}"
                    )
        return None

    def _source_types(self, source: str, columns: Iterable[str]) -> dict[str, str]:
        """Current Spark type names of some columns of a source."""
        from resources.contracts import spark_type_name

        schema = {f.name.lower(): f.type for f in self.sources[source].arrow_schema()}
        return {c: spark_type_name(schema[c]) for c in columns if c in schema}

    def _input_types(self, plan: ViewPlan) -> dict[str, dict[str, str]]:
        """The types of the source columns a view reads (its own and its arrangements'):
        when one changes, the view is rebuilt rather than fed updates of another type."""
        columns: dict[str, set[str]] = {}
        for get in plan.gets:
            if get.kind == "source":
                columns.setdefault(get.collection, set()).update(get.columns)
        for arrangement in self.plan.arrangements_of(plan.name):
            if arrangement.key.collection in self.sources:
                columns.setdefault(arrangement.key.collection, set()).update(arrangement.columns)
        return {s: self._source_types(s, sorted(cols)) for s, cols in columns.items()}

    def rebuild_reason(self, name: str) -> str | None:
        """Why a view must be rebuilt before it can continue incrementally, or None."""
        return self._stale_definition(self.layout.view_log(name), self.view(name))

    def epoch_for_rebuild(self, name: str) -> EpochRecord | None:
        """Mint an epoch (even with no source change) when the view already holds the latest
        one, so that a rebuild asked for now has an epoch to write at; None if not needed."""
        if self.table_epoch(self.layout.view_log(self.view(name).name)) < self.latest_epoch():
            return None
        return self.mint_epoch(force=True)

    def refresh_view(self, name: str, *, rebuild: bool = False) -> ViewResult:
        """Bring one view to :meth:`target_epoch`; idempotent per epoch (see module doc).

        Its Spark jobs run in a job group of their own (the Spark UI lists them under the
        view's name); the result counts them.

        Args:
            name: the view.
            rebuild: recompute it from its inputs' state at the target epoch even if its
                definition did not change (a definition change always rebuilds).

        Raises:
            IvmError: a rebuild is due but no epoch is newer than the view's (mint one).
            EvaluationError: its SQL fails on a row of its change (an overflow, a division
                by zero, as Spark's ANSI mode fails), nothing committed: names the view, and
                the column and expression when known.
        """
        from ops.declines import recorded

        name = self.view(name).name
        self._thread.found = None  # what the driver found failing (_driver_failed)
        with (
            self.job_group(f"view {name}", f"ivm: refresh view {name}") as group,
            recorded() as declined,
        ):
            result = self._refresh_view_reporting(name, rebuild)
        result.driver_declined = declined
        if group is not None and group.jobs is None:  # Spark Connect: tagged, not counted
            result.spark_jobs, result.spark_job_group = None, group.id
        elif group is not None and group.jobs:
            result.spark_jobs, result.spark_job_group = group.jobs, group.id
        return result

    def _refresh_view_reporting(self, name: str, rebuild: bool) -> ViewResult:
        """:meth:`_refresh_view`, Spark's failure evaluating the view's SQL on a row raised
        as an EvaluationError naming the view (and, as the driver found it, the column)."""
        from py4j.protocol import Py4JJavaError
        from pyspark.errors import PySparkException

        from ops.stateless import evaluation_error

        try:
            return self._refresh_view(name, rebuild)
        except (PySparkException, Py4JJavaError) as error:
            failure = evaluation_error(error)
            if failure is None:
                raise
            found: EvaluationError | None = getattr(self._thread, "found", None)
            if found is not None and failure.operation in (None, found.operation):
                if found.kind == failure.kind:
                    failure = failure.located(column=found.column, operation=found.operation)
            column = self._column_computing(name, failure.operation)
            raise failure.located(view=name, column=column) from error

    def _column_computing(self, name: str, operation: str | None) -> str | None:
        """The view's column (or ``WHERE``) whose expression holds ``operation`` (Spark SQL
        text), when one of its plan's projections or filters does."""
        from ivm.plan.ir import Filter, Join, Project, walk
        from ops.stateless import spark_sql

        if not operation:
            return None
        for node in walk(self.view(name).root):
            outputs: list[tuple[str, Any]] = []
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

    def _refresh_view(self, name: str, rebuild: bool) -> ViewResult:
        from ops.ingest import log_files_between
        from ops.sink import TableChange, append_updates, apply_to_table

        plan = self.view(name)
        started = time.perf_counter()
        log_uri, table_uri = self.layout.view_log(name), self.layout.view_table(name)
        log_done, table_done = self.table_epoch(log_uri), self.table_epoch(table_uri)
        target = self.target_epoch(plan)
        result = ViewResult(name, target, table_done)
        reason = "rebuild requested" if rebuild else self.rebuild_reason(name)
        if reason and log_done >= target:
            raise IvmError(
                f"view {name!r} must be rebuilt ({reason}), which needs an epoch newer than "
                f"{log_done}: run `ivm --project {self.project.root} refresh` (it mints one) "
                "or materialize ivm/epoch first"
            )
        if target == 0 or (log_done >= target and table_done >= target):
            result.epoch = max(table_done, target)
            result.status = "up-to-date"
            result.seconds = time.perf_counter() - started
            self.progress(f"{name}: up to date at epoch {result.epoch}")
            return result
        meta = self._definition(plan)
        log_start = self._log_start(log_uri)
        logged = None  # the log's updates this call wrote, when the driver wrote them
        if log_done < target:
            t0 = time.perf_counter()
            overwrite = small = False
            unchanged: frozenset[str] = frozenset()
            if not reason and log_done > 0:
                unchanged = self._unchanged_inputs(plan, log_done, target)
            quiet = not reason and log_done > 0 and unchanged >= set(plan.inputs)
            recompute = None
            if not reason and not quiet and log_done > 0:
                recompute = self._recompute_reason(plan, log_done, target)
            if (reason or recompute) and log_done > 0:
                why = reason or recompute
                verb = "rebuilding" if reason else "recomputing"
                self.progress(f"{name}: {verb} at epoch {target} ({why})")
                updates, overwrite = self._rebuild_updates(plan, log_done, target)
                result.status, result.reason = ("rebuilt" if reason else "recomputed"), why
            elif quiet:  # nothing it reads changed: no update, no Spark, only the epoch
                updates = None
                result.status = "refreshed"
                result.inputs_changed = False
                result.computed_by = "nothing"
            else:
                lookups: dict = {}
                small = self.small_change(plan.inputs, log_done, target)
                updates = None
                if small:
                    updates = self._updates_on_driver(plan, log_done, target, lookups, unchanged)
                if updates is not None:
                    result.computed_by = "driver"
                else:
                    by_driver: list[str] = []
                    updates = self._view_updates(
                        plan, log_done, target, lookups, unchanged, small, by_driver
                    )
                    if by_driver:
                        result.computed_by = "mixed"
                result.lookups = lookups
                result.status = "built" if log_done == 0 else "refreshed"
            if overwrite or log_done == 0:
                log_start = target
            if updates is None:
                commit = commit_files(
                    log_uri,
                    app_id=self.app_id(log_uri),
                    epoch=target,
                    schema=self.table_schema(log_uri),
                    metadata={**meta, LOG_START: str(log_start)},
                )
            else:
                commit = append_updates(
                    updates,
                    log_uri,
                    app_id=self.app_id(log_uri),
                    epoch=target,
                    metadata={**meta, LOG_START: str(log_start)},
                    overwrite=overwrite,
                    small=small,
                )
            crash_point("log_committed")
            if commit.committed and log_done == table_done and not overwrite and log_done > 0:
                logged = commit.staged  # the updates of (log_done, target], as written
            result.timings["log"] = time.perf_counter() - t0
            result.commit_versions["log"] = commit.version
        t0 = time.perf_counter()
        table_meta = {**meta, REFRESH_SECONDS: f"{t0 - started:.3f}"}
        # A log that started anew after the table's epoch (new columns) rewrites the table.
        table_stale = 0 < table_done < log_start or (name in self._repairing and table_done > 0)
        if (
            table_done > 0
            and not table_stale
            and not log_files_between(log_uri, table_done, target)
        ):
            # The log holds no update after the table's epoch: the table only moves its epoch.
            commit = commit_files(
                table_uri,
                app_id=self.app_id(table_uri),
                epoch=target,
                schema=self.table_schema(table_uri),
                metadata=table_meta,
            )
            change = TableChange(commit, inserted=0, deleted=0, files_rewritten=0, rows_rewritten=0)
        else:
            from ops.ingest import consolidated_on, insertions_only, view_changes_by_driver

            since = -1 if table_stale else table_done
            net, files = self._net_change(plan, since, target, log_start)
            result.log_files_read = len(files)
            positive = insertions_only(files)  # appended as they are: nothing to size
            change = apply_to_table(
                self.spark,
                net,
                table_uri,
                app_id=self.app_id(table_uri),
                epoch=target,
                metadata=table_meta,
                label=name,
                overwrite=table_stale,
                positive=positive,
                rows_hint=_at_most(f.file.num_records for f in files),
                # The log's epochs since the table's, summed per row: a row may come at one
                # epoch and go at the next.
                net_rows=None
                if table_stale or logged is None
                else consolidated_on(logged, plan.columns),
                read_net=lambda most: view_changes_by_driver(
                    files, plan.columns, since, target, most
                ),
            )
        crash_point("table_committed")
        result.timings["table"] = time.perf_counter() - t0
        result.commit_versions["table"] = change.commit.version
        result.inserted, result.deleted = change.inserted, change.deleted
        result.rows_changed = change.inserted + change.deleted
        result.files_rewritten = change.files_rewritten
        result.rows_rewritten = change.rows_rewritten
        result.seconds = time.perf_counter() - started
        self.progress(
            f"{name}: epoch {table_done} -> {target}: +{change.inserted} -{change.deleted} rows "
            f"({result.seconds:.2f}s)"
        )
        return result

    def _unchanged_inputs(self, plan: ViewPlan, done: int, target: int) -> frozenset[str]:
        """The collections a view reads whose updates in ``(done, target]`` change nothing it
        sees, known on the driver without Spark: a source that kept its version, or whose
        change feed only rewrote columns the view does not read (nor its contract checks) or
        undid itself; a view that logged no update. A delta join skips their paths; a view
        all of whose inputs are here only moves its epoch."""
        from ops.ingest import log_files_between, source_change_cancels

        epochs = self._epoch_map()
        out = set()
        for source in plan.source_inputs:
            columns = self._columns_read(plan, source)
            for e in range(done + 1, target + 1):
                rng = epochs[e].ranges.get(source) if e in epochs else None
                if rng is None or rng[0] is None or source not in self.sources:
                    break
                if rng[0] != rng[1] and not source_change_cancels(
                    self.spark, self.sources[source], rng[0], rng[1], e, columns
                ):
                    break
            else:
                out.add(source)
        out.update(
            v
            for v in plan.view_inputs
            if not log_files_between(self.layout.view_log(v), done, target)
        )
        return frozenset(out)

    def _input_columns(self, plan: ViewPlan, coll: str) -> tuple[str, ...] | None:
        """The columns a view reads of an input: a source's (:meth:`_columns_read`); a view's
        updates come with every column (None)."""
        return self._columns_read(plan, coll) if coll in plan.source_inputs else None

    def _columns_read(self, plan: ViewPlan, source: str) -> tuple[str, ...]:
        """The source's columns a view reads (after demand analysis), and those its contract's
        row check reads: an update that keeps them all keeps what the view sees."""
        return self._checked_columns(
            source, [c for g in plan.gets if g.collection == source for c in g.columns]
        )

    def _checked_columns(self, source: str, columns: Sequence[str]) -> tuple[str, ...]:
        """``columns`` of a source and those its contract's row check reads."""
        from ivm.plan.ir import referenced_columns

        out = set(columns)
        contract = self._contract(source)
        check = None if contract is None else contract.predicate()
        if check is not None:
            out |= {c.lower() for c in referenced_columns(check)}
        return tuple(sorted(out))

    def input_change(self, plan: ViewPlan, done: int, target: int) -> tuple[int, int]:
        """How many updates a view's inputs give in ``(done, target]``, and how many rows they
        hold at ``target``: the share decides whether to recompute (``recompute_above``).

        Sources count their change feed's rows (read now if no view has yet; it is kept for
        the refresh) or their appended files' row counts; views count the rows of the diff-log
        files that may hold updates in the range. Totals come from file statistics.
        """
        from ops.ingest import source_rows

        epochs = self._epoch_map()
        changed = sum(self.change_rows(coll, done, target) for coll in plan.inputs)
        total = 0
        for coll in plan.source_inputs:
            total += source_rows(self.sources[coll], epochs[target].ranges[coll][1])
        for coll in plan.view_inputs:
            total += self._rows_hint(coll) or 0
        return changed, total

    def change_rows(self, coll: str, done: int, target: int) -> int:
        """How many updates a collection gives in ``(done, target]``, at most: a source's
        change feed rows (read now if no reader has yet; it is kept for the refresh) or its
        appended files' rows; a view's rows in the diff-log files that may hold updates in
        the range. From file statistics and the kept feeds: no Spark job."""
        from ops.ingest import log_files_between, source_change_rows

        if coll in self.plan.views:
            log_uri = self.layout.view_log(coll)
            return sum(f.num_records or 0 for f in log_files_between(log_uri, done, target))
        epochs = self._epoch_map()
        changed = 0
        for e in range(done + 1, target + 1):
            rng = epochs[e].ranges.get(coll)  # missing: the refresh itself says so
            if rng is not None and rng[0] != rng[1]:
                changed += source_change_rows(self.spark, self.sources[coll], rng[0], rng[1], e)
        return changed

    def small_change(self, colls: Iterable[str], done: int, target: int) -> bool:
        """Whether ``colls`` give at most :data:`~ops.sink.DRIVER_CHANGE_ROWS` updates in
        ``(done, target]`` (``done`` > 0: a refresh, not a build): what they cause is then
        written by the driver (see :func:`ops.sink.stage_updates`)."""
        from ops.sink import DRIVER_CHANGE_ROWS

        return done > 0 and sum(self.change_rows(c, done, target) for c in colls) <= (
            DRIVER_CHANGE_ROWS
        )

    def _recompute_reason(self, plan: ViewPlan, done: int, target: int) -> str | None:
        """Why this refresh should recompute the view rather than apply its inputs' changes:
        more than ``recompute_above`` of their rows changed (and at least
        :data:`RECOMPUTE_MIN_ROWS`), or None."""
        share_limit = self.project.recompute_above
        if share_limit >= 1:
            return None
        changed, total = self.input_change(plan, done, target)
        if changed < RECOMPUTE_MIN_ROWS or changed <= share_limit * total:
            return None
        return (
            f"{changed:,} updates to its inputs' {total:,} rows ({changed / max(total, 1):.1%}) "
            f"exceed [refresh] recompute_above = {share_limit:g}"
        )

    def _log_start(self, log_uri: str) -> int:
        """The epoch since which the diff log holds the view's whole history (0: no log)."""
        info = last_commit_metadata(log_uri, LOG_START)
        return int(info[LOG_START]) if info else 0

    def _rebuild_updates(self, plan: ViewPlan, log_done: int, target: int):
        """Updates that take the stored view (at ``log_done``) to a fresh computation at ``target``.

        Returns:
            ``(updates, overwrite)``: with unchanged columns, the difference ``fresh - stored``
            at time ``target`` (appended to the log); with changed columns, the fresh contents
            alone, to replace the log's history.
        """
        from pyspark.sql import functions as F

        from ops import DIFF, TIME
        from ops.consolidate import consolidate
        from ops.ingest import view_state
        from ops.sink import arrow_schema, same_columns

        fresh = self._view_updates(plan, 0, target)
        log_uri, table_uri = self.layout.view_log(plan.name), self.layout.view_table(plan.name)
        stored_schema = self.table_schema(log_uri)
        if not same_columns(arrow_schema(fresh), stored_schema):
            self.progress(f"{plan.name}: columns changed; the diff log starts anew")
            return fresh, True
        table_epoch = self.table_epoch(table_uri)
        stored = view_state(
            self.spark,
            table_uri,
            self.table_schema(table_uri),
            log_uri,
            stored_schema,
            log_done,
            table_epoch
            if table_epoch >= self._log_start(log_uri) and plan.name not in self._repairing
            else -1,
        )
        retract = stored.withColumn(DIFF, -F.col(DIFF)).withColumn(
            TIME, F.lit(target).cast("bigint")
        )
        return consolidate(fresh.unionByName(retract), plan.columns), False

    # -- inputs -------------------------------------------------------------------------------

    def _epoch_map(self) -> dict[int, EpochRecord]:
        return {e.epoch: e for e in self.epochs()}

    def _collection_updates(
        self, coll: str, done: int, target: int, columns: Sequence[str] | None = None
    ):
        """A source's or view's updates in ``(done, target]``; its snapshot at ``target``
        (as updates at ``target``) when ``done`` is 0. ``columns``: what the reader needs of a
        source (see :meth:`_source_updates`); a view's updates come with every column."""
        from ops.ingest import view_changes, view_state

        spark = self.spark
        if coll in self.plan.views:
            up_log, up_table = self.layout.view_log(coll), self.layout.view_table(coll)
            log_schema = self.table_schema(up_log)
            if done == 0:
                return view_state(
                    spark,
                    up_table,
                    self.table_schema(up_table),
                    up_log,
                    log_schema,
                    target,
                    self.table_epoch(up_table),
                )
            return view_changes(spark, up_log, log_schema, done, target)[0]
        df = self._source_updates(
            coll, done, target, None if columns is None else self._checked_columns(coll, columns)
        )
        valid = self.contract_predicate(coll)
        return df if valid is None else df.where(valid)

    def _source_updates(
        self, coll: str, done: int, target: int, columns: Sequence[str] | None = None
    ):
        """A source's updates in ``(done, target]`` as its table has them (no contract).

        ``columns``: the reader needs only these; a change feed kept on the driver then comes
        summed on them there (:func:`ops.ingest.source_changes_once`): an update that rewrote
        other columns only reaches no lookup, join or state. Snapshots and appended files
        come with every column."""
        from pyspark.sql import functions as F

        from ops import DIFF, TIME
        from ops.ingest import source_changes_once, source_snapshot

        epochs = self._epoch_map()
        source = self.sources[coll]
        if done == 0:
            return source_snapshot(self.spark, source, epochs[target].ranges[coll][1], target)
        if done >= target:  # an empty range: no change
            version = epochs[target].ranges[coll][1]
            return source_changes_once(self.spark, source, version, version, target, columns)
        parts = []
        for e in range(done + 1, target + 1):
            rng = epochs[e].ranges.get(coll)
            if rng is None:
                raise SourceError(f"source {coll!r} is missing from epoch {e}'s record")
            part = source_changes_once(self.spark, source, rng[0], rng[1], e, columns)
            # Ranges read otherwise (appended files) come with every column.
            if columns is not None:
                part = part.select(*[F.col(f"`{c}`") for c in columns], TIME, DIFF)
            parts.append(part)
        df = parts[0]
        for p in parts[1:]:
            df = df.unionByName(p)
        return df

    def _view_updates(
        self,
        plan: ViewPlan,
        done: int,
        target: int,
        stats=None,
        unchanged: frozenset[str] = frozenset(),
        small: bool = False,
        by_driver: list[str] | None = None,
    ):
        """The view's updates in ``(done, target]``, consolidated per (data, time) unless
        computed from scratch. Joins skip the delta paths of the ``unchanged`` inputs (see
        :meth:`_unchanged_inputs`); ``small``: the inputs' change is (:meth:`small_change`),
        so the state's is too, and the driver computes the inner joins under the view's
        reductions where it can (:meth:`_join_handed_to_spark`; each one marked in
        ``by_driver``).

        From scratch (``done`` = 0) joins are computed from the inputs' snapshots; otherwise
        by delta paths whose lookups read the shared arrangements (refreshed first). From
        scratch, the updates are the view's rows, each ``+1`` at ``target``, equal rows not
        summed: summing them would only merge duplicates, at the price of shuffling the whole
        view (readers sum what they read; see :meth:`_net_change`).
        """
        from ops.consolidate import consolidate
        from ops.join import render_join_delta
        from ops.reduce import render_stateful
        from ops.stateless import render

        for arrangement in self.plan.arrangements_of(plan.name):
            self.refresh_arrangement(arrangement.key)
        stats = stats if stats is not None else {}
        store = self._state_store(plan, done, target, stats, small=small)
        inputs = {
            coll: self._collection_updates(
                coll,
                done,
                target,
                self._columns_read(plan, coll) if coll in plan.source_inputs else None,
            )
            for coll in plan.inputs
        }
        crash_point("ingest")
        delta_join = None
        if plan.joins and (done > 0 or plan.has_state):  # NOT IN keeps state from the build on
            delta_join = partial(
                render_join_delta,
                lookup=partial(self._lookup, stats=stats),
                old=done,
                new=target,
                store=store,
                snapshot=lambda coll, at: self._collection_updates(coll, 0, at),
                unchanged=unchanged,
            )
            if small and plan.has_state and self._driver_computes():
                delta_join = self._join_handed_to_spark(
                    plan, done, target, stats, unchanged, delta_join, by_driver
                )
        stateful = partial(render_stateful, store=store)
        updates = render(plan.root, inputs, delta_join, stateful)
        if done == 0:  # a build: its columns must be Spark's (they become the tables')
            self._check_columns(plan, target, inputs, updates)
        return updates if done == 0 else consolidate(updates, plan.columns)

    def _check_columns(
        self, plan: ViewPlan, epoch: int, inputs: Mapping[str, Any], updates: Any
    ) -> None:
        """Raise unless ``updates`` (a build's) have the columns Spark's analysis of the view's
        SQL gives over the same inputs at ``epoch`` (:func:`ivm.columns.check_columns` says
        what equal means); a table the plan does not read (an input a constant join
        condition never matches, none of whose columns the view shows) is given to Spark as
        no row of its columns at ``epoch``. Analysis only, no job."""
        from pyspark.sql.pandas.types import from_arrow_schema
        from pyspark.sql.types import StructType

        from ivm.columns import analysed_schema, check_columns
        from ivm.sql.lower import referenced_tables
        from ivm.sql.parse import parse_view
        from ops import DIFF, TIME

        frames = dict(inputs)
        for coll in referenced_tables(parse_view(plan.sql, plan.file)) - set(frames):
            if coll in self.sources:
                schema = self.sources[coll].arrow_schema(self._epoch_map()[epoch].ranges[coll][1])
            elif coll in self.plan.views:
                schema = self.table_schema(self.layout.view_table(coll))
            else:
                continue  # not a table: Spark's analysis names it
            lowered = pa.schema([f.with_name(f.name.lower()) for f in schema])
            frames[coll] = self.spark.createDataFrame([], from_arrow_schema(lowered))
        expected = analysed_schema(self.spark, plan.sql, plan.file, frames)
        ours = [f for f in updates.schema.fields if f.name not in (TIME, DIFF)]
        check_columns(plan.name, plan.file, expected, StructType(ours))

    @staticmethod
    def _driver_computes() -> bool:
        """Whether the driver computes small changes (:mod:`ops.local`): with its writes on
        (:data:`ops.sink.DRIVER_WRITE`) and :data:`ops.local.DRIVER_VIEWS`."""
        import ops.local
        import ops.sink

        return ops.sink.DRIVER_WRITE and ops.local.DRIVER_VIEWS

    def _updates_on_driver(
        self,
        plan: ViewPlan,
        done: int,
        target: int,
        stats: dict | None = None,
        unchanged: frozenset[str] = frozenset(),
    ) -> pa.Table | None:
        """A view's updates in ``(done, target]`` computed by the driver in Arrow
        (:mod:`ops.local`, :mod:`ops.local_reduce`), consolidated per (data, time) and laid
        out as its log's rows; None when Spark computes them: the plan has an outer or
        semi-join, a set operation or an aggregate the driver does not compute, an input's
        change or a lookup's rows are not held by the driver, or an expression is not one the
        driver evaluates exactly as Spark (each reason recorded, :meth:`_declined`), or its
        SQL fails on a row (Spark's plan decides whether it evaluates that row:
        :meth:`_driver_failed`). Joins run the delta paths of the inputs
        not ``unchanged`` (:meth:`_unchanged_inputs`), their lookups read by the driver
        (``stats``: per arrangement, as :meth:`_view_updates`).

        The caller has checked that the inputs' change is small (:meth:`small_change`)."""
        from ops import TIME
        from ops.ingest import consolidated_on
        from ops.local import normalized_floats, off_driver, render_local, types_recorded
        from ops.sink import same_columns

        if not self._driver_computes():
            return None
        if (why := off_driver(plan.root)) is not None:
            self._declined(plan.name, f"computed by Spark ({why})")
            return None
        for arrangement in self.plan.arrangements_of(plan.name):
            self.refresh_arrangement(arrangement.key)
        stats = stats if stats is not None else {}
        join = self._driver_join(done, target, stats, unchanged)
        stateful = None
        if plan.has_state:
            from ops.local_reduce import stateful_local

            store = self._state_store(plan, done, target, stats, small=True)
            stateful = partial(stateful_local, store=store)
        try:
            with types_recorded(self.spark, self.layout.root):
                inputs = {
                    coll: self._arrow_updates(coll, done, target, self._input_columns(plan, coll))
                    for coll in plan.inputs
                }
                crash_point("ingest")
                updates = render_local(self.spark, plan.root, inputs, join, stateful)
            updates = normalized_floats(updates)
        except NotOnDriver as why:
            self._declined(plan.name, f"computed by Spark ({why})")
            return None
        except EvaluationError as found:
            self._driver_failed(plan.name, found)
            return None
        summed = consolidated_on(updates, [*plan.columns, TIME])
        log_schema = self.table_schema(self.layout.view_log(plan.name))
        if summed is None or not same_columns(summed.schema, log_schema):
            self._declined(plan.name, "computed by Spark (its updates' types are Spark's)")
            return None
        return summed.cast(log_schema)

    def _declined(self, view: str, reason: str) -> None:
        """The driver handed part of ``view``'s refresh to Spark: said in the progress log and
        recorded on its result (:func:`ops.declines.declined`)."""
        from ops.declines import declined

        declined(reason)
        self.progress(f"{view}: {reason}")

    def _driver_failed(self, view: str, found: EvaluationError) -> None:
        """The driver found the view's SQL failing on a row of its change. Spark's plan may
        not evaluate that row (it pushes filters below projections): Spark computes the
        change, and raises if it fails too (:meth:`_refresh_view_reporting`, which names
        the column the driver found)."""
        self._thread.found = found.located(view=view)
        self._declined(view, f"computed by Spark, which decides whether it fails ({found})")

    def _driver_join(
        self, done: int, target: int, stats: dict, unchanged: frozenset[str]
    ) -> Callable[[Any, Mapping[str, pa.Table]], pa.Table]:
        """How the driver renders an inner join's updates in ``(done, target]`` from its
        inputs' Arrow updates (:func:`ops.local.join_delta_local`), its lookups read by the
        driver; raises NotOnDriver when it cannot."""
        from ops.local import join_delta_local

        def lookup(stage, keys: pa.Table, as_of: int, columns) -> pa.Table:
            rows = self._lookup_arrow(stage, keys, as_of, columns=columns, stats=stats)
            if rows is None:
                raise NotOnDriver(f"{stage.arrangement}'s lookup is Spark's")
            return rows

        return partial(
            join_delta_local, self.spark, lookup=lookup, old=done, new=target, unchanged=unchanged
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
    ) -> Callable:
        """A join renderer for Spark's plan (:func:`ops.stateless.render`) of a small change:
        an inner join's updates computed by the driver (:meth:`_driver_join`) and handed to
        Spark as a local relation, for the reduction above it (each one marked in
        ``by_driver``); ``by_spark`` renders the joins the driver cannot."""
        from pyspark.sql.pandas.types import from_arrow_schema

        from ops.local import on_driver, types_recorded

        local = self._driver_join(done, target, stats, unchanged)

        def render_join(node, deltas):
            if on_driver(node):
                try:
                    with types_recorded(self.spark, self.layout.root):
                        colls = {inp.get.collection for inp in node.inputs}
                        inputs = {
                            c: self._arrow_updates(c, done, target, self._input_columns(plan, c))
                            for c in colls
                        }
                        table = local(node, inputs)
                    if by_driver is not None:
                        by_driver.append("join")
                    return self.spark.createDataFrame(table, schema=from_arrow_schema(table.schema))
                except NotOnDriver as why:
                    self._declined(plan.name, f"a join computed by Spark ({why})")
                except EvaluationError as found:
                    self._driver_failed(plan.name, found)
            return by_spark(node, deltas)

        return render_join

    def _arrow_updates(
        self, coll: str, done: int, target: int, columns: Sequence[str] | None = None
    ) -> pa.Table:
        """A collection's updates in ``(done, target]`` as Arrow ``(columns..., _time,
        _diff)``, from what the driver holds or reads: a source's change feeds summed on
        ``columns`` (and the columns its contract checks), or its appended files' rows, the
        rows breaking its contract left out; a view's diff log read from its files (every
        column, or ``columns``). Raises NotOnDriver when the driver does not hold them."""
        import numpy as np

        from ops import DIFF, TIME
        from ops.ingest import source_change_arrow, view_changes_arrow
        from ops.local import Evaluator
        from resources.lake import spark_compatible

        if coll in self.plan.views:
            log_uri = self.layout.view_log(coll)
            table = view_changes_arrow(log_uri, self.table_schema(log_uri), done, target)
            if table is None:
                raise NotOnDriver(f"view {coll!r}'s change is too large to hold")
            return table if columns is None else table.select([*columns, TIME, DIFF])
        if columns is None:
            raise InvariantViolation(f"source {coll!r}: the columns to read are needed")
        read = list(self._checked_columns(coll, columns))
        epochs = self._epoch_map()
        source = self.sources[coll]
        parts = []
        for e in range(done + 1, target + 1):
            rng = epochs[e].ranges.get(coll) if e in epochs else None
            if rng is None or rng[0] is None:
                raise NotOnDriver(f"source {coll!r} is read whole at epoch {e}")
            if rng[0] == rng[1]:
                continue  # the source kept its version
            net = source_change_arrow(self.spark, source, rng[0], rng[1], e, read)
            if net is None:
                raise NotOnDriver(f"source {coll!r}'s change is not held by the driver")
            times = pa.array(np.full(net.num_rows, e, dtype=np.int64))
            net = spark_compatible(net).select([*read, DIFF])
            parts.append(net.add_column(len(read), TIME, times))
        if parts:
            table = pa.concat_tables(parts)
        else:
            schema = source.arrow_schema(epochs[target].ranges[coll][1])
            fields = {f.name.lower(): f.type for f in schema}
            table = pa.schema(
                [*(pa.field(c, fields[c]) for c in read), (TIME, pa.int64()), (DIFF, pa.int64())]
            ).empty_table()
        contract = self._contract(coll)
        check = None if contract is None else contract.predicate()
        if check is not None and table.num_rows:
            table = table.filter(Evaluator(self.spark, table, [check]).mask(check))
        return table.select([*columns, TIME, DIFF])

    def state_uri(self, view: str, table: str) -> str:
        """Where a view's state table lives: ``state/<view>/<table>``."""
        return f"{self.layout.root}/state/{view}/{table}"

    def _state_store(
        self, plan: ViewPlan, done: int, target: int, stats: dict, *, small: bool = False
    ):
        """The view's state tables as the reduce operators see them (see ops.reduce);
        ``small``: the inputs' change is small, so are the state's (written by the driver
        unless a write's known size says otherwise)."""
        from ops.arrange import (
            DRIVER_SORT_ROWS,
            LookupStats,
            lookup,
            lookup_rows,
            write_held_updates,
            write_updates,
        )
        from ops.buffer import DRIVER_STATE_ROWS
        from ops.reduce import StateStore
        from ops.sink import DRIVER_CHANGE_ROWS, arrow_schema, collect_flat
        from resources.lake import spark_compatible_schema

        def committed(table, by_driver: bool, commit) -> int | None:
            """Commit one epoch of a state table once: ``commit(uri, metadata)``."""
            uri = self.state_uri(plan.name, table.name)
            if self.table_epoch(uri) >= target:
                return None  # written by an earlier attempt at this epoch
            started = time.perf_counter()
            result = commit(uri, {"ivm.state": table.name, "ivm.view": plan.name})
            crash_point("state_committed")
            how = ", written by the driver" if by_driver else ""
            self.progress(
                f"{plan.name}: state {table.name}: {result.rows} rows at epoch {target}{how} "
                f"({time.perf_counter() - started:.2f}s)"
            )
            return result.rows

        def write(table, updates, rows_hint: int | None = None) -> int | None:
            def by_spark(uri: str, metadata: dict[str, str]) -> CommitResult:
                return write_updates(
                    updates,
                    uri,
                    table.key,
                    app_id=self.app_id(uri),
                    epoch=target,
                    metadata=metadata,
                    overwrite=done == 0 and open_table(uri) is not None,
                    rows_hint=rows_hint,
                    small=small and (rows_hint or 0) <= DRIVER_CHANGE_ROWS,
                )

            def by_driver(uri: str, metadata: dict[str, str]) -> CommitResult:
                # A build's state of known, moderate size: collected as Arrow, then sorted
                # and written by the driver as Spark lays it out, without Spark's range
                # partitioning (a sampling pass and a shuffle); by Spark if a type does not
                # carry over.
                rows = collect_flat(updates)
                result = None
                if rows is not None:
                    result = write_held_updates(
                        rows,
                        uri,
                        table.key,
                        arrow_schema(updates),
                        app_id=self.app_id(uri),
                        epoch=target,
                        metadata=metadata,
                        overwrite=open_table(uri) is not None,
                    )
                return result or by_spark(uri, metadata)

            driver = done == 0 and rows_hint is not None and rows_hint <= DRIVER_SORT_ROWS
            return committed(table, driver, by_driver if driver else by_spark)

        def read(table, key, keys, as_of):
            uri = self.state_uri(plan.name, table.name)
            df, st = lookup(
                self.spark,
                uri,
                self.table_schema(uri),
                list(key),
                keys,
                as_of,
                measure=self.measure_lookups,
                null_safe=True,
                raw=True,
            )
            stats.setdefault(f"state {table.name}", LookupStats()).add(st)
            return df

        def read_rows(table, key, keys, as_of):
            uri = self.state_uri(plan.name, table.name)
            schema = spark_compatible_schema(self.table_schema(uri))
            rows, st = lookup_rows(uri, schema, list(key), keys, as_of, DRIVER_STATE_ROWS)
            stats.setdefault(f"state {table.name}", LookupStats()).add(st)
            return rows

        def write_rows(table, rows) -> int | None:
            def commit(uri: str, metadata: dict[str, str]):
                # A build's rows come with the schema Spark's write would give the table.
                schema = (
                    rows.schema if done == 0 else spark_compatible_schema(self.table_schema(uri))
                )
                result = write_held_updates(
                    rows,
                    uri,
                    table.key,
                    schema,
                    app_id=self.app_id(uri),
                    epoch=target,
                    metadata=metadata,
                    overwrite=done == 0 and open_table(uri) is not None,
                )
                if result is None:
                    raise InvariantViolation(
                        f"view {plan.name!r}: state {table.name}: rows of columns "
                        f"{rows.column_names} do not fit the table's {schema}"
                    )
                return result

            return committed(table, True, commit)

        def snapshot(node):
            from ivm.plan.ir import collections
            from ops.stateless import render

            names = {get.collection for get in collections(node)}
            return render(node, {c: self._collection_updates(c, 0, target) for c in names})

        def progress(message: str) -> None:
            self.progress(f"{plan.name}: {message}")

        return StateStore(
            self.spark, done, target, write, read, progress, snapshot, small, read_rows, write_rows
        )

    # -- arrangements ---------------------------------------------------------------------------

    def arrangement_uri(self, key: ArrangementKey) -> str:
        return f"{self.layout.root}/arrangements/{key.name}"

    def collection_epoch(self, coll: str) -> int:
        """The newest epoch whose updates a collection can give: sources, the latest epoch;
        views, what their diff log holds."""
        if coll in self.plan.views:
            return self.table_epoch(self.layout.view_log(coll))
        return self.latest_epoch()

    def refresh_arrangement(self, key: ArrangementKey) -> CommitResult | None:
        """Bring an arrangement up to its collection's epoch; idempotent per epoch.

        A new arrangement, or one whose readers now need other columns, is (re)built from
        the collection's snapshot at ``since`` = the oldest epoch any existing reader still
        reads at (its "old" time), plus the updates after it, so every reader's lookups at
        its old and new times stay exact.
        """
        with self._lock:
            lock = self._arranging.setdefault(key, threading.Lock())
        with lock:  # views refreshed at once share it: one writes, the others find it done
            with self.job_group(f"arrangement {key.name}", f"ivm: arrangement {key.name}"):
                return self._refresh_arrangement(key)

    def _refresh_arrangement(self, key: ArrangementKey) -> CommitResult | None:
        from pyspark.sql import functions as F

        from ops import DIFF, TIME
        from ops.arrange import write_held_updates, write_updates
        from ops.consolidate import consolidate
        from resources.lake import spark_compatible_schema

        aplan = self.plan.arrangements[key]
        uri = self.arrangement_uri(key)
        target = self.collection_epoch(key.collection)
        done = self.table_epoch(uri)
        if target == 0 or done >= target:
            return None
        info = last_commit_metadata(uri, "ivm.columns")
        contract = json.dumps(self._contract_hashes([key.collection]))
        types = json.dumps(
            self._source_types(key.collection, aplan.columns)
            if key.collection in self.sources
            else {},
            sort_keys=True,
        )
        retyped = info is not None and info.get("ivm.types", types) != types
        rebuild = (
            info is None
            or json.loads(info["ivm.columns"]) != list(aplan.columns)
            or info.get("ivm.contract", "{}") != contract
            or retyped
        )
        _ = self.spark  # Column expressions need a live session (the CLI starts it lazily)
        cols = [F.col(f"`{c}`") for c in aplan.columns]
        started = time.perf_counter()
        built = None  # by the driver, from a snapshot's files
        if rebuild:
            readers = [self.table_epoch(self.layout.view_log(v)) for v in aplan.users]
            # Retyped columns: every reader is rebuilt from snapshots (see _input_types), so
            # none reads before ``target``, and older updates would have the old types.
            since = target if retyped else min([r for r in readers if r > 0] + [target])
        else:
            since = int(info["ivm.since"])
        metadata = {
            "ivm.arrangement": key.name,
            "ivm.columns": json.dumps(list(aplan.columns)),
            "ivm.since": str(since),
            "ivm.contract": contract,
            "ivm.types": types,
        }
        in_ranges, updates = False, None
        if rebuild and since == target and key.collection in self.sources:
            built = self._build_by_driver(key, target, metadata, overwrite=done > 0)
        if rebuild and built is None:
            # A snapshot's rows are already updates (d, since, +1): summing equal ones would
            # only merge duplicate rows, at the price of shuffling the whole collection (SF1
            # lineitem: 15.2s -> 8.2s to build). Lookups consolidate what they read.
            ordered = None
            if since == target and key.collection in self.sources:
                ordered = self._snapshot_in_order(key.collection, since, key.key[0])
            in_ranges = ordered is not None
            snapshot = ordered if in_ranges else self._collection_updates(key.collection, 0, since)
            updates = snapshot.select(*cols, TIME, DIFF)
            if since < target:
                changes = self._collection_updates(key.collection, since, target, aplan.columns)
                updates = updates.unionByName(
                    consolidate(changes.select(*cols, TIME, DIFF), aplan.columns)
                )
        held = None if rebuild else self._held_changes(key.collection, done, target, aplan.columns)
        result = (
            built
            if held is None
            else write_held_updates(
                held,
                uri,
                key.key,
                spark_compatible_schema(self.table_schema(uri)),
                app_id=self.app_id(uri),
                epoch=target,
                metadata=metadata,
            )
        )
        by_driver = held is not None and result is not None
        if result is None:
            if updates is None:
                changes = self._collection_updates(key.collection, done, target, aplan.columns)
                updates = consolidate(changes.select(*cols, TIME, DIFF), aplan.columns)
            result = write_updates(
                updates,
                uri,
                key.key,
                app_id=self.app_id(uri),
                epoch=target,
                metadata=metadata,
                overwrite=rebuild and done > 0,
                rows_hint=self._rows_hint(key.collection) if rebuild else None,
                in_ranges=rebuild and in_ranges,
                small=not rebuild and self.small_change([key.collection], done, target),
            )
        crash_point("arrangement_committed")
        how = " from a source in key order, without a shuffle" if in_ranges else ""
        how += " (summed and written by the driver)" if by_driver else ""
        how += " from its source's files, by the driver" if built is not None else ""
        self.progress(
            f"arrangement {key}: {'built' if rebuild else 'appended'} {result.rows} updates "
            f"at epoch {target}{how} ({time.perf_counter() - started:.2f}s)"
        )
        return result

    def _build_by_driver(
        self, key: ArrangementKey, epoch: int, metadata: dict[str, str], overwrite: bool
    ) -> CommitResult | None:
        """Build ``key``'s arrangement from its source's snapshot at ``epoch`` by the driver
        (:func:`ops.arrange.build_by_driver`), or None: a contract to check (Spark evaluates
        it), a partition column among the arrangement's, or what that function declines."""
        from ops import DIFF, TIME
        from ops.arrange import build_by_driver
        from ops.ingest import source_snapshot
        from ops.sink import arrow_schema

        source = self.sources[key.collection]
        columns = self.plan.arrangements[key].columns
        version = self._epoch_map()[epoch].ranges[key.collection][1]
        partitioned = {c.lower() for c in source.partition_columns(version)}
        if self.contract_predicate(key.collection) is not None or partitioned & set(columns):
            return None
        files = source.files(version)
        # The types Spark's read of the snapshot gives (a plan, no job), as its build has.
        snapshot = source_snapshot(self.spark, source, version, epoch, files)
        schema = arrow_schema(snapshot.select(*[f"`{c}`" for c in columns], TIME, DIFF))
        uri = self.arrangement_uri(key)
        return build_by_driver(
            files,
            uri,
            key.key,
            schema,
            app_id=self.app_id(uri),
            epoch=epoch,
            metadata=metadata,
            overwrite=overwrite,
        )

    def _held_changes(
        self, coll: str, done: int, target: int, columns: Sequence[str]
    ) -> pa.Table | None:
        """A collection's updates in ``(done, target]`` summed on ``columns`` (``(columns...,
        _time, _diff)``) when the driver holds them all (:meth:`_arrow_updates`), at most
        :data:`~ops.sink.DRIVER_CHANGE_ROWS`. None otherwise."""
        from ops import TIME
        from ops.ingest import consolidated_on
        from ops.sink import DRIVER_CHANGE_ROWS

        if self.change_rows(coll, done, target) > DRIVER_CHANGE_ROWS:
            return None
        try:
            rows = self._arrow_updates(coll, done, target, columns)
        except NotOnDriver as why:
            from ops.declines import declined

            declined(f"{coll}'s change appended to an arrangement by Spark ({why})")
            return None
        return consolidated_on(rows, [*columns, TIME])

    def _snapshot_in_order(self, source: str, epoch: int, column: str):
        """A large source's snapshot at ``epoch`` read so that each Spark partition holds its
        own range of ``column`` (contract applied), or None: see
        :func:`ops.ingest.source_snapshot_in_order`. Small sources are not worth the footer
        reads: their shuffle is cheap."""
        from ops.arrange import ROWS_PER_FILE
        from ops.ingest import source_snapshot_in_order

        if (self._rows_hint(source) or 0) < ROWS_PER_FILE:
            return None
        version = self._epoch_map()[epoch].ranges[source][1]
        df = source_snapshot_in_order(self.spark, self.sources[source], version, epoch, column)
        valid = self.contract_predicate(source)
        return df if df is None or valid is None else df.where(valid)

    def arrangement_status(self) -> list[dict[str, Any]]:
        """Every arrangement: key, columns, users and its table's size (no Spark).

        The analogue of Materialize's ``mz_arrangement_sizes`` and ``mz_arrangement_sharing``.
        """
        out = []
        for key, aplan in self.plan.arrangements.items():
            uri = self.arrangement_uri(key)
            dt = open_table(uri)
            rows = size = files = 0
            if dt is not None:
                actions = pa.table(dt.get_add_actions(flatten=True))
                files = actions.num_rows
                rows = int(sum(r or 0 for r in actions.column("num_records").to_pylist()))
                size = int(sum(actions.column("size_bytes").to_pylist()))
            info = last_commit_metadata(uri, "ivm.since")
            out.append(
                {
                    "arrangement": str(key),
                    "collection": f"{key.kind} {key.collection}",
                    "key": list(key.key),
                    "columns": list(aplan.columns),
                    "users": list(aplan.users),
                    "epoch": self.table_epoch(uri),
                    "since": int(info["ivm.since"]) if info else None,
                    "rows": rows,
                    "bytes": size,
                    "files": files,
                    "path": uri,
                }
            )
        return out

    def _rows_hint(self, coll: str) -> int | None:
        """Rough row count of a collection (from Delta stats), to size files."""
        uri = self.layout.view_table(coll) if coll in self.plan.views else self.sources[coll].uri
        return sum(f.num_records or 0 for f in table_files(uri)) or None

    def _lookup(
        self, stage, keys, as_of: int, *, stats: dict, columns: Iterable[str] | None = None
    ):
        """Read an arrangement's state at ``as_of`` for the keys in ``keys`` (see ops.arrange),
        only ``columns`` (and the key) when given."""
        from ops.arrange import LookupStats, lookup

        uri = self.arrangement_uri(stage.arrangement)
        self._check_since(uri, stage.arrangement, as_of)
        df, st = lookup(
            self.spark,
            uri,
            self.table_schema(uri),
            stage.arrangement.key,
            keys,
            as_of,
            measure=self.measure_lookups,
            columns=columns,
        )
        stats.setdefault(str(stage.arrangement), LookupStats()).add(st)
        return df

    def _lookup_arrow(
        self, stage, keys: pa.Table, as_of: int, *, stats: dict, columns: Iterable[str]
    ) -> pa.Table | None:
        """:meth:`_lookup` answered by the driver in Arrow (:func:`ops.arrange.lookup_arrow`),
        or None when Spark should read it."""
        from ops.arrange import LookupStats, lookup_arrow

        uri = self.arrangement_uri(stage.arrangement)
        self._check_since(uri, stage.arrangement, as_of)
        return lookup_arrow(
            uri,
            self.table_schema(uri),
            stage.arrangement.key,
            keys,
            as_of,
            columns=set(columns),
            stats=stats.setdefault(str(stage.arrangement), LookupStats()),
        )

    def _check_since(self, uri: str, arrangement: ArrangementKey, as_of: int) -> None:
        info = last_commit_metadata(uri, "ivm.since")
        since = int(info["ivm.since"]) if info else 0
        if as_of < since:
            raise InvariantViolation(
                f"arrangement {arrangement} holds updates since epoch {since}; a lookup "
                f"at epoch {as_of} cannot be answered"
            )

    def _net_change(self, plan: ViewPlan, table_done: int, target: int, log_start: int):
        """The net change ``(columns..., _diff)`` the readable table needs, from the log, and
        the log files read (with their ``_time`` and ``_diff`` statistics).

        The log's updates are summed per data unless they need not be: positive diffs only
        (each row is then written ``_diff`` times, whether or not equal rows were summed), or
        one incremental epoch's updates (consolidated when written; ``log_start``, the epoch
        the log starts at, holds a computation from scratch, whose equal rows are not summed).
        """
        from ops import DIFF, TIME
        from ops.consolidate import consolidate
        from ops.ingest import insertions_only, single_time, view_changes

        log_uri = self.layout.view_log(plan.name)
        df, files = view_changes(
            self.spark, log_uri, self.table_schema(log_uri), table_done, target
        )
        if insertions_only(files) or (single_time(files) and files[0].mins[TIME] > log_start):
            return df.select(*[f"`{c}`" for c in plan.columns], DIFF), files
        return consolidate(df, plan.columns, by_time=False), files

    def table_schema(self, uri: str) -> pa.Schema:
        dt = open_table(uri)
        if dt is None:
            raise InvariantViolation(f"{uri}: expected table is missing")
        return pa.schema(dt.schema().to_arrow())

    # -- verification ---------------------------------------------------------------------------

    def from_scratch(self, name: str, epoch: int):
        """The view's SQL evaluated by Spark from scratch over its inputs at ``epoch`` (sources
        at that epoch's versions, upstream views' contents at that epoch): no state, no updates.
        """
        from pyspark.sql import functions as F

        from ivm.columns import spark_query
        from ivm.sql.lower import referenced_tables
        from ivm.sql.parse import parse_view
        from ops import DIFF, TIME

        plan = self.view(name)
        # Every table the SQL names: the plan may not read one (a constant join condition).
        named = referenced_tables(parse_view(plan.sql, plan.file))
        known = set(self.plan.views) | set(self.sources)
        for coll in dict.fromkeys([*plan.inputs, *sorted(named & known)]):
            df = self._collection_updates(coll, 0, epoch)
            rows = df.where(F.col(DIFF) > 0).withColumn(
                "_copy", F.explode(F.sequence(F.lit(1), F.col(DIFF).cast("int")))
            )
            rows.drop(TIME, DIFF, "_copy").createOrReplaceTempView(coll)
        return spark_query(self.spark, plan.sql, plan.file)  # the SQL as written, for Spark

    def verify(self, name: str, *, examples: int = 3) -> VerifyResult:
        """Compare a view with :meth:`from_scratch` at its epoch: its diff log (what
        downstream views consume) summed up to that epoch, and its readable table; also
        count negative multiplicities in the log. Columns are compared exactly but for
        floating-point ones, equal within the oracle's stated tolerance (:mod:`ivm.oracle`;
        the result lists it). A table behind its log (a refresh stopped between the two
        commits) is reported."""
        with self.job_group(f"verify {name}", f"ivm: verify view {name}"):
            return self._verify(name, examples)

    def _verify(self, name: str, examples: int) -> VerifyResult:
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        from ops import DIFF
        from ops.ingest import read_files, view_changes
        from resources.lake import table_files

        started = time.perf_counter()
        plan = self.view(name)
        table_uri, log_uri = self.layout.view_table(name), self.layout.view_log(name)
        epoch = self.table_epoch(log_uri)
        table_epoch = self.table_epoch(table_uri)
        result = VerifyResult(name, epoch)
        if epoch == 0:
            raise IvmError(f"view {name!r} has not been materialized yet: nothing to verify")

        def named(df):
            cols = zip(df.schema.fields, plan.columns, strict=True)
            return df.select(*[F.col(f"`{f.name}`").alias(c) for f, c in cols])

        log, _ = view_changes(self.spark, log_uri, self.table_schema(log_uri), -1, epoch)
        summed = log.groupBy(*[F.col(f"`{c}`") for c in plan.columns]).agg(F.sum(DIFF).alias(DIFF))
        result.negative = summed.where(F.col(DIFF) < 0).count()
        log_rows = (
            summed.where(F.col(DIFF) > 0)
            .withColumn("_copy", F.explode(F.sequence(F.lit(1), F.col(DIFF).cast("int"))))
            .select(*[F.col(f"`{c}`") for c in plan.columns])
        )
        expected = named(self.from_scratch(name, epoch))
        actual = named(log_rows)
        if table_epoch == epoch:  # the table must hold exactly the log's rows
            table = named(
                read_files(self.spark, table_files(table_uri), self.table_schema(table_uri))
            )
            actual = actual.unionByName(table.exceptAll(actual)).exceptAll(actual.exceptAll(table))
        else:
            result.examples.append(f"table at epoch {table_epoch} is behind its log: refresh")
            result.extra += 1
        # Each side is computed once (the from-scratch one can be a large job), then compared.
        expected, actual = expected.persist(), actual.persist()
        floating = (T.DoubleType, T.FloatType)
        try:
            result.expected_rows, result.actual_rows = expected.count(), actual.count()
            if any(isinstance(f.dataType, floating) for f in expected.schema.fields):
                self._verify_tolerant(result, expected, actual, examples)
            else:  # every column exact: Spark's EXCEPT ALL, both ways
                missing = expected.exceptAll(actual).persist()
                extra = actual.exceptAll(expected).persist()
                result.missing, result.extra = missing.count(), result.extra + extra.count()
                for label, df in (("missing", missing), ("extra", extra)):
                    for row in df.limit(examples).collect():
                        result.examples.append(f"{label} {tuple(row)}")
                    df.unpersist()
        finally:
            expected.unpersist()
            actual.unpersist()
        result.seconds = time.perf_counter() - started
        self.progress(result.describe())
        return result

    def _verify_tolerant(self, result: VerifyResult, expected, actual, examples: int) -> None:
        """``expected`` (from scratch) against ``actual`` (the view's rows), both persisted
        DataFrames with a floating-point column, compared in Spark under the oracle's rules
        (:func:`ivm.oracle.tolerant_differences`): counts into ``result``, with examples and
        the rule of each column not compared exactly."""
        from pyspark.sql.pandas.types import to_arrow_schema

        from ivm.oracle import SparkBackend, column_rules, tolerant_differences

        rules = column_rules(to_arrow_schema(expected.schema), to_arrow_schema(actual.schema))
        backend = SparkBackend(self.spark)
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
        self._repairing = {name}
        try:  # every view moves to the new epoch: upstream ones so this one can reach it
            self.refresh(rebuild=[name])
        finally:
            self._repairing = set()
        result = self.verify(name)
        result.repaired = True
        return result

    # -- maintenance ---------------------------------------------------------------------------

    def lake_tables(self) -> list[str]:
        """Every Delta table the engine writes: views, logs, arrangements, state, epochs,
        quarantines."""
        out = [self.layout.epochs]
        for name in self.plan.order:
            out += [self.layout.view_log(name), self.layout.view_table(name)]
            out += [self.state_uri(name, t.name) for t in state_tables(self.plan.views[name].root)]
        out += [self.arrangement_uri(k) for k in self.plan.arrangements]
        out += [self.quarantine_uri(s) for s in self.project.contracts]
        return [u for u in out if open_table(u) is not None]

    def vacuum(self, retention_hours: float = 168.0) -> dict[str, int]:
        """Delete files no table version within ``retention_hours`` references: files of
        commits that never happened (a crash between writing and committing) and files
        replaced by rebuilds. Readers of older versions need those versions' files, hence
        the retention (default 7 days). Returns files deleted per table."""
        out = {}
        for uri in self.lake_tables():
            dt = open_for_write(uri)
            deleted = dt.vacuum(
                retention_hours=int(retention_hours),
                enforce_retention_duration=False,
                dry_run=False,
                full=True,  # also files no version ever referenced (never committed)
            )
            if deleted:
                out[self.app_id(uri)] = len(deleted)
                self.progress(f"vacuum {self.app_id(uri)}: {len(deleted)} files deleted")
        return out

    # -- reporting ----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Consumed source versions, latest epoch, and each view's epoch (no Spark)."""
        epochs = self.epochs()
        last = epochs[-1] if epochs else None
        sources = {}
        for name, uri in self.project.sources.items():
            consumed = last.ranges.get(name, (None, None))[1] if last else None
            try:
                current: int | None = SourceTable(name, uri).version()
            except SourceError:
                current = None
            sources[name] = {"path": uri, "consumed_version": consumed, "current_version": current}
        views = {}
        for name in self.plan.order:
            st = self.view_status(name)
            views[name] = {"epoch": st.table_epoch, "log_epoch": st.log_epoch, "rows": st.rows}
        for name, error in sorted(self.plan.broken.items()):
            views[name] = {"epoch": None, "log_epoch": None, "rows": None, "error": str(error)}
        return {
            "lake": self.layout.root,
            "epoch": last.epoch if last else 0,
            "minted_at": last.minted_at.isoformat() if last else None,
            "sources": sources,
            "views": views,
        }


def _at_most(counts: Iterable[int | None]) -> int | None:
    """The sum of row counts, or None when one is unknown (so no bound)."""
    total = 0
    for n in counts:
        if n is None:
            return None
        total += n
    return total
