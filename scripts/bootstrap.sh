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
# A .venv whose python cannot run pip (a venv made without ensurepip, Debian's python3-venv
# missing; an interrupted creation; an interpreter that is gone) is made again, not reused:
# it would fail every later run with "No module named pip".
if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  if [[ -e .venv || -L .venv ]]; then
    echo "bootstrap: .venv cannot run pip; making it again" >&2
  fi
  "$PY" -m venv --clear .venv || {
    echo "bootstrap: error: '$PY -m venv' failed; on Debian / Ubuntu install python3-venv" \
         "(apt-get install python3-venv), or set PYTHON to another python3" >&2
    exit 1
  }
fi
stamp=.venv/.installed-$(cat pyproject.toml | sha1sum | cut -c1-12)
if [[ ! -f $stamp ]]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[test]"
  rm -f .venv/.installed-* && touch "$stamp"
fi
