"""Benchmarks: incremental refresh against full recompute (Spark and DuckDB), side by side.

``./dev bench`` (or ``python -m bench``) first runs every step below once at SF 0.01,
unmeasured (``--warm-up-scale``: a JVM's first queries and a process's first refresh pay
one-time costs), then, for each TPC-H scale factor:

1. ``tpchgen-cli`` data as Delta sources with CDF, a project with the demo's views (joins,
   accumulable and hierarchical aggregates, top-k, DISTINCT counts, views over views);
2. the initial build (every view from the sources' snapshots);
3. ``--runs`` times: a TPC-H change batch (RF1 new orders with their line items, RF2 deletes of
   orders with theirs, updates; ``--change`` of the orders per kind), then, in the same warm
   Spark session, the incremental refresh, Spark recomputing every view's SQL from scratch
   (result written as Parquet, as a full-refresh pipeline would) and DuckDB recomputing it
   over the same source versions (read with delta-rs);
4. the Spark jobs each way ran (a refresh's fixed cost is mostly its jobs' latency); the rows
   each way's Parquet scans returned (Spark's scan metrics, :mod:`bench.scans`: the refresh's
   by part of the lake, against the full recompute's) and the rows in the arrangement and
   state files each refresh opened; stored bytes against the raw
   Parquet bytes of the same columns, before and after ``ivm compact``; at SF1 (else the
   largest scale), the latency from a source commit to all views committed through the
   Dagster sensor, with the run in process, in a fresh process with its own JVM, and in a
   fresh process on a warm Spark Connect server (the two ways a deployment can run it).

Every scale gets the same absolute change: ``--change`` of SF1's orders per kind (the issue's
"size of SF1's 0.1% batch"), so SF0.1 changes 1% of its orders and SF3 0.033%.

``--sweep`` varies the change size at one scale factor to find where incremental stops
winning. Results: ``BENCHMARKS.md`` (medians, ratios) and ``bench/refresh_vs_scale.png``.
Timings are wall-clock on a shared machine: compare ratios measured in the same run.

The report replaces what lies above :data:`HAND_KEPT` in ``BENCHMARKS.md``; the marker line and
everything after it (measurements kept by hand) are written back as they are. An existing
report without the marker stops the bench before it runs (:func:`hand_kept`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ivm.config import DEFAULT_PARALLELISM
from ops.sink import Strategy

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORK = HERE / "work"
REFERENCE_SCALE = 1.0
"""The scale whose ``--change`` share sets the absolute change every scale applies."""
WARM_UP_SCALE = 0.01
"""The scale factor of the unmeasured run that warms the session up first (:func:`warm_up`)."""
HAND_KEPT = "<!-- hand-kept measurements below: ./dev bench keeps them -->"
"""The line of ``BENCHMARKS.md`` below which the bench never writes: the generated report goes
above it, the line and what follows it are kept."""


def say(msg: str = "") -> None:
    print(msg, flush=True)


@dataclass
class Point:
    """One change batch at one scale: the three ways of bringing the views up to date."""

    scale: float
    change: float
    incremental: float
    spark_full: float
    duckdb_full: float
    rows_opened: int = 0
    rows_total: int = 0
    batch: str = ""
    recompute: float = 0.0  # sweep: every view recomputed from its inputs' state
    auto: float = 0.0  # sweep: the engine's rule (recompute_above) chose per view
    share: float = 0.0  # sweep: input updates / input rows, largest over the views
    recomputed: int = 0  # sweep: views the rule recomputed
    spark_jobs: int = 0  # Spark jobs the incremental refresh ran (summed over the views)
    full_jobs: int = 0  # Spark jobs of the Spark full recompute
    read: dict[str, int] = field(default_factory=dict)  # incremental: rows scanned per area
    in_memory: int = 0  # incremental: rows its lookups probed in the driver's memory
    full_read: int = 0  # rows the Spark full recompute scanned
    views: dict[str, dict[str, float]] = field(default_factory=dict)  # incremental, per view

    @property
    def scanned(self) -> int:
        """Rows the incremental refresh's scans returned, all areas."""
        return sum(self.read.values())


@dataclass
class ScaleResult:
    scale: float
    build: float
    change: float = 0.0
    points: list[Point] = field(default_factory=list)
    storage: dict[str, list[dict]] = field(default_factory=dict)  # before/after compaction
    compact_seconds: float = 0.0
    sensor: dict[str, dict[str, float]] = field(default_factory=dict)
    checked: int = 0  # views found equal to DuckDB's result after the runs

    def median(self, attr: str) -> float:
        return statistics.median(getattr(p, attr) for p in self.points)


