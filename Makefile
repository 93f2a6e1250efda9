# Two commands do everything on a fresh machine: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test install lint typecheck bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, pinned: 2.13.0 is a CPU build on local disk; an unpinned torch would pull GBs of CUDA.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[server,worker,dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/paraplan db upgrade
	@echo "paraplan: open http://$(HOST):$(PORT)/ (demo plan seeded on first start)"
	PARAPLAN_SEED_DEMO_PLAN=true $(BIN)/paraplan serve --host $(HOST) --port $(PORT)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy solvers service worker paraplan_cli

test: lint typecheck
	$(BIN)/python -m pytest -q $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

bench: $(STAMP)
	@for f in bench/*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

# (the database lives in the data directory, ~/.local/share/paraplan by default: clean leaves it)
clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
