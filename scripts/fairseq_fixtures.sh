#!/usr/bin/env bash
# Regenerate tests/fixtures/fairseq/ with the reference implementation itself (fairseq's fconv):
# a scratch virtual environment OUTSIDE the project (never one of its dependencies), then
# scripts/fairseq_fixtures.py inside it. Needs ../shared/data/multi30k and a package registry.
#
#   bash scripts/fairseq_fixtures.sh [VENV_DIR]      # default /tmp/fairseq-ref-venv
#
# Versions (also written to tests/fixtures/fairseq/VERSIONS.json by the Python script): those
# of scripts/fairseq_venv.sh, which makes the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-/tmp/fairseq-ref-venv}
bash scripts/fairseq_venv.sh "$VENV"
"$VENV/bin/python" scripts/fairseq_fixtures.py --out tests/fixtures/fairseq \
  --data ../shared/data/multi30k
