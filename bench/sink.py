"""A readable table's change sized on the driver or by Spark (``python -m bench.sink ROUNDS``).

A 20-file table of 200,000 rows ``(k, name, v DECIMAL)``; each round applies a change of 500
random deletions and 500 insertions, alternately with a size bound (the change is sized and
its files found on the driver, from one Arrow copy) and without (a cached copy, a summing
job and a join job). Prints each round and the sorted times of each way, the first two
rounds dropped (warm-up). Both ways rewrite the same files, so the difference is the jobs.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from decimal import Decimal


def main(rounds: int) -> None:
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

    for f in range(20):
        rows = fresh_rows(10_000)
        apply(f + 1, [(r, 1) for r in rows], bounded=True, first=f == 0)
        held.update(rows)
    rng = random.Random(1)
    times: dict[str, list[float]] = {"driver": [], "spark": []}
    for i in range(2 * rounds):
        way = "driver" if i % 2 == 0 else "spark"
        deleted = rng.sample(sorted(held), 500)
        inserted = fresh_rows(500)
        started = time.perf_counter()
        change = apply(
            21 + i, [(r, -1) for r in deleted] + [(r, 1) for r in inserted], bounded=way == "driver"
        )
        seconds = time.perf_counter() - started
        held.difference_update(deleted)
        held.update(inserted)
        if i >= 2:
            times[way].append(seconds)
        print(f"round {i}: {way:6s} {seconds:.3f}s, {change.files_rewritten} files rewritten")
    for way, xs in times.items():
        print(f"{way}: {' '.join(f'{x:.3f}' for x in sorted(xs))}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8)
