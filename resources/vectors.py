"""Deletion vectors written by the driver: rows of a local table's files marked deleted, and
files added, in one Delta commit of its own making.

Owns the Delta protocol's deletion vector format (PROTOCOL.md, "Deletion Vector Format": per
data file a 64-bit RoaringBitmapArray, its 32-bit buckets serialized by pyroaring in the
portable Roaring format, framed in one ``deletion_vector_<uuid>.bin`` per commit with a CRC-32
each), the replay of a table's log that finds the ``add`` action each touched file is live by
(its path and current vector: the ``remove`` must name both), and the commit itself: a log
entry ``<version>.json`` created atomically (a hard link, which fails when the version
exists). delta-rs reads such vectors but writes none, and a delta-spark MERGE scans the table
to find rows the driver already holds by position; this is the proportional path between
them. Only local tables qualify (:func:`driver_writable`), whose features this writer
honours; the rest go through delta-spark.

Contract in ``(data, time, diff)`` terms: :func:`commit_vectors` applies one epoch's
deletions (a ``-1`` for each row at the given positions, which the table must hold live) and
insertions (the rows of the given files, ``+1`` each) in one commit carrying
``txn(app_id, epoch)``, once: an epoch the table already records changes nothing. Every
touched file is re-added with the union of its old and new positions, or removed when that
union is all its rows; no data file is written or rewritten. The caller holds the table's
lock (:func:`resources.lake.table_lock`) from reading the positions to the commit.
"""

from __future__ import annotations

import json
import os
import re
import struct
import time
import uuid
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow.parquet as pq
from deltalake import DeltaTable, TableFeatures
from deltalake.transaction import AddAction
from pyroaring import BitMap

from ivm.errors import CommitConflictError, InvariantViolation, LakeError
from resources.lake import (
    TABLE_CONFIGURATION,
    CommitResult,
    deleted_positions_of,
    has_vectors,
    local_path,
    open_for_write,
    open_table,
)

VECTORS = "delta.enableDeletionVectors"
MAGIC = 1681511377
"""The RoaringBitmapArray format's magic number (little endian, before the buckets)."""
_TYPES = {"timestampNtz", "variantType", "variantType-preview"}
READER_FEATURES = frozenset({"deletionVectors", *_TYPES})
WRITER_FEATURES = frozenset({"deletionVectors", "appendOnly", "invariants", *_TYPES})
"""The table features this writer honours (types only ask that values be written as the
type says, which the engine's files do; delta-rs reports the legacy features and variant
types as present on the tables it upgrades): a table with any other (column mapping, row
tracking, a change data feed's files, v2 checkpoints, constraints) is written by
delta-spark."""
_CHECKPOINT = re.compile(r"(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet")
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def driver_writable(table_uri: str, dt: DeltaTable | None) -> str | None:
    """Why the driver cannot commit deletion vectors to the table; None when it can: a local
    table (a log entry is created atomically only there) whose features it honours
    (:data:`READER_FEATURES`, :data:`WRITER_FEATURES`), or one still to get the feature."""
    if "://" in table_uri and not table_uri.startswith("file://"):
        return "the table is not on the local file system"
    if dt is None:
        return None
    protocol = dt.protocol()
    if protocol.min_writer_version < 7 and protocol.min_reader_version < 3:
        if protocol.min_writer_version > 2:  # legacy CHECK constraints, feed, columns...
            return f"the table's writer version {protocol.min_writer_version} asks for more"
        return None
    other = sorted(
        set(protocol.reader_features or []) - READER_FEATURES
        | set(protocol.writer_features or []) - WRITER_FEATURES
    )
    if other:
        return f"the table has feature{'s' if len(other) > 1 else ''} {', '.join(other)}"
    if dt.metadata().configuration.get("delta.appendOnly") == "true":
        return "the table is append-only"
    return None


