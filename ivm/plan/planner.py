"""The planner: a project's view files -> one plan per view, in dependency order.

Owns the decisions that hold across views: which names are sources and which are views, the
order views refresh in (upstream first), cycles, and each view's maintenance kind. It needs
only the sources' column names, so planning, ``explain`` and the goldens run without Spark.

Contract in ``(data, time, diff)`` terms: for every view, ``plan.root`` maps the updates of its
inputs at epoch ``e`` to the updates of the view at ``e``; refreshing views in ``order`` means
each view reads inputs that already hold epoch ``e``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from graphlib import CycleError, TopologicalSorter

from ivm.errors import ConfigError, IvmError, SourceError, SqlError, UpstreamBroken
from ivm.plan.ir import Get, Join, Node, SemiJoin, collections, walk
from ivm.plan.join import ArrangementKey, DeltaPath, arrangement_needs, plan_paths
from ivm.plan.reduce import mark_monotonic, state_tables
from ivm.sql.lower import CatalogEntry, InternalView, lower_view, referenced_tables
from ivm.sql.parse import ParsedView


@dataclass(frozen=True, slots=True)
class ViewPlan:
    """The plan of one view.

    Attributes:
        name: the view's name.
        file: its ``.sql`` file.
        sql: the file's text.
        sql_hash: hash of the normalized query (the asset's code version).
        root: the plan tree.
        maintenance: how it is kept up to date; ``"incremental"`` for every view this release
            accepts (a construct that could not be maintained is rejected by name instead).
    """

    name: str
    file: str
    sql: str
    sql_hash: str
    root: Node
    maintenance: str = "incremental"
    owner: str | None = None
    """For an internal view (a join input the planner made a view of its own): the view
    whose SQL it comes from; None for a view of the project."""
    label: str = ""
    """For an internal view: what it is in its owner's SQL (``subquery t``, ``CTE c``)."""

    @property
    def columns(self) -> tuple[str, ...]:
        return self.root.columns

    @property
    def joins(self) -> list[Join]:
        """Joins, and semi-joins as the two-input joins whose arrangements they read."""
        out = []
        for n in walk(self.root):
            if isinstance(n, Join):
                out.append(n)
            elif isinstance(n, SemiJoin):
                out.append(n.as_join)
        return out

    @property
    def has_state(self) -> bool:
        """Whether the view keeps state tables of its own (reductions, NOT IN)."""
        return bool(state_tables(self.root))

    def paths(self, join: Join) -> tuple[DeltaPath, ...]:
        return plan_paths(join, self.name)

    @property
    def gets(self) -> list[Get]:
        return collections(self.root)

    @property
    def inputs(self) -> tuple[str, ...]:
        """Distinct collections read, in first-use order."""
        return tuple(dict.fromkeys(g.collection for g in self.gets))

    @property
    def source_inputs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(g.collection for g in self.gets if g.kind == "source"))

    @property
    def view_inputs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(g.collection for g in self.gets if g.kind == "view"))


