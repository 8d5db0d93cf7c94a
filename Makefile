# Every target installs what it needs first, so each one works on a fresh clone.
PYTHON ?= python3
# `make test PYTHON=python3.13`: a name that is not on PATH is looked for among pyenv's
# versions; each Python other than the default gets a venv of its own beside .venv.
PYTHON_EXE := $(shell $(PYTHON) -c '' 2>/dev/null && echo $(PYTHON) || \
	ls -d $$(pyenv root 2>/dev/null)/versions/$(patsubst python%,%,$(PYTHON)).*/bin/$(PYTHON) \
	2>/dev/null | sort -V | tail -1)
VENV   := $(if $(filter python3,$(PYTHON)),.venv,.venv-$(notdir $(PYTHON)))
BIN    := $(VENV)/bin
PIP    := $(BIN)/pip install --quiet --disable-pip-version-check
# The dev extra (tests, lint, every integration) and, apart, what the demo runs: the package
# and the report extra, so that `make demo` installs in seconds and not the whole dev extra.
STAMP      := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.demo-installed
# The suite runs in parallel processes (pytest-xdist): its tests mostly wait on sockets and
# sleeps, so more workers than the 2 cores finish sooner. `make test WORKERS=0`: one process.
WORKERS ?= 4

.PHONY: install services test test-unit test-floors lint demo bench docs clean

install: $(STAMP)

$(BIN)/python:
	@test -n '$(PYTHON_EXE)' || (echo 'no $(PYTHON) on PATH or in pyenv' >&2; exit 2)
	$(PYTHON_EXE) -m venv $(VENV)

$(STAMP): setup.cfg pyproject.toml | $(BIN)/python
	$(PIP) -e '.[dev]'
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): setup.cfg pyproject.toml | $(BIN)/python
	$(PIP) -e '.[report]'
	touch $(DEMO_STAMP)

# redis-server for the shared-limits tests (they start their own on a free port) and chromium
# for the report's browser test (driven by playwright, never `playwright install`); installed
# from Debian's packages when missing and the machine allows it.
APT_INSTALL := DEBIAN_FRONTEND=noninteractive apt-get install -y -q

services:
	command -v redis-server >/dev/null || (command -v apt-get >/dev/null && \
		($(APT_INSTALL) redis-server >/dev/null || \
		 (apt-get update -q >/dev/null && $(APT_INSTALL) redis-server >/dev/null))) || \
		echo "redis-server is not installed: the shared-limits tests will be skipped"
	command -v chromium >/dev/null || (command -v apt-get >/dev/null && \
		($(APT_INSTALL) chromium >/dev/null || \
		 (apt-get update -q >/dev/null && $(APT_INSTALL) chromium >/dev/null))) || \
		echo "chromium is not installed: the report's browser test will be skipped"

test: install services docs
	$(BIN)/python -m pytest -n $(WORKERS)

# The tests that need no server, no browser and no other process: a fast check of one more Python.
test-unit: install
	$(BIN)/python -m pytest -n $(WORKERS) -m 'not integration'

demo: $(DEMO_STAMP)
	$(BIN)/python scripts/demo.py

# The lowest versions setup.cfg admits, in a venv of their own: each install_requires floor
# pinned (scripts/floors.py reads them from setup.cfg) as a constraints file, so that nothing
# installed beside the package can pull one up; with it the report extra (as `make demo`) and
# what collecting the unit tests imports (pytest imports every module, those that
# -m 'not integration' deselects too). A test of another extra skips without it. Then `pip
# freeze` must show every floor, and the unit tests and the demo run there.
FLOORS       := $(VENV)-floors
FLOORS_PINS  := $(FLOORS)/floors.txt
FLOORS_STAMP := $(FLOORS)/.installed
FLOORS_TOOLS := pytest pytest-xdist hypothesis responses trustme openai anthropic httpx boto3

$(FLOORS_STAMP): setup.cfg pyproject.toml scripts/floors.py
	@test -n '$(PYTHON_EXE)' || (echo 'no $(PYTHON) on PATH or in pyenv' >&2; exit 2)
	rm -rf $(FLOORS)
	$(PYTHON_EXE) -m venv $(FLOORS)
	$(FLOORS)/bin/python scripts/floors.py > $(FLOORS_PINS)
	$(FLOORS)/bin/pip install --quiet --disable-pip-version-check -c $(FLOORS_PINS) \
		-e '.[report]' $(FLOORS_TOOLS)
	touch $(FLOORS_STAMP)

test-floors: $(FLOORS_STAMP)
	$(FLOORS)/bin/pip freeze | $(FLOORS)/bin/python scripts/floors.py --check
	$(FLOORS)/bin/python -m pytest -n $(WORKERS) -m 'not integration'
	$(FLOORS)/bin/python scripts/demo.py

# The peers from the bench extra; nginx for the fast server when the machine can install it
# (without it, the bundled asyncio server stands in and the report says so).
bench: install
	$(PIP) -e '.[bench]'
	command -v nginx >/dev/null || (command -v apt-get >/dev/null && \
		($(APT_INSTALL) nginx-light >/dev/null || \
		 (apt-get update -q >/dev/null && $(APT_INSTALL) nginx-light >/dev/null))) || true
	$(BIN)/python scripts/bench.py

# The documentation site (mkdocs.yml, docs/) into site/, git-ignored. --strict: a broken link,
# a missing anchor or a reference to a name batchsync does not have fails the build.
DOCS_STAMP := $(VENV)/.docs-installed

$(DOCS_STAMP): $(STAMP)
	$(PIP) -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

lint: install
	$(BIN)/ruff check batchsync tests scripts examples/*.py
	$(BIN)/ruff format --check batchsync tests scripts examples/*.py
	$(BIN)/mypy

clean:
	rm -rf .venv .venv-* build dist site *.egg-info .pytest_cache .mypy_cache .ruff_cache
