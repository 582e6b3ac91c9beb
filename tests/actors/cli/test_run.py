"""``fractor run``: one task on a real model, against a real HTTP server on 127.0.0.1.

The server speaks each provider's wire format (``providers/wires.py``); every test
asserts on what it received and on what the command printed. No network, no real key.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from fractor.actors.cli import _parser, main
from fractor.actors.cli._run import run_command

from ..loopback import LoopbackServer, json_reply, sse_reply
from ..providers.wires import (
    ANTHROPIC_KEY,
    ANTHROPIC_TRIO_UNSUPPORTED,
    completion,
    message,
    sent_anthropic_key,
    text,
    wire_call,
)
from ..providers.wires import openai_error as error_body

# -- OpenAI and compatible servers ------------------------------------------------------


def test_fractor_run_against_the_loopback_server(
    server: LoopbackServer, capsys: pytest.CaptureFixture[str]
) -> None:
    server.queue(json_reply(completion("The answer is 42.", prompt=21, output=6)))
    code = main(
        [
            "run",
            "--model",
            "openai:test",
            "--base-url",
            f"{server.url}/v1",
            "--budget-tokens",
            "5000",
            "--max-tokens",
            "300",
            "--instructions",
            "Be brief.",
            "What is the answer?",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "agent 'assistant' started on openai:test" in out
    assert "step 1: answered [" in out
    assert "status: completed (final answer)" in out
    assert "The answer is 42." in out
    assert "usage: 21 input tokens (0 cached), 6 output tokens, 1 request(s)" in out
    body = server.requests[0].json()
    assert body["model"] == "test"
    assert body["max_tokens"] == 300
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the answer?"},
    ]


async def test_run_command_on_both_backends(
    server: LoopbackServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_KEY", "sk-from-my-var")
    server.queue(
        json_reply(completion(None, (wire_call("c1", "add", '{"a": 1}'),))),
        json_reply(completion("Done.")),
    )
    url = f"{server.url}/v1"
    args = _parser().parse_args(
        ["run", "--model", "openai:test", "--base-url", url, "--api-key-env", "MY_KEY", "task"]
    )
    assert await run_command(args) == 0
    out = capsys.readouterr().out
    assert 'step 1: 1 tool call(s): add({"a": 1})' in out
    assert "step 2: answered [" in out
    assert out.rstrip().endswith("2 request(s), 1 tool call(s)")
    assert server.requests[0].headers["authorization"] == "Bearer sk-from-my-var"


def test_fractor_run_reports_failures_and_bad_options(
    server: LoopbackServer, capsys: pytest.CaptureFixture[str]
) -> None:
    server.queue(json_reply(error_body("bad key", "invalid_api_key"), status=401))
    url = f"{server.url}/v1"
    assert main(["run", "--model", "openai:test", "--base-url", url, "go"]) == 1
    out = capsys.readouterr().out
    assert "model request failed: ProviderError: openai model 'test', HTTP 401" in out
    assert "status: failed" in out
    assert "check the key" in out
    assert main(["run", "--model", "gpt-4", "go"]) == 2
    assert "names no provider" in capsys.readouterr().err
    assert main(["run", "--model", "openai:m", "--api-key-env", "NOT_SET_ANYWHERE", "go"]) == 2
    assert "NOT_SET_ANYWHERE" in capsys.readouterr().err
    assert main(["run", "--model", "openai:gpt-4.1-mini", "go"]) == 2
    assert "OPENAI_API_KEY" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "--model", "openai:m", "--budget-tokens", "0", "go"])
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--budget-tokens", "0", "expected a whole number >= 1, got 0"),
        ("--retries", "-1", "expected a whole number >= 0, got -1"),
        ("--max-tokens", "ten", "expected a whole number, got 'ten'"),
    ],
)
def test_run_rejects_bad_numbers_saying_what_was_expected(
    option: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "--model", "openai:m", option, value, "go"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: {message}" in err


# -- Anthropic -----------------------------------------------------------------------------


def test_fractor_run_with_anthropic(
    server: LoopbackServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
    server.queue(json_reply(message(text("Forty-two."), input_tokens=20, output_tokens=4)))
    backend = "asyncio" if ANTHROPIC_TRIO_UNSUPPORTED else "trio"
    args = ["--model", "anthropic:claude-test", "--base-url", server.url, "--backend", backend]
    code = main(["run", *args, "--budget-requests", "3", "What is the answer?"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "Forty-two." in out
    assert "usage: 20 input tokens (0 cached), 4 output tokens, 1 request(s)" in out
    (received,) = server.requests
    assert sent_anthropic_key(received) == ANTHROPIC_KEY
    assert received.json()["messages"] == [
        {"role": "user", "content": [text("What is the answer?")]}
    ]


def test_fractor_run_prints_no_key_a_server_echoes(
    server: LoopbackServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    canary, password = "sk-canary-cli-9d1e4f2a", "cli-canary-pw"
    monkeypatch.setenv("OPENAI_API_KEY", canary)
    said = f"Incorrect API key provided: {canary}"
    server.queue(json_reply(error_body(said, "invalid_api_key"), status=401))
    root = server.url.replace("http://", f"http://user:{password}@")
    code = main(["run", "--model", "openai:test", "--base-url", f"{root}/v1", "Hello"])
    captured = capsys.readouterr()
    printed = captured.out + captured.err
    assert code != 0
    assert "the API key was rejected" in printed
    assert "[redacted]" in printed
    assert canary not in printed
    assert password not in printed


def _chunk(delta: Mapping[str, object] | None, finish: str | None = None) -> dict[str, object]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "c", "object": "chat.completion.chunk", "model": "test", "choices": choices}


def test_fractor_run_stream_prints_the_answer_as_it_arrives(
    server: LoopbackServer, capsys: pytest.CaptureFixture[str]
) -> None:
    call_chunk = {
        "role": "assistant",
        "tool_calls": [
            {"index": 0, "id": "c1", "type": "function", "function": {"name": "add"}},
        ],
    }
    args_chunk = {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1}'}}]}
    usage = {"id": "c", "object": "chat.completion.chunk", "model": "test", "choices": []}
    server.queue(
        sse_reply([_chunk(call_chunk), _chunk(args_chunk), _chunk({}, "tool_calls")], done=True),
        sse_reply(
            [
                _chunk({"role": "assistant", "content": "The answer "}),
                _chunk({"content": "is 42."}),
                _chunk({}, "stop"),
                {**usage, "usage": {"prompt_tokens": 30, "completion_tokens": 5}},
            ],
            done=True,
            gap=0.01,
        ),
    )
    code = main(
        ["run", "--model", "openai:test", "--base-url", f"{server.url}/v1", "--stream", "Go"]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    assert '[calling add({"a": 1})]' in lines
    assert "[add failed in" in out  # the run's agent has no tools: an error result
    assert "The answer is 42." in lines
    assert out.count("The answer is 42.") == 1  # streamed once, not printed again
    assert "status: completed (final answer)" in out
    assert all(r.json()["stream"] is True for r in server.requests)
    assert "step 1:" not in out  # no live view lines while streaming


@pytest.mark.parametrize(
    ("answer", "sent", "result"),
    [
        ("y\n", ["hi team"], "note sent: hi team"),
        ("n not on a Friday\n", [], "[denied] a person denied this call: not on a Friday"),
        ("", [], "[denied] a person denied this call: no answer: the terminal's input is closed"),
    ],
)
def test_fractor_run_asks_on_the_terminal_before_a_tool_that_needs_approval(
    server: LoopbackServer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    answer: str,
    sent: list[str],
    result: str,
) -> None:
    from . import run_tools

    run_tools.SENT.clear()
    monkeypatch.setattr("sys.stdin", io.StringIO(answer))
    server.queue(
        json_reply(completion(None, (wire_call("c1", "send_note", '{"text": "hi team"}'),))),
        json_reply(completion("Done.")),
    )
    code = main(
        [
            "run",
            "--model",
            "openai:test",
            "--base-url",
            f"{server.url}/v1",
            "--tool",
            "tests.actors.cli.run_tools:send_note",
            "--tool",
            "tests.actors.cli.run_tools:word_count",
            "Tell the team hi",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert 'approve send_note({"text": "hi team"})?' in out
    assert "waiting for approval of send_note" in out  # the plain progress lines say so
    assert sent == run_tools.SENT
    first, second = (r.json() for r in server.requests)
    assert {t["function"]["name"] for t in first["tools"]} == {"send_note", "word_count"}
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "c1", "content": result}


def test_fractor_run_refuses_a_tool_it_cannot_find(capsys: pytest.CaptureFixture[str]) -> None:
    url = "http://127.0.0.1:9/v1"
    command = ["run", "--model", "openai:test", "--base-url", url]
    code = main([*command, "--tool", "no_such_module_here:thing", "task"])
    assert code == 2
    assert "--tool 'no_such_module_here:thing'" in capsys.readouterr().err


# -- sessions: a conversation kept across runs, compacted, resumed -------------------------


def test_fractor_run_keeps_a_session_compacts_it_and_resumes_it(
    server: LoopbackServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from . import run_tools

    url = f"{server.url}/v1"
    db = str(tmp_path / "sessions.db")
    session = ["run", "--model", "openai:test", "--base-url", url, "--session", "notes"]
    session += ["--db", db, "--compact-at", "1", "--keep", "1"]
    counting = ["--tool", "tests.actors.cli.run_tools:word_count"]
    server.queue(json_reply(completion("Noted: tea.")))
    assert main([*session, "I drink tea."]) == 0
    assert f"session 'notes': 1 turn, kept in {db}; its trace: fractor trace" in (
        capsys.readouterr().out
    )
    # The second run goes on from the first: its turn is in the request.
    server.queue(
        sse_reply([_chunk({"role": "assistant", "content": "Noted: Oslo."}), _chunk({}, "stop")])
    )
    assert main([*session, "--stream", "I live in Oslo."]) == 0  # streamed, the same
    assert "session 'notes': 2 turns, kept in" in capsys.readouterr().out
    second = server.requests[-1].json()["messages"]
    assert [m["content"] for m in second] == ["I drink tea.", "Noted: tea.", "I live in Oslo."]
    # The third folds the oldest turn into a summary first (one request of its own).
    server.queue(
        json_reply(completion("The user drinks tea.")),
        json_reply(completion(None, (wire_call("c1", "word_count", '{"text": "a b c"}'),))),
        json_reply(completion(None, (wire_call("c2", "word_count", '{"text": "d e"}'),))),
    )
    code = main([*session, *counting, "--budget-requests", "3", "Count words."])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "status: budget_exceeded" in out
    summarization, step = (r.json() for r in server.requests[-3:-1])
    assert summarization["messages"][0]["content"].startswith("You keep the memory")
    assert "User: I drink tea." in summarization["messages"][1]["content"]
    assert step["messages"][0]["content"].endswith("The user drinks tea.")
    assert [m["content"] for m in step["messages"][1:]] == [
        "I live in Oslo.",
        "Noted: Oslo.",
        "Count words.",
    ]
    # --resume picks the stopped run up: the completed word count is not run again.
    run_tools.COUNTED.clear()
    server.queue(
        json_reply(completion("Tea, and Oslo.")),  # this run folds one more turn first
        json_reply(completion(None, (wire_call("c3", "word_count", '{"text": "a b c"}'),))),
        json_reply(completion("3 and 2 words.")),
    )
    assert main([*session, *counting, "--resume", "Go on."]) == 0
    out = capsys.readouterr().out
    assert "3 and 2 words." in out
    assert "session 'notes': 2 turns, 2 more in its summary, kept in" in out
    assert run_tools.COUNTED == []  # answered from the stopped run
    resumed = server.requests[-2].json()["messages"]
    assert resumed[-2]["content"] == "Go on."
    assert "Earlier attempts stopped before an answer" in resumed[-1]["content"]
    assert 'word_count({"text": "a b c"}) returned: 3' in resumed[-1]["content"]


@pytest.mark.parametrize(
    ("session", "db"), [("notes", "sessions.db"), ("Ann's $5 notes", "my data/s.db")]
)
def test_the_trace_command_a_session_run_prints_works_when_copied(
    session: str,
    db: str,
    server: LoopbackServer,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FRACTOR_DB", raising=False)
    (tmp_path / db).parent.mkdir(exist_ok=True)
    server.queue(json_reply(completion("Noted: tea.")))
    url = f"{server.url}/v1"
    argv = ["--session", session, "--db", db, "I drink tea."]
    assert main(["run", "--model", "openai:test", "--base-url", url, *argv]) == 0
    out = capsys.readouterr().out
    hint = out.rsplit("its trace: ", 1)[1].strip()
    assert hint.startswith("fractor trace "), out
    # Pasted into a shell, in the same directory, with the `fractor` of this environment.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    shown = subprocess.run(
        hint,
        shell=True,
        cwd=tmp_path,
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert "assistant [assistant#" in shown.stdout
    assert 'task: "I drink tea."' in shown.stdout
    assert 'answer: "Noted: tea."' in shown.stdout


@pytest.mark.parametrize("keyed", [True, False], ids=["base-url", "no-key"])
@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--resume"], "--resume picks up a session: give its name with --session NAME"),
        (["--session", " "], "--session ' ': a name of its own, not empty"),
        (["--tool", "no_such_module_here:thing"], "--tool 'no_such_module_here:thing'"),
        (["--compact-at", "0"], "argument --compact-at: expected a whole number >= 1, got 0"),
    ],
)
def test_session_options_are_checked(
    options: list[str], said: str, keyed: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrong option is said first, before any key is looked for: the same message
    with a server that needs none (--base-url) and with no key at all."""
    model = ["--model", "openai:test", *(["--base-url", "http://127.0.0.1:9/v1"] * keyed)]
    with contextlib.suppress(SystemExit):  # argparse's own errors exit with 2
        code = main(["run", *model, *options, "go on"])
        assert code == 2
    err = capsys.readouterr().err
    assert said in err
    assert "API key" not in err


