"""Recording the class-data archive that shortens the start of a Spark JVM.

A Spark JVM spends much of its start loading and verifying the same few thousand classes
(Scala's, Spark's, Parquet's) from the jars. Java's class-data sharing (AppCDS, JDK 13+) maps
them instead from an archive that one JVM recorded. Every fresh process pays that start:
``ivm refresh``, a Dagster run started by the sensor, ``ivm spark-server``.

This module records the archive: :func:`record`, run once by ``./dev`` after installing
(``python -m resources.classes``), starts a separate JVM that does a little of everything the
engine asks of Spark (Parquet written and read, a shuffle, a join, generated code) and dumps
what it loaded. Where archives live, which one fits a JVM and the options that map it belong
to :mod:`resources.spark` (:func:`~resources.spark.archive_path`,
:func:`~resources.spark.class_archive_options`), which hands later JVMs the archive when one
fits; no user run ever records one. ``IVM_SPARK_CLASS_ARCHIVE`` names another folder for the
archives, or ``off``.

Contract in ``(data, time, diff)`` terms: none; the archive only changes how fast a JVM starts,
never what it computes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from pyspark import SparkContext
from pyspark.sql import functions as F

from resources.spark import (
    ARCHIVE_ENV,
    ARCHIVE_QUIET,
    archive_path,
    check_java,
    get_spark,
    spark_conf,
)


def record(conf: Mapping[str, str] | None = None, timeout: float = 600.0) -> Path | None:
    """Record the archive fitting ``conf`` unless there is one: a separate Python process
    starts a JVM that dumps its classes when it exits, into a temporary file renamed into
    place once complete (a concurrent or interrupted recording leaves no partial archive).
    Returns the archive (None when switched off, no Java is found, or the JVM dumped
    nothing).

    Raises:
        subprocess.CalledProcessError: the recording process failed.
    """
    path = archive_path(conf)
    if path is None or path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = str(path.with_name(f"{path.name}.{os.getpid()}.tmp"))  # the JVM writes it
    try:
        subprocess.run(
            [sys.executable, "-m", "resources.classes", "--dump-into", temporary],
            check=True,
            timeout=timeout,
            cwd=Path(__file__).resolve().parent.parent,
            capture_output=True,
        )
        if os.path.exists(temporary) and os.path.getsize(temporary) > 0:
            os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return path if path.is_file() else None


def _recording_run(temporary: str) -> None:
    """In the recording process: a session whose JVM dumps its classes into ``temporary``
    at exit, a little of every kind of work the engine gives Spark, then the JVM's exit,
    awaited so that the dump is complete when this process ends."""
    options = spark_conf().get("spark.driver.extraJavaOptions", "")
    spark = get_spark(
        {
            "spark.driver.extraJavaOptions": (
                f"{options} -XX:ArchiveClassesAtExit={temporary} {ARCHIVE_QUIET}"
            )
        }
    )
    with tempfile.TemporaryDirectory() as folder:
        df = spark.range(20_000).select(
            F.col("id"),
            (F.col("id") % 7).alias("k"),
            F.col("id").cast("decimal(15,2)").alias("d"),
            F.concat(F.lit("v"), F.col("id").cast("string")).alias("s"),
            F.current_date().alias("day"),
        )
        df.write.parquet(f"{folder}/a")
        back = spark.read.parquet(f"{folder}/a")
        keys = spark.createDataFrame([(k, f"k{k}") for k in range(7)], "k long, name string")
        other = back.select("id", F.col("s").alias("t"))
        joined = back.join(F.broadcast(keys), "k").join(other, "id")
        joined.groupBy("name").agg(F.sum("d"), F.countDistinct("t"), F.max("day")).collect()
        back.where("id < 100").toArrow()
    gateway = SparkContext._gateway
    spark.stop()
    if gateway is not None and getattr(gateway, "proc", None) is not None:
        gateway.shutdown()
        gateway.proc.stdin.close()  # the JVM exits on EOF, dumping its classes first
        gateway.proc.wait(timeout=300)


def main(argv: list[str]) -> int:
    """``python -m resources.classes``: record the archive for the default settings (what
    ``./dev`` runs), saying where it is; ``--dump-into PATH`` is :func:`record`'s own run."""
    if argv[:1] == ["--dump-into"] and len(argv) == 2:
        _recording_run(argv[1])
        return 0
    if argv:
        print("usage: python -m resources.classes", file=sys.stderr)
        return 2
    check_java()
    path = archive_path()
    if path is None:
        print(f"Spark class archive: off ({ARCHIVE_ENV})")
        return 0
    if path.is_file():
        return 0
    print(f"recording Spark's classes for faster JVM starts (once): {path}", file=sys.stderr)
    try:
        record()
    except subprocess.CalledProcessError as e:
        print(f"the recording failed:\n{(e.stderr or b'').decode()[-2000:]}", file=sys.stderr)
        return 1
    except subprocess.TimeoutExpired:
        print("the recording did not finish in time", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
