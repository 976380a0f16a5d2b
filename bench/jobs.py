"""Where a refresh's Spark jobs go, per view (``python -m bench.jobs [--scale SF] [--fraction F]
[--path spark|policy] [--views q03,q21] [--queries DIR]``).

Builds the 22 TPC-H views of ``tests/tpch/`` (or the views of ``--queries``, ``*.sql`` over
the TPC-H tables) and the internal views they plan over TPC-H
sources at ``--scale`` (default 0.01), applies one change batch touching ``--fraction`` of the
orders (default 2%, ``demo.tpch.apply_change_batch``), refreshes once on Spark alone
(``--path spark``) or where the policy places each view (``policy``), and prints the build
and refresh times, the Spark jobs of the refresh, each view's seconds, jobs and who computed
it, slowest first, and for the views named by ``--views`` their jobs by kind (the call that
started them, as Spark's UI names it: ``withThreadLocalCaptured`` is a query stage or a
broadcast of adaptive execution, ``toArrow`` and ``collect`` results brought to the driver,
``localCheckpoint`` a materialized intermediate, ``parquet`` a write).
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.__main__ import WORK
from demo.__main__ import write_project
from demo.tpch import ALL_TABLES, apply_change_batch, create_sources, generate_parquet
from engine.facade import Engine
from ivm import policy
from ivm.policy import Policy
from resources.spark import get_spark

QUERIES = Path(__file__).resolve().parent.parent / "tests" / "tpch"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.jobs", description=__doc__)
    parser.add_argument("--scale", type=float, default=0.01)
    parser.add_argument("--fraction", type=float, default=0.02)
    parser.add_argument("--path", choices=("spark", "policy"), default="spark")
    parser.add_argument("--views", default="q03")
    parser.add_argument("--queries", type=Path, default=QUERIES)
    args = parser.parse_args()
    parquet = generate_parquet(args.scale, WORK / f"tpch-sf{args.scale:g}", ALL_TABLES)
    root = Path(tempfile.mkdtemp(prefix="ivm-bench-jobs-"))
    sources = create_sources(parquet, root / "data", ALL_TABLES)
    project = write_project(root, sources, views=args.queries)
    spark = get_spark(
        {
            "spark.ui.enabled": "true",
            "spark.ui.retainedJobs": "100000",
            "spark.ui.retainedStages": "100000",
        }
    )
    engine = Engine(project, spark=spark)
    start = time.perf_counter()
    assert engine.refresh().ok
    print(f"build {time.perf_counter() - start:.1f}s")
    apply_change_batch(sources, args.fraction, seed=7)
    if args.path == "spark":
        policy.install(Policy.spark_only())
    start = time.perf_counter()
    report = engine.refresh()
    assert report.ok, [(v.view, v.error) for v in report.views if v.error]
    jobs = sum(v.spark_jobs or 0 for v in report.views)
    print(
        f"refresh ({args.path}) {time.perf_counter() - start:.1f}s, {len(report.views)} views, "
        f"{jobs} Spark jobs"
    )
    for v in sorted(report.views, key=lambda v: -v.seconds):
        print(f"  {v.view:32s} {v.seconds:6.2f}s {v.spark_jobs or 0:4d} jobs  {v.computed_by}")
    context = spark.sparkContext
    url = f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}/jobs"
    with urllib.request.urlopen(url) as response:
        started = json.load(response)
    groups = {v.view: v.spark_job_group for v in report.views}
    for name in args.views.split(","):
        mine = [j for j in started if groups.get(name) and j.get("jobGroup") == groups[name]]
        print(f"{name}: {len(mine)} jobs by the call that started them")
        kinds = collections.Counter(j["name"].split(" at ")[0] for j in mine)
        for kind, n in kinds.most_common():
            print(f"  {n:4d} {kind}")


if __name__ == "__main__":
    main()
