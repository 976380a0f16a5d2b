"""The whole-suite run's share of the ``slow`` tests (``tests/conftest.py``): dealt into
shards of about equal time, each test in one shard, the same whatever the order of
collection (every xdist worker deals them alike)."""

from __future__ import annotations

import random

from tests.conftest import SLOW_DEFAULT_SECONDS, SLOW_SECONDS, SLOW_SHARDS, slow_shards


def test_slow_tests_are_dealt_into_shards_of_about_equal_time() -> None:
    named = [f"tests/{name}" for name in SLOW_SECONDS]
    others = [f"tests/test_x.py::test_{i}" for i in range(25)]
    nodeids = named + others
    dealt = slow_shards(nodeids)
    assert sorted(dealt) == sorted(nodeids)
    assert set(dealt.values()) == set(range(SLOW_SHARDS))
    totals = [0.0] * SLOW_SHARDS
    for nodeid, shard in dealt.items():
        totals[shard] += SLOW_SECONDS.get(nodeid.split("/")[-1], SLOW_DEFAULT_SECONDS)
    # longest first to the lightest shard: within 4/3 of the best possible largest shard
    best = max(sum(totals) / SLOW_SHARDS, *SLOW_SECONDS.values())
    assert max(totals) <= best * 4 / 3, totals
    shuffled = nodeids[:]
    random.Random(3).shuffle(shuffled)
    assert slow_shards(shuffled) == dealt
