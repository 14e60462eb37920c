# Engram: the two commands are `make run` and `make test`; everything else they need is here.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench lint validate-deploy eval clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, by exact version: the CPU wheel on local disk (see pyproject).
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m services.stack run

test: $(STAMP) deploy-tools
	$(BIN)/python -m pytest -q tests

# docker-compose (Debian's package) parses docker-compose.yml offline; no engine runs here.
deploy-tools:
	@command -v docker-compose >/dev/null 2>&1 || { (apt-get update -qq && apt-get install -y -qq docker-compose >/dev/null) || echo "docker-compose not installable; its test will skip"; }

validate-deploy: $(STAMP) deploy-tools
	$(BIN)/python -m pytest -q tests/deploy

bench: $(STAMP)
	$(BIN)/python -m bench.run_all

eval: $(STAMP)
	$(BIN)/python -m bench.eval_locomo

clean:
	rm -rf $(VENV) .data
