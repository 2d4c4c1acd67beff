#!/usr/bin/env bash
# A lent GPU machine's 15 minutes, prepared: what `scripts/gpu_checks.sh` needs there (it has
# PyTorch, pyarrow and sentencepiece, but no Ray, no MLflow, no ../shared and no registry) put
# in one folder that travels with the checkout, and one command that runs the checks there and
# packs what they wrote into the few files the device tool brings back.
#
#   bash scripts/gpu_lease.sh prepare [DATA_DIR]   # here (default ../shared/data): .devcarry/
#   bash scripts/gpu_lease.sh run                  # there, carrying .devcarry: results in $OUT
#
# `prepare` fills .devcarry/ (ignored by git) with
#   data/     the newstest files the benchmarks read (wmt14-en-de 2013+2014, wmt14-en-fr
#             2012+2013),
#   loop/     a preprocessing output for the Ray-free training loop (Multi30k En-De through
#             `python -m preprocessing`: batches/train, batches/valid, spm/spm.model),
#   wheels/   the reference implementation's wheels (scripts/fairseq_wheels.sh), unless
#             NO_REF=1,
# keeps an inductor cache brought back by an earlier lease (.devcarry/inductor/*.part-*, see
# below), checks that what travels fits the device tool's 64 MiB, and prints the call.
#
# `run` runs `scripts/gpu_checks.sh` on all of it (DEADLINE, default 480 s, leaves a lease's
# start-up and the transfers room in its 15 minutes), then, whatever it returned, packs the
# results and the log into $OUT/gpu_checks.tgz and inductor's cache into $OUT/inductor.tgz.part-*
# (15 MiB parts: the tool brings back 8 files of up to 16 MiB, 64 MiB in all). Copy those parts
# into .devcarry/inductor/ here and the next lease's compile starts from that cache.
set -uo pipefail
cd "$(dirname "$0")/.."
kit=.devcarry

prepare() {
  local data=${1:-../shared/data} py=${PYTHON:-.venv/bin/python}
  [[ -x $py ]] || py=python3
  for f in wmt14-en-de/newstest2013 wmt14-en-de/newstest2014 wmt14-en-fr/newstest2012 \
           wmt14-en-fr/newstest2013; do
    ls "$data/$f".* >/dev/null 2>&1 || { echo "no $data/$f.*: give DATA_DIR (../shared/data)"; exit 2; }
  done
  [[ -d $data/multi30k ]] || { echo "no $data/multi30k: give DATA_DIR (../shared/data)"; exit 2; }
  git check-ignore -q "$kit/x" || { echo "$kit/ is not ignored by git (.gitignore)"; exit 2; }
  mkdir -p "$kit"
  # data/ and loop/ are made again each time, removed only where this script made them (its
  # mark beside them); wheels/ and inductor/ stay
  for d in data loop; do
    if [[ -e $kit/$d ]]; then
      grep -qx "$d" "$kit/.made_by_gpu_lease" 2>/dev/null \
        || { echo "$kit/$d was not made by this script: move it away first"; exit 2; }
      rm -rf "${kit:?}/$d"
    fi
  done
  printf 'data\nloop\n' > "$kit/.made_by_gpu_lease"
  { git log -1 --format='%H %s'; git status --porcelain --untracked-files=no | grep -q . \
      && echo "with uncommitted changes"; } > "$kit/commit.txt"
  mkdir -p "$kit/data/wmt14-en-de" "$kit/data/wmt14-en-fr"
  cp "$data"/wmt14-en-de/newstest201[34].* "$kit/data/wmt14-en-de/"
  cp "$data"/wmt14-en-fr/newstest201[23].* "$kit/data/wmt14-en-fr/"

  prep=$(mktemp -d)  # the preprocessing's own tree, removed once its batches are copied
  trap 'rm -rf "$prep" "$prep.log"' EXIT
  echo "== preprocessing Multi30k En-De for the training loop (about a minute)"
  "$py" -m preprocessing --task multi30k_en_de --source "$data/multi30k" --split valid=val \
    --split test=test_2016_flickr --out "$prep" > "$prep.log" 2>&1 \
    || { tail -20 "$prep.log"; echo "preprocessing failed"; exit 1; }
  local cut spm
  cut=$(dirname "$(find "$prep" -path '*/batches/*/train' -type d | head -1)")
  spm=$(find "$prep" -path '*/spm/spm.model' | head -1)
  [[ -d $cut/train && -d $cut/valid && -f $spm ]] || { echo "no batches in $prep"; exit 1; }
  mkdir -p "$kit/loop/batches" "$kit/loop/spm"
  cp -r "$cut/train" "$cut/valid" "$kit/loop/batches/"
  cp "$spm" "$kit/loop/spm/"

  if [[ ${NO_REF:-0} != 1 ]] && ! ls "$kit"/wheels/fairseq_fixed-*.whl >/dev/null 2>&1; then
    echo "== the reference's wheels"
    bash scripts/fairseq_wheels.sh "$kit/wheels" >/dev/null || { echo "no wheels (NO_REF=1 skips them)"; exit 1; }
  fi

  local tree carried total
  tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1)
  carried=$(du -sb "$kit" | cut -f1)
  total=$((tree + carried))
  printf '%s: %d MiB; the checkout: %d MiB; together %d MiB of the 64 MiB a call may take\n' \
    "$kit" $((carried >> 20)) $((tree >> 20)) $((total >> 20))
  (( total < 64 << 20 )) || { echo "too large: drop $kit/inductor or NO_REF=1"; exit 2; }
  cat <<EOF
