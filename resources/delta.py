"""Delta Lake's own Spark integration (delta-spark) in every Spark session the engine starts.

Owns Delta's jars and the settings that load them: the jars of ``io.delta:delta-spark`` at the
version of the installed ``delta-spark`` Python package, fetched once with Maven
(``mvn dependency:copy-dependencies`` from ``resources/delta-jars.pom.xml``, which leaves out
what PySpark already ships) into a folder of their own (:func:`jars_dir`), and the session
settings that load them (:func:`delta_settings`: ``spark.jars`` as a glob over that folder, so
the settings are known before the jars are there; Delta's SQL extension and catalog).
:func:`ensure_jars` runs before any session starts (``resources.spark.check_spark``) and
``./dev`` runs it first (``python -m resources.delta``), so the first command fetches them
with a visible message, and a missing Java or Maven, or a refused download, is said plainly.

Contract in ``(data, time, diff)`` terms: none; this module only makes Delta's reader and
writer available to Spark.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ivm.errors import IvmError

JARS_ENV = "IVM_DELTA_JARS"
"""A folder that holds (or will hold) Delta's jars, instead of the default (:func:`jars_dir`)."""
POM = Path(__file__).with_name("delta-jars.pom.xml")
SCALA_SPARK = "4.0_2.13"
"""The Spark and Scala versions in the artifact's name: ``delta-spark_4.0_2.13`` for PySpark
4.0 (Delta's artifacts since 4.1 carry the Spark version)."""
COMPLETE = ".complete"
"""Written last into a jars folder: a folder without it is an interrupted fetch."""

MAVEN_HELP = (
    "Maven fetches Delta's jars once: install it (`sudo apt-get install maven` on Debian/Ubuntu, "
    "`brew install maven` on macOS), or put the jars of {artifact} and its dependencies in a "
    f"folder and set {JARS_ENV} to it"
)


class DeltaJarsError(IvmError):
    """Delta's jars are not there and cannot be fetched."""


def delta_version() -> str:
    """The installed delta-spark Python package's version: the jars' version too."""
    return importlib.metadata.version("delta-spark")


def artifact() -> str:
    return f"io.delta:delta-spark_{SCALA_SPARK}:{delta_version()}"


def jars_dir() -> Path:
    """Where Delta's jars are: ``$IVM_DELTA_JARS``, else ``<cache>/ivm/delta-<version>``
    (``$XDG_CACHE_HOME`` or ``~/.cache``)."""
    chosen = os.environ.get(JARS_ENV)
    if chosen:
        return Path(chosen)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "ivm" / f"delta-{delta_version()}"


def delta_settings() -> dict[str, str]:
    """The Spark settings that load Delta: its jars (fetched first if they are not there:
    :func:`ensure_jars`), listed one by one (Spark ships each to a cluster's executors; a
    glob reaches the driver's class path only), its SQL extension and its catalog, and the
    partitions Delta rebuilds a table's state in: one (its default, 50, makes every
    snapshot a job of 50 tasks; the engine's tables checkpoint every 10 commits, so a state
    is small; a project's ``[spark]`` table overrides it)."""
    jars = sorted(str(p) for p in ensure_jars(say=_tell).glob("*.jar"))
    return {
        "spark.jars": ",".join(jars),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.databricks.delta.snapshotPartitions": "1",
    }


def _tell(message: str) -> None:
    print(f"ivm: {message}", file=sys.stderr)


def ensure_jars(say=_tell) -> Path:
    """Delta's jars, fetched with Maven unless there (``say`` is told before a fetch).

    Raises:
        DeltaJarsError: Maven is missing, or refused the artifact (its error quoted).
    """
    folder = jars_dir()
    if (folder / COMPLETE).is_file() or (os.environ.get(JARS_ENV) and any(folder.glob("*.jar"))):
        return folder
    mvn = shutil.which("mvn")
    if mvn is None:
        raise DeltaJarsError(MAVEN_HELP.format(artifact=artifact()))
    say(f"fetching {artifact()} and its dependencies with Maven into {folder} (once)...")
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        _fetch(mvn, staging)
        (staging / COMPLETE).write_text(artifact() + "\n")
        if folder.exists():  # an interrupted fetch
            shutil.rmtree(folder)
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _fetch(mvn: str, into: Path) -> None:
    command = [
        mvn,
        "-B",
        "-q",
        "-Dstyle.color=never",
        "-f",
        str(POM),
        f"-Ddelta.version={delta_version()}",
        "dependency:copy-dependencies",
        f"-DoutputDirectory={into}",
    ]
    run = subprocess.run(command, capture_output=True, text=True, check=False)
    if run.returncode != 0 or not any(into.glob("delta-spark_*.jar")):
        plain = re.sub(r"\x1b\[[0-9;]*m", "", run.stdout)  # Maven colours some lines anyway
        errors = [line.strip() for line in plain.splitlines() if line.startswith("[ERROR]")]
        detail = errors[0] if errors else run.stderr.strip() or f"exit status {run.returncode}"
        raise DeltaJarsError(
            f"Maven could not fetch {artifact()}:\n{detail}\n"
            f"(command: {' '.join(command)}; {MAVEN_HELP.format(artifact=artifact())})"
        )


def main() -> int:
    """``python -m resources.delta``: fetch the jars unless there; print where they are."""
    try:
        folder = ensure_jars(say=lambda m: print(f"dev: {m}", file=sys.stderr))
    except DeltaJarsError as e:
        print(f"dev: {e}", file=sys.stderr)
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
