"""Dagster assets for one project: observable sources, the epoch, and one asset per view.

Owns the mapping from the engine's objects to Dagster's: asset keys, dependencies taken from
the plan, code versions (the SQL hash), data versions and metadata. Every computation is the
engine's (:class:`engine.facade.Engine`): ``ivm refresh`` and a materialization run the same code.

Contract in ``(data, time, diff)`` terms:

- ``sources/<name>`` is observed: its data version is the Delta table version.
- ``ivm/epoch`` mints the next epoch: the version range of every source that changed.
- ``views/<name>`` brings the view to the newest epoch its inputs reached; its data version
  is that epoch, so a materialization that changed nothing keeps the same data version. The
  views are one subsettable multi-asset (op ``ivm_views``): a run refreshes the views it
  selected side by side, as ``ivm refresh`` does.
"""

from collections.abc import Iterator, Sequence
from graphlib import TopologicalSorter
from typing import Any

import dagster as dg
import pyarrow as pa
from dagster import AssetExecutionContext
from dagster_pyspark import LazyPySparkResource
from pydantic import Field

from engine.facade import Engine
from engine.results import ViewResult
from ivm.config import Project
from ivm.errors import IvmError
from resources.faults import crash_point
from resources.lake import SourceTable
from resources.spark import check_spark

SOURCES_GROUP = "sources"
VIEWS_GROUP = "views"
EPOCH_KEY = dg.AssetKey(["ivm", "epoch"])
POOL = "ivm_lake"
"""Concurrency pool of every asset that writes the lake: limit it to 1 (see dagster.yaml)."""


def source_key(name: str) -> dg.AssetKey:
    return dg.AssetKey(["sources", name])


def view_key(name: str) -> dg.AssetKey:
    return dg.AssetKey(["views", name])


def _md_code(text: str, lang: str = "") -> dg.MetadataValue:
    return dg.MetadataValue.md(f"```{lang}\n{text.rstrip()}\n```")


def _source_asset(project: Project, name: str, uri: str) -> Any:
    @dg.observable_source_asset(
        key=source_key(name),
        group_name=SOURCES_GROUP,
        description=f"Delta table {uri}; its data version is the Delta table version.",
        metadata={"path": dg.MetadataValue.path(uri)},
    )
    def _observe() -> dg.ObserveResult:
        version = SourceTable(name, uri).version()
        return dg.ObserveResult(
            data_version=dg.DataVersion(str(version)), metadata={"delta_version": version}
        )

    return _observe


def _epoch_asset(project: Project, sources: Sequence[str]) -> dg.AssetsDefinition:
    @dg.asset(
        key=EPOCH_KEY,
        deps=[source_key(s) for s in sources],
        group_name=VIEWS_GROUP,
        pool=POOL,
        kinds={"delta"},
        description=(
            "Mints the next epoch: fixes, for every source, the Delta version range "
            "(lower, upper] whose changes the views consume next."
        ),
    )
    def epoch(context: AssetExecutionContext, pyspark: LazyPySparkResource) -> dg.MaterializeResult:
        # Spark only when some source has row checks (its quarantine is written here).
        spark = pyspark.spark_session if project.contracts else None
        engine = Engine(project, spark=spark, progress=context.log.info)
        rebuilds = {v: r for v in engine.plan.order if (r := engine.rebuild_reason(v))}
        if context.run.tags.get(FULL_REFRESH_TAG, "") == "true":
            rebuilds.update({v: "full refresh requested" for v in engine.plan.order})
        for view, reason in rebuilds.items():
            context.log.info(f"view {view} will be rebuilt: {reason}")
        record = engine.mint_epoch(force=bool(rebuilds))
        current = engine.latest_epoch()
        ranges = record.ranges if record else (engine.epochs()[-1].ranges if current else {})
        table = "\n".join(
            f"| {s} | {'-' if lo is None else lo} | {up} |" for s, (lo, up) in ranges.items()
        )
        quarantined: dict[str, Any] = {}
        for q in engine.quarantine():
            quarantined[f"quarantined {q.source}"] = q.rows
            if q.example:
                quarantined[f"quarantined {q.source}: example"] = q.describe()
        return dg.MaterializeResult(
            metadata={
                **quarantined,
                "epoch": current,
                "minted": record is not None,
                "ranges": dg.MetadataValue.md(
                    f"| source | lower (exclusive) | upper |\n|---|---|---|\n{table}"
                ),
            },
            data_version=dg.DataVersion(f"epoch-{current}"),
        )

    return epoch