The device call (checks under DEADLINE=480 s, then packing; give_back after it):
  run(command="bash scripts/gpu_lease.sh run", carry=["$kit"], timeout_s=560)
EOF
}

run() {
  local out=${OUT:-$PWD/gpu_lease_out} res cache
  mkdir -p "$out"
  res=$(mktemp -d)
  cache=$(mktemp -d)
  if ls "$kit"/inductor/inductor.tgz.part-* >/dev/null 2>&1; then
    cat "$kit"/inductor/inductor.tgz.part-* | tar -xz -C "$cache" \
      && echo "inductor cache from an earlier lease: $(du -sh "$cache" | cut -f1)"
  fi
  local loop=() ref=()
  [[ -d $kit/loop ]] && loop=(LOOP_DATA="$kit/loop")
  ls "$kit"/wheels/*.whl >/dev/null 2>&1 && ref=(REF_WHEELS="$kit/wheels")
  env "${loop[@]}" "${ref[@]}" INDUCTOR_CACHE="$cache" DEADLINE="${DEADLINE:-480}" \
    bash scripts/gpu_checks.sh "$res" "$kit/data"
  local rc=$?
  cp "$kit/commit.txt" "$res/" 2>/dev/null  # the commit `prepare` ran at (no git there)
  tar -czf "$out/gpu_checks.tgz" -C "$res" .
  if [[ -n $(ls -A "$cache") ]]; then
    tar -cz -C "$cache" . | split -b 15M -a 1 - "$out/inductor.tgz.part-"
    local parts
    parts=$(ls "$out"/inductor.tgz.part-* | wc -l)
    if (( parts > 4 )); then  # with gpu_checks.tgz: over the 64 MiB that comes back
      rm -f "$out"/inductor.tgz.part-*
      echo "inductor cache: $parts parts of 15 MiB, more than comes back; not kept"
    else
      echo "inductor cache: $parts part(s) in $out (copy them to $kit/inductor/ for the next lease)"
    fi
  fi
  rm -rf "$res" "$cache"
  ls -l "$out"
  return $rc
}

case ${1:-} in
  prepare) shift; prepare "$@" ;;
  run) run ;;
  *) echo "usage: gpu_lease.sh prepare [DATA_DIR] | run"; exit 2 ;;
esac