def sensor_latency(
    config: Path, sources, change: float, seed: int, connect_url: str
) -> dict[str, dict[str, float]]:
    """From a source commit to every view committed, through the Dagster sensor, three ways:
    one tick evaluated right after the commit, then the run it requests, executed

    - ``warm``: in process (the bench's warm Spark session), the floor;
    - ``fresh``: in a new process (``dagster job execute``), as a deployed Dagster's run
      launcher starts every run: Python, Dagster and a Spark JVM start, and the refresh runs
      on a cold JVM (its code not yet compiled);
    - ``server``: in a new process as well, but a Spark Connect client (``SPARK_REMOTE``) of
      a long-lived server, here the bench's own warm session (``ivm spark-server`` deployed).

    A deployed sensor adds up to its polling interval. Each way applies its own batch."""
    import dagster as dg

    from dagster_project.definitions import build_definitions
    from dagster_project.jobs import REFRESH_JOB
    from demo.tpch import apply_change_batch

    defs = build_definitions(config)
    sensor = defs.get_sensor_def("ivm_source_versions")
    instance = dg.DagsterInstance.ephemeral()
    interval = float(sensor.minimum_interval_seconds or 30)
    out = {}
    for way in SENSOR_WAYS:
        before = _engine(config).latest_epoch()  # read before the clock starts
        apply_change_batch(sources, change, seed=seed + len(out))
        committed = time.perf_counter()
        result = sensor(dg.build_sensor_context(instance=instance, definitions=defs))
        (request,) = result.run_requests
        requested = time.perf_counter()
        tags = {**request.tags, "dagster/run_key": request.run_key}
        if way == "warm":
            run = defs.resolve_job_def(REFRESH_JOB).execute_in_process(instance=instance, tags=tags)
            if not run.success:
                raise SystemExit("the sensor's run failed")
        else:
            _run_in_fresh_process(
                config, REFRESH_JOB, tags, connect_url if way == "server" else None
            )
        done = time.perf_counter()
        _check_all_views_at(config, before + 1)
        out[way] = {
            "tick": requested - committed,
            "run": done - requested,
            "total": done - committed,
            "interval": interval,
        }
    return out


SENSOR_WAYS = {
    "warm": "in process, warm",
    "fresh": "fresh process, its own JVM",
    "server": "fresh process, warm Spark Connect server",
}
"""How the sensor's run is executed (see :func:`sensor_latency`), as BENCHMARKS.md names them."""


def _run_in_fresh_process(
    config: Path, job: str, tags: dict[str, str], remote: str | None = None
) -> None:
    """``dagster job execute`` of the code location's ``job`` on the project ``config``, in a
    new process with a Dagster instance of its own; a Spark Connect client of ``remote`` if
    given, else with a JVM of its own."""
    from ivm.config import CONFIG_ENV

    with tempfile.TemporaryDirectory(prefix="ivm-bench-dagster-") as home:
        env = {**os.environ, CONFIG_ENV: str(config), "DAGSTER_HOME": home}
        env.pop("SPARK_REMOTE", None)
        if remote is not None:
            env["SPARK_REMOTE"] = remote
        cmd = [
            sys.executable, "-m", "dagster", "job", "execute",
            "-m", "dagster_project.definitions", "-j", job, "--tags", json.dumps(tags),
        ]  # fmt: skip
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr)[-4000:]
        raise SystemExit(f"the sensor's run failed in a fresh process:\n{output}")


def _engine(config: Path):  # -> Engine (no Spark: it reads the Delta logs only)
    """A fresh engine on the project ``config``: it sees what another process committed."""
    from engine.facade import Engine
    from ivm.config import load_project

    return Engine(load_project(config))


def _check_all_views_at(config: Path, epoch: int) -> None:
    """Stop the bench unless the latest epoch is ``epoch`` and every view reached it."""
    status = _engine(config).status()
    behind = {v: s["epoch"] for v, s in status["views"].items() if s["epoch"] != epoch}
    if status["epoch"] != epoch or behind:
        raise SystemExit(
            f"the sensor's run left epoch {status['epoch']} (expected {epoch}), "
            f"views behind: {behind}"
        )


def storage_totals(rows: list[dict]) -> dict[str, tuple[int, int]]:
    """Stored and raw bytes summed over arrangements and over views (see engine.compact)."""
    out: dict[str, tuple[int, int]] = {}
    for kind in ("arrangement", "view"):
        mine = [r for r in rows if r["what"].startswith(kind + " ")]
        out[kind] = (sum(r["stored_bytes"] for r in mine), sum(r["raw_bytes"] for r in mine))
    return out


