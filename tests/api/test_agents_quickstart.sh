#!/usr/bin/env bash
# Keeps the README's "Agents: tools and environments" section true (label api): runs exactly its
# commands (the block between `<!-- agents:begin -->` and `<!-- agents:end -->`) against dapod on
# a free loopback port, with the example tool's port 8765 replaced by a free one
# (readme_block.sh), then checks
# - that the job succeeded, the followed stream ended (`end succeeded`), and every printed line
#   agrees with GET /v1/jobs/{id}/metrics;
# - the curve: greedy accuracy on the unseen validation keys (eval_temperature 0, checked in the
#   resolved job) at most EVAL0_MAX at step 0 (chance is 0.1; a model that does not call cannot
#   know a key's code) and at least FINAL_MIN at the last evaluation; the last step's episodes
#   call the tool (tool calls per episode at least CALLS_MIN: half the prompts show a lookup);
# - that the printed episode is a conversation: the model's '@', the tool's answer '=D', the
#   model's D, the tool's turn untrained.
# The README's fixed seed gives 0.00 at step 0 and 1.00 from step 30; a job's metrics depend
# only on its spec, seed and thread configuration, never on timing.
# Stops the daemon with SIGTERM and requires exit 0.
# Exit 77 (skipped) when curl or python3 is missing. Usage: test_agents_quickstart.sh DAPOD
set -euo pipefail
dapod=$1
test=test_agents_quickstart
# shellcheck source=readme_block.sh
. "$(dirname "$0")/readme_block.sh"
readme_init
readme_extract agents
readme_serve "$dapod"
readme_run 800 8765

python3 - "$url" "$tmp/out.txt" "$root/tests/api" <<'PY' || fail "the agents quick start's results are wrong"
import re, sys

url, out = sys.argv[1:3]
sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[3])
from readme_job import Readme
EVAL0_MAX, FINAL_MIN, CALLS_MIN = 0.2, 0.9, 0.4
readme = Readme("test_agents_quickstart", url, out)
get, check, lines, job = readme.get, readme.check, readme.lines, readme.job
hp = job["hyperparameters"]
check(hp["eval_temperature"] == 0, "evaluation is not greedy: %r" % hp["eval_temperature"])
check(job["episode"]["tools"][0]["function"]["name"] == "lookup", "no lookup tool in the job")

metrics = get("/v1/jobs/%s/metrics" % job["id"])
evals = [m for m in metrics if "eval/accuracy" in m]
train = {m["step"]: m for m in metrics if "accuracy" in m}
total = hp["total_steps"]
check([m["step"] for m in evals] == list(range(0, total + 1, hp["eval_every"])),
      "evaluations at steps %s" % [m["step"] for m in evals])
curve = " ".join("%d:%.2f" % (m["step"], m["eval/accuracy"]) for m in evals)

# what was printed is what the metrics say
printed_evals = [re.fullmatch(r"step +(\d+) +unseen keys, greedy: accuracy (\d\.\d\d)", ln)
                 for ln in lines]
printed_evals = [(int(f.group(1)), float(f.group(2))) for f in printed_evals if f]
check([s for s, _ in printed_evals] == [m["step"] for m in evals],
      "printed evaluations %s" % printed_evals)
for (s, a), m in zip(printed_evals, evals):
    check(abs(a - m["eval/accuracy"]) < 0.006, "step %d: printed %.2f, metrics %.4f"
          % (s, a, m["eval/accuracy"]))
printed_steps = [re.fullmatch(r"step +(\d+) +tool calls per episode (\d\.\d\d) +accuracy (\d\.\d\d)",
                              ln) for ln in lines]
printed_steps = [f for f in printed_steps if f]
check(len(printed_steps) == total // 10, "%d step lines printed" % len(printed_steps))
for f in printed_steps:
    m = train[int(f.group(1))]
    check(abs(float(f.group(2)) - m["episode/tool_calls_mean"]) < 0.006
          and abs(float(f.group(3)) - m["accuracy"]) < 0.006,
          "%r disagrees with the metrics list" % f.group(0))

# the curve
check(evals[0]["eval/accuracy"] <= EVAL0_MAX, "step 0: greedy accuracy %.2f > %g (%s)"
      % (evals[0]["eval/accuracy"], EVAL0_MAX, curve))
check(evals[-1]["eval/accuracy"] >= FINAL_MIN, "final greedy accuracy on unseen keys %.2f < %g (%s)"
      % (evals[-1]["eval/accuracy"], FINAL_MIN, curve))
calls = train[total]["episode/tool_calls_mean"]
check(calls >= CALLS_MIN, "the last step's episodes call %.2f times each (< %g)" % (calls, CALLS_MIN))

# the printed episode: prompt, then the model's call, the tool's answer, the model's answer
i = next((k for k, ln in enumerate(lines) if ln.startswith("prompt ")), None)
check(i is not None, "no episode was printed")
f = re.fullmatch(r"prompt '(code \d+\?)'  answer '(\d)'  reward 1\.0", lines[i])
check(f is not None, "the printed episode reads %r" % lines[i])
code = f.group(2)
want = ["  assistant '@'  (trained)", "  tool      '=%s'" % code,
        "  assistant '%s'  (trained)" % code]
check(lines[i + 1:i + 4] == want, "the printed episode is %r, not %r" % (lines[i + 1:i + 4], want))
print("test_agents_quickstart: greedy accuracy on unseen keys %s; tool calls per episode %.2f "
      "at step %d" % (curve, calls, total), file=sys.stderr)
PY

readme_stop
echo "test_agents_quickstart: 1 passed, 0 failed" >&2
