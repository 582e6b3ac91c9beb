"""Images and documents on the command line: ``fractor run --image/--file``, the
progress lines, the live tree and ``fractor trace``, each part one line, never its
bytes. ``fractor run`` runs against the OpenAI-compatible loopback server."""

from __future__ import annotations

import base64
import io
import re
import shlex
from pathlib import Path

import pytest
from rich.console import Console

from fractor.actors import (
    Agent,
    Document,
    ExecutionEnd,
    ExecutionStart,
    FunctionModel,
    Image,
    ModelRequest,
    ModelResponse,
    ToolEnd,
    ToolResultMessage,
    call,
    describe_part,
    reply,
    tool,
    watch,
)
from fractor.actors.cli import main
from fractor.actors.cli._draw import render_tree
from fractor.actors.cli._lines import LatestLines, ProgressLines, part_lines
from fractor.actors.cli._run import stream_note
from fractor.runtime import Event, Runtime

from ..loopback import LoopbackServer, json_reply
from ..parts_data import pdf, png
from ..providers.wires import completion
from .test_live import an_event, snapshot, terminal, written

PNG = png(4, 3)
PDF = pdf(2)
SHOT = Image(data=png(640, 480, fill=9))
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    made = {"png": PNG, "pdf": PDF, "txt": b"just some words\n"}
    for suffix, data in made.items():
        (tmp_path / f"in.{suffix}").write_bytes(data)
    return {suffix: str(tmp_path / f"in.{suffix}") for suffix in made}