def spark_full_recompute(engine, out: Path, views: list[str] | None = None) -> tuple[float, int]:
    """Every view's SQL (or ``views``') from scratch with Spark at the latest epoch, written as
    Parquet: the seconds it took and the Spark jobs it ran."""
    from resources.spark import OPTIMIZER_EXCLUDED_RULES, RUNTIME_BLOOM_FILTER, JobGroup

    epoch = engine.latest_epoch()
    conf = engine.spark.conf
    # Spark's own defaults for the optimizer settings the engine changes for small changes:
    # runtime Bloom filters may help a full recompute.
    ours = {key: conf.get(key, None) for key in (RUNTIME_BLOOM_FILTER, OPTIMIZER_EXCLUDED_RULES)}
    for key in ours:
        conf.unset(key)
    jobs = JobGroup("bench full recompute", "bench: every view's SQL from scratch")
    jobs.open(engine.spark)
    try:
        started = time.perf_counter()
        for name in views or engine.plan.order:
            engine.from_scratch(name, epoch).write.mode("overwrite").parquet(str(out / name))
        seconds = time.perf_counter() - started
    finally:
        jobs.close(engine.spark)
        for key, value in ours.items():
            if value is not None:
                conf.set(key, value)
    return seconds, jobs.jobs


def duckdb_full_recompute(engine) -> float:
    from engine.oracle import duckdb_evaluate

    started = time.perf_counter()
    duckdb_evaluate(engine)
    return time.perf_counter() - started


def check_views(engine, where: str) -> int:
    """Every view's table and log against DuckDB over the same source versions: a benchmark
    of wrong answers measures nothing. Exits naming the first view that differs."""
    from engine.oracle import compare_views

    results = compare_views(engine)
    for c in results:
        if not c.equal:
            raise SystemExit(f"{where}: {c.describe()}")
    say(f"    {where}: all {len(results)} views equal DuckDB's result")
    return len(results)


def _view_costs(result) -> dict[str, float]:
    """One view's share of a refresh: its seconds (computing and logging its updates, then
    applying them to its readable table), Spark jobs, rows changed and table rows rewritten."""
    return {
        "seconds": result.seconds,
        "log": result.timings.get("log", 0.0),
        "table": result.timings.get("table", 0.0),
        "jobs": result.spark_jobs or 0,
        "changed": result.rows_changed,
        "rewritten": result.rows_rewritten,
        "written": result.inserted + result.rows_rewritten,
        "vectors": float(
            (result.table_write or "").startswith(
                (Strategy.DELETE_BY_VECTORS.value, Strategy.VECTORS_BY_DRIVER.value)
            )
        ),
    }


def _lookup_rows(report) -> tuple[int, int]:
    opened = total = 0
    for v in report.views:
        for st in v.lookups.values():
            opened += st.rows_in_opened_files
            total += st.rows_total
    return opened, total


def setup(scale: float):
    from demo.__main__ import write_project
    from demo.tpch import create_sources, generate_parquet

    work = WORK / f"sf{scale:g}"
    if work.exists():
        shutil.rmtree(work)
    parquet = generate_parquet(scale, WORK / f"tpch-sf{scale:g}")
    sources = create_sources(parquet, work / "project" / "data")
    config = write_project(work / "project", sources)
    return work, sources, config


def project(config: Path, parallelism: int, recompute_above: float = 1.0):
    """The benchmark project with ``parallelism`` views refreshed at once; by default never
    recomputing (the scale runs measure the incremental refresh itself)."""
    from dataclasses import replace

    from ivm.config import load_project

    return replace(load_project(config), parallelism=parallelism, recompute_above=recompute_above)


def run_scale(
    scale: float,
    runs: int,
    change: float,
    spark,
    *,
    parallelism: int,
    seed0: int = 1,
    sensor: str | None = None,
) -> ScaleResult:
    """One scale factor's build, batches, checks and storage; with ``sensor`` (the bench's
    Spark Connect address) also the sensor's latency."""
    from bench.scans import ScanRows
    from demo.tpch import apply_change_batch
    from engine.compact import compact, storage_report
    from engine.facade import Engine

    work, sources, config = setup(scale)
    engine = Engine(project(config, parallelism), spark=spark, progress=lambda m: None)
    scans = ScanRows(spark, engine.layout.root)
    started = time.perf_counter()
    report = engine.refresh()
    build = time.perf_counter() - started
    if not report.ok:
        raise SystemExit(f"build failed: {[v.error for v in report.views if v.error]}")
    say(f"  SF {scale:g}: initial build {build:.1f}s; batches of {change:.2%} of the orders")
    result = ScaleResult(scale, build, change)
    for run in range(runs):
        summary = apply_change_batch(sources, change, seed=seed0 + run)
        scans.mark()
        started = time.perf_counter()
        report = engine.refresh()
        inc = time.perf_counter() - started
        if not report.ok:
            raise SystemExit(f"refresh failed: {[v.error for v in report.views if v.error]}")
        read = scans.rows()
        scans.mark()
        full, full_jobs = spark_full_recompute(engine, work / "full")
        full_read = sum(scans.rows().values())
        duck = duckdb_full_recompute(engine)
        opened, total = _lookup_rows(report)
        jobs = sum(v.spark_jobs for v in report.views)
        point = Point(scale, change, inc, full, duck, opened, total, str(summary))
        point.spark_jobs, point.full_jobs = jobs, full_jobs
        point.read, point.full_read = dict(read), full_read
        point.in_memory = sum(st.rows_in_memory for v in report.views for st in v.lookups.values())
        point.views = {v.view: _view_costs(v) for v in report.views}
        result.points.append(point)
        say(
            f"    run {run + 1}: incremental {inc:.1f}s ({jobs} Spark jobs, "
            f"{sum(read.values()):,} rows scanned) | Spark full {full:.1f}s ({full_jobs} jobs, "
            f"{full_read:,} rows scanned) | DuckDB full {duck:.1f}s | rows in opened state "
            f"files {opened:,} of {total:,}"
        )
    result.checked = check_views(engine, f"SF {scale:g} after {runs} batches")
    result.storage["before"] = storage_report(engine)
    started = time.perf_counter()
    compact(engine, retention_hours=0)
    result.compact_seconds = time.perf_counter() - started
    result.storage["after"] = storage_report(engine)
    say(f"    compacted in {result.compact_seconds:.1f}s")
    check_views(engine, f"SF {scale:g} after compaction")
    if sensor:
        result.sensor = sensor_latency(config, sources, change, seed0 + runs, sensor)
        times = ", ".join(f"{result.sensor[w]['total']:.1f}s {SENSOR_WAYS[w]}" for w in SENSOR_WAYS)
        interval = result.sensor["warm"]["interval"]
        say(
            f"    sensor: source commit -> all views committed: {times} (+ up to the "
            f"{interval:.0f}s polling interval)"
        )
    return result


