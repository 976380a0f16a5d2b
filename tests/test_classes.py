"""The class-data archive of Spark's JVM: recorded once by a JVM of its own
(``resources.classes``), then mapped by every later JVM whose Java, PySpark and class path it
fits (``resources.spark``), and never used when switched off or when it does not fit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from resources import classes, spark
from resources.spark import spark_conf

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def archives(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "archives"
    monkeypatch.setenv(spark.ARCHIVE_ENV, str(folder))
    return folder


def _options() -> str:
    return spark_conf({})["spark.driver.extraJavaOptions"]


def test_a_jvm_maps_the_archive_only_once_recorded_and_not_when_switched_off(
    archives, monkeypatch
) -> None:
    path = spark.archive_path()
    assert path is not None and path.parent == archives
    assert "SharedArchiveFile" not in _options()  # none recorded: a plain start
    path.parent.mkdir(parents=True)
    path.write_bytes(b"recorded")
    assert f"-XX:SharedArchiveFile={path} -Xshare:auto" in _options()
    assert "-XX:+UseParallelGC" in _options()  # beside the engine's own options
    # An archive the JVM cannot use (this one is not one) is passed over, quietly.
    java = spark.java_path()
    assert java is not None
    started = subprocess.run(
        [java, *spark.class_archive_options().split(), "-version"], capture_output=True, text=True
    )
    assert started.returncode == 0 and "warning" not in started.stderr.lower(), started.stderr
    # Another class path is another archive, not recorded yet.
    assert spark.archive_path({"spark.jars": "/x/extra.jar"}) != path
    assert (
        "SharedArchiveFile"
        not in spark_conf({"spark.jars": "/x/extra.jar"})["spark.driver.extraJavaOptions"]
    )
    monkeypatch.setenv(spark.ARCHIVE_ENV, "off")
    assert spark.archive_path() is None and "SharedArchiveFile" not in _options()


def test_recording_is_skipped_when_the_archive_exists(archives, monkeypatch) -> None:
    path = spark.archive_path()
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_bytes(b"recorded")

    def no_run(*args, **kwargs):
        raise AssertionError("recorded again")

    monkeypatch.setattr(subprocess, "run", no_run)
    assert classes.record() == path


@pytest.mark.slow
def test_a_recorded_archive_is_complete_and_the_next_jvm_loads_classes_from_it(
    archives, tmp_path
) -> None:
    path = classes.record()
    assert path is not None and path.is_file() and path.stat().st_size > 10 * 2**20
    assert [p.name for p in archives.iterdir()] == [path.name]  # no temporary file left
    log = tmp_path / "classes.log"
    script = (
        "from resources.spark import get_spark, spark_conf\n"
        "options = spark_conf({})['spark.driver.extraJavaOptions']\n"
        f"options += ' -Xlog:class+load=info:file={log}'\n"
        "spark = get_spark({'spark.driver.extraJavaOptions': options})\n"
        "assert spark.range(10).count() == 10\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = log.read_text().splitlines()
    shared = [line for line in lines if "source: shared objects file (top)" in line]
    spark_classes = [line for line in shared if " org.apache.spark." in line]
    assert len(shared) > 1000 and len(spark_classes) > 500, (len(lines), len(shared))
