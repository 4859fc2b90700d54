# The two commands a new user needs: `make demo` and `make test`.
# Both run `make setup` first, which is idempotent.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fastci-setup

.PHONY: setup demo test bench clean

setup: $(STAMP)

$(STAMP): third_party/requirements.txt pyproject.toml
	bash tools/setup.sh
	touch $(STAMP)

demo: setup
	$(PY) -m bench.demo

# Extra pytest flags, e.g. PYTEST_ARGS=--junitxml=build/pytest.xml, and a file
# to receive pytest's own exit code (make turns every failure into 2); .ci/run uses both.
PYTEST_ARGS ?=
PYTEST_RC_FILE ?=

# FastCI's tests, microllm's unit tests, and microllm's GPU suite at its floors
# (the full-workload suite is `bazel test //examples/...`, not part of `make test`).
test: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q tests examples/microllm/unit_tests \
		examples/microllm/tests --at-floors $(PYTEST_ARGS); \
	rc=$$?; if [ -n "$(PYTEST_RC_FILE)" ]; then echo $$rc > "$(PYTEST_RC_FILE)"; fi; exit $$rc

bench: setup
	$(PY) -m bench

clean:
	-bazel shutdown
	rm -rf $(VENV) bazel-*