def warm_up(scale: float, change: float, spark, *, parallelism: int) -> None:
    """Run every measured step once at a small ``scale``, unmeasured, before the first scale
    factor: the engine's build and refresh, Spark's and DuckDB's full recomputes. A JVM's
    first queries compile and load classes, and the process's first refresh imports and
    plans; measured cold, they landed on SF 0.1 alone (its build 21.0s there against 9.5s
    once the session had run one, while the Spark full recompute measured after it was
    already warm)."""
    from demo.tpch import apply_change_batch
    from engine.facade import Engine

    started = time.perf_counter()
    work, sources, config = setup(scale)
    engine = Engine(project(config, parallelism), spark=spark, progress=lambda m: None)
    if not engine.refresh().ok:
        raise SystemExit(f"warm-up at SF {scale:g}: the build failed")
    apply_change_batch(sources, change, seed=0)
    if not engine.refresh().ok:
        raise SystemExit(f"warm-up at SF {scale:g}: the refresh failed")
    spark_full_recompute(engine, work / "full")
    duckdb_full_recompute(engine)
    shutil.rmtree(work)
    say(f"== warm-up at SF {scale:g} (not measured): {time.perf_counter() - started:.1f}s")


def sweep(scale: float, changes: list[float], spark, *, parallelism: int) -> list[Point]:
    """Per change size, three batches of that size: one applied incrementally, one with every
    view recomputed from its inputs' state, one left to the engine's rule
    (``recompute_above``, its default); then Spark and DuckDB from scratch."""
    from demo.tpch import apply_change_batch
    from engine.facade import Engine
    from ivm.config import DEFAULT_RECOMPUTE_ABOVE

    work, sources, config = setup(scale)
    engine = Engine(project(config, parallelism), spark=spark, progress=lambda m: None)
    ruled = Engine(
        project(config, parallelism, DEFAULT_RECOMPUTE_ABOVE), spark=spark, progress=lambda m: None
    )
    assert engine.refresh().ok
    points = []

    def timed(eng, **kwargs):
        started = time.perf_counter()
        report = eng.refresh(**kwargs)
        if not report.ok:
            raise SystemExit(f"refresh failed: {[v.error for v in report.views if v.error]}")
        return time.perf_counter() - started, report

    for i, change in enumerate(changes):
        apply_change_batch(sources, change, seed=100 + 3 * i)
        inc, report = timed(engine)
        opened, total = _lookup_rows(report)
        apply_change_batch(sources, change, seed=101 + 3 * i)
        recompute, _ = timed(engine, rebuild=True)
        apply_change_batch(sources, change, seed=102 + 3 * i)
        share = _input_share(ruled)
        auto, report = timed(ruled)
        recomputed = sum(v.status == "recomputed" for v in report.views)
        full, _ = spark_full_recompute(engine, work / "full")
        duck = duckdb_full_recompute(engine)
        points.append(
            Point(
                scale,
                change,
                inc,
                full,
                duck,
                opened,
                total,
                "",
                recompute,
                auto,
                share,
                recomputed,
            )
        )
        say(
            f"  sweep {change:.2%}: incremental {inc:.1f}s | recompute {recompute:.1f}s | "
            f"rule {auto:.1f}s ({recomputed} recomputed; inputs changed up to {share:.2%}) | "
            f"Spark full {full:.1f}s"
        )
    check_views(engine, f"sweep at SF {scale:g}")
    return points


