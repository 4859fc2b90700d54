#!/usr/bin/env bash
# Idempotent set-up: Bazel 4.2.3 and Chromium from Debian, and a .venv with pinned deps.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v bazel >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  echo "setup: installing bazel-bootstrap (Bazel 4.2.3) from Debian" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq bazel-bootstrap bazel-rules-java >/dev/null
fi

# fastci eval's report test and benchmark open report.html in headless Chromium; the
# plots' text is drawn in DejaVu Sans, as matplotlib laid it out.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  echo "setup: installing chromium (headless browser for the eval report test) from Debian" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium fonts-dejavu-core >/dev/null
fi

if [ ! -x .venv/bin/python3 ]; then
  if ! python3 -c 'import ensurepip' 2>/dev/null; then
    # Debian ships venv's pip bootstrap separately.
    if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
  fi
  python3 -m venv .venv
fi
.venv/bin/pip install -q --disable-pip-version-check -r third_party/requirements.txt
.venv/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
.venv/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e examples/microllm
