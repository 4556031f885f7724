#!/usr/bin/env bash
# learn_addition.sh: DAPO from random initialisation learns single-digit addition.
#
# The "tiny" preset (Llama, ~99k parameters, character tokenizer, random weights) is trained by
# `dapod train` with the built-in exact judge, one response token (max_new_tokens 1), G 16,
# 16 prompt groups per step, learning rate 5e-4: the configuration of tests/rl/test_learn.c.
# Greedy accuracy (eval_samples 1, eval_temperature 0) on the prompts is measured every
# --eval-every steps; the script prints it per step per seed and the first step at which each
# seed reached --threshold.
#
#   default  "a+b=" -> a+b      for a, b in 0..4   (25 prompts, answers 0..8), 300 steps
#   --hard   "a+b=" -> (a+b)%10 for a, b in 0..9   (100 prompts),              600 steps
#
# The validation file is the training file: this shows that the RL loop learns, not that the
# model generalises to unseen sums.
#
# usage: examples/learn_addition.sh [--hard] [--seeds "1 2 3 4 5"] [--steps N] [--eval-every N]
#                                   [--jobs N] [--threshold X] [--keep DIR]
# env:   DAPOD=/path/to/dapod (default: build/server/dapod next to this folder);
#        DAPOD_THREADS=N threads per run where dapod has --threads (default cores / --jobs)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DAPOD=${DAPOD:-$here/../build/server/dapod}
PY=/usr/bin/python3

hard=0 seeds="1 2 3 4 5" steps="" eval_every=25 jobs=2 threshold=0.9 keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    --hard) hard=1 ;;
    --seeds) seeds=$2; shift ;;
    --steps) steps=$2; shift ;;
    --eval-every) eval_every=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    --threshold) threshold=$2; shift ;;
    --keep) keep=$2; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "learn_addition.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$steps" ] || steps=$([ $hard = 1 ] && echo 600 || echo 300)
if [ ! -x "$DAPOD" ]; then
  echo "learn_addition.sh: no dapod at $DAPOD; build it first:" >&2
  echo "  cmake -S . -B build && cmake --build build -j2   (or set DAPOD=...)" >&2
  exit 2
fi

if [ -n "$keep" ]; then
  mkdir -p "$keep"; work=$(cd "$keep" && pwd)
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/dapo-addition-XXXXXX")
  trap 'rm -rf "$work"' EXIT
fi

# A private copy of the binary: a rebuild of build/ during the runs cannot disturb them.
cp "$DAPOD" "$work/dapod"
DAPOD=$work/dapod
# The tiny model gains nothing from BLAS threads; runs go side by side instead.
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
# Newer dapod builds run a job on a thread pool (dapod train --threads N, default all cores):
# split the cores between the runs that go side by side.
train_args=()
probe=$("$DAPOD" train --threads 1 2>&1 || true)
if [[ $probe != *"unknown argument '--threads'"* ]]; then
  per=$(($(nproc) / jobs)); [ "$per" -ge 1 ] || per=1
  train_args=(--threads "${DAPOD_THREADS:-$per}")
fi

# dataset and one job file per seed (relative paths resolve against the job file's folder)
"$PY" - "$work" "$hard" "$steps" "$eval_every" $seeds <<'EOF'
import json, os, sys
work, hard, steps, eval_every = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4])
n = 10 if hard else 5
with open(os.path.join(work, "data.jsonl"), "w") as f:
    for a in range(n):
        for b in range(n):
            ans = (a + b) % 10 if hard else a + b
            f.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(ans)}) + "\n")
for s in sys.argv[5:]:
    job = {
        "model": "tiny", "training_file": "data.jsonl", "validation_file": "data.jsonl",
        "judge": {"type": "exact"}, "seed": int(s),
        "hyperparameters": {
            "algorithm": "dapo", "total_steps": steps, "max_new_tokens": 1, "group_size": 16,
            "prompt_batch_size": 16, "gen_batch_multiplier": 2, "max_gen_batches": 10,
            "minibatch_size": 64, "learning_rate": 5e-4, "eval_every": eval_every,
            "eval_samples": 1, "eval_temperature": 0.0,
        },
    }
    with open(os.path.join(work, f"job-seed{s}.json"), "w") as f:
        json.dump(job, f, indent=1)
