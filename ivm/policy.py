"""The execution policy: where an epoch's work runs and the sizes that decide it.

The plan decides *what* a view computes; the policy decides *where* (the driver's Arrow
renderer or Spark's) and *how* (which physical strategy of a renderer), from sizes known
before the work starts: the change's rows (the change feed, the log files' statistics) and the
state's rows (the Delta log's statistics). Every threshold that chooses between two paths is a
named field of :class:`Policy`, documented here; the measurements behind the defaults are in
BENCHMARKS.md ("Policy thresholds").

Contract in ``(data, time, diff)`` terms: a policy changes where and how updates are computed,
never which updates. For one plan node and one input, every choice yields the same multiset of
``(data, time, diff)``; the oracle tests run the same views under :meth:`Policy.spark_only`
and the defaults and compare both with DuckDB.

One policy is in force per process (:func:`current`): the engine installs its project's
(``[policy]`` in ``ivm.toml``), and tests set one with :func:`using`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

from ivm.errors import ConfigError
from ivm.plan.driver import driver_support
from ivm.plan.ir import Node

MIB = 1024 * 1024


@dataclass(frozen=True)
class Policy:
    """The thresholds that choose between paths. ``0`` turns a driver path off."""

    # -- where a view's epoch runs ---------------------------------------------------------
    driver: bool = True
    """Whether the driver computes and writes small changes at all; off, Spark does every
    step (``Policy.spark_only()``)."""
    driver_change_rows: int = 100_000
    """A refresh whose inputs give at most this many updates (by the change feed's and the log
    files' row counts) is a *small change*: computed by the driver's renderer where it can, and
    its updates written by the driver (one Parquet file, no Spark commit protocol)."""
    driver_state_rows: int = 100_000
    """Most rows of a reduction's change, and of the state rows a lookup opens, that the driver
    takes on (accumulable sums, MIN/MAX towers, TopK buffers, DISTINCT counts)."""
    recompute_min_rows: int = 10_000
    """A change of fewer input updates is always applied incrementally, whatever its share of
    the inputs (``[refresh] recompute_above``)."""

    # -- arrangements: builds ----------------------------------------------------------------
    driver_build_rows: int = 24_000_000
    """A source snapshot of at most this many rows whose files are laid out by the key becomes
    an arrangement written by the driver, file by file."""
    driver_sort_rows: int = 4_000_000
    """A snapshot not laid out by the key is sorted whole by the driver up to this many rows."""
    arrangement_file_rows: int = 500_000
    """Rows per file of an arrangement Spark writes."""
    row_group_bytes: int = 16 * MIB
    """Parquet row-group size of arrangement files."""
    page_rows: int = 1_000
    """Rows per Parquet page: with the page index, a lookup of k keys reads about k pages."""
    page_bytes: int = 64 * 1024
    """Parquet page size bound of arrangement files."""

    # -- arrangements: lookups ---------------------------------------------------------------
    pushdown_keys: int = 400
    """Values per pushed-down ``IN (...)`` list (a longer OR chain overflows a task's stack)."""
    push_ratio: int = 4
    """A lookup pushes ``key IN (...)`` into its scans while ``keys * page_rows`` is under
    ``1 / push_ratio`` of the live rows; otherwise it reads the candidate files once."""
    driver_lookup_rows: int = 100_000
    """A read-once lookup is done by the driver while the rows whose first key column matches
    stay within this many."""
    cold_file_rows: int = 50_000
    """A file of at most this many rows not yet in the driver's memory counts as held: decoding
    it costs less than a Spark job."""

    # -- sources -----------------------------------------------------------------------------
    ordered_max_files: int = 64
    """At most this many source files are read one by one in key order (one scan each)."""
    keep_feed_bytes: int = 64 * MIB
    """A change feed up to this size stays on the driver for the refresh, so each view can ask
    whether the change touches the columns it reads."""

    # -- the table sink ----------------------------------------------------------------------
    table_file_rows: int = 1_000_000
    """Target rows per file of a readable table's first build."""
    driver_rewrite_rows: int = 4_000_000
    """Up to this many rows in the files a change may delete from, the driver rewrites them."""
    driver_insert_bytes: int = 512 * MIB
    """Most bytes of Arrow memory an insert-only change may take on the driver."""
    deletion_vectors: bool = True
    """Whether a readable table may take deletions as deletion vectors (marked by the driver
    when it counted the change and can read the candidate files, else by one delta-spark
    MERGE; the table gets the feature the first time): rows written per refresh are then the
    rows inserted. Off, deletions rewrite files: for tables that readers without deletion
    vector support open."""
    rewrite_copy_rows: int = 4_000_000
    """For deletions the driver does not mark (counted by Spark, candidate files over
    ``driver_rewrite_rows``, a table it cannot commit to): a rewrite that would copy this many
    untouched rows or more is a delta-spark MERGE by deletion vectors instead; ``0``: always.
    Below it Spark's rewrite measured faster (a MERGE scans the table: BENCHMARKS.md,
    "Readable tables")."""
    per_row_prune_files: int = 8
    """When the deleted rows' range still overlaps this many files, find the files row by row."""
    prune_columns: int = 8
    """How many leading columns a deletion uses to find the table's files that may hold it,
    by their min/max statistics."""
    broadcast_deletes: int = 1_000_000
    """Up to this many deleted rows, Spark's rewrite ships them to every task (no shuffle of
    the table's rows); beyond, it joins by sorting both sides."""

    def __post_init__(self) -> None:
        for name in _POSITIVE:
            if getattr(self, name) <= 0:
                raise ConfigError(f"policy.{name} must be > 0, not {getattr(self, name)}")

    @classmethod
    def spark_only(cls, **changes: Any) -> Policy:
        """Every step on Spark: no driver computation, write, state, sort, build or lookup."""
        return cls(
            driver=False,
            driver_change_rows=0,
            driver_state_rows=0,
            driver_build_rows=0,
            driver_sort_rows=0,
            driver_lookup_rows=0,
            driver_rewrite_rows=0,
            driver_insert_bytes=0,
            **changes,
        )

    @classmethod
    def from_config(cls, table: Mapping[str, Any], where: str = "[policy]") -> Policy:
        """A policy from ``ivm.toml``'s ``[policy]`` table: unknown keys and wrong types are
        :class:`ConfigError` naming the key."""
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in table.items():
            f = known.get(key)
            if f is None:
                raise ConfigError(
                    f"{where}: unknown policy setting {key!r}; known: {', '.join(sorted(known))}"
                )
            want = bool if f.type in ("bool", bool) else int
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise ConfigError(f"{where}: {key} must be {want.__name__}, not {value!r}")
            if want is int and value < 0:
                raise ConfigError(f"{where}: {key} must be >= 0, not {value}")
            values[key] = value
        try:
            return cls(**values)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None

    def replace(self, **changes: Any) -> Policy:
        return dataclasses.replace(self, **changes)

    def place(self, root: Node, change_rows: int, *, build: bool = False) -> Placement:
        """Where a refresh of the view ``root`` computes its updates, decided before it runs
        from its inputs' change (``change_rows`` updates, from the change feeds' and log files'
        row counts) and what the driver's renderers compute of its plan, known from the plan
        alone (:func:`ivm.plan.driver.driver_support`: nodes, expressions, aggregates).

        ``driver``: the driver renders the whole change in Arrow; what it finds only from the
        column types or the rows (a lookup or state read past ``driver_state_rows``, a decimal
        past Arrow's digits, non-ASCII text under UPPER) it hands to Spark before writing
        anything, and the refresh records why (``ops.declines``).
        ``spark``: Spark renders it (the inner joins under its reductions still by the driver
        when the change is small). ``build``: a first build reads its inputs whole: Spark."""
        limit = self.driver_change_rows
        if build:
            return Placement("spark", "a first build reads every row of its inputs")
        if not self.driver:
            return Placement("spark", "the driver is off: policy.driver = false")
        if change_rows > limit:
            return Placement(
                "spark", f"{change_rows:,} input updates > driver_change_rows = {limit:,}"
            )
        unsupported = driver_support(root)
        if unsupported is not None:
            return Placement("spark", f"{unsupported}; {change_rows:,} input updates", small=True)
        return Placement(
            "driver", f"{change_rows:,} input updates <= driver_change_rows = {limit:,}", True
        )

    def describe(self, root: Node) -> str:
        """Where the view ``root``'s refreshes run under this policy, for EXPLAIN."""
        if not self.driver:
            return "Spark (policy.driver = false)"
        unsupported = driver_support(root)
        if unsupported is not None:
            return f"Spark ({unsupported})"
        return (
            f"the driver (Arrow) when its inputs change by at most {self.driver_change_rows:,} "
            "updates (policy.driver_change_rows), else Spark"
        )


_POSITIVE = (
    "arrangement_file_rows",
    "row_group_bytes",
    "page_rows",
    "page_bytes",
    "pushdown_keys",
    "push_ratio",
    "ordered_max_files",
    "table_file_rows",
    "prune_columns",
)
"""Sizes that are divisors or batch sizes: 0 would not turn a path off, it would break it."""


@dataclass(frozen=True)
class Placement:
    """Where one refresh of a view computes its updates, and why (shown by ``ivm refresh``,
    recorded on the view's result and its Dagster materialization)."""

    where: str
    """``driver`` or ``spark``."""
    reason: str
    small: bool = False
    """The change is small (at most ``driver_change_rows``): what it causes is written by the
    driver, and the inner joins under Spark's reductions are computed by the driver."""

    def __str__(self) -> str:
        return f"{self.where} ({self.reason})"


_lock = threading.Lock()
_current = Policy()


def current() -> Policy:
    """The policy in force in this process."""
    return _current


def install(policy: Policy) -> Policy:
    """Put ``policy`` in force for the whole process (every thread); returns the previous."""
    global _current
    with _lock:
        previous, _current = _current, policy
    return previous


@contextmanager
def using(policy: Policy | None = None, **changes: Any) -> Iterator[Policy]:
    """``policy`` (default: the current one) with ``changes``, in force inside the block."""
    chosen = (policy or current()).replace(**changes)
    previous = install(chosen)
    try:
        yield chosen
    finally:
        install(previous)
