#!/usr/bin/env bash
# ablation.sh: the GRPO baseline against DAPO, and two arms in between, on the same tasks and
# seeds, from the same random initialisation of the "tiny" preset.
#
# Arms (every other hyperparameter is shared: G 16, 16 prompt groups per step, minibatch 64,
# learning rate 5e-4, gen_batch_multiplier 2 and max_gen_batches 10 where dynamic sampling runs):
#   grpo       "algorithm": "grpo": eps_high = eps_low = 0.2, no dynamic sampling,
#              seq-mean-token-mean, no overlong shaping, kl_coef 0.001
#   dapo-sym   "algorithm": "dapo" with dynamic_sampling false and eps_high 0.2: GRPO without
#              the KL term, with token-mean (the step every DAPO technique is added to)
#   dapo-nods  "algorithm": "dapo" with dynamic_sampling false: adds clip-higher (eps_high 0.28)
#   dapo       "algorithm": "dapo": adds dynamic sampling
# and one more, not run unless named in --arms (it is about 10 times slower than the others):
#   grpo-wide  "algorithm": "grpo" with 10 times the prompts per step (prompt_batch_size 160,
#              minibatch_size 640: still 4 updates per step): about the number of responses
#              DAPO's dynamic sampling generates per step on average, so a same-budget baseline
# (The preset's overlong_buffer is max_new_tokens / 5, which is 0 for both tasks here: overlong
#  shaping is off in every arm.)
#
# Tasks (exact judge, "a+b=" -> a+b for a, b in 0..4, 25 prompts, validation = training file):
#   one   max_new_tokens 1: the answer is the one sampled character
#   eos   max_new_tokens 4, sampling stops at </s>: correct only if the model also stops, e.g.
#         "7</s>" (decodes to "7"); "7abc" is wrong. From random init a response is right about
#         once in 10^4 samples, so the first correct samples are rare.
#
# For each task it prints, per metric, a table of steps x arms (training metrics averaged over the
# --print-every steps ending at that step, then over seeds), and a per-seed summary.
#
# usage: examples/ablation.sh [--tasks "eos one"] [--arms "grpo dapo-sym dapo-nods dapo"]
#                             [--seeds "1 2"] [--steps N] [--print-every N] [--jobs N]
#                             [--keep DIR] [--report-only]
# --keep DIR keeps every run's outputs (checkpoints, rollouts, metrics) in DIR; --report-only
# with --keep DIR and the same --tasks/--arms/--seeds/--steps prints the tables again
# from DIR without training.
# env:   DAPOD=/path/to/dapod (default: build/server/dapod next to this folder);
#        DAPOD_THREADS=N threads per run where dapod has --threads (default cores / --jobs)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DAPOD=${DAPOD:-$here/../build/server/dapod}
PY=/usr/bin/python3

tasks="eos one" arms="grpo dapo-sym dapo-nods dapo" seeds="1 2" steps=300 every=25 jobs=2 keep=""
report_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --tasks) tasks=$2; shift ;;
    --arms) arms=$2; shift ;;
    --seeds) seeds=$2; shift ;;
    --steps) steps=$2; shift ;;
    --print-every) every=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    --keep) keep=$2; shift ;;
    --report-only) report_only=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "ablation.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
for a in $arms; do
  case "$a" in
    grpo|grpo-wide|dapo-sym|dapo-nods|dapo) ;;
    *) echo "ablation.sh: unknown arm '$a'" >&2; exit 2 ;;
  esac
done
for t in $tasks; do
  case "$t" in one|eos) ;; *) echo "ablation.sh: unknown task '$t'" >&2; exit 2 ;; esac
done
if [ $report_only = 1 ] && [ ! -d "$keep" ]; then
  echo "ablation.sh: --report-only needs --keep DIR of an earlier run" >&2; exit 2
fi
if [ $report_only = 0 ] && [ ! -x "$DAPOD" ]; then
  echo "ablation.sh: no dapod at $DAPOD; build it first:" >&2
  echo "  cmake -S . -B build && cmake --build build -j2   (or set DAPOD=...)" >&2
  exit 2
fi

if [ -n "$keep" ]; then
  mkdir -p "$keep"; work=$(cd "$keep" && pwd)
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/dapo-ablation-XXXXXX")
  trap 'rm -rf "$work"' EXIT
