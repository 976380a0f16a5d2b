"""What the engine's operations report: one view's refresh, a whole refresh, a verification,
a quarantine, a view's status. Plain data, shown by the CLI and as Dagster metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from resources.lake import EpochRecord


@dataclass
class ViewResult:
    """What refreshing one view did. ``rows_changed`` counts updates (inserts + deletes)."""

    view: str
    epoch: int
    previous_epoch: int
    rows_changed: int = 0
    inserted: int = 0
    deleted: int = 0
    seconds: float = 0.0
    # refreshed | up-to-date | built | rebuilt | recomputed | failed | skipped
    status: str = "refreshed"
    reason: str | None = None  # why it was rebuilt or recomputed
    error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    log_files_read: int = 0
    # The readable table's files that held deleted rows, rewritten without them (copy on
    # write), and the rows written that the change did not insert (those files' rows; with
    # deletion vectors, the copies of a row held more times than deleted).
    files_rewritten: int = 0
    rows_rewritten: int = 0
    table_write: str | None = None  # how the table's change was written, and why
    commit_versions: dict[str, int | None] = field(default_factory=dict)
    lookups: dict[str, Any] = field(default_factory=dict)  # arrangement -> LookupStats
    inputs_changed: bool = True  # False: nothing it reads changed; only its epoch moved
    # Spark jobs its refresh ran (arrangements it wrote included); None: not counted (Spark
    # Connect, whose server's UI lists them by the operation tag ``spark_job_group``)
    spark_jobs: int | None = 0
    spark_job_group: str | None = None  # their job group in the Spark UI (None: no Spark)
    # Who computed its updates: "spark"; "driver" (a small change evaluated in Arrow,
    # ops.stateless.driver); "mixed": the driver computed the joins, Spark the reductions above
    # them; "nothing": no input changed what it reads
    computed_by: str = "spark"
    # Where the policy placed its computation before it ran, and why (ivm.policy.Placement)
    placement: str | None = None
    # Why the driver handed parts of a small change to Spark (ops.declines), in order
    driver_declined: list[str] = field(default_factory=list)

    def metadata(self) -> dict[str, Any]:
        """Flat metadata (for Dagster and JSON output)."""
        return {
            "epoch": self.epoch,
            "previous_epoch": self.previous_epoch,
            "rows_changed": self.rows_changed,
            "rows_inserted": self.inserted,
            "rows_deleted": self.deleted,
            "seconds": round(self.seconds, 3),
            "status": self.status,
            **({"reason": self.reason} if self.reason else {}),
            "inputs_changed": self.inputs_changed,
            "computed_by": self.computed_by,
            **({"placement": self.placement} if self.placement else {}),
            "driver_declined": list(self.driver_declined),
            "files_rewritten": self.files_rewritten,
            "table_rows_rewritten": self.rows_rewritten,
            **({"table_write": self.table_write} if self.table_write else {}),
            "log_files_read": self.log_files_read,
            **({"spark_jobs": self.spark_jobs} if self.spark_jobs is not None else {}),
            **({"spark_job_group": self.spark_job_group} if self.spark_job_group else {}),
            **{f"delta_version_{k}": v for k, v in self.commit_versions.items()},
            **{f"seconds_{k}": round(v, 3) for k, v in self.timings.items()},
            **{
                f"arrangement {name}: {k}": v
                for name, st in self.lookups.items()
                for k, v in st.as_dict().items()
            },
        }


@dataclass
class QuarantineResult:
    """Rows of a source's new updates that broke its contract, set aside at an epoch."""

    source: str
    epoch: int
    rows: int
    table: str
    example: dict[str, Any] | None = None

    def describe(self) -> str:
        if not self.rows:
            return f"source {self.source}: every new row meets its contract"
        example = ", ".join(f"{k}={v!r}" for k, v in (self.example or {}).items())
        return (
            f"source {self.source}: {self.rows} updates quarantined at epoch {self.epoch} in "
            f"{self.table} (e.g. {example})"
        )


@dataclass
class RefreshReport:
    """What one ``refresh`` did: the epoch minted (if any) and every view's result."""

    minted: EpochRecord | None
    views: list[ViewResult]
    seconds: float
    quarantined: list[QuarantineResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(v.status not in ("failed", "skipped") for v in self.views)


@dataclass
class VerifyResult:
    """A view compared with Spark's from-scratch evaluation of its SQL at the view's epoch."""

    view: str
    epoch: int
    expected_rows: int = 0
    actual_rows: int = 0
    missing: int = 0  # rows from scratch has and the view lacks (with multiplicity)
    extra: int = 0  # rows the view has and from scratch lacks
    negative: int = 0  # rows whose summed diff in the view's log is negative
    examples: list[str] = field(default_factory=list)
    repaired: bool = False
    seconds: float = 0.0
    tolerances: list[str] = field(default_factory=list)  # columns not compared exactly: how

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.negative)

    def describe(self) -> str:
        rules = f"; compared: {'; '.join(self.tolerances)}" if self.tolerances else ""
        if self.ok:
            return f"{self.view}: OK at epoch {self.epoch} ({self.actual_rows} rows){rules}"
        parts = [f"{self.missing} rows missing", f"{self.extra} extra"]
        if self.negative:
            parts.append(f"{self.negative} negative multiplicities in its log")
        ex = f" (e.g. {'; '.join(self.examples)})" if self.examples else ""
        return f"{self.view}: DIFFERENT at epoch {self.epoch}: {', '.join(parts)}{ex}{rules}"

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {"ok": self.ok}


@dataclass(frozen=True)
class ViewStatus:
    view: str
    log_epoch: int
    table_epoch: int
    rows: int | None


@dataclass
class ConsistencyResult:
    """A view's cheap self-consistency, read from its tables without Spark and without
    evaluating its SQL (:meth:`engine.maintenance.Maintenance.consistency`): its readable table
    at its log's epoch, holding as many rows as the log's updates sum to, no row with a
    negative multiplicity, and the plan's columns."""

    view: str
    epoch: int  # the diff log's
    table_epoch: int
    table_rows: int = 0
    log_rows: int = 0  # the log's diffs summed up to the table's epoch
    negative: int | None = None  # rows whose summed diff is negative; None: not counted
    columns: tuple[str, ...] = ()  # the plan's
    table_columns: tuple[str, ...] = ()
    log_columns: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def problems(self) -> list[str]:
        out = []
        if self.table_epoch != self.epoch:
            out.append(f"table at epoch {self.table_epoch}, its log at {self.epoch}: refresh")
        if self.table_rows != self.log_rows:
            out.append(f"table has {self.table_rows} rows, its log sums to {self.log_rows}")
        if self.negative:
            out.append(f"{self.negative} rows with a negative multiplicity in its log")
        if self.table_columns != self.columns:
            out.append(f"table columns {list(self.table_columns)} are not {list(self.columns)}")
        if self.log_columns != self.columns:
            out.append(f"log columns {list(self.log_columns)} are not {list(self.columns)}")
        return out

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        notes = f" ({'; '.join(self.notes)})" if self.notes else ""
        if self.ok:
            return f"{self.view}: consistent at epoch {self.epoch} ({self.table_rows} rows){notes}"
        return f"{self.view}: INCONSISTENT at epoch {self.epoch}: {'; '.join(self.problems)}{notes}"
