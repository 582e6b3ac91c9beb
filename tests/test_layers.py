"""Dependencies run one way: the imports of every module, read with ``ast``.

Every ``.py`` module of ``fractor`` (``runtime/``, ``actors/``, ``benchmarks/``) is parsed
(nothing is imported); each of its imports of these packages is resolved, absolute or
relative, at module level or inside a function. The check fails, naming the modules
and the line, on:

1. **A circle**: modules that import each other, directly or through others, counting
   every import: at module level, inside a function, and under ``if TYPE_CHECKING:``.
   An import for types only never runs, but a reader follows it all the same: two
   modules that name each other's types are one concept in two files, and neither
   can be read (nor changed) without the other. One circle is by design and stays:
   **the kernel's actor core** (``CORE``: an actor, its cell, its reference and the
   runtime that spawns them are one mechanism), and only within those modules.
2. **An upward import.** The layers, lowest first::

       runtime  <  actors (the core)  <  actors.providers  <  actors.integrations
                <  actors.ui  <  actors.cli  <  benchmarks

   A module imports its own layer and the layers below it, never one above: the
   kernel knows nothing of agents, the core nothing of providers, nothing of the
   product imports the benchmarks. The command line may use an integration, an
   integration never the command line. The web view (``actors.ui``) is the edge,
   with the command line: it may use the integrations, the providers and the core,
   the command line may serve it (``--ui``), nothing below imports it. A package's
   ``__init__`` (its public surface) may re-export from anywhere inside its own
   package: ``actors`` re-exports ``watch`` from ``actors.cli._live``.
3. **A private cross-package import.** A private module (one whose name, below the
   top package, starts with ``_``) is imported only from inside the package that
   holds it (its ``__init__``, its siblings and their subpackages) or by the
   ``__init__`` of a package enclosing it, re-exporting; anything else goes through
   the package's public surface. So ``actors.cli._run`` may import
   ``actors._agent._agent``, but ``actors`` may not import ``runtime._waiter`` (it imports
   ``runtime.lowlevel``), nor ``benchmarks`` ``actors._models._protocol``, nor
   ``actors.cli`` ``actors.providers._openai``.

4. **A heavy dependency in the core.** rich, Ray, MCP and OpenTelemetry are the
   edge's and the integrations' (``fractor.actors.cli``, ``fractor.actors.integrations``);
   no other module of the kernel or the agent layer imports them, at any level, for
   types only included: a user who never draws a live view or joins a cluster never
   loads them. The web view's server (Starlette, uvicorn) is the web view's
   (``fractor.actors.ui``) and the integrations' (the MCP server runs on uvicorn).

The tests themselves are not walked: they may reach into private modules. The
checker is first run on small synthetic module graphs, each breaking one rule, so
that the repository passing it means something.
"""

from __future__ import annotations

import ast
import itertools
import pathlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).parent.parent
#: The folders of the package ``fractor`` (``.package/fractor`` links to them).
PACKAGES = ("runtime", "actors", "benchmarks")
#: The layers, lowest first; a module's layer is the longest entry its name starts with.
#: ``fractor`` itself, the surface users import, is the top: nothing inside imports it.
LAYERS = (
    "fractor.runtime",
    "fractor.actors",
    "fractor.actors.providers",
    "fractor.actors.integrations",
    "fractor.actors.ui",
    "fractor.actors.cli",
    "fractor.benchmarks",
    "fractor",
)


@dataclass(frozen=True)
class Module:
    source: str
    is_package: bool  # an ``__init__.py``


@dataclass(frozen=True)
class Import:
    importer: str
    target: str
    line: int
    type_only: bool  # under ``if TYPE_CHECKING:``

    def __str__(self) -> str:
        kind = " for types only" if self.type_only else ""
        return f"{self.importer} imports {self.target} (line {self.line}){kind}"


# -- the checker ----------------------------------------------------------------------


#: The kernel's actor core: the one circle allowed for good. ``Actor`` is started and
#: stopped by its ``Cell``, which the ``Runtime`` creates and an ``ActorRef`` sends
#: to; each names the others (for types, at least) by the nature of the mechanism.
CORE = frozenset(
    {
        "fractor.runtime._actor",
        "fractor.runtime._cell",
        "fractor.runtime._ref",
        "fractor.runtime._runtime",
    }
)


