#!/usr/bin/env python3
"""The official `openai` npm package (pinned: package-lock.json) drives a whole reinforcement
fine-tuning job on a daemon of its own (sdk_job.mjs). Installs the package with tests/npm_ci.sh.
Usage: test_openai_sdk.py --dapod PATH --work DIR"""
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
        p = subprocess.run(["node", os.path.join(a.work, "sdk_job.mjs"), url, tmp],
                           env=dict(os.environ, OPENAI_API_KEY=key), timeout=900)
        if p.returncode:
            sys.stderr.write(d.log()[-4000:])
        return p.returncode


if __name__ == "__main__":
    sys.exit(main())
