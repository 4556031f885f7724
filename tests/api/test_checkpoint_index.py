#!/usr/bin/python3
"""A checkpoint indexed after a crash lists what its folder holds (label api).

The daemon indexes a checkpoint when the runner reports it; a process that dies after writing the
folder and before indexing it leaves the folder unlisted, and the next start indexes it from the
folder (the worker's recovery). Both must list the same files, by the one list of checkpoint
files (core/engine/checkpoint.h ckpt_file_names): before that list was one, recovery's copy lacked
tokenizer_config.json, so such a checkpoint's chat template could not be downloaded (404) and
`dapoctl download` dropped it.

The crash is reproduced exactly, not by timing: a job on a model folder with a
tokenizer_config.json runs to its end; the daemon stops; the last checkpoint's index row and
event are deleted and the job set back to running, as a process killed between writing the
folder and indexing it leaves them; a new daemon on the same data recovers the job.

Run: /usr/bin/python3 tests/api/test_checkpoint_index.py --dapod build/server/dapod
"""

import argparse
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

DAPOD = None
ADDITION = os.path.join(HERE, "..", "data", "addition.jsonl")
TOKENIZER_CONFIG = {"model_max_length": 512, "clean_up_tokenization_spaces": False,
                    "chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"}
STEPS = 3


def wait_ended(test, d, job_id):
    """The job object once its status is terminal (long-polls; fails after 300 s)."""
    deadline = time.monotonic() + 300
    while True:
        job = d.get("/v1/jobs/%s?wait=10" % job_id, timeout=30).json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        test.assertLess(time.monotonic(), deadline, "job %s did not end" % job_id)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class CheckpointIndex(unittest.TestCase):
    def test_a_checkpoint_indexed_after_a_crash_lists_every_file(self):
        args = ("--workers", "1", "--blas-threads", "1")
        d = harness.Daemon(DAPOD, args)
        data_dir = d.data_dir
        folder = os.path.join(d.models_dir, "tiny-tc")
        subprocess.run([DAPOD, "save-preset", "tiny", folder], check=True,
                       stdout=subprocess.DEVNULL)
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
            json.dump(TOKENIZER_CONFIG, f)
        d2 = None
        try:
            d.start()
            with open(ADDITION, "rb") as f:
                r = d.request("POST", "/v1/files?purpose=fine-tune&filename=a.jsonl", body=f.read(),
                              headers={"Content-Type": "application/x-ndjson"})
            self.assertEqual(r.status, 201, r)
            spec = {"model": "tiny-tc", "training_file": r.json()["id"], "judge": {"type": "math"},
                    "seed": 1, "hyperparameters": {"total_steps": STEPS, "checkpoint_every": 1,
                                                   "max_new_tokens": 4, "group_size": 4,
                                                   "prompt_batch_size": 2,
                                                   "on_sampling_shortfall": "partial"}}
            r = d.request("POST", "/v1/jobs", body=json.dumps(spec).encode(),
                          headers={"Content-Type": "application/json"})
            self.assertEqual(r.status, 201, r)
            job_id = r.json()["id"]
            job = wait_ended(self, d, job_id)
            self.assertEqual(job["status"], "succeeded", job)
            listed = {c["step"]: c for c in
                      d.get("/v1/jobs/%s/checkpoints" % job_id).json()["data"]}
            self.assertEqual(sorted(listed), list(range(STEPS + 1)))
            self.assertEqual(d.stop(), 0, d.log())

            # the crash: the folder of the last step is written, its index row and event are not
            db = sqlite3.connect(os.path.join(data_dir, "dapod.sqlite3"))
            with db:
                n = db.execute("DELETE FROM checkpoints WHERE job_id = ? AND step = ?",
                               (job_id, STEPS)).rowcount
                self.assertEqual(n, 1)
                n = db.execute("DELETE FROM events WHERE job_id = ? AND type = 'checkpoint' AND "
                               "json_extract(data, '$.step') = ?", (job_id, STEPS)).rowcount
                self.assertEqual(n, 1)
                db.execute("UPDATE jobs SET status = 'running', finished_at = NULL WHERE id = ?",
                           (job_id,))
            db.close()

            d2 = harness.Daemon(DAPOD, args, data_dir=data_dir)
            d2.models_dir = d.models_dir
            d2.start()
            job = wait_ended(self, d2, job_id)
            self.assertEqual(job["status"], "succeeded", job)

            again = {c["step"]: c for c in
                     d2.get("/v1/jobs/%s/checkpoints" % job_id).json()["data"]}
            self.assertIn(STEPS, again, "recovery did not index the last checkpoint")
            on_disk = os.path.join(data_dir, "jobs", job_id, "checkpoints", "step-%d" % STEPS)
            want = {name: (os.path.getsize(os.path.join(on_disk, name)),
                           sha256(os.path.join(on_disk, name)))
                    for name in os.listdir(on_disk)}
            self.assertIn("tokenizer_config.json", want)
            got = {f["name"]: (f["bytes"], f["sha256"]) for f in again[STEPS]["files"]}
            self.assertEqual(got, want, "the recovered index lists what the folder holds")
            # the same names as the checkpoint indexed when it was written
            self.assertEqual([f["name"] for f in again[STEPS]["files"]],
                             [f["name"] for f in listed[STEPS]["files"]])
            r = d2.get("/v1/jobs/%s/checkpoints/%d/tokenizer_config.json" % (job_id, STEPS))
            self.assertEqual(r.status, 200, r)
            self.assertEqual(json.loads(r.body), TOKENIZER_CONFIG)
        finally:
            if d2:
                self.assertEqual(d2.stop(), 0, d2.log())
                d2.cleanup()
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
