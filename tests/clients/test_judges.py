#!/usr/bin/python3
"""The example judges end to end (label clients). The C judge (clients/judges/c_judge.c) is
first checked on hand-written cases over HTTP (its rule, its 400s, /stats); then a short real
job runs through the daemon against each judge (the C one and math_judge.py): the job succeeds,
the judge saw every sampled response of every step (its own counters against the rollouts
files), and every rollout's raw reward is the judge's verdict recomputed here (for the C judge
by an independent Python version of its rule), so the rewards did arrive; the metrics' raw
reward mean is the rollouts' mean.

Run: /usr/bin/python3 tests/clients/test_judges.py --dapod DAPOD --c-judge DAPOD_C_JUDGE
"""

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import harness  # noqa: E402

sys.path.insert(0, os.path.join(common.ROOT, "clients", "judges"))
import math_judge  # noqa: E402

DAPOD = C_JUDGE = None
NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
WS = " \t\r\n\v\f"


def c_rule(response, answer):
    """The C judge's rule, written again from its README: (reward, correct)."""
    a = (answer or "").strip(WS)
    if NUMBER.fullmatch(a):
        found = NUMBER.findall(response)
        if not found:
            return -1.0, False
        ok = float(found[-1]) == float(a)
        return (1.0 if ok else -0.5), ok
    ok = response.strip(WS) == a
    return (1.0 if ok else -1.0), ok