def _input_share(engine) -> float:
    """The largest share of input rows changed over the views, for the next epoch."""
    shares = []
    done = engine.latest_epoch()
    pending = engine.pending_changes()
    if not pending:
        return 0.0
    engine.mint_epoch()
    target = engine.latest_epoch()
    for name in engine.plan.order:
        changed, total = engine.input_change(engine.view(name), done, target)
        shares.append(changed / max(total, 1))
    return max(shares)


def plot(results: list[ScaleResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scales = [r.scale for r in results]
    fig, ax = plt.subplots(figsize=(6, 4))
    for attr, label in (
        ("incremental", "incremental refresh"),
        ("spark_full", "Spark full recompute"),
        ("duckdb_full", "DuckDB full recompute"),
    ):
        ax.plot(scales, [r.median(attr) for r in results], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("TPC-H scale factor")
    ax.set_ylabel("seconds (median)")
    ax.set_title("Refreshing all demo views after the same absolute change")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_markdown(
    results: list[ScaleResult], swept: list[Point], args: argparse.Namespace, path: Path
) -> None:
    lines = [
        "# Benchmarks",
        "",
        f"Produced by `{' '.join(['./dev bench', *sys.argv[1:]])}` on this machine "
        "(2 cores, shared): wall-clock seconds, medians of "
        f"{args.runs} change batches per scale factor, all in one Spark session, warmed up "
        + (
            f"first by an unmeasured run of every step at SF {args.warm_up_scale:g}. "
            if args.warm_up_scale > 0
            else "by nothing (`--warm-up-scale 0`). "
        )
        + "The views "
        "are the demo's (`demo/views`: three-way joins, accumulable and MIN/MAX aggregates, "
        "COUNT(DISTINCT), global and per-group top-k, views over views). Each batch is TPC-H "
        f"RF1 + RF2 + updates of {args.change:.2%} of SF1's orders per kind. Refreshes run "
        f"up to {args.parallelism} views at once (`[refresh] parallelism`). After the runs "
        "(and again after compaction) every view's table and diff log was compared with "
        "DuckDB's result over the same source versions: "
        + ", ".join(f"SF {r.scale:g}: {r.checked} of {r.checked} equal" for r in results)
        + ".",
        "",
        "| SF | initial build | incremental | Spark full | DuckDB full | Spark full / incremental "
        "| Spark jobs: incremental / full | rows scanned: incremental / full "
        "| rows in opened state files |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        inc, full, duck = r.median("incremental"), r.median("spark_full"), r.median("duckdb_full")
        opened = statistics.median(p.rows_opened for p in r.points)
        total = statistics.median(p.rows_total for p in r.points)
        jobs = statistics.median(p.spark_jobs for p in r.points)
        full_jobs = statistics.median(p.full_jobs for p in r.points)
        scanned, full_scanned = r.median("scanned"), r.median("full_read")
        lines.append(
            f"| {r.scale:g} | {r.build:.1f} | {inc:.1f} | {full:.1f} | {duck:.1f} | "
            f"{full / inc:.2f}x | {jobs:,.0f} / {full_jobs:,.0f} | "
            f"{scanned:,.0f} / {full_scanned:,.0f} | {opened:,.0f} of {total:,.0f} |"
        )
    lines += [
        "",
        "Each run's seconds, in the order run (the machine is shared: the medians above are "
        "of these): "
        + "; ".join(
            f"SF {r.scale:g}: incremental {', '.join(f'{p.incremental:.1f}' for p in r.points)}"
            f", Spark full {', '.join(f'{p.spark_full:.1f}' for p in r.points)}"
            for r in results
        )
        + ".",
        "",
        "Every batch changes the same absolute number of orders at every scale (the size of "
        "SF1's batch), so the rows show how refresh time grows with the data "
        "for a fixed change. Batch sizes: "
        + ", ".join(f"SF {r.scale:g}: {r.change:.2%} of the orders" for r in results)
        + ".",
        "",
        *_scan_table(results),
        *_time_table(results),
        "Stored bytes after the runs, before and after `ivm compact` (arrangements: their bytes "
        "against the raw Parquet bytes of the same columns in their collection; views: table + "
        "diff log + state against the table; see `ivm compact`):",
        "",
        "| SF | arrangements stored / raw | ratio | after compact | views stored / table | "
        "ratio | after compact | compact time |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        mb = lambda b: f"{b / 1e6:.1f} MB"  # noqa: E731
        before, after = storage_totals(r.storage["before"]), storage_totals(r.storage["after"])
        cells = []
        for kind in ("arrangement", "view"):
            (sb, raw), (sa, _) = before[kind], after[kind]
            cells += [f"{mb(sb)} / {mb(raw)}", f"{sb / raw:.2f}x", f"{sa / raw:.2f}x"]
        lines.append(f"| {r.scale:g} | {' | '.join(cells)} | {r.compact_seconds:.1f}s |")
    with_sensor = [r for r in results if r.sensor]
    if with_sensor:
        lines += [
            "",
            "End-to-end latency through the Dagster sensor: one tick evaluated right after the "
            "source commit, then the run it requests, executed in the bench's warm Spark "
            "session (the floor), or in a fresh process (`dagster job execute`), as a deployed "
            "Dagster's run launcher starts every run: Python and Dagster start, and either a "
            "Spark JVM of its own, on which the refresh runs cold, or a Spark Connect client "
            "of a long-lived warm server (`ivm spark-server`; here the bench's session serves "
            "it). A deployed sensor adds up to its polling interval. Each way applies its own "
            "batch.",
            "",
            "| SF | run executed | tick | run | commit -> all views committed | polling interval |",
            "|---:|---|---:|---:|---:|---:|",
        ]
        for r in with_sensor:
            for way, label in SENSOR_WAYS.items():
                t = r.sensor[way]
                lines.append(
                    f"| {r.scale:g} | {label} | {t['tick']:.1f}s | {t['run']:.1f}s | "
                    f"{t['total']:.1f}s | {t['interval']:.0f}s |"
                )
    if swept:
        lines += [
            "",
            f"Change-size sweep at SF {swept[0].scale:g} (one batch each):",
            "",
            "Each change size is applied three times, as batches of the same size: refreshed "
            "incrementally, with every view recomputed from its inputs' state "
            "(`refresh --rebuild`), and by the engine's rule (`[refresh] recompute_above`, "
            "default), which recomputes the views whose input updates exceed that share of "
            "their input rows. *Input share* is the largest such share over the views.",
            "",
            "| change | input share | incremental | recompute | rule (views recomputed) "
            "| Spark full | DuckDB full | Spark full / incremental |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for p in swept:
            lines.append(
                f"| {p.change:.2%} | {p.share:.2%} | {p.incremental:.1f} | {p.recompute:.1f} | "
                f"{p.auto:.1f} ({p.recomputed}) | {p.spark_full:.1f} | {p.duckdb_full:.1f} | "
                f"{p.spark_full / p.incremental:.2f}x |"
            )
    lines += ["", "![refresh time against scale factor](bench/refresh_vs_scale.png)", ""]
    lines += targets(results, swept)
    kept = hand_kept(path)  # read now: sections appended while the bench ran are kept too
    path.write_text("\n".join(lines) + "\n" + kept)


def hand_kept(path: Path) -> str:
    """What the bench writes back below its report: the :data:`HAND_KEPT` line and everything
    after it in ``path`` as it is (the line alone when ``path`` does not exist).

    Raises:
        SystemExit: ``path`` exists without the marker line, so writing the report would lose
            whatever it holds besides the bench's own tables.
    """
    if not path.exists():
        return HAND_KEPT + "\n"
    lines = path.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.rstrip("\r\n") == HAND_KEPT:
            return "".join(lines[i:])
    raise SystemExit(
        f"{path} has no line {HAND_KEPT!r}: put it above the sections kept by hand "
        "(or remove the file), then run the bench again"
    )


def _scan_table(results: list[ScaleResult]) -> list[str]:
    """Rows scanned per refresh by part of the lake (medians), against the full recompute's."""
    from bench.scans import AREAS

    lines = [
        "Rows the Parquet scans returned (Spark's own scan metrics, after row-group and page "
        "skipping, before filters; `bench/scans.py`), medians per refresh: the incremental "
        "refresh by what it read (lookups in arrangements and state tables; readable tables "
        "rewritten where a deletion may hit them; diff logs applied to the tables; sources' "
        "appended files; change feeds come from the driver and are not scans; the rows the "
        "driver decodes itself, in the readable tables it rewrites, the row groups its "
        "read-once lookups open and the small state tables it reads, are counted with them), "
        "against Spark recomputing every view from the sources. Rows a lookup probes in the "
        "driver's memory (files an earlier lookup of the process decoded, `[refresh] cache_mb`) "
        "are read from no file; the last column counts the rows those probes visit (by binary "
        "search of each file's sorted key: the keys' rows, not the files'). Neither are the "
        "files of the readable tables the driver rewrites once it holds them (those it wrote "
        "the refresh before): their rows are in the per-view table below:",
        "",
        "| SF | "
        + " | ".join(AREAS)
        + " | incremental | Spark full | full / incremental | probed in memory |",
        "|---:|" + "---:|" * (len(AREAS) + 4),
    ]
    for r in results:
        cells = [statistics.median(p.read.get(a, 0) for p in r.points) for a in AREAS]
        inc, full = r.median("scanned"), r.median("full_read")
        lines.append(
            f"| {r.scale:g} | "
            + " | ".join(f"{c:,.0f}" for c in cells)
            + f" | {inc:,.0f} | {full:,.0f} | {full / inc if inc else 0:.1f}x"
            + f" | {r.median('in_memory'):,.0f} |"
        )
    return [*lines, ""]


def _time_table(results: list[ScaleResult]) -> list[str]:
    """Where a refresh's time goes, per view (medians over the runs at the reference scale),
    and at every scale the readable tables' part: the one that grows with the tables."""
    by = {r.scale: r for r in results}
    ref = by.get(REFERENCE_SCALE) or max(results, key=lambda r: r.scale)
    names = sorted({n for p in ref.points for n in p.views})

    def med(r: ScaleResult, name: str, key: str) -> float:
        return statistics.median(p.views.get(name, {}).get(key, 0.0) for p in r.points)

    lines = [
        f"Where an SF {ref.scale:g} refresh's time goes, per view (medians): its seconds (views "
        "run several at once on 2 cores, so they add up to more than the refresh), split into "
        "computing and logging its updates (*log*: lookups, state, the diff-log commit; "
        "arrangements it is the first to need) and applying them to its "
        "readable table (*table*: inserted rows appended; deleted rows marked in deletion "
        "vectors by the driver, or by one delta-spark MERGE for changes it does not count, or "
        "rewritten where vectors are off), with the rows it changed, "
        "the rows written that it did not insert (rewritten files' rows) and the share of "
        "refreshes whose deletions went to deletion vectors:",
        "",
        "| view | seconds | log | table | Spark jobs | rows changed | table rows rewritten "
        "| by vectors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in names:
        lines.append(
            f"| {n} | {med(ref, n, 'seconds'):.2f} | {med(ref, n, 'log'):.2f} | "
            f"{med(ref, n, 'table'):.2f} | {med(ref, n, 'jobs'):,.0f} | "
            f"{med(ref, n, 'changed'):,.0f} | {med(ref, n, 'rewritten'):,.0f} | "
            f"{statistics.mean(p.views.get(n, {}).get('vectors', 0.0) for p in ref.points):.0%} |"
        )
    lines += [
        "",
        "The readable tables' part at each scale (medians per refresh): seconds spent applying "
        "the views' updates to their tables against all view-seconds, and rows written "
        "(inserted and rewritten) against rows changed:",
        "",
        "| SF | table seconds / view seconds | share | table rows written | of which rewritten "
        "| rows changed | written / changed |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        table, total = _views_total(r, "table"), _views_total(r, "seconds")
        changed = _views_total(r, "changed")
        written = _views_total(r, "written")
        lines.append(
            f"| {r.scale:g} | {table:.1f} / {total:.1f} | {table / total if total else 0:.0%} | "
            f"{written:,.0f} | {_views_total(r, 'rewritten'):,.0f} | {changed:,.0f} | "
            f"{written / changed if changed else 0:.1f} |"
        )
    return [*lines, ""]


def _views_total(r: ScaleResult, key: str) -> float:
    """A per-view figure (:func:`_view_costs`) summed over the views, median over the runs."""
    return statistics.median(sum(v[key] for v in p.views.values()) for p in r.points)


def _refresh_gap(r: ScaleResult) -> str:
    """What stands between a scale's refresh and 10x Spark's full recompute, from its runs."""
    table, total = _views_total(r, "table"), _views_total(r, "seconds")
    jobs, full_jobs = r.median("spark_jobs"), r.median("full_jobs")
    full, inc = r.median("spark_full"), r.median("incremental")
    return (
        f"What stands between the SF {r.scale:g} refresh and 10x: 10x means "
        f"{full / 10:.1f}s for every view, and the refresh runs {jobs:,.0f} Spark jobs "
        f"(the full recompute {full_jobs:,.0f}), {1000 * inc / jobs if jobs else 0:.0f} ms of "
        f"its wall time per job, and they scan {r.median('scanned'):,.0f} rows against the "
        f"full recompute's {r.median('full_read'):,.0f}; and "
        f"{table / total if total else 0:.0%} of "
        f"the views' seconds go to applying their changes to the readable tables "
        f"({_views_total(r, 'rewritten'):,.0f} rows rewritten per refresh; deletions are "
        "marked in deletion vectors by the driver: `python -m bench.sink`)."
    )


def targets(results: list[ScaleResult], swept: list[Point]) -> list[str]:
    """Where the issue's targets stand, computed from this run."""
    by = {r.scale: r for r in results}
    out = ["## Targets", "", "| target | measured | met |", "|---|---|---|"]
    gap = None
    if 1.0 in by:
        r = by[1.0]
        ratio = r.median("spark_full") / r.median("incremental")
        out.append(
            f"| SF1, 0.1% change: incremental >= 10x faster than Spark full | "
            f"{ratio:.2f}x | {'yes' if ratio >= 10 else 'no'} |"
        )
        if ratio < 10:
            gap = _refresh_gap(r)
        build = r.build / r.median("spark_full")
        out.append(
            f"| SF1 initial build <= 2x Spark full recompute | {build:.1f}x | "
            f"{'yes' if build <= 2 else 'no'} |"
        )
    base = by.get(0.1)
    for r in results if base is not None else []:
        if r.scale <= base.scale:
            continue
        growth = r.median("incremental") / base.median("incremental")
        full = r.median("spark_full") / base.median("spark_full")
        same = abs(r.change * r.scale - base.change * base.scale) < 1e-12
        out.append(
            f"| incremental time SF0.1 -> SF{r.scale:g} grows <= 1.5x for the same absolute "
            f"change (full recompute: {full:.1f}x) | {growth:.2f}x | "
            f"{'yes' if growth <= 1.5 else 'no'}{'' if same else ' (not the same change)'} |"
        )
    for r in results:
        (stored, raw), (after, _) = (
            storage_totals(r.storage["before"])["arrangement"],
            storage_totals(r.storage["after"])["arrangement"],
        )
        if raw:
            out.append(
                f"| SF {r.scale:g}: arrangements <= 1.5x the raw Parquet bytes of the same "
                f"columns | {stored / raw:.2f}x ({after / raw:.2f}x after compact) | "
                f"{'yes' if after / raw <= 1.5 else 'no'} |"
            )
    if gap:
        out += ["", gap]
    if swept:
        from ivm.config import DEFAULT_RECOMPUTE_ABOVE
        from ivm.policy import current

        wins = [p for p in swept if p.incremental < p.spark_full]
        ahead = [p for p in swept if p.incremental <= p.recompute]
        behind = [p for p in swept if p.incremental > p.recompute]
        vs_full = (
            f"incremental beats Spark's full recompute up to {max(p.change for p in wins):.2%}"
            if wins
            else "incremental never beat Spark's full recompute at this scale"
        )
        crossover = (
            f"the engine's own recompute is faster from {min(p.change for p in behind):.2%} "
            f"(input share {min(p.share for p in behind):.2%})"
            if behind
            else "the engine's own recompute never beat the incremental refresh"
        )
        if ahead:
            crossover += (
                f"; incremental is faster up to {max(p.change for p in ahead):.2%} "
                f"(input share {max(p.share for p in ahead):.2%})"
            )
        out += [
            "",
            f"Rule from the sweep: {vs_full}; {crossover}. The engine recomputes a view when "
            f"its input updates exceed `[refresh] recompute_above` = {DEFAULT_RECOMPUTE_ABOVE:g} "
            f"of its input rows (and number at least {current().recompute_min_rows:,}); the *rule* "
            "column is that choice.",
        ]
    return out + [""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--scales", default="0.1,1,3", help="TPC-H scale factors (0.1,1,3)")
    parser.add_argument("--runs", type=int, default=3, help="change batches per scale (3)")
    parser.add_argument(
        "--change",
        type=float,
        default=0.001,
        help="fraction of SF1's orders per kind (0.001); every scale changes the same "
        "absolute number of orders",
    )
    parser.add_argument(
        "--sweep",
        default="0.0001,0.01,0.03,0.1",
        help="change fractions to sweep at --sweep-scale (0.0001,0.01,0.03,0.1); '' for none",
    )
    parser.add_argument("--sweep-scale", type=float, default=0.1)
    parser.add_argument(
        "--parallelism",
        type=int,
        default=DEFAULT_PARALLELISM,
        help=f"views refreshed at once ({DEFAULT_PARALLELISM}, the engine's default)",
    )
    parser.add_argument(
        "--warm-up-scale",
        type=float,
        default=WARM_UP_SCALE,
        help=f"scale factor of the unmeasured warm-up run first ({WARM_UP_SCALE:g}; 0: none)",
    )
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    hand_kept(Path(args.out))  # no marker: stop now, not after the runs

    from resources.spark import free_port, serve

    port = free_port()
    spark = serve({"spark.sql.shuffle.partitions": "4"}, port=port)
    results = []
    scales = [float(s) for s in args.scales.split(",") if s]
    sensor_at = REFERENCE_SCALE if REFERENCE_SCALE in scales else max(scales)
    if args.warm_up_scale > 0:
        # SF1's absolute change would be 10% of SF 0.01's orders, past where incremental
        # wins: the warm-up changes at most 1%.
        change = args.change * REFERENCE_SCALE / args.warm_up_scale
        warm_up(args.warm_up_scale, min(change, 0.01), spark, parallelism=args.parallelism)
    for scale in scales:
        say(f"== TPC-H SF {scale:g}")
        change = args.change * REFERENCE_SCALE / scale  # the same absolute change everywhere
        results.append(
            run_scale(
                scale,
                args.runs,
                change,
                spark,
                parallelism=args.parallelism,
                sensor=f"sc://localhost:{port}" if scale == sensor_at else None,
            )
        )
    swept = []
    if args.sweep:
        say(f"== change-size sweep at SF {args.sweep_scale:g}")
        changes = [float(c) for c in args.sweep.split(",")]
        swept = sweep(args.sweep_scale, changes, spark, parallelism=args.parallelism)
    plot(results, HERE / "refresh_vs_scale.png")
    write_markdown(results, swept, args, Path(args.out))
    say(f"wrote {args.out} and {HERE / 'refresh_vs_scale.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
