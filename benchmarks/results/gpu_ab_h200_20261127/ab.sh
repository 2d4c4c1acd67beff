# A/B on one H200 (2026-11-27): base = commit 5c6ffc5 (git archive into .devcarry/base), new = the
# attention operands cast once (EncoderOut.for_attention), alternated, En-Fr bf16.
set -uo pipefail
export PYTHONUNBUFFERED=1
root=$PWD
run() {  # run LABEL DIR TOKENS
  (cd "$2" && timeout 40 python3 -m benchmarks.training --preset wmt14_en_fr --device cuda \
    --dtype bf16 --max-tokens "$3" --steps 15 --warmup 3 --profile 2 --data "$root/.devcarry/data" \
    --out "$OUT/ab_$1_$3.json" --replace 2>&1 | grep -E "cuda bf16|GPU busy") | sed "s/^/$1 $3: /"
}
run base .devcarry/base 3000; run new . 3000; run base .devcarry/base 3000; run new . 3000
run base .devcarry/base 24000; run new . 24000
