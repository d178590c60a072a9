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

IMAGE_REPO ?= ghcr.io/sdarflow
VERSION    := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)

images:
	@command -v docker >/dev/null || { echo "error: docker not found; fix: run on a machine with Docker (BuildKit)"; exit 2; }
	DOCKER_BUILDKIT=1 docker build -f images/Dockerfile.cpu -t $(IMAGE_REPO)/sdarflow:$(VERSION) .
	DOCKER_BUILDKIT=1 docker build -f images/Dockerfile.train-gpu -t $(IMAGE_REPO)/sdarflow-train-gpu:$(VERSION) .
	DOCKER_BUILDKIT=1 docker build -f images/Dockerfile.rollout-gpu -t $(IMAGE_REPO)/sdarflow-rollout-gpu:$(VERSION) .

clean:
	rm -rf $(VENV) demo-output .pytest_cache
