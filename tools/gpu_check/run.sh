#!/usr/bin/env bash
# make gpu-check on the GPU host: install the carried wheels (make gpu-wheels put them in .whl/
# here), then run the check with the host's python3 (the one that holds CUDA torch). No network,
# no Bazel, no virtualenv. Arguments go to tools/gpu_check/check.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${GPU_CHECK_PYTHON:-python3}"
if compgen -G ".whl/*.whl" > /dev/null; then
  SITE="${GPU_CHECK_SITE:-/tmp/gpu-check-site}"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" .whl/*.whl
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$PY" tools/gpu_check/check.py "$@"