def check(modules: Mapping[str, Module]) -> list[str]:
    """Every problem of ``modules`` (by dotted name), one sentence each; a circle
    within ``CORE`` is none."""
    imports = [found for name in sorted(modules) for found in imports_of(name, modules)]
    return [
        *circles(imports, (CORE,)),
        *upward(imports, modules),
        *private(imports, modules),
        *heavy(modules),
    ]


def imports_of(name: str, modules: Mapping[str, Module]) -> Iterator[Import]:
    """The imports by ``name`` of the packages of ``modules``, resolved to module names."""
    module = modules[name]
    package = name if module.is_package else name.rpartition(".")[0]
    tops = {known.partition(".")[0] for known in modules}
    visitor = _Visitor()
    visitor.visit(ast.parse(module.source))
    for target, level, names, line, type_only in visitor.found:
        if level:  # relative: ``from ..x import y``
            base = ".".join(package.split(".")[: len(package.split(".")) - (level - 1)])
            target = f"{base}.{target}" if target else base
        if target.partition(".")[0] not in tops:
            continue  # the standard library or a third party
        # ``from package import name``: the submodule ``name`` if there is one.
        targets = [f"{target}.{n}" if f"{target}.{n}" in modules else target for n in names]
        for resolved in dict.fromkeys(targets or [target]):
            if resolved != name:
                yield Import(name, resolved, line, type_only)


class _Visitor(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found: list[tuple[str, int, list[str], int, bool]] = []
        self.type_only = False

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        guarded = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        )
        if not guarded:
            self.generic_visit(node)
            return
        outer, self.type_only = self.type_only, True
        for statement in node.body:
            self.visit(statement)
        self.type_only = outer
        for statement in node.orelse:
            self.visit(statement)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.found.append((alias.name, 0, [], node.lineno, self.type_only))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        names = [alias.name for alias in node.names]
        self.found.append((node.module or "", node.level, names, node.lineno, self.type_only))


def circles(imports: list[Import], allowed: tuple[frozenset[str], ...] = ()) -> Iterator[str]:
    """Each circle of imports (for types only included), as one path around it,
    unless all its modules are within one of ``allowed``."""
    edges: dict[str, dict[str, Import]] = {}
    for found in imports:
        edges.setdefault(found.importer, {}).setdefault(found.target, found)
    for component in _strongly_connected(edges):
        if any(component <= modules for modules in allowed):
            continue
        start = min(component)
        path = _path_back(start, component, edges)
        steps = "; ".join(str(edges[a][b]) for a, b in itertools.pairwise(path))
        also = sorted(component - set(path))
        more = f" (the circle also takes in {', '.join(also)})" if also else ""
        yield f"import circle {' -> '.join(path)}: {steps}{more}"


