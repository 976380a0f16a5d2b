"""The project file ``ivm.toml``: where the lake is, where the views are, which sources exist.

A project is plain data, loaded and validated without Spark. Relative paths are taken relative
to the directory holding ``ivm.toml``; URIs (``s3://...``) pass through unchanged.

Contract in ``(data, time, diff)`` terms: a project only names collections. Sources are the
input collections (Delta tables whose versions become epochs); views are the derived ones.

Example ``ivm.toml``::

    lake = "lake"
    views = "views"
    [sources]
    orders = "data/orders"
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ivm.errors import ConfigError
from ivm.policy import Policy

CONFIG_ENV = "IVM_PROJECT"
"""Environment variable naming the ``ivm.toml`` (or its directory) the Dagster location loads."""

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KNOWN_KEYS = {
    "lake",
    "views",
    "sources",
    "contracts",
    "spark",
    "refresh",
    "policy",
    "dagster",
    "catalog",
}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?")
"""A catalog database: ``schema`` or ``catalog.schema`` (Unity Catalog's three levels)."""

AUTOMATIONS = ("eager", "on_cron", "none")
"""How Dagster keeps views fresh (``[dagster] automation``): refresh when an input changed,
after each tick of ``[dagster] cron``, or only when asked (a run, the sensor, a schedule)."""

DEFAULT_AUTOMATION_CRON = "0 * * * *"

DEFAULT_PARALLELISM = 4
"""Views refreshed at once when ``[refresh] parallelism`` is not set."""

DEFAULT_RECOMPUTE_ABOVE = 0.2
"""Share of a view's input rows changed above which a refresh recomputes the view from its
inputs instead of from their changes, when ``[refresh] recompute_above`` is not set
(where the two cross on ``./dev bench``'s sweep: see BENCHMARKS.md)."""


def _is_uri(value: str) -> bool:
    return "://" in value


@dataclass(frozen=True, slots=True)
class Project:
    """A loaded ``ivm.toml``.

    Attributes:
        root: directory of the project file.
        config_file: the ``ivm.toml`` path.
        lake: where the system keeps its tables (local path or URI).
        views_dir: folder of ``*.sql`` files.
        sources: source name -> Delta table path or URI, in file order.
        spark_conf: extra Spark settings from the optional ``[spark]`` table.
        contracts: source name -> ``file.py:Name`` of the pandera schema declared for it
            (optional ``[contracts]`` table; see ``resources.contracts``).
        parallelism: how many views one refresh brings up to date at once (``[refresh]
            parallelism``); a view starts once the views it reads are done. Spark runs their
            jobs side by side, which hides its per-job latency.
        recompute_above: the share of a view's input rows changed since its last epoch
            (``[refresh] recompute_above``, 0 to 1) above which the refresh recomputes the view
            from its inputs' state instead of from their changes; 1 never does.
        cache_mb: the driver memory (MiB, ``[refresh] cache_mb``) that keeps arrangement and
            state files decoded between lookups (:mod:`resources.filecache`); 0 keeps none,
            None: the cache's default (a quarter of the machine's memory, at most 8 GiB).
        policy: the execution policy of the optional ``[policy]`` table
            (:class:`ivm.policy.Policy`: the thresholds that choose between the driver's and
            Spark's paths), put in force by the engine; None: the process's.
        automation: the automation condition the Dagster location gives the epoch,
            arrangements and views (``[dagster] automation``, one of :data:`AUTOMATIONS`).
        automation_cron: the cron schedule of ``on_cron`` (``[dagster] cron``).
        catalog_database: the database of Spark's catalog each view table is registered in
            (``[catalog] database``), so Spark SQL reads ``database.view``; None: none is.
        metastore: a folder for an embedded Hive metastore (``[catalog] metastore``) that
            Spark sessions started with this project use (their ``[spark]`` settings get it),
            for a Spark without a metastore of its own; None: the session's catalog as
            configured (Unity Catalog, a Hive metastore service, Glue...).
    """

    root: Path
    config_file: Path
    lake: str
    views_dir: Path
    sources: dict[str, str]
    spark_conf: dict[str, str] = field(default_factory=dict)
    contracts: dict[str, str] = field(default_factory=dict)
    parallelism: int = DEFAULT_PARALLELISM
    recompute_above: float = DEFAULT_RECOMPUTE_ABOVE
    cache_mb: int | None = None
    policy: Policy | None = None
    automation: str = "eager"
    automation_cron: str = DEFAULT_AUTOMATION_CRON
    catalog_database: str | None = None
    metastore: str | None = None

    def view_files(self) -> list[Path]:
        """The project's view files, sorted by name."""
        return sorted(self.views_dir.glob("*.sql"))


def _resolve(root: Path, value: str) -> str:
    if _is_uri(value):
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (root / path).resolve())