fi
names=()
for t in $tasks; do for s in $seeds; do for a in $arms; do names+=("$t-$a-s$s"); done; done; done
failed=0
if [ $report_only = 0 ]; then
cp "$DAPOD" "$work/dapod" # a rebuild of build/ during the runs cannot disturb them
DAPOD=$work/dapod
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
# Newer dapod builds run a job on a thread pool (dapod train --threads N, default all cores):
# split the cores between the runs that go side by side.
train_args=()
probe=$("$DAPOD" train --threads 1 2>&1 || true)
if [[ $probe != *"unknown argument '--threads'"* ]]; then
  per=$(($(nproc) / jobs)); [ "$per" -ge 1 ] || per=1
  train_args=(--threads "${DAPOD_THREADS:-$per}")
fi

"$PY" - "$work" "$steps" "$every" "$tasks" "$arms" "$seeds" <<'EOF'
import json, os, sys
work, steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tasks, arms, seeds = sys.argv[4].split(), sys.argv[5].split(), sys.argv[6].split()
with open(os.path.join(work, "add.jsonl"), "w") as f:
    for a in range(5):
        for b in range(5):
            f.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n")
ARMS = {
    "grpo": {"algorithm": "grpo"},
    "grpo-wide": {"algorithm": "grpo", "prompt_batch_size": 160, "minibatch_size": 640},
    "dapo-sym": {"algorithm": "dapo", "dynamic_sampling": False, "eps_high": 0.2},
    "dapo-nods": {"algorithm": "dapo", "dynamic_sampling": False},
    "dapo": {"algorithm": "dapo"},
}
TASKS = {"one": 1, "eos": 4}
for t in tasks:
    for a in arms:
        for s in seeds:
            hp = {"total_steps": steps, "max_new_tokens": TASKS[t], "group_size": 16,
                  "prompt_batch_size": 16, "gen_batch_multiplier": 2, "max_gen_batches": 10,
                  "minibatch_size": 64, "learning_rate": 5e-4, "eval_every": every,
                  "eval_samples": 1, "eval_temperature": 0.0}
            hp.update(ARMS[a])
            job = {"model": "tiny", "training_file": "add.jsonl", "validation_file": "add.jsonl",
                   "judge": {"type": "exact"}, "seed": int(s), "hyperparameters": hp}
            with open(os.path.join(work, f"job-{t}-{a}-s{s}.json"), "w") as f:
                json.dump(job, f, indent=1)
EOF

# Per run: train, then summarise the sampled responses of the printed steps from rollouts/
# (the within-group entropy of the sampled responses, over every sampled group, which the
# trainer's "entropy" metric cannot show: it covers trained tokens only), then drop rollouts/.
run_one() { # name
  local n=$1 d=$work/$1 t0 rc=0
  t0=$(date +%s)
  rm -rf "$d"; mkdir -p "$d"
  "$DAPOD" train --config "$work/job-$n.json" --out "$d/out" "${train_args[@]}" \
    >"$d/metrics.jsonl" 2>"$d/log.txt" ||
    rc=$?
  echo $(($(date +%s) - t0)) >"$d/secs"
  echo $rc >"$d/rc"
  "$PY" - "$d" "$every" <<'EOF'
import collections, json, math, os, sys
d, every = sys.argv[1], int(sys.argv[2])
out = {}
rdir = os.path.join(d, "out", "rollouts")
for name in os.listdir(rdir) if os.path.isdir(rdir) else []:
    step = int(name[len("step-"):-len(".jsonl")])
    if step % every and step != 1:
        continue
    groups = collections.defaultdict(collections.Counter)
    with open(os.path.join(rdir, name)) as f:
        for line in f:
            r = json.loads(line)
            groups[(r["round"], r["group"])][tuple(r["response_token_ids"])] += 1
    ents = []
    for c in groups.values():
        n = sum(c.values())
        ents.append(-sum(k / n * math.log(k / n) for k in c.values()))
    out[step] = {"sample_entropy": sum(ents) / len(ents),
                 "distinct": sum(len(c) for c in groups.values()) / len(groups)}
with open(os.path.join(d, "rollstats.json"), "w") as f:
    json.dump(out, f)
EOF
  [ -n "$keep" ] || rm -rf "$d/out/rollouts"
  echo "  $n: exit $rc after $(cat "$d/secs") s" >&2
}

echo "ablation: tasks [$tasks], arms [$arms], seeds [$seeds], $steps steps; ${#names[@]} runs," \
  "$jobs at a time, in $work" >&2
