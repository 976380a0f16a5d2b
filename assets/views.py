"""Dagster assets for one project: observable sources, the epoch, shared arrangements and one
asset per view, with the checks Dagster runs on them.

Owns the mapping from the engine's objects to Dagster's: asset keys and groups (``sources``,
``arrangements``, ``views``), dependencies taken from the plan (only edges that carry data),
code versions (the SQL hash), automation conditions, data versions, and metadata Dagster
renders (column schema and lineage, table name, URI, storage kind, code references). Every
computation is the engine's (:class:`engine.facade.Engine`): ``ivm refresh`` and a
materialization run the same code.

Contract in ``(data, time, diff)`` terms:

- ``sources/<name>`` is observed: its data version is the Delta table version.
- ``ivm/epoch`` fixes the version range of every source that changed (the next epoch). The
  epoch, the arrangements and the views are one subsettable multi-asset (op ``ivm_views``):
  a run that selects any view mints the epoch first, whether or not it selected ``ivm/epoch``,
  then refreshes its views side by side, as ``ivm refresh`` does; so no view needs an edge
  from the epoch.
- ``views/<name>`` brings the view to the newest epoch; its data version is that epoch, so a
  materialization that changed nothing keeps the same data version.
- Check ``consistent`` (every view, one multi-asset check, no Spark) runs with every
  materialization; check ``matches_from_scratch`` (Spark recomputes the view) runs only in
  runs that materialize nothing (the ``ivm_verify`` job, a check launched alone).
"""

from collections.abc import Callable, Iterator, Sequence
from graphlib import TopologicalSorter
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
from dagster import AssetExecutionContext
from dagster._core.definitions.data_version import DATA_VERSION_TAG
from dagster_pyspark import LazyPySparkResource
from pydantic import Field
from pyspark.sql import SparkSession

from assets.keys import (
    EPOCH,
    AssetKeys,
    IvmAsset,
    Translator,
    arrangement_asset,
    default_key,
    translate,
)
from engine.facade import Engine
from engine.inspect import Inspector
from engine.results import ConsistencyResult, QuarantineResult, ViewResult
from ivm.config import Project
from ivm.errors import IvmError
from ivm.plan.ir import column_lineage
from ivm.plan.join import ArrangementKey
from resources.faults import crash_point
from resources.lake import EpochRecord, SourceTable
from resources.spark import check_spark

SOURCES_GROUP = "sources"
ARRANGEMENTS_GROUP = "arrangements"
VIEWS_GROUP = "views"
EPOCH_KEY = default_key(EPOCH)
"""The epoch's default key (see :mod:`assets.keys` for keys after translation)."""
POOL = "ivm_lake"
"""Concurrency pool of every asset that writes the lake: limit it to 1 (see dagster.yaml)."""


def source_key(name: str) -> dg.AssetKey:
    """A source's default key, ``sources/<name>``."""
    return default_key(IvmAsset("source", name))


def view_key(name: str) -> dg.AssetKey:
    """A view's default key, ``views/<name>``."""
    return default_key(IvmAsset("view", name))


def arrangement_key(key: ArrangementKey) -> dg.AssetKey:
    """An arrangement's default key, ``arrangements/<collection>_by_<column>[_and_<column>...]``,
    e.g. ``arrangements/orders_by_o_custkey`` (its table is ``arrangements/<key.name>``)."""
    return default_key(arrangement_asset(key))


def spark_factory(pyspark: LazyPySparkResource) -> Callable[[], SparkSession]:
    """The resource's session, started (after the Java or server check) only when a step
    first needs Spark: a refresh that finds nothing to compute starts no JVM."""

    def start() -> SparkSession:
        check_spark(pyspark.spark_config)
        return pyspark.spark_session

    return start


def _md_code(text: str, lang: str = "") -> dg.MetadataValue:
    return dg.MetadataValue.md(f"```{lang}\n{text.rstrip()}\n```")


def _uri(path: str) -> str:
    """A table's location as a URI (``file://`` for a local path)."""
    return path if "://" in path else Path(path).as_uri()


def _table_metadata(uri: str, registered: str | None = None) -> dict[str, Any]:
    """What Dagster shows of any Delta table the engine writes; ``registered``: its name in
    Spark's catalog (a view table under ``[catalog] database``), else the name Spark SQL
    reads a path table by."""
    return {
        "dagster/uri": dg.MetadataValue.url(_uri(uri)),
        "dagster/table_name": registered or f"delta.`{uri}`",
        "dagster/storage_kind": "delta",
    }


