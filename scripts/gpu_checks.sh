#!/usr/bin/env bash
# The GPU checks in one pass, for a machine with one CUDA GPU, PyTorch, numpy, pyarrow and
# sentencepiece installed (no Ray or MLflow needed; pytest for step 4, whose test files that
# import sacrebleu or rouge_score are left out where those are missing), in the order of issue 37's targets, each under its own time limit (a step that
# ignores its SIGTERM, e.g. one blocked in a CUDA call, is killed KILL_AFTER s later, default
# 10) and all under DEADLINE seconds (default 500: a step that would start with under MIN_STEP s
# left, default 20, is skipped; the step limits sum past any deadline a lease allows, so what
# comes last is what a slow lease loses). A step took 13-22 s on the H200 of 2026-11-27:
#   1. benchmarks.training, the paper's En-Fr model in bf16 with the paper's whole 24,000-token
#      update in one step (>= 45% of the bf16 peak), then at the paper's 3,000 tokens per GPU
#      (>= 25%), both with --profile (GPU-busy time from kernel events, kernels, launches and
#      host syncs per step, phases); the 3,000-token run keeps its timed batches for 2,
#   2. with REF_WHEELS set (a folder from scripts/fairseq_wheels.sh), the reference
#      implementation's step on those batches in bf16 autocast (>= 2x),
#   3. the 3,000-token step on static shapes replayed from CUDA graphs (--static-shapes 8
#      --cuda-graphs --profile), the way to 25% at that budget,
#   4. every test marked `gpu` that needs no Ray / MLflow (tests/test_train.py needs both),
#   5. with LOOP_DATA set (a preprocessing output: batches/train, batches/valid, spm model),
#      the whole training loop without Ray (`python -m convs2s train`, bf16): 200 updates with
#      validation and checkpoints, then the same command to 300, which must resume, and 200
#      updates on static shapes replayed from CUDA graphs (--set cuda_graphs=true),
#   6. the other variants: the 24,000-token step with the blocks' element-wise work compiled
#      (--fuse inductor), the convolutions by cuDNN (--conv native), both, and only the fused
#      loss's chunks compiled (--compile-loss); at 3,000 tokens all three with CUDA graphs,
#      static shapes without graphs (what the padding costs) and the convolutions by cuDNN;
#      a compiling variant is skipped with under MIN_COMPILE_STEP s left (default 60),
#   7. the float32 pair: the reference's float32 step and this project's on the same batches,
#   8. last (it did not finish in 293 s on the H200): the En-Fr bf16 step with the model
#      compiled through the loss (--compile inductor, one dynamic graph).
# The float32 En-De step and benchmarks.generation, measured on the H200 of 2026-11-27, are no
# longer run. TORCH_LOGS=recompiles,graph_breaks for every step: a compiled variant's log says
# whether a guard failed inside the timed steps (a recompile) or the graph broke.
#
#   bash scripts/gpu_checks.sh OUT_DIR [DATA_DIR]
#   (LOOP_DATA=, REF_WHEELS=, DEADLINE=, KILL_AFTER=, MIN_STEP=, MIN_COMPILE_STEP=,
#   INDUCTOR_CACHE=, LOG=, PACK= optional)
#
# DATA_DIR holds wmt14-en-de/newstest2013+2014 and wmt14-en-fr/newstest2012+2013 (default
# ../shared/data). The script goes on after a failure; the last line says which steps failed
# or were skipped. Results: OUT_DIR/*.json and the log, LOG (default OUT_DIR/gpu.log), written
# as it goes. With PACK=FILE, OUT_DIR is packed into FILE (a .tgz) after every step, written
# beside it and then renamed, so that a call killed from outside keeps every step that ended
# (scripts/gpu_lease.sh puts PACK and LOG in the folder the device tool brings back).
set -uo pipefail
out=${1:?usage: gpu_checks.sh OUT_DIR [DATA_DIR]}
data=${2:-../shared/data}
deadline=${DEADLINE:-500}
kill_after=${KILL_AFTER:-10}
min_step=${MIN_STEP:-20}
min_compile=${MIN_COMPILE_STEP:-60}
mkdir -p "$out"
exec > >(tee -a "${LOG:-$out/gpu.log}") 2>&1
tee_pid=$!  # waited for at the end, so that the log is whole when this script returns
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
failed=()
skipped=()
# What every step imports (numpy: the batches and checkpoints; neither torch nor pyarrow
# requires it; yaml: the settings `python -m convs2s train` reads): missing, one line now, not
# a traceback in each step
lacks='import importlib.util as u
print(" ".join(m for m in ("numpy", "torch", "pyarrow", "sentencepiece", "yaml")
               if not u.find_spec(m)))'
