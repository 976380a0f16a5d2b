"""The Spark session: its settings, its creation and the Java check that precedes it, the
class-data archive its JVM maps, the job groups that label a thread's Spark jobs
(:class:`JobGroup`), and the warm Spark Connect server (:func:`serve`).

Owns every Spark setting the engine relies on (:func:`spark_conf`); ``ivm refresh``, the tests
and Dagster's resource all build their session from it, so they compute on identical settings.
A session is either *classic* (a JVM started in this process, which maps the class-data
archive :mod:`resources.classes` recorded, when one fits) or a *Spark Connect* client of a
long-lived server (``spark.remote`` in ``[spark]``, or PySpark's ``SPARK_REMOTE``) that
:func:`serve` runs with the same settings.

Contract in ``(data, time, diff)`` terms: none; settings only change how updates are computed
(e.g. UTC session time zone and microsecond Parquet timestamps keep timestamps exact), the
archive only how fast a JVM starts, and job groups only name and count the jobs.
"""

from __future__ import annotations

import atexit
import hashlib
import itertools
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

from ivm.errors import IvmError
from resources.delta import delta_settings, ensure_jars, jars_dir

# PySpark (and its Py4J) is imported inside the functions that start or use a session: every
# `ivm` command imports this module, `show`, `explain` and `status` never start Spark, and
# importing PySpark would lengthen their start.

LOG4J_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")

JAVA_HELP = (
    "Java 17 or newer is required for Spark. Install it, e.g. `sudo apt-get install "
    "openjdk-17-jre-headless` (Debian/Ubuntu), `brew install openjdk@17` (macOS), "
    "or set JAVA_HOME to an existing JDK 17+."
)


class JavaMissingError(IvmError):
    """No usable Java runtime for Spark."""


class SparkConnectError(IvmError):
    """The Spark Connect server a project names (``spark.remote``) does not answer."""


REMOTE = "spark.remote"
"""The setting (or PySpark's ``SPARK_REMOTE`` variable) naming a Spark Connect server."""
DEFAULT_CONNECT_PORT = 15002
CONNECT_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"

# -- Java ------------------------------------------------------------------------------------


def java_path() -> str | None:
    """The ``java`` Spark starts: ``$JAVA_HOME/bin/java``, else the one on the PATH."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return java if java and os.path.exists(java) else None


def java_major_version() -> int | None:
    """Major version of the ``java`` Spark will start (JAVA_HOME first), or None if none."""
    java = java_path()
    if java is None:
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def check_java() -> None:
    """Raise :class:`JavaMissingError` with install advice unless Java 17+ is available."""
    major = java_major_version()
    if major is None:
        raise JavaMissingError(f"no Java found. {JAVA_HELP}")
    if major < 17:
        raise JavaMissingError(f"Java {major} found. {JAVA_HELP}")


# -- the class-data archive a driver JVM maps ------------------------------------------------

ARCHIVE_ENV = "IVM_SPARK_CLASS_ARCHIVE"
"""Where the archives are kept (a folder), or ``off``; by default ``$XDG_CACHE_HOME/ivm``
(``~/.cache/ivm``)."""

ARCHIVE_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
"""No JVM warnings about an archive it cannot use (it then starts as without one)."""

CLASS_PATH_SETTINGS = ("spark.jars", "spark.jars.packages", "spark.driver.extraClassPath")
"""Settings that change the driver's class path, and so which archive fits it."""


def archive_dir() -> Path | None:
    """The folder of the archives (:data:`ARCHIVE_ENV`); None when switched off."""
    chosen = os.environ.get(ARCHIVE_ENV, "")
    if chosen.lower() == "off":
        return None
    if chosen:
        return Path(chosen)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "ivm"


