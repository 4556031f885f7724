#!/usr/bin/python3
"""API keys (label api): with keys configured every request but /healthz and /readyz needs
"Authorization: Bearer <key>" (401 problem+json otherwise, also for an unknown key); a key sees
only what it created (404, not 403, for another key's file); an admin key sees everything.

Run: /usr/bin/python3 tests/api/test_auth.py --dapod build/server/dapod
"""

import argparse
import hashlib
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

DATA = os.path.join(HERE, "..", "data")
DAPOD = None
KEYS = {"alice": "alice-secret-1", "bob": "bob-secret-2", "root": "root-secret-3"}


def sha(k):
    return hashlib.sha256(k.encode()).hexdigest()


class AuthTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        spec = "alice:%s,bob:%s,root:%s:admin" % (sha(KEYS["alice"]), sha(KEYS["bob"]),
                                                 sha(KEYS["root"]))
        cls.d = harness.Daemon(DAPOD, args=["--api-keys", spec])
        cls.d.start()

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()
        cls.d.cleanup()

    def auth(self, who):
        return {"Authorization": "Bearer " + KEYS[who]}

    def upload(self, who):
        with open(os.path.join(DATA, "addition.jsonl"), "rb") as f:
            body = f.read()
        h = {"Content-Type": "application/x-ndjson"}
        h.update(self.auth(who))
        r = self.d.request("POST", "/v1/files?purpose=train&filename=a.jsonl", body, headers=h)
        self.assertEqual(r.status, 201, r)
        return r.json()["id"]

    def test_probes_open(self):
        self.assertEqual(self.d.get("/healthz").status, 200)
        self.assertEqual(self.d.get("/readyz").status, 200)

    def test_missing_and_unknown_key(self):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic eA=="}):
            r = self.d.get("/v1/files", headers=headers)
            self.assertEqual(r.status, 401, r)
            self.assertTrue(r.header("Content-Type").startswith("application/problem+json"))
            self.assertEqual(r.json()["type"], "https://dapod.dev/problems/unauthorized")
            self.assertEqual(r.header("WWW-Authenticate"), "Bearer")
        self.assertEqual(self.d.get("/metrics").status, 401)

    def test_ownership(self):
        fid = self.upload("alice")
        self.assertEqual(self.d.get("/v1/files/" + fid, headers=self.auth("alice")).status, 200)
        self.assertEqual(self.d.get("/v1/files/" + fid, headers=self.auth("bob")).status, 404)
        self.assertEqual(self.d.get("/v1/files/" + fid, headers=self.auth("root")).status, 200)
        ids = [f["id"] for f in self.d.get("/v1/files", headers=self.auth("bob")).json()["data"]]
        self.assertNotIn(fid, ids)
        r = self.d.request("DELETE", "/v1/files/" + fid, headers=self.auth("bob"))
        self.assertEqual(r.status, 404)
        r = self.d.request("DELETE", "/v1/files/" + fid, headers=self.auth("alice"))
        self.assertEqual(r.status, 200, r)


class QueueLimitTest(unittest.TestCase):
    """max_queued_jobs: a new job past the limit is 429 with Retry-After, but a retry of an
    accepted request (same Idempotency-Key and body) still gets its job (200)."""

    def test_full_queue_and_idempotent_retry(self):
        with harness.Daemon(DAPOD, args=["--max-queued-jobs", "1", "--workers", "1"]) as d:
            with open(os.path.join(DATA, "addition.jsonl"), "rb") as f:
                body = f.read()
            r = d.request("POST", "/v1/files?purpose=train&filename=a.jsonl", body,
                          headers={"Content-Type": "application/x-ndjson"})
            fid = r.json()["id"]

            def job(steps):
                return {"model": "tiny", "training_file": fid,
                        "hyperparameters": {"total_steps": steps, "max_new_tokens": 2,
                                            "group_size": 2, "prompt_batch_size": 1}}
            ids = []
            first = d.post_json("/v1/jobs", job(100000))  # occupies the one worker
            self.assertEqual(first.status, 201, first)
            ids.append(first.json()["id"])
            for _ in range(100):  # wait until the worker took it
                if d.get("/v1/jobs/" + ids[0]).json()["status"] == "running":
                    break
                d.get("/v1/jobs/%s?wait=1" % ids[0])
            queued = d.post_json("/v1/jobs", job(2), headers={"Idempotency-Key": "k1"})
            self.assertEqual(queued.status, 201, queued)
            ids.append(queued.json()["id"])
            full = d.post_json("/v1/jobs", job(3))
            self.assertEqual(full.status, 429, full)
            self.assertEqual(full.header("Retry-After"), "30")
            self.assertIn("max_queued_jobs", full.json()["detail"])
            again = d.post_json("/v1/jobs", job(2), headers={"Idempotency-Key": "k1"})
            self.assertEqual(again.status, 200, again)
            self.assertEqual(again.json()["id"], ids[1])
            for i in ids:
                d.request("POST", "/v1/jobs/%s/cancel" % i, b"")


def main():
    global DAPOD
    ap = argparse.ArgumentParser()
    ap.add_argument("--dapod", required=True)
    args, rest = ap.parse_known_args()
    DAPOD = os.path.abspath(args.dapod)
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