def _view_table_metadata(engine: Inspector, name: str) -> dict[str, Any]:
    database = engine.project.catalog_database
    registered = None if database is None else f"{database}.{name}"
    return _table_metadata(engine.layout.view_table(name), registered)


SOURCES_OP = "ivm_sources"


def _source_spec(name: str, uri: str) -> dg.AssetSpec:
    return dg.AssetSpec(
        key=source_key(name),
        group_name=SOURCES_GROUP,
        kinds={"delta"},
        description=f"Delta table {uri}; its data version is the Delta table version.",
        metadata=_table_metadata(uri),
    )


def _sources_asset(
    project: Project, specs: Sequence[dg.AssetSpec], keys: AssetKeys
) -> dg.AssetsDefinition:
    """Every source as an observable asset (one op observes those selected): its data
    version is its Delta table's version, read without Spark."""

    @dg.multi_observable_source_asset(name=SOURCES_OP, specs=specs, can_subset=True)
    def _observe(context: dg.AssetExecutionContext) -> Iterator[dg.ObserveResult]:
        for name, uri in project.sources.items():
            if keys.source(name) in context.selected_asset_keys:
                version = SourceTable(name, uri).version()
                yield dg.ObserveResult(
                    asset_key=keys.source(name),
                    data_version=dg.DataVersion(str(version)),
                    metadata={"delta_version": version},
                )

    return _observe


def _epoch_spec(project: Project, condition: dg.AutomationCondition | None) -> dg.AssetSpec:
    return dg.AssetSpec(
        key=EPOCH_KEY,
        deps=[source_key(s) for s in project.sources],
        group_name=SOURCES_GROUP,
        kinds={"delta"},
        description=(
            "The epochs: for every source, the Delta version range (lower, upper] whose "
            "changes the views consume. A run that refreshes views mints the next epoch "
            "itself; materializing this asset alone mints it (and quarantines rows breaking "
            "a source's contract) without refreshing any view."
        ),
        metadata=_table_metadata(Inspector(project).layout.epochs),
        automation_condition=condition,
        skippable=True,
    )


def _epoch_metadata(
    engine: Engine, minted: EpochRecord | None, quarantined: Sequence[QuarantineResult]
) -> dict[str, Any]:
    current = engine.latest_epoch()
    ranges = minted.ranges if minted else (engine.epochs()[-1].ranges if current else {})
    out: dict[str, Any] = {
        "epoch": current,
        "minted": minted is not None,
        "ranges": dg.MetadataValue.table(
            records=[
                dg.TableRecord({"source": s, "lower": -1 if lo is None else lo, "upper": up})
                for s, (lo, up) in ranges.items()
            ],
            schema=dg.TableSchema(
                columns=[
                    dg.TableColumn("source", "string"),
                    dg.TableColumn("lower", "int", description="exclusive; -1: from empty"),
                    dg.TableColumn("upper", "int", description="inclusive"),
                ]
            ),
        ),
    }
    for q in quarantined:
        out[f"quarantined {q.source}"] = q.rows
        if q.example:
            out[f"quarantined {q.source}: example"] = q.describe()
    return out


def _column_schema(engine: Inspector, name: str) -> dg.TableSchema:
    """The view's columns as its plan names them, with their types once its table exists."""
    uri = engine.layout.view_table(name)
    types: dict[str, str] = {}
    if engine.table_epoch(uri):
        types = {f.name: str(f.type) for f in engine.table_schema(uri)}
    return dg.TableSchema(
        columns=[dg.TableColumn(c, types.get(c, "unknown")) for c in engine.view(name).columns]
    )


def _collection_keys(engine: Inspector, collection: str, keys: AssetKeys) -> list[dg.AssetKey]:
    """The assets a collection stands for: a source's or a view's own; an internal view (not
    an asset) stands for the sources and views it reads."""
    plan = engine.plan
    if collection not in plan.views:
        return [keys.source(collection)]
    if plan.views[collection].owner is None:
        return [keys.view(collection)]
    sources, views = plan.project_inputs(collection)
    return [*(keys.source(s) for s in sources), *(keys.view(v) for v in views)]


def _origins(engine: Inspector, name: str) -> dict[str, set[tuple[str, str]]]:
    """Each column's origins in sources and project views, through internal views."""
    plan = engine.plan
    out: dict[str, set[tuple[str, str]]] = {}
    for column, deps in column_lineage(plan.views[name].root).items():
        found: set[tuple[str, str]] = set()
        for coll, c in deps:
            internal = coll in plan.views and plan.views[coll].owner is not None
            found |= _origins(engine, coll).get(c, set()) if internal else {(coll, c)}
        out[column] = found
    return out


