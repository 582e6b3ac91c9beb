"""Stores: where actors keep their state, and records, across process restarts.

The kernel knows bytes, not LLMs. A store keeps two things:

- one **state** per actor id: opaque bytes, replaced whole by each ``save``;
- **records**: opaque bytes under a unique id, with the id of the actor that saved
  them, a ``kind`` naming what they are and an optional ``parent_id`` (another
  record's id: a tree of records is rebuilt with ``records(parent_id=...)``). The
  ``actors`` package keeps one execution trace per record (kind ``"trace"``).

``save(actor_id, state, records=...)`` writes the state and the records in **one
transaction** (all or none: a process killed mid-save leaves the previous state
readable); a record saved under an id already taken replaces it.

A ``BlobStore`` (both stores here) also keeps **blobs**: opaque bytes under a key
that names their content (the ``actors`` package uses an image's or a document's
SHA-256), each kept once however many states and records refer to it.
``save(..., blobs={key: data})`` adds them in the same transaction (a key already
stored is not written again); ``load_blobs(keys)`` returns those it has. Blobs are
never replaced nor deleted: a key names one content.

Two implementations: ``MemoryStore`` (the fake, for tests: a dict, nothing survives
the process) and ``SQLiteStore`` (stdlib ``sqlite3`` run in worker threads, WAL
mode, one transaction per save). Neither is opened or closed by the ``Runtime``:
whoever creates a store closes it, best with ``async with``.
"""

from __future__ import annotations

import math
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Literal, Protocol, TypeVar

import anyio
import anyio.lowlevel
import msgspec

from ._exceptions import StoreError

__all__ = ["SCHEMA_VERSION", "BlobStore", "MemoryStore", "Record", "SQLiteStore", "Store"]

T = TypeVar("T")

#: The layout of the SQLite database, kept in ``PRAGMA user_version``: 2 added the
#: blobs table (a version 1 database is brought up to 2 when opened).
SCHEMA_VERSION = 2


class Record(msgspec.Struct, frozen=True, kw_only=True):
    """One record: opaque ``data`` under a unique ``id``.

    ``kind`` says what the data is (how to decode it); ``parent_id`` links it to
    another record (empty: no parent). ``actor_id`` is the actor the record is about:
    the one it names, or by default (empty) the actor whose ``save`` stored it (one
    save may store records of several actors, e.g. an execution and its subagents').
    ``saved_at`` (Unix time) is set by the store when it saves the record: the value
    given to ``save`` is ignored.
    """

    id: str
    data: bytes
    kind: str = ""
    parent_id: str = ""
    actor_id: str = ""
    saved_at: float = 0.0


class Store(Protocol):
    """Where actors keep their state and records. Every method may raise ``StoreError``.

    A store is used by many actors at once: every method is safe to call
    concurrently, and concurrent saves never lose each other's writes.
    """

    async def load(self, actor_id: str) -> bytes | None:
        """The state last saved for ``actor_id``, or None if there is none."""
        ...

    async def save(
        self, actor_id: str, state: bytes | None, *, records: Sequence[Record] = ()
    ) -> None:
        """Replace the state of ``actor_id`` and add ``records``, in one transaction.

        ``state=None`` leaves the stored state as it is (to add records only). A
        record whose id is already stored replaces it. If the save fails, nothing of
        it is stored.
        """
        ...

    async def delete(self, actor_id: str) -> None:
        """Forget the state of ``actor_id`` (its records stay); no error if none."""
        ...

    async def record(self, record_id: str) -> Record | None:
        """The record saved under ``record_id``, or None."""
        ...

    async def records(
        self,
        *,
        actor_id: str | None = None,
        parent_id: str | None = None,
        kind: str | None = None,
        limit: int | None = 100,
    ) -> list[Record]:
        """Records that match every filter given: of ``actor_id``, under
        ``parent_id`` (``""``: records without a parent), of ``kind``; None: any.

        At most the ``limit`` most recently saved ones are returned (None: all),
        oldest first.
        """
        ...

    async def aclose(self) -> None:
        """Release the store. Idempotent; every later call raises ``StoreError``."""
        ...


class BlobStore(Store, Protocol):
    """A store that also keeps blobs, each once, under a key naming its content."""

    async def save(
        self,
        actor_id: str,
        state: bytes | None,
        *,
        records: Sequence[Record] = (),
        blobs: Mapping[str, bytes] | None = None,
    ) -> None:
        """As ``Store.save``, and add ``blobs`` (key to bytes) in the same
        transaction; a key already stored keeps its bytes."""
        ...

    async def load_blobs(self, keys: Iterable[str]) -> dict[str, bytes]:
        """The blobs stored under ``keys`` (a key not stored is left out)."""
        ...