def archive_path(conf: Mapping[str, str] | None = None) -> Path | None:
    """The archive that fits a JVM started with ``conf``: one per Java installation (its
    resolved path, size and time), PySpark version and class-path settings. None when
    switched off or no Java is found."""
    folder, java = archive_dir(), java_path()
    if folder is None or java is None:
        return None
    import pyspark  # lazy: see the imports

    real = os.path.realpath(java)
    st = os.stat(real)
    parts = [real, str(st.st_size), str(st.st_mtime_ns), pyspark.__version__]
    parts += [f"{k}={(conf or {}).get(k, '')}" for k in CLASS_PATH_SETTINGS]
    parts.append(f"delta={jars_dir()}")
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return folder / f"spark-{pyspark.__version__}-{digest}.jsa"


def class_archive_options(conf: Mapping[str, str] | None = None) -> str:
    """The driver JVM options that map the archive fitting ``conf``, if recorded (else ""):
    ``-Xshare:auto``, so a JVM that cannot use it starts as without it, quietly."""
    path = archive_path(conf)
    if path is None or not path.is_file():
        return ""
    return f"-XX:SharedArchiveFile={path} -Xshare:auto {ARCHIVE_QUIET}"


# -- settings --------------------------------------------------------------------------------

PARQUET_CODEC = "zstd"
ZSTD_LEVEL = 1
"""How every Parquet file of the lake is compressed, by Spark's writers and by the driver's
(:func:`resources.lake.stage_arrow`)."""

RUNTIME_BLOOM_FILTER = "spark.sql.optimizer.runtime.bloomFilter.enabled"
DATAFRAME_DEBUGGING = "spark.python.sql.dataFrameDebugging.enabled"
OPTIMIZER_EXCLUDED_RULES = "spark.sql.optimizer.excludedRules"


