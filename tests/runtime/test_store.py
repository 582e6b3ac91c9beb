"""Stores: one behaviour suite for both, then what only SQLite does (WAL, schema, files)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import pytest

from fractor.runtime import MemoryStore, Record, SQLiteStore, Store, StoreError

MakeStore = Callable[[], Store]


@pytest.fixture
async def store(make_store: MakeStore) -> AsyncIterator[Store]:
    made = make_store()
    try:
        yield made
    finally:
        await made.aclose()


def rec(id: str, data: bytes = b"x", *, parent_id: str = "", kind: str = "trace") -> Record:
    return Record(id=id, data=data, parent_id=parent_id, kind=kind)


async def test_state_round_trip_and_replace(store: Store) -> None:
    assert await store.load("a") is None
    await store.save("a", b"one")
    await store.save("b", b"\x00binary\xff")
    assert await store.load("a") == b"one"
    await store.save("a", b"two")
    assert await store.load("a") == b"two"
    assert await store.load("b") == b"\x00binary\xff"
    await store.delete("a")
    await store.delete("never-saved")
    assert await store.load("a") is None
    assert await store.load("b") == b"\x00binary\xff"


async def test_records_are_saved_with_the_state_and_found_by_id_actor_parent_kind(
    store: Store,
) -> None:
    await store.save("lead", b"s1", records=[rec("lead#1")])
    await store.save("r-1", None, records=[rec("r#2", parent_id="lead#1")])
    await store.save("r-2", None, records=[rec("r#3", parent_id="lead#1"), rec("note", kind="n")])
    assert await store.load("r-1") is None  # state=None saves records only
    found = await store.record("r#2")
    assert found is not None
    assert (found.id, found.actor_id, found.parent_id, found.kind, found.data) == (
        "r#2",
        "r-1",
        "lead#1",
        "trace",
        b"x",
    )
    assert found.saved_at > 0
    assert await store.record("missing") is None
    assert [r.id for r in await store.records(parent_id="lead#1")] == ["r#2", "r#3"]
    assert [r.id for r in await store.records(parent_id="")] == ["lead#1", "note"]
    assert [r.id for r in await store.records(actor_id="r-2")] == ["r#3", "note"]
    assert [r.id for r in await store.records(kind="trace", parent_id="")] == ["lead#1"]
    assert [r.id for r in await store.records()] == ["lead#1", "r#2", "r#3", "note"]
    # The most recent ``limit`` records, oldest first.
    assert [r.id for r in await store.records(limit=2)] == ["r#3", "note"]
    assert await store.records(limit=0) == []
    assert len(await store.records(limit=None)) == 4


async def test_one_save_stores_records_of_other_actors_under_their_own_id(
    store: Store,
) -> None:
    # An execution's save carries its subagents' traces: each names its own actor.
    await store.save(
        "lead",
        b"s",
        records=[rec("lead#1"), Record(id="r#2", data=b"x", parent_id="lead#1", actor_id="r#2")],
    )
    assert [r.id for r in await store.records(actor_id="lead")] == ["lead#1"]
    assert [r.id for r in await store.records(actor_id="r#2")] == ["r#2"]
    child = await store.record("r#2")
    assert child is not None
    assert (child.actor_id, child.parent_id) == ("r#2", "lead#1")


async def test_a_record_saved_again_replaces_the_old_one(store: Store) -> None:
    await store.save("a", b"s", records=[rec("t", b"old"), rec("u")])
    await store.save("b", b"s", records=[rec("t", b"new", parent_id="p")])
    found = await store.record("t")
    assert found is not None
    assert (found.data, found.actor_id, found.parent_id) == (b"new", "b", "p")
    assert [r.id for r in await store.records()] == ["u", "t"]  # moved to the end


async def test_a_failing_save_leaves_the_previous_state_and_writes_nothing(
    store: Store,
) -> None:
    await store.save("a", b"before", records=[rec("kept")])
    # The state is written first; the second record then fails inside the transaction.
    with pytest.raises(StoreError, match="record ids must be non-empty") as caught:
        await store.save("a", b"after", records=[rec("new"), rec("")])
    assert "'a'" in str(caught.value)
    assert await store.load("a") == b"before"
    assert await store.record("new") is None
    assert [r.id for r in await store.records()] == ["kept"]
    # The store is still usable after the failed transaction.
    await store.save("a", b"after", records=[rec("new")])
    assert await store.load("a") == b"after"


async def test_bad_arguments_are_refused_clearly(store: Store) -> None:
    with pytest.raises(StoreError, match="state must be bytes"):
        await store.save("a", "text")  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="actor_id must be a non-empty str"):
        await store.save("", b"x")
    with pytest.raises(StoreError, match=r"fractor\.Record"):
        await store.save("a", b"x", records=[("id", b"x")])  # type: ignore[list-item]
    with pytest.raises(StoreError, match="limit must be"):
        await store.records(limit=-1)
    assert await store.load("a") is None


async def test_concurrent_saves_lose_nothing(store: Store) -> None:
    async def save(index: int) -> None:
        await store.save(
            f"actor-{index}", f"state {index}".encode(), records=[rec(f"t{index}", b"%d" % index)]
        )

    async with anyio.create_task_group() as tg:
        for index in range(300):
            tg.start_soon(save, index)
    for index in range(300):
        assert await store.load(f"actor-{index}") == f"state {index}".encode()
    records = await store.records(limit=None)
    assert sorted(r.id for r in records) == sorted(f"t{i}" for i in range(300))


async def test_a_closed_store_refuses_every_call(make_store: MakeStore) -> None:
    store = make_store()
    await store.save("a", b"x")
    await store.aclose()
    await store.aclose()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        await store.load("a")
    with pytest.raises(StoreError, match="closed"):
        await store.save("a", b"y")
    with pytest.raises(StoreError, match="closed"):
        await store.records()


async def test_a_new_store_on_the_same_file_sees_everything(tmp_path: Path) -> None:
    path = tmp_path / "kept.db"
    async with SQLiteStore(path) as store:
        await store.save("a", b"state", records=[rec("t1")])
    async with SQLiteStore(str(path)) as again:
        assert await again.load("a") == b"state"
        assert [r.id for r in await again.records()] == ["t1"]


async def test_sqlite_uses_wal_and_records_its_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "wal.db"
    async with SQLiteStore(path) as store:
        await store.save("a", b"x")
        with sqlite3.connect(path) as raw:
            assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert raw.execute("PRAGMA user_version").fetchone()[0] == 2
        raw.close()


async def test_two_stores_on_one_file_write_concurrently(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    async with SQLiteStore(path) as first, SQLiteStore(path) as second:

        async def save(store: Store, index: int) -> None:
            await store.save(f"a{index}", b"s", records=[rec(f"t{index}")])

        async with anyio.create_task_group() as tg:
            for index in range(100):
                tg.start_soon(save, first if index % 2 else second, index)
        assert len(await first.records(limit=None)) == 100
        assert await second.load("a99") == b"s"


async def test_sqlite_refuses_a_newer_schema_and_a_bad_path(tmp_path: Path) -> None:
    newer = tmp_path / "newer.db"
    raw = sqlite3.connect(newer)
    raw.execute("PRAGMA user_version = 99")
    raw.close()
    with pytest.raises(StoreError, match="version 99, written by a newer fractor"):
        async with SQLiteStore(newer):
            pass
    missing = tmp_path / "no-such-dir" / "x.db"
    with pytest.raises(StoreError, match="no-such-dir") as caught:
        await SQLiteStore(missing).load("a")
    assert "cannot load the state of actor 'a'" in str(caught.value)
    not_a_db = tmp_path / "text.db"
    not_a_db.write_text("hello, this is not a database at all " * 100)
    store = SQLiteStore(not_a_db)
    with pytest.raises(StoreError, match="not a database"):
        await store.open()
    await store.aclose()


def test_sqlite_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="synchronous"):
        SQLiteStore(tmp_path / "x.db", synchronous="OFF")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        SQLiteStore(tmp_path / "x.db", timeout=-1)
    for timeout in (float("nan"), float("inf"), "1", True):
        with pytest.raises(ValueError, match="timeout must be a finite number of seconds"):
            SQLiteStore(tmp_path / "x.db", timeout=timeout)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"path must be a str or os\.PathLike, got None"):
        SQLiteStore(None)  # type: ignore[arg-type]
    assert repr(SQLiteStore(tmp_path / "x.db")).startswith("SQLiteStore(")


async def test_blobs_are_kept_once_and_loaded_by_key(store: Store) -> None:
    assert isinstance(store, MemoryStore | SQLiteStore)
    blob = b"\x89PNG" + b"\x00" * 1000
    await store.save("a", b"s1", records=[rec("t1")], blobs={"k1": blob})
    await store.save("b", b"s2", blobs={"k1": b"other bytes, same key", "k2": b"two"})
    assert await store.load_blobs(["k1", "k2", "missing"]) == {"k1": blob, "k2": b"two"}
    assert await store.load_blobs([]) == {}
    with pytest.raises(StoreError, match="blobs map non-empty str keys to bytes"):
        await store.save("a", b"s3", blobs={"": b"x"})
    assert await store.load("a") == b"s1"  # the refused save wrote nothing


async def test_a_version_1_database_is_brought_up_to_blobs(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    raw = sqlite3.connect(path)
    raw.execute(
        "CREATE TABLE states (actor_id TEXT PRIMARY KEY NOT NULL, state BLOB NOT NULL, "
        "saved_at REAL NOT NULL)"
    )
    raw.execute("INSERT INTO states VALUES ('a', x'6f6c64', 0)")
    raw.execute("PRAGMA user_version = 1")
    raw.commit()
    raw.close()
    async with SQLiteStore(path) as store:
        assert await store.load("a") == b"old"
        await store.save("a", b"new", blobs={"k": b"blob"})
        assert await store.load_blobs(["k"]) == {"k": b"blob"}
