# The commands a newcomer needs: `make demo` and `make test`. Everything else is a step of those.
SHELL := /bin/bash
PY := .venv/bin/python
LOCALCLUSTER := $(PY) -m harness.localcluster
# `make bench BENCH="tool_sandbox operator"` runs only those (directories of bench/)
BENCH ?=

.PHONY: setup cluster-up cluster-down images demo test test-fast test-process test-unit test-e2e bench lint chart-generate chart-check gpu-image-check

setup:
	@scripts/setup.sh

cluster-up: setup
	@$(LOCALCLUSTER) up

cluster-down:
	@if [ -x $(PY) ]; then $(LOCALCLUSTER) down; fi

# build the three images (images/) with buildah on a locally made Debian base; cached by input
images: setup
	@$(LOCALCLUSTER) images

# build the trainer's GPU variant (~4 GB of CUDA wheels; the free disk it needs: images/README.md) and check it in a pod on a
# local cluster's real node: vLLM, verl and torch import, the GPU example's dry run passes (no GPU
# needed; not part of `make test`)
gpu-image-check: setup
	@images/trainer/gpu-image-check.sh

demo: setup
	$(PY) scripts/demo.py

# all three tiers (tests/conftest.py marks each test): pure, process and cluster, as two pytest
# processes side by side (harness/harness/test_streams.py: the real node's modules and the rest)
test: setup lint
	@$(PY) -m harness.test_streams

# the edit loop: the pure tier only (in-process, no servers, no verl)
test-fast: setup
	$(PY) -m pytest -m pure tests

# real sandbox servers, worker pools and the trainer stack, no cluster
test-process: setup
	$(PY) -m pytest -m process tests

test-unit: setup
	$(PY) -m pytest tests/unit

test-e2e: setup
	$(PY) -m pytest tests/e2e

# the operator benchmark needs a running cluster of kwok nodes; the others start what they measure
bench: setup
	@$(LOCALCLUSTER) up --no-real-node
	$(PY) -m bench $(BENCH)

# ruff, and mypy strict on the operator (pyproject.toml [tool.mypy])
lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy

# regenerate the chart's dashboard JSON, alert rules and CRD copy after editing charts/chartgen or crds/
chart-generate: setup
	$(PY) -m chartgen

chart-check: setup
	$(PY) -m chartgen --check
