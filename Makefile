# MessageX — every command a newcomer, a developer or CI needs.
#
# A fresh machine needs only Python 3.11+ and make: the first target that needs the project
# creates .tools/ (a venv holding uv from PyPI) and .venv/ (the project, from uv.lock).
# Later runs only check that .venv/ matches uv.lock, which takes uv a few milliseconds.

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
UV_VERSION := 0.13.8
TOOLS := .tools
UV := $(TOOLS)/bin/uv
VENV := .venv
BIN := $(VENV)/bin

# Where `make run` / `make migrate` keep the embedded PostgreSQL (when DATABASE_URL is unset).
MESSAGEX_DATA_DIR ?= $(CURDIR)/.messagex

# uv: install into .venv, never download a Python of its own.
export UV_PROJECT_ENVIRONMENT := $(CURDIR)/$(VENV)
export UV_PYTHON_DOWNLOADS := never
# Compile bytecode at install: environments that set PYTHONDONTWRITEBYTECODE (containers, CI)
# would otherwise parse every module from source at each start (~2.5 s of `messagex serve`).
export UV_COMPILE_BYTECODE := 1

# Extra arguments: `make test ARGS="tests/api -k queues"`, `make run ARGS="--port 9000"`.
ARGS ?=
# pytest-xdist workers for `make test` (0: one process). The suite mostly waits, so 3
# workers run it in about half the time on 2 cores; CPU-heavy tests form groups that run one
# at a time each (tests/conftest.py). CI runs 3 (.ci/run); `make test TEST_WORKERS=0` is
# the serial run.
TEST_WORKERS ?= 3

.PHONY: help sync run db-url test lint openapi migrate bench clean distclean

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 12

# A stamp per uv version: changing UV_VERSION reinstalls uv on the next make.
UV_STAMP := $(TOOLS)/.uv-$(UV_VERSION)

$(UV_STAMP):
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || \
		{ echo "MessageX needs Python 3.11 or newer: run make with PYTHON=/path/to/python3.11" >&2; exit 1; }
	@test -x $(TOOLS)/bin/python || $(PYTHON) -m venv $(TOOLS) || \
		{ rm -rf $(TOOLS); echo "could not create a venv (Debian/Ubuntu: apt-get install python3-venv)" >&2; exit 1; }
	$(TOOLS)/bin/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	@rm -f $(TOOLS)/.uv-* && touch $@

sync: $(UV_STAMP) ## Install or update .venv from uv.lock (cheap when nothing changed)
	@$(UV) sync --frozen --quiet --python "$$($(PYTHON) -c 'import sys; print(sys.executable)')"

run: sync ## Run the broker on http://127.0.0.1:8000 (embedded PostgreSQL unless DATABASE_URL is set)
	MESSAGEX_DATA_DIR="$(MESSAGEX_DATA_DIR)" $(BIN)/messagex serve $(ARGS)

db-url: sync ## Print the database URL of the broker `make run` runs (for services using §18)
	@MESSAGEX_DATA_DIR="$(MESSAGEX_DATA_DIR)" $(BIN)/messagex database-url

test: sync ## Run the whole test suite (embedded PostgreSQL unless MESSAGEX_TEST_DATABASE_URL is set)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(ARGS)

lint: sync ## ruff check, ruff format --check, mypy --strict, import-linter
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

openapi: sync ## Regenerate openapi/openapi.json and openapi/asyncapi.json from the app
	$(BIN)/messagex openapi --output openapi/openapi.json
	$(BIN)/messagex asyncapi --output openapi/asyncapi.json

migrate: sync ## Migrate the database (DATABASE_URL, or the embedded one) to the latest schema
	MESSAGEX_DATA_DIR="$(MESSAGEX_DATA_DIR)" $(BIN)/messagex migrate $(ARGS)

bench: sync ## Run the benchmarks (python -m bench; see bench/)
	$(BIN)/python -m bench $(ARGS)

clean: ## Remove caches and build output (keeps .venv, .tools and the .messagex data)
	rm -rf .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .hypothesis dist build
	find . -path ./$(VENV) -prune -o -path ./$(TOOLS) -prune -o \
		-name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean ## Also remove .venv and .tools (the next make bootstraps them again)
	rm -rf $(VENV) $(TOOLS)
