"""The lake's snapshot cache (no Spark): readers share one opened handle per table version,
yet always see the newest commit, and never a table that was dropped and created again at
the same path. In ``(data, time, diff)`` terms: caching must not change what any version
holds."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from resources.lake import (
    EpochRecord,
    LakeLayout,
    append_epoch,
    commit_files,
    last_commit_metadata,
    now_utc,
    open_for_write,
    open_table,
    read_epochs,
    transaction_version,
)


def _checkpoints(uri: str) -> list[int]:
    return sorted(
        int(p.name.split(".")[0]) for p in Path(uri, "_delta_log").glob("*.checkpoint.parquet")
    )


def _rows(uri: str) -> list[int]:
    return sorted(open_table(uri).to_pyarrow_table().column("a").to_pylist())


def test_a_version_is_opened_once_and_new_commits_show_at_once(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    assert open_table(uri) is None
    write_deltalake(uri, pa.table({"a": [1]}))
    first = open_table(uri)
    assert open_table(uri) is first  # same version: the same handle
    write_deltalake(uri, pa.table({"a": [2]}), mode="append")
    assert open_table(uri).version() == 1 and _rows(uri) == [1, 2]
    assert open_table(uri, 0) is first and first.version() == 0  # old snapshots stay as they were
    assert open_for_write(uri) is not open_table(uri)  # writers get their own handle


def test_a_table_created_again_at_the_same_path_is_not_served_from_the_cache(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"a": [1]}))
    assert _rows(uri) == [1]
    shutil.rmtree(uri)
    assert open_table(uri) is None
    write_deltalake(uri, pa.table({"a": [7, 8]}))  # version 0 again, other contents
    assert _rows(uri) == [7, 8]
    assert open_table(uri).metadata().id == DeltaTable(uri).metadata().id


def test_epochs_and_commit_metadata_follow_the_newest_commit(tmp_path: Path) -> None:
    uri = str(tmp_path / "log")
    schema = pa.schema([pa.field("a", pa.int64())])
    for epoch in (1, 2):
        commit_files(uri, app_id="v", epoch=epoch, schema=schema, metadata={"k": str(epoch)})
        assert transaction_version(uri, "v") == epoch
        assert last_commit_metadata(uri, "k")["k"] == str(epoch)
    # A commit from outside the engine (another process) shows too.
    DeltaTable(uri).create_write_transaction([], mode="append", schema=schema)
    assert open_table(uri).version() == 2
    layout = LakeLayout(str(tmp_path))
    for epoch in (1, 2):
        append_epoch(layout, EpochRecord(epoch, {"s": (epoch - 1, epoch)}, now_utc()))
        assert [e.epoch for e in read_epochs(layout)] == list(range(1, epoch + 1))


def test_commits_report_their_version_and_checkpoint_every_ten(tmp_path: Path) -> None:
    """Each commit reports the version it made (read from the commits after the writer's
    handle, not a fresh open), and the tables the engine creates take a checkpoint every 10
    commits, so opening one replays at most 10 JSON commits whatever the epochs behind it;
    the epochs table too."""
    uri = str(tmp_path / "t")
    schema = pa.schema([("a", pa.int64())])
    for epoch in range(1, 13):
        result = commit_files(uri, app_id="w", epoch=epoch, schema=schema)
        assert result.committed and result.version == epoch - 1 == DeltaTable(uri).version()
    assert commit_files(uri, app_id="w", epoch=12, schema=schema).version == 11  # done: no commit
    conf = DeltaTable(uri).metadata().configuration
    assert conf.get("delta.checkpointInterval") == "10", conf
    assert _checkpoints(uri) == [9]  # after the 10th commit
    layout = LakeLayout(str(tmp_path / "lake"))
    for epoch in range(1, 12):
        append_epoch(layout, EpochRecord(epoch, {"s": (epoch - 1, epoch)}, now_utc()))
    assert _checkpoints(layout.epochs) == [9]
    assert [r.epoch for r in read_epochs(layout)] == list(range(1, 12))
