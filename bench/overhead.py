"""Where a refresh's time goes: per view, its seconds, its Spark jobs and the time inside them.

``python -m bench.overhead [--scale 0.1] [--change 0.0001] [--rounds 2]`` builds the
benchmark's TPC-H project at ``--scale`` (``bench/work/sf<scale>``, made anew), then per round
applies a change batch of ``--change`` of the orders per kind, brings the arrangements up to
date, and refreshes the views one at a time. For the last round it prints, per view, the
refresh's wall-clock seconds, the Spark jobs in its job group (:class:`resources.spark.JobGroup`)
and the seconds during which at least one of them ran (Spark's status store: an internal API,
fine for a benchmark). The rest of a view's time is the driver's: planning each query,
Py4J round trips, the Delta log (delta-rs) and commits. With a tiny change this is a refresh's
fixed cost, whatever the data's size.

``--writes spark`` has Spark write every file (the policy's ``driver`` off,
:class:`ivm.policy.Policy`: the driver neither computes nor writes small changes);
``--writes alternate`` alternates rounds between the two and prints each's median seconds per
refresh, side by side in one session (after a first round that warms the session up).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import ivm.policy


def busy_seconds(spark, group: str) -> float:
    """Seconds during which at least one job of ``group`` was running."""
    sc = spark.sparkContext
    store = sc._jsc.sc().statusStore()
    spans = []
    for job_id in sc.statusTracker().getJobIdsForGroup(group):
        job = store.job(job_id)
        start, end = job.submissionTime(), job.completionTime()
        if start.isDefined() and end.isDefined():
            spans.append((start.get().getTime(), end.get().getTime()))
    total, current = 0, None
    for a, b in sorted(spans):
        if current is None or a > current[1]:
            total += current[1] - current[0] if current else 0
            current = [a, b]
        else:
            current[1] = max(current[1], b)
    total += current[1] - current[0] if current else 0
    return total / 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__)
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--change", type=float, default=0.0001)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--writes", choices=["driver", "spark", "alternate"], default="driver")
    args = parser.parse_args(argv)

    import statistics

    from bench.__main__ import project, setup
    from demo.tpch import apply_change_batch
    from engine.facade import Engine
    from resources.spark import get_spark

    spark = get_spark({"spark.sql.shuffle.partitions": "4"})
    _, sources, config = setup(args.scale)
    engine = Engine(project(config, 1), spark=spark, progress=lambda m: None)
    if not engine.refresh().ok:
        raise SystemExit("the build failed")
    rows: list[tuple[str, float, int, float]] = []
    totals: dict[str, list[float]] = {"driver": [], "spark": []}
    alternate = args.writes == "alternate"
    for run in range(args.rounds + alternate):  # alternating: a first round to warm up
        writes = args.writes if not alternate else ("spark", "driver")[run % 2]
        with ivm.policy.using(driver=writes == "driver"):
            apply_change_batch(sources, args.change, seed=1 + run)
            engine.mint_epoch()
            for key in engine.plan.arrangements:  # their writes are not any view's
                engine.refresh_arrangement(key)
            rows.clear()
            for name in engine.plan.order:
                started = time.perf_counter()
                result = engine.refresh_view(name)
                seconds = time.perf_counter() - started
                group = result.spark_job_group
                busy = busy_seconds(spark, group) if group else 0.0
                rows.append((name, seconds, result.spark_jobs, busy))
        total = sum(r[1] for r in rows)
        if run or not alternate:
            totals[writes].append(total)
        print(f"round {run + 1}, small writes by {writes}: {total:.2f}s", flush=True)
    for writes, seconds_list in totals.items():
        if seconds_list:
            print(
                f"small writes by {writes}: median {statistics.median(seconds_list):.2f}s per "
                f"refresh over {len(seconds_list)} rounds"
            )
    width = max(len(r[0]) for r in rows)
    print(f"SF {args.scale:g}, {args.change:.4%} of the orders per kind, views one at a time:")
    print(f"{'view'.ljust(width)}  seconds  Spark jobs  in jobs  share")
    for name, seconds, jobs, busy in sorted(rows, key=lambda r: -r[1]):
        share = busy / seconds if seconds else 0.0
        print(f"{name.ljust(width)}  {seconds:7.2f}  {jobs:10}  {busy:7.2f}  {share:5.0%}")
    seconds, jobs, busy = (sum(r[i] for r in rows) for i in (1, 2, 3))
    print(f"{'total'.ljust(width)}  {seconds:7.2f}  {jobs:10}  {busy:7.2f}  {busy / seconds:5.0%}")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # skip native thread pools' teardown at exit (see engine.cli.entry)