def _column_lineage(engine: Inspector, name: str, keys: AssetKeys) -> dg.TableColumnLineage:
    """Each column's origins in the sources and views the view reads (from the plan)."""

    def key(coll: str) -> dg.AssetKey:
        return keys.view(coll) if coll in engine.plan.views else keys.source(coll)

    return dg.TableColumnLineage(
        deps_by_column={
            column: [dg.TableColumnDep(key(coll), c) for coll, c in sorted(deps)]
            for column, deps in _origins(engine, name).items()
            if deps
        }
    )


def view_metadata(
    engine: Engine, name: str, result: ViewResult, keys: AssetKeys | None = None
) -> dict[str, Any]:
    """The metadata a view's materialization reports (also used by tests)."""
    status = engine.view_status(name)
    table_uri = engine.layout.view_table(name)
    schema = engine.table_schema(table_uri)
    columns = dg.TableSchema(
        columns=[dg.TableColumn(f.name, str(f.type)) for f in pa.schema(schema)]
    )
    return {
        **result.metadata(),
        **_view_table_metadata(engine, name),
        "dagster/row_count": status.rows or 0,
        "dagster/column_schema": columns,
        "dagster/column_lineage": _column_lineage(engine, name, keys or AssetKeys()),
        "diff_log": dg.MetadataValue.path(engine.layout.view_log(name)),
        "explain": _md_code(engine.explain(name)),
    }


def _arrangement_spec(
    engine: Inspector, key: ArrangementKey, condition: dg.AutomationCondition | None
) -> dg.AssetSpec:
    aplan = engine.plan.arrangements[key]
    return dg.AssetSpec(
        key=arrangement_key(key),
        deps=_collection_keys(engine, key.collection, AssetKeys()),
        group_name=ARRANGEMENTS_GROUP,
        kinds={"spark", "delta"},
        description=(
            f"Shared arrangement of {key.kind} {key.collection} by ({', '.join(key.key)}), "
            f"holding [{', '.join(aplan.columns)}]; read by {', '.join(aplan.users)}."
        ),
        metadata=_table_metadata(engine.arrangement_uri(key)),
        automation_condition=condition,
        skippable=True,
    )


def _arrangement_result(key: dg.AssetKey, status: dict[str, Any]) -> dg.MaterializeResult:
    return dg.MaterializeResult(
        asset_key=key,
        metadata={
            "epoch": status["epoch"],
            "dagster/row_count": status["rows"],
            "bytes": status["bytes"],
            "files": status["files"],
            "used_by": ", ".join(status["users"]),
        },
        data_version=dg.DataVersion(f"epoch-{status['epoch']}"),
    )


FULL_REFRESH_TAG = "ivm/full_refresh"
"""Run tag (value ``true``) that rebuilds every view the run materializes, e.g. a backfill
launched from the UI's launchpad; or the run config ``full_refresh: true`` of ``ivm_views``."""


class ViewRefreshConfig(dg.Config):
    """Run config of the views' op (``ivm_views``)."""

    full_refresh: bool = Field(
        default=False,
        description=(
            "Rebuild the selected views from their inputs' current state (at a new epoch) "
            "instead of applying the new changes; the difference to each stored view is "
            "committed, so downstream views still receive only the changes."
        ),
    )


def _full_refresh(context: AssetExecutionContext, config: ViewRefreshConfig) -> bool:
    return config.full_refresh or context.run.tags.get(FULL_REFRESH_TAG, "") == "true"


VIEWS_OP = "ivm_views"
"""The op that mints epochs and refreshes arrangements and views: one subsettable multi-asset,
so a run refreshes its selected views side by side (``[refresh] parallelism``) in one Spark
session."""


