#!/usr/bin/env bash
# A/B of the training step on one GPU: a base checkout against this one, alternated in one call
# (lent machines differ from each other by up to 1.3x on the host side: compare only inside one
# run). Prepare the base here, where git is, then carry it:
#
#   git archive BASE_COMMIT | (mkdir -p .devcarry/base && tar -x -C .devcarry/base)
#   bash scripts/gpu_ab.sh .devcarry/base OUT_DIR DATA_DIR [TOKENS ...]   (default 3000 24000)
#
# Each TOKENS budget runs base, new, base, new (the paper's En-Fr model, bf16, --profile 2:
# kernels, launches and host syncs a step, GPU-busy time); the JSON of each lands in OUT_DIR
# as ab_<base|new>_<tokens>_<round>.json, packed into OUT_DIR/ab_json.tgz at the end (the
# device tool brings back 8 files at most), and the console lines in OUT_DIR/ab.log.
# PRESET, DEVICE and DTYPE override the model, cuda and bf16 (a CPU dry run: DEVICE=cpu
# PRESET=tiny DTYPE=fp32). NEW_ARGS adds benchmark flags to the "new" runs only: with BASE_DIR
# `.` it alternates two settings of one checkout, e.g. the fused loss's chunks compiled:
#
#   NEW_ARGS="--compile-loss inductor" bash scripts/gpu_ab.sh . OUT_DIR DATA_DIR 24000
set -uo pipefail
base=${1:?usage: gpu_ab.sh BASE_DIR OUT_DIR DATA_DIR [TOKENS ...]}
out=${2:?OUT_DIR}
data=$(cd "${3:?DATA_DIR}" && pwd)
shift 3
if (( $# )); then budgets=("$@"); else budgets=(3000 24000); fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
json_dir=$(mktemp -d)  # this script's own: the JSONs are packed from here, then it goes
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
read -r -a new_args <<< "${NEW_ARGS:-}"
run() {  # run LABEL DIR TOKENS ROUND [ARGS...]
  local label=$1 dir=$2 tokens=$3 round=$4
  shift 4
  (cd "$dir" && timeout 90 $PY -m benchmarks.training --preset "${PRESET:-wmt14_en_fr}" \
    --device "${DEVICE:-cuda}" --dtype "${DTYPE:-bf16}" --max-tokens "$tokens" --steps 15 \
    --warmup 3 --profile 2 --data "$data" "$@" \
    --out "$json_dir/ab_${label}_${tokens}_${round}.json" --replace 2>&1 \
    | grep -E " (cuda|cpu) |GPU busy") \
    | sed "s/^/$label $tokens: /" | tee -a "$out/ab.log"
}
for t in "${budgets[@]}"; do
  for round in 1 2; do
    run base "$base" "$t" "$round"
    run new . "$t" "$round" "${new_args[@]}"
  done
done
tar -czf "$out/ab_json.tgz" -C "$json_dir" . && rm -rf "$json_dir"
