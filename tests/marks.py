"""Marks shared by the test files: which parameters of a test run in every whole-suite run and
which are taken by turns (``slow``, see ``tests/conftest.py``'s ``slow_shard``)."""

from __future__ import annotations

from typing import Any

import pytest


def by_turns(*values: Any, id: str) -> Any:
    """A parameter marked ``slow``: a whole-suite run takes it one time in ``SLOW_SHARDS``.

    For a test run over two execution paths (or two layouts) whose other parameter runs every
    time: every whole-suite run still checks the test's promise, and the second path's run
    comes by turns (always when the file or the test is named)."""
    return pytest.param(*values, id=id, marks=pytest.mark.slow)
