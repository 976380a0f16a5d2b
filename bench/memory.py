"""The driver's peak memory while building views over snapshots of growing size
(``python -m bench.memory [ROWS ...]``, default 1,000,000 and 10,000,000).

For each size, one process generates the source (a Delta table with CDF; in batches), and a
fresh process builds three views over it: a filter, a GROUP BY (accumulable state) and a join
with a small dimension (an arrangement of the whole source). That process's peak resident
memory (``ru_maxrss``) is the Python driver's: the engine never collects a large snapshot;
a first build's readable table of up to the policy's ``driver_rewrite_rows`` rows
(:class:`ivm.policy.Policy`) is read from its diff log and written by the driver, and so is an
arrangement of a source of up to ``driver_sort_rows`` rows (up to ``driver_build_rows``, file
by file, when the files are laid out by the key), larger ones by Spark's executors, all
committed by delta-rs from file statistics: the peak is bounded whatever the source's size. The
JVM (Spark's driver and, in local mode, its executors) is a child process with its own heap
(``spark.driver.memory``), reported apart: its peak depends on Spark's buffers, not on ours.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VIEWS = {
    "big_orders": "CREATE VIEW big_orders AS SELECT k, grp, v FROM items WHERE v > 900",
    "per_grp": "CREATE VIEW per_grp AS SELECT grp, count(*) AS n, sum(v) AS s FROM items "
    "GROUP BY grp",
    "named": "CREATE VIEW named AS SELECT i.k, d.name FROM items i JOIN dims d ON d.grp = i.grp",
}


def generate(root: Path, rows: int) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import write_deltalake

    schema = pa.schema(
        [
            ("k", pa.int64()),
            ("grp", pa.string()),
            ("v", pa.decimal128(12, 2)),
            ("note", pa.string()),
        ]
    )

    def batches():
        step = 500_000
        for start in range(0, rows, step):
            k = pa.array(range(start, min(rows, start + step)), pa.int64())
            grp = pc.cast(pc.remainder(k, 1000), pa.string())
            v = pc.cast(
                pc.divide(pc.cast(pc.remainder(pc.multiply(k, 7919), 100_000), pa.float64()), 100),
                pa.decimal128(12, 2),
            )
            note = pc.binary_join_element_wise("note-", pc.cast(k, pa.string()), "")
            yield pa.record_batch([k, grp, v, note], schema=schema)

    reader = pa.RecordBatchReader.from_batches(schema, batches())
    write_deltalake(
        str(root / "items"), reader, configuration={"delta.enableChangeDataFeed": "true"}
    )
    dims = pa.table({"grp": [str(i) for i in range(1000)], "name": [f"g{i}" for i in range(1000)]})
    write_deltalake(str(root / "dims"), dims)
    (root / "p" / "views").mkdir(parents=True)
    (root / "p" / "ivm.toml").write_text(
        f'lake = "lake"\nviews = "views"\n[sources]\nitems = "{root / "items"}"\n'
        f'dims = "{root / "dims"}"\n[spark]\n"spark.sql.shuffle.partitions" = "8"\n'
    )
    for name, sql in VIEWS.items():
        (root / "p" / "views" / f"{name}.sql").write_text(sql + "\n")


def build(root: Path) -> dict:
    from engine.facade import Engine
    from resources.spark import get_spark

    spark = get_spark({"spark.sql.shuffle.partitions": "8"})
    engine = Engine(root / "p" / "ivm.toml", spark=spark, progress=lambda m: None)
    started = time.perf_counter()
    report = engine.refresh()
    seconds = time.perf_counter() - started
    assert report.ok, [v.error for v in report.views]
    jvm = spark.sparkContext._jvm.java.lang.management.ManagementFactory
    heap_peak = sum(
        pool.getPeakUsage().getUsed()
        for pool in jvm.getMemoryPoolMXBeans()
        if str(pool.getType()) == "Heap memory"
    )
    return {
        "build_seconds": round(seconds, 1),
        "python_peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "jvm_heap_peak_mib": round(heap_peak / 2**20, 1),
    }


def main(sizes: list[int]) -> None:
    out = []
    for rows in sizes:
        root = Path(tempfile.mkdtemp(prefix=f"ivm-mem-{rows}-"))
        subprocess.run(
            [sys.executable, "-m", "bench.memory", "--generate", str(root), str(rows)], check=True
        )
        proc = subprocess.run(
            [sys.executable, "-m", "bench.memory", "--build", str(root)],
            check=True,
            capture_output=True,
            text=True,
        )
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        result["source_rows"] = rows
        out.append(result)
        print(
            f"{rows:>12,} source rows: build {result['build_seconds']}s; Python driver peak "
            f"RSS {result['python_peak_mib']} MiB; JVM heap peak {result['jvm_heap_peak_mib']} MiB",
            flush=True,
        )
    if len(out) > 1:
        a, b = out[0], out[-1]
        print(
            f"source x{b['source_rows'] / a['source_rows']:.0f}: Python driver peak "
            f"x{b['python_peak_mib'] / a['python_peak_mib']:.2f}, build time "
            f"x{b['build_seconds'] / a['build_seconds']:.1f}"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--generate"]:
        generate(Path(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1:2] == ["--build"]:
        result = build(Path(sys.argv[2]))
        print(json.dumps(result), flush=True)
        import os

        os._exit(0)  # skip native teardown (see engine.cli.entry)
    else:
        main([int(a) for a in sys.argv[1:]] or [1_000_000, 10_000_000])
