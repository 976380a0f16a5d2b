"""What deleting a group's minimum and maximum reads, level by level (``python -m bench.tower N``).

One group of N distinct values (the ``expected_group_size`` hint set to N), a MIN/MAX view;
delete the current minimum and maximum, refresh, and print the rows Spark's Parquet scans
read from each tower level (measured, not estimated) against the rows the level holds.
"""

from __future__ import annotations

import random
import sys
import tempfile
from pathlib import Path


def main(n: int) -> None:
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from engine.facade import Engine
    from resources.spark import get_spark

    root = Path(tempfile.mkdtemp(prefix="ivm-tower-"))
    path = str(root / "big")
    values = list(range(n))
    random.Random(3).shuffle(values)
    write_deltalake(
        path,
        pa.table({"g": ["x"] * n, "v": values}),
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    (root / "p" / "views").mkdir(parents=True)
    (root / "p" / "ivm.toml").write_text(
        f'lake = "lake"\nviews = "views"\n[sources]\nbig = "{path}"\n'
    )
    (root / "p" / "views" / "extremes.sql").write_text(
        f"-- ivm: expected_group_size = {n}\n"
        "CREATE VIEW extremes AS SELECT g, min(v) AS lo, max(v) AS hi FROM big GROUP BY g\n"
    )
    spark = get_spark({"spark.sql.shuffle.partitions": "2"})
    engine = Engine(
        root / "p" / "ivm.toml", spark=spark, measure_lookups=True, progress=lambda m: None
    )
    engine.refresh()
    DeltaTable(path).delete(f"v IN (0, {n - 1})")
    result = engine.refresh().views[0]
    print(
        f"group of {n:,} values; after deleting its min and max: "
        f"{engine.read_view('extremes').to_pylist()}"
    )
    for name, st in sorted(result.lookups.items()):
        print(
            f"  {name}: {st.keys} keys looked up, {st.rows_scanned:,} rows read of "
            f"{st.rows_total:,}"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
