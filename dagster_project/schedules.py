"""Schedules (stopped by default): refresh (cron from ``IVM_REFRESH_CRON``, default hourly) and
compaction (``IVM_COMPACT_CRON``, default daily at 03:00)."""

from __future__ import annotations

import os

import dagster as dg

DEFAULT_CRON = "0 * * * *"


def refresh_schedule(job: dg.UnresolvedAssetJobDefinition) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(
        name="ivm_refresh_schedule",
        job=job,
        cron_schedule=os.environ.get("IVM_REFRESH_CRON", DEFAULT_CRON),
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description="Refreshes all views on a cron schedule.",
    )


def compact_schedule(job: dg.JobDefinition) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(
        name="ivm_compact_schedule",
        job=job,
        cron_schedule=os.environ.get("IVM_COMPACT_CRON", "0 3 * * *"),
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description="Compacts the lake (ivm compact) once a day.",
    )