@dataclass(frozen=True, slots=True)
class ArrangementPlan:
    """One shared arrangement: a collection by a key, with the columns its readers need.

    Attributes:
        key: which collection, by which columns.
        columns: the collection columns stored: the key first, then every column some
            reader needs (demand analysis across all views that share it).
        users: the views that read it, in refresh order.
    """

    key: ArrangementKey
    columns: tuple[str, ...]
    users: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ProjectPlan:
    """Plans of all views, upstream first, the arrangements they share, the sources' columns."""

    views: Mapping[str, ViewPlan]
    sources: Mapping[str, tuple[str, ...]]
    arrangements: Mapping[ArrangementKey, ArrangementPlan] = field(default_factory=dict)
    broken: Mapping[str, IvmError] = field(default_factory=dict)
    """Views that cannot be planned, with why: their own SQL is invalid, or they read a
    source that cannot be opened or a view that is broken (:class:`UpstreamBroken`). The
    others plan, and refresh, without them."""

    def arrangements_of(self, view: str) -> list[ArrangementPlan]:
        return [a for a in self.arrangements.values() if view in a.users]

    def check(self) -> ProjectPlan:
        """The plan itself when every view planned.

        Raises:
            IvmError: the error of the first broken view (by name), a view's own error
                before one that only waits for a broken upstream.
        """
        for name in sorted(
            self.broken, key=lambda n: (isinstance(self.broken[n], UpstreamBroken), n)
        ):
            raise self.broken[name]
        return self

    @property
    def order(self) -> tuple[str, ...]:
        return tuple(self.views)

    @property
    def project_views(self) -> tuple[str, ...]:
        """The views of the project's files (internal views left out), upstream first."""
        return tuple(n for n, v in self.views.items() if v.owner is None)

    def internal_inputs(self, name: str) -> tuple[str, ...]:
        """The internal views ``name`` reads, directly or through other internal views,
        upstream first: refreshing ``name`` refreshes them first."""
        found: set[str] = set()
        pending = [name]
        while pending:
            for v in self.views[pending.pop()].view_inputs:
                if self.views[v].owner is not None and v not in found:
                    found.add(v)
                    pending.append(v)
        return tuple(n for n in self.views if n in found)

    def project_inputs(self, name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The sources and project views ``name`` reads, through internal views: its inputs
        as its SQL names them."""
        reads = [name, *self.internal_inputs(name)]
        sources = dict.fromkeys(s for n in reads for s in self.views[n].source_inputs)
        views = dict.fromkeys(
            v for n in reads for v in self.views[n].view_inputs if self.views[v].owner is None
        )
        return tuple(sources), tuple(views)


def plan_views(
    parsed: Sequence[ParsedView],
    source_columns: Mapping[str, Sequence[str]],
    append_only: Collection[str] = (),
    *,
    broken: Mapping[str, IvmError] | None = None,
    broken_sources: Mapping[str, IvmError] | None = None,
) -> ProjectPlan:
    """Plan every view of a project; a view that cannot be planned is set aside, not fatal.

    Args:
        parsed: the parsed view files.
        source_columns: source name -> its column names.
        append_only: sources that only ever grow (``delta.appendOnly``): MIN/MAX and TopK
            over them need no tower.
        broken: views already known to be broken (files that do not parse), by name.
        broken_sources: sources that cannot be opened, with the error.

    Returns:
        The plan; views whose SQL is invalid or unsupported, or that read a broken source or
        view, are in ``broken`` (with the error naming file, position and construct).

    Raises:
        ConfigError: two views share a name, or a view has a source's name.
        SqlError: views form a cycle.
    """
    failed: dict[str, IvmError] = dict(broken or {})
    bad_sources = dict(broken_sources or {})
    by_name = _by_name(parsed, {*source_columns, *bad_sources})
    graph = {name: referenced_tables(p) & set(by_name) for name, p in by_name.items()}
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as e:
        cycle = " -> ".join(e.args[1])
        raise SqlError(f"views depend on each other in a cycle: {cycle}") from e
    catalog: dict[str, CatalogEntry] = {
        name: ("source", tuple(c.lower() for c in cols)) for name, cols in source_columns.items()
    }
    plans: dict[str, ViewPlan] = {}
    internal: dict[str, InternalView] = {}
    for name in order:
        p = by_name[name]
        reads = referenced_tables(p)
        bad_view = next((v for v in sorted(reads) if v in failed), None)
        bad_source = next((s for s in sorted(reads) if s in bad_sources), None)
        if bad_view is not None:
            failed[name] = UpstreamBroken(
                f"{p.file}: view {name!r} waits for view {bad_view!r}, which is broken"
            )
            continue
        if bad_source is not None:
            failed[name] = SourceError(
                f"{p.file}: view {name!r} reads source {bad_source!r}: {bad_sources[bad_source]}"
            )
            continue
        planned = dict(internal)
        try:
            root = mark_monotonic(lower_view(p, catalog, planned, by_name), append_only)
        except IvmError as e:
            failed[name] = e
            continue
        for key in [k for k in planned if k not in internal]:  # in the order they were made
            internal[key] = planned[key]
            plans[planned[key].name] = _internal_plan(planned[key], p, append_only)
            catalog[planned[key].name] = ("view", plans[planned[key].name].columns)
        plans[name] = ViewPlan(name, p.file, p.sql, p.sql_hash, root)
        catalog[name] = ("view", root.columns)
    return ProjectPlan(
        plans,
        {k: tuple(c.lower() for c in v) for k, v in source_columns.items()},
        _arrangements(plans, catalog),
        failed,
    )


def _by_name(parsed: Sequence[ParsedView], sources: Collection[str]) -> dict[str, ParsedView]:
    """The views by name.

    Raises:
        ConfigError: two views share a name, or a view has a source's name.
    """
    by_name: dict[str, ParsedView] = {}
    for p in parsed:
        if p.name in by_name:
            raise ConfigError(
                f"{p.file}: view {p.name!r} is already defined in {by_name[p.name].file}"
            )
        if p.name in sources:
            raise ConfigError(f"{p.file}: view {p.name!r} has the name of a source in ivm.toml")
        by_name[p.name] = p
    return by_name


def _internal_plan(v: InternalView, owner: ParsedView, append_only: Collection[str]) -> ViewPlan:
    """The plan of an internal view ``owner``'s lowering made: its SQL is its own (the
    oracles evaluate it), its file and errors its owner's."""
    text = ParsedView(v.name, owner.file, v.sql, v.query)
    root = mark_monotonic(v.root, append_only)
    return ViewPlan(v.name, owner.file, v.sql, text.sql_hash, root, owner=owner.name, label=v.label)


def _arrangements(
    plans: Mapping[str, ViewPlan], catalog: Mapping[str, CatalogEntry]
) -> dict[ArrangementKey, ArrangementPlan]:
    """Group every lookup of every view by (collection, key): one shared arrangement each."""
    columns: dict[ArrangementKey, set[str]] = {}
    users: dict[ArrangementKey, list[str]] = {}
    for plan in plans.values():
        for join in plan.joins:
            for key, needed in arrangement_needs(join, plan.file):
                columns.setdefault(key, set()).update(needed)
                if plan.name not in users.setdefault(key, []):
                    users[key].append(plan.name)
    out = {}
    for key in sorted(columns):
        order = catalog[key.collection][1]
        rest = tuple(c for c in order if c in columns[key] and c not in key.key)
        out[key] = ArrangementPlan(key, key.key + rest, tuple(users[key]))
    return out
