"""Policies side by side: is a special path worth keeping? (``python -m bench.policies``).

One TPC-H lake (the demo's views), built once; then ``--rounds`` rounds in which every variant,
in turn and in a rotating order, gets a change batch of the same size and refreshes under its
policy (``ivm.policy.using``). Each variant names the policy fields it changes, e.g.
``no-driver-lookups:driver_lookup_rows=0``; the variant ``default`` is always measured. Prints
per variant the median, minimum and maximum refresh seconds and the median's ratio to the
default's, and the readable tables' rows written against the rows the views changed, then checks every view against DuckDB (a faster wrong answer measures nothing).

Usage: ``python -m bench.policies --scale 1 --rounds 5 'name:field=value[,field=value]' ...``
(``./dev`` sets up the environment: ``.venv/bin/python -m bench.policies``). Timings are
wall-clock on a shared machine: only ratios measured in one run compare.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import fields

from ivm.policy import Policy


def parse_variant(text: str) -> tuple[str, dict[str, object]]:
    """``name:field=value,field=value`` as ``(name, changes)``, each value typed as the
    policy's field (``true``/``false`` for booleans).

    >>> parse_variant("off:driver=false,driver_lookup_rows=0")
    ('off', {'driver': False, 'driver_lookup_rows': 0})
    """
    name, _, spec = text.partition(":")
    types = {f.name: f.type for f in fields(Policy)}
    changes: dict[str, object] = {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        if key not in types:
            raise SystemExit(f"{text}: no policy field {key!r} (see ivm/policy.py)")
        changes[key] = value == "true" if types[key] in (bool, "bool") else int(value)
    return name, changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.policies", description=__doc__)
    parser.add_argument("variants", nargs="*", help="name:field=value[,field=value]")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--change", type=float, default=0.001, help="of SF1's orders per kind")
    args = parser.parse_args(argv)
    variants = dict([("default", {}), *map(parse_variant, args.variants)])

    from bench.__main__ import REFERENCE_SCALE, check_views, project, say, setup
    from demo.tpch import apply_change_batch
    from engine.facade import Engine
    from ivm import policy
    from resources.spark import get_spark

    spark = get_spark({"spark.sql.shuffle.partitions": "4"})
    work, sources, config = setup(args.scale)
    engine = Engine(project(config, 4), spark=spark, progress=lambda m: None)
    if not engine.refresh().ok:
        raise SystemExit("the build failed")
    change = args.change * REFERENCE_SCALE / args.scale
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    written: dict[str, list[int]] = {name: [] for name in variants}
    changed: dict[str, list[int]] = {name: [] for name in variants}
    names = list(variants)
    seed = 1
    for r in range(args.rounds + 1):  # round 0 warms every variant up, unmeasured
        for name in names[r % len(names) :] + names[: r % len(names)]:
            apply_change_batch(sources, change, seed=seed)
            seed += 1
            with policy.using(**variants[name]):  # type: ignore[arg-type]
                started = time.perf_counter()
                report = engine.refresh()
                took = time.perf_counter() - started
            if not report.ok:
                raise SystemExit(f"{name}: {[v.error for v in report.views if v.error]}")
            if r:
                seconds[name].append(took)
                written[name].append(sum(v.inserted + v.rows_rewritten for v in report.views))
                changed[name].append(sum(v.rows_changed for v in report.views))
    base = statistics.median(seconds["default"])
    say(f"SF {args.scale:g}, {args.rounds} refreshes per variant, {change:.3%} of orders each")
    say(
        f"{'variant':<28} {'median':>8} {'min':>7} {'max':>7} {'vs default':>10} "
        f"{'table rows written':>18} {'rows changed':>12}"
    )
    for name, values in seconds.items():
        median = statistics.median(values)
        say(
            f"{name:<28} {median:>7.2f}s {min(values):>6.2f}s {max(values):>6.2f}s "
            f"{median / base:>9.2f}x {statistics.median(written[name]):>18,.0f} "
            f"{statistics.median(changed[name]):>12,.0f}"
        )
    check_views(engine, f"SF {args.scale:g} after {seed - 1} batches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