def _view_spec(
    engine: Inspector, name: str, condition: dg.AutomationCondition | None
) -> dg.AssetSpec:
    plan = engine.plan.views[name]
    sources, views = engine.plan.project_inputs(name)
    deps = [*(source_key(s) for s in sources), *(view_key(v) for v in views)]
    deps += [
        arrangement_key(a.key)
        for n in (name, *engine.plan.internal_inputs(name))
        for a in engine.plan.arrangements_of(n)
    ]
    return dg.AssetSpec(
        key=view_key(name),
        deps=deps,
        group_name=VIEWS_GROUP,
        code_version=plan.sql_hash,
        kinds={"spark", "delta"},
        description=f"View {name} ({Path(plan.file).name}), maintained incrementally.",
        metadata={
            **_view_table_metadata(engine, name),
            "dagster/column_schema": _column_schema(engine, name),
            "dagster/column_lineage": _column_lineage(engine, name, AssetKeys()),
            "dagster/code_references": dg.CodeReferencesMetadataValue(
                code_references=[
                    dg.LocalFileCodeReference(
                        file_path=str(Path(plan.file).resolve()), line_number=1, label="SQL"
                    )
                ]
            ),
            "sql": _md_code(plan.sql, "sql"),
            "explain": _md_code(engine.explain(name)),
        },
        automation_condition=condition,
        skippable=True,
    )


def _views_asset(
    project: Project, engine: Inspector, specs: Sequence[dg.AssetSpec], keys: AssetKeys
) -> dg.AssetsDefinition:
    """The epoch, every plannable view and every shared arrangement as one subsettable
    multi-asset (as dbt models are in dagster-dbt): Dagster shows one asset each with its
    lineage, and a run hands the views it selected to :meth:`Engine.refresh`, which mints the
    epoch and runs them side by side (each arrangement written once, by the first view that
    needs it) and skips the readers of a view that fails. The views that refreshed are
    materialized; then the step fails naming the others. (Arrangements and the epoch are in
    the same op: a chain across ops would split the run into sequential steps, and the epoch
    would need an edge to every view to be minted first.)"""
    arrangements = list(engine.plan.arrangements)
    # Dagster takes a multi-asset's results in dependency order.
    order = list(
        TopologicalSorter({s.key: {d.asset_key for d in s.deps} for s in specs}).static_order()
    )

    @dg.multi_asset(
        name=VIEWS_OP,
        specs=specs,
        can_subset=True,
        pool=POOL,
        description="Mints the next epoch, refreshes the selected views side by side.",
    )
    def views(
        context: AssetExecutionContext, pyspark: LazyPySparkResource, config: ViewRefreshConfig
    ) -> Iterator[dg.MaterializeResult]:
        run_engine = Engine(project, spark=spark_factory(pyspark), progress=context.log.info)
        selected = context.selected_asset_keys
        names = [n for n in run_engine.plan.order if keys.view(n) in selected]
        chosen = [k for k in arrangements if keys.arrangement(k) in selected]
        full = _full_refresh(context, config)
        report, minted, quarantined = None, None, []
        if names:  # mints the epoch (a new one for a rebuild), quarantines, refreshes
            report = run_engine.refresh(names, rebuild=full)
            minted, quarantined = report.minted, report.quarantined
        elif keys.epoch in selected:
            minted = run_engine.mint_epoch(force=full)
            quarantined = run_engine.quarantine()
        for key in chosen:  # those no selected view read are refreshed here
            run_engine.refresh_arrangement(key)
        crash_point("before_materialization")
        results = _epoch_result(context, run_engine, keys, minted, quarantined)
        status = {a["arrangement"]: a for a in run_engine.arrangement_status()}
        for k in chosen:
            results[keys.arrangement(k)] = _arrangement_result(keys.arrangement(k), status[str(k)])
        failed = []
        for result in report.views if report else []:
            if result.status in ("failed", "skipped"):
                failed.append(f"{result.view}: {result.status}: {result.error}")
                continue
            if keys.view(result.view) not in selected:  # an internal view its readers need
                continue
            results[keys.view(result.view)] = dg.MaterializeResult(
                asset_key=keys.view(result.view),
                metadata=view_metadata(run_engine, result.view, result, keys),
                data_version=dg.DataVersion(f"epoch-{result.epoch}"),
            )
        yield from (results[key] for key in order if key in results)
        if failed:
            raise dg.Failure(
                description=f"{len(failed)} of {len(names)} views did not refresh",
                metadata={"views": dg.MetadataValue.md("\n".join(f"- {f}" for f in failed))},
            )

    return views


def _epoch_result(
    context: AssetExecutionContext,
    engine: Engine,
    keys: AssetKeys,
    minted: EpochRecord | None,
    quarantined: Sequence[QuarantineResult],
) -> dict[dg.AssetKey, dg.MaterializeResult]:
    """The epoch's result when the run selected it; else, when the run minted one for its
    views, the epoch's materialization recorded (though not selected) and no result."""
    meta = _epoch_metadata(engine, minted, quarantined)
    version = dg.DataVersion(f"epoch-{engine.latest_epoch()}")
    if keys.epoch in context.selected_asset_keys:
        return {
            keys.epoch: dg.MaterializeResult(
                asset_key=keys.epoch, metadata=meta, data_version=version
            )
        }
    if minted is not None:
        context.log_event(
            dg.AssetMaterialization(
                keys.epoch, metadata=meta, tags={DATA_VERSION_TAG: version.value}
            )
        )
    return {}


