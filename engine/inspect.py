"""A project's lake read without Spark: its plan and EXPLAIN, its tables' epochs, each view's
status and rows, arrangements' sizes, vacuum. The read-only ``ivm`` commands (``show``,
``explain``, ``status``, ``arrangements``) run on it and never import PySpark;
:class:`engine.facade.Engine` adds the Spark side.

Contract in ``(data, time, diff)`` terms: nothing here writes a view, log, arrangement or
state; vacuum deletes only files no version within its retention references.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from engine.catalog import Catalog, Progress
from engine.definitions import Definitions
from engine.maintenance import Maintenance
from engine.results import ConsistencyResult, ViewStatus
from ivm import policy as policies
from ivm.config import Project
from ivm.errors import IvmError
from ivm.plan.explain import explain
from ivm.plan.join import ArrangementKey
from ivm.plan.planner import ProjectPlan, ViewPlan
from ivm.policy import Policy
from resources.filecache import DEFAULT_BUDGET_MB, FILES
from resources.lake import EpochRecord, LakeLayout, SourceTable


class Inspector:
    """A project's lake, read without Spark (see the module).

    Args:
        project: the loaded project (or a path to its ``ivm.toml``).
        progress: called with a one-line message as work proceeds.
        policy: the execution policy to put in force (default: the project's ``[policy]``
            when it has one, else the process's, :func:`ivm.policy.current`).
    """

    def __init__(
        self,
        project: Project | str,
        progress: Progress | None = None,
        *,
        policy: Policy | None = None,
    ) -> None:
        self.catalog = Catalog(project, progress)
        self.project: Project = self.catalog.project
        self.layout: LakeLayout = self.catalog.layout
        # One cache per process, its budget set by the first project opened (a warning else).
        mb = DEFAULT_BUDGET_MB if self.project.cache_mb is None else self.project.cache_mb
        FILES.configure(mb * 1024 * 1024, str(self.project.config_file))
        chosen = policy or self.project.policy
        if chosen is not None:
            policies.install(chosen)
        self.definitions = Definitions(self.catalog)
        self.maintenance = Maintenance(self.catalog)

    # -- planning -----------------------------------------------------------------------------

    @property
    def progress(self) -> Progress:
        """Called with a one-line message as work proceeds (may be replaced)."""
        return self.catalog.progress

    @progress.setter
    def progress(self, progress: Progress) -> None:
        self.catalog.progress = progress

    @property
    def sources(self) -> dict[str, SourceTable]:
        return self.catalog.sources

    @property
    def broken_sources(self) -> dict[str, IvmError]:
        return self.catalog.broken_sources

    @property
    def plan(self) -> ProjectPlan:
        return self.catalog.plan

    def view(self, name: str) -> ViewPlan:
        return self.catalog.view(name)

    def explain(self, name: str) -> str:
        """The view's EXPLAIN text, with where its refreshes run under the policy in force;
        then that of each internal view it reads."""
        names = (self.view(name).name, *self.plan.internal_inputs(self.view(name).name))
        return "\n".join(explain(self.view(n), self.plan, policies.current()) for n in names)

    def contract_predicate(self, source: str, dialect: str = "spark") -> str | None:
        return self.catalog.contract_predicate(source, dialect)

    def rebuild_reason(self, name: str) -> str | None:
        return self.definitions.rebuild_reason(name)

    # -- the lake -----------------------------------------------------------------------------

    def app_id(self, uri: str) -> str:
        return self.catalog.app_id(uri)

    def epochs(self) -> list[EpochRecord]:
        return self.catalog.epochs()

    def latest_epoch(self) -> int:
        return self.catalog.latest_epoch()

    def table_epoch(self, uri: str) -> int:
        return self.catalog.table_epoch(uri)

    def table_schema(self, uri: str) -> pa.Schema:
        return self.catalog.table_schema(uri)

    def arrangement_uri(self, key: ArrangementKey) -> str:
        return self.catalog.arrangement_uri(key)

    def state_uri(self, view: str, table: str) -> str:
        return self.catalog.state_uri(view, table)

    def quarantine_uri(self, source: str) -> str:
        return self.catalog.quarantine_uri(source)

    def view_status(self, name: str) -> ViewStatus:
        return self.maintenance.view_status(name)

    def read_view(self, name: str) -> pa.Table:
        return self.maintenance.read_view(name)

    def consistency(self, name: str) -> ConsistencyResult:
        """The view's cheap consistency check: no Spark, no SQL evaluated (see
        :meth:`engine.maintenance.Maintenance.consistency`)."""
        return self.maintenance.consistency(name)

    def status(self) -> dict[str, Any]:
        return self.maintenance.status()

    def arrangement_status(self) -> list[dict[str, Any]]:
        return self.maintenance.arrangement_status()

    def lake_tables(self) -> list[str]:
        return self.maintenance.lake_tables()

    def vacuum(self, retention_hours: float = 168.0) -> dict[str, int]:
        return self.maintenance.vacuum(retention_hours)

    def release_spark(self) -> None:
        """Nothing to release: no Spark here."""
