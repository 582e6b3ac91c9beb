"""The model-string registry: a provider is its own module(s) and one entry in
``PROVIDERS``, and nothing else names it.

A provider fractor does not ship (``MistralModel``, written in this file as a user
would write it in theirs, from public names only) is added with one line,
``PROVIDERS["mistral"] = MistralModel``: ``model_from_string``, an agent and
``fractor run --model mistral:...`` then know it, without a change to fractor.
Inside the package, the wire formats fractor ships import only their own modules
and the shared ones, never another's: one more is its modules and its entry.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Mapping
from typing import Any

import pytest

from fractor import Agent, Runtime
from fractor.actors import ModelRequest, ModelResponse, estimate_tokens, reply
from fractor.actors.cli import main
from fractor.actors.providers import PROVIDERS, model_from_string


class MistralModel:
    """A provider of a wire format fractor does not ship: it answers every request
    with a text naming its model and what it was configured with."""

    provider = "mistral"
    env_var = "MISTRAL_API_KEY"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.base_url = base_url or "https://api.mistral.ai/v1"
        self.api_key = api_key
        self.timeout = timeout
        self.options = dict(options or {})
        self.requests: list[ModelRequest] = []

    @property
    def name(self) -> str:
        return f"{self.provider}:{self.model}"

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        return reply(f"{self.model} says hello")

    def estimate_tokens(self, request: ModelRequest) -> int:
        return estimate_tokens(request)

    async def aclose(self) -> None:
        pass


@pytest.fixture
def mistral(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one line that adds the provider (undone after the test)."""
    monkeypatch.setitem(PROVIDERS, "mistral", MistralModel)


def test_an_unregistered_provider_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown provider 'mistral'") as raised:
        model_from_string("mistral:small-latest")
    assert "known providers are anthropic, openai" in str(raised.value)


@pytest.mark.usefixtures("mistral")
def test_a_provider_added_from_outside_resolves_from_its_model_strings() -> None:
    model = model_from_string(
        " Mistral:small-latest ", base_url="http://127.0.0.1:1/v1", api_key="k", temperature=0.2
    )
    assert isinstance(model, MistralModel)
    assert model.name == "mistral:small-latest"
    assert (model.base_url, model.api_key, model.timeout) == ("http://127.0.0.1:1/v1", "k", 60.0)
    assert model.options == {"temperature": 0.2}
    # Split at the first colon, as for every provider.
    assert isinstance(tagged := model_from_string("mistral:small:q4"), MistralModel)
    assert tagged.model == "small:q4"
    # The registry is the one list: the errors name it, the built-in providers stay.
    with pytest.raises(ValueError, match="known providers are anthropic, mistral, openai"):
        model_from_string("mixtral:small")
    with pytest.raises(ValueError, match="'anthropic:MODEL' or 'mistral:MODEL' or 'openai:MODEL'"):
        model_from_string("mistral:")
    assert PROVIDERS["openai"].__name__ == "OpenAIModel"  # type: ignore[attr-defined]


@pytest.mark.usefixtures("mistral")
async def test_an_agent_runs_on_a_provider_added_from_outside() -> None:
    model = model_from_string("mistral:small-latest")
    assert isinstance(model, MistralModel)
    async with Runtime() as rt:
        result = await (await rt.spawn(Agent("greeter", model))).ask("Say hello.")
    assert result.status == "completed", result.stop_reason
    assert result.text == "small-latest says hello"
    assert [request.messages[-1].content for request in model.requests] == ["Say hello."]


@pytest.mark.usefixtures("mistral")
def test_the_command_line_knows_a_provider_added_from_outside(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", "--model", "mistral:small-latest", "Say hello."]) == 0
    out = capsys.readouterr().out
    assert "agent 'assistant' started on mistral:small-latest" in out
    assert "small-latest says hello" in out
    assert "status: completed (final answer)" in out


def test_the_command_line_runs_a_provider_whose_model_has_no_base_url(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model with ``base_url = None`` (its SDK's default endpoint) starts as any
    other: the banner shows no address instead of failing to redact one."""

    class Local(MistralModel):
        def __init__(self, model: str, **options: Any) -> None:
            super().__init__(model, **options)
            self.base_url = None  # type: ignore[assignment]

    monkeypatch.setitem(PROVIDERS, "local", Local)
    assert main(["run", "--model", "local:small-latest", "Say hello."]) == 0
    out = capsys.readouterr().out
    assert "agent 'assistant' started on mistral:small-latest" in out
    assert "small-latest says hello" in out


# -- inside the package: no provider imports another ------------------------------------

PROVIDERS_DIR = pathlib.Path(__file__).parents[3] / "actors" / "providers"
#: What every wire format builds on.
SHARED = {"_base", "_content", "_errors", "_sse", "_estimates", "_ratelimits"}


def _imports(path: pathlib.Path) -> set[str]:
    """The modules of the providers' package that ``path`` imports (``from ._x``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                names.add(node.module.partition(".")[0])
            else:
                names.update(alias.name for alias in node.names)
    return names


def test_each_wire_format_imports_only_its_own_modules_and_the_shared_ones() -> None:
    modules = {path.stem: path for path in PROVIDERS_DIR.glob("_*.py") if path.stem != "__init__"}
    formats = {name.split("_")[1] for name in modules if name not in SHARED}
    assert formats == {"openai", "anthropic"}  # each one module and its readers
    for name, path in sorted(modules.items()):
        imported = _imports(path)
        if name in SHARED:
            assert imported <= SHARED, (name, imported)
            continue
        own = {other for other in modules if other.split("_")[1] == name.split("_")[1]}
        assert imported <= SHARED | own, (name, imported - SHARED - own)
    # The registry is the one place that names them all.
    assert {"_openai", "_anthropic"} <= _imports(PROVIDERS_DIR / "__init__.py")