def _broken_view_spec(name: str, error: IvmError) -> dg.AssetSpec:
    return dg.AssetSpec(
        key=view_key(name),
        group_name=VIEWS_GROUP,
        kinds={"spark", "delta"},
        description=f"View {name}: BROKEN: {error}",
        metadata={"error": dg.MetadataValue.text(str(error))},
    )


def _broken_view_asset(name: str, spec: dg.AssetSpec, error: IvmError) -> dg.AssetsDefinition:
    """A view that cannot be planned: it stays in the graph, and materializing it fails with
    the error (file, position, construct), while the other views refresh."""

    @dg.multi_asset(name=view_key(name).to_python_identifier(), specs=[spec], pool=POOL)
    def view() -> dg.MaterializeResult:
        raise error

    return view


CONSISTENT_CHECK = "consistent"
FROM_SCRATCH_CHECK = "matches_from_scratch"
CONSISTENCY_OP = "ivm_consistency"
FROM_SCRATCH_OP = "ivm_from_scratch"


def _check_result(
    key: dg.AssetCheckKey, result: Any, metadata: dict[str, Any]
) -> dg.AssetCheckResult:
    """A view's check result from the engine's (``ok``, ``describe()``, ``epoch``,
    ``seconds``) and what else the check reports."""
    return dg.AssetCheckResult(
        asset_key=key.asset_key,
        check_name=key.name,
        passed=result.ok,
        description=result.describe(),
        metadata={"epoch": result.epoch, **metadata, "seconds": round(result.seconds, 3)},
    )


def _consistency_result(key: dg.AssetCheckKey, result: ConsistencyResult) -> dg.AssetCheckResult:
    return _check_result(
        key,
        result,
        {
            "table_epoch": result.table_epoch,
            "table_rows": result.table_rows,
            "log_rows": result.log_rows,
            "negative_multiplicities": -1 if result.negative is None else result.negative,
        },
    )


