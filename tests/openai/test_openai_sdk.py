#!/usr/bin/env python3
"""The official `openai` npm package (pinned: package-lock.json) drives a whole reinforcement
fine-tuning job on a daemon of its own (sdk_job.mjs); then the README's "Coming from OpenAI
reinforcement fine-tuning" examples run as they are: the Node one always, the Python one where
the `openai` Python package is installed (said and skipped otherwise). Installs the npm package
with tests/npm_ci.sh. Usage: test_openai_sdk.py --dapod PATH --work DIR"""
import argparse
import hashlib
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "api"))
import harness  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dapod", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    rc = subprocess.run(["sh", os.path.join(HERE, "..", "npm_ci.sh"), HERE, a.work, "sdk_job.mjs"])
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
        p = subprocess.run(["node", os.path.join(a.work, "sdk_job.mjs"), url, tmp], env=env,
                           timeout=900)
        if p.returncode:
            sys.stderr.write(d.log()[-4000:])
            return p.returncode
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
            last = p.stdout.strip().splitlines()[-1:] or [""]
            if p.returncode or not last[0].startswith("succeeded ft:tiny:"):
                sys.stderr.write("README %s example failed (%d):\n%s\n%s" % (
                    lang, p.returncode, p.stderr[-3000:], d.log()[-3000:]))
                return 1
            print("README %s example: %s" % (lang, last[0]))
        # a clean stop (under ASan: no leak, no error report)
        rc = d.stop()
        if rc != 0:
            sys.stderr.write("dapod exited %s after SIGTERM:\n%s" % (rc, d.log()[-4000:]))
            return 1
        return 0


if __name__ == "__main__":
    sys.exit(main())
