# pd-deploy: the two commands the README promises, plus lint / bench helpers.
#   make demo   venv + render-only run of the main playbook on the embedded inventories (no hardware)
#   make test   venv + lint + unit/render tests + Molecule scenarios on a local Docker engine (lint and
#               unit beside the Molecule lanes: tests/harness/run-tests.sh; PD_TEST_SERIAL=1 one by one)
#   make collection  build/collection/pd-deploy-<version>.tar.gz: `ansible-galaxy collection build` of the
#               checkout, which is the collection pd.deploy (galaxy.yml at the top; no Galaxy needed), and
#               the tarballs of its dependencies rebuilt from the ansible wheel (tools/wheel_collections.py)
#   make check-collection  ansible-lint, ansible-doc and ansible-test sanity of the built collection, installed
#               offline with its dependencies into a lean venv (tests/harness/check-artifact.sh)
#   make docs   rewrite docs/reference/variables.md from the argument specs, schemas and data files
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint unit molecule bench bench-deploy collection check-collection docs clean

venv: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $(STAMP)

demo: venv
	$(BIN)/ansible-playbook deploy-pd.yml -e pd_render_only=true
	$(BIN)/ansible-playbook deploy-pd.yml -i inventories/example -e pd_render_only=true
	@echo "Launch specs: build/local/render/<host>/*.json, build/example/render/<host>/*.json   Capacity: build/example/render/<cluster>/capacity.md"

lint: venv
	$(BIN)/yamllint --strict .
	$(BIN)/ansible-lint --offline

unit: venv
	$(BIN)/pytest -q tests

molecule: venv
	PATH="$(CURDIR)/$(BIN):$$PATH" bash tests/harness/run-molecule.sh

test: venv
	PATH="$(CURDIR)/$(BIN):$$PATH" MAKE="$(MAKE)" bash tests/harness/run-tests.sh

collection: venv
	$(BIN)/ansible-galaxy collection build --force --output-path build/collection .
	$(BIN)/python tools/wheel_collections.py --out build/collection

check-collection: venv
	PD_PROJECT_PYTHON="$(CURDIR)/$(BIN)/python" bash tests/harness/check-artifact.sh

docs: venv
	$(BIN)/python tools/variable_reference.py

bench: venv
	$(BIN)/python bench/bench.py

bench-deploy: venv
	$(BIN)/python bench/deploy_bench.py

clean:
	rm -rf build .pytest_cache .hypothesis