def _sources_and_contracts(
    file: Path, root: Path, data: dict[str, Any]
) -> tuple[dict[str, str], dict[str, str]]:
    """``[sources]`` (name -> resolved path) and ``[contracts]`` (source -> ``file.py:Schema``),
    checked."""
    raw_sources = data.get("sources", {})
    if not isinstance(raw_sources, dict):
        raise ConfigError(f'{file}: [sources] must be a table of name = "path"')
    sources: dict[str, str] = {}
    for name, value in raw_sources.items():
        if not _NAME.match(name):
            raise ConfigError(f"{file}: source name {name!r} is not a valid SQL identifier")
        if not isinstance(value, str):
            raise ConfigError(f"{file}: source {name!r} must be a path string")
        sources[name.lower()] = _resolve(root, value)
    raw_contracts = data.get("contracts", {})
    if not isinstance(raw_contracts, dict):
        raise ConfigError(f'{file}: [contracts] must be a table of source = "file.py:Schema"')
    contracts: dict[str, str] = {}
    for name, value in raw_contracts.items():
        if name.lower() not in sources:
            raise ConfigError(f"{file}: [contracts] names {name!r}, which is not a source")
        if not isinstance(value, str):
            raise ConfigError(f'{file}: contract of {name!r} must be "file.py:Schema"')
        contracts[name.lower()] = value
    return sources, contracts