def _strongly_connected(edges: Mapping[str, Mapping[str, Import]]) -> list[set[str]]:
    """Tarjan's algorithm; only the components of two modules or more."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for successor in edges.get(node, {}):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def _path_back(
    start: str, component: set[str], edges: Mapping[str, Mapping[str, Import]]
) -> list[str]:
    """The shortest path from ``start`` round to itself inside ``component``."""
    paths = {start: [start]}
    queue = [start]
    for node in queue:
        for successor in sorted(edges.get(node, {})):
            if successor == start:
                return [*paths[node], start]
            if successor in component and successor not in paths:
                paths[successor] = [*paths[node], successor]
                queue.append(successor)
    raise AssertionError(f"no way back to {start}")  # pragma: no cover - a component


def layer(name: str) -> str:
    """The layer of a module: the longest of ``LAYERS`` its name is in."""
    return max((p for p in LAYERS if name == p or name.startswith(f"{p}.")), key=len)


def upward(imports: list[Import], modules: Mapping[str, Module]) -> Iterator[str]:
    for found in imports:
        importer, target = layer(found.importer), layer(found.target)
        if LAYERS.index(target) <= LAYERS.index(importer):
            continue
        if modules[found.importer].is_package and found.target.startswith(f"{found.importer}."):
            continue  # a package's surface re-exports from inside the package
        yield f"upward import: {found}: {importer!r} is below {target!r}"


def owner(name: str) -> str | None:
    """The package a private module belongs to; ``None`` for a public module."""
    parts = name.split(".")
    for depth, part in enumerate(parts[1:], 1):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            return ".".join(parts[:depth])
    return None


def private(imports: list[Import], modules: Mapping[str, Module]) -> Iterator[str]:
    for found in imports:
        home = owner(found.target)
        if home is None or found.importer == home or found.importer.startswith(f"{home}."):
            continue
        if modules[found.importer].is_package and home.startswith(f"{found.importer}."):
            continue  # an enclosing package's surface re-exports it
        yield (
            f"private import: {found}: {found.target} is private to {home!r}; import "
            f"what it needs from a public module of {home!r}"
        )


#: Third-party packages only the edge and the integrations may import.
HEAVY = ("rich", "ray", "mcp", "opentelemetry", "starlette", "uvicorn")
#: Where they may be imported (and everything below).
HEAVY_HOMES = (
    "fractor.actors.cli",
    "fractor.actors.ui",
    "fractor.actors.integrations",
    "fractor.benchmarks",
)


def heavy(modules: Mapping[str, Module]) -> Iterator[str]:
    for name in sorted(modules):
        if any(name == home or name.startswith(f"{home}.") for home in HEAVY_HOMES):
            continue
        visitor = _Visitor()
        visitor.visit(ast.parse(modules[name].source))
        for target, level, _, line, _ in visitor.found:
            top = target.partition(".")[0]
            if not level and top in HEAVY:
                yield (
                    f"heavy import: {name} imports {target} (line {line}); only "
                    f"{', '.join(HEAVY_HOMES)} may"
                )


def repository() -> dict[str, Module]:
    top = ROOT / ".package" / "fractor" / "__init__.py"
    modules = {"fractor": Module(top.read_text(encoding="utf-8"), True)}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = ("fractor", *path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            modules[name] = Module(path.read_text(encoding="utf-8"), is_package)
    return modules


# -- the checker on synthetic graphs ----------------------------------------------------


def graph(sources: Mapping[str, str]) -> dict[str, Module]:
    """Modules from their sources; the packages enclosing them are empty unless given
    (a module whose name another one extends is a package)."""
    named = {
        "fractor": "",
        "fractor.runtime": "",
        "fractor.actors": "",
        "fractor.benchmarks": "",
        **sources,
    }
    for name in list(named):  # every enclosing package exists, empty unless given
        parts = name.split(".")
        for depth in range(1, len(parts)):
            named.setdefault(".".join(parts[:depth]), "")
    return {
        name: Module(source, any(other.startswith(f"{name}.") for other in named))
        for name, source in named.items()
    }


TYPE_ONLY = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    "

BROKEN = {
    "a circle": (
        {"fractor.actors._a": "from ._b import B", "fractor.actors._b": "from . import _a"},
        "import circle fractor.actors._a -> fractor.actors._b -> fractor.actors._a",
    ),
    "a circle through a function's import": (
        {
            "fractor.actors._a": "from ._b import B",
            "fractor.actors._b": "from ._c import C",
            "fractor.actors._c": "def f():\n    from fractor.actors._a import A",
        },
        "import circle fractor.actors._a -> fractor.actors._b -> fractor.actors._c"
        " -> fractor.actors._a",
    ),
    "a circle through an import for types only": (
        {
            "fractor.actors._agent": "from ._execution import Execution",
            "fractor.actors._execution": TYPE_ONLY + "from ._agent import Agent",
        },
        "import circle fractor.actors._agent -> fractor.actors._execution -> "
        "fractor.actors._agent: fractor.actors._agent imports fractor.actors._execution "
        "(line 1); fractor.actors._execution imports fractor.actors._agent (line 3) "
        "for types only",
    ),
    "a circle of imports for types only": (
        {
            "fractor.actors._host": TYPE_ONLY + "from ._hosts import HostLink",
            "fractor.actors._hosts": TYPE_ONLY + "from ._host import AgentHost",
        },
        "import circle fractor.actors._host -> fractor.actors._hosts -> fractor.actors._host",
    ),
    "the kernel's actor core taking in one more module": (
        {
            "fractor.runtime._actor": "from ._cell import Cell",
            "fractor.runtime._cell": "from ._mailbox import Mailbox",
            "fractor.runtime._mailbox": TYPE_ONLY + "from ._actor import Actor",
        },
        "import circle fractor.runtime._actor -> fractor.runtime._cell -> "
        "fractor.runtime._mailbox -> fractor.runtime._actor",
    ),
    "a circle outside the kernel's actor core": (
        {
            "fractor.runtime._supervisor": "from ._tree import Node",
            "fractor.runtime._tree": TYPE_ONLY + "from ._supervisor import Supervisor",
        },
        "import circle fractor.runtime._supervisor -> fractor.runtime._tree",
    ),
    "the kernel importing the agents": (
        {"fractor.runtime._x": "import fractor.actors"},
        "upward import: fractor.runtime._x imports fractor.actors (line 1): "
        "'fractor.runtime' is below 'fractor.actors'",
    ),
    "the core importing the command line": (
        {"fractor.actors.cli": "", "fractor.actors._agent": "from .cli import main"},
        "upward import: fractor.actors._agent imports fractor.actors.cli",
    ),
    "the core importing a provider, for types only": (
        {
            "fractor.actors.providers": "",
            "fractor.actors._agent": TYPE_ONLY + "from .providers import Model",
        },
        "upward import: fractor.actors._agent imports fractor.actors.providers (line 3)",
    ),
    "an integration importing the command line": (
        {"fractor.actors.cli": "", "fractor.actors.integrations.mcp": "from ..cli import main"},
        "upward import: fractor.actors.integrations.mcp imports fractor.actors.cli",
    ),
    "the core importing the web view": (
        {"fractor.actors.ui": "", "fractor.actors._agent": "from .ui import serve_ui"},
        "upward import: fractor.actors._agent imports fractor.actors.ui",
    ),
    "a provider importing the web view, for types only": (
        {
            "fractor.actors.ui": "",
            "fractor.actors.providers._openai": TYPE_ONLY + "from ..ui import UI",
        },
        "upward import: fractor.actors.providers._openai imports fractor.actors.ui (line 3)",
    ),
    "the web view importing the command line": (
        {"fractor.actors.cli": "", "fractor.actors.ui._server": "from ..cli import main"},
        "upward import: fractor.actors.ui._server imports fractor.actors.cli",
    ),
    "the core importing uvicorn": (
        {"fractor.actors._agent": "def serve():\n    import uvicorn"},
        "heavy import: fractor.actors._agent imports uvicorn (line 2)",
    ),
    "the product importing the benchmarks": (
        {"fractor.actors.cli._bench": "def suite():\n    import fractor.benchmarks"},
        "upward import: fractor.actors.cli._bench imports fractor.benchmarks",
    ),
    "the core importing the kernel's private module": (
        {
            "fractor.runtime._waiter": "",
            "fractor.actors._execution": "from fractor.runtime._waiter import park",
        },
        "private import: fractor.actors._execution imports fractor.runtime._waiter (line 1): "
        "fractor.runtime._waiter is private to 'fractor.runtime'",
    ),
    "the benchmarks importing a private module of the agents": (
        {
            "fractor.actors._models": "",
            "fractor.benchmarks._common": "from fractor.actors._models import CycleModel",
        },
        "private import: fractor.benchmarks._common imports fractor.actors._models",
    ),
    "the benchmarks importing the package's top instead of a layer": (
        {"fractor.benchmarks._common": "from fractor import Agent"},
        "upward import: fractor.benchmarks._common imports fractor (line 1)",
    ),
    "the core importing rich": (
        {"fractor.actors._agent": "def draw():\n    import rich.tree"},
        "heavy import: fractor.actors._agent imports rich.tree (line 2)",
    ),
    "the kernel importing OpenTelemetry for types only": (
        {"fractor.runtime._events": TYPE_ONLY + "from opentelemetry import trace"},
        "heavy import: fractor.runtime._events imports opentelemetry (line 3)",
    ),
    "a provider importing Ray": (
        {"fractor.actors.providers._openai": "import ray"},
        "heavy import: fractor.actors.providers._openai imports ray (line 1)",
    ),
    "the command line importing a provider's private module": (
        {
            "fractor.actors.providers._openai": "",
            "fractor.actors.cli._run": "from ..providers._openai import OpenAIModel",
        },
        "private import: fractor.actors.cli._run imports fractor.actors.providers._openai",
    ),
}

SOUND = {
    "the kernel's actor core importing each other, for types and at run time": {
        "fractor.runtime._actor": TYPE_ONLY + "from ._cell import Cell\n    from . import _runtime",
        "fractor.runtime._cell": "from ._actor import Actor\nfrom ._ref import ActorRef",
        "fractor.runtime._ref": TYPE_ONLY + "from ._runtime import Runtime",
        "fractor.runtime._runtime": "from ._actor import Actor\nfrom ._cell import Cell",
    },
    "two modules in one direction, the lower naming no type of the higher": {
        "fractor.actors._models": "from ._fakes import ScriptedModel",
        "fractor.actors._fakes": "from ._messages import ModelRequest",
        "fractor.actors._messages": "",
    },
    "a surface re-exporting from a subpackage's private module": {
        "fractor.actors": "from .cli._live import watch",
        "fractor.actors.cli._live": "from fractor.runtime import Runtime",
    },
    "the edge importing the core, the providers and the kernel's surfaces": {
        "fractor.runtime.lowlevel": "",
        "fractor.actors._agent": "from fractor.runtime.lowlevel import park",
        "fractor.actors.providers": "from .. import _agent",
        "fractor.actors.providers._openai": "",  # (so providers is a package)
        "fractor.actors.cli._run": (
            "from .._agent import Agent\nfrom ..providers import model_from_string"
        ),
    },
    "the command line serving the web view, which uses the core and an integration": {
        "fractor.actors.integrations.otel": "",
        "fractor.actors.ui._server": (
            "from .._agent import Agent\nfrom ..integrations import otel\nimport uvicorn"
        ),
        "fractor.actors.cli._ui": "from ..ui import serve_ui",
    },
    "the edge and the integrations importing what they draw and join with": {
        "fractor.actors.cli._live": "import rich.tree",
        "fractor.actors.integrations.ray": "import ray",
        "fractor.actors.integrations.otel": "from opentelemetry import trace",
    },
    "the benchmarks importing public surfaces and their own private modules": {
        "fractor.benchmarks._harness": "",
        "fractor.benchmarks.__main__": (
            "from . import _harness\nfrom fractor.actors import Agent\nimport fractor.runtime"
        ),
    },
}


@pytest.mark.parametrize(("sources", "expected"), BROKEN.values(), ids=BROKEN.keys())
def test_the_checker_reports_a_broken_rule(sources: dict[str, str], expected: str) -> None:
    problems = check(graph(sources))
    assert any(expected in problem for problem in problems), problems


@pytest.mark.parametrize("sources", SOUND.values(), ids=SOUND.keys())
def test_the_checker_accepts_a_sound_graph(sources: dict[str, str]) -> None:
    assert check(graph(sources)) == []


# -- the repository ---------------------------------------------------------------------


def test_the_walk_sees_every_module_and_its_imports() -> None:
    modules = repository()
    assert {
        "fractor.runtime.lowlevel",
        "fractor.actors._agent._agent",
        "fractor.actors.providers",
        "fractor.actors.cli._run",
    } <= set(modules)
    edges = {(i.importer, i.target, i.type_only) for n in modules for i in imports_of(n, modules)}
    # Imports of every kind are seen: absolute and relative, at run time and for
    # types only (the kernel's actor core has both; its circle is the one allowed).
    assert ("fractor.runtime._cell", "fractor.runtime._actor", False) in edges
    assert ("fractor.runtime._actor", "fractor.runtime._cell", True) in edges
    assert ("fractor.actors._hosts._remote", "fractor.runtime.lowlevel", False) in edges
    assert ("fractor.actors._hosts._hosts", "fractor.actors._hosts._remote", False) in edges
    assert ("fractor", "fractor.actors", False) in edges


def test_dependencies_run_one_way() -> None:
    problems = check(repository())
    assert not problems, "\n".join(problems)