def view_metadata(engine: Engine, name: str, result: ViewResult) -> dict[str, Any]:
    """The metadata a view's materialization reports (also used by tests)."""
    status = engine.view_status(name)
    table_uri = engine.layout.view_table(name)
    schema = engine.table_schema(table_uri)
    columns = dg.TableSchema(
        columns=[dg.TableColumn(f.name, str(f.type)) for f in pa.schema(schema)]
    )
    return {
        **result.metadata(),
        "dagster/row_count": status.rows or 0,
        "dagster/table_name": table_uri,
        "dagster/column_schema": columns,
        "diff_log": dg.MetadataValue.path(engine.layout.view_log(name)),
        "explain": _md_code(engine.explain(name)),
    }


def arrangement_key(name: str) -> dg.AssetKey:
    return dg.AssetKey(["arrangements", name])


def _collection_key(engine: Engine, collection: str) -> dg.AssetKey:
    return view_key(collection) if collection in engine.plan.views else source_key(collection)


def _arrangement_spec(engine: Engine, key: Any) -> dg.AssetSpec:
    aplan = engine.plan.arrangements[key]
    return dg.AssetSpec(
        key=arrangement_key(key.name),
        deps=[_collection_key(engine, key.collection), EPOCH_KEY],
        group_name=VIEWS_GROUP,
        kinds={"spark", "delta"},
        description=(
            f"Shared arrangement of {key.kind} {key.collection} by ({', '.join(key.key)}), "
            f"holding [{', '.join(aplan.columns)}]; read by {', '.join(aplan.users)}."
        ),
        metadata={"table": dg.MetadataValue.path(engine.arrangement_uri(key))},
        skippable=True,
    )


