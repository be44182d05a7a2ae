# fedpers: `make run` (quick-start experiment) and `make test` (test suite). Both create .venv first.
# `make compose-check`: docker-compose.yml live on a local base image (root; installs Docker, docker-compose and
# debootstrap with apt where it may and starts dockerd, else names what is missing: deploy/compose/prereqs.sh).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.fedpers-installed
export FLWR_TELEMETRY_ENABLED := 0
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION := 1

.PHONY: run test venv clean bench-mnist nginx compose-check

venv: $(STAMP)

# Pinned dependencies (requirements.lock) with pip: torch 2.14.1 / torchvision 0.29.1 come from the
# machine's local wheels where present; nothing may pull a newer torch.
$(STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.lock
	$(BIN)/python -m pip install -q --no-deps -e .
	@touch $(STAMP)

run: $(STAMP)
	$(BIN)/fedpers sweep configs/sweeps/quickstart_compare.yaml --out results/quickstart
	@cat results/quickstart/table.md
	@echo "curves: results/quickstart/curves_digits_a0.1.png; each run's own files: results/quickstart/runs/"

test: $(STAMP) nginx
	$(BIN)/python -m pytest -q

# The deployment tests put nginx in front of the SuperLink (as deploy local and compose do): install
# Debian's where we may (root with apt); elsewhere those tests skip and say why.
nginx:
	@command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx || \
	  { test "$$(id -u)" = 0 && command -v apt-get >/dev/null 2>&1 && apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null 2>&1 || \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null 2>&1; } || \
	  echo "nginx not installed (needs root and apt): the deployment tests will skip"

bench-mnist: $(STAMP)
	$(BIN)/python benchmarks/mnist_table2.py --rounds 10

# docker-compose.yml up on a local Debian base image (no Docker Hub), a short run through the proxy, the
# reachability probes, a SuperNode restart, a run the nodes do not fit, teardown; output in
# results/compose-check/compose-check-<UTC time>.out (ignored by git).
compose-check: $(STAMP)
	FEDPERS_BIN=$(abspath $(BIN)) deploy/compose/check.sh

clean:
	rm -rf $(VENV) results .pytest_cache
