"""Images and documents stored once: a blob per content, referred to by hash."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

import msgspec
import pytest

from fractor.actors import (
    Agent,
    ContentError,
    ContentLimits,
    Document,
    ExecutionTrace,
    Image,
    Message,
    ModelRequest,
    ScriptedModel,
    ToolResultMessage,
    UserMessage,
    call,
    fail,
    reply,
    tool,
)
from fractor.actors._blobs import attach_trace, load_blobs, stored_keys
from fractor.actors._observation._traces import render_trace_tree, trace_from_record
from fractor.runtime import MemoryStore, Runtime, SQLiteStore

from .parts_data import big_png, pdf

SIZE = 1_000_000
IMAGE = Image(data=big_png(SIZE, width=1024, height=768))


@tool
async def screenshot() -> list[str | Image]:
    """The screen, as an image."""
    return ["the screen", IMAGE]


def files_of(folder: Path, prefix: str) -> list[Path]:
    """The database's files (with its WAL, if any is left)."""
    return [p for p in folder.iterdir() if p.name.startswith(prefix)]


def users(request: ModelRequest) -> list[UserMessage]:
    return users_of(request.messages)


def users_of(messages: Sequence[Message]) -> list[UserMessage]:
    return [m for m in messages if isinstance(m, UserMessage)]


def data_of(part: object) -> bytes | None:
    assert isinstance(part, Image | Document)
    return part.data


async def test_sqlite_keeps_one_blob_for_a_conversation_a_trace_and_a_resumed_agent(
    tmp_path: Path,
) -> None:
    path = tmp_path / "parts.db"
    model = ScriptedModel([call("screenshot"), reply("A screen.")])
    async with SQLiteStore(path) as store, Runtime(store=store) as rt:
        ref = await rt.spawn(Agent("viewer", model, tools=[screenshot]), id="viewer")
        assert (await ref.ask(["Is this the same as the screen?", IMAGE])).ok
    # A later process: the conversation comes back with the bytes; the model sees them.
    again = ScriptedModel([reply("Still the same.")])
    async with SQLiteStore(path) as store, Runtime(store=store) as rt:
        ref = await rt.spawn(Agent("viewer", again, tools=[screenshot]), id="viewer")
        conversation = await ref.conversation()
        assert (await ref.ask(["And now?", IMAGE])).ok
        (first, second) = users(again.requests[0])
        records = await store.records(limit=None)
    assert users_of(conversation.messages)[0].parts == (IMAGE,)
    assert data_of(first.parts[0]) == IMAGE.data
    assert data_of(second.parts[0]) is IMAGE.data
    traces = [trace_from_record(record) for record in records]
    assert len(traces) == 2
    # Records keep the parts' metadata, never their bytes.
    assert all(len(record.data) < 10_000 for record in records)
    (outcome,) = traces[0].steps[0].outcomes
    assert outcome.parts[0].stored
    assert traces[0].task_parts[0].sha256 == IMAGE.sha256
    line = f"[image 1024x768 png, 1.0 MB, sha256:{IMAGE.sha256[:8]}]"
    assert line in render_trace_tree(traces[:1])
    with sqlite3.connect(path) as raw:
        (blobs,) = raw.execute("SELECT count(*) FROM blobs").fetchone()
        (state,) = raw.execute("SELECT length(state) FROM states").fetchone()
    raw.close()
    assert blobs == 1
    assert state < 10_000
    size = sum(p.stat().st_size for p in files_of(tmp_path, "parts.db"))
    assert SIZE < size < 1.1 * SIZE + 100_000  # one copy of the image, and the text


async def test_traces_loaded_to_run_again_get_their_bytes_back(tmp_path: Path) -> None:
    document = Document(data=pdf(pages=2))
    model = ScriptedModel([reply("Read.")])
    async with SQLiteStore(tmp_path / "t.db") as store, Runtime(store=store) as rt:
        ref = await rt.spawn(Agent("reader", model), id="reader")
        await ref.ask(["Read this.", document])
        (record,) = await store.records(limit=None)
        trace = trace_from_record(record)
        keys = stored_keys(traces=[trace])
        back = attach_trace(trace, await load_blobs(store, keys))
    assert keys == {document.sha256}
    assert trace.task_parts[0].stored
    assert back.task_parts == (document,)
    assert isinstance(back, ExecutionTrace)