def _arrangement_result(key: Any, status: dict[str, Any]) -> dg.MaterializeResult:
    return dg.MaterializeResult(
        asset_key=arrangement_key(key.name),
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
"""The op that refreshes views: one subsettable multi-asset, so a run refreshes its selected
views side by side (``[refresh] parallelism``) in one Spark session."""


def _view_spec(engine: Engine, name: str) -> dg.AssetSpec:
    plan = engine.plan.views[name]
    deps = [source_key(s) for s in plan.source_inputs]
    deps += [view_key(v) for v in plan.view_inputs]
    deps += [arrangement_key(a.key.name) for a in engine.plan.arrangements_of(name)]
    deps.append(EPOCH_KEY)
    return dg.AssetSpec(
        key=view_key(name),
        deps=deps,
        group_name=VIEWS_GROUP,
        code_version=plan.sql_hash,
        kinds={"spark", "delta"},
        description=f"View {name} ({plan.file}), maintained incrementally.",
        metadata={
            "sql": _md_code(plan.sql, "sql"),
            "explain": _md_code(engine.explain(name)),
            "table": dg.MetadataValue.path(engine.layout.view_table(name)),
        },
        skippable=True,
    )


def _views_asset(project: Project, engine: Engine) -> dg.AssetsDefinition:
    """Every plannable view and shared arrangement as one subsettable multi-asset (as dbt
    models are in dagster-dbt): Dagster shows one asset each with its lineage, and a run hands
    the views it selected to :meth:`Engine.refresh`, which runs them side by side (each
    arrangement written once, by the first view that needs it) and skips the readers of a
    view that fails. The views that refreshed are materialized; then the step fails naming
    the others. (Arrangements are in the same op: a view -> arrangement -> view chain across
    two ops would split the run into sequential steps.)"""
    arrangements = list(engine.plan.arrangements)
    specs = [_arrangement_spec(engine, k) for k in arrangements]
    specs += [_view_spec(engine, name) for name in engine.plan.order]
    # Dagster takes a multi-asset's results in dependency order.
    order = list(
        TopologicalSorter({s.key: {d.asset_key for d in s.deps} for s in specs}).static_order()
    )

    @dg.multi_asset(
        name=VIEWS_OP,
        specs=specs,
        can_subset=True,
        pool=POOL,
        description="Refreshes the selected views to the newest epoch, side by side.",
    )
    def views(
        context: AssetExecutionContext, pyspark: LazyPySparkResource, config: ViewRefreshConfig
    ) -> Iterator[dg.MaterializeResult]:
        check_spark(pyspark.spark_config)
        run_engine = Engine(project, spark=pyspark.spark_session, progress=context.log.info)
        selected = context.selected_asset_keys
        names = [n for n in run_engine.plan.order if view_key(n) in selected]
        chosen = [k for k in arrangements if arrangement_key(k.name) in selected]
        full = _full_refresh(context, config)
        for name in names if full else []:
            run_engine.epoch_for_rebuild(name)  # mints one new epoch at most
        report = run_engine.refresh(names, mint=False, rebuild=full) if names else None
        for key in chosen:  # those no selected view read are refreshed here
            run_engine.refresh_arrangement(key)
        crash_point("before_materialization")
        status = {a["arrangement"]: a for a in run_engine.arrangement_status()}
        results = {arrangement_key(k.name): _arrangement_result(k, status[str(k)]) for k in chosen}
        failed = []
        for result in report.views if report else []:
            if result.status in ("failed", "skipped"):
                failed.append(f"{result.view}: {result.status}: {result.error}")
                continue
            results[view_key(result.view)] = dg.MaterializeResult(
                asset_key=view_key(result.view),
                metadata=view_metadata(run_engine, result.view, result),
                data_version=dg.DataVersion(f"epoch-{result.epoch}"),
            )
        yield from (results[key] for key in order if key in results)
        if failed:
            raise dg.Failure(
                description=f"{len(failed)} of {len(names)} views did not refresh",
                metadata={"views": dg.MetadataValue.md("\n".join(f"- {f}" for f in failed))},
            )

    return views


def _broken_view_asset(name: str, error: IvmError) -> dg.AssetsDefinition:
    """A view that cannot be planned: it stays in the graph, and materializing it fails with
    the error (file, position, construct), while the other views refresh."""

    @dg.asset(
        key=view_key(name),
        deps=[EPOCH_KEY],
        group_name=VIEWS_GROUP,
        pool=POOL,
        kinds={"spark", "delta"},
        description=f"View {name}: BROKEN: {error}",
        metadata={"error": dg.MetadataValue.text(str(error))},
    )
    def view() -> dg.MaterializeResult:
        raise error

    return view


CHECK_NAME = "matches_from_scratch"


def _verify_check(project: Project, name: str) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=view_key(name),
        name=CHECK_NAME,
        description=(
            "Recomputes the view from scratch with Spark SQL at its epoch and compares it with "
            "the view's diff log and table (multisets; floating-point columns within the "
            "tolerance the result states, others exact); also: no negative multiplicity. "
            "Repair with `ivm verify --repair`."
        ),
    )
    def check(
        context: dg.AssetCheckExecutionContext, pyspark: LazyPySparkResource
    ) -> dg.AssetCheckResult:
        check_spark(pyspark.spark_config)
        engine = Engine(project, spark=pyspark.spark_session, progress=context.log.info)
        result = engine.verify(name)
        return dg.AssetCheckResult(
            passed=result.ok,
            description=result.describe(),
            metadata={
                "epoch": result.epoch,
                "rows_expected": result.expected_rows,
                "rows_actual": result.actual_rows,
                "rows_missing": result.missing,
                "rows_extra": result.extra,
                "negative_multiplicities": result.negative,
                "examples": "; ".join(result.examples) or "-",
                "seconds": round(result.seconds, 3),
            },
        )

    return check


def build_asset_checks(project: Project) -> list[dg.AssetChecksDefinition]:
    """One from-scratch check per view (the ``verify`` command as an asset check)."""
    engine = Engine(project)
    return [_verify_check(project, name) for name in engine.plan.order]


def build_assets(project: Project) -> list[Any]:
    """Every asset of a project: sources, the epoch, and views in refresh order.

    Raises:
        IvmError: the project cannot be planned (its message names the file and position).
    """
    engine = Engine(project)
    assets: list[Any] = [_source_asset(project, name, uri) for name, uri in project.sources.items()]
    assets.append(_epoch_asset(project, list(project.sources)))
    if engine.plan.order:
        assets.append(_views_asset(project, engine))
    assets.extend(_broken_view_asset(n, e) for n, e in sorted(engine.plan.broken.items()))
    return assets
