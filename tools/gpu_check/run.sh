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
# The recorder's audit hook in C (analyzer/fastci/evidence/record/native_audit.c), built in place
# where this host can (a C compiler and Python's headers); else the recorder's Python hook
# runs, and the overhead stage's results say which.
inc="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
suffix="$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
if command -v cc > /dev/null && [ -f "$inc/Python.h" ]; then
  cc -shared -fPIC -O2 -I"$inc" analyzer/fastci/evidence/record/native_audit.c \
      -o "analyzer/fastci/evidence/record/native_audit$suffix" \
    || echo "gpu-check: the C audit hook did not build; recording uses the Python hook" >&2
else
  echo "gpu-check: no C compiler or Python headers here; recording uses the Python audit hook" >&2
fi
exec "$PY" tools/gpu_check/check.py "$@"
