# The two commands a new user needs: `make demo` and `make test`.
# Both run `make setup` first, which is idempotent.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fastci-setup

.PHONY: setup demo test test-py312 bench eval gpu-wheels gpu-check gpu-check-smoke clean remote-cache-setup remote-cache-start remote-cache-stop remote-cache-status

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
test: setup remote-cache-setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q tests examples/microllm/unit_tests \
		examples/microllm/tests --at-floors $(PYTEST_ARGS); \
	rc=$$?; if [ -n "$(PYTEST_RC_FILE)" ]; then echo $$rc > "$(PYTEST_RC_FILE)"; fi; exit $$rc

# The Python 3.12 leg: the recorder's sys.monitoring engine, ingest and selection tests
# (tests/py312_leg.txt) in .venv312 (third_party/requirements-py312.txt, pyenv's 3.12).
# tools/py312_leg.sh says which interpreter; a missing Python 3.12 fails, never skips.
test-py312:
	bash tools/py312_leg.sh $(PYTEST_ARGS)

# The loopback remote cache (docs/REMOTE.md): BuildGrid in its own virtualenv
# (never in .venv, so the tests' dependency set stays as it is), serving
# grpc://127.0.0.1:$(REMOTE_CACHE_PORT) from $(REMOTE_CACHE_DIR) (blobs in cas/,
# server.pid, server.log). Use it with `bazel test //... --config=remote_cache`.
BG_VENV := .venv-buildgrid
BG_STAMP := $(BG_VENV)/.fastci-requirements
REMOTE_CACHE_PORT ?= 8980
REMOTE_CACHE_DIR ?= build/remote_cache
RC := python3 tools/remote_cache/server.py

remote-cache-setup: $(BG_STAMP)

# `make test` lists it after `setup`, which installs python3-venv on Debian when missing.
$(BG_STAMP): tools/remote_cache/requirements.txt
	$(RC) setup --venv $(BG_VENV)

remote-cache-start: remote-cache-setup
	$(RC) start --venv $(BG_VENV) --port $(REMOTE_CACHE_PORT) --dir $(REMOTE_CACHE_DIR)

remote-cache-stop:
	$(RC) stop --dir $(REMOTE_CACHE_DIR)

remote-cache-status:
	$(RC) status --dir $(REMOTE_CACHE_DIR)

bench: setup
	$(PY) -m bench

# The README's headline table: `fastci eval` on the bundled example's benchmark changes
# (docs/EVAL.md), every test really run at full workload and the plan's tests as planned.
# The calibration reduction needs is a main-branch job (about 40 min on 2 CPU cores):
# made here only when .fastci/calibration.db is absent. Long: ~6 min per change on 2 cores.
EVAL_CHANGES ?= bench/changes/*.patch
EVAL_ARGS ?= --gpu-slots 8
EVAL_OUT ?= build/eval
eval: setup
	test -f .fastci/calibration.db || $(PY) -m fastci calibrate
	OMP_NUM_THREADS=1 $(PY) -m fastci eval $(EVAL_CHANGES) $(EVAL_ARGS) --out $(EVAL_OUT)

# The GPU check (tools/gpu_check/check.py; docs/REDUCTION.md, "On a GPU"): FastCI measured on
# one GPU host that has python3 with CUDA torch but no network, no Bazel and no virtualenv.
# Here (with network): `make gpu-wheels` downloads the cp312 manylinux wheels the host lacks,
# pinned by third_party/requirements.txt, into the git-ignored .whl/ (they travel with the
# tree). There: `make gpu-check` installs them into a scratch folder and runs the check
# (build/gpu-check/results.json and results.md); on a host without a GPU it stops at once (exit 3).
GPU_WHEELS := libcst bazel-runfiles protobuf coverage
GPU_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64
gpu-wheels: setup
	rm -rf .whl && mkdir -p .whl
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		$(foreach p,$(GPU_PLATFORMS),--platform $(p)) -d .whl \
		$$(for n in $(GPU_WHEELS); do grep -iE "^$$n==" third_party/requirements.txt; done)
	ls .whl

gpu-check:
	bash tools/gpu_check/run.sh $(GPU_CHECK_ARGS)

# Every stage of the check on CPU with two tests and one change: a smoke, not GPU numbers.
gpu-check-smoke: setup
	OMP_NUM_THREADS=1 $(PY) tools/gpu_check/check.py --device cpu --smoke $(GPU_CHECK_ARGS)

clean:
	-bazel shutdown
	-$(RC) stop --dir $(REMOTE_CACHE_DIR)
	rm -rf $(VENV) $(BG_VENV) bazel-*