class JudgeServer:
    def __init__(self, argv):
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  preexec_fn=harness._die_with_parent)
        line = self.p.stdout.readline().decode().strip()
        if not line.isdigit():
            self.p.kill()
            raise RuntimeError("judge did not print its port: %r %s"
                               % (line, self.p.stderr.read().decode()))
        self.port = int(line)

    def request(self, method, path, body=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            c.request(method, path, body=body,
                      headers={"Content-Type": "application/json"} if body else {})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def stop(self):
        self.p.terminate()
        try:
            rc = self.p.wait(timeout=20)
        finally:
            if self.p.poll() is None:
                self.p.kill()
                self.p.wait()
            self.p.stdout.close()
            self.p.stderr.close()
        return rc


class CJudgeUnit(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.j = JudgeServer([C_JUDGE, "--port", "0"])

    @classmethod
    def tearDownClass(cls):
        rc = cls.j.stop()
        assert rc == 0, "dapod-c-judge exited %s on SIGTERM" % rc

    def score(self, items):
        st, body = self.j.request("POST", "/score", json.dumps(
            {"job_id": "job-x", "step": 1, "items": items}))
        self.assertEqual(st, 200, body)
        return {r["id"]: r for r in json.loads(body)["results"]}

    def test_rule_on_hand_written_cases(self):
        cases = [  # response, answer, reward, correct
            ("71+10 = 81", "81", 1.0, True),
            ("81.0", "81", 1.0, True),
            ("it is 80", "81", -0.5, False),
            ("-3 then 81 then -5", "-5", 1.0, True),
            ("no digits here", "81", -1.0, False),
            ("12.5.7", "5.7", -0.5, False),  # the numbers are 12.5 and 7
            ("  Paris \n", "Paris", 1.0, True),
            ("paris", "Paris", -1.0, False),
            ("", "", 1.0, True),
        ]
        items = [{"id": str(i), "group": 0, "prompt": "p", "response": r, "answer": a,
                  "metadata": None, "response_tokens": 3, "finish_reason": "stop"}
                 for i, (r, a, _, _) in enumerate(cases)]
        got = self.score(items)
        for i, (r, a, reward, correct) in enumerate(cases):
            self.assertEqual(c_rule(r, a), (reward, correct), "python rule, case %d" % i)
            self.assertEqual((got[str(i)]["reward"], got[str(i)]["correct"]), (reward, correct),
                             "case %d: %r vs %r" % (i, r, a))

    def test_bad_requests_are_400_and_counted(self):
        st0, b0 = self.j.request("GET", "/stats")
        bad0 = json.loads(b0)["bad_requests"]
        for body in (b"not json", b"[]", b'{"items": 3}',
                     b'{"items": [{"id": 1, "response": "x", "answer": "y"}]}',
                     b'{"items": [{"id": "1", "answer": "y"}]}'):
            st, out = self.j.request("POST", "/score", body)
            self.assertEqual(st, 400, body)
            self.assertIn("error", json.loads(out))
        st, _ = self.j.request("GET", "/nope")
        self.assertEqual(st, 404)
        st, b = self.j.request("GET", "/stats")
        self.assertEqual(json.loads(b)["bad_requests"], bad0 + 6)
        st, b = self.j.request("GET", "/healthz")
        self.assertEqual((st, json.loads(b)), (200, {"ok": True}))


class JudgesEndToEnd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = harness.Daemon(DAPOD, ("--workers", "1", "--blas-threads", "1"))
        try:
            cls.d.start()
            cls.file_id = common.upload(cls.d)
        except BaseException:
            cls.d.cleanup()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            rc = cls.d.stop()
            assert rc == 0, "dapod exited %s:\n%s" % (rc, cls.d.log())
        finally:
            cls.d.cleanup()

    def run_job(self, url):
        hp = {"total_steps": 2, "checkpoint_every": 0, "max_new_tokens": 6, "group_size": 4,
              "prompt_batch_size": 4}
        judge = {"type": "http", "url": url, "timeout_ms": 30000, "max_batch": 8}
        r = self.d.post_json("/v1/jobs", common.job_spec(self.file_id, hp, judge))
        self.assertEqual(r.status, 201, r)
        job = common.wait_terminal(self.d, r.json()["id"])
        self.assertEqual(job["status"], "succeeded", job)
        rollouts = {}
        for step in (1, 2):
            body = self.d.get("/v1/jobs/%s/rollouts?step=%d" % (job["id"], step)).body
            rollouts[step] = [json.loads(l) for l in body.decode().splitlines() if l.strip()]
            self.assertTrue(rollouts[step])
        metrics = {m["step"]: m for m in common.metrics_rows(self.d, job["id"])}
        for step, rows in rollouts.items():
            mean = sum(x["reward_raw"] for x in rows) / len(rows)
            self.assertAlmostEqual(metrics[step]["reward/raw_mean"], mean, places=5)
        return job, rollouts

    def test_job_against_c_judge(self):
        j = JudgeServer([C_JUDGE, "--port", "0"])
        try:
            # First the daemon's judge test endpoint, as the README shows.
            r = self.d.post_json("/v1/judges/test", {
                "judge": {"type": "http", "url": "http://127.0.0.1:%d/score" % j.port},
                "items": [{"response": "so 2+3 = 5", "answer": "5"},
                          {"response": "4", "answer": "5"}]})
            self.assertEqual(r.status, 200, r)
            self.assertEqual([x["reward"] for x in r.json()["results"]], [1.0, -0.5])
            job, rollouts = self.run_job("http://127.0.0.1:%d/score" % j.port)
            st, b = j.request("GET", "/stats")
            stats = json.loads(b)
        finally:
            self.assertEqual(j.stop(), 0)
        all_rows = [x for rows in rollouts.values() for x in rows]
        self.assertEqual(stats["items"], 2 + len(all_rows))  # the 2 judge-test items too
        for x in all_rows:
            reward, correct = c_rule(x["response"], x["answer"])
            self.assertEqual(x["reward_raw"], reward, x)
            self.assertEqual(x["correct"], correct, x)
        values = sorted({x["reward_raw"] for x in all_rows})
        self.assertGreater(len(values), 1, "every reward was %s: nothing to learn from" % values)

    def test_job_against_math_judge(self):
        j = JudgeServer(["/usr/bin/python3",
                         os.path.join(common.ROOT, "clients", "judges", "math_judge.py"),
                         "--port", "0"])
        try:
            job, rollouts = self.run_job("http://127.0.0.1:%d/score" % j.port)
            st, b = j.request("GET", "/log")
            log = json.loads(b)["requests"]
        finally:
            j.stop()
        all_rows = [x for rows in rollouts.values() for x in rows]
        self.assertEqual(sum(r["n"] for r in log if r["job_id"] == job["id"]), len(all_rows))
        self.assertEqual({r["step"] for r in log}, {1, 2})
        for x in all_rows:
            ok = math_judge.same(math_judge.extract(x["response"]), x["answer"])
            self.assertEqual(x["reward_raw"], 1.0 if ok else -1.0, x)
            self.assertEqual(x["correct"], ok, x)


def main():
    global DAPOD, C_JUDGE
    ap = argparse.ArgumentParser()
    ap.add_argument("--dapod", required=True)
    ap.add_argument("--c-judge", required=True)
    args, rest = ap.parse_known_args()
    DAPOD, C_JUDGE = os.path.abspath(args.dapod), os.path.abspath(args.c_judge)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
