#!/usr/bin/env bash
# Create (or reuse) .venv with the project and its test dependencies installed.
# Pins torch to 2.13.0 so a CPU machine never pulls the multi-GB CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml | sha1sum | cut -c1-12)
if [[ ! -f $stamp ]]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[test]"
  rm -f .venv/.installed-* && touch "$stamp"
fi
