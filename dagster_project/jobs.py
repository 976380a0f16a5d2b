"""Jobs: refresh, verify and compact. Each runs in one process so its steps share one Spark
session."""

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pydantic import Field

from assets.views import POOL, VIEWS_GROUP
from engine.compact import compact, storage_report
from engine.facade import Engine
from ivm.config import Project
from resources.spark import check_spark

REFRESH_JOB = "ivm_refresh"


def refresh_job() -> "dg.UnresolvedAssetJobDefinition":
    """Mint an epoch and bring every view to it (the epoch asset and all view assets).

    Without the from-scratch checks: they recompute every view, which is what a refresh
    avoids; they run in :func:`verify_job` (or on demand in the UI).
    """
    return dg.define_asset_job(
        REFRESH_JOB,
        selection=dg.AssetSelection.groups(VIEWS_GROUP).without_checks(),
        executor_def=dg.in_process_executor,
        description="One epoch: mint it from the sources' new versions, refresh every view.",
    )


VERIFY_JOB = "ivm_verify"


def verify_job() -> "dg.UnresolvedAssetJobDefinition":
    """Run every view's from-scratch check (``ivm verify`` as a job)."""
    return dg.define_asset_job(
        VERIFY_JOB,
        selection=dg.AssetSelection.all_asset_checks(),
        executor_def=dg.in_process_executor,
        description="Recompute every view from scratch at its epoch and compare (asset checks).",
    )


COMPACT_JOB = "ivm_compact"


class CompactConfig(dg.Config):
    retention_hours: float = Field(
        default=168.0,
        description="vacuum keeps the files that table versions this recent reference",
    )


def compact_job(project: Project) -> dg.JobDefinition:
    """Maintenance: ``ivm compact`` (advance since, consolidate, optimize, vacuum) as a job,
    in the lake's pool so it never runs beside a refresh."""

    @dg.op(pool=POOL, name="compact_lake")
    def compact_lake(
        context: dg.OpExecutionContext, pyspark: LazyPySparkResource, config: CompactConfig
    ) -> dg.Output[None]:
        check_spark(pyspark.spark_config)
        engine = Engine(project, spark=pyspark.spark_session, progress=context.log.info)
        report = compact(engine, retention_hours=config.retention_hours)
        totals = report.totals()
        storage = storage_report(engine)
        table = "\n".join(
            f"| {s['what']} | {s['rows']} | {s['stored_per_row']} | {s['raw_per_row']} | "
            f"{s['ratio']} |"
            for s in storage
        )
        return dg.Output(
            None,
            metadata={
                **totals,
                "files_vacuumed": report.files_vacuumed,
                "seconds": round(report.seconds, 3),
                "storage": dg.MetadataValue.md(
                    "| what | rows | stored B/row | raw B/row | ratio |\n|---|---|---|---|---|\n"
                    + table
                ),
            },
        )

    @dg.job(
        name=COMPACT_JOB,
        executor_def=dg.in_process_executor,
        description="Advance every table's since, consolidate, optimize, vacuum (ivm compact).",
    )
    def job() -> None:
        compact_lake()

    return job
