"""Jobs: refresh, verify and compact. Each runs in one process (as every run of the location
does: the Definitions' executor) so its steps share one Spark session."""

from collections.abc import Sequence

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pydantic import Field

from assets.keys import AssetKeys
from assets.views import POOL, spark_factory
from engine.compact import compact, storage_report
from engine.facade import Engine
from ivm.config import Project

REFRESH_JOB = "ivm_refresh"


def refresh_job(
    keys: AssetKeys, checks: Sequence[dg.AssetChecksDefinition] = ()
) -> "dg.UnresolvedAssetJobDefinition":
    """Mint an epoch and bring every view to it (the epoch, arrangement and view assets, by
    their ``keys``), with ``checks`` (the cheap ones).

    Without the from-scratch checks: they recompute every view, which is what a refresh
    avoids; they run in :func:`verify_job` (or on demand in the UI).
    """
    assets = dg.AssetSelection.assets(*keys.of_kinds("epoch", "arrangement", "view"))
    return dg.define_asset_job(
        REFRESH_JOB,
        selection=assets.without_checks() | dg.AssetSelection.checks(*checks),
        executor_def=dg.in_process_executor,
        description="One epoch: mint it from the sources' new versions, refresh every view.",
    )


VERIFY_JOB = "ivm_verify"


def verify_job() -> "dg.UnresolvedAssetJobDefinition":
    """Run every view's checks, the from-scratch one among them (``ivm verify`` as a job):
    a run that materializes nothing, so the from-scratch checks compute."""
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


STORAGE_COLUMNS = {
    "what": "string",
    "rows": "int",
    "stored_bytes": "int",
    "raw_bytes": "int",
    "stored_per_row": "float",
    "raw_per_row": "float",
    "ratio": "float",
}
"""The columns of the compaction's storage report (:func:`engine.compact.storage_report`)."""


def compact_job(project: Project) -> dg.JobDefinition:
    """Maintenance: ``ivm compact`` (advance since, consolidate, optimize, vacuum) as a job,
    in the lake's pool so it never runs beside a refresh."""

    @dg.op(pool=POOL, name="compact_lake")
    def compact_lake(
        context: dg.OpExecutionContext, pyspark: LazyPySparkResource, config: CompactConfig
    ) -> dg.Output[None]:
        engine = Engine(project, spark=spark_factory(pyspark), progress=context.log.info)
        report = compact(engine, retention_hours=config.retention_hours)
        totals = report.totals()
        storage = storage_report(engine)
        return dg.Output(
            None,
            metadata={
                **totals,
                "files_vacuumed": report.files_vacuumed,
                "seconds": round(report.seconds, 3),
                "storage": dg.MetadataValue.table(
                    records=[dg.TableRecord({k: s[k] for k in STORAGE_COLUMNS}) for s in storage],
                    schema=dg.TableSchema(
                        columns=[dg.TableColumn(k, t) for k, t in STORAGE_COLUMNS.items()]
                    ),
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