async def test_the_memory_store_keeps_the_one_bytes_object() -> None:
    store = MemoryStore()
    model = ScriptedModel([call("screenshot"), reply("ok"), reply("again")])
    async with Runtime(store=store) as rt:
        ref = await rt.spawn(Agent("viewer", model, tools=[screenshot]), id="viewer")
        await ref.ask(["look", IMAGE])
        await ref.ask(["look again", IMAGE])
    assert list(store.blobs) == [IMAGE.sha256]
    assert store.blobs[IMAGE.sha256] is IMAGE.data
    assert b"base64" not in store.states["viewer"]
    assert len(store.states["viewer"]) < 10_000
    async with Runtime(store=store) as rt:
        ref = await rt.spawn(Agent("viewer", ScriptedModel([])), id="viewer")
        conversation = await ref.conversation()
    restored = [m for m in conversation.messages if isinstance(m, UserMessage)]
    assert all(data_of(m.parts[0]) is IMAGE.data for m in restored)


async def test_a_store_without_blobs_keeps_the_parts_whole() -> None:
    class PlainStore(MemoryStore):
        load_blobs = None  # type: ignore[assignment]

    store = PlainStore()
    async with Runtime(store=store) as rt:
        ref = await rt.spawn(Agent("viewer", ScriptedModel([reply("ok")])), id="viewer")
        await ref.ask(["look", IMAGE])
    assert store.blobs == {}
    state = msgspec.json.decode(store.states["viewer"])
    assert len(state["messages"][0]["parts"][0]["data"]) > SIZE  # base64, whole


async def test_a_resumed_ask_in_a_new_process_reuses_a_tool_results_image(
    tmp_path: Path,
) -> None:
    path = tmp_path / "resume.db"
    calls_made: list[str] = []

    @tool
    async def snap() -> list[str | Image]:
        """The screen, as an image."""
        calls_made.append("snap")
        return ["the screen", IMAGE]

    first = ScriptedModel([call("snap"), fail(RuntimeError("the server went away"))])
    async with SQLiteStore(path) as store, Runtime(store=store) as rt:
        ref = await rt.spawn(Agent("viewer", first, tools=[snap]), id="viewer")
        assert not (await ref.ask("Look at the screen.")).ok
    later = ScriptedModel([call("snap"), reply("A screen.")])
    async with SQLiteStore(path) as store, Runtime(store=store) as rt:
        ref = await rt.spawn(Agent("viewer", later, tools=[snap]), id="viewer")
        assert (await ref.ask("Look at the screen.", resume=True)).ok
    assert calls_made == ["snap"]  # answered from the stored trace, not run again
    (result,) = [m for m in later.requests[1].messages if isinstance(m, ToolResultMessage)]
    assert data_of(result.parts[0]) == IMAGE.data


async def test_parts_refused_at_the_door_leave_nothing_in_the_store(tmp_path: Path) -> None:
    # An ask whose image is over the agent's limit (or of a kind nobody reads) is
    # refused before anything is written: no blob, no state, no record.
    path = tmp_path / "refused.db"
    model = ScriptedModel([reply("never")])
    small = Agent("small", model, content_limits=ContentLimits(part=1_000))
    async with SQLiteStore(path) as store, Runtime(store=store) as rt:
        ref = await rt.spawn(small, id="small")
        with pytest.raises(ContentError, match="a part may have"):
            await ref.ask(["look", IMAGE])
        with pytest.raises(ContentError):
            await ref.ask(["look", Image(data=b"GIF89a-not-quite" * 10, media_type="image/png")])
        records = await store.records(limit=None)
    with sqlite3.connect(path) as raw:
        counts = [
            raw.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("blobs", "states")
        ]
    raw.close()
    assert (counts, records, len(model.requests)) == ([0, 0], [], 0)
