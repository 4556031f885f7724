#!/usr/bin/env bash
# Keeps the README's quick start true (label api): extracts the shell blocks between
# `<!-- quickstart:begin -->` and `<!-- quickstart:end -->` of README.md, starts dapod on a free
# loopback port with a scratch data directory, replaces only the base URL
# (http://127.0.0.1:8080) with the daemon's, runs the commands with bash -e -o pipefail in a
# scratch folder that sees the repository's tests/ and examples/ (they write their dataset,
# job.json and tiny-dapo/ where they run), then checks
# - that the job succeeded and the followed stream ended (`end succeeded`);
# - that it learned: one printed line per step that agrees with GET /v1/jobs/{id}/metrics, the
#   mean accuracy of the first 5 steps at most FIRST_MAX, of the last 10 at least LAST_MIN, and
#   greedy answers of the final checkpoint (POST /v1/completions, temperature 0) right for at
#   least GREEDY_MIN of the training file's prompts. The thresholds leave a margin below what
#   the README's fixed seed gives (0.02, 0.92, 23 of 25 right); a job's metrics depend only on its
#   spec, seed and thread configuration, never on timing;
# - that the downloaded files are the final checkpoint's (same SHA-256 as its index) and a valid
#   checkpoint: config.json parses with the Hugging Face keys, model.safetensors' header parses
#   and its tensors tile the file.
# Stops the daemon with SIGTERM and requires exit 0.
# Exit 77 (skipped) when curl or python3 is missing. Usage: test_quickstart.sh DAPOD
set -euo pipefail
dapod=$1
test=test_quickstart
# shellcheck source=readme_block.sh
. "$(dirname "$0")/readme_block.sh"
readme_init
readme_extract quickstart
readme_serve "$dapod"
readme_run 300

# ---- what they did ----
python3 - "$url" "$tmp/work" "$tmp/out.txt" "$root/tests/api" <<'PY' || fail "the quick start's results are wrong"
import hashlib, json, os, re, struct, sys, urllib.request

url, work, out = sys.argv[1:4]
sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[4])
from readme_job import Readme
readme = Readme("test_quickstart", url, out)
get, check, lines, job = readme.get, readme.check, readme.lines, readme.job

# ---- it learned ----
FIRST_MAX, LAST_MIN, GREEDY_MIN = 0.2, 0.7, 0.7
total = job["hyperparameters"]["total_steps"]
train = [m for m in get("/v1/jobs/%s/metrics" % job["id"]) if "accuracy" in m]
check([m["step"] for m in train] == list(range(1, total + 1)),
      "the metrics list has steps %s, not 1..%d" % ([m["step"] for m in train], total))
printed = [ln for ln in lines if ln.startswith("step ")]
check(len(printed) == total, "%d step lines printed for %d steps:\n%s"
      % (len(printed), total, "\n".join(printed[-5:])))
for ln, m in zip(printed, train):
    f = re.fullmatch(r"step +(\d+) +reward ([+-]\d+\.\d\d) +accuracy (\d\.\d\d)", ln)
    check(f is not None, "a step line reads %r" % ln)
    check(int(f.group(1)) == m["step"] and abs(float(f.group(2)) - m["reward/mean"]) < 0.006
          and abs(float(f.group(3)) - m["accuracy"]) < 0.006,
          "%r disagrees with the metrics list: reward %.4f, accuracy %.4f"
          % (ln, m["reward/mean"], m["accuracy"]))
acc = [m["accuracy"] for m in train]
first, last = sum(acc[:5]) / 5, sum(acc[-10:]) / 10
curve = " ".join("%d:%.2f" % (m["step"], m["accuracy"]) for m in train[::5])
check(first <= FIRST_MAX, "mean accuracy of steps 1-5 is %.3f > %g (%s)"
      % (first, FIRST_MAX, curve))
