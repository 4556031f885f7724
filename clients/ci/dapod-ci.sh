#!/bin/sh
# Fine-tune from a CI pipeline with dapoctl: upload the dataset, submit the job and wait for it
# (one progress line per step in the CI log), then download the final checkpoint as an
# artefact. The exit code is dapoctl's, so the CI step fails when the job fails (1), is
# cancelled (3) or runs past the time limit (4); see clients/dapoctl/README.md.
#
# Usage: dapod-ci.sh DATASET.jsonl JOB_TEMPLATE.json OUT_DIR
#   JOB_TEMPLATE.json is a job body whose "training_file" is the string "@TRAINING_FILE@".
# Environment: DAPOD_URL (default http://127.0.0.1:8080), DAPOD_API_KEY (optional),
#   DAPOCTL (default: dapoctl on PATH), DAPOD_CI_TIMEOUT (seconds, default 3600),
#   DAPOD_CI_KEY (Idempotency-Key, default: a fresh one; set it to the CI run's id so that a
#   retried step attaches to the same job instead of starting a second one).
set -eu
[ $# -eq 3 ] || { echo "usage: $0 DATASET.jsonl JOB_TEMPLATE.json OUT_DIR" >&2; exit 2; }
dataset=$1
template=$2
out=$3
ctl=${DAPOCTL:-dapoctl}
timeout=${DAPOD_CI_TIMEOUT:-3600}
key=${DAPOD_CI_KEY:-ci-$(date +%s)-$$}

file_id=$("$ctl" upload "$dataset")
echo "dataset: $file_id"

job_json=$(mktemp)
trap 'rm -f "$job_json"' EXIT
sed "s/@TRAINING_FILE@/$file_id/" "$template" >"$job_json"

# --json: progress lines go to stderr (the CI log), the final job object to stdout.
set +e
"$ctl" --json submit --wait --timeout "$timeout" --idempotency-key "$key" "$job_json" >"$out.job.json"
rc=$?
set -e
if [ $rc -ne 0 ]; then
  echo "dapoctl submit --wait exited $rc" >&2
  exit $rc
fi
job_id=$(sed -n 's/.*"id": "\(job-[^"]*\)".*/\1/p' "$out.job.json" | head -1)
echo "job: $job_id succeeded"

"$ctl" download "$job_id" latest --all "$out"
mv "$out.job.json" "$out/job.json"
echo "final checkpoint in $out"
