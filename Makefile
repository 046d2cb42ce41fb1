# The commands a newcomer needs: `make demo` and `make test`. Everything else is a step of those.
SHELL := /bin/bash
PY := .venv/bin/python
LOCALCLUSTER := PYTHONPATH=tests/e2e $(PY) -m localcluster
KUBECONFIG_LOCAL := .local-cluster/kubeconfig

.PHONY: setup cluster-up cluster-down demo test test-unit test-e2e bench lint

setup:
	@scripts/setup.sh

cluster-up: setup
	@$(LOCALCLUSTER) up

cluster-down:
	@if [ -x $(PY) ]; then $(LOCALCLUSTER) down; fi

demo: setup
	$(PY) scripts/demo.py

test: setup
	$(PY) -m pytest tests

test-unit: setup
	$(PY) -m pytest tests/unit

test-e2e: setup
	$(PY) -m pytest tests/e2e

bench: setup
	$(PY) -m bench

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check tests/e2e/localcluster bench
