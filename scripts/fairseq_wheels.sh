#!/usr/bin/env bash
# Wheels of the reference implementation (fairseq's fconv) for a GPU machine that has Python
# 3.12, PyTorch, numpy, regex, sacrebleu, scikit-learn and torchaudio but no package registry
# (the lent GPU machines: .library/device/KINDS.md lists their packages): fairseq-fixed 0.12.3.1
# (fairseq 0.12.2 with the fixes Python >= 3.11 needs; 0.12.2 itself does not import there) and
# the four packages it needs that such a machine lacks. Never a dependency of the project.
#
#   bash scripts/fairseq_wheels.sh DIR        # then, on the machine, with DIR carried along:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/ref DIR/*.whl
#   PYTHONPATH=/tmp/ref python3 scripts/fairseq_training_speed.py --device cuda ...
#
# scripts/gpu_checks.sh does the last two steps itself when REF_WHEELS=DIR is set. Checked on
# CPU with Python 3.12.1, torch 2.11.0 and numpy 2.5.5 (2026-11-27).
set -euo pipefail
dir=${1:?usage: fairseq_wheels.sh DIR}
mkdir -p "$dir"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d "$dir" \
  "fairseq-fixed==0.12.3.1" "hydra-core==1.3.2" "omegaconf==2.3.0" "bitarray==3.12.3"
# omegaconf 2.3 needs antlr4-python3-runtime 4.9.*, published as source only: pure Python, so
# a wheel built here installs anywhere.
python3 -m pip wheel -q --no-deps -w "$dir" "antlr4-python3-runtime==4.9.3"
ls -l "$dir"
