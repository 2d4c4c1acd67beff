#!/usr/bin/env bash
# `ray job stop` on the README's local head (section "Running on a Ray cluster"): the En-Fr smoke
# workflow submitted as a job, stopped SECONDS_IN (default 15) seconds into training, once with
# Ray's default wait before SIGKILL (RAY_JOB_STOP_WAIT_TIME_S, 3 s) and once with 60 s in the job's
# runtime environment. Prints, per case, how long `ray job stop` took, the end of the job's log
# (it should end with the `interrupted:` line) and the status of every MLflow run of the job
# (the workflow's and its training run: KILLED). Writes only under OUT (default a new temporary
# folder); it starts a Ray head and stops it (`ray stop` stops every Ray process on this
# machine: run it where no other Ray runs).
#
#   bash scripts/ray_job_stop_check.sh            # about 2 minutes on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d /tmp/ray-job-stop.XXXXXX)}
mkdir -p "$OUT" && OUT=$(realpath "$OUT")  # absolute: the job runs in Ray's copy of the checkout
SECONDS_IN=${SECONDS_IN:-15}
source .venv/bin/activate
ray start --head --num-cpus 2 --dashboard-port 8265 --disable-usage-stats > "$OUT/head.log" 2>&1
trap 'ray stop > /dev/null 2>&1 || true' EXIT
export RAY_AUTH_MODE=token RAY_ADDRESS=http://127.0.0.1:8265
for case in default wait60; do
  env='{}'
  [[ $case == wait60 ]] && env='{"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": "60"}}'
  ray job submit --no-wait --submission-id "$case" --working-dir . --runtime-env-json "$env" \
    -- python workflows/wmt14_en_fr.py --preset smoke --storage-path "$OUT/runs" \
    --tracking-uri "sqlite:///$OUT/mlflow.db" --run-name "$case" > "$OUT/submit_$case.log" 2>&1 \
    || { echo "error: ray job submit failed: $OUT/submit_$case.log" >&2; exit 1; }
  started=""
  for _ in $(seq 1 300); do  # until training starts (the job's log says so)
    logs=$(ray job logs "$case" 2> /dev/null || true)
    if [[ $logs == *"== train"* ]]; then started=1; break; fi
    sleep 1
  done
  [[ -n $started ]] || { echo "error: job $case did not start training in 300 s" >&2; exit 1; }
  sleep "$SECONDS_IN"
  t0=$(date +%s.%N)
  ray job stop "$case" > "$OUT/stop_$case.log" 2>&1
  t1=$(date +%s.%N)
  # (to about a second: the command's own start and its polling included)
  echo "== $case: ray job stop returned after $(python -c "print(round($t1 - $t0, 1))") s"
  ray job logs "$case" 2> /dev/null | tail -3
done
python - "$OUT/mlflow.db" <<'EOF'
import sys

from mlflow.tracking import MlflowClient

client = MlflowClient(f"sqlite:///{sys.argv[1]}")
exp = client.get_experiment_by_name("wmt14_en_fr")
for run in sorted(client.search_runs([exp.experiment_id]), key=lambda r: r.info.start_time):
    print(f"MLflow run {run.data.tags.get('convs2s.run_key', run.info.run_name)}: "
          f"{run.info.status}")
EOF
echo "outputs: $OUT"