def spark_conf(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Spark settings of the engine, with a project's ``[spark]`` overrides applied.

    A setting that departs from Spark's default says why; the measurements behind them are in
    BENCHMARKS.md ("Moved from docstrings: resources")."""
    conf = {
        "spark.master": "local[*]",
        "spark.app.name": "ivm",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "4g",
        # Small batches: a few shuffle partitions, no locality wait.
        "spark.sql.shuffle.partitions": "4",
        "spark.default.parallelism": "4",
        "spark.locality.wait": "0",
        "spark.sql.adaptive.enabled": "true",
        # Exact, portable Parquet: UTC, INT64 microsecond timestamps, zstd at level 1
        # (Parquet's default is 3: files barely larger, written faster).
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.parquet.compression.codec": PARQUET_CODEC,
        "spark.hadoop.parquet.compression.codec.zstd.level": str(ZSTD_LEVEL),
        "spark.sql.files.maxRecordsPerFile": "2000000",
        "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
        "spark.hadoop.parquet.enable.summary-metadata": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Arrangement lookups push `key IN (...)` into Parquet scans (row-group skipping).
        # (ops.arrange splits larger key sets: long IN lists overflow Spark's filter recursion.)
        "spark.sql.parquet.pushdown.inFilterThreshold": "400",
        # No runtime Bloom filters: on a lookup (a small change joined with an arrangement)
        # Spark built one by scanning the whole arrangement to prune the small side, a second
        # full read per join. The bench's Spark full recompute runs with Spark's default (see
        # bench.__main__.spark_full_recompute).
        RUNTIME_BLOOM_FILTER: "false",
        # No folding of projections and filters over local relations at planning time: a
        # change read from a change feed, and the keys of a lookup, come to Spark from Arrow
        # as local relations, and the rule evaluated every plan that reads them row by row,
        # interpreted, on the driver's planning thread. Without it the same expressions run
        # compiled in the plan's tasks.
        OPTIMIZER_EXCLUDED_RULES: "org.apache.spark.sql.catalyst.optimizer.ConvertToLocalRelation",
        # Keep the code Spark generates and compiles for a plan: a refresh runs the same few
        # hundred plans every epoch, and the default cache (100 classes) evicted them before
        # they came back.
        "spark.sql.codegen.cache.maxEntries": "4000",
        # No Python call sites in DataFrame error contexts: with it on (Spark 4's default),
        # every Column function and DataFrame method first asks the JVM for the active
        # session and a setting, and sets and clears the call site (tests/test_spark.py counts
        # the Py4J round trips). The engine's own errors name the view, table and column.
        DATAFRAME_DEBUGGING: "false",
        "spark.driver.extraJavaOptions": _driver_java_options(overrides),
    }
    conf.update(overrides or {})
    if remote_url(overrides) is None:
        # Delta's reader and writer (delta-spark): its jars (fetched on first use), SQL
        # extension and catalog; a project's own jars and extensions join Delta's, its other
        # settings win.
        for key, value in delta_settings().items():
            if key not in _LISTS:
                conf.setdefault(key, value)
                continue
            theirs = [v for v in conf.get(key, "").split(",") if v]
            conf[key] = ",".join([value, *(v for v in theirs if v not in value.split(","))])
    if conf["spark.master"].startswith("local") and "spark.pyspark.python" not in conf:
        # Python workers (exact floating-point results, ops.reduce.floatsum) run this interpreter,
        # which has PySpark, rather than whatever `python3` the PATH finds.
        conf["spark.pyspark.python"] = os.environ.get("PYSPARK_PYTHON") or sys.executable
    if remote_url(overrides) is not None:
        # A Spark Connect client sets only its session's SQL settings: the server (started by
        # `serve` with the same settings) owns the JVM, the master and the static ones.
        conf = {
            k: v
            for k, v in conf.items()
            if k == REMOTE or (k.startswith("spark.sql.") and k not in _STATIC_SQL)
        }
    return conf


_LISTS = ("spark.jars", "spark.sql.extensions")
"""Comma-separated settings where a project's values join Delta's instead of replacing them."""

_STATIC_SQL = frozenset(
    {
        "spark.sql.codegen.cache.maxEntries",
        "spark.sql.extensions",
        "spark.sql.catalog.spark_catalog",
    }
)
"""Settings of :func:`spark_conf` fixed when the JVM starts (a client cannot set them)."""


def _driver_java_options(overrides: Mapping[str, str] | None) -> str:
    """The driver JVM's options: errors only from its log (Spark's startup WARN lines say
    nothing a user can act on), the throughput collector rather than G1 (batch work that
    pauses no one), and the class-data archive fitting ``overrides`` when one was recorded."""
    options = f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG} -XX:+UseParallelGC"
    archive = class_archive_options(overrides)
    return f"{options} {archive}" if archive else options


def check_spark(conf: Mapping[str, str] | None = None) -> None:
    """Before a session is built from ``conf`` (e.g. by dagster-pyspark's resource): Java 17+
    and Delta's jars (fetched on first use) for a JVM of this process, or, with
    ``spark.remote``, a server that answers.

    Raises:
        JavaMissingError: no Java 17+ (classic only).
        DeltaJarsError: Delta's jars are missing and Maven cannot fetch them (classic only).
        SparkConnectError: the Spark Connect server does not answer.
    """
    url = remote_url(conf)
    if url is None:
        check_java()
        ensure_jars()
    else:
        _check_reachable(url)


def remote_url(overrides: Mapping[str, str] | None = None) -> str | None:
    """The Spark Connect server the session should use: ``spark.remote`` from the project's
    settings, else PySpark's ``SPARK_REMOTE``; None for a classic session."""
    return (overrides or {}).get(REMOTE) or os.environ.get("SPARK_REMOTE") or None


def is_connect(spark) -> bool:  # spark: SparkSession
    """Whether ``spark`` is a Spark Connect client (its JVM is a server's, not this process's)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def session_key(spark) -> str:  # spark: SparkSession
    """An id that changes when the session does: the application's for a classic session (a
    restarted JVM is a new one), the server session's for a Spark Connect client."""
    return spark.session_id if is_connect(spark) else spark.sparkContext.applicationId


def _endpoint(spark) -> str | None:  # spark: a Spark Connect SparkSession
    """``host:port`` of a Spark Connect client's server (None if PySpark hides it)."""
    return getattr(getattr(spark.client, "_builder", None), "endpoint", None)


