"""Epochs and the sizes of what changed in them.

*Minting* epoch ``e`` records, per source, the version range ``(lower, upper]`` it covers; the
record is committed before any view reads it and never changes. A view's *target* is the
latest epoch, bounded by its upstream views' epochs. The sizes here (a collection's updates in
``(done, target]``, from change feeds and Delta statistics, no Spark job) are what the policy
decides with before a refresh runs.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.catalog import Catalog
from engine.session import Session
from ivm import policy
from ivm.errors import SourceError
from ivm.plan.planner import ViewPlan
from ops.ingest import log_files_between, source_change_cancels, source_change_rows, source_rows
from resources.lake import EpochRecord, append_epoch, now_utc


class Epochs:
    """Minting epochs, and what changed between two of them (see the module)."""

    def __init__(self, catalog: Catalog, session: Session) -> None:
        self.catalog = catalog
        self.session = session

    def source_versions(self) -> dict[str, int]:
        return {name: s.version() for name, s in self.catalog.sources.items()}

    def pending_changes(self, *, allow_reset: bool = False) -> dict[str, tuple[int | None, int]]:
        """Sources whose current version is past the last epoch: name -> (recorded, current).

        Raises:
            SourceError: a source's version went backwards, unless ``allow_reset``.
        """
        epochs = self.catalog.epochs()
        last = epochs[-1].ranges if epochs else {}
        out: dict[str, tuple[int | None, int]] = {}
        for name, version in self.source_versions().items():
            recorded = last.get(name, (None, None))[1] if name in last else None
            if recorded is None or version > recorded:
                out[name] = (recorded, version)
            elif version < recorded and allow_reset:
                out[name] = (recorded, version)
            elif version < recorded:
                raise SourceError(
                    f"source {name!r} ({self.catalog.project.sources[name]}) is at version "
                    f"{version}, older than version {recorded} already consumed: was it "
                    "re-created or restored? Rebuild with `ivm refresh --rebuild`"
                )
        return out

    def mint(self, *, force: bool = False) -> EpochRecord | None:
        """Record a new epoch if any source advanced (or is new); None when nothing changed.

        Args:
            force: mint one even if no source changed (a rebuild needs a new epoch to write
                at). A source whose version went backwards (re-created, restored) then
                re-enters from its snapshot instead of raising.
        """
        while True:
            epochs = self.catalog.epochs()
            last = epochs[-1] if epochs else None
            pending = self.pending_changes(allow_reset=force)
            if not pending and not (force and last is not None):
                return None
            record = EpochRecord((last.epoch if last else 0) + 1, self._ranges(last), now_utc())
            if append_epoch(self.catalog.layout, record):
                changed = ", ".join(
                    f"{s} {'new' if lo is None else lo}->{up}"
                    for s, (lo, up) in record.ranges.items()
                    if lo != up
                )
                self.catalog.progress(
                    f"epoch {record.epoch} minted ({changed or 'no source changed: for rebuilds'})"
                )
                return record
            # Another refresher minted this epoch first: look again.

    def _ranges(self, last: EpochRecord | None) -> dict[str, tuple[int | None, int]]:
        """Each source's version range for the epoch after ``last``."""
        ranges: dict[str, tuple[int | None, int]] = {}
        for name, version in self.source_versions().items():
            prev = last.ranges.get(name) if last else None
            lower = prev[1] if prev else None
            ranges[name] = (None if lower is not None and version < lower else lower, version)
        for name in self.catalog.broken_sources:  # unreadable now: no change until it is back
            if last is not None and name in last.ranges:
                ranges[name] = (last.ranges[name][1], last.ranges[name][1])
        return ranges

    def target(self, view: ViewPlan) -> int:
        """The newest epoch a view can reach: the latest epoch, bounded by its input views."""
        cat = self.catalog
        target = cat.latest_epoch()
        for upstream in view.view_inputs:
            target = min(target, cat.table_epoch(cat.layout.view_table(upstream)))
        return target

    # -- sizes ------------------------------------------------------------------------------

    def change_rows(self, coll: str, done: int, target: int) -> int:
        """How many updates a collection gives in ``(done, target]``, at most: a source's
        change feed rows (read now if no reader has yet; it is kept for the refresh) or its
        appended files' rows; a view's rows in the diff-log files that may hold updates in
        the range. From file statistics and the kept feeds: no Spark job."""
        cat = self.catalog
        if coll in cat.plan.views:
            log_uri = cat.layout.view_log(coll)
            return sum(f.num_records or 0 for f in log_files_between(log_uri, done, target))
        epochs = cat.epoch_map()
        changed = 0
        for e in range(done + 1, target + 1):
            rng = epochs[e].ranges.get(coll)  # missing: the refresh itself says so
            if rng is not None and rng[0] != rng[1]:
                changed += source_change_rows(
                    self.session.spark, cat.sources[coll], rng[0], rng[1], e
                )
        return changed

    def small_change(self, colls: Iterable[str], done: int, target: int) -> bool:
        """Whether ``colls`` give at most ``policy.driver_change_rows`` updates in
        ``(done, target]`` (``done`` > 0: a refresh, not a build): what they cause is then
        written by the driver."""
        limit = policy.current().driver_change_rows
        return done > 0 and sum(self.change_rows(c, done, target) for c in colls) <= limit

    def input_change(self, plan: ViewPlan, done: int, target: int) -> tuple[int, int]:
        """How many updates a view's inputs give in ``(done, target]``, and how many rows they
        hold at ``target`` (from file statistics and the kept change feeds)."""
        cat = self.catalog
        epochs = cat.epoch_map()
        changed = sum(self.change_rows(coll, done, target) for coll in plan.inputs)
        total = 0
        for coll in plan.source_inputs:
            total += source_rows(cat.sources[coll], epochs[target].ranges[coll][1])
        for coll in plan.view_inputs:
            total += cat.rows_hint(coll) or 0
        return changed, total

    def recompute_reason(self, plan: ViewPlan, done: int, target: int) -> str | None:
        """Why this refresh should recompute the view rather than apply its inputs' changes:
        more than ``[refresh] recompute_above`` of their rows changed (and at least
        ``policy.recompute_min_rows``), or None."""
        share_limit = self.catalog.project.recompute_above
        if share_limit >= 1:
            return None
        changed, total = self.input_change(plan, done, target)
        if changed < policy.current().recompute_min_rows or changed <= share_limit * total:
            return None
        return (
            f"{changed:,} updates to its inputs' {total:,} rows ({changed / max(total, 1):.1%}) "
            f"exceed [refresh] recompute_above = {share_limit:g}"
        )

    def unchanged_inputs(self, plan: ViewPlan, done: int, target: int) -> frozenset[str]:
        """The collections a view reads whose updates in ``(done, target]`` change nothing it
        sees, known on the driver without Spark: a source that kept its version, or whose
        change feed only rewrote columns the view does not read (nor its contract checks) or
        undid itself; a view that logged no update. A delta join skips their paths; a view
        all of whose inputs are here only moves its epoch."""
        cat = self.catalog
        out = {s for s in plan.source_inputs if self._source_unchanged(plan, s, done, target)}
        out.update(
            v
            for v in plan.view_inputs
            if not log_files_between(cat.layout.view_log(v), done, target)
        )
        return frozenset(out)

    def _source_unchanged(self, plan: ViewPlan, source: str, done: int, target: int) -> bool:
        cat = self.catalog
        epochs = cat.epoch_map()
        columns = cat.columns_read(plan, source)
        for e in range(done + 1, target + 1):
            rng = epochs[e].ranges.get(source) if e in epochs else None
            if rng is None or rng[0] is None or source not in cat.sources:
                return False
            if rng[0] != rng[1] and not source_change_cancels(
                self.session.spark, cat.sources[source], rng[0], rng[1], e, columns
            ):
                return False
        return True
