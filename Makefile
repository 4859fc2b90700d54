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
	$(PY) -m fastci.demo

test: setup
	$(PY) -m pytest -q tests examples/microllm/unit_tests

bench: setup
	$(PY) -m bench

clean:
	-bazel shutdown
	rm -rf $(VENV) bazel-*
