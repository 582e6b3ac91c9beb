# Two commands on a fresh machine: `make demo` and `make test`.
# Each creates .venv on first use and installs the project with its dev extra.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest compiled bench stress clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fractor demo

# The suite runs in parallel (pytest-xdist): most of its tests wait (on servers,
# subprocesses, Ray, a browser), so it runs more workers than the machine has cores;
# tests that share something costly (a Ray instance, a browser, a module's server)
# run on one worker each (tests/conftest.py). mypy (about a minute on a fresh clone,
# before its cache exists) runs beside it: its report follows pytest's, and either
# failing fails. `make test JOBS=1` runs the suite in one process.
JOBS ?= 4
PYTEST_JOBS = $(if $(filter 1,$(JOBS)),,-n $(JOBS) --dist loadgroup --durations=10)
# pytest rewrites the asserts of every test module it imports, and keeps the result
# in __pycache__ unless PYTHONDONTWRITEBYTECODE is set (as it is on CI), when each
# worker rewrote every module again: 12 s of CPU a worker, half of its collection.
# So pytest may write its cache, and with workers one collection fills it first,
# beside mypy (one core each), for the workers to read.
PYTEST = PYTHONDONTWRITEBYTECODE= $(BIN)/pytest
REWRITTEN = $(if $(filter 1,$(JOBS)),true,$(PYTEST) --collect-only -q -p no:xdist > /dev/null 2>&1)

test: lint compiled
	@$(BIN)/mypy > $(VENV)/mypy.log 2>&1 & types=$$!; \
	$(REWRITTEN); \
	$(PYTEST) $(PYTEST_JOBS); tests=$$?; \
	wait $$types; typed=$$?; \
	echo "mypy:"; cat $(VENV)/mypy.log; \
	exit $$(( tests || typed ))

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP) compiled
	@$(REWRITTEN)
	$(PYTEST) $(PYTEST_JOBS)

# The package's bytecode, written once: the suite starts Python processes that import
# fractor hundreds of times (the CLI, MCP servers, crash-loop workers, Ray workers),
# and where PYTHONDONTWRITEBYTECODE is set (as on CI) each compiled every module again.
compiled: $(STAMP)
	@$(BIN)/python -m compileall -q -j 0 runtime actors benchmarks tests

bench: $(STAMP)
	$(BIN)/python -m fractor.benchmarks

stress: $(STAMP)
	$(BIN)/python -m tests.stress.crash --kills 100 --backend both
	$(BIN)/python -m tests.stress.fuzz --trees 2000 --backend both
	FRACTOR_STRESS=1 $(BIN)/pytest -n $(JOBS) tests/actors/hosts/test_lease_properties.py tests/actors/hosts/test_hosts.py

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .hypothesis
