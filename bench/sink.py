"""A readable table's change applied three ways (``python -m bench.sink [ROUNDS] [--files F]
[--rows-per-file N]``).

A table of ``F`` files of ``N`` rows ``(k, name, v DECIMAL)`` (default 20 of 10,000); each
round applies a change of 500 random deletions and 500 insertions, the ways taking turns:
*spark* (no size bound: a cached copy, a summing job, a join job and Spark's rewrite),
*sized* (a size bound: the change is sized and its files found on the driver, from one Arrow
copy, and Spark rewrites them) and *driver* (the driver also rewrites the files, with no
Spark job, the policy's ``driver_rewrite_rows``, :class:`ivm.policy.Policy`; off for the
other two ways). Prints each round and the sorted times of
each way, the first round of each dropped (warm-up). Every way rewrites the files holding a
deleted row (the driver keeps a candidate that holds none), so the difference is the work
around the rows.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from decimal import Decimal

import ivm.policy

WAYS = ("spark", "sized", "driver")


def main(rounds: int, files: int, rows_per_file: int) -> None:
    import pyarrow as pa

    from ops import DIFF
    from ops.sink import apply_to_table
    from resources.spark import get_spark

    spark = get_spark({"spark.sql.shuffle.partitions": "4"})
    uri = tempfile.mkdtemp(prefix="ivm-sink-") + "/t"
    schema = pa.schema(
        [("k", pa.int64()), ("name", pa.string()), ("v", pa.decimal128(15, 2)), (DIFF, pa.int64())]
    )
    held: set[tuple] = set()
    next_key = 0

    def fresh_rows(n: int) -> list[tuple]:
        nonlocal next_key
        out = [(k, f"n{k % 977}", Decimal(k % 1000) / 100) for k in range(next_key, next_key + n)]
        next_key += n
        return out

    def apply(epoch: int, change: list[tuple[tuple, int]], *, bounded: bool, first: bool = False):
        table = pa.Table.from_pylist(
            [{"k": k, "name": n, "v": v, DIFF: d} for (k, n, v), d in change], schema=schema
        )
        return apply_to_table(
            spark,
            spark.createDataFrame(table),
            uri,
            app_id="bench",
            epoch=epoch,
            metadata={},
            label="bench",
            overwrite=first,
            rows_hint=len(change) if bounded else None,
        )

    for f in range(files):
        rows = fresh_rows(rows_per_file)
        apply(f + 1, [(r, 1) for r in rows], bounded=True, first=f == 0)
        held.update(rows)
    rng = random.Random(1)
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    for i in range(len(WAYS) * rounds):
        way = WAYS[i % len(WAYS)]
        deleted = rng.sample(sorted(held), 500)
        inserted = fresh_rows(500)
        rewrites = {} if way == "driver" else {"driver_rewrite_rows": 0}
        with ivm.policy.using(**rewrites):
            started = time.perf_counter()
            change = apply(
                files + 1 + i,
                [(r, -1) for r in deleted] + [(r, 1) for r in inserted],
                bounded=way != "spark",
            )
            seconds = time.perf_counter() - started
        held.difference_update(deleted)
        held.update(inserted)
        if i >= len(WAYS):
            times[way].append(seconds)
        print(
            f"round {i}: {way:6s} {seconds:.3f}s, {change.files_rewritten} files "
            f"({change.rows_rewritten:,} rows) rewritten"
        )
    for way, xs in times.items():
        print(f"{way}: {' '.join(f'{x:.3f}' for x in sorted(xs))}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.sink", description=__doc__)
    parser.add_argument("rounds", type=int, nargs="?", default=8)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--rows-per-file", type=int, default=10_000)
    args = parser.parse_args()
    main(args.rounds, args.files, args.rows_per_file)