check(last >= LAST_MIN, "mean accuracy of the last 10 steps is %.3f < %g (%s)"
      % (last, LAST_MIN, curve))
asked = [ln for ln in lines if re.fullmatch(r"What is \d+\+\d+\? .*", ln)]
check(len(asked) >= 1, "no answer from the final checkpoint was printed")
with urllib.request.urlopen(url + "/v1/files/%s/content" % job["training_file"], timeout=30) as r:
    data = [json.loads(x) for x in r.read().decode("utf-8").splitlines() if x.strip()]
right = 0
for d in data:
    body = json.dumps({"model": job["fine_tuned_model"], "prompt": d["prompt"],
                       "max_tokens": job["hyperparameters"]["max_new_tokens"],
                       "temperature": 0}).encode("utf-8")
    req = urllib.request.Request(url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        right += json.load(r)["choices"][0]["text"].strip() == d["answer"]
check(right >= GREEDY_MIN * len(data),
      "the final checkpoint answers %d of %d prompts right (greedy)" % (right, len(data)))
print("test_quickstart: accuracy %.3f over steps 1-5, %.3f over the last 10 (%s); "
      "greedy %d of %d right; printed: %s"
      % (first, last, curve, right, len(data), "; ".join(asked)), file=sys.stderr)
final = job["checkpoints"][-1]
check(job["fine_tuned_model"] == "%s:step-%d" % (job["id"], final), job["fine_tuned_model"])
ckpt = [c for c in get("/v1/jobs/%s/checkpoints" % job["id"])["data"] if c["step"] == final][0]
index = {f["name"]: f for f in ckpt["files"]}
folder = os.path.join(work, "tiny-dapo")
for name in ("config.json", "model.safetensors"):
    path = os.path.join(folder, name)
    check(os.path.isfile(path), "%s was not downloaded" % name)
    data = open(path, "rb").read()
    check(hashlib.sha256(data).hexdigest() == index[name]["sha256"],
          "%s is not the final checkpoint's (step %d)" % (name, final))

cfg = json.load(open(os.path.join(folder, "config.json")))
for k in ("architectures", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "vocab_size", "max_position_embeddings",
          "rms_norm_eps", "rope_theta", "tie_word_embeddings", "torch_dtype", "bos_token_id",
          "eos_token_id"):
    check(k in cfg, "config.json lacks %s" % k)

blob = open(os.path.join(folder, "model.safetensors"), "rb").read()
check(len(blob) >= 8, "model.safetensors is too short")
(n,) = struct.unpack("<Q", blob[:8])
check(8 + n <= len(blob), "model.safetensors: header length %d past the end" % n)
header = json.loads(blob[8:8 + n].decode("utf-8"))
header.pop("__metadata__", None)
sizes = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4}
spans = []
for name, t in header.items():
    count = 1
    for d in t["shape"]:
        count *= d
    a, b = t["data_offsets"]
    check(t["dtype"] in sizes and b - a == count * sizes[t["dtype"]],
          "tensor %s: %s %s does not fill [%d, %d)" % (name, t["dtype"], t["shape"], a, b))
    spans.append((a, b))
spans.sort()
check(spans and spans[0][0] == 0 and spans[-1][1] == len(blob) - 8 - n and
      all(x[1] == y[0] for x, y in zip(spans, spans[1:])),
      "model.safetensors: the tensors do not tile the data section")
check("model.embed_tokens.weight" in header and "model.norm.weight" in header,
      "model.safetensors lacks the standard tensor names: %s" % sorted(header)[:5])
check(header["model.embed_tokens.weight"]["shape"] == [cfg["vocab_size"], cfg["hidden_size"]],
      "embed_tokens does not match config.json")
print("test_quickstart: job %s succeeded; step %d checkpoint: %d tensors, %d bytes"
      % (job["id"], final, len(header), len(blob)), file=sys.stderr)
PY

readme_stop
echo "test_quickstart: 1 passed, 0 failed" >&2
