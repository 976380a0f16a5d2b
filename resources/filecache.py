"""Decoded Parquet files of the lake, kept in the driver's memory between lookups.

A Delta table changes by adding and removing whole files; a data file itself is never
rewritten. So the rows of a file, decoded once, stay its rows: a lookup that probes an
arrangement or a state table (``ops.arrange``) finds its keys in memory, in time proportional
to the keys, instead of decoding Parquet pages that mostly hold other keys. The Delta tables
stay the durable, shared copy. The driver's rewrites of a readable table (``ops.sink``) read
their files here too, and hand over the files they write (:meth:`FileCache.put`).

Contract in ``(data, time, diff)`` terms: :meth:`FileCache.read` returns exactly the updates
``(columns..., _time, _diff)`` stored in the file, with the schema asked, whether they come
from memory or from disk. An entry is keyed by the file's path, its size and modification
time, and the schema: a file that a tool rewrote in place is read again, never served stale.

What stays: a lookup tells the cache which files its table has now (:meth:`FileCache.keep_only`)
and a rewrite's commit drops the files it replaced (:meth:`FileCache.discard`). A file that
does not fit in what is left of the budget displaces only entries idle for
:data:`IDLE_SECONDS` (least recently read first); otherwise it is returned without being kept
(:meth:`FileCache.would_keep` says so, and lookups then read its matching row groups only). So
a working set larger than the budget keeps the part that fits instead of evicting, in a cycle,
each file just before it is read again. A budget of 0 keeps nothing.

The budget is the process's (``[refresh] cache_mb``, :data:`DEFAULT_BUDGET_MB`), set once by
the first project opened (:meth:`FileCache.configure`); a later one asking for another budget
is warned (:class:`CacheBudgetWarning`) and shares the first's.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

MAX_CHUNKS = 2048
"""Most chunks a column of a held file keeps when handed over by its writer
(:meth:`FileCache.put`); past it they are combined into one. Slices cost nothing to keep,
but every kernel and the Parquet writer pay per chunk: noticeable past a few thousand."""

CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
"""Where a container's memory limit is (cgroup v2, then v1)."""


