"""Schedules (stopped by default): refresh (cron from ``IVM_REFRESH_CRON``, default hourly),
verification from scratch (``IVM_VERIFY_CRON``, default daily at 04:00) and compaction
(``IVM_COMPACT_CRON``, default daily at 03:00)."""

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


def verify_schedule(job: dg.UnresolvedAssetJobDefinition) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(
        name="ivm_verify_schedule",
        job=job,
        cron_schedule=os.environ.get("IVM_VERIFY_CRON", "0 4 * * *"),
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description="Recomputes every view from scratch and compares (ivm verify) once a day.",
    )


def compact_schedule(job: dg.JobDefinition) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(
        name="ivm_compact_schedule",
        job=job,
        cron_schedule=os.environ.get("IVM_COMPACT_CRON", "0 3 * * *"),
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description="Compacts the lake (ivm compact) once a day.",
    )
