"""The ``ivm`` command: refresh, show, explain, status, arrangements, verify, vacuum, compact
for a project, and ``spark-server`` (a warm Spark Connect server its runs can compute on).

Owns argument parsing, output formats and exit codes: 0 on success, 1 when a refresh ran but
some view failed, 2 on bad input (one line on stderr naming the file, the object and, for
SQL, the line and column; nothing is written). ``show``, ``explain`` and ``status`` start no
Spark session: they read the Delta log and Parquet files with delta-rs.

Contract in ``(data, time, diff)`` terms: ``refresh`` advances every view to the newest epoch;
``show`` prints the view's collection at its epoch, one line per row occurrence.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import decimal
import io
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import duckdb
import pyarrow as pa

from engine.inspect import Inspector
from engine.oracle import compare_views
from ivm.config import CONFIG_ENV
from ivm.errors import IvmError
from resources.spark import DEFAULT_CONNECT_PORT, get_spark, remote_address, remote_url, serve


def _json_default(v: Any) -> Any:
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, (dt.date, dt.datetime)):
        return v.isoformat()
    if isinstance(v, bytes):
        return v.hex()
    return str(v)


def _sorted(table: pa.Table) -> pa.Table:
    try:
        return table.sort_by([(c, "ascending") for c in table.column_names])
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        return table


def _cell(v: Any) -> str:
    return "NULL" if v is None else str(v)


def format_rows(table: pa.Table, fmt: str) -> str:
    """Render rows as an aligned text table, CSV, or JSON (one array of objects)."""
    table = _sorted(table)
    rows = table.to_pylist()
    cols = table.column_names
    if fmt == "json":
        return json.dumps(rows, default=_json_default, indent=1) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols)
        for r in rows:
            w.writerow(
                [
                    ""
                    if r[c] is None
                    else _json_default(r[c])
                    if not isinstance(r[c], (int, float, str))
                    else r[c]
                    for c in cols
                ]
            )
        return buf.getvalue()
    cells = [[_cell(r[c]) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths, strict=False)).rstrip()  # noqa: E731
    out = [line(cols), line(["-" * w for w in widths])]
    out.extend(line(row) for row in cells)
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out) + "\n"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ivm",
        description="Incremental materialized views over Delta Lake (Spark + Dagster).",
    )
    p.add_argument(
        "--project",
        default=os.environ.get(CONFIG_ENV, "."),
        help=f"project directory or ivm.toml (default: ${CONFIG_ENV} or the current directory)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="also log engine details")
    p.add_argument(
        "-q", "--quiet", action="store_true", help="no progress lines on stderr during refresh"
    )
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("refresh", help="run one epoch: bring every view up to date")
    r.add_argument("views", nargs="*", help="only these views (default: all)")
    r.add_argument("--json", action="store_true", help="print the report as JSON")
    r.add_argument(
        "--rebuild",
        action="store_true",
        help="recompute the views (default: all) from their inputs' current state at a new "
        "epoch; downstream views still receive only the changes",
    )
    _reading_commands(sub)
    _writing_commands(sub)
    return p


def _reading_commands(sub: argparse._SubParsersAction) -> None:
    """Subcommands that change no view: show, explain, status, arrangements, verify."""
    s = sub.add_parser("show", help="print a view's current rows")
    s.add_argument("view")
    s.add_argument("--format", choices=("table", "csv", "json"), default="table")
    s.add_argument("--limit", type=int, default=None, help="print at most N rows")
    e = sub.add_parser("explain", help="print a view's incremental plan")
    e.add_argument("view")
    st = sub.add_parser("status", help="consumed source versions and each view's epoch")
    st.add_argument("--json", action="store_true")
    ar = sub.add_parser(
        "arrangements", help="shared arrangements: key, columns, size, and the views using each"
    )
    ar.add_argument("--json", action="store_true")
    v = sub.add_parser(
        "verify",
        help="recompute views from scratch (Spark SQL, or DuckDB) at their epoch and report "
        "differences",
    )
    v.add_argument("views", nargs="*", help="only these views (default: all)")
    v.add_argument(
        "--oracle",
        choices=("spark", "duckdb"),
        default="spark",
        help="who evaluates the views' SQL from scratch: spark (default; its own SQL, over "
        "the inputs at the view's epoch) or duckdb (independent: the SQL translated to "
        "DuckDB, over the sources at that epoch, no Spark)",
    )
    v.add_argument(
        "--repair",
        action="store_true",
        help="rebuild a view that differs at a new epoch (its correcting updates go to its "
        "diff log, so downstream views receive them), then verify again (--oracle spark)",
    )
    v.add_argument("--json", action="store_true")


def _writing_commands(sub: argparse._SubParsersAction) -> None:
    """Subcommands that write the lake or serve: vacuum, compact, spark-server."""
    vac = sub.add_parser(
        "vacuum",
        help="delete files no recent table version references (uncommitted or replaced files)",
    )
    vac.add_argument(
        "--hours", type=float, default=168.0, help="keep files of versions this recent (168)"
    )
    co = sub.add_parser(
        "compact",
        help="advance every table's since (consolidate old updates), optimize, vacuum; report "
        "rows and bytes before and after, and stored bytes per row against raw Parquet",
    )
    co.add_argument(
        "--hours", type=float, default=168.0, help="vacuum keeps files of versions this recent"
    )
    co.add_argument("--json", action="store_true")
    sv = sub.add_parser(
        "spark-server",
        help="keep a warm Spark serving Spark Connect clients: runs whose project sets "
        "spark.remote (a Dagster run, `ivm refresh`) compute on it instead of starting a JVM",
    )
    sv.add_argument(
        "--warm-up",
        action="store_true",
        help="once serving, verify every view on the server (reads only): the first run after "
        "a start then finds compiled code",
    )
    sv.add_argument(
        "--host",
        default="127.0.0.1",
        help="interface to listen on (127.0.0.1; the server has no authentication: expose it "
        "only on a network you trust)",
    )
    sv.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"port to serve (default: the project's spark.remote, else {DEFAULT_CONNECT_PORT})",
    )


def _spark_server(engine: Any, args: argparse.Namespace) -> int:
    """Serve until interrupted (Ctrl-C or SIGTERM), then stop Spark."""
    conf = engine.project.spark_conf
    url = remote_url(conf)
    port = args.port or (remote_address(url)[1] if url else DEFAULT_CONNECT_PORT)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    spark = serve(conf, port, args.host)
    where = "localhost" if args.host == "127.0.0.1" else args.host
    print(
        f"Spark Connect server on {args.host}:{port} (Spark {spark.version}); clients set "
        f'`"spark.remote" = "sc://{where}:{port}"` in [spark] or SPARK_REMOTE. '
        "Ctrl-C stops it.",
        file=sys.stderr,
        flush=True,
    )
    if args.warm_up:
        threading.Thread(target=warm_up, args=(engine.project, spark), daemon=True).start()
    try:
        while not stop.wait(3600):
            pass
    except KeyboardInterrupt:
        pass
    spark.stop()
    return 0


def warm_up(project: Any, spark: Any) -> list[Any]:
    """Verify every view on ``spark`` (reads only: nothing is written), so that a server's
    JVM compiles the code of scans, joins and aggregates before its first client needs it;
    returns the :class:`~engine.facade.VerifyResult` of each view that could be verified. Runs
    beside the clients (they are served meanwhile); a view that cannot be verified (not built
    yet, broken) is skipped, named."""
    from engine.facade import Engine  # here: the commands without Spark never import PySpark

    def say(message: str) -> None:
        print(f"warm-up: {message}", file=sys.stderr, flush=True)

    engine = Engine(project, spark=spark, progress=lambda m: None)
    started = time.perf_counter()
    results = []
    for name in engine.plan.order:
        try:
            results.append(engine.verify(name))
        except IvmError as e:
            say(f"{name} skipped: {e}")
    differ = [r.view for r in results if not r.ok]
    say(
        f"{len(results)} views verified in {time.perf_counter() - started:.1f}s"
        + (f"; they differ from their SQL: {', '.join(differ)} (`ivm verify`)" if differ else "")
    )
    return results


def _compact(engine: Any, args: argparse.Namespace) -> int:
    from engine.compact import compact, storage_report  # here: it imports PySpark

    report = compact(engine, retention_hours=args.hours)
    storage = storage_report(engine)
    if args.json:
        print(
            json.dumps(
                {
                    "tables": [t.as_dict() for t in report.tables],
                    "totals": report.totals(),
                    "files_vacuumed": report.files_vacuumed,
                    "seconds": round(report.seconds, 3),
                    "storage": storage,
                },
                indent=1,
            )
        )
        return 0
    rows = [
        {
            "table": t.table,
            "since": "-" if t.since_after is None else f"{t.since_before or 0} -> {t.since_after}",
            "rows": f"{t.rows_before} -> {t.rows_after}",
            "bytes": f"{t.bytes_before} -> {t.bytes_after}",
            "files": f"{t.files_before} -> {t.files_after}",
            "note": t.skipped or "",
        }
        for t in report.tables
    ]
    sys.stdout.write(format_rows(pa.Table.from_pylist(rows), "table"))
    tot = report.totals()
    print(
        f"total: rows {tot['rows_before']} -> {tot['rows_after']}, bytes {tot['bytes_before']} "
        f"-> {tot['bytes_after']}, files {tot['files_before']} -> {tot['files_after']}; "
        f"{report.files_vacuumed} files vacuumed ({report.seconds:.1f}s)"
    )
    print("stored bytes per row against the raw Parquet bytes of the same columns:")
    sys.stdout.write(format_rows(pa.Table.from_pylist(storage), "table"))
    return 0


def _verify(engine: Any, args: argparse.Namespace) -> int:
    if args.oracle == "duckdb":  # internal views: Spark's oracle only (compare_views)
        return _verify_duckdb(engine, args.views or list(engine.plan.project_views), args)
    names = args.views or list(engine.plan.order)
    results = []
    for name in names:
        r = engine.verify(name)
        if not r.ok and args.repair:
            r = engine.repair(name)
        results.append(r)
    if args.json:
        print(json.dumps([r.as_dict() for r in results], default=_json_default, indent=1))
    else:
        for r in results:
            print(r.describe() + (" (after repair)" if r.repaired else ""))
    return 0 if all(r.ok for r in results) else 1


def _verify_duckdb(engine: Any, names: list[str], args: argparse.Namespace) -> int:
    """``verify --oracle duckdb``: each view's table against DuckDB's evaluation of its SQL
    (:func:`engine.oracle.compare_views`), and its diff log summed against its table; no Spark."""
    for name in names:
        engine.view(name)  # an unknown view is named before any work
    try:
        results = compare_views(engine, names, log=True)
    except duckdb.Error as e:  # SQL DuckDB cannot run (a function it lacks): say so, exit 2
        first = str(e).strip().splitlines()[0]
        raise IvmError(f"DuckDB cannot evaluate the views: {first} (use --oracle spark)") from e
    if args.json:
        print(json.dumps([c.as_dict() for c in results], default=_json_default, indent=1))
    else:
        for c in results:
            print(c.describe())
    return 0 if all(c.equal for c in results) else 1


def _refresh(engine: Any, args: argparse.Namespace) -> int:
    report = engine.refresh(args.views or None, rebuild=args.rebuild)
    if args.json:
        print(
            json.dumps(
                {
                    "epoch": engine.latest_epoch(),
                    "minted": report.minted.epoch if report.minted else None,
                    "seconds": round(report.seconds, 3),
                    "views": {v.view: {**v.metadata(), "error": v.error} for v in report.views},
                    "quarantined": {
                        q.source: {"rows": q.rows, "table": q.table, "example": q.example}
                        for q in report.quarantined
                    },
                },
                indent=1,
                default=str,
            )
        )
    else:
        if report.minted is None:
            print(f"no source changed since epoch {engine.latest_epoch()}")
        width = max([len(v.view) for v in report.views] + [4])
        print(
            f"{'view'.ljust(width)}  epoch  rows changed  table rows rewritten  seconds  "
            "spark jobs  status"
        )
        for v in report.views:
            print(
                f"{v.view.ljust(width)}  {v.epoch:>5}  {v.rows_changed:>12}  "
                f"{v.rows_rewritten:>20}  {v.seconds:>7.2f}  "
                f"{'-' if v.spark_jobs is None else v.spark_jobs:>10}  {v.status}{': ' + (v.error or v.reason) if v.error or v.reason else ''}"
            )
        for v in report.views:
            if v.placement:  # where the policy placed its computation, and why
                print(f"{v.view}: computed by {v.computed_by}; placed on {v.placement}")
            for why in v.driver_declined:  # a small change the driver handed to Spark
                print(f"{v.view}: driver declined: {why}")
        for q in report.quarantined:
            if q.rows:
                print(q.describe())
        print(f"total {report.seconds:.2f}s")
    return 0 if report.ok else 1


def _status(engine: Any, args: argparse.Namespace) -> int:
    st = engine.status()
    if args.json:
        print(json.dumps(st, indent=1, default=_json_default))
        return 0
    print(f"lake: {st['lake']}")
    print(f"epoch: {st['epoch']}" + (f" (minted {st['minted_at']})" if st["minted_at"] else ""))
    print("sources:")
    for name, s in st["sources"].items():
        consumed = "-" if s["consumed_version"] is None else s["consumed_version"]
        current = "missing" if s["current_version"] is None else s["current_version"]
        print(f"  {name}: consumed version {consumed}, current version {current}  ({s['path']})")
    print("views:")
    for name, v in st["views"].items():
        rows = "-" if v["rows"] is None else v["rows"]
        if v.get("error"):
            print(f"  {name}: BROKEN: {v['error']}")
            continue
        internal = f"  (internal, of view {v['internal_of']})" if v.get("internal_of") else ""
        print(f"  {name}: epoch {v['epoch']}, {rows} rows{internal}")
    return 0


def _arrangements(engine: Any, args: argparse.Namespace) -> int:
    rows = engine.arrangement_status()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print("no arrangements: no view joins anything")
        return 0
    table = pa.Table.from_pylist(
        [
            {
                "arrangement": r["arrangement"],
                "columns": ", ".join(r["columns"]),
                "rows": r["rows"],
                "bytes": r["bytes"],
                "files": r["files"],
                "epoch": r["epoch"],
                "used by": ", ".join(r["users"]),
            }
            for r in rows
        ]
    )
    sys.stdout.write(format_rows(table, "table"))
    return 0


WITHOUT_SPARK = frozenset({"show", "explain", "status", "arrangements", "vacuum"})
"""Commands that need no Spark (:class:`~engine.inspect.Inspector`): they start faster and
run where no Java is installed."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ivm`` command; returns the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s"
    )
    engine: Inspector | None = None
    try:
        show_progress = args.command in ("refresh", "compact") and not args.quiet or args.verbose
        progress = (lambda m: print(m, file=sys.stderr, flush=True)) if show_progress else None
        if args.command == "verify" and args.repair and args.oracle != "spark":
            raise IvmError(
                "verify --repair rebuilds views on Spark and checks them with it: use it with "
                "--oracle spark (the default), not --oracle duckdb"
            )
        duckdb_verify = args.command == "verify" and args.oracle == "duckdb"
        if args.command in WITHOUT_SPARK or duckdb_verify:
            engine = Inspector(args.project, progress=progress)
        else:
            # Imported here, not at the top: the commands without Spark never import PySpark.
            from engine.facade import Engine

            engine = Engine(args.project, progress=progress)
        if args.command == "refresh":
            return _refresh(engine, args)
        if args.command == "show":
            table = engine.read_view(args.view)
            if args.limit is not None:
                table = _sorted(table).slice(0, args.limit)
            sys.stdout.write(format_rows(table, args.format))
            return 0
        if args.command == "explain":
            sys.stdout.write(engine.explain(args.view))
            return 0
        if args.command == "arrangements":
            return _arrangements(engine, args)
        if args.command == "verify":
            return _verify(engine, args)
        if args.command == "compact":
            return _compact(engine, args)
        if args.command == "spark-server":
            return _spark_server(engine, args)
        if args.command == "vacuum":
            deleted = engine.vacuum(args.hours)
            for table, n in deleted.items():
                print(f"{table}: {n} files deleted")
            print(f"{sum(deleted.values())} files deleted in {len(deleted)} tables")
            return 0
        return _status(engine, args)
    except IvmError as e:
        print(f"ivm: error: {e}", file=sys.stderr)
        return 2
    finally:
        if engine is not None:
            engine.release_spark()  # `entry` exits without running atexit handlers


def entry() -> None:
    """Console-script entry: exit without interpreter finalization.

    Native thread pools (delta-rs's runtime, Arrow's) can abort with "terminate called
    without an active exception" when Python tears them down at exit; everything the command
    wrote is committed and flushed by then, so skip that teardown.
    """
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    if _spark_started():
        get_spark().stop()
    os._exit(code)


def _spark_started() -> bool:
    if "pyspark" not in sys.modules:
        return False
    from pyspark.sql import SparkSession  # here: only once PySpark was imported anyway

    return SparkSession.getActiveSession() is not None


if __name__ == "__main__":  # `python -m engine.cli` exits the same way as the `ivm` command
    entry()
