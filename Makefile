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

.PHONY: venv python-check demo test lint unit molecule bench bench-deploy collection check-collection docs clean

venv: $(STAMP)

# ansible-core 2.19 (requirements-dev.txt) needs Python 3.11 or later: an older one is refused here, before
# pip spends minutes looking for a wheel that does not exist for it ("No matching distribution").
PYTHON_MIN := 3.11
python-check:
	@v="$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)"; \
	if [[ -z "$$v" ]]; then \
	  echo "make: '$(PYTHON)' does not run. pd-deploy needs Python >= $(PYTHON_MIN): install it, or name it: make $(or $(MAKECMDGOALS),venv) PYTHON=python3.11" >&2; exit 1; \
	fi; \
	if [[ "$$(printf '%s\n' "$(PYTHON_MIN)" "$$v" | sort -V | head -n1)" != "$(PYTHON_MIN)" ]]; then \
	  echo "make: $(PYTHON) is Python $$v; pd-deploy needs Python >= $(PYTHON_MIN) (ansible-core 2.19). Install it and name it: make $(or $(MAKECMDGOALS),venv) PYTHON=python3.11" >&2; exit 1; \
	fi; \
	[[ -e "$(STAMP)" ]] || echo "make: $(PYTHON) is Python $$v (>= $(PYTHON_MIN))"

# python-check first, on every run that needs the venv (a few milliseconds)
$(STAMP): requirements.txt requirements-dev.txt | python-check
	@echo "make: creating $(VENV) and installing requirements-dev.txt (ansible, the linters, Molecule): a first install downloads about 100 MB and takes 2 to 3 minutes; pip's lines follow"
	$(PYTHON) -m venv $(VENV)
	set -o pipefail; $(BIN)/pip install --disable-pip-version-check --progress-bar off -r requirements-dev.txt \
	  | { grep --line-buffered -E '^(Collecting|Installing|Successfully)' || true; }
	touch $(STAMP)

demo: venv
	@echo "make: rendering the embedded inventory (inventories/local): no host is touched"
	$(BIN)/ansible-playbook deploy-pd.yml -e pd_render_only=true
	@echo "make: rendering the example fleet (inventories/example)"
	$(BIN)/ansible-playbook deploy-pd.yml -i inventories/example -e pd_render_only=true
	@echo "Launch specs: build/local/render/<host>/*.json, build/example/render/<host>/*.json   Capacity: build/example/render/<cluster>/capacity.md"

lint: venv
	$(BIN)/yamllint --strict .
	$(BIN)/ansible-lint --offline

# the test files spread over every core (pytest-xdist), each file's tests in one worker, so a module's
# fixtures (ansible-playbook runs shared by its tests) run once
unit: venv
	$(BIN)/pytest -q -n auto --dist loadfile tests

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