t_start=$(date +%s)
for n in "${names[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  run_one "$n" &
done
wait
echo "all runs done in $(($(date +%s) - t_start)) s" >&2
fi # report_only
for n in "${names[@]}"; do
  if [ "$(cat "$work/$n/rc" 2>/dev/null)" != 0 ]; then
    failed=1
    echo "$n failed or is missing; last lines of its log:" >&2
    tail -n 5 "$work/$n/log.txt" >&2 || true
  fi
done

"$PY" - "$work" "$steps" "$every" "$tasks" "$arms" "$seeds" <<'EOF'
import json, math, os, sys
work, steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tasks, arms, seeds = sys.argv[4].split(), sys.argv[5].split(), sys.argv[6].split()
TITLE = {"one": "one token: max_new_tokens 1",
         "eos": "stop at </s>: max_new_tokens 4, correct = right digit then </s>"}

def load(t, a, s):
    d = os.path.join(work, f"{t}-{a}-s{s}")
    tr, ev = {}, {}
    with open(os.path.join(d, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            if "eval/accuracy" in m:
                ev[m["step"]] = m["eval/accuracy"]
            elif "accuracy" in m:
                tr[m["step"]] = m
    try:
        with open(os.path.join(d, "rollstats.json")) as f:
            rs = {int(k): v for k, v in json.load(f).items()}
    except (OSError, ValueError):
        rs = {}
    with open(os.path.join(d, "secs")) as f:
        secs = int(f.read())
    return tr, ev, rs, secs

def mean(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(xs) / len(xs) if xs else None

DS = {"dapo"}  # the arms with dynamic sampling

def informative(a, m):
    # trained groups whose advantages are not all zero. Rewards are +-1 here (exact judge,
    # no overlong shaping), so a group is informative iff it is mixed. With dynamic sampling
    # every kept group is mixed; without it every sampled group is trained on.
    if a in DS:
        return m["groups/kept"]
    return m["groups/sampled"] * (1 - m["groups/all_correct_frac"] - m["groups/all_wrong_frac"])

def trained(m):  # the entropy metric exists only for steps that trained on something
    return m["groups/kept"] > 0 and m.get("tokens/trained", 1) > 0

W = 10
for t in tasks:
    runs = {(a, s): load(t, a, s) for a in arms for s in seeds}
    pts = list(range(every, steps + 1, every))
    print(f"\n==== task {t} ({TITLE[t]}); seeds {' '.join(seeds)} ====")
    print(f"(training metrics: mean over steps (step-{every}, step], then over seeds; "
          f"eval: greedy accuracy at that step, mean over seeds)")

    def window(a, s, key, st, only=lambda m: True):
        tr = runs[(a, s)][0]
        return mean([key(tr[k]) for k in range(st - every + 1, st + 1) if k in tr and only(tr[k])])

    def table(title, key, fmt, start=None, start_step=0):
        print(f"\n{title}")
        print("  step" + "".join(f"{a:>{W}}" for a in arms))
        if start is not None:
            print(f"{start_step:6d}" + "".join(
                f"{fmt(start(a)) if start(a) is not None else '-':>{W}}" for a in arms))
        for st in pts:
            cells = []
            for a in arms:
                v = mean([key(a, s, st) for s in seeds])
                cells.append(fmt(v) if v is not None else "-")
            print(f"{st:6d}" + "".join(f"{c:>{W}}" for c in cells))

    f2 = lambda v: f"{v:.2f}"
    f3 = lambda v: f"{v:.3f}"
    pct = lambda v: f"{100 * v:.2f}%"
    table("eval/accuracy (greedy, all 25 prompts)",
          lambda a, s, st: runs[(a, s)][1].get(st), f2,
          start=lambda a: mean([runs[(a, s)][1].get(0) for s in seeds]))
    table("accuracy (training samples, every sampled response)",
          lambda a, s, st: window(a, s, lambda m: m["accuracy"], st), f3)
    table("entropy (logged: mean per-token entropy over the TRAINED tokens, nats)",
          lambda a, s, st: window(a, s, lambda m: m["entropy"], st, trained), f3)
    table("sample entropy (entropy of the 16 responses within each sampled group, at that "
          "step, over all sampled groups; nats, max ln 16 = 2.77)",
          lambda a, s, st: runs[(a, s)][2].get(st, {}).get("sample_entropy"), f3,
          start=lambda a: mean([runs[(a, s)][2].get(1, {}).get("sample_entropy") for s in seeds]),
          start_step=1)
    if t != "one":
        table("response_length/mean (tokens, </s> included)",
              lambda a, s, st: window(a, s, lambda m: m["response_length/mean"], st), f2)
    table("policy/clip_frac_low (share of trained tokens, ratio < 1-eps_low with A < 0)",
          lambda a, s, st: window(a, s, lambda m: m["policy/clip_frac_low"], st), pct)
    table("policy/clip_frac_high (share of trained tokens, ratio > 1+eps_high with A > 0)",
          lambda a, s, st: window(a, s, lambda m: m["policy/clip_frac_high"], st), pct)
    table("groups/kept per step (groups trained on)",
          lambda a, s, st: window(a, s, lambda m: m["groups/kept"], st), lambda v: f"{v:.1f}")
    table("groups/sampled per step",
          lambda a, s, st: window(a, s, lambda m: m["groups/sampled"], st), lambda v: f"{v:.1f}")
    table("informative groups trained per step (kept groups with some non-zero advantage)",
          lambda a, s, st: window(a, s, lambda m: informative(a, m), st), lambda v: f"{v:.1f}")

    def seed_stats(a, s):
        tr, ev, rs, secs = runs[(a, s)]
        last = max(tr) if tr else 0
        ents = [m["entropy"] for m in tr.values() if trained(m)]
        return {
            "final": ev[max(ev)] if ev else None,
            "first": next((st for st in sorted(ev) if ev[st] >= 0.9), None),
            "acc25": mean([tr[k]["accuracy"] for k in range(last - 24, last + 1) if k in tr]),
            "minent": min(ents) if ents else None,
            "sent": rs[max(rs)]["sample_entropy"] if rs else None,
            "gen": sum(m["tokens/generated"] for m in tr.values()),
            "sampled": sum(m["groups/sampled"] for m in tr.values()),
            "kept": sum(m["groups/kept"] for m in tr.values()),
            "inf": sum(informative(a, m) for m in tr.values()),
            "secs": secs,
        }

    st = {(a, s): seed_stats(a, s) for a in arms for s in seeds}
    def avg(a, k):
        return mean([st[(a, s)][k] for s in seeds])
    def fmt(v, f):
        return "-" if v is None else f(v)

    print(f"\nsummary, task {t}: means over seeds {' '.join(seeds)} ({steps} steps)")
    hdr = ["arm", "final eval", "seeds >= 0.9", "last-25 train acc", "min entropy",
           "final sample ent.", "gen tokens", "groups sampled", "informative/trained"]
    rows = [hdr]
    for a in arms:
        inf, kept = avg(a, "inf"), avg(a, "kept")
        n_reach = sum(st[(a, s)]["first"] is not None for s in seeds)
        rows.append([a, fmt(avg(a, "final"), lambda v: f"{v:.2f}"), f"{n_reach}/{len(seeds)}",
                     fmt(avg(a, "acc25"), lambda v: f"{v:.3f}"),
                     fmt(avg(a, "minent"), lambda v: f"{v:.3f}"),
                     fmt(avg(a, "sent"), lambda v: f"{v:.3f}"),
                     f"{avg(a, 'gen') / 1e3:.0f}k", f"{avg(a, 'sampled'):.0f}",
                     f"{inf:.0f}/{kept:.0f} ({100 * inf / kept if kept else 0:.0f}%)"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(hdr))]
    for r in rows:
        print("  " + "  ".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}"
                                for i, (c, w) in enumerate(zip(r, widths))))
    print(f"per seed ({' / '.join(seeds)}):")
    rows = [["arm", "final eval", "first step >= 0.9", "gen tokens", "seconds"]]
    for a in arms:
        ss = [st[(a, s)] for s in seeds]
        rows.append([a, " ".join(fmt(x["final"], lambda v: f"{v:.2f}") for x in ss),
                     " ".join(f"{x['first'] if x['first'] is not None else 'never'}" for x in ss),
                     " ".join(f"{x['gen'] / 1e3:.0f}k" for x in ss),
                     " ".join(str(x["secs"]) for x in ss)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print(("  " + "  ".join(f"{c:<{w}}" for c, w in zip(r, widths))).rstrip())
EOF
exit $failed
