#!/usr/bin/env bash
# A lent GPU machine's 15 minutes, prepared: what `scripts/gpu_checks.sh` needs there (it has
# PyTorch, pyarrow and sentencepiece, but no Ray, no MLflow, no ../shared and no registry) put
# in one folder that travels with the checkout, and one command that runs the checks there and
# packs what they wrote into the few files the device tool brings back.
#
#   bash scripts/gpu_lease.sh prepare [DATA_DIR]   # here (default ../shared/data): .devcarry/
#   bash scripts/gpu_lease.sh run                  # there, carrying .devcarry: results in $OUT
#   bash scripts/gpu_lease.sh keep-cache DIR       # here: DIR's inductor.tgz.part-* (brought
#                                                  # back by `run`) for the next lease
#
# `prepare` fills .devcarry/ (ignored by git) with
#   data/     the newstest files the benchmarks read (wmt14-en-de 2013+2014, wmt14-en-fr
#             2012+2013),
#   loop/     a preprocessing output for the Ray-free training loop (Multi30k En-De through
#             `python -m preprocessing`: batches/train, batches/valid, spm/spm.model),
#   wheels/   the reference implementation's wheels (scripts/fairseq_wheels.sh; NO_REF=1
#             leaves them out, and removes those an earlier `prepare` fetched),
#   commit.txt  the commit (and whether the tree had changes) the results will belong to,
# keeps inductor/ (`keep-cache`), checks that what travels fits the device tool's 64 MiB
# (removing inductor/ first where it does not: the cache only saves compile time), and
# prints the call. It removes only folders it made itself (listed in .devcarry/.made_by_gpu_lease).
#
# `run` runs `scripts/gpu_checks.sh` on all of it (DEADLINE, default 480 s, leaves a lease's
# start-up and the transfers room in its 15 minutes) with its log written straight to
# $OUT/gpu.log and its results packed into $OUT/gpu_checks.tgz after every step (with
# commit.txt), so that a call the device tool kills at its limit still brings back every step
# that ended; then, whatever it returned, packs inductor's cache into $OUT/inductor.tgz.part-*
# (15 MiB parts, at most 3: the tool brings back 8 files, 16 MiB each and 64 MiB in all; at
# most 6 come: these, the log, the pack and a pack cut off as it was written,
# gpu_checks.tgz.partial). OUT must be an empty folder (the device tool gives one). Relative
# paths are taken from where the script is called.
set -uo pipefail
here=$PWD
abspath() { [[ $1 = /* ]] && echo "$1" || echo "$here/$1"; }
cd "$(dirname "$0")/.."
kit=.devcarry
mark=$kit/.made_by_gpu_lease
made() { grep -qx "$1" "$mark" 2>/dev/null; }
remove_made() {  # remove_made NAME: .devcarry/NAME if this script made it; else refuse
  [[ -e $kit/$1 ]] || return 0
  made "$1" || { echo "$kit/$1 was not made by this script: move it away first"; exit 2; }
  rm -rf "${kit:?}/$1"
  grep -vx "$1" "$mark" > "$mark.new"; mv "$mark.new" "$mark"
}
note_made() { made "$1" || echo "$1" >> "$mark"; }

prepare() {
  local data py=${PYTHON:-.venv/bin/python}
  data=$(abspath "${1:-../shared/data}")
  [[ -x $py ]] || py=python3
  for f in wmt14-en-de/newstest2013 wmt14-en-de/newstest2014 wmt14-en-fr/newstest2012 \
           wmt14-en-fr/newstest2013; do
    ls "$data/$f".* >/dev/null 2>&1 || { echo "no $data/$f.*: give DATA_DIR (../shared/data)"; exit 2; }
  done
  [[ -d $data/multi30k ]] || { echo "no $data/multi30k: give DATA_DIR (../shared/data)"; exit 2; }
  git check-ignore -q "$kit/x" || { echo "$kit/ is not ignored by git (.gitignore)"; exit 2; }
  mkdir -p "$kit"
  touch "$mark"
  remove_made data  # data/ and loop/ are made again each time
  remove_made loop
  { git log -1 --format='%H %s'
    [[ -n $(git status --porcelain) ]] && echo "with changes not committed (they travel too)"
  } > "$kit/commit.txt"
  note_made data
  mkdir -p "$kit/data/wmt14-en-de" "$kit/data/wmt14-en-fr"
  cp "$data"/wmt14-en-de/newstest201[34].* "$kit/data/wmt14-en-de/"
  cp "$data"/wmt14-en-fr/newstest201[23].* "$kit/data/wmt14-en-fr/"

  prep=$(mktemp -d)  # the preprocessing's own tree, removed once its batches are copied
  trap 'rm -rf "$prep" "$prep.log"' EXIT
  echo "== preprocessing Multi30k En-De for the training loop (about 15 s)"
  "$py" -m preprocessing --task multi30k_en_de --source "$data/multi30k" --split valid=val \
    --split test=test_2016_flickr --out "$prep" > "$prep.log" 2>&1 \
    || { tail -20 "$prep.log"; echo "preprocessing failed"; exit 1; }
  local cut spm
  cut=$(dirname "$(find "$prep" -path '*/batches/*/train' -type d | head -1)")
  spm=$(find "$prep" -path '*/spm/spm.model' | head -1)
  [[ -d $cut/train && -d $cut/valid && -f $spm ]] || { echo "no batches in $prep"; exit 1; }
  note_made loop
  mkdir -p "$kit/loop/batches" "$kit/loop/spm"
  cp -r "$cut/train" "$cut/valid" "$kit/loop/batches/"
  cp "$spm" "$kit/loop/spm/"

  if [[ ${NO_REF:-0} == 1 ]]; then
    remove_made wheels
  elif ! ls "$kit"/wheels/fairseq_fixed-*.whl >/dev/null 2>&1; then
    echo "== the reference's wheels"
    remove_made wheels
    note_made wheels
    bash scripts/fairseq_wheels.sh "$kit/wheels" >/dev/null \
      || { echo "no wheels (NO_REF=1 goes without them)"; exit 1; }
  fi

  local tree carried total
  tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1)
  carried=$(du -sb "$kit" | cut -f1)
  total=$((tree + carried))
  if (( total >= 64 << 20 )) && [[ -d $kit/inductor ]]; then
    # the compile cache only saves the next compile time: it goes first, before what the checks
    # need (the data, the loop's batches) or the reference's row (the wheels)
    echo "$kit/inductor, the kept compile cache ($(du -sh "$kit/inductor" | cut -f1)), does not" \
      "fit beside the rest in 64 MiB: removed (the next lease compiles without it)"
    remove_made inductor
    carried=$(du -sb "$kit" | cut -f1)
    total=$((tree + carried))
  fi
  printf '%s: %d MiB (%s); the checkout: %d MiB; together %d MiB of the 64 MiB a call carries\n' \
    "$kit" $((carried >> 20)) "$(cd "$kit" && du -sh -- */ 2>/dev/null | tr '\t\n' ' ')" \
    $((tree >> 20)) $((total >> 20))
  (( total < 64 << 20 )) || {
    echo "too large: NO_REF=1 leaves the reference's wheels out"
    exit 2; }
  cat <<EOF
The device call, sized from the device tool's status first (budget_left_s, B): a start takes a
minute or two, the packing and the transfers another, so DEADLINE = min(480, B - 330) seconds of
checks and timeout_s = DEADLINE + 80 (with the full 900 s: 480 and 560). give_back after it:
  run(command="DEADLINE=480 bash scripts/gpu_lease.sh run", carry=["$kit"], timeout_s=560)
EOF
}

run() {
  local out res cache
  [[ -n ${OUT:-} ]] || { echo "set OUT, an empty folder for what comes back (the device tool does)"; exit 2; }
  out=$(abspath "$OUT")
  mkdir -p "$out" || exit 2
  [[ -z $(ls -A "$out") ]] || { echo "OUT ($out) is not empty: give an empty folder"; exit 2; }
  res=$(mktemp -d)
  cache=$(mktemp -d)
  if ls "$kit"/inductor/inductor.tgz.part-* >/dev/null 2>&1; then
    cat "$kit"/inductor/inductor.tgz.part-* | tar -xz -C "$cache" \
      && echo "inductor cache from an earlier lease: $(du -sh "$cache" | cut -f1)"
  fi
  local loop=() ref=()
  [[ -d $kit/loop ]] && loop=(LOOP_DATA="$kit/loop")
  ls "$kit"/wheels/*.whl >/dev/null 2>&1 && ref=(REF_WHEELS="$kit/wheels")
  cp "$kit/commit.txt" "$res/" 2>/dev/null  # the commit `prepare` ran at (no git there)
  # (every result's machine.git names it too: benchmarks/machine.py)
  export CONVS2S_COMMIT="$(tr '\n' ' ' < "$kit/commit.txt" 2>/dev/null)"
  env "${loop[@]}" "${ref[@]}" INDUCTOR_CACHE="$cache" DEADLINE="${DEADLINE:-480}" \
    LOG="$out/gpu.log" PACK="$out/gpu_checks.tgz" bash scripts/gpu_checks.sh "$res" "$kit/data"
  local rc=$?
  # (gpu_checks.sh packed after its last step; again, in case it ended before any step did)
  tar -czf "$out/gpu_checks.tgz.partial" -C "$res" . \
    && mv -f "$out/gpu_checks.tgz.partial" "$out/gpu_checks.tgz"
  if [[ -n $(ls -A "$cache") ]]; then
    tar -cz -C "$cache" . | split -b 15M -a 1 - "$out/inductor.tgz.part-"
    local parts
    parts=$(ls "$out"/inductor.tgz.part-* | wc -l)
    if (( parts > 3 )); then  # more than comes back beside the rest, or travels next time
      rm -f "$out"/inductor.tgz.part-*  # (written by this run, just above)
      echo "inductor cache: $parts parts of 15 MiB, more than can travel; not kept"
    else
      echo "inductor cache: $parts part(s) in $out (keep-cache puts them in $kit/inductor)"
    fi
  fi
  rm -rf "$res" "$cache"
  ls -l "$out"
  return $rc
}

keep_cache() {  # the parts a lease brought back, checked whole, in place of the kept ones
  local from
  [[ -n ${1:-} ]] || { echo "usage: gpu_lease.sh keep-cache DIR (with inductor.tgz.part-*)"; exit 2; }
  from=$(abspath "$1")
  ls "$from"/inductor.tgz.part-* >/dev/null 2>&1 || { echo "no inductor.tgz.part-* in $from"; exit 2; }
  cat "$from"/inductor.tgz.part-* | tar -tz >/dev/null \
    || { echo "the parts in $from do not join into a whole archive"; exit 2; }
  mkdir -p "$kit"
  touch "$mark"
  remove_made inductor
  note_made inductor
  mkdir -p "$kit/inductor"
  for f in "$from"/inductor.tgz.part-*; do
    install -m 644 "$f" "$kit/inductor/"  # (writable: what the tool brings back is read-only)
  done
  echo "kept: $(ls "$kit/inductor" | wc -l) part(s), $(du -sh "$kit/inductor" | cut -f1)"
}

case ${1:-} in
  prepare) shift; prepare "$@" ;;
  run) run ;;
  keep-cache) shift; keep_cache "$@" ;;
  *) echo "usage: gpu_lease.sh prepare [DATA_DIR] | run | keep-cache DIR"; exit 2 ;;
esac
