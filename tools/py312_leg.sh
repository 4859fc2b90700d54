#!/usr/bin/env bash
# The Python 3.12 CI leg (`make test-py312`; .ci/run runs it after the main leg).
#
# FastCI records with sys.monitoring on Python 3.12+ (fastci/evidence/record/monitor.py) and with
# coverage.py's C tracer on 3.11 (the main leg). This leg keeps the 3.12 path from rotting:
# a venv of pinned packages (third_party/requirements-py312.txt; no torch, no Bazel) and
# the test modules listed in tests/py312_leg.txt. The interpreter: $FASTCI_PY312, else
# python3.12 on PATH, else pyenv's 3.12.1 (/root/.pyenv/versions/3.12.1/bin/python3).
# No interpreter is a failure, said in one line, never a skip.
# Prints "py312 leg: <pytest summary>" and exits with pytest's code (1 when setup failed).
set -uo pipefail
cd "$(dirname "$0")/.."

# A candidate counts when it runs and is 3.12+ (a pyenv shim may exist and fail to run).
is_312() { [ -n "$1" ] && "$1" -c 'import sys; assert sys.version_info[:2] >= (3, 12)' 2>/dev/null; }
py=""
if [ -n "${FASTCI_PY312:-}" ]; then
  is_312 "$FASTCI_PY312" && py="$FASTCI_PY312"
else
  for cand in "$(command -v python3.12 || true)" /root/.pyenv/versions/3.12.1/bin/python3; do
    if is_312 "$cand"; then py="$cand"; break; fi
  done
fi
if [ -z "$py" ]; then
  echo "py312 leg: FAILED: no Python 3.12+ interpreter runs here (tried ${FASTCI_PY312:-python3.12 on PATH and /root/.pyenv/versions/3.12.1/bin/python3}; set FASTCI_PY312)"
  exit 1
fi

venv=.venv312
stamp="$venv/.fastci-requirements"
want="$(cat third_party/requirements-py312.txt pyproject.toml | sha256sum | cut -c1-16) $("$py" -c 'import sys; print(sys.version.split()[0])')"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "py312 leg: setting up $venv with $py" >&2
  rm -rf "$venv"
  if ! { "$py" -m venv "$venv" \
      && "$venv/bin/pip" install -q --disable-pip-version-check -r third_party/requirements-py312.txt \
      && "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation -e .; }; then
    echo "py312 leg: FAILED (setting up $venv)"
    exit 1
  fi
  echo "$want" > "$stamp"
fi

mapfile -t modules < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' tests/py312_leg.txt | grep -v '^$')
start=$(date +%s)
out=build/ci/py312-pytest.log
mkdir -p build/ci
OMP_NUM_THREADS=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider "${modules[@]}" "$@" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error)' "$out" | tail -1 | sed 's/=//g; s/^ *//; s/ *$//')
echo "py312 leg: $("$venv/bin/python" -c 'import sys; print(sys.version.split()[0])'), ${#modules[@]} modules, $(( $(date +%s) - start ))s: ${summary:-no pytest summary} (exit $rc)"
exit "$rc"
