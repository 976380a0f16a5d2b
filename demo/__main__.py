"""The demo, end to end on an embedded local lake (the README's first command).

1. Generate TPC-H (``tpchgen-cli``) and write it as Delta tables with CDF on.
2. Create a project (``ivm.toml`` + the views in ``demo/views``) and refresh: the first epoch
   builds every view from the sources' snapshots.
3. Apply a TPC-H-style batch (RF1 inserts, RF2 deletes, updates) and refresh again: only the
   change is read and written.
4. Compare every view with DuckDB's from-scratch evaluation of the same SQL.

Everything lands under ``demo/work/`` (regenerated each run). Exit 1 if any view differs.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from demo.tpch import apply_change_batch, create_sources, generate_parquet
from engine.facade import Engine, RefreshReport
from engine.oracle import compare_views
from resources.spark import get_spark

HERE = Path(__file__).resolve().parent
WORK = HERE / "work"


def say(msg: str = "") -> None:
    print(msg, flush=True)


def timed(label: str):
    class _T:
        def __enter__(self):
            self.t = time.perf_counter()
            return self

        def __exit__(self, *exc):
            self.seconds = time.perf_counter() - self.t
            if exc[0] is None:
                say(f"  {label}: {self.seconds:.1f}s")

    return _T()


def write_project(root: Path, sources: dict[str, str], views: Path = HERE / "views") -> Path:
    """A project in ``root`` over ``sources`` (Delta tables under ``root/data``) with the
    views of ``views`` (default: the demo's); its ``ivm.toml``."""
    (root / "views").mkdir(parents=True, exist_ok=True)
    for f in sorted(views.glob("*.sql")):
        shutil.copy(f, root / "views" / f.name)
    lines = ['lake = "lake"', 'views = "views"', "", "[sources]"]
    lines += [f'{name} = "data/{name}"' for name in sources]
    lines += ["", "[spark]", '"spark.sql.shuffle.partitions" = "4"']
    (root / "ivm.toml").write_text("\n".join(lines) + "\n")
    return root / "ivm.toml"


def print_report(report: RefreshReport, title: str) -> None:
    say(f"  {title}")
    width = max(len(v.view) for v in report.views)
    say(f"    {'view'.ljust(width)}  epoch  inserted  deleted  table rows rewritten  seconds")
    for v in report.views:
        say(
            f"    {v.view.ljust(width)}  {v.epoch:>5}  {v.inserted:>8}  {v.deleted:>7}  "
            f"{v.rows_rewritten:>20}  {v.seconds:>7.2f}"
            f"{'  ' + v.status if v.status == 'failed' else ''}"
        )


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    """The demo's command line: the TPC-H scale factor and the change batch's size."""
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.1, help="TPC-H scale factor (0.1)")
    parser.add_argument(
        "--change", type=float, default=0.001, help="fraction of orders per change kind (0.001)"
    )
    return parser.parse_args(argv)


def _create_project(scale: float, project_dir: Path) -> tuple[Path, dict[str, str]]:
    """Step 1: TPC-H as Delta sources and a fresh project over them; its config and sources."""
    if project_dir.exists():
        shutil.rmtree(project_dir)
    say(f"== 1. TPC-H scale factor {scale:g} as Delta sources with CDF")
    with timed("tpchgen-cli"):
        parquet = generate_parquet(scale, WORK / "tpch")
    with timed("write Delta sources"):
        sources = create_sources(parquet, project_dir / "data")
    config = write_project(project_dir, sources)
    say(f"  project: {config}")
    return config, sources


def _first_refresh(config: Path) -> tuple[Any, RefreshReport]:
    """Step 2: start Spark and build every view; the session and the refresh's report."""
    say("\n== 2. First refresh: every view built from the sources' snapshots")
    with timed("start Spark"):
        spark = get_spark()
    engine = Engine(config, spark=spark)
    for name in engine.plan.order:
        say(f"  view {name}: {', '.join(engine.plan.views[name].columns)}")
    with timed("refresh (epoch 1)"):
        first = engine.refresh()
    print_report(first, "per view:")
    return spark, first


def _change_and_refresh(
    config: Path, spark: Any, sources: dict[str, str], change: float
) -> tuple[Engine, RefreshReport]:
    """Step 3: apply a change batch to the sources and refresh; the engine and its report."""
    say(f"\n== 3. A change batch ({change:.2%} of orders per kind), then refresh")
    with timed("apply batch to sources"):
        summary = apply_change_batch(sources, change)
    say(f"  {summary}")
    # measure_lookups: also record the rows Spark's scans really read (costs an extra pass).
    engine = Engine(config, spark=spark, measure_lookups=True)
    with timed("refresh (epoch 2)"):
        second = engine.refresh()
    print_report(
        second,
        "per view (the change was read and logged; a readable table rewrites the files its "
        "deletions hit):",
    )
    print_lookups(second)
    return engine, second


def print_lookups(report: RefreshReport) -> None:
    """Per view and arrangement: the rows and files its lookups read, against the whole."""
    say("  arrangement lookups (rows Spark's scans read / rows in the arrangement):")
    for v in report.views:
        for name, st in v.lookups.items():
            share = st.rows_scanned / st.rows_total if st.rows_total else 0.0
            say(
                f"    {v.view} -> {name}: {st.lookups} lookups of {st.keys} keys read "
                f"{st.rows_scanned} of {st.rows_total} rows ({share:.1%}), "
                f"{st.files_opened} of {st.files_total} files"
            )


def _compare(engine: Engine) -> bool:
    """Step 4: every view against DuckDB from scratch; whether all are equal."""
    say("\n== 4. Every view against DuckDB's from-scratch evaluation of the same SQL")
    with timed("DuckDB evaluation and comparison"):
        results = compare_views(engine)
    for r in results:
        say(f"  {r.describe()}")
    return all(r.equal for r in results)


def _say_next(project_dir: Path, config: Path) -> None:
    """The commands to explore the demo's project next (CLI and Dagster UI)."""
    say(
        "\nNext:\n"
        f"  .venv/bin/ivm --project {project_dir} show urgent_open_orders\n"
        f"  .venv/bin/ivm --project {project_dir} explain urgent_open_orders\n"
        f"  .venv/bin/ivm --project {project_dir} status\n"
        f"  .venv/bin/ivm --project {project_dir} arrangements\n"
        "  Open the same project in the Dagster UI (lineage, plans, refresh runs):\n"
        f"    IVM_PROJECT={config} .venv/bin/dagster dev -w workspace.yaml\n"
        "  then browse http://127.0.0.1:3000 (Assets -> Lineage) and materialize 'views'."
    )


def main(argv: list[str] | None = None) -> int:
    """Run the demo's four steps; 0 when every view equals its from-scratch evaluation."""
    args = _arguments(argv)
    project_dir = WORK / "project"
    config, sources = _create_project(args.scale, project_dir)
    spark, first = _first_refresh(config)
    engine, second = _change_and_refresh(config, spark, sources, args.change)
    ok = _compare(engine) and first.ok and second.ok
    say(
        "\n"
        + (
            "OK: every view equals its from-scratch evaluation."
            if ok
            else "FAILED: some view differs or failed (see above)."
        )
    )
    _say_next(project_dir, config)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
