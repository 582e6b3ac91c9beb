"""Users install one package, ``fractor``: the wheel holds it and nothing else at the
top of site-packages, and a user's own ``runtime.py``, ``actors/`` or ``benchmarks/``
beside their script cannot shadow any part of it.

The wheel is built here with the project's own build backend (hatchling, in the
``dev`` extra: no network), unpacked into a folder, and run from it by a script in
a folder of the user's that holds those names.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).parent.parent

SCRIPT = """\
import anyio
from fractor import Agent, Budget, Runtime, ScriptedModel, call, reply, tool
import fractor.actors, fractor.runtime, fractor.benchmarks

@tool
async def get_weather(city: str) -> str:
    \"\"\"Current weather for a city.\"\"\"
    return f"22 C and sunny in {city}"

model = ScriptedModel([call("get_weather", city="Paris"), reply("Sunny in Paris.")])

async def main() -> None:
    async with Runtime(budget=Budget(tokens=10_000)) as rt:
        result = await (await rt.spawn(Agent("assistant", model, tools=[get_weather]))).ask("?")
        print(result.status, result.text)

anyio.run(main)
import actors, benchmarks.mine, runtime  # the user's own, untouched by fractor
print(actors.MINE, benchmarks.mine.MINE, runtime.MINE)
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    from hatchling.builders.wheel import WheelBuilder

    out = tmp_path_factory.mktemp("dist")
    (built,) = WheelBuilder(str(ROOT)).build(directory=str(out), versions=["standard"])
    return pathlib.Path(built)


def test_the_wheel_installs_fractor_and_nothing_else(wheel: pathlib.Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        record = next(name for name in names if name.endswith(".dist-info/RECORD"))
        recorded = archive.read(record).decode().splitlines()
        scripts = archive.read(record.replace("RECORD", "entry_points.txt")).decode()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"fractor", record.split("/")[0]}
    assert {line.split("/")[0] for line in recorded} == tops
    for layer in ("runtime", "actors", "benchmarks"):
        assert f"fractor/{layer}/__init__.py" in names
    assert "fractor/__init__.py" in names
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
    assert "fractor = fractor.actors.cli:main" in scripts


def test_a_users_own_runtime_actors_and_benchmarks_shadow_nothing(
    wheel: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    app = tmp_path / "app"
    (app / "actors").mkdir(parents=True)
    (app / "benchmarks").mkdir()
    (app / "runtime.py").write_text("MINE = 'my runtime'\n")
    (app / "actors" / "__init__.py").write_text("MINE = 'my actors'\n")
    (app / "benchmarks" / "mine.py").write_text("MINE = 'my benchmarks'\n")  # a namespace
    (app / "app.py").write_text(SCRIPT)
    # The unpacked wheel first: the editable install of this checkout is on the path
    # too (its .pth), and must not be the fractor the script finds.
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-W", "error", "app.py"],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "completed Sunny in Paris.",
        "my actors my benchmarks my runtime",
    ]
    where = subprocess.run(
        [sys.executable, "-c", "import fractor; print(fractor.__file__)"],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert where.stdout.strip() == str(site / "fractor" / "__init__.py"), where.stderr