def _check_blobs(store: str, actor_id: str, blobs: Mapping[str, bytes] | None) -> None:
    for key, data in (blobs or {}).items():
        if not isinstance(key, str) or not key or not isinstance(data, bytes):
            raise StoreError(
                store,
                f"save blobs of actor {actor_id!r}",
                f"blobs map non-empty str keys to bytes, got {key!r}: {type(data).__qualname__}",
            )


def _check_save(store: str, actor_id: str, state: bytes | None, records: Sequence[Record]) -> None:
    """Refuse a save whose arguments are of the wrong type, before touching anything."""
    if not isinstance(actor_id, str) or not actor_id:
        raise StoreError(store, "save", f"actor_id must be a non-empty str, got {actor_id!r}")
    if state is not None and not isinstance(state, bytes):
        raise StoreError(
            store,
            f"save the state of actor {actor_id!r}",
            f"state must be bytes or None, got {type(state).__qualname__}",
        )
    for record in records:
        if not isinstance(record, Record):
            raise StoreError(
                store,
                f"save records of actor {actor_id!r}",
                f"records must be fractor.Record values, got {type(record).__qualname__}",
            )


def _check_limit(store: str, limit: int | None) -> None:
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise StoreError(store, "list records", f"limit must be an int >= 0 or None, got {limit!r}")


_EMPTY_ID = "record ids must be non-empty strings"


class MemoryStore:
    """A store in a dict: the fake, for tests. Nothing survives the process.

    It behaves like ``SQLiteStore``: one save is all or nothing, records come back
    in save order, a closed store refuses every call. ``states`` (actor id to state)
    and ``blobs`` (key to the very bytes object saved first under it) are there
    for assertions.
    """

    def __init__(self) -> None:
        self.states: dict[str, bytes] = {}
        self.blobs: dict[str, bytes] = {}
        self._records: dict[str, tuple[int, Record]] = {}
        self._seq = 0
        self._closed = False

    def __repr__(self) -> str:
        return "MemoryStore()"

    async def __aenter__(self) -> MemoryStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def load(self, actor_id: str) -> bytes | None:
        await anyio.lowlevel.checkpoint()
        self._check_open(f"load the state of actor {actor_id!r}")
        return self.states.get(actor_id)

    async def save(
        self,
        actor_id: str,
        state: bytes | None,
        *,
        records: Sequence[Record] = (),
        blobs: Mapping[str, bytes] | None = None,
    ) -> None:
        await anyio.lowlevel.checkpoint()
        self._check_open(f"save the state of actor {actor_id!r}")
        _check_save(repr(self), actor_id, state, records)
        _check_blobs(repr(self), actor_id, blobs)
        if any(not record.id for record in records):
            raise StoreError(repr(self), f"save records of actor {actor_id!r}", _EMPTY_ID)
        # Validated: from here on nothing can fail, so the save is all or nothing.
        now = time.time()
        if state is not None:
            self.states[actor_id] = state
        for key, data in (blobs or {}).items():
            self.blobs.setdefault(key, data)
        for record in records:
            self._seq += 1
            stored = msgspec.structs.replace(
                record, actor_id=record.actor_id or actor_id, saved_at=now
            )
            self._records.pop(record.id, None)  # a replaced record moves to the end
            self._records[record.id] = (self._seq, stored)

    async def delete(self, actor_id: str) -> None:
        await anyio.lowlevel.checkpoint()
        self._check_open(f"delete the state of actor {actor_id!r}")
        self.states.pop(actor_id, None)

    async def load_blobs(self, keys: Iterable[str]) -> dict[str, bytes]:
        await anyio.lowlevel.checkpoint()
        self._check_open("load blobs")
        blobs = self.blobs
        return {key: blobs[key] for key in keys if key in blobs}

    async def record(self, record_id: str) -> Record | None:
        await anyio.lowlevel.checkpoint()
        self._check_open(f"load record {record_id!r}")
        found = self._records.get(record_id)
        return None if found is None else found[1]

    async def records(
        self,
        *,
        actor_id: str | None = None,
        parent_id: str | None = None,
        kind: str | None = None,
        limit: int | None = 100,
    ) -> list[Record]:
        await anyio.lowlevel.checkpoint()
        self._check_open("list records")
        _check_limit(repr(self), limit)
        found = [
            record
            for _, record in self._records.values()
            if (actor_id is None or record.actor_id == actor_id)
            and (parent_id is None or record.parent_id == parent_id)
            and (kind is None or record.kind == kind)
        ]
        if limit is not None:
            found = found[len(found) - limit :] if limit else []
        return found

    async def aclose(self) -> None:
        self._closed = True

    def _check_open(self, operation: str) -> None:
        if self._closed:
            raise StoreError(repr(self), operation, "the store is closed")


