#!/usr/bin/env bash
# Regenerate tests/fixtures/fairseq/ with the reference implementation itself (fairseq's fconv):
# a scratch virtual environment OUTSIDE the project (never one of its dependencies), then
# scripts/fairseq_fixtures.py inside it. Needs ../shared/data/multi30k and a package registry.
#
#   bash scripts/fairseq_fixtures.sh [VENV_DIR]      # default /tmp/fairseq-ref-venv
#
# Versions (also written to tests/fixtures/fairseq/VERSIONS.json by the Python script):
# fairseq-fixed 0.12.3.1 (fairseq 0.12.2 with the fixes Python 3.11 needs), torch 2.13.0 (CPU),
# subword-nmt 0.3.8, sacremoses 0.2.0. fairseq declares torchaudio, which no CPU wheel of this
# torch has and which fconv never uses: fairseq is installed without dependencies and its
# requirements but torchaudio are installed by name.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-/tmp/fairseq-ref-venv}
PY=${PYTHON:-python3}
if [[ ! -x $VENV/bin/fairseq-train ]]; then
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "torch==2.13.0" "numpy<2.3" cython cffi "hydra-core==1.3.2" \
    "omegaconf==2.3.0" regex "sacrebleu>=2.4" tqdm bitarray scikit-learn packaging \
    "subword-nmt==0.3.8" "sacremoses==0.2.0" setuptools wheel
  # The C++ / Cython extensions build against the torch above (no isolated build env, which
  # would fetch another torch).
  "$VENV/bin/pip" install -q --no-deps --no-build-isolation "fairseq-fixed==0.12.3.1"
fi
"$VENV/bin/python" scripts/fairseq_fixtures.py --out tests/fixtures/fairseq \
  --data ../shared/data/multi30k