def describe_session(spark) -> str:  # spark: SparkSession
    """Where a session computes, for logs: this process's JVM or a Spark Connect server."""
    if is_connect(spark):
        return f"Spark {spark.version} on the Spark Connect server {_endpoint(spark) or '?'}"
    sc = spark.sparkContext
    return f"Spark {spark.version} in this process's JVM ({sc.master}, {sc.applicationId})"


def get_spark(overrides: Mapping[str, str] | None = None):  # -> SparkSession
    """The process's Spark session, created on first use with :func:`spark_conf`: a Spark
    Connect client when :func:`remote_url` names a server (the session's SQL settings are
    set on the server's session; no JVM starts here), else a local JVM.

    Raises:
        JavaMissingError: no Java 17+ (classic only).
        SparkConnectError: the server does not answer.
    """
    active = _active_session()
    if active is not None:
        return active
    check_spark(overrides)
    url = remote_url(overrides)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    conf = spark_conf(overrides)
    for key, value in conf.items():
        builder = builder.config(key, value)
    if url is None:
        # PySpark starts its Python workers (here, or on a cluster's executors) with
        # $PYSPARK_PYTHON (else `python3` from the PATH), not with the spark.pyspark.python
        # setting, which only spark-submit reads. A project's setting wins over the
        # environment, as it does in spark-submit; the local default does not.
        if (overrides or {}).get("spark.pyspark.python"):
            os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]
        elif "spark.pyspark.python" in conf:
            os.environ.setdefault("PYSPARK_PYTHON", conf["spark.pyspark.python"])
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        return spark
    return _connect(builder.remote(url), url)


def _connect(builder, url: str):  # -> SparkSession
    """A Spark Connect session from ``builder`` (whose server :func:`check_spark` found
    answering: PySpark would otherwise retry for about a minute before failing), released at
    exit (:func:`release_at_exit`)."""
    from pyspark.errors import PySparkException

    try:
        spark = builder.getOrCreate()
    except PySparkException as e:
        raise SparkConnectError(f"Spark Connect server {url}: {e}") from e
    release_at_exit(spark)
    return spark


_releasing: set[str] = set()


def release_at_exit(spark) -> None:  # spark: SparkSession
    """Release a Spark Connect session on its server when this process exits (nothing for a
    classic one). A session the client leaves open keeps, on the server, every DataFrame it
    checkpointed until the server's idle timeout (an hour by default): a server serving a run
    every few minutes would hold many."""
    if is_connect(spark) and spark.session_id not in _releasing:
        _releasing.add(spark.session_id)
        atexit.register(release, spark)


def release(spark) -> None:  # spark: SparkSession
    """Release a Spark Connect session on its server now, if the server still answers (a dead
    server has nothing to release, and the client would retry for minutes)."""
    from pyspark.errors import PySparkException

    if not is_connect(spark) or spark.is_stopped:
        return
    endpoint = _endpoint(spark)
    try:
        if endpoint is not None:
            _check_reachable(f"sc://{endpoint}", timeout=1.0)
        spark.stop()
    except (SparkConnectError, PySparkException, OSError):
        return


def remote_address(url: str) -> tuple[str, int]:
    """Host and port of a Spark Connect URL (``sc://host[:port][/;params]``)."""
    parsed = urlparse(url.replace("sc://", "http://", 1))
    return parsed.hostname or "localhost", parsed.port or DEFAULT_CONNECT_PORT


def _check_reachable(url: str, timeout: float = 5.0) -> None:
    host, port = remote_address(url)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        raise SparkConnectError(
            f"the Spark Connect server {url} ({REMOTE}) does not answer: {e}. Start it with "
            f"`ivm spark-server --port {port}` (or unset {REMOTE} and SPARK_REMOTE to start "
            "Spark in this process)"
        ) from e