_SCHEMA = """
CREATE TABLE IF NOT EXISTS states (
    actor_id TEXT PRIMARY KEY NOT NULL CHECK (actor_id <> ''),
    state BLOB NOT NULL,
    saved_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE CHECK (id <> ''),
    actor_id TEXT NOT NULL,
    kind TEXT NOT NULL DEFAULT '',
    parent_id TEXT NOT NULL DEFAULT '',
    data BLOB NOT NULL,
    saved_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS records_by_actor ON records (actor_id, seq);
CREATE INDEX IF NOT EXISTS records_by_parent ON records (parent_id, seq);
CREATE TABLE IF NOT EXISTS blobs (
    key TEXT PRIMARY KEY NOT NULL CHECK (key <> ''),
    data BLOB NOT NULL
) WITHOUT ROWID;
"""

_UPSERT_STATE = (
    "INSERT INTO states (actor_id, state, saved_at) VALUES (?, ?, ?) "
    "ON CONFLICT (actor_id) DO UPDATE SET state = excluded.state, saved_at = excluded.saved_at"
)
# REPLACE deletes the old row first: a replaced record gets a new seq (moves to the end).
_INSERT_RECORD = (
    "INSERT OR REPLACE INTO records (id, actor_id, kind, parent_id, data, saved_at) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
_SELECT_RECORD = "SELECT id, data, kind, parent_id, actor_id, saved_at FROM records"

Synchronous = Literal["NORMAL", "FULL"]


class SQLiteStore:
    """A store in one SQLite database file: the default, durable store.

    ``sqlite3`` blocks, so every call runs in a worker thread; one capacity limiter
    per store lets one thread at a time use its one connection (opened on first use,
    or on ``async with``). The database is in WAL mode (readers never block the
    writer) and each save is one ``BEGIN IMMEDIATE ... COMMIT`` transaction: a
    process killed at any point leaves every save either whole or absent. Several
    processes may share the file; a writer waits up to ``timeout`` seconds for
    another's transaction. The schema is created on open; its version is kept in
    ``PRAGMA user_version`` and a database of a newer version is refused.

    ``synchronous="NORMAL"`` (the default) survives any crash of the process; after a
    power loss the last saves may be missing, never half there. ``"FULL"`` makes
    every save durable before it returns, at the cost of an fsync each.

    A call that is cancelled while its thread runs waits for the thread: a save that
    has begun always completes or rolls back.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        timeout: float = 10.0,
        synchronous: Synchronous = "NORMAL",
    ) -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}")
        if not isinstance(path, str | bytes | os.PathLike):
            raise TypeError(f"path must be a str or os.PathLike, got {path!r}")
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 <= timeout < math.inf  # NaN fails this too
        ):
            raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout!r}")
        self.path = os.fspath(path)
        self.timeout = timeout
        self.synchronous = synchronous
        self._connection: sqlite3.Connection | None = None
        self._limiter = anyio.CapacityLimiter(1)
        self._closed = False

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"

    async def __aenter__(self) -> SQLiteStore:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def open(self) -> None:
        """Open the database now (every call opens it if needed); idempotent."""
        await self._run("open the database", lambda connection: None)

    async def load(self, actor_id: str) -> bytes | None:
        def load(connection: sqlite3.Connection) -> bytes | None:
            row = connection.execute(
                "SELECT state FROM states WHERE actor_id = ?", (actor_id,)
            ).fetchone()
            return None if row is None else bytes(row[0])

        return await self._run(f"load the state of actor {actor_id!r}", load)

    async def save(
        self,
        actor_id: str,
        state: bytes | None,
        *,
        records: Sequence[Record] = (),
        blobs: Mapping[str, bytes] | None = None,
    ) -> None:
        _check_save(repr(self), actor_id, state, records)
        _check_blobs(repr(self), actor_id, blobs)

        def save(connection: sqlite3.Connection) -> None:
            now = time.time()
            with _transaction(connection):
                if blobs:
                    # Only the keys not stored yet: a blob's bytes are bound once.
                    keys = list(blobs)
                    marks = ", ".join("?" * len(keys))
                    stored = {
                        row[0]
                        for row in connection.execute(
                            f"SELECT key FROM blobs WHERE key IN ({marks})", keys
                        )
                    }
                    connection.executemany(
                        "INSERT OR IGNORE INTO blobs (key, data) VALUES (?, ?)",
                        [(key, blobs[key]) for key in keys if key not in stored],
                    )
                if state is not None:
                    connection.execute(_UPSERT_STATE, (actor_id, state, now))
                if records:
                    connection.executemany(
                        _INSERT_RECORD,
                        [
                            (r.id, r.actor_id or actor_id, r.kind, r.parent_id, r.data, now)
                            for r in records
                        ],
                    )

        operation = (
            f"save the state of actor {actor_id!r}"
            if state is not None
            else f"save records of actor {actor_id!r}"
        )
        await self._run(operation, save)

    async def delete(self, actor_id: str) -> None:
        def delete(connection: sqlite3.Connection) -> None:
            with _transaction(connection):
                connection.execute("DELETE FROM states WHERE actor_id = ?", (actor_id,))

        await self._run(f"delete the state of actor {actor_id!r}", delete)

    async def record(self, record_id: str) -> Record | None:
        def record(connection: sqlite3.Connection) -> Record | None:
            row = connection.execute(f"{_SELECT_RECORD} WHERE id = ?", (record_id,)).fetchone()
            return None if row is None else _record(row)

        return await self._run(f"load record {record_id!r}", record)

    async def records(
        self,
        *,
        actor_id: str | None = None,
        parent_id: str | None = None,
        kind: str | None = None,
        limit: int | None = 100,
    ) -> list[Record]:
        _check_limit(repr(self), limit)
        where: list[str] = []
        params: list[object] = []
        for column, value in (("actor_id", actor_id), ("parent_id", parent_id), ("kind", kind)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        query = _SELECT_RECORD + (f" WHERE {' AND '.join(where)}" if where else "")
        query += " ORDER BY seq DESC"
        if limit is not None:
            query += " LIMIT ?"
            params.append(limit)

        def records(connection: sqlite3.Connection) -> list[Record]:
            rows = connection.execute(query, params).fetchall()
            return [_record(row) for row in reversed(rows)]

        return await self._run("list records", records)

    async def load_blobs(self, keys: Iterable[str]) -> dict[str, bytes]:
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}

        def load(connection: sqlite3.Connection) -> dict[str, bytes]:
            found: dict[str, bytes] = {}
            for start in range(0, len(wanted), 500):  # under SQLite's bound variables
                chunk = wanted[start : start + 500]
                marks = ", ".join("?" * len(chunk))
                for key, data in connection.execute(
                    f"SELECT key, data FROM blobs WHERE key IN ({marks})", chunk
                ):
                    found[key] = bytes(data)
            return found

        return await self._run("load blobs", load)

    async def aclose(self) -> None:
        """Close the connection (waiting for the call in progress, if any)."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            async with self._limiter:
                connection, self._connection = self._connection, None
                if connection is not None:
                    await anyio.to_thread.run_sync(connection.close)

    async def _run(self, operation: str, function: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``function`` with the connection in a worker thread, one call at a time."""
        if self._closed:
            raise StoreError(repr(self), operation, "the store is closed")

        def run() -> T:
            if self._closed:
                raise StoreError(repr(self), operation, "the store is closed")
            connection = self._connection
            if connection is None:
                connection = self._connection = self._connect()
            return function(connection)

        try:
            return await anyio.to_thread.run_sync(run, limiter=self._limiter)
        except sqlite3.Error as exc:
            raise StoreError(repr(self), operation, _reason(exc)) from exc

    def _connect(self) -> sqlite3.Connection:
        """Open the database and bring its schema up (in a worker thread)."""
        connection = sqlite3.connect(
            self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False
        )
        try:
            connection.execute("PRAGMA journal_mode = WAL")
            connection.execute(f"PRAGMA synchronous = {self.synchronous}")
            if self._schema_version(connection) < SCHEMA_VERSION:
                # Checked again under the write lock: another process may be creating it.
                with _transaction(connection):
                    if self._schema_version(connection) < SCHEMA_VERSION:
                        for statement in _SCHEMA.split(";"):
                            if statement.strip():
                                connection.execute(statement)
                        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except BaseException:
            connection.close()
            raise
        return connection

    def _schema_version(self, connection: sqlite3.Connection) -> int:
        version: int = connection.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                repr(self),
                "open the database",
                f"its schema is version {version}, written by a newer fractor; "
                f"this one reads version {SCHEMA_VERSION}",
            )
        return version


@contextmanager
def _transaction(connection: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` on any exception."""
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield
        connection.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise


def _record(row: tuple[str, bytes, str, str, str, float]) -> Record:
    record_id, data, kind, parent_id, actor_id, saved_at = row
    return Record(
        id=record_id,
        data=bytes(data),
        kind=kind,
        parent_id=parent_id,
        actor_id=actor_id,
        saved_at=saved_at,
    )


def _reason(exc: sqlite3.Error) -> str:
    text = str(exc) or type(exc).__name__
    if "CHECK constraint failed: id" in text:
        return f"{_EMPTY_ID} ({text})"
    return text
