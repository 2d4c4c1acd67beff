#!/usr/bin/env bash
# The reference implementation (fairseq's fconv) in a scratch virtual environment OUTSIDE the
# project (never one of its dependencies), for the scripts that compare with it
# (fairseq_fixtures.sh, fairseq_quality.py, fairseq_training_speed.py, ...). Needs a package
# registry; does nothing where the environment is there already.
#
#   bash scripts/fairseq_venv.sh [VENV_DIR]      # default /tmp/fairseq-ref-venv
#
# Versions: fairseq-fixed 0.12.3.1 (fairseq 0.12.2 with the fixes Python 3.11 needs), torch
# 2.13.0 (CPU), subword-nmt 0.3.8, sacremoses 0.2.0. fairseq declares torchaudio, which no CPU
# wheel of this torch has and which fconv never uses: fairseq is installed without dependencies
# and its requirements but torchaudio are installed by name.
set -euo pipefail
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