def free_port() -> int:
    """A TCP port free on this machine now, for a server started on the fly (tests, bench)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(
    overrides: Mapping[str, str] | None = None,
    port: int = DEFAULT_CONNECT_PORT,
    host: str = "127.0.0.1",
):  # -> SparkSession
    """Start this process's Spark with a Spark Connect server on ``host:port`` and the
    engine's settings (:func:`spark_conf`), and return the classic session that hosts it.
    Clients (``spark.remote = "sc://host:port"``) each get a session of their own on its JVM,
    whose compiled code, caches and warm JIT they share. The server lives as long as this
    process. It has no authentication: by default it listens on the loopback interface only.

    Raises:
        JavaMissingError: no Java 17+.
        SparkConnectError: Spark already runs in this process without the server.
    """
    settings = {k: v for k, v in (overrides or {}).items() if k != REMOTE}
    plugins = [p for p in settings.get("spark.plugins", "").split(",") if p]
    settings["spark.plugins"] = ",".join([*plugins, CONNECT_PLUGIN])
    settings["spark.connect.grpc.binding.address"] = host
    settings["spark.connect.grpc.binding.port"] = str(port)
    env_remote = os.environ.pop("SPARK_REMOTE", None)  # this process is the server
    try:
        spark = get_spark(settings)
    finally:
        if env_remote is not None:
            os.environ["SPARK_REMOTE"] = env_remote
    if CONNECT_PLUGIN not in spark.sparkContext.getConf().get("spark.plugins", ""):
        raise SparkConnectError("Spark already runs in this process without a Connect server")
    return spark


_JOB_PROPERTIES = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
_group_numbers = itertools.count(1)


class JobGroup:
    """The Spark jobs one thread starts while the group is open, under one job group: the
    Spark UI lists them with their group and ``description``, and :meth:`close` counts them.

    A job group is a property of the thread that starts the jobs (PySpark pins each Python
    thread to a JVM thread of its own), so views refreshed at once keep their jobs apart; the
    jobs Spark starts on its own threads for a query (broadcasts, adaptive stages) inherit it.
    Opening saves the thread's previous group and closing restores it.

    On Spark Connect the group is an operation tag of the thread (the server's UI lists the
    operations by tag) and the jobs are not counted: ``jobs`` stays None.
    """

    def __init__(self, name: str, description: str) -> None:
        self.id = f"ivm-{next(_group_numbers)} {name}".replace(",", ";")  # a tag has no commas
        self.description = description
        self.jobs: int | None = 0
        self._previous: tuple[str | None, ...] | None = None

    @property
    def opened(self) -> bool:
        return self._previous is not None

    def open(self, spark) -> None:  # spark: SparkSession
        if is_connect(spark):
            spark.addTag(self.id)
            self._previous = ()
            return
        sc = spark.sparkContext
        self._previous = tuple(sc.getLocalProperty(k) for k in _JOB_PROPERTIES)
        sc.setJobGroup(self.id, self.description)

    def close(self, spark) -> int | None:
        """Restore the thread's previous group; the number of jobs started in this one (None
        on Spark Connect)."""
        if self._previous is None:
            return 0
        if is_connect(spark):
            spark.removeTag(self.id)
            self._previous, self.jobs = None, None
            return None
        sc = spark.sparkContext
        _listeners_caught_up(sc)
        self.jobs = len(sc.statusTracker().getJobIdsForGroup(self.id))
        for key, value in zip(_JOB_PROPERTIES, self._previous, strict=True):
            sc.setLocalProperty(key, value)  # None removes it
        self._previous = None
        return self.jobs


def _listeners_caught_up(sc, timeout_ms: int = 2000) -> None:
    """Wait until Spark's listeners have seen every event posted so far (the status tracker
    learns of a job from its start event, delivered asynchronously). Spark's own tests use
    this internal call; if a Spark version lacks it, counts may miss a job that just ended."""
    from py4j.protocol import Py4JError

    try:
        sc._jsc.sc().listenerBus().waitUntilEmpty(timeout_ms)
    except Py4JError:
        return


def _active_session():
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()
