# The two commands a newcomer runs: `make demo` and `make test`. Both bootstrap what they need.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo test tools lint e2e bench check-deploy clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# System services and tools the tests use for real: redis-server, promtool, helm.
tools:
	@bash scripts/install-tools.sh

demo: venv
	$(BIN)/prefixgate demo

test: venv tools
	PATH="$(CURDIR)/.tools/bin:$$PATH" $(BIN)/python -m pytest -q -p no:cacheprovider

lint: venv
	$(BIN)/ruff check app tests bench

e2e: venv
	PATH="$(CURDIR)/.tools/bin:$$PATH" bash scripts/e2e.sh

bench: venv
	$(BIN)/prefixgate bench all

clean:
	rm -rf $(VENV) .tools .pytest_cache
