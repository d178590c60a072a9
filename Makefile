# Every target is self-contained on a fresh machine: it creates .venv and installs the pinned dependencies first.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test bench lint images clean

$(STAMP): pyproject.toml requirements.lock
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; fix: install Python 3.11 or pass PYTHON=..."; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# requirements.lock pins every transitive dependency; pyproject.toml pins the direct ones.
	$(BIN)/pip install --quiet -c requirements.lock -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/sdarflow demo --out demo-output

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m bench --quick

lint: $(STAMP)
	$(BIN)/ruff check src components pipelines tests
	$(BIN)/ruff format --check src components pipelines tests

clean:
	rm -rf $(VENV) demo-output .pytest_cache
