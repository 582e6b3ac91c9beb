"""``fractor mcp-serve``: an agent served as one MCP tool
(``fractor.actors.integrations.mcp_serve``).

::

    fractor mcp-serve myagents:researcher
    fractor mcp-serve myagents:researcher --budget-tokens 50000 --budget-seconds 120
    fractor mcp-serve myagents:researcher --http 127.0.0.1:8000

``MODULE:NAME`` names an ``actors.Agent`` defined at module level (the current
directory is importable, as for ``python -m``). Over stdio (the default) the
process is the server an MCP client starts: stdout carries the protocol, anything
else goes to stderr. With ``--http HOST:PORT`` it serves streamable HTTP at
``http://HOST:PORT/mcp`` (port 0: one the system picks) and prints that URL on
stderr once it accepts connections. Ctrl-C or SIGTERM stops either: each call in
flight is answered with an error, and the command exits 0 after one line saying
so. Each call spawns the agent afresh in the server's one ``Runtime``, under the
agent's budget and the ``--budget-*`` options (per call). The command runs on
asyncio (the HTTP server is uvicorn). Exit status 2 for bad usage: no such module
or attribute, not an Agent, a bad address, the ``mcp`` extra missing.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fractor.runtime import Budget

from .._agent._agent import Agent
from ._imports import import_spec
from ._run import _positive_float, _positive_int

__all__ = ["add_mcp_serve_parser", "load_agent", "mcp_serve_command"]


def add_mcp_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``mcp-serve`` to the ``fractor`` subcommands (``parser.add_subparsers()``)."""
    serve: argparse.ArgumentParser = subparsers.add_parser(
        "mcp-serve",
        help="serve an agent as one MCP tool (stdio, or streamable HTTP)",
        description=(
            "Serve an agent over the Model Context Protocol as one tool, named after the "
            "agent, with one 'task' argument: a call returns the agent's final answer, or "
            "an error naming the status and stop reason. Over stdio unless --http is given."
        ),
    )
    serve.add_argument(
        "agent", metavar="MODULE:NAME", help="a fractor.Agent at module level, e.g. myagents:lead"
    )
    serve.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio",
    )
    serve.add_argument(
        "--budget-tokens", type=_positive_int, metavar="N", help="token limit of each call"
    )
    serve.add_argument(
        "--budget-seconds", type=_positive_float, metavar="S", help="wall-clock limit of each call"
    )
    serve.add_argument(
        "--budget-requests",
        type=_positive_int,
        metavar="N",
        help="model request limit of each call",
    )
    serve.add_argument(
        "--budget-tool-calls", type=_positive_int, metavar="N", help="tool call limit of each call"
    )
    return serve


def load_agent(spec: str) -> Agent:
    """The ``actors.Agent`` named ``module:attribute``, imported as
    ``_imports.import_spec`` does (the current directory too); a ``ValueError`` (or a
    ``TypeError``: not an Agent) saying what is wrong."""
    found = import_spec(
        spec,
        example="myagents:researcher",
        fits=lambda value, _module: isinstance(value, Agent),
        kind="agents",
    )
    if not isinstance(found, Agent):
        raise TypeError(f"{spec!r} is a {type(found).__qualname__}, not a fractor.Agent")
    return found


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--http {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8000")
    return host, int(port)


async def mcp_serve_command(args: argparse.Namespace) -> int:
    """Run ``fractor mcp-serve``; returns the exit status."""
    try:
        from ..integrations import mcp_serve
    except ImportError as exc:
        print(
            f"fractor mcp-serve: needs the mcp extra (pip install 'fractor[mcp]'): {exc}",
            file=sys.stderr,
        )
        return 2
    try:
        agent = load_agent(args.agent)
        address = None if args.http is None else _address(args.http)
    except (ValueError, TypeError) as exc:
        print(f"fractor mcp-serve: {exc}", file=sys.stderr)
        return 2
    limits = {
        "tokens": args.budget_tokens,
        "seconds": args.budget_seconds,
        "requests": args.budget_requests,
        "tool_calls": args.budget_tool_calls,
    }
    budget = Budget(**limits) if any(v is not None for v in limits.values()) else None
    if address is None:
        print(f"fractor mcp-serve: serving agent {agent.name!r} over stdio", file=sys.stderr)
        return _stopped(await mcp_serve.serve_stdio(agent, budget=budget))
    try:
        sock = mcp_serve.bind(*address)
    except OSError as exc:
        print(f"fractor mcp-serve: cannot listen on {args.http}: {exc}", file=sys.stderr)
        return 2

    def ready(url: str) -> None:
        print(f"fractor mcp-serve: serving agent {agent.name!r} at {url}", file=sys.stderr)
        sys.stderr.flush()

    with sock:
        return _stopped(await mcp_serve.serve_http(agent, sock, budget=budget, ready=ready))


def _stopped(stopped: Any) -> int:
    """The exit status of a server that stopped (``mcp_serve.Stopped``): 0, after one
    line on stderr when a signal stopped it, saying how many calls it answered so."""
    if stopped.signal:
        count = stopped.calls
        answered = (
            f"; {count} call{'s' if count != 1 else ''} in flight answered with an error"
            if count
            else ""
        )
        print(f"fractor mcp-serve: stopped ({stopped.signal}){answered}", file=sys.stderr)
    return 0