if ! missing=$($PY -c "$lacks") || [[ -n $missing ]]; then
  echo "gpu_checks: error: $PY lacks ${missing:-a working interpreter}: every step imports" \
       "numpy, torch, pyarrow, sentencepiece and yaml (PyYAML)"
  exit 2
fi
pack() {  # with PACK set: OUT_DIR as it is now, whole, in PACK (a cut pack stays PACK.partial)
  [[ -n ${PACK:-} ]] || return 0
  tar -czf "$PACK.partial" --warning=no-file-changed -C "$out" .
  (( $? <= 1 )) && mv -f "$PACK.partial" "$PACK"  # (1: a file grew as it was read, the log)
}
step() {  # step NAME SECONDS CMD...   (the limit is cut to what is left of the deadline;
  # `need=S step ...`: skipped with under S s left, not MIN_STEP: a compile that cannot end in
  # what is left only costs the steps after it)
  local name=$1 limit=$2
  shift 2
  local left=$((deadline - SECONDS))
  if (( left < ${need:-$min_step} )); then
    echo "==== $name: skipped, ${left} s left of ${deadline}"
    skipped+=("$name")
    return 1
  fi
  (( limit > left )) && limit=$left
  echo "==== $name ($(date -u +%T), limit ${limit} s)"
  local t0=$SECONDS
  timeout -k "$kill_after" "$limit" "$@"  # KILL kill_after s after a TERM the step ignored
  local rc=$?
  echo "==== $name: exit $rc in $((SECONDS - t0)) s"
  [[ $rc -eq 0 ]] || failed+=("$name")
  pack
  return $rc
}
train() {  # train NAME SECONDS PRESET DTYPE MAX_TOKENS [ARGS...]
  local name=$1 limit=$2 preset=$3 dtype=$4 tokens=$5
  shift 5
  step "$name" "$limit" $PY -m benchmarks.training --preset "$preset" --device cuda \
    --dtype "$dtype" --max-tokens "$tokens" --data "$data" --replace "$@"
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
torch.cuda.get_device_name(), torch.cuda.get_device_capability())"

fr=wmt14_en_fr
# every compile (the loss's chunks and the fused blocks in step 5, the whole model last) reads
# and fills the cache
[[ -n "${INDUCTOR_CACHE:-}" ]] && export TORCHINDUCTOR_CACHE_DIR="$INDUCTOR_CACHE"
work=$(mktemp -d)  # this script's own scratch (the timed batches, the reference's packages)
trap 'rm -rf "$work"' EXIT
export TORCH_LOGS=recompiles,graph_breaks
# 1. the headline figures: the paper's whole 24,000-token update in one step (issue 37: >= 45%
# of the bf16 peak), then each GPU's 3,000 tokens of an 8-GPU update (>= 25%). The 24,000-token
# batches are cut from 300,000 pairs drawn from the newstest sentences (R24): from the 6,003
# themselves, ten batches each held lengths far apart (filled 0.58-0.93), where the paper's
# corpus fills them as full as 3,000-token ones (0.96-0.99 here). Figures to compare: the JSONs'
# tgt_tokens_per_s_overall (all tokens over all seconds; the median of per-step rates ran 3-15%
# above it), fraction_of_peak (measured peak) beside fraction_of_datasheet_peak.
R24="--resample 300000"
train "en-fr bf16 24000" 100 $fr bf16 24000 --steps 20 --warmup 3 --profile 3 --profile-shapes \
  $R24 --out "$out/training_${fr}_cuda_bf16_24k.json"
train "en-fr bf16 3000" 100 $fr bf16 3000 --steps 30 --warmup 5 --profile 3 \
  --dump-batches "$work/batches_3000.json" --out "$out/training_${fr}_cuda_bf16.json"