def load_project(path: str | os.PathLike[str] | None = None) -> Project:
    """Load and validate a project.

    Args:
        path: an ``ivm.toml`` file or the directory holding one; defaults to ``$IVM_PROJECT``.

    Returns:
        The project, with every path resolved.

    Raises:
        ConfigError: the file is missing or malformed, or a key or name is invalid.
    """
    if path is None:
        env = os.environ.get(CONFIG_ENV)
        if not env:
            raise ConfigError(f"no project given: pass --project DIR or set {CONFIG_ENV}")
        path = env
    file = Path(path)
    if file.is_dir():
        file = file / "ivm.toml"
    if not file.is_file():
        raise ConfigError(f"{file}: project file not found")
    try:
        data = tomllib.loads(file.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{file}: malformed TOML: {e}") from e
    unknown = sorted(set(data) - _KNOWN_KEYS)
    if unknown:
        raise ConfigError(
            f"{file}: unknown key {unknown[0]!r} (expected {', '.join(sorted(_KNOWN_KEYS))})"
        )
    root = file.parent.resolve()
    for key in ("lake", "views"):
        if not isinstance(data.get(key, ""), str):
            raise ConfigError(f"{file}: {key!r} must be a string path")
    lake = _resolve(root, data.get("lake", "lake"))
    views_dir = Path(_resolve(root, data.get("views", "views")))
    if not views_dir.is_dir():
        raise ConfigError(f"{file}: views folder {str(views_dir)!r} does not exist")
    sources, contracts = _sources_and_contracts(file, root, data)
    spark_conf = data.get("spark", {})
    if not isinstance(spark_conf, dict):
        raise ConfigError(f"{file}: [spark] must be a table of Spark settings")
    parallelism, recompute_above, cache_mb = _refresh_settings(file, data.get("refresh", {}))
    automation, automation_cron = _dagster_settings(f"{file}: [dagster]", data.get("dagster", {}))
    policy = data.get("policy", {})
    if not isinstance(policy, dict):
        raise ConfigError(f"{file}: [policy] must be a table of policy settings")
    database, metastore = _catalog_settings(f"{file}: [catalog]", root, data.get("catalog", {}))
    spark_conf = {str(k): str(v) for k, v in spark_conf.items()}
    if metastore is not None:
        spark_conf = {**metastore_settings(metastore), **spark_conf}
    return Project(
        root=root,
        config_file=file.resolve(),
        lake=lake,
        views_dir=views_dir,
        sources=sources,
        spark_conf=spark_conf,
        contracts=contracts,
        parallelism=parallelism,
        recompute_above=recompute_above,
        cache_mb=cache_mb,
        policy=Policy.from_config(policy, f"{file}: [policy]") if "policy" in data else None,
        automation=automation,
        automation_cron=automation_cron,
        catalog_database=database,
        metastore=metastore,
    )


def _catalog_settings(where: str, root: Path, table: object) -> tuple[str | None, str | None]:
    """``[catalog]``'s database and metastore folder, checked (errors start with ``where``)."""
    if not isinstance(table, dict):
        raise ConfigError(f'{where} must be a table (database = "analytics", metastore = ...)')
    unknown = sorted(set(table) - {"database", "metastore"})
    if unknown:
        raise ConfigError(f"{where} has unknown key {unknown[0]!r} (expected database, metastore)")
    database = table.get("database")
    if database is not None and (not isinstance(database, str) or not _NAME.fullmatch(database)):
        raise ConfigError(
            f"{where} database must be a name like analytics or main.analytics, not {database!r}"
        )
    metastore = table.get("metastore")
    if metastore is not None and not isinstance(metastore, str):
        raise ConfigError(f"{where} metastore must be a folder path, not {metastore!r}")
    if metastore is not None and database is None:
        raise ConfigError(f"{where} metastore is used only with a database")
    return database, None if metastore is None else _resolve(root, metastore)


def metastore_settings(folder: str) -> dict[str, str]:
    """Spark settings for an embedded Hive metastore (Derby) and warehouse under ``folder``:
    the catalog a local Spark keeps between sessions. Derby lets one JVM open it at a time."""
    return {
        "spark.sql.catalogImplementation": "hive",
        "spark.hadoop.javax.jdo.option.ConnectionURL": (
            f"jdbc:derby:;databaseName={folder}/metastore_db;create=true"
        ),
        "spark.sql.warehouse.dir": f"{folder}/warehouse",
    }


def _dagster_settings(where: str, table: object) -> tuple[str, str]:
    """``[dagster]``'s automation and cron, checked (errors start with ``where``)."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table (automation = ..., cron = ...)")
    unknown = sorted(set(table) - {"automation", "cron"})
    if unknown:
        raise ConfigError(f"{where} has unknown key {unknown[0]!r} (expected automation, cron)")
    automation = table.get("automation", "eager")
    if automation not in AUTOMATIONS:
        raise ConfigError(
            f"{where} automation must be one of {', '.join(AUTOMATIONS)}, not {automation!r}"
        )
    cron = table.get("cron", DEFAULT_AUTOMATION_CRON)
    if not isinstance(cron, str) or len(cron.split()) != 5:
        raise ConfigError(
            f'{where} cron must be a cron schedule of five fields (e.g. "0 * * * *"), not {cron!r}'
        )
    if "cron" in table and automation != "on_cron":
        raise ConfigError(f'{where} cron is used only with automation = "on_cron"')
    return automation, cron


def with_automation(
    project: Project, automation: str | None, cron: str | None, where: str
) -> Project:
    """``project`` with ``[dagster]``'s automation and cron replaced by those given (None keeps
    the project's), checked as ``[dagster]`` is; errors start with ``where``.

    Raises:
        ConfigError: an unknown automation, a malformed cron, or a cron without ``on_cron``.
    """
    table = {"automation": automation or project.automation}
    if cron is not None:
        table["cron"] = cron
    elif table["automation"] == "on_cron":
        table["cron"] = project.automation_cron
    automation, cron = _dagster_settings(where, table)
    return replace(project, automation=automation, automation_cron=cron)


def _refresh_settings(file: Path, refresh: object) -> tuple[int, float, int | None]:
    """``[refresh]``'s parallelism, recompute_above and cache_mb, checked."""
    if not isinstance(refresh, dict) or set(refresh) - {
        "parallelism",
        "recompute_above",
        "cache_mb",
    }:
        raise ConfigError(
            f"{file}: [refresh] takes parallelism = <views at once>, "
            "recompute_above = <share of input rows changed, 0 to 1> and "
            "cache_mb = <driver memory for decoded arrangement files, MiB>"
        )
    parallelism = refresh.get("parallelism", DEFAULT_PARALLELISM)
    if not isinstance(parallelism, int) or isinstance(parallelism, bool) or parallelism < 1:
        raise ConfigError(f"{file}: [refresh] parallelism must be a whole number >= 1")
    recompute_above = refresh.get("recompute_above", DEFAULT_RECOMPUTE_ABOVE)
    if (
        not isinstance(recompute_above, int | float)
        or isinstance(recompute_above, bool)
        or not 0 <= recompute_above <= 1
    ):
        raise ConfigError(
            f"{file}: [refresh] recompute_above must be a number from 0 to 1 (the share of a "
            f"view's input rows changed; 1 never recomputes), not {recompute_above!r}"
        )
    cache_mb = refresh.get("cache_mb")
    if cache_mb is not None and (
        not isinstance(cache_mb, int) or isinstance(cache_mb, bool) or cache_mb < 0
    ):
        raise ConfigError(
            f"{file}: [refresh] cache_mb must be a whole number of MiB >= 0 (0: no cache), "
            f"not {cache_mb!r}"
        )
    return parallelism, float(recompute_above), cache_mb
