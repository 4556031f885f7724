#!/usr/bin/env python3
"""The official `openai` npm package (pinned: package-lock.json) drives a whole reinforcement
fine-tuning job on a daemon of its own (sdk_job.mjs); then the README's "Coming from OpenAI
fine-tuning" examples run as they are: the Node one always (supervised, then DPO, then
reinforcement fine-tuning on one task, each job from the last one's model: each figure it prints
must show its method working), the Python one where
the `openai` Python package is installed (said and skipped otherwise); then the SDK drives a
checkpoint through tool calls (sdk_tools.mjs), the checkpoint trained here to call (the tiny
preset against tests/rl/env_server.py's /ask route). With --script NAME only that script of
tests/openai runs on the daemon (ctest openai_sft_sdk: sdk_sft.mjs, a supervised job). Installs
the npm package with tests/npm_ci.sh.
Usage: test_openai_sdk.py --dapod PATH --work DIR [--script NAME]"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "api"))
import harness  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dapod", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--script", help="run only this script of tests/openai (e.g. sdk_sft.mjs)")
    a = ap.parse_args()
    rc = subprocess.run(["sh", os.path.join(HERE, "..", "npm_ci.sh"), HERE, a.work, "sdk_job.mjs",
                         "sdk_tools.mjs", "sdk_sft.mjs", "sdk_parse.mjs", "sdk_dpo.mjs"])
    if rc.returncode:
        return rc.returncode
    # an API key (the SDK's apiKey; a wrong one is AuthenticationError) and a queue of one job
    # (a second queued job is RateLimitError)
    key = "sdk-test-key-1"
    spec = "sdk:%s" % hashlib.sha256(key.encode()).hexdigest()
    with tempfile.TemporaryDirectory() as tmp, \
            harness.Daemon(a.dapod, args=["--workers", "1", "--blas-threads", "1",
                                          "--api-keys", spec, "--max-queued-jobs", "1"]) as d:
        url = "http://127.0.0.1:%d/v1" % d.port
        env = dict(os.environ, OPENAI_API_KEY=key, OPENAI_BASE_URL=url)
        p = subprocess.run(["node", os.path.join(a.work, a.script or "sdk_job.mjs"), url, tmp],
                           env=env, timeout=900)
        if p.returncode:
            sys.stderr.write(d.log()[-4000:])
            return p.returncode
        if not a.script:
            rc = readme_examples(a, env, tmp, d)
            if rc:
                return rc
            # tool calls: a checkpoint that calls, driven by the SDK
            model = train_caller(url, key, tmp)
            p = subprocess.run(["node", os.path.join(a.work, "sdk_tools.mjs"), url, model],
                               env=env, timeout=600)
            if p.returncode:
                sys.stderr.write(d.log()[-4000:])
                return p.returncode
        # a clean stop (under ASan: no leak, no error report)
        rc = d.stop()
        if rc != 0:
            sys.stderr.write("dapod exited %s after SIGTERM:\n%s" % (rc, d.log()[-4000:]))
            return 1
        return 0


def readme_examples(a, env, tmp, d):
    """The README's "Coming from OpenAI fine-tuning" examples: the Node one, and the Python one where the
    `openai` Python package is installed. 0 when each ran to a succeeded job (or was skipped)."""
    for lang, cmd in (("node", ["node"]), ("python", [sys.executable])):
        if lang == "python" and subprocess.run(cmd + ["-c", "from openai import OpenAI"],
                                               cwd=tmp, capture_output=True).returncode:
            print("README python example: skipped, no `openai` Python package")
            continue
        # the module resolves the npm package from the work dir; it writes into tmp
        path = os.path.join(a.work if lang == "node" else tmp,
                            "readme_rft." + ("mjs" if lang == "node" else "py"))
        with open(path, "w") as f:
            f.write(harness.readme_block("openai-" + lang))
        p = subprocess.run(cmd + [path], env=env, cwd=tmp, timeout=600,
                           capture_output=True, text=True)
        sys.stdout.write(p.stdout)
        lines = p.stdout.strip().splitlines()
        ok = not p.returncode and (node_pipeline_ok(lines) if lang == "node" else
                                   (lines[-1:] or [""])[0].startswith("succeeded ft:tiny:"))
        if not ok:
            sys.stderr.write("README %s example failed (%d):\n%s\n%s" % (
                lang, p.returncode, p.stderr[-3000:], d.log()[-3000:]))
            return 1
        print("README %s example: %s" % (lang, " | ".join(lines[-4:])))
    return 0


def node_pipeline_ok(lines):
    """The Node example's pipeline (supervised, then DPO, then reinforcement, each from the last
    one's model) printed what each method is for: supervised fine-tuning gets sums right, DPO
    prefers the right sum to held-out misses, reinforcement gets more sums right than supervised
    fine-tuning did, and the last model keeps the first base's name."""
    import re
    if len(lines) < 4:
        return False
    sft = re.fullmatch(r"supervised: succeeded, (\d+)/100 right", lines[-4])
    dpo = re.fullmatch(r"dpo: succeeded, held-out preference accuracy ([0-9.]+)", lines[-3])
    rft = re.fullmatch(r"reinforcement: succeeded, (\d+)/100 right", lines[-2])
    return bool(sft and dpo and rft and int(sft.group(1)) >= 10 and float(dpo.group(1)) >= 0.8
                and int(rft.group(1)) >= int(sft.group(1)) + 15
                and lines[-1].startswith("ft:tiny:dapod::job-"))


def train_caller(url, key, tmp):
    """The tiny preset trained to call (a turn starting with '@', rewarded by the stand-in
    environment's /ask route): returns its checkpoint's model id."""
    def call(method, path, body=None, ctype="application/json"):
        req = urllib.request.Request(url.rsplit("/v1", 1)[0] + path, data=body, method=method,
                                     headers={"Authorization": "Bearer " + key,
                                              "Content-Type": ctype})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())
    env = subprocess.Popen([sys.executable, os.path.join(HERE, "..", "rl", "env_server.py"),
                            os.path.join(tmp, "env.log")], stdout=subprocess.PIPE)
    try:
        port = int(env.stdout.readline())
        lines = "".join(json.dumps({"prompt": "code %d?" % k, "answer": str(k % 10)}) + "\n"
                        for k in range(40))
        fid = call("POST", "/v1/files?purpose=fine-tune&filename=calls.jsonl", lines.encode(),
                   "application/x-ndjson")["id"]
        body = {"model": "tiny", "training_file": fid, "judge": {"type": "exact"}, "seed": 1,
                "hyperparameters": {"total_steps": 60, "group_size": 32, "prompt_batch_size": 4,
                                    "max_new_tokens": 1, "learning_rate": 3e-3,
                                    "dynamic_sampling": False, "checkpoint_every": 60},
                "episode": {"max_turns": 1, "reward": "environment",
                            "environment": {"type": "http",
                                            "url": "http://127.0.0.1:%d/ask" % port}}}
        job = call("POST", "/v1/jobs", json.dumps(body).encode())
        end = time.monotonic() + 600
        while job["status"] not in ("succeeded", "failed", "cancelled") and time.monotonic() < end:
            job = call("GET", "/v1/jobs/%s?wait=10" % job["id"])
        if job["status"] != "succeeded":
            raise RuntimeError("the calling model's job ended %s: %s" % (job["status"],
                                                                       job.get("error")))
        return "%s:step-60" % job["id"]
    finally:
        env.kill()
        env.wait()
        env.stdout.close()


if __name__ == "__main__":
    sys.exit(main())