def memory_bytes() -> int | None:
    """The memory this process can count on: the machine's, or its container's limit when
    lower; None when the platform does not say."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    for limit in CGROUP_LIMITS:
        try:
            with open(limit, encoding="ascii") as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def default_budget_mb(memory: int | None) -> int:
    """A quarter of ``memory`` (bytes), between 256 MiB and 8 GiB; 2 GiB when unknown."""
    if memory is None:
        return 2048
    return max(256, min(8192, memory // 4 // 2**20))


DEFAULT_BUDGET_MB = default_budget_mb(memory_bytes())
"""Memory the cache may hold when ``[refresh] cache_mb`` is not set: a quarter of the
machine's (or container's) memory, at most 8 GiB (:func:`default_budget_mb`)."""

IDLE_SECONDS = 6 * 3600.0
"""An entry not read for this long may make room for another file (see the module)."""

_Key = tuple[str, int, int, str]


class CacheBudgetWarning(UserWarning):
    """A project asked for a file-cache budget other than the one its process already has."""


@dataclass
class CacheStats:
    """What the cache did since it was made."""

    hits: int = 0
    misses: int = 0
    rows_loaded: int = 0
    evictions: int = 0


class FileCache:
    """Parquet files decoded as Arrow tables, within a byte budget (see the module)."""

    def __init__(self, budget_bytes: int, idle_seconds: float = IDLE_SECONDS) -> None:
        self._budget = budget_bytes
        self._idle = idle_seconds
        self._entries: OrderedDict[_Key, pa.Table] = OrderedDict()  # least recently read first
        self._read_at: dict[_Key, float] = {}
        self._refused: dict[_Key, int] = {}  # files decoded but not kept: their size
        self._bytes = 0
        self._lock = threading.Lock()
        self._loading: dict[_Key, threading.Lock] = {}
        self._derived: dict[_Key, dict[Hashable, Any]] = {}  # per entry: see derived()
        self._configured_by: str | None = None  # see configure()
        self.stats = CacheStats()

    @property
    def budget_bytes(self) -> int:
        return self._budget

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def set_budget(self, budget_bytes: int) -> None:
        """Hold at most ``budget_bytes`` from now on (0: nothing), evicting what exceeds it.
        Unconditional: a process's projects go through :meth:`configure`."""
        with self._lock:
            self._budget = max(0, budget_bytes)
            self._evict_over(self._budget)

    def configure(self, budget_bytes: int, by: str) -> int:
        """Set the budget once per cache: the first call sets it (``by`` names who asked:
        a project's ``ivm.toml``); a later call asking for the same budget changes nothing,
        one asking for another is warned (:class:`CacheBudgetWarning`, naming both) and
        keeps the first. Returns the budget that applies."""
        budget_bytes = max(0, budget_bytes)
        with self._lock:
            first = self._configured_by
            if first is None:
                self._configured_by = by
                self._budget = budget_bytes
                self._evict_over(self._budget)
                return budget_bytes
            current = self._budget
        if budget_bytes != current:
            warnings.warn(
                f"{by}: [refresh] cache_mb = {budget_bytes // 2**20} is not applied: this "
                f"process's file cache keeps {current // 2**20} MiB, set by {first} (the budget "
                "is the process's, set by the first project it opens)",
                CacheBudgetWarning,
                stacklevel=2,
            )
        return current

    @property
    def configured_by(self) -> str | None:
        """Who set the budget (:meth:`configure`), None while nobody has."""
        return self._configured_by

    def keep_only(self, directory: str, paths: Iterable[str]) -> None:
        """Drop the entries of files under ``directory`` (a table's) other than ``paths``
        (the files the table has now: the others were compacted away)."""
        live = set(paths)
        prefix = directory.rstrip("/") + "/"
        self._forget(lambda path: path.startswith(prefix) and path not in live)

    def would_keep(self, path: str, schema: pa.Schema) -> bool:
        """Whether :meth:`read` would answer from memory or keep what it decodes, as far as
        the cache knows: False for a file it decoded and could not keep, while there is
        still no room for it (a caller then reads only the parts it needs)."""
        key = _key(path, schema)
        with self._lock:
            if key is None or self._budget == 0:
                return False
            size = self._refused.get(key)
            return size is None or key in self._entries or self._room() >= size

    def _room(self) -> int:
        """Bytes free, counting entries idle long enough to make way."""
        idle_since = time.monotonic() - self._idle
        idle = sum(t.nbytes for k, t in self._entries.items() if self._read_at[k] <= idle_since)
        return self._budget - self._bytes + idle

    def holds(self, path: str, schema: pa.Schema) -> bool:
        """Whether ``path`` (as it is now on disk) is in memory with ``schema``."""
        key = _key(path, schema)
        with self._lock:
            return key is not None and key in self._entries

    def read(self, path: str, schema: pa.Schema) -> tuple[pa.Table, bool]:
        """The file's rows with ``schema``'s columns and types, from memory when held, else
        decoded from disk and kept if they fit the budget; and whether they were decoded now.
        Concurrent readers of one file decode it once."""
        key = _key(path, schema)
        if key is None:  # gone from disk: let Parquet say so
            return _decode(path, schema), True
        with self._lock:
            table = self._entries.get(key)
            if table is not None:
                self._touch(key)
                return table, False
            loading = self._loading.setdefault(key, threading.Lock())
        with loading:
            with self._lock:
                table = self._entries.get(key)
                if table is not None:  # another thread decoded it meanwhile
                    self._touch(key)
                    return table, False
            table = _decode(path, schema)
            with self._lock:
                self._loading.pop(key, None)
                self.stats.misses += 1
                self.stats.rows_loaded += table.num_rows
                self._admit(key, table)
            return table, True

    def put(self, path: str, schema: pa.Schema, table: pa.Table) -> bool:
        """Keep ``table`` as ``path``'s rows read with ``schema``: a file the caller has
        just written from exactly these rows (so the next read decodes nothing), if it fits
        as a decoded file would; whether it is kept. Its chunks are kept as they are, up to
        :data:`MAX_CHUNKS` in a column (a rewrite's slices of the file it replaced: no
        copy), else combined into one."""
        key = _key(path, schema)
        if key is None or self._budget == 0:
            return False
        table = table.select(schema.names)
        if table.schema != schema:
            table = table.cast(schema)
        if max((c.num_chunks for c in table.columns), default=1) > MAX_CHUNKS:
            table = table.combine_chunks()
        with self._lock:
            return key in self._entries or self._admit(key, table)

    def derived(
        self, path: str, schema: pa.Schema, name: Hashable, make: Callable[[pa.Table], Any]
    ) -> Any:
        """``make(rows)`` of a file held with ``schema`` (an index of a column: the file's
        rows never change), computed on the first call and kept with the entry until it
        leaves; None when the file is not held. What it keeps is not counted in the budget:
        a few bytes per row at most (:class:`ops.rows.SortedKey` views the rows' own
        buffer for 64-bit integers without NULLs)."""
        key = _key(path, schema)
        with self._lock:
            table = self._entries.get(key) if key is not None else None
            if table is None or key is None:
                return None
            known = self._derived.get(key, {})
            if name in known:
                return known[name]
        value = make(table)
        with self._lock:
            if key in self._entries:
                self._derived.setdefault(key, {})[name] = value
        return value

    def discard(self, paths: Iterable[str]) -> None:
        """Drop the entries of ``paths`` (files their table no longer has)."""
        gone = set(paths)
        self._forget(gone.__contains__)

    def _forget(self, gone: Callable[[str], bool]) -> None:
        """Drop the entries, and what is known of refused files, whose path is ``gone``."""
        with self._lock:
            for key in [k for k in self._entries if gone(k[0])]:
                self._drop(key)
            for key in [k for k in self._refused if gone(k[0])]:
                del self._refused[key]

    def _admit(self, key: _Key, table: pa.Table) -> bool:
        """Keep ``table`` under ``key`` if it fits once idle entries make way; else remember
        that it did not (lock held)."""
        size = table.nbytes
        self._evict_over(self._budget - size, idle_only=True)
        if self._bytes + size > self._budget:
            self._refused[key] = size
            return False
        self._entries[key] = table
        self._read_at[key] = time.monotonic()
        self._bytes += size
        self._refused.pop(key, None)
        return True

    def _touch(self, key: _Key) -> None:
        self._entries.move_to_end(key)
        self._read_at[key] = time.monotonic()
        self.stats.hits += 1

    def _drop(self, key: _Key) -> None:
        self._bytes -= self._entries.pop(key).nbytes
        del self._read_at[key]
        self._derived.pop(key, None)
        self.stats.evictions += 1

    def _evict_over(self, limit: int, idle_only: bool = False) -> None:
        """Drop least recently read entries while more than ``limit`` bytes are held; with
        ``idle_only``, only those idle for the cache's idle time."""
        idle_since = time.monotonic() - self._idle
        while self._entries and self._bytes > limit:
            key = next(iter(self._entries))
            if idle_only and self._read_at[key] > idle_since:
                return
            self._drop(key)


def _key(path: str, schema: pa.Schema) -> _Key | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (path, st.st_size, st.st_mtime_ns, schema.to_string(show_schema_metadata=False))


def _decode(path: str, schema: pa.Schema) -> pa.Table:
    """The file's ``schema`` columns, one contiguous chunk per column (a row's values are
    found by position: :class:`ops.rows.SortedKey`, ``take``). ``ParquetFile.read`` decodes
    each column straight into one chunk; Arrow's dataset scan (``pq.read_table``) hands over
    batches of 128Ki rows that must then be concatenated, a second copy of every byte."""
    with pq.ParquetFile(path) as file:
        table = file.read(columns=schema.names)
    return table.select(schema.names).cast(schema).combine_chunks()


FILES = FileCache(DEFAULT_BUDGET_MB * 1024 * 1024)
"""The process's cache (see the module's docstring)."""