# 2. the reference on the same batches as this project's step of the same dtype (>= 2x)
ref() {  # ref DTYPE STEPS WARMUP: the steps and warm-up of this project's run of that dtype
  step "reference en-fr $1 3000" 90 env PYTHONPATH="$work/ref" \
    $PY scripts/fairseq_training_speed.py --batches "$work/batches_3000.json" \
    --arch fconv_wmt_en_fr --vocab 40000 --dropout 0.1 --device cuda --dtype "$1" \
    --steps "$2" --warmup "$3" --out "$out/training_${fr}_cuda_${1}_reference.json"
}
reference=
if [[ -n "${REF_WHEELS:-}" && -f "$work/batches_3000.json" ]]; then
  step "reference install" 60 $PY -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --target "$work/ref" "$REF_WHEELS"/*.whl && reference=1
  [[ -n $reference ]] && ref bf16 30 5
fi

# 3. the same batches padded to static shapes and replayed from one CUDA graph per shape (what
# the launches cost): each timed shape is stepped once before the timing; profiled too
# (GPU-busy time, kernels and graph launches under replay)
train "en-fr bf16 3000 cuda graphs" 120 $fr bf16 3000 --steps 30 --warmup 5 --static-shapes 8 \
  --cuda-graphs --profile 3 --out "$out/training_${fr}_cuda_bf16_graphs.json"

# 4. the correctness checks, before the other figures: they decide whether the code is right
# on a GPU (the corpora the tests read: DATA_DIR, which holds the newstest files, not ../shared)
# (each test named as it ends, the slowest ten, and with pytest-timeout, in the device's image,
# a test hung past 90 s named and failed alone, not the whole step cut at its limit: the signal
# method, whose SIGALRM fails that test and goes on; the thread method ends the whole pytest
# process, every later test lost. A hang inside C code waits for the step's own limit. The files
# that compile with inductor (loss, fused, train_step), the slowest, come last.)
# (a test file that cannot be imported here, sacrebleu or rouge_score missing, is one
# collection error: the other files' tests still run, --continue-on-collection-errors)
per_test=()
$PY -c "import pytest_timeout" 2>/dev/null && per_test=(--timeout=90 --timeout-method=signal)
if ! $PY -c "import pytest" 2>/dev/null; then
  echo "==== gpu-tests: skipped, no pytest in $PY"
  skipped+=(gpu-tests)
else
step gpu-tests 180 env -u TORCH_LOGS CONVS2S_SHARED_DATA="$(cd "$data" && pwd)" \
  $PY -m pytest -v --durations=10 "${per_test[@]}" -m gpu \
  -p no:cacheprovider --continue-on-collection-errors \
  tests/test_model.py tests/test_checkpoint.py tests/test_optim.py \
  tests/test_search.py tests/test_translate.py tests/test_memory_fit.py tests/test_benchmarks.py \
  tests/test_loss.py tests/test_fused.py tests/test_train_step.py
fi

# 5. the whole loop without Ray (before the variants: the only GPU run of the Trainer, its
# resume, its CUDA graphs and its memory fit)
if [[ -n "${LOOP_DATA:-}" ]]; then
  run_root=$(mktemp -d)  # the runs' checkpoints: a folder of this script's own, removed after
  loop=(--train-data "$LOOP_DATA/batches/train" --valid-data "$LOOP_DATA/batches/valid"
        --spm-model "$(ls "$LOOP_DATA"/spm/spm.model "$LOOP_DATA"/spm.model 2>/dev/null | head -1)"
        --model small --storage-path "$run_root" --device cuda --precision bf16
        --set checkpoint_interval=100)
  step "loop 200 updates" 90 $PY -m convs2s train "${loop[@]}" --run-name gpu --max-updates 200
  step "loop resumed to 300" 90 $PY -m convs2s train "${loop[@]}" --run-name gpu \
    --max-updates 300
  cp "$run_root/gpu/metrics.jsonl" "$out/loop_metrics.jsonl" 2>/dev/null
  # the same loop on static shapes replayed from CUDA graphs (TrainConfig.cuda_graphs)
  step "loop 200 updates, cuda graphs" 120 $PY -m convs2s train "${loop[@]}" \
    --run-name gpu_graphs --max-updates 200 --set static_shapes=8 --set cuda_graphs=true
  cp "$run_root/gpu_graphs/metrics.jsonl" "$out/loop_graphs_metrics.jsonl" 2>/dev/null
  # the graphed loop said how many shapes it captured and how many steps ran eagerly
  step "loop cuda graphs logged" 10 $PY -c '
import json, sys
rows = [json.loads(l)["metrics"] for l in open(sys.argv[1]) if l.strip()]
graphs = [m for m in rows if "train/graph_shapes" in m]
assert graphs, "no train/graph_shapes in the graphed loop'"'"'s metrics"
last = graphs[-1]
print("graph shapes", last["train/graph_shapes"], "eager steps", last["train/graph_eager_steps"])
assert last["train/graph_shapes"] >= 1' "$out/loop_graphs_metrics.jsonl"
  rm -rf "$run_root"
fi

# 6. the variants (each that compiles needs a minute left, MIN_COMPILE_STEP). The blocks'
# element-wise work (GLU, residuals, scalings, softmax) and the
# loss's chunks compiled as a few shared functions (TrainConfig.fuse): a compile of under a
# minute; the convolutions by cuDNN instead of k-frame windows + GEMM (TrainConfig.conv =
# "native"): 12 GiB a 24,000-token step less memory traffic, counted on the CPU
# (docs/benchmarks.md)
need=$min_compile train "en-fr bf16 24000 fused" 120 $fr bf16 24000 --steps 20 --warmup 3 \
  --profile 3 $R24 \
  --fuse inductor --out "$out/training_${fr}_cuda_bf16_24k_fused.json"
train "en-fr bf16 24000 native conv" 100 $fr bf16 24000 --steps 20 --warmup 3 --profile 3 \
  $R24 --conv native --out "$out/training_${fr}_cuda_bf16_24k_native_conv.json"
need=$min_compile train "en-fr bf16 24000 native conv fused" 100 $fr bf16 24000 --steps 20 \
  --warmup 3 $R24 \
  --profile 3 --conv native --fuse inductor \
  --out "$out/training_${fr}_cuda_bf16_24k_native_conv_fused.json"
# all of it at 3,000 tokens: fewer, fuller kernels, launched from CUDA graphs
need=$min_compile train "en-fr bf16 3000 cuda graphs native conv fused" 120 $fr bf16 3000 \
  --steps 30 --warmup 5 \
  --static-shapes 8 --cuda-graphs --conv native --fuse inductor \
  --out "$out/training_${fr}_cuda_bf16_graphs_native_conv_fused.json"
need=$min_compile train "en-fr bf16 24000 loss compiled" 100 $fr bf16 24000 --steps 20 \
  --warmup 3 --profile 3 $R24 \
  --compile-loss inductor --out "$out/training_${fr}_cuda_bf16_24k_loss_compiled.json"
# static shapes without graphs: what the padding alone costs
train "en-fr bf16 3000 static shapes" 80 $fr bf16 3000 --steps 30 --warmup 5 --static-shapes 8 \
  --out "$out/training_${fr}_cuda_bf16_static.json"
train "en-fr bf16 3000 native conv" 80 $fr bf16 3000 --steps 30 --warmup 5 --conv native \
  --out "$out/training_${fr}_cuda_bf16_native_conv.json"

# 7. the float32 pair, on the same batches
[[ -n $reference ]] && ref fp32 20 3
train "en-fr fp32 3000" 80 $fr fp32 3000 --steps 20 --warmup 3 \
  --out "$out/training_${fr}_cuda_fp32.json"

# 8. the whole model compiled through the loss, with what is left. warmup_step_s in the JSON
# holds the compile (first step) and any recompile, compile_phases_s its phases. A compile still
# running 15 s before the step's limit prints its phases and where it is (--compile-deadline).
# INDUCTOR_CACHE=DIR (set for every step, above) keeps inductor's caches there: bring DIR back
# and carry it to the next lease (scripts/gpu_lease.sh packs it), whose compile of the same code
# then skips what is cached. Triton kernels are kept as each is built, so even a compile that
# was cut off leaves them; the FX-graph and AOT caches are written only by a compile that
# finished.
limit=$((deadline - SECONDS)); (( limit > 480 )) && limit=480
need=$min_compile train "en-fr bf16 3000 compiled" 480 $fr bf16 3000 --steps 20 --warmup 4 \
  --compile inductor \
  --compile-deadline $((limit > 35 ? limit - 15 : 20)) \
  --out "$out/training_${fr}_cuda_bf16_compiled.json"
unset TORCH_LOGS

echo "failed steps: ${failed[*]:-none}; skipped: ${skipped[*]:-none}"
rc=$(( ${#failed[@]} > 0 ))
exec >&- 2>&-  # tee sees the end of its input, writes the rest of the log and exits
# (at most 10 s: a process left behind by a step cut at its limit may still hold the pipe)
for _ in {1..100}; do kill -0 "$tee_pid" 2>/dev/null || break; sleep 0.1; done
pack  # the last pack: the log too, where it is in OUT_DIR
exit "$rc"
