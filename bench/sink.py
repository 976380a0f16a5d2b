"""A readable table's change applied five ways (``python -m bench.sink [ROUNDS] [--files F]
[--rows-per-file N]``).

Each way keeps its own table of ``F`` files of ``N`` rows ``(k, name, v DECIMAL)`` (default 20
of 10,000); each round applies a change of 500 random deletions and 500 insertions, the ways
taking turns: *spark* (no size bound: a cached copy, a summing job, a join job and Spark's
rewrite), *sized* (a size bound: the change is sized and its files found on the driver, from
one Arrow copy, and Spark rewrites them), *driver* (the driver also rewrites the files, with
no Spark job, the policy's ``driver_rewrite_rows``) and *vectors* (the deletions marked in
deletion vectors by one delta-spark MERGE that also inserts, ``rewrite_copy_rows = 0``; the
copies held are counted on the driver) and *dv-driver* (the driver marks the vectors and
commits them itself). Prints each round and the sorted times of each way,
the first round of each dropped (warm-up), and the rows each wrote. The first three rewrite
the files holding a deleted row (the driver keeps a candidate that holds none); the last
two rewrite none.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from decimal import Decimal

import ivm.policy

WAYS = ("spark", "sized", "driver", "vectors", "dv-driver")
POLICIES: dict[str, dict[str, object]] = {
    "spark": {"driver_rewrite_rows": 0, "deletion_vectors": False},
    "sized": {"driver_rewrite_rows": 0, "deletion_vectors": False},
    "driver": {"deletion_vectors": False},
    "vectors": {"rewrite_copy_rows": 0, "driver_rewrite_rows": 0},
    "dv-driver": {"rewrite_copy_rows": 0},
}
"""The policy each way refreshes under."""


def main(rounds: int, files: int, rows_per_file: int) -> None:
    import pyarrow as pa

    from ops import DIFF
    from ops.sink import apply_to_table
    from resources.spark import get_spark

    spark = get_spark({"spark.sql.shuffle.partitions": "4"})
    root = tempfile.mkdtemp(prefix="ivm-sink-")
    schema = pa.schema(
        [("k", pa.int64()), ("name", pa.string()), ("v", pa.decimal128(15, 2)), (DIFF, pa.int64())]
    )
    next_key = 0

    def fresh_rows(n: int) -> list[tuple]:
        nonlocal next_key
        out = [(k, f"n{k % 977}", Decimal(k % 1000) / 100) for k in range(next_key, next_key + n)]
        next_key += n
        return out

    def apply(way: str, epoch: int, change: list[tuple[tuple, int]], *, first: bool = False):
        table = pa.Table.from_pylist(
            [{"k": k, "name": n, "v": v, DIFF: d} for (k, n, v), d in change], schema=schema
        )
        return apply_to_table(
            spark,
            spark.createDataFrame(table),
            f"{root}/{way}",
            app_id="bench",
            epoch=epoch,
            metadata={},
            label=way,
            overwrite=first,
            rows_hint=len(change) if way != "spark" or first else None,
        )

    held: dict[str, set[tuple]] = {way: set() for way in WAYS}
    for f in range(files):
        rows = fresh_rows(rows_per_file)
        for way in WAYS:
            apply(way, f + 1, [(r, 1) for r in rows], first=f == 0)
            held[way].update(rows)
    rng = random.Random(1)
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    written: dict[str, list[int]] = {way: [] for way in WAYS}
    for i in range(len(WAYS) * rounds):
        way = WAYS[i % len(WAYS)]
        deleted = rng.sample(sorted(held[way]), 500)
        inserted = fresh_rows(500)
        with ivm.policy.using(**POLICIES[way]):
            started = time.perf_counter()
            change = apply(
                way, files + 1 + i, [(r, -1) for r in deleted] + [(r, 1) for r in inserted]
            )
            seconds = time.perf_counter() - started
        held[way].difference_update(deleted)
        held[way].update(inserted)
        if i >= len(WAYS):
            times[way].append(seconds)
            written[way].append(change.inserted + change.rows_rewritten)
        print(
            f"round {i}: {way:7s} {seconds:.3f}s, {change.files_rewritten} files "
            f"({change.rows_rewritten:,} rows) rewritten, {change.inserted + change.deleted} "
            "rows changed"
        )
    for way, xs in times.items():
        rows = statistics.median(written[way]) if written[way] else 0
        print(
            f"{way}: {' '.join(f'{x:.3f}' for x in sorted(xs))} (median rows written {rows:,.0f})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.sink", description=__doc__)
    parser.add_argument("rounds", type=int, nargs="?", default=8)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--rows-per-file", type=int, default=10_000)
    args = parser.parse_args()
    main(args.rounds, args.files, args.rows_per_file)
