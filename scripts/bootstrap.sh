#!/usr/bin/env bash
# Create (or reuse) .venv with the project and its test dependencies installed.
# torch 2.13.0 is installed first, on its own. The pin chooses the version, not the build: pip
# takes whichever 2.13.0 its configured indexes and find-links offer (PyPI's Linux x86_64 wheel
# is the CUDA build, with the nvidia-* packages). For the CPU build, put it in .venv before
# running this (a 2.13.0+cpu already there satisfies the pin and is kept):
#   python3 -m venv .venv
#   .venv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
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
