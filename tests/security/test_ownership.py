#!/usr/bin/python3
"""Ownership over every route (label security): alice uploads a file and trains a small job to
the end (checkpoints, rollouts, a fine-tuned model); then EVERY operation of openapi.yaml is called
on alice's resources with bob's key (another non-admin key), alice's and root's (admin). Bob gets
404 problem+json (never 403, never the data) for every one of them, and lists without alice's
items; alice and root get the resource. An operation of openapi.yaml missing from the table below
fails the test, so a new route cannot skip the audit.

Run: /usr/bin/python3 tests/security/test_ownership.py --dapod build/server/dapod
"""

import argparse
import hashlib
import json
import os
import re
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "api"))
import harness  # noqa: E402

DAPOD = None
KEYS = {"alice": "alice-key-0001", "bob": "bob-key-0002", "root": "root-key-0003"}
NO_SUCH_JOB = "job-00000000-0000-4000-8000-000000000000"
HP = {"total_steps": 2, "checkpoint_every": 1, "max_new_tokens": 4, "group_size": 4,
      "prompt_batch_size": 2}
GRADER = {"type": "string_check", "name": "g", "input": "{{sample.output_text}}",
          "reference": "{{item.a}}", "operation": "eq"}


def sha(k):
    return hashlib.sha256(k.encode()).hexdigest()


def openapi_operations():
    """(METHOD, path template) of every operation in openapi.yaml, read with a line scanner (the
    file's layout: paths at two spaces, methods at four)."""
    ops, path, in_paths = [], None, False
    with open(os.path.join(ROOT, "openapi.yaml")) as f:
        for line in f:
            if re.match(r"^paths:\s*$", line):
                in_paths = True
                continue
            if in_paths and re.match(r"^\S", line):
                break
            m = re.match(r"^  (/\S*):\s*$", line)
            if in_paths and m:
                path = m.group(1)
                continue
            m = re.match(r"^    (get|put|post|delete|patch|head|options):\s*$", line)
            if in_paths and path and m:
                ops.append((m.group(1).upper(), path))
    return ops


