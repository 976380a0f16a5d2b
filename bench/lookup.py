"""Arrangement lookups: pushed-down ``key IN (...)`` scans against one scan and a semi-join.

``python -m bench.lookup [ARRANGEMENT] [--keys 5,20,50,400] [--runs 2]`` looks up random
keys of an arrangement (default: SF1's ``lineitem`` by ``l_orderkey`` from ``./dev bench``)
both ways, alternating, in one warm Spark session, and prints the seconds of each (lookup
plus a count of its rows). The policy's ``push_ratio`` (:class:`ivm.policy.Policy`) comes from
these figures.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

import ivm.policy

DEFAULT = Path(__file__).resolve().parent / "work/sf1/project/lake/arrangements"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lookup", description=__doc__)
    parser.add_argument("arrangement", nargs="?", default=str(DEFAULT / "lineitem__by__l_orderkey"))
    parser.add_argument("--keys", default="5,20,50,400")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args(argv)

    import pyarrow as pa
    from deltalake import DeltaTable

    import ops.arrange as arrange
    from ops import DIFF, TIME
    from resources.lake import table_files
    from resources.spark import get_spark

    if not DeltaTable.is_deltatable(args.arrangement):
        raise SystemExit(f"no arrangement at {args.arrangement}: run `./dev bench` first")
    dt = DeltaTable(args.arrangement)
    schema = pa.schema(dt.schema().to_arrow())
    key = schema.names[0]
    spark = get_spark({"spark.sql.shuffle.partitions": "4"})
    key_type = spark.read.parquet(*dt.file_uris()).schema[key].dataType
    values = [r[0] for r in spark.read.parquet(*dt.file_uris()).select(key).distinct().collect()]
    rows = sum(f.num_records or 0 for f in table_files(args.arrangement))
    print(f"{args.arrangement}: {rows:,} updates, {len(values):,} keys", flush=True)
    if not {TIME, DIFF} <= set(schema.names):
        raise SystemExit(f"{args.arrangement} is not an arrangement (no {TIME}/{DIFF} columns)")
    rng = random.Random(7)
    for n in (int(k) for k in args.keys.split(",")):
        for run in range(args.runs):
            for mode in (
                ("pushed down", "read once") if run % 2 == 0 else ("read once", "pushed down")
            ):
                wanted = spark.createDataFrame(
                    [(k,) for k in rng.sample(values, n)], f"`{key}` {key_type.simpleString()}"
                )
                with ivm.policy.using(push_ratio=10**12 if mode == "read once" else 0):
                    started = time.perf_counter()
                    found, _ = arrange.lookup(spark, args.arrangement, schema, [key], wanted, 2**62)
                    count = found.count()
                    seconds = time.perf_counter() - started
                print(f"  {n:>6,} keys, {mode:>11}: {seconds:6.2f}s ({count:,} rows)", flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # skip native thread pools' teardown at exit (see engine.cli.entry)
