#!/usr/bin/python3
"""A new job's data is checked against its model once, and large datasets off the HTTP threads
(label api).

Creating a job renders and tokenizes every prompt of its datasets against its model (a prompt
too long for the context is refused at once, naming its line) and learns the longest prompt for
the memory plan. The check depends on the model's files, the datasets, the chat template and
max_new_tokens only, so the daemon keeps it (`dapod_job_checks_total{how="kept"}`); datasets over
`job_check_inline_bytes` are checked by the job checker thread while the request waits suspended
(`{how="offloaded"}`). Everything here is decided by counters and replies, never by timing.

Run: /usr/bin/python3 tests/api/test_job_checks.py --dapod build/server/dapod
"""

import argparse
import json
import os
import sys
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

DAPOD = None
ADDITION = os.path.join(HERE, "..", "data", "addition.jsonl")
HP = {"total_steps": 1, "max_new_tokens": 4, "group_size": 2, "prompt_batch_size": 2}


def checks(d):
    out = {}
    for line in d.get("/metrics").body.decode().splitlines():
        if line.startswith("dapod_job_checks_total{how=\""):
            how = line.split('"')[1]
            out[how] = int(float(line.split()[-1]))
    return out


def upload(d, data):
    r = d.request("POST", "/v1/files?purpose=fine-tune&filename=d.jsonl", body=data,
                  headers={"Content-Type": "application/x-ndjson"})
    assert r.status == 201, r
    return r.json()["id"]


def create(d, spec, key=None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Idempotency-Key"] = key
    return d.request("POST", "/v1/jobs", body=json.dumps(spec).encode(), headers=headers,
                     timeout=120)


def spec(file_id, **hp):
    return {"model": "tiny", "training_file": file_id, "judge": {"type": "math"}, "seed": 1,
            "hyperparameters": dict(HP, **hp)}


class Offloaded(unittest.TestCase):
    """job_check_inline_bytes 0: every check runs on the checker thread."""

    @classmethod
    def setUpClass(cls):
        cls.d = harness.Daemon(DAPOD, ("--workers", "1", "--blas-threads", "1",
                                       "--job-check-inline-bytes", "0", "--http-threads", "2"))
        cls.d.start()
        with open(ADDITION, "rb") as f:
            cls.addition = f.read()

    @classmethod
    def tearDownClass(cls):
        rc = cls.d.stop()
        cls.d.cleanup()
        assert rc == 0, rc

    def test_checked_once_on_the_checker_thread_then_kept(self):
        fid = upload(self.d, self.addition)
        before = checks(self.d)
        r = create(self.d, spec(fid))
        self.assertEqual(r.status, 201, r)
        self.assertGreater(r.json()["memory"]["total_bytes"], 0)
        after = checks(self.d)
        self.assertEqual(after["ran"] - before["ran"], 1)
        self.assertEqual(after["offloaded"] - before["offloaded"], 1)
        # the same model, data, template and max_new_tokens: the kept check answers
        r2 = create(self.d, spec(fid, total_steps=2, learning_rate=0.002))
        self.assertEqual(r2.status, 201, r2)
        again = checks(self.d)
        self.assertEqual(again["ran"], after["ran"])
        self.assertEqual(again["kept"] - after["kept"], 1)
        self.assertEqual(r2.json()["memory"]["for"], r.json()["memory"]["for"])
        # max_new_tokens changes what fits the context: checked again
        r3 = create(self.d, spec(fid, max_new_tokens=6))
        self.assertEqual(r3.status, 201, r3)
        self.assertEqual(checks(self.d)["ran"] - again["ran"], 1)
        for j in (r, r2, r3):
            self.d.request("POST", "/v1/jobs/%s/cancel" % j.json()["id"])

    def test_problems_found_off_thread_are_named_and_kept(self):
        lines = [json.dumps({"prompt": "What is 1+1?", "answer": "2"}),
                 json.dumps({"prompt": "1+" * 400 + "1?", "answer": "401"})]
        fid = upload(self.d, ("\n".join(lines) + "\n").encode())
        before = checks(self.d)
        for attempt in range(2):
            r = create(self.d, spec(fid))
            self.assertEqual(r.status, 422, r)
            errs = r.json()["errors"]
            self.assertEqual([e["field"] for e in errs], ["training_file"], errs)
            self.assertIn("line 2", errs[0]["message"])
        after = checks(self.d)
        self.assertEqual(after["ran"] - before["ran"], 1, "the second refusal is the kept check")
        self.assertEqual(after["kept"] - before["kept"], 1)

    def test_concurrent_creations_and_an_idempotent_retry(self):
        fids = [upload(self.d, self.addition + b"\n" * (i + 1)) for i in range(4)]
        out = [None] * 4

        def one(i):
            out[i] = create(self.d, spec(fids[i]), key="k-%d" % i)

        ts = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual([o.status for o in out], [201] * 4, out)
        retry = create(self.d, spec(fids[0]), key="k-0")
        self.assertEqual(retry.status, 200, retry)
        self.assertEqual(retry.json()["id"], out[0].json()["id"])
        for o in out:
            self.d.request("POST", "/v1/jobs/%s/cancel" % o.json()["id"])


class Inline(unittest.TestCase):
    """The default (1 MiB): a small dataset is checked on the request's own thread."""

    def test_small_dataset_checked_inline(self):
        d = harness.Daemon(DAPOD, ("--workers", "1", "--blas-threads", "1"))
        try:
            d.start()
            with open(ADDITION, "rb") as f:
                fid = upload(d, f.read())
            r = create(d, spec(fid))
            self.assertEqual(r.status, 201, r)
            c = checks(d)
            self.assertEqual((c["ran"], c["kept"], c["offloaded"]), (1, 0, 0))
            d.request("POST", "/v1/jobs/%s/cancel" % r.json()["id"])
            self.assertEqual(d.stop(), 0, d.log())
        finally:
            d.cleanup()


def main():
    global DAPOD
    ap = argparse.ArgumentParser()
    ap.add_argument("--dapod", required=True)
    args, rest = ap.parse_known_args()
    DAPOD = os.path.abspath(args.dapod)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