def test_a_session_may_have_any_name_of_its_own(
    server: LoopbackServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``assistant-2`` has the shape of the runtime's own ids; given as --session, it is
    the user's, and the next run goes on from it."""
    url = f"{server.url}/v1"
    session = ["run", "--model", "openai:test", "--base-url", url, "--session", "assistant-2"]
    session += ["--db", str(tmp_path / "sessions.db")]
    server.queue(json_reply(completion("Noted: tea.")), json_reply(completion("Tea.")))
    assert main([*session, "I drink tea."]) == 0
    assert main([*session, "What do I drink?"]) == 0
    assert "session 'assistant-2': 2 turns, kept in" in capsys.readouterr().out
    second = server.requests[-1].json()["messages"]
    assert [m["content"] for m in second] == ["I drink tea.", "Noted: tea.", "What do I drink?"]


@pytest.mark.parametrize(
    ("model", "variable"),
    [
        ("openai:gpt-4.1-mini", "OPENAI_API_KEY"),
        ("anthropic:claude-sonnet-4-5", "ANTHROPIC_API_KEY"),
    ],
)
def test_a_missing_key_is_told_in_the_commands_own_options(
    model: str, variable: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command names its own flags, not the Python arguments a library user gives."""
    assert main(["run", "--model", model, "hi"]) == 2
    err = capsys.readouterr().err
    assert "no API key was given" in err
    assert f"set the environment variable {variable}" in err
    assert "--api-key-env VAR" in err
    assert "--base-url URL" in err
    assert "api_key=" not in err
    assert "base_url=" not in err


@pytest.mark.parametrize("stream", [False, True], ids=["live", "stream"])
def test_fractor_run_with_ui_announces_its_web_view_once(
    server: LoopbackServer, capsys: pytest.CaptureFixture[str], stream: bool
) -> None:
    # The web view serves while the run runs (tests/actors/cli/test_demo.py reads it);
    # its URL, with its token, is said once, on stderr, and the run is as without it.
    server.queue(json_reply(completion("The answer is 42.", prompt=21, output=6)))
    extra = ["--stream"] if stream else []
    code = main(
        ["run", "--model", "openai:test", "--base-url", f"{server.url}/v1", "--ui", *extra, "Q?"]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.out
    urls = re.findall(r"http://127\.0\.0\.1:\d+/\?token=[\w-]{40,}", captured.err)
    assert len(urls) == 1, captured.err
    assert "The answer is 42." in captured.out


def test_fractor_run_against_no_server_bills_nothing_and_says_why_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Issue 40: a refused connection was billed (24 tokens, 3 requests) and its long
    # error printed three times (the progress line, the status line, the answer).
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once it is closed
    url = f"http://127.0.0.1:{port}/v1"
    assert main(["run", "--model", "openai:llama3.2", "--base-url", url, "Hello"]) == 1
    out = capsys.readouterr().out
    assert out.count("check the base URL, the network and that the server is running") == 1
    assert "status: failed\n" in out
    assert out.rstrip().endswith(
        "0 input tokens (0 cached), 0 output tokens, 0 request(s), 0 tool call(s)"
    )
