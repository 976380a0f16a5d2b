"""The engine: one object per project over the modules that do the work. No Dagster here.

:class:`Engine` extends :class:`~engine.inspect.Inspector` (the catalog, definitions and
maintenance: no Spark) with the Spark session, epochs, inputs, shared arrangements, a view's
computation and refresh, the scheduler of a whole refresh, quarantine and verification, and
forwards the operations the CLI, the Dagster assets, the benchmarks and the tests call.

Contract in ``(data, time, diff)`` terms: after ``refresh_view(v)`` returns with epoch ``e``,
the log of ``v`` holds updates whose sum up to ``e`` equals the view's SQL evaluated over the
sources at the versions of epoch ``e``, and the readable table holds exactly those rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

from pyspark.sql import DataFrame, SparkSession

from engine.arrangements import Arrangements
from engine.catalog import Progress
from engine.compute import Compute
from engine.epochs import Epochs
from engine.inputs import Inputs
from engine.inspect import Inspector
from engine.quarantine import Quarantine
from engine.refresh import ViewRefresh
from engine.results import QuarantineResult, RefreshReport, VerifyResult, ViewResult
from engine.schedule import Scheduler
from engine.session import Session
from engine.verify import Verifier
from ivm.config import Project
from ivm.plan.join import ArrangementKey
from ivm.plan.planner import ViewPlan
from ivm.policy import Policy
from resources.lake import CommitResult, EpochRecord
from resources.spark import JobGroup


class Engine(Inspector):
    """A project's engine: the :class:`~engine.inspect.Inspector`'s reads, and refreshing,
    verifying and repairing views on Spark.

    Args:
        project: the loaded project (or a path to its ``ivm.toml``).
        spark: the Spark session to compute with, or a factory called on first need (a
            Dagster resource's session, started only if some step needs Spark); the
            project's own session, created on first need, if None.
        progress: called with a one-line message as work proceeds.
        measure_lookups: record the rows Spark's scans actually read in each arrangement
            lookup (an extra pass per lookup: for benchmarks and notes).
        policy: the execution policy to put in force (default: the project's ``[policy]``
            when it has one, else the process's, :func:`ivm.policy.current`).
    """

    def __init__(
        self,
        project: Project | str,
        spark: SparkSession | Callable[[], SparkSession] | None = None,
        progress: Progress | None = None,
        *,
        measure_lookups: bool = False,
        policy: Policy | None = None,
    ) -> None:
        super().__init__(project, progress, policy=policy)
        self.session = Session(self.catalog, spark)
        self.epoch_log = Epochs(self.catalog, self.session)
        self.inputs = Inputs(self.catalog, self.session, self.epoch_log)
        self.arrangements = Arrangements(
            self.catalog,
            self.session,
            self.epoch_log,
            self.inputs,
            self.definitions,
            measure_lookups=measure_lookups,
        )
        self.compute = Compute(
            self.catalog,
            self.session,
            self.inputs,
            self.arrangements,
            self.definitions,
            measure_lookups=measure_lookups,
        )
        self.views = ViewRefresh(
            self.catalog, self.session, self.epoch_log, self.definitions, self.compute
        )
        self.quarantines = Quarantine(self.catalog, self.epoch_log, self.inputs, self.definitions)
        self.scheduler = Scheduler(
            self.catalog,
            self.session,
            self.epoch_log,
            self.definitions,
            self.quarantines,
            self.views,
        )
        self.verifier = Verifier(self.catalog, self.session, self.inputs, self.scheduler)

    # -- epochs -----------------------------------------------------------------------------

    def source_versions(self) -> dict[str, int]:
        return self.epoch_log.source_versions()

    def pending_changes(self, *, allow_reset: bool = False) -> dict[str, tuple[int | None, int]]:
        return self.epoch_log.pending_changes(allow_reset=allow_reset)

    def mint_epoch(self, *, force: bool = False) -> EpochRecord | None:
        return self.epoch_log.mint(force=force)

    def target_epoch(self, view: ViewPlan) -> int:
        return self.epoch_log.target(view)

    def input_change(self, plan: ViewPlan, done: int, target: int) -> tuple[int, int]:
        return self.epoch_log.input_change(plan, done, target)

    def epoch_for_rebuild(self, name: str) -> EpochRecord | None:
        """Mint an epoch (even with no source change) when the view already holds the latest
        one, so that a rebuild asked for now has an epoch to write at; None if not needed."""
        log_uri = self.layout.view_log(self.view(name).name)
        if self.table_epoch(log_uri) < self.latest_epoch():
            return None
        return self.mint_epoch(force=True)

    # -- Spark --------------------------------------------------------------------------------

    @property
    def spark(self) -> SparkSession:
        return self.session.spark

    def vacuum(self, retention_hours: float = 168.0) -> dict[str, int]:
        """:meth:`Inspector.vacuum`, with Delta's own VACUUM for tables with deletion vectors
        (its Spark jobs in one job group)."""
        spark = self.spark
        with self.job_group("vacuum", "ivm: vacuum the lake's tables"):
            return self.maintenance.vacuum(retention_hours, spark)

    def release_spark(self) -> None:
        """Release a Spark Connect session on its server now (nothing for a classic session,
        whose JVM ends with this process)."""
        self.session.release()

    def job_group(self, name: str, description: str) -> AbstractContextManager[JobGroup | None]:
        return self.session.job_group(name, description)

    # -- refreshing ---------------------------------------------------------------------------

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
        return self.scheduler.refresh(views, mint=mint, rebuild=rebuild)

    def refresh_view(self, name: str, *, rebuild: bool = False) -> ViewResult:
        """Bring one view to its target epoch (see :class:`engine.refresh.ViewRefresh`)."""
        return self.views.refresh_view(name, rebuild=rebuild)

    def refresh_arrangement(self, key: ArrangementKey) -> CommitResult | None:
        return self.arrangements.refresh(key)

    def quarantine(self) -> list[QuarantineResult]:
        return self.quarantines.run()

    # -- verification -------------------------------------------------------------------------

    def from_scratch(self, name: str, epoch: int) -> DataFrame:
        return self.verifier.from_scratch(name, epoch)

    def verify(self, name: str, *, examples: int = 3) -> VerifyResult:
        return self.verifier.verify(name, examples=examples)

    def repair(self, name: str) -> VerifyResult:
        return self.verifier.repair(name)
