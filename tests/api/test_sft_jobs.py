#!/usr/bin/python3
"""Supervised jobs through the daemon (issue 27; label api):
- a file of {"prompt", "completion"} lines (invalid as a DAPO file: no "answer") trains a
  `"method": "supervised"` job: the job object shows method "supervised", judge null, every
  supervised knob resolved and total_steps = ceil(lines / batch_size) * epochs; it succeeds and
  its metrics carry train/loss and train/mean_token_accuracy, its validation valid/loss;
- a DAPO job's object shows method "dapo";
- refusals name the field: an unknown method, a DAPO knob on a
  supervised job, a judge on it, a bad line of its file (by line and field).

Run: /usr/bin/python3 tests/api/test_sft_jobs.py --dapod build/server/dapod
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_jobs  # noqa: E402

SUMS = "".join(json.dumps({"prompt": "%d+%d=" % (a, b), "completion": str(a + b)}) + "\n"
               for a in range(5) for b in range(5)).encode()
SFT_HP = {"batch_size": 8, "epochs": 2, "learning_rate": 0.003, "eval_every": 2}


class SupervisedJobs(test_jobs.DaemonCase):
    def sft(self, hp=None, file_id=None, **body):
        b = {"method": "supervised", "model": "tiny",
             "training_file": file_id or self.upload(SUMS)["id"],
             "hyperparameters": dict(SFT_HP if hp is None else hp)}
        b.update(body)
        return self.d.post_json("/v1/jobs", b)

    def test_supervised_job(self):
        fid = self.upload(SUMS)["id"]
        r = self.sft(file_id=fid, validation_file=fid)
        self.assertEqual(r.status, 201, r)
        j = r.json()
        self.assertEqual(j["method"], "supervised")
        self.assertIsNone(j["judge"])
        self.assertEqual(j["total_steps"], 8)  # ceil(25 / 8) * 2
        self.assertEqual(j["hyperparameters"], {
            "epochs": 2, "batch_size": 8, "learning_rate": 0.003, "lr_schedule": "linear",
            "lr_warmup_steps": 0, "max_sequence_tokens": 2048, "truncate": False,
            "weight_decay": 0.0, "grad_clip": 1.0, "adam_beta1": 0.9, "adam_beta2": 0.999,
            "adam_eps": 1e-8, "checkpoint_every": 0, "keep_checkpoints": 0, "eval_every": 2,
            "micro_batch_tokens": 1024})
        j = self.wait_status(j["id"], ("succeeded", "failed"))
        self.assertEqual(j["status"], "succeeded", j)
        self.assertEqual(j["step"], 8)
        m = j["latest_metrics"]
        for k in ("train/loss", "train/mean_token_accuracy", "train/tokens", "learning_rate",
                  "grad_norm"):
            self.assertIn(k, m)
        ev = self.assertJson(self.d.get("/v1/jobs/%s/metrics" % j["id"]), 200)
        self.assertIn("valid/loss", json.dumps(ev))

    def test_dapo_job_shows_method(self):
        j = self.create_ok()
        self.assertEqual(j["method"], "dapo")

    def test_refusals(self):
        fid = self.upload(SUMS)["id"]
        for body, field, part in (
                ({"method": "rl"}, "method", "expected"),
                ({"hyperparameters": {"group_size": 4}}, "hyperparameters.group_size",
                 "not a hyperparameter of method supervised"),
                ({"judge": {"type": "math"}}, "judge", "no judge")):
            r = self.sft(file_id=fid, **body)
            p = self.assertProblem(r, 422, "validation_failed")
            self.assertFields(p, field)
            msg = [e["message"] for e in p["errors"] if e["field"] == field][0]
            self.assertIn(part, msg)
        bad = (json.dumps({"prompt": "1+1=", "completion": "2"}) + "\n" +
               json.dumps({"prompt": "1+2=", "completion": "3", "weight": 1}) + "\n").encode()
        r = self.sft(file_id=self.upload(bad)["id"])
        p = self.assertProblem(r, 422, "validation_failed")
        self.assertFields(p, "training_file")
        msg = [e["message"] for e in p["errors"] if e["field"] == "training_file"][0]
        self.assertIn("line 2: field 'weight': unknown", msg)


if __name__ == "__main__":
    sys.exit(test_jobs.main())  # --dapod, then this module's tests
