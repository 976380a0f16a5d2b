"""The catalog: a project's sources, contracts and plan, and what the lake records about its
tables (epochs, each table's epoch, schema and size). No Spark, no writes.

Contract in ``(data, time, diff)`` terms: a table's *epoch* is the version of the transaction
``txn(app_id = table path, version = epoch)`` it last committed; the table holds the sum of
its updates up to that epoch. Epoch ``e`` maps each source to the version range
``(lower, upper]`` whose changes carry time ``e``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import cached_property

import pyarrow as pa

from ivm.config import Project, load_project
from ivm.errors import (
    ConfigError,
    InvariantViolation,
    IvmError,
    SourceError,
    SqlError,
    ViewNotFoundError,
)
from ivm.plan.ir import referenced_columns
from ivm.plan.join import ArrangementKey
from ivm.plan.planner import ProjectPlan, ViewPlan, plan_views
from ivm.sql.parse import parse_view_file
from resources.contracts import Contract, load_contract
from resources.lake import (
    EpochRecord,
    LakeLayout,
    SourceTable,
    open_table,
    read_epochs,
    table_files,
)

log = logging.getLogger("ivm")

Progress = Callable[[str], None]


class Catalog:
    """A project's sources, contracts, plan and lake layout (see the module)."""

    def __init__(self, project: Project | str, progress: Progress | None = None) -> None:
        self.project = project if isinstance(project, Project) else load_project(project)
        self.layout = LakeLayout(self.project.lake)
        self.progress: Progress = progress or (lambda msg: log.info(msg))
        self._contracts: dict[str, Contract] = {}

    # -- sources and contracts ----------------------------------------------------------------

    @cached_property
    def _opened_sources(self) -> tuple[dict[str, SourceTable], dict[str, IvmError]]:
        good: dict[str, SourceTable] = {}
        bad: dict[str, IvmError] = {}
        for name, uri in self.project.sources.items():
            try:
                source = SourceTable(name, uri)
                schema = source.check()
                contract = self.contract(name)
                if contract is not None:
                    contract.check_schema(schema)
                good[name] = source
            except (SourceError, ConfigError) as e:
                bad[name] = e
        return good, bad

    @property
    def sources(self) -> dict[str, SourceTable]:
        """The sources that can be opened (see :attr:`broken_sources` for the others)."""
        return self._opened_sources[0]

    @property
    def broken_sources(self) -> dict[str, IvmError]:
        """Sources that cannot be opened (missing, corrupt log, unreadable), with why."""
        return self._opened_sources[1]

    def contract(self, source: str) -> Contract | None:
        """The pandera schema declared for ``source`` in ``[contracts]``, or None."""
        ref = self.project.contracts.get(source)
        if ref is None:
            return None
        if source not in self._contracts:
            self._contracts[source] = load_contract(self.project.root, source, ref)
        return self._contracts[source]

    def contract_predicate(self, source: str, dialect: str = "spark") -> str | None:
        """The SQL predicate a source's valid rows satisfy (None: no contract or no row check)."""
        contract = self.contract(source)
        return None if contract is None else contract.predicate_sql(dialect)

    def checked_columns(self, source: str, columns: Sequence[str]) -> tuple[str, ...]:
        """``columns`` of a source and those its contract's row check reads."""
        out = set(columns)
        contract = self.contract(source)
        check = None if contract is None else contract.predicate()
        if check is not None:
            out |= {c.lower() for c in referenced_columns(check)}
        return tuple(sorted(out))

    def columns_read(self, plan: ViewPlan, source: str) -> tuple[str, ...]:
        """The source's columns a view reads (after demand analysis), and those its contract's
        row check reads: an update that keeps them all keeps what the view sees."""
        return self.checked_columns(
            source, [c for g in plan.gets if g.collection == source for c in g.columns]
        )

    def input_columns(self, plan: ViewPlan, coll: str) -> tuple[str, ...] | None:
        """The columns a view reads of an input: a source's (:meth:`columns_read`); a view's
        updates come with every column (None)."""
        return self.columns_read(plan, coll) if coll in plan.source_inputs else None

    # -- the plan -----------------------------------------------------------------------------

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
            parsed, columns, append_only, broken=broken, broken_sources=self.broken_sources
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

    # -- the lake's tables --------------------------------------------------------------------

    def app_id(self, uri: str) -> str:
        return LakeLayout.app_id(uri, self.layout.root)

    def arrangement_uri(self, key: ArrangementKey) -> str:
        return f"{self.layout.root}/arrangements/{key.name}"

    def state_uri(self, view: str, table: str) -> str:
        """Where a view's state table lives: ``state/<view>/<table>``."""
        return f"{self.layout.root}/state/{view}/{table}"

    def quarantine_uri(self, source: str) -> str:
        """Where a source's rows that break its contract are kept: ``quarantine/<source>``."""
        return f"{self.layout.root}/quarantine/{source}"

    def epochs(self) -> list[EpochRecord]:
        return read_epochs(self.layout)

    def epoch_map(self) -> dict[int, EpochRecord]:
        return {e.epoch: e for e in self.epochs()}

    def latest_epoch(self) -> int:
        epochs = self.epochs()
        return epochs[-1].epoch if epochs else 0

    def table_epoch(self, uri: str) -> int:
        dt = open_table(uri)
        if dt is None:
            return 0
        return dt.transaction_version(self.app_id(uri)) or 0

    def table_schema(self, uri: str) -> pa.Schema:
        dt = open_table(uri)
        if dt is None:
            raise InvariantViolation(f"{uri}: expected table is missing")
        return pa.schema(dt.schema().to_arrow())

    def rows_hint(self, coll: str) -> int | None:
        """Rough row count of a collection (from Delta stats), to size files."""
        uri = self.layout.view_table(coll) if coll in self.plan.views else self.sources[coll].uri
        return sum(f.num_records or 0 for f in table_files(uri)) or None

    def collection_epoch(self, coll: str) -> int:
        """The newest epoch whose updates a collection can give: sources, the latest epoch;
        views, what their diff log holds."""
        if coll in self.plan.views:
            return self.table_epoch(self.layout.view_log(coll))
        return self.latest_epoch()