def _consistency_checks(
    project: Project, names: Sequence[str], keys: AssetKeys
) -> dg.AssetChecksDefinition:
    @dg.multi_asset_check(
        name=CONSISTENCY_OP,
        specs=[
            dg.AssetCheckSpec(
                CONSISTENT_CHECK,
                asset=keys.view(n),
                blocking=False,
                description=(
                    "Cheap, no Spark: the readable table is at its diff log's epoch and holds "
                    "as many rows as the log's diffs sum to, no row's summed diff is negative, "
                    "and both have the plan's columns. Runs with every materialization."
                ),
            )
            for n in names
        ],
        can_subset=True,
        description="Each selected view's cheap consistency check (no Spark).",
    )
    def consistency(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        engine = Inspector(project)
        for key in sorted(context.selected_asset_check_keys, key=lambda k: k.asset_key.path):
            try:
                result = engine.consistency(keys.asset(key.asset_key).name)
            except IvmError as e:  # not materialized yet: the check fails saying so
                yield dg.AssetCheckResult(
                    asset_key=key.asset_key, check_name=key.name, passed=False, description=str(e)
                )
                continue
            yield _consistency_result(key, result)

    return consistency


def materializes_assets(context: dg.AssetCheckExecutionContext) -> bool:
    """Whether the check's run materializes any asset (its selection, or its whole job's)."""
    selection = context.run.asset_selection
    if selection is not None:
        return bool(selection)
    return bool(context.job_def.asset_layer.executable_asset_keys)


def _from_scratch_checks(
    project: Project, names: Sequence[str], keys: AssetKeys
) -> dg.AssetChecksDefinition:
    @dg.multi_asset_check(
        name=FROM_SCRATCH_OP,
        specs=[
            dg.AssetCheckSpec(
                FROM_SCRATCH_CHECK,
                asset=keys.view(n),
                description=(
                    "Recomputes the view from scratch with Spark SQL at its epoch and compares "
                    "it with the view's diff log and table (multisets; floating-point columns "
                    "within the tolerance the result states, others exact); also: no negative "
                    "multiplicity. Runs in the ivm_verify job (or launched alone), never with a "
                    "materialization. Repair with `ivm verify --repair`."
                ),
            )
            for n in names
        ],
        can_subset=True,
        description="Each selected view recomputed from scratch and compared (ivm verify).",
    )
    def from_scratch(
        context: dg.AssetCheckExecutionContext, pyspark: LazyPySparkResource
    ) -> Iterator[dg.AssetCheckResult]:
        if materializes_assets(context):  # "Materialize all" selects every check of the assets
            context.log.info(
                "from-scratch checks not run: this run materializes assets; they run in the "
                "ivm_verify job or when launched alone"
            )
            return
        engine = Engine(project, spark=spark_factory(pyspark), progress=context.log.info)
        for key in sorted(context.selected_asset_check_keys, key=lambda k: k.asset_key.path):
            result = engine.verify(keys.asset(key.asset_key).name)
            yield _check_result(
                key,
                result,
                {
                    "rows_expected": result.expected_rows,
                    "rows_actual": result.actual_rows,
                    "rows_missing": result.missing,
                    "rows_extra": result.extra,
                    "negative_multiplicities": result.negative,
                    "examples": "; ".join(result.examples) or "-",
                },
            )

    return from_scratch


def build_asset_checks(
    project: Project, keys: AssetKeys | None = None
) -> list[dg.AssetChecksDefinition]:
    """Two multi-asset checks over every view: ``consistent`` (cheap, with every
    materialization) and ``matches_from_scratch`` (``ivm verify``; in the verify job); on the
    views' ``keys`` (default: their default keys)."""
    names = list(Inspector(project).plan.project_views)
    if not names:
        return []
    keys = keys or AssetKeys()
    return [_consistency_checks(project, names, keys), _from_scratch_checks(project, names, keys)]


def automation_condition(project: Project) -> dg.AutomationCondition | None:
    """The condition of the epoch, arrangements and views (``[dagster] automation``):
    ``eager`` requests them when an input was updated (a source observed at a new version, an
    upstream asset materialized), ``on_cron`` after each cron tick once all their inputs were
    updated since it; either also when a view's SQL changed (its code version). None for
    ``none``."""
    if project.automation == "none":
        return None
    changed = dg.AutomationCondition.code_version_changed()
    if project.automation == "on_cron":
        return (dg.AutomationCondition.on_cron(project.automation_cron) | changed).with_label(
            f"on_cron({project.automation_cron}) or its SQL changed"
        )
    return (dg.AutomationCondition.eager() | changed).with_label("eager or its SQL changed")


def _default_specs(project: Project, engine: Inspector) -> dict[IvmAsset, dg.AssetSpec]:
    """Every asset's spec before translation (default keys and groups), in the graph's order:
    sources, the epoch, arrangements, views, views that cannot be planned."""
    condition = automation_condition(project)
    specs = {IvmAsset("source", n): _source_spec(n, uri) for n, uri in project.sources.items()}
    specs[EPOCH] = _epoch_spec(project, condition)
    for k in engine.plan.arrangements:
        specs[arrangement_asset(k)] = _arrangement_spec(engine, k, condition)
    for name in engine.plan.project_views:  # internal views refresh with their readers
        specs[IvmAsset("view", name)] = _view_spec(engine, name, condition)
    for name, error in sorted(engine.plan.broken.items()):
        specs[IvmAsset("view", name)] = _broken_view_spec(name, error)
    return specs


def build_assets(
    project: Project, translator: Translator | None = None
) -> tuple[list[Any], AssetKeys]:
    """Every asset of a project: sources, the epoch, arrangements and views, the last three
    with the project's :func:`automation_condition`; each spec passed through ``translator``
    (a component's translation hook; None: the default specs). Also the keys in force.

    Raises:
        IvmError: the project cannot be planned (its message names the file and position).
        DagsterInvalidDefinitionError: the translation gave two assets the same key.
    """
    engine = Inspector(project)
    specs, keys = translate(_default_specs(project, engine), translator)
    sources = [s for a, s in specs.items() if a.kind == "source"]
    broken = {IvmAsset("view", n) for n in engine.plan.broken}
    lake = [s for a, s in specs.items() if a.kind != "source" and a not in broken]
    assets: list[Any] = [_sources_asset(project, sources, keys)] if sources else []
    assets.append(_views_asset(project, engine, lake, keys))
    assets.extend(
        _broken_view_asset(n, specs[IvmAsset("view", n)], e)
        for n, e in sorted(engine.plan.broken.items())
    )
    return assets, keys