class Ownership(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        spec = "alice:%s,bob:%s,root:%s:admin" % (sha(KEYS["alice"]), sha(KEYS["bob"]),
                                                 sha(KEYS["root"]))
        cls.d = harness.Daemon(DAPOD, args=["--api-keys", spec, "--workers", "1"])
        cls.d.start()
        try:
            cls.prepare()
        except Exception:
            cls.d.cleanup()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()
        cls.d.cleanup()

    @classmethod
    def req(cls, who, method, path, body=None, ctype="application/json", timeout=60):
        h = {"Authorization": "Bearer " + KEYS[who]} if who else {}
        if body is not None:
            h["Content-Type"] = ctype
            if not isinstance(body, bytes):
                body = json.dumps(body).encode()
        return cls.d.request(method, path, body=body, headers=h, timeout=timeout)

    @classmethod
    def prepare(cls):
        with open(os.path.join(ROOT, "tests", "data", "addition.jsonl"), "rb") as f:
            cls.data = f.read()
        r = cls.req("alice", "POST", "/v1/files?purpose=train&filename=a.jsonl", cls.data,
                    "application/x-ndjson")
        assert r.status == 201, r
        cls.fid = r.json()["id"]
        r = cls.req("alice", "POST", "/v1/jobs", {"model": "tiny", "training_file": cls.fid,
                                                   "hyperparameters": HP, "seed": 3})
        assert r.status == 201, r
        cls.jid = r.json()["id"]
        end = time.monotonic() + 240
        while True:
            j = cls.req("alice", "GET", "/v1/jobs/%s?wait=10" % cls.jid).json()
            if j["status"] == "succeeded":
                break
            assert j["status"] in ("queued", "running"), j
            assert time.monotonic() < end, "the job did not finish: %s" % j
        cls.model = j["fine_tuned_model"]
        cls.step = j["checkpoints"][-1]

    def calls(self):
        """(METHOD, template) -> (path, body or None, kind). kind: "owned" (bob 404, owner and
        admin succeed), "list" (bob's list lacks alice's item), "open" (no owned resource: every
        key is served)."""
        j, f, m, st = self.jid, self.fid, self.model, self.step
        judge = {"judge": {"type": "exact"}, "items": [{"response": "4", "answer": "4"}]}
        return {
            ("GET", "/healthz"): ("/healthz", None, "open"),
            ("GET", "/readyz"): ("/readyz", None, "open"),
            ("GET", "/metrics"): ("/metrics", None, "open"),
            ("POST", "/v1/files"): None,  # creates: test_create_with_anothers_ids
            ("GET", "/v1/files"): ("/v1/files?limit=100", None, ("list", f)),
            ("POST", "/v1/files/validate"): None,  # stores nothing, owns nothing
            ("GET", "/v1/files/{file_id}"): ("/v1/files/" + f, None, "owned"),
            ("DELETE", "/v1/files/{file_id}"): ("/v1/files/" + f, None, "owned-delete"),
            ("GET", "/v1/files/{file_id}/content"): ("/v1/files/%s/content" % f, None, "owned"),
            ("GET", "/v1/models"): ("/v1/models?limit=100", None, ("list", m)),
            ("GET", "/v1/models/{model_id}"): ("/v1/models/" + m, None, "owned"),
            ("POST", "/v1/judges/test"): ("/v1/judges/test", judge, "open"),
            ("POST", "/v1/jobs"): None,  # creates: test_create_with_anothers_ids
            ("GET", "/v1/jobs"): ("/v1/jobs?limit=100", None, ("list", j)),
            ("GET", "/v1/jobs/{job_id}"): ("/v1/jobs/" + j, None, "owned"),
            ("DELETE", "/v1/jobs/{job_id}"): ("/v1/jobs/" + j, None, "owned-delete"),
            ("POST", "/v1/jobs/{job_id}/cancel"): ("/v1/jobs/%s/cancel" % j, None, "owned-state"),
            ("POST", "/v1/jobs/{job_id}/pause"): ("/v1/jobs/%s/pause" % j, None, "owned-state"),
            ("POST", "/v1/jobs/{job_id}/resume"): ("/v1/jobs/%s/resume" % j, None, "owned-state"),
            ("GET", "/v1/jobs/{job_id}/events"): ("/v1/jobs/%s/events" % j, None, "owned"),
            ("GET", "/v1/jobs/{job_id}/events/stream"):
                ("/v1/jobs/%s/events/stream" % j, None, "owned"),
            ("GET", "/v1/jobs/{job_id}/metrics"): ("/v1/jobs/%s/metrics" % j, None, "owned"),
            ("GET", "/v1/jobs/{job_id}/checkpoints"):
                ("/v1/jobs/%s/checkpoints" % j, None, "owned"),
            ("GET", "/v1/jobs/{job_id}/checkpoints/{step}/{file}"):
                ("/v1/jobs/%s/checkpoints/%d/model.safetensors" % (j, st), None, "owned"),
            ("HEAD", "/v1/files/{file_id}/content"): ("/v1/files/%s/content" % f, None, "owned"),
            ("HEAD", "/v1/jobs/{job_id}/checkpoints/{step}/{file}"):
                ("/v1/jobs/%s/checkpoints/%d/model.safetensors" % (j, st), None, "owned"),
            ("GET", "/v1/jobs/{job_id}/rollouts"):
                ("/v1/jobs/%s/rollouts?step=%d" % (j, st), None, "owned"),
            # the OpenAI-compatible surface (its errors are OpenAI's {"error": ...})
            ("POST", "/v1/fine_tuning/jobs"): None,  # creates: test_create_with_anothers_ids
            ("GET", "/v1/fine_tuning/jobs"): ("/v1/fine_tuning/jobs?limit=100", None, ("list", j)),
            ("GET", "/v1/fine_tuning/jobs/{fine_tuning_job_id}"):
                ("/v1/fine_tuning/jobs/" + j, None, "owned"),
            ("POST", "/v1/fine_tuning/jobs/{fine_tuning_job_id}/cancel"):
                ("/v1/fine_tuning/jobs/%s/cancel" % j, None, "owned-state"),
            ("POST", "/v1/fine_tuning/jobs/{fine_tuning_job_id}/pause"):
                ("/v1/fine_tuning/jobs/%s/pause" % j, None, "owned-state"),
            ("POST", "/v1/fine_tuning/jobs/{fine_tuning_job_id}/resume"):
                ("/v1/fine_tuning/jobs/%s/resume" % j, None, "owned-state"),
            ("GET", "/v1/fine_tuning/jobs/{fine_tuning_job_id}/events"):
                ("/v1/fine_tuning/jobs/%s/events" % j, None, "owned"),
            ("GET", "/v1/fine_tuning/jobs/{fine_tuning_job_id}/checkpoints"):
                ("/v1/fine_tuning/jobs/%s/checkpoints" % j, None, "owned"),
            ("POST", "/v1/fine_tuning/alpha/graders/run"):
                ("/v1/fine_tuning/alpha/graders/run", {"grader": GRADER, "model_sample": "4",
                                                       "item": {"a": "4"}}, "open"),
            ("POST", "/v1/fine_tuning/alpha/graders/validate"):
                ("/v1/fine_tuning/alpha/graders/validate", {"grader": GRADER}, "open"),
            ("POST", "/v1/chat/completions"):
                ("/v1/chat/completions", {"model": m, "max_tokens": 2,
                                          "messages": [{"role": "user", "content": "1+1="}]},
                 ("body", "model", m, NO_SUCH_JOB + ":step-%d" % st)),
            # a body naming another key's model: the same answer as a model that does not exist
            ("POST", "/v1/completions"):
                ("/v1/completions", {"model": m, "prompt": "1+1=", "max_tokens": 2},
                 ("body", "model", m, NO_SUCH_JOB + ":step-%d" % st)),
        }

    def assertNotFound(self, r, what):
        self.assertEqual(r.status, 404, "%s: %r" % (what, r))
        if what.startswith("HEAD "):
            return
        if re.match(r"\S+ /v1/(fine_tuning|chat)/", what):  # OpenAI's error shape there
            self.assertTrue(r.header("Content-Type").startswith("application/json"), what)
            self.assertEqual(r.json()["error"]["code"], "not_found", what)
        else:
            self.assertTrue(r.header("Content-Type").startswith("application/problem+json"),
                            what)
            self.assertEqual(r.json()["status"], 404, what)
        # nothing of the resource leaks into the problem
        self.assertNotIn(self.data[:40], r.body, what)

    def test_every_route_is_covered(self):
        ops = openapi_operations()
        self.assertGreater(len(ops), 20, ops)
        table = self.calls()
        missing = [op for op in ops if op not in table]
        self.assertEqual(missing, [], "operations of openapi.yaml without an ownership check")

    def test_another_key_gets_404_owner_and_admin_succeed(self):
        checked = 0
        for (method, tmpl), call in sorted(self.calls().items()):
            if call is None:
                continue
            path, body, kind = call
            what = "%s %s" % (method, tmpl)
            with self.subTest(op=what):
                if isinstance(kind, tuple) and kind[0] == "body":
                    # bob's answer is the one for an id that does not exist (no oracle), and
                    # names the field; alice and root are served
                    _, field, mine, none = kind
                    r = self.req("bob", method, path, body)
                    other = json.loads(json.dumps(body).replace(mine, none))
                    r0 = self.req("bob", method, path, other)
                    self.assertIn(r.status, (404, 422), "%s as bob: %r" % (what, r))
                    self.assertEqual((r.status, r.body.replace(mine.encode(), none.encode())),
                                     (r0.status, r0.body), what)
                    self.assertIn(field, r.body.decode(), what)
                    for who in ("alice", "root"):
                        r = self.req(who, method, path, body)
                        self.assertEqual(r.status, 200, "%s as %s: %r" % (what, who, r))
                elif isinstance(kind, tuple):  # a list: alice's item is invisible to bob
                    key = "id"
                    for who, sees in (("bob", False), ("alice", True), ("root", True)):
                        r = self.req(who, method, path)
                        self.assertEqual(r.status, 200, "%s as %s: %r" % (what, who, r))
                        ids = [x[key] for x in r.json()["data"]]
                        self.assertEqual(kind[1] in ids, sees, "%s as %s: %s" % (what, who, ids))
                elif kind == "open":
                    for who in ("bob", "alice", "root"):
                        r = self.req(who, method, path, body)
                        self.assertEqual(r.status, 200, "%s as %s: %r" % (what, who, r))
                    r = self.req(None, method, path, body)
                    want = 200 if tmpl in ("/healthz", "/readyz") else 401
                    self.assertEqual(r.status, want, "%s without a key: %r" % (what, r))
                elif kind in ("owned", "owned-state"):
                    self.assertNotFound(self.req("bob", method, path, body), what + " as bob")
                    for who in ("alice", "root"):
                        r = self.req(who, method, path, body)
                        if kind == "owned":
                            self.assertEqual(r.status, 200, "%s as %s: %r" % (what, who, r))
                        else:  # the job has ended: a state conflict, not "no such job"
                            self.assertEqual(r.status, 409, "%s as %s: %r" % (what, who, r))
                    self.assertEqual(self.req(None, method, path, body).status, 401, what)
                elif kind == "owned-delete":  # bob's attempt must not delete anything
                    self.assertNotFound(self.req("bob", method, path), what + " as bob")
                    self.assertEqual(self.req("alice", "GET", path).status, 200, what)
                else:
                    self.fail("unknown kind %r" % (kind,))
                checked += 1
        self.assertGreaterEqual(checked, 24)

    def test_create_with_anothers_ids(self):
        """Bob cannot train on alice's file or from her model: the answer is the one for an id
        that does not exist. Uploads and validation are per key."""
        r = self.req("bob", "POST", "/v1/files/validate", self.data, "application/x-ndjson")
        self.assertEqual(r.status, 200, r)
        r = self.req("bob", "POST", "/v1/files?purpose=train&filename=b.jsonl", self.data,
                     "application/x-ndjson")
        self.assertEqual(r.status, 201, r)
        bob_file = r.json()["id"]
        none_file = "file-00000000-0000-4000-8000-000000000000"
        for field, mine, none in (("training_file", self.fid, none_file),
                                  ("validation_file", self.fid, none_file),
                                  ("model", self.model, NO_SUCH_JOB + ":step-%d" % self.step)):
            spec = {"model": "tiny", "training_file": bob_file, "hyperparameters": HP}
            spec[field] = mine
            r = self.req("bob", "POST", "/v1/jobs", spec)
            self.assertIn(r.status, (404, 422), r)
            self.assertIn(field, r.body.decode(), r)
            spec[field] = none
            r0 = self.req("bob", "POST", "/v1/jobs", spec)
            self.assertEqual((r.status, r.body.replace(mine.encode(), none.encode())),
                             (r0.status, r0.body), field)

        # the OpenAI-compatible create: the same, in OpenAI's error shape
        for field, mine, none in (("training_file", self.fid, none_file),
                                  ("validation_file", self.fid, none_file)):
            spec = {"model": "tiny", "training_file": bob_file,
                    "method": {"type": "reinforcement", "reinforcement": {"grader": GRADER}}}
            spec[field] = mine
            r = self.req("bob", "POST", "/v1/fine_tuning/jobs", spec)
            self.assertEqual(r.status, 400, r)
            self.assertIn(field, r.json()["error"]["message"], r)
            spec[field] = none
            r0 = self.req("bob", "POST", "/v1/fine_tuning/jobs", spec)
            self.assertEqual((r.status, r.body.replace(mine.encode(), none.encode())),
                             (r0.status, r0.body), field)

        self.assertNotFound(self.req("alice", "GET", "/v1/files/" + bob_file), "bob's file")
        self.assertEqual(self.req("root", "GET", "/v1/files/" + bob_file).status, 200)

    def test_z_owner_deletes(self):
        """Last (z): the owner's delete works where bob's was 404."""
        r = self.req("alice", "DELETE", "/v1/jobs/" + self.jid)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(self.req("root", "GET", "/v1/jobs/" + self.jid).status, 404)
        r = self.req("alice", "DELETE", "/v1/files/" + self.fid)
        self.assertEqual(r.status, 200, r)


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