def enable_vectors(table_uri: str) -> bool:
    """Give the table the deletion vectors feature and property (delta-rs commits, no data
    changed) where it lacks them; True when a commit was made. Every refresh that marks
    vectors asks: the shared snapshot answers, and a handle of its own is opened only to
    commit."""
    seen = open_table(table_uri)
    if (
        seen is not None
        and has_vectors(seen)
        and seen.metadata().configuration.get(VECTORS) == "true"
    ):
        return False
    dt = open_for_write(table_uri)
    if dt is None:
        raise LakeError(f"{table_uri}: no table to enable deletion vectors on")
    changed = False
    if "deletionVectors" not in (dt.protocol().reader_features or []):
        dt.alter.add_feature(TableFeatures.DeletionVectors, allow_protocol_versions_increase=True)
        changed = True
    if dt.metadata().configuration.get(VECTORS) != "true":
        dt.alter.set_table_properties({VECTORS: "true"})
        changed = True
    return changed


def bitmap(positions: np.ndarray) -> bytes:
    """``positions`` (distinct, non-negative) as a RoaringBitmapArray: the magic number, the
    bucket count, then per most significant 32 bits (ascending) the key and a portable
    32-bit Roaring bitmap of the least significant ones."""
    values = np.unique(np.asarray(positions, dtype=np.uint64))
    keys = values >> np.uint64(32)
    out = [struct.pack("<iq", MAGIC, len(np.unique(keys)))]
    for key in np.unique(keys):
        low = (values[keys == key] & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        out.append(struct.pack("<i", int(key)) + BitMap(low).serialize())
    return b"".join(out)


def z85(data: bytes) -> str:
    """ZeroMQ's Base85 (RFC 32) of ``data`` (a multiple of 4 bytes): the encoding a
    deletion vector's path takes its UUID in."""
    if len(data) % 4:
        raise ValueError("Z85 encodes whole 4-byte words")
    chars = []
    for (word,) in struct.iter_unpack(">I", data):
        chars += [_Z85[word // 85**i % 85] for i in range(4, -1, -1)]
    return "".join(chars)


def commit_vectors(
    table_uri: str,
    *,
    app_id: str,
    epoch: int,
    deletions: Mapping[str, np.ndarray],
    adds: Sequence[AddAction] = (),
    metadata: Mapping[str, str] | None = None,
) -> CommitResult:
    """Mark the rows at ``deletions``' positions deleted (by data file path, relative to the
    table and unquoted; positions among the file's live rows) and add ``adds``, in one
    commit carrying ``txn(app_id, epoch)``; skipped (``committed`` False) when the table
    already records ``epoch``. The caller holds the table's lock.

    Raises:
        CommitConflictError: a file is no longer in the table, or the log entry's version
            was taken (a writer that does not take the lock).
        InvariantViolation: a position is already deleted or past the file's rows.
        LakeError: the table is missing or has a feature this writer does not honour.
    """
    started = time.perf_counter()
    result = CommitResult(table_uri, epoch, committed=False, version=None)
    dt = open_for_write(table_uri)
    if dt is None:
        raise LakeError(f"{table_uri}: cannot delete rows from a missing table")
    if (dt.transaction_version(app_id) or 0) >= epoch:
        result.version = dt.version()
        return result
    why_not = driver_writable(table_uri, dt)
    if why_not is not None:
        raise LakeError(f"{table_uri}: the driver cannot write deletion vectors: {why_not}")
    root = local_path(table_uri).rstrip("/")
    now = int(time.time() * 1000)
    actions = _marked_files(table_uri, dt, deletions, now)
    actions += [{"add": _added(a)} for a in adds]
    commit_info = {
        "timestamp": now,
        "operation": "DELETE",
        "operationParameters": {},
        "readVersion": dt.version(),
        "isBlindAppend": False,
        "engineInfo": "ivm (deletion vectors by the driver)",
        "ivm.epoch": str(epoch),
        **(metadata or {}),
    }
    txn = {"txn": {"appId": app_id, "version": epoch, "lastUpdated": now}}
    version = dt.version() + 1
    _create_entry(root, version, [{"commitInfo": commit_info}, txn, *actions])
    _checkpoint_if_due(table_uri, dt, version)
    result.committed = True
    result.version = version
    result.files_added = len(adds)
    result.files_removed = sum(1 for a in actions if "remove" in a)
    result.seconds = time.perf_counter() - started
    return result


def _marked_files(
    table_uri: str, dt: DeltaTable, deletions: Mapping[str, np.ndarray], now: int
) -> list[dict[str, Any]]:
    """The actions marking ``deletions`` in ``dt``'s snapshot: per file, the ``remove`` of
    its live ``add`` and the file again with the union of its old and new positions (none
    when that is all its rows), the vectors written to one new file beside the data.

    Raises:
        CommitConflictError: a file is no longer in the table.
        InvariantViolation: a position is already deleted or past the file's rows.
    """
    root = local_path(table_uri).rstrip("/")
    live = _live_adds(root, dt.version(), set(deletions))
    gone = sorted(set(deletions) - set(live))
    if gone:
        raise CommitConflictError(f"{table_uri}: {gone[0]} left the table while it was read")
    old = deleted_positions_of(dt, [os.path.join(root, p) for p in deletions])
    actions: list[dict[str, Any]] = []
    dv_id = uuid.uuid4()
    frames = bytearray(b"\x01")
    for path in sorted(deletions):
        add = live[path]
        rows = _records(add, table_uri)
        before = old.get(os.path.join(root, path), np.empty(0, np.int64))
        new = np.asarray(deletions[path], dtype=np.int64)
        union = np.union1d(before, new)
        if len(union) != len(before) + len(np.unique(new)) or (len(new) and new.max() >= rows):
            raise InvariantViolation(
                f"{table_uri}: deleting rows of {path} that are deleted already or past its "
                f"{rows} rows"
            )
        actions.append({"remove": _removal(add, now)})
        if len(union) == rows:
            continue  # every row deleted: the file leaves the table
        data = bitmap(union)
        descriptor = {
            "storageType": "u",
            "pathOrInlineDv": z85(dv_id.bytes),
            "offset": len(frames),
            "sizeInBytes": len(data),
            "cardinality": len(union),
        }
        frames += struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))
        actions.append({"add": _readded(add, descriptor)})
    if len(frames) > 1:
        with open(os.path.join(root, f"deletion_vector_{dv_id}.bin"), "wb") as fh:
            fh.write(frames)
    return actions


def _records(add: Mapping[str, Any], table_uri: str) -> int:
    """The file's row count from its statistics (a file with a vector must carry it)."""
    stats = json.loads(add.get("stats") or "{}")
    if stats.get("numRecords") is None:
        raise LakeError(f"{table_uri}: {add['path']} has no row count in the log")
    return int(stats["numRecords"])


def _removal(add: Mapping[str, Any], now: int) -> dict[str, Any]:
    """The ``remove`` of a live ``add``: the same path and vector (the logical file's
    identity)."""
    removal = {
        "path": add["path"],
        "deletionTimestamp": now,
        "dataChange": True,
        "extendedFileMetadata": True,
        "partitionValues": add.get("partitionValues") or {},
        "size": add.get("size"),
    }
    if add.get("deletionVector"):
        removal["deletionVector"] = add["deletionVector"]
    return removal


def _readded(add: Mapping[str, Any], descriptor: Mapping[str, Any]) -> dict[str, Any]:
    """The file again with its new vector; its min/max now wide bounds of its live rows."""
    stats = json.loads(add.get("stats") or "{}")
    stats["tightBounds"] = False
    kept = {k: v for k, v in add.items() if k not in ("deletionVector", "stats") and v is not None}
    return {**kept, "dataChange": True, "stats": json.dumps(stats), "deletionVector": descriptor}


def _added(a: AddAction) -> dict[str, Any]:
    return {
        "path": a.path,
        "partitionValues": dict(a.partition_values or {}),
        "size": a.size,
        "modificationTime": a.modification_time,
        "dataChange": True,
        "stats": a.stats,
    }


def _create_entry(root: str, version: int, actions: Sequence[Mapping[str, Any]]) -> None:
    """Write the log entry of ``version``, whole or not at all: written aside, then linked
    in place (a link fails when the name exists, as a put-if-absent)."""
    log = os.path.join(root, "_delta_log")
    aside = os.path.join(log, f".{version:020d}.{uuid.uuid4().hex}.json.tmp")
    with open(aside, "w") as fh:
        for action in actions:
            fh.write(json.dumps(action, separators=(",", ":")) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    try:
        os.link(aside, os.path.join(log, f"{version:020d}.json"))
    except FileExistsError as e:
        raise CommitConflictError(
            f"{root}: version {version} was committed by another writer"
        ) from e
    finally:
        os.unlink(aside)


def _checkpoint_if_due(table_uri: str, dt: DeltaTable, version: int) -> None:
    """A checkpoint by delta-rs at the table's interval, as its own commits make one."""
    interval = dt.metadata().configuration.get(
        "delta.checkpointInterval", TABLE_CONFIGURATION["delta.checkpointInterval"]
    )
    if version % int(interval) == 0:
        handle = open_for_write(table_uri)
        if handle is not None:
            handle.create_checkpoint()


def _live_adds(root: str, version: int, paths: set[str]) -> dict[str, dict[str, Any]]:
    """The live ``add`` action of each of ``paths`` (relative, unquoted) at ``version``:
    the newest classic checkpoint at or before it, then the JSON entries after it; an entry
    applies its removes (path and vector) before its adds."""
    log = os.path.join(root, "_delta_log")
    start, parts = _checkpoint(log, version)
    live: dict[str, dict[str, Any]] = {}
    for part in parts:
        column = pq.read_table(part, columns=["add"]).column("add")
        for add in column.to_pylist():
            if add is not None and unquote(add["path"]) in paths:
                live[unquote(add["path"])] = _as_action(add)
    for v in range(start + 1, version + 1):
        entry = list(_entry(log, v))
        for action in entry:
            removed = action.get("remove")
            if removed is not None and unquote(removed["path"]) in live:
                now = live[unquote(removed["path"])]
                if _dv_id(now) == _dv_id(removed):
                    del live[unquote(removed["path"])]
        for action in entry:
            add = action.get("add")
            if add is not None and unquote(add["path"]) in paths:
                live[unquote(add["path"])] = add
    return live


def _checkpoint(log: str, version: int) -> tuple[int, list[str]]:
    """The newest complete classic checkpoint at or before ``version``: its version and its
    parts' paths; ``(-1, [])`` when there is none."""
    found: dict[int, dict[int, str]] = {}
    wanted: dict[int, int] = {}
    for name in os.listdir(log):
        m = _CHECKPOINT.fullmatch(name)
        if m is None or int(m.group(1)) > version:
            continue
        v = int(m.group(1))
        part, total = (int(m.group(2)), int(m.group(3))) if m.group(2) else (1, 1)
        found.setdefault(v, {})[part] = os.path.join(log, name)
        wanted[v] = total
    complete = [v for v, parts in found.items() if len(parts) == wanted[v]]
    if not complete:
        return -1, []
    best = max(complete)
    return best, [found[best][i] for i in sorted(found[best])]


def _entry(log: str, version: int) -> Iterator[dict[str, Any]]:
    with open(os.path.join(log, f"{version:020d}.json")) as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def _dv_id(action: Mapping[str, Any]) -> str | None:
    """A deletion vector's unique id (PROTOCOL.md, "Derived Fields"); None: no vector."""
    dv = action.get("deletionVector")
    if not dv:
        return None
    offset = dv.get("offset")
    base = f"{dv['storageType']}{dv['pathOrInlineDv']}"
    return base if offset is None else f"{base}@{offset}"


_ADD_FIELDS = (
    "path",
    "partitionValues",
    "size",
    "modificationTime",
    "dataChange",
    "stats",
    "tags",
    "deletionVector",
    "baseRowId",
    "defaultRowCommitVersion",
    "clusteringProvider",
)
_MAPS = ("partitionValues", "tags")


def _as_action(add: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint's ``add`` struct as its JSON action: the action's own fields (not the
    parsed ``*_parsed`` copies), absent where null, maps as objects."""
    out: dict[str, Any] = {}
    for name in _ADD_FIELDS:
        value = add.get(name)
        if value is None:
            continue
        if name in _MAPS:
            value = dict(value)
        elif isinstance(value, dict):
            value = {k: v for k, v in value.items() if v is not None}
        out[name] = value
    return out
