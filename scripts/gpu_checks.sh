#!/usr/bin/env bash
# The GPU checks in one pass, for a machine with one CUDA GPU and PyTorch installed:
#   1. every test marked `gpu` that needs no Ray / MLflow (the Ray Train one, tests/test_train.py,
#      needs both; run `make test` on a GPU node with the project installed for it),
#   2. benchmarks.training on the paper's En-De and En-Fr models, float32 and bf16,
#   3. benchmarks.generation on the paper's En-Fr model (random weights, Table 3's 6,003
#      sentences), float32 and bf16, beam 1 and 5,
#   4. with LOOP_DATA set (a preprocessing output: batches/train, batches/valid, spm model),
#      the whole training loop without Ray (`python -m convs2s train`, bf16): 200 updates with
#      validation and checkpoints, then the same command to 300, which must resume,
#   5. last (compiling takes minutes): the paper's En-Fr step in bf16 with the model compiled
#      through the loss (--compile inductor, one dynamic graph), beside step 2's eager figure.
#
#   bash scripts/gpu_checks.sh OUT_DIR [DATA_DIR]
#
# DATA_DIR holds wmt14-en-de/newstest2013+2014 and wmt14-en-fr/newstest2012+2013 (default
# ../shared/data). Each step runs under its own time limit and the script goes on after a
# failure; the last line says which steps failed. Results: OUT_DIR/*.json and OUT_DIR/gpu.log.
set -uo pipefail
out=${1:?usage: gpu_checks.sh OUT_DIR [DATA_DIR]}
data=${2:-../shared/data}
mkdir -p "$out"
exec > >(tee -a "$out/gpu.log") 2>&1
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
failed=()
step() {  # step NAME SECONDS CMD...
  local name=$1 limit=$2
  shift 2
  echo "==== $name ($(date -u +%T))"
  local t0=$SECONDS
  timeout "$limit" "$@"
  local rc=$?
  echo "==== $name: exit $rc in $((SECONDS - t0)) s"
  [[ $rc -eq 0 ]] || failed+=("$name")
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
torch.cuda.get_device_name(), torch.cuda.get_device_capability())"

step gpu-tests 300 $PY -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_model.py tests/test_loss.py tests/test_checkpoint.py tests/test_train_step.py \
  tests/test_translate.py

for preset in wmt14_en_de wmt14_en_fr; do
  tokens=$([[ $preset == wmt14_en_fr ]] && echo 3000 || echo 4000)  # the paper's per-GPU budget
  for dtype in fp32 bf16; do
    step "training $preset $dtype" 150 $PY -m benchmarks.training --preset "$preset" \
      --device cuda --dtype "$dtype" --max-tokens "$tokens" --steps 40 --warmup 5 \
      --data "$data" --out "$out/training_${preset}_cuda_${dtype}.json" --replace
  done
done

step "generation wmt14_en_fr" 300 $PY -m benchmarks.generation --preset wmt14_en_fr \
  --device cuda --dtype fp32 bf16 --beams 1 5 --data "$data" \
  --out "$out/generation_wmt14_en_fr_cuda.json" --replace

if [[ -n "${LOOP_DATA:-}" ]]; then
  loop=(--train-data "$LOOP_DATA/batches/train" --valid-data "$LOOP_DATA/batches/valid"
        --spm-model "$(ls "$LOOP_DATA"/spm/spm.model "$LOOP_DATA"/spm.model 2>/dev/null | head -1)"
        --model small --storage-path "$out/loop" --run-name gpu --device cuda --precision bf16
        --set checkpoint_interval=100)
  step "loop 200 updates" 150 $PY -m convs2s train "${loop[@]}" --max-updates 200
  step "loop resumed to 300" 150 $PY -m convs2s train "${loop[@]}" --max-updates 300
  cp "$out/loop/gpu/metrics.jsonl" "$out/loop_metrics.jsonl" 2>/dev/null
fi

step "training wmt14_en_fr bf16 compiled" 300 $PY -m benchmarks.training --preset wmt14_en_fr \
  --device cuda --dtype bf16 --max-tokens 3000 --steps 40 --warmup 8 --compile inductor \
  --data "$data" --out "$out/training_wmt14_en_fr_cuda_bf16_compiled.json" --replace

echo "failed steps: ${failed[*]:-none}"
[[ ${#failed[@]} -eq 0 ]]