def test_run_gives_the_task_its_images_and_documents(
    server: LoopbackServer, files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--image`` and ``--file`` become parts of the task: the head and the progress
    lines name each in one line, the request carries their bytes, the output never."""
    server.queue(json_reply(completion("A tiny picture and a report.")))
    url = f"{server.url}/v1"
    argv = ["run", "--model", "openai:test", "--base-url", url]
    argv += ["--image", files["png"], "--file", files["pdf"], "What are these?"]
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    image = describe_part(Image(data=PNG))
    document = describe_part(Document(data=PDF, name="in.pdf"))
    assert image.startswith("[image 4x3 png, 1 KB, sha256:")
    assert document.startswith("[document in.pdf, 2 pages, 1 KB, sha256:")
    assert f"task: What are these?\nwith: {image}\nwith: {document}\n" in out
    assert f"assistant: task: {image}" in out  # the progress line of its start
    assert f"assistant: task: {document}" in out
    assert base64.b64encode(PNG).decode() not in out
    (request,) = server.requests
    body = request.body.decode()
    assert "What are these?" in body
    assert base64.b64encode(PNG).decode() in body  # the image went with the task
    assert base64.b64encode(PDF).decode() in body


@pytest.mark.parametrize(
    ("option", "which", "said"),
    [
        ("--image", "missing.png", "--image '{path}': no such file"),
        ("--file", "missing.pdf", "--file '{path}': no such file"),
        (
            "--image",
            "txt",
            "--image '{path}': an image must be PNG or JPEG or WebP or GIF, got bytes of no "
            "known type (starting b'just som') (a PDF goes with --file)",
        ),
        (
            "--image",
            "pdf",
            "--image '{path}': an image must be PNG or JPEG or WebP or GIF, got bytes of "
            "application/pdf (a PDF goes with --file)",
        ),
        (
            "--file",
            "png",
            "--file '{path}': * must be PDF or WAV or MP3, got bytes of image/png "
            "(an image with --image)",
        ),
        ("--file", "dir", "--file '{path}': a directory, not a file"),
    ],
)
def test_run_refuses_a_missing_file_or_an_unknown_kind_before_anything_runs(
    option: str,
    which: str,
    said: str,
    server: LoopbackServer,
    files: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = files.get(which, str(tmp_path / which))
    if which == "dir":
        path = str(tmp_path)
    url = f"{server.url}/v1"
    code = main(["run", "--model", "openai:test", "--base-url", url, option, path, "look"])
    captured = capsys.readouterr()
    assert code == 2
    head, _, tail = f"fractor run: {said.format(path=path)}".partition("*")
    assert captured.err.strip().startswith(head)  # the core's own words between
    assert captured.err.strip().endswith(tail)
    assert captured.out == ""  # nothing started
    assert server.requests == []


def test_part_lines_name_whose_each_part_is() -> None:
    image, document = describe_part(SHOT), describe_part(Document(data=PDF, name="r.pdf"))
    start = ExecutionStart(task="look", parts=(image, document))
    assert part_lines(start) == (f"task: {image}", f"task: {document}")
    end = ToolEnd(tool="screenshot", call_id="c1", parts=(image,))
    assert part_lines(end) == (f"screenshot returned {image}",)
    answer = ExecutionEnd(status="completed", reason="", steps=1, tokens=9, parts=(image,))
    assert part_lines(answer) == (f"answered with {image}",)
    assert part_lines(ExecutionStart(task="look")) == ()


def test_progress_lines_show_each_part_on_a_line_of_its_own() -> None:
    image = describe_part(SHOT)
    lines = ProgressLines()
    event = Event(
        at=1.5,
        agent="looker",
        execution_id="e",
        depth=1,
        detail=ToolEnd(tool="screenshot", call_id="c1", parts=(image, image)),
    )
    assert lines.line(event) == (
        f"[  1.50s] looker: screenshot returned {image}\n"
        f"[  1.50s] looker: screenshot returned {image}"
    )
    start = Event(
        at=0.0,
        agent="looker",
        execution_id="e",
        depth=1,
        detail=ExecutionStart(task="look", parts=(image,)),
    )
    assert lines.line(start) == (
        f"[  0.00s] looker: started: 'look'\n[  0.00s] looker: task: {image}"
    )


def test_the_tree_shows_an_agents_parts_one_line_each_the_latest_kept() -> None:
    tree = snapshot(fanout=2)
    image = describe_part(SHOT)
    latest = LatestLines()
    latest.feed(an_event("root/lead", ExecutionStart(task="go", parts=(image,))))
    for index in range(5):
        latest.feed(
            an_event(
                "root/lead/r0", ToolEnd(tool=f"shot{index}", call_id=str(index), parts=(image,))
            )
        )
    done = ExecutionEnd(status="completed", reason="", steps=1, tokens=9, parts=(image,))
    latest.feed(an_event("root/lead/r1", done))
    assert latest.parts("root/lead") == (f"task: {image}",)
    assert latest.parts("root/lead/r0") == (
        "… 1 earlier part(s)",
        *(f"shot{index} returned {image}" for index in range(1, 5)),
    )
    assert latest.parts("root/lead/r1") == (f"answered with {image}",)  # kept after its end
    console = Console(file=io.StringIO(), width=160)
    console.print(render_tree(tree, title="t", lines=latest))
    out = ANSI.sub("", console.file.getvalue())  # type: ignore[attr-defined]
    assert f"task: {image}" in out
    assert f"shot4 returned {image}" in out
    assert "shot0 returned" not in out
    assert f"answered with {image}" in out


@tool
async def screenshot(page: str) -> list[str | Image]:
    """Take a screenshot of a page."""
    return [f"the {page} page", SHOT]


def _looker(request: ModelRequest) -> ModelResponse:
    if not any(isinstance(m, ToolResultMessage) for m in request.messages):
        return call("screenshot", page="home")
    return reply("here it is", parts=(SHOT,))


async def test_the_live_view_shows_a_runs_parts_never_their_bytes() -> None:
    """A task with an image, a tool returning one, an answer with one: the progress
    lines and the live tree each show them as one line."""
    agent = Agent("looker", FunctionModel(_looker), tools=[screenshot])
    image = describe_part(SHOT)
    task_image = describe_part(Image(data=PNG))
    pipe = Console(file=io.StringIO(), width=200)
    async with Runtime() as rt, watch(rt, console=pipe, refresh=0.01, plain=True):
        result = await (await rt.spawn(agent)).ask(["look at this", Image(data=PNG)])
    assert result.parts == (SHOT,)
    out = written(pipe)
    assert f"looker: task: {task_image}" in out
    assert f"looker: screenshot returned {image}" in out
    assert f"looker: answered with {image}" in out
    assert base64.b64encode(SHOT.data or b"").decode()[:40] not in out
    tty = terminal()
    tty.width = 200
    async with Runtime() as rt, watch(rt, console=tty, refresh=0.01):
        await (await rt.spawn(agent)).ask(["look at this", Image(data=PNG)])
    drawn = written(tty)
    assert f"task: {task_image}" in drawn
    assert f"screenshot returned {image}" in drawn
    assert f"answered with {image}" in drawn


def test_fractor_trace_shows_the_parts_of_a_run(
    server: LoopbackServer,
    files: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server.queue(json_reply(completion("A tiny picture.")))
    db = str(tmp_path / "runs.db")
    url = f"{server.url}/v1"
    argv = ["run", "--model", "openai:test", "--base-url", url, "--session", "seer"]
    assert main([*argv, "--db", db, "--image", files["png"], "What is it?"]) == 0
    out = capsys.readouterr().out
    hint = shlex.split(out.rsplit("its trace: ", 1)[1].strip())
    assert hint[:2] == ["fractor", "trace"]
    assert main(hint[1:]) == 0
    shown = capsys.readouterr().out
    assert f"part: {describe_part(Image(data=PNG))}" in shown
    assert base64.b64encode(PNG).decode() not in shown


async def test_a_stream_shows_the_parts_a_tool_returned_one_line_each() -> None:
    """``ref.stream`` (and so ``fractor run --stream``): a tool's images come as lines
    of its ``ToolEnd``, and the note ``run`` writes shows them, never bytes."""
    agent = Agent("looker", FunctionModel(_looker), tools=[screenshot])
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        async with ref.stream(["look at this", Image(data=PNG)]) as run:
            events = [event async for event in run]
    (finished,) = [event.detail for event in events if isinstance(event.detail, ToolEnd)]
    image = describe_part(SHOT)
    assert finished.parts == (image,)
    note = stream_note(finished)
    assert note is not None
    assert note.splitlines()[1:] == [f"[screenshot returned {image}]"]
    assert base64.b64encode(SHOT.data or b"").decode()[:40] not in note
