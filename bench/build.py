"""Where a build's time goes: per step, its seconds, the JVM's CPU seconds and its Spark jobs,
against Spark recomputing each view from scratch.

``python -m bench.build [--scale 1] [--warm 0.1]`` builds the benchmark's TPC-H project at
``--warm`` first (warming the JVM's compiler, as the bench's smaller scales do), then at
``--scale`` (``bench/work/sf<scale>``, made anew) one step at a time: each source's
arrangements, then each view (its diff log, state and readable table). Then Spark recomputes
every view's SQL from scratch at the same epoch, written as Parquet (the bench's *Spark full*),
twice; the second pass is reported. CPU seconds are the Spark JVM's user and system time
(``/proc``; on 2 cores a step's CPU can be twice its seconds), so the comparison holds on a
machine whose load varies: the build and Spark full do the same work or they do not.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path


def jvm_cpu_seconds(spark) -> Callable[[], float]:
    """A clock of the Spark JVM's CPU seconds (user + system), read from ``/proc``."""
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    stat = Path(f"/proc/{pid}/stat")
    ticks = os.sysconf("SC_CLK_TCK")

    def clock() -> float:
        fields = stat.read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / ticks

    return clock


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.build", description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--warm", type=float, default=0.1, help="0: no warm-up build")
    args = parser.parse_args(argv)

    from bench.__main__ import WORK, project, setup, spark_full_recompute
    from engine.facade import Engine
    from resources.spark import get_spark

    spark = get_spark({"spark.sql.shuffle.partitions": "4"})
    cpu = jvm_cpu_seconds(spark)
    if args.warm:
        _, _, config = setup(args.warm)
        if not Engine(project(config, 4), spark=spark, progress=lambda m: None).refresh().ok:
            raise SystemExit("the warm-up build failed")
    _, _, config = setup(args.scale)
    engine = Engine(project(config, 1), spark=spark, progress=lambda m: None)
    engine.mint_epoch()
    steps: list[tuple[str, float, float, int]] = []

    def step(name: str, run: Callable[[], object]) -> None:
        started, cpu0 = time.perf_counter(), cpu()
        with engine.job_group(f"bench build {name}", f"bench: build {name}") as group:
            run()  # the engine's own groups nest in this one, which counts their jobs
        steps.append((name, time.perf_counter() - started, cpu() - cpu0, group.jobs))

    for key in engine.plan.arrangements:
        if key.collection in engine.sources:  # a view's arrangement follows its view
            step(f"arrangement {key.name}", lambda key=key: engine.refresh_arrangement(key))
    for name in engine.plan.order:
        step(name, lambda name=name: engine.refresh_view(name))
    full: dict[str, tuple[float, float, int]] = {}
    out = WORK / f"sf{args.scale:g}-full"
    for _ in range(2):
        for name in engine.plan.order:
            cpu0 = cpu()
            seconds, jobs = spark_full_recompute(engine, out, views=[name])
            full[name] = (seconds, cpu() - cpu0, jobs)
    shutil.rmtree(out, ignore_errors=True)
    width = max(len(s[0]) for s in steps)
    print(f"SF {args.scale:g} build, one step at a time, against Spark full per view:")
    print(f"{'step'.ljust(width)}  seconds  CPU s  jobs | full: seconds  CPU s  jobs  CPU ratio")
    for name, seconds, used, jobs in steps:
        line = f"{name.ljust(width)}  {seconds:7.2f}  {used:5.1f}  {jobs:4}"
        if name in full:
            fs, fc, fj = full[name]
            line += f" |       {fs:7.2f}  {fc:5.1f}  {fj:4}  {used / fc if fc else 0:8.1f}x"
        print(line)
    seconds, used, jobs = (sum(s[i] for s in steps) for i in (1, 2, 3))
    fs, fc, fj = (sum(f[i] for f in full.values()) for i in (0, 1, 2))
    print(
        f"{'total'.ljust(width)}  {seconds:7.2f}  {used:5.1f}  {jobs:4} |       {fs:7.2f}  "
        f"{fc:5.1f}  {fj:4}  {used / fc:8.1f}x"
    )
    arranged = [s for s in steps if s[0].startswith("arrangement ")]
    print(
        f"arrangements: {sum(s[1] for s in arranged):.2f}s, {sum(s[2] for s in arranged):.1f} "
        f"CPU s ({sum(s[2] for s in arranged) / used:.0%} of the build's CPU)"
    )
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # skip native thread pools' teardown at exit (see engine.cli.entry)
