"""A whole refresh: mint an epoch, quarantine contract-breaking rows, then refresh the chosen
views in dependency order, up to ``[refresh] parallelism`` at once (threads sharing the Spark
session), the heads of the longest chains of expected work first.

Contract in ``(data, time, diff)`` terms: a view starts only once every selected view it reads
has reached its epoch (it reads their logs up to it); a view whose input failed is skipped,
never fed partial updates.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from engine.catalog import Catalog
from engine.definitions import Definitions
from engine.epochs import Epochs
from engine.quarantine import Quarantine
from engine.refresh import REFRESH_SECONDS, ViewRefresh
from engine.results import RefreshReport, ViewResult
from engine.session import Session
from ivm.errors import IvmError, UpstreamBroken
from ivm.plan.planner import ViewPlan
from resources.lake import last_commit_metadata


def costliest_first(
    order: Sequence[str], inputs: Mapping[str, Iterable[str]], seconds: Mapping[str, float]
) -> list[str]:
    """``order`` (a dependency order) re-ranked so that the views on the longest chains start
    first: a view's rank is its own expected seconds plus the largest rank among the views
    reading it. Still a dependency order (a view ranks at least as high as its readers; ties
    keep ``order``), so a refresh running several views at once does not leave its costliest
    view, or the head of a long chain, for last."""
    readers: dict[str, list[str]] = {n: [] for n in order}
    for name in order:
        for up in inputs.get(name, ()):
            if up in readers:
                readers[up].append(name)
    rank: dict[str, float] = {}
    for name in reversed(order):
        rank[name] = seconds.get(name, 0.0) + max((rank[r] for r in readers[name]), default=0.0)
    return sorted(order, key=lambda n: -rank[n])


class Scheduler:
    """Refreshing many views (see the module)."""

    def __init__(
        self,
        catalog: Catalog,
        session: Session,
        epochs: Epochs,
        definitions: Definitions,
        quarantine: Quarantine,
        views: ViewRefresh,
    ) -> None:
        self.catalog = catalog
        self.session = session
        self.epochs = epochs
        self.definitions = definitions
        self.quarantine = quarantine
        self.views = views
        self.last_refresh_seconds: Callable[[str], float] = self._last_refresh_seconds

    def refresh(
        self,
        views: Iterable[str] | None = None,
        *,
        mint: bool = True,
        rebuild: bool | Iterable[str] = False,
    ) -> RefreshReport:
        """Mint an epoch if sources changed, then bring views (default: all) up to it; see
        :meth:`engine.Engine.refresh`."""
        started = time.perf_counter()
        cat = self.catalog
        plan = cat.plan  # plan first: invalid SQL must fail before anything is written
        if views is None:
            names, unplanned = list(plan.order), sorted(plan.broken)
        else:
            wanted = [v.lower() for v in views]
            unplanned = [v for v in wanted if v in plan.broken]
            names = [cat.view(v).name for v in wanted if v not in plan.broken]
            names += [i for n in list(names) for i in plan.internal_inputs(n) if i not in names]
        if unplanned and not names:  # nothing to refresh: the error itself, nothing written
            raise plan.broken[unplanned[0]]
        asked = set(names) if rebuild is True else {cat.view(v).name for v in (rebuild or [])}
        needs = {n for n in names if n in asked or self.definitions.rebuild_reason(n)}
        with self.session.job_group("epoch", "ivm: mint an epoch, quarantine"):
            minted = self.epochs.mint(force=bool(needs)) if mint else None
            quarantined = self.quarantine.run()
        chosen = set(names)
        arrangements = self.views.compute.arrangements
        arrangements.rebuilding = frozenset(
            k for k, a in plan.arrangements.items() if asked and set(a.users) <= asked
        )
        try:
            results = self._refresh_views([n for n in plan.order if n in chosen], asked)
        finally:
            arrangements.rebuilding = frozenset()
        for name in unplanned:
            error = plan.broken[name]
            status = "skipped" if isinstance(error, UpstreamBroken) else "failed"
            results.append(ViewResult(name, 0, 0, status=status, error=str(error)))
            cat.progress(f"{name}: {status.upper()}: {error}")
        return RefreshReport(minted, results, time.perf_counter() - started, quarantined)

    def _refresh_views(self, order: list[str], asked: set[str]) -> list[ViewResult]:
        """Refresh ``order`` (dependency order) with up to ``parallelism`` views at once.

        A view starts once every selected view it reads has finished, the views on the
        longest chains of expected work first (:func:`costliest_first`, from the seconds each
        view's last refresh took; a first build has none and keeps ``order``); if one of those it
        reads failed it is skipped. An error that is not an :class:`IvmError` (a bug, a lost
        Spark) stops new starts and is raised once the running views end.
        """
        views = self.catalog.plan.views
        parallelism = self.catalog.project.parallelism
        pending = costliest_first(
            order,
            {n: views[n].view_inputs for n in order},
            {n: self.last_refresh_seconds(n) for n in order},
        )
        run = _Run(set(order), pending)
        with ThreadPoolExecutor(parallelism, thread_name_prefix="ivm") as pool:
            while (run.pending and run.unexpected is None) or run.running:
                for name in run.ready(views, parallelism, self.catalog.progress):
                    future = pool.submit(self.views.refresh_view, name, rebuild=name in asked)
                    run.running[future] = name
                if run.running:
                    run.collect(self.catalog.progress)
        if run.unexpected is not None:
            raise run.unexpected
        return [run.results[n] for n in order if n in run.results]

    def _last_refresh_seconds(self, name: str) -> float:
        """How long the view's last refresh took until its table commit (0 if unknown)."""
        info = last_commit_metadata(self.catalog.layout.view_table(name), REFRESH_SECONDS)
        try:
            return float(info[REFRESH_SECONDS]) if info else 0.0
        except ValueError:  # written by hand or by another tool: no estimate
            return 0.0


class _Run:
    """The views of one refresh: pending, running, finished and failed."""

    def __init__(self, selected: set[str], pending: list[str]) -> None:
        self.selected = selected
        self.pending = pending
        self.running: dict[Future, str] = {}
        self.results: dict[str, ViewResult] = {}
        self.failed: dict[str, str] = {}
        self.unexpected: BaseException | None = None

    def ready(
        self, views: Mapping[str, ViewPlan], parallelism: int, progress: Callable[[str], None]
    ) -> list[str]:
        """The pending views to start now, best first, taken off ``pending``: those whose
        selected inputs are done, while fewer than ``parallelism`` run. A view reading one
        that failed is skipped (recorded, not started)."""
        if self.unexpected is not None:
            return []
        out: list[str] = []
        busy = set(self.running.values())
        for name in list(self.pending):
            if len(self.running) + len(out) >= parallelism:
                break  # queue nothing: a view that becomes ready may rank higher
            ups = [u for u in views[name].view_inputs if u in self.selected]
            if any(u in busy or u in self.pending for u in ups):
                continue
            self.pending.remove(name)
            blocked = [u for u in ups if u in self.failed]
            if blocked:
                r = ViewResult(name, 0, 0, status="skipped")
                r.error = f"waits for view {blocked[0]!r}, which failed"
                self.failed[name] = r.error
                self.results[name] = r
                progress(f"{name}: skipped ({r.error})")
                continue
            busy.add(name)
            out.append(name)
        return out

    def collect(self, progress: Callable[[str], None]) -> None:
        """Wait for a running view to finish and record its result."""
        finished, _ = wait(self.running, return_when=FIRST_COMPLETED)
        for future in finished:
            name = self.running.pop(future)
            try:
                self.results[name] = future.result()
            except IvmError as e:
                self.failed[name] = str(e)
                self.results[name] = ViewResult(name, 0, 0, status="failed", error=str(e))
                progress(f"{name}: FAILED: {e}")
            except BaseException as e:  # noqa: BLE001 - re-raised by the caller, once
                self.unexpected = self.unexpected or e
