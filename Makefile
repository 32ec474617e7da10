# The two commands a newcomer runs: `make demo` and `make test`. Both bootstrap what they need.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo test test-floors tools lint e2e e2e-sglang soak bench check-deploy sync-deploy clean

# uv installs the dependencies in seconds where pip takes ~40 s on the 2-core box; pip is the
# fallback when uv cannot be installed. xds-protos (prefixgate epp) bundles an older copy of
# opentelemetry/proto/*: the real opentelemetry-proto is reinstalled over it, so tracing's OTLP
# exporter finds the names it imports.
# The venv is made without pip (its ensurepip takes ~5 s) and the outer pip puts uv in it (`pip
# --python`, pip >= 22.3); where that fails, the venv gets its own pip.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv --without-pip $(VENV)
	if $(PY) -m pip --python $(BIN)/python install -q uv || \
	   { $(BIN)/python -m ensurepip -q && $(BIN)/pip install -q uv; }; then \
	  install="$(BIN)/uv pip install -q --python $(BIN)/python"; again="--reinstall"; \
	else \
	  $(BIN)/python -m ensurepip -q; $(BIN)/pip install -q -U pip; install="$(BIN)/pip install -q"; again="--force-reinstall"; \
	fi; \
	$$install -e '.[test]' && \
	$$install $$again --no-deps "opentelemetry-proto==$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"
	touch $(STAMP)

venv: $(STAMP)

# System services and tools the tests use for real: redis-server, promtool, helm.
tools:
	@bash scripts/install-tools.sh

demo: venv
	$(BIN)/prefixgate demo

# The suite runs in TEST_WORKERS processes (pytest-xdist; 0: in this one), a file's tests in one
# process; a test marked `exclusive` (it times the wall clock) runs while no other does. Four even
# on 2 cores: most tests wait rather than compute (docs/testing-parallel.md).
TEST_WORKERS ?= 4
# Bytecode is written even where the environment says PYTHONDONTWRITEBYTECODE: every worker and
# every child process (`prefixgate serve`, the simulator) would otherwise compile app/ and rewrite
# the tests' asserts anew on every run. app/ is compiled once up front, in parallel, and so are the
# test modules as pytest rewrites them and the client SDKs the tests import (tests/warm_bytecode.py),
# which each worker would otherwise do itself.
TEST_ENV := PYTHONDONTWRITEBYTECODE= PATH="$(CURDIR)/.tools/bin:$$PATH"

# The virtualenv and the tools are independent: set up side by side (from a clean clone the tools'
# download overlaps the install).
test:
	@$(MAKE) --no-print-directory -j2 venv tools
	$(BIN)/ruff check -q app tests bench dashboards deploy
	$(TEST_ENV) $(BIN)/python -m compileall -q -j 0 app tests
	$(TEST_ENV) $(BIN)/python tests/warm_bytecode.py
	$(TEST_ENV) $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: venv
	$(BIN)/ruff check app tests bench

# Deploy artefacts only (dashboards, alert rules, Helm chart, kustomize, Dockerfile, tracing);
# also part of `make test`.
check-deploy: venv tools
	PATH="$(CURDIR)/.tools/bin:$$PATH" $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/test_deploy_dashboards.py tests/test_deploy_rules.py tests/test_deploy_helm.py \
		tests/test_deploy_manifests.py tests/test_deploy_prometheus.py tests/test_tracing.py

# Regenerate the dashboards and the Helm chart's copies (dashboards, rules, values schema).
sync-deploy: venv
	$(BIN)/python dashboards/build.py
	$(BIN)/python deploy/sync.py

e2e: venv
	PATH="$(CURDIR)/.tools/bin:$$PATH" bash scripts/e2e.sh

# The real-SGLang tier (SGLang 0.5.23 on CPU; the first run installs .venv-sglang, ~10 min).
e2e-sglang: venv
	PATH="$(CURDIR)/.tools/bin:$$PATH" bash scripts/e2e-sglang.sh

# Every tune-side diagnosis split scored against its floor (tests/test_diagnosis_scores.py; ~45 s): the
# newest are in `make test`, the older ones (a split more each round) here; CI runs both.
test-floors: venv
	$(TEST_ENV) $(BIN)/python -m pytest -q -p no:cacheprovider -m floors -n 3 --dist loadfile \
		tests/test_diagnosis_scores.py tests/test_diagnosis_floors.py tests/test_diagnosis_floors_last.py

# The long-run memory test (~90 s, so not in `make test`): a real gateway process at a small
# memory.budget_mb, RSS read at steady state (tests/test_memory_soak.py, docs/memory.md).
soak: venv
	$(BIN)/python -m pytest -q -p no:cacheprovider -m soak -s tests/test_memory_soak.py

bench: venv
	$(BIN)/prefixgate bench all

clean:
	rm -rf $(VENV) .tools .pytest_cache