EOF

run_one() { # seed
  local s=$1 t0 rc=0
  t0=$(date +%s)
  rm -rf "$work/seed$s"
  "$DAPOD" train --config "$work/job-seed$s.json" --out "$work/seed$s" "${train_args[@]}" \
    >"$work/metrics-seed$s.jsonl" 2>"$work/log-seed$s.txt" || rc=$?
  echo $(($(date +%s) - t0)) >"$work/secs-seed$s"
  echo $rc >"$work/rc-seed$s"
  # rollouts/ holds every sampled response of every step (hundreds of MB): not needed here
  [ -n "$keep" ] || rm -rf "$work/seed$s/rollouts"
  echo "  seed $s: exit $rc after $(cat "$work/secs-seed$s") s" >&2
}

task=$([ $hard = 1 ] && echo '"a+b=" -> (a+b) mod 10, a, b in 0..9 (100 prompts)' ||
  echo '"a+b=" -> a+b, a, b in 0..4 (25 prompts)')
echo "DAPO, tiny preset from random init, $task; $steps steps; seeds: $seeds" >&2
echo "running $jobs at a time in $work ..." >&2
t_start=$(date +%s)
for s in $seeds; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  run_one "$s" &
done
wait
echo "all runs done in $(($(date +%s) - t_start)) s" >&2

failed=0
for s in $seeds; do
  if [ "$(cat "$work/rc-seed$s")" != 0 ]; then
    failed=1
    echo "seed $s failed; last lines of its log:" >&2
    tail -n 5 "$work/log-seed$s.txt" >&2
  fi
done

"$PY" - "$work" "$threshold" "$task" "$steps" $seeds <<'EOF'
import json, os, sys
work, thr, task, steps = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
seeds = sys.argv[5:]
evals, train, secs = {}, {}, {}
for s in seeds:
    ev, tr = {}, {}
    with open(os.path.join(work, f"metrics-seed{s}.jsonl")) as f:
        for line in f:
            d = json.loads(line)
            if "eval/accuracy" in d:
                ev[d["step"]] = d["eval/accuracy"]
            elif "accuracy" in d:
                tr[d["step"]] = d
    evals[s], train[s] = ev, tr
    with open(os.path.join(work, f"secs-seed{s}")) as f:
        secs[s] = f.read().strip()
steps_seen = sorted({k for ev in evals.values() for k in ev})

def cell(x):
    return "   -  " if x is None else f"{x:6.2f}"

print(f"\nGreedy eval accuracy, {task}")
print("  step " + "".join(f" seed{s:<2}" for s in seeds) + "   mean")
for st in steps_seen:
    row = [evals[s].get(st) for s in seeds]
    have = [x for x in row if x is not None]
    mean = sum(have) / len(have) if have else None
    print(f"{st:6d} " + "".join(cell(x) + " " for x in row) + cell(mean))

print(f"\nFirst evaluated step with greedy accuracy >= {thr:g}:")
reached = []
for s in seeds:
    first = next((st for st in sorted(evals[s]) if evals[s][st] >= thr), None)
    final = evals[s][max(evals[s])] if evals[s] else float("nan")
    tr = train[s]
    gen = sum(d.get("tokens/generated", 0) for d in tr.values())
    ent = tr[max(tr)]["entropy"] if tr else float("nan")
    print(f"  seed {s}: {first if first is not None else 'never':>5}   "
          f"(final {final:.2f}; {gen} tokens generated; last-step entropy {ent:.3f}; "
          f"{secs[s]} s)")
    if first is not None:
        reached.append(first)
print(f"  {len(reached)} of {len(seeds)} seeds reached {thr:g} within {steps} steps"
      + (f"; median first step {sorted(reached)[len(reached) // 2]}" if reached else ""))
EOF
exit $failed
