#!/usr/bin/python3
"""DPO jobs through OpenAI's surface, POST /v1/fine_tuning/jobs with `method.type: "dpo"`
(issue 27; label api; docs/OPENAI.md "DPO jobs"):
- the job object: method.dpo.hyperparameters and the top-level hyperparameters resolved
  (beta, batch_size, learning_rate_multiplier, n_epochs; "auto" as 0.1, 8, 1, 3), the native
  job's knobs (method dpo, beta, batch_size, epochs, learning_rate = 1e-5 x multiplier),
  total_steps, trained_tokens equal to the sum of the native train/tokens, fine_tuned_model;
- metrics events carry train_loss and train_rewards_accuracy / _margin / _chosen / _rejected
  (valid_loss, valid_rewards_... for evaluations) equal to the native metrics; checkpoints'
  metrics too; result_files[0] is a fine-tune-results file whose CSV rows are the native train/loss,
  rewards/accuracy, valid/loss and valid/rewards/accuracy;
- refusals in OpenAI's error shape naming the field as sent: beta 3, beta 0, n_epochs 0, the
  top-level hyperparameters, two preferred outputs (the line and field in the message).

Run: /usr/bin/python3 tests/api/test_openai_dpo.py --dapod build/server/dapod
"""

import csv
import io
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_jobs  # noqa: E402


def pair(q, good, bad):
    return {"input": {"messages": [{"role": "user", "content": q}]},
            "preferred_output": [{"role": "assistant", "content": good}],
            "non_preferred_output": [{"role": "assistant", "content": bad}]}


# prefer the digit after the question's last digit to the one before it (mod 10)
PAIRS = "".join(json.dumps(pair("%d%d" % (a, b), str((b + 1) % 10), str((b + 9) % 10))) + "\n"
                for a in range(4) for b in range(5)).encode()
VALID = "".join(json.dumps(pair("%d%d" % (a, b), str((b + 1) % 10), str((b + 9) % 10))) + "\n"
                for a in range(5, 7) for b in range(3)).encode()


class OpenAIDpo(test_jobs.DaemonCase):
    def create(self, hp=None, method=None, **body):
        b = {"model": "tiny", "training_file": self.train_id,
             "method": method or {"type": "dpo", "dpo": {"hyperparameters": hp or {}}}}
        b.update(body)
        return self.d.post_json("/v1/fine_tuning/jobs", b)

    @classmethod
    def prepare(cls):
        cls.train_id = cls.upload(PAIRS)["id"]
        cls.valid_id = cls.upload(VALID)["id"]

    def oai_error(self, r, param, part):
        self.assertEqual(r.status, 400, r)
        e = r.json()["error"]
        self.assertEqual(e["type"], "invalid_request_error", e)
        self.assertEqual(e["param"], param, e)
        self.assertIn(part, e["message"], e)
        return e

    def test_1_job_events_checkpoints_results(self):
        hp = {"beta": 0.5, "batch_size": 8, "n_epochs": 2, "learning_rate_multiplier": 100}
        r = self.create(hp, validation_file=self.valid_id, seed=2, suffix="prefs")
        self.assertEqual(r.status, 200, r)
        j = r.json()
        want = {"batch_size": 8, "learning_rate_multiplier": 100.0, "n_epochs": 2, "beta": 0.5}
        self.assertEqual(j["method"], {"type": "dpo", "dpo": {"hyperparameters": want}})
        self.assertEqual(j["hyperparameters"], want)
        self.assertEqual(j["total_steps"], 6)  # ceil(20 / 8) * 2
        native = self.job(j["id"])
        self.assertEqual(native["method"], "dpo")
        nhp = native["hyperparameters"]
        self.assertEqual((nhp["batch_size"], nhp["epochs"], nhp["beta"], nhp["loss_type"],
                          nhp["eval_every"], nhp["checkpoint_every"]),
                         (8, 2, 0.5, "sigmoid", 1, 1))
        self.assertAlmostEqual(nhp["learning_rate"], 1e-3, delta=1e-12)
        self.wait_status(j["id"], ("succeeded", "failed"))
        j = self.assertJson(self.d.get("/v1/fine_tuning/jobs/" + j["id"]), 200)
        self.assertEqual(j["status"], "succeeded", j)
        self.assertEqual(j["fine_tuned_model"], "ft:tiny:dapod:prefs:%s" % j["id"])
        rows = self.assertJson(self.d.get("/v1/jobs/%s/metrics" % j["id"]), 200)
        train = {m["step"]: m for m in rows if "train/loss" in m}
        valid = {m["step"]: m for m in rows if "valid/loss" in m}
        self.assertEqual(sorted(train), list(range(1, 7)))
        self.assertEqual(sorted(valid), list(range(0, 7)))
        print("held-out (6 pairs) valid/rewards/accuracy by step: %s; margin at step 6 %.4f"
              % (" ".join("%.3f" % valid[s]["valid/rewards/accuracy"] for s in range(7)),
                 valid[6]["valid/rewards/margin"]), file=sys.stderr)
        self.assertEqual(j["trained_tokens"], sum(m["train/tokens"] for m in train.values()))
        # the job learned something on the held-out pairs (not a learning test: see test_dpo_run)
        self.assertGreater(valid[6]["valid/rewards/margin"], 0)

        evs = self.assertJson(
            self.d.get("/v1/fine_tuning/jobs/%s/events?limit=100" % j["id"]), 200)["data"]
        seen_t, seen_v = set(), set()
        for e in evs:
            if e["type"] != "metrics":
                continue
            d = e["data"]
            self.assertEqual(d["total_steps"], 6)
            if "train_loss" in d:
                m = train[d["step"]]
                for k in ("accuracy", "margin", "chosen", "rejected"):
                    self.assertEqual(d["train_rewards_" + k], m["rewards/" + k])
                self.assertEqual(d["train_loss"], m["train/loss"])
                self.assertIn("rewards accuracy=", e["message"])
                seen_t.add(d["step"])
            else:
                m = valid[d["step"]]
                self.assertEqual(d["valid_loss"], m["valid/loss"])
                for k in ("accuracy", "margin", "chosen", "rejected"):
                    self.assertEqual(d["valid_rewards_" + k], m["valid/rewards/" + k])
                # an epoch's end (steps 3 and 6: 20 pairs, batch 8): the full validation
                if d["step"] in (3, 6):
                    self.assertEqual(d["full_valid_loss"], d["valid_loss"])
                    self.assertEqual(d["full_valid_rewards_accuracy"],
                                     m["full_valid/rewards/accuracy"])
                    self.assertEqual(d["full_valid_rewards_accuracy"], d["valid_rewards_accuracy"])
                else:
                    self.assertNotIn("full_valid_loss", d)
                seen_v.add(d["step"])
        self.assertEqual(sorted(seen_t), list(range(1, 7)))
        self.assertEqual(sorted(seen_v), list(range(0, 7)))

        cks = self.assertJson(
            self.d.get("/v1/fine_tuning/jobs/%s/checkpoints" % j["id"]), 200)["data"]
        self.assertEqual([c["step_number"] for c in cks], [6, 5, 4, 3, 2, 1, 0])
        for c in cks[:-1]:
            m = train[c["step_number"]]
            self.assertEqual(c["metrics"]["train_loss"], m["train/loss"], c)
            self.assertEqual(c["metrics"]["train_rewards_accuracy"], m["rewards/accuracy"], c)

        self.assertEqual(len(j["result_files"]), 1, j)
        fid = j["result_files"][0]
        self.assertEqual(self.assertJson(self.d.get("/v1/files/" + fid), 200)["purpose"],
                         "fine-tune-results")
        text = self.d.get("/v1/files/%s/content" % fid).body.decode()
        self.assertEqual(text.splitlines()[0],
                         "step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy")
        got = list(csv.DictReader(io.StringIO(text)))
        self.assertEqual([int(x["step"]) for x in got], list(range(1, 7)))
        for x in got:
            s = int(x["step"])
            self.assertEqual(float(x["train_loss"]), train[s]["train/loss"])
            self.assertEqual(float(x["train_accuracy"]), train[s]["rewards/accuracy"])
            self.assertEqual(float(x["valid_loss"]), valid[s]["valid/loss"])
            self.assertEqual(float(x["valid_mean_token_accuracy"]),
                             valid[s]["valid/rewards/accuracy"])

    def test_2_auto(self):
        r = self.create({"beta": "auto", "batch_size": "auto", "n_epochs": "auto",
                         "learning_rate_multiplier": "auto"})
        self.assertEqual(r.status, 200, r)
        j = r.json()
        self.assertEqual(j["hyperparameters"], {"batch_size": 8, "learning_rate_multiplier": 1.0,
                                                "n_epochs": 3, "beta": 0.1})
        self.assertEqual(j["total_steps"], 9)  # ceil(20 / 8) * 3
        self.assertEqual(self.job(j["id"])["hyperparameters"]["beta"], 0.1)
        self.d.post_json("/v1/fine_tuning/jobs/%s/cancel" % j["id"], {})

    def test_3_refusals(self):
        P = "method.dpo.hyperparameters."
        self.oai_error(self.create({"beta": 3}), P + "beta", "(0, 2]")
        self.oai_error(self.create({"beta": 0}), P + "beta", "(0, 2]")
        self.oai_error(self.create({"n_epochs": 0}), P + "n_epochs", "[1, 50]")
        self.oai_error(self.create({"label_smoothing": 0.7}), P + "label_smoothing",
                       "not in [0, 0.5)")
        self.oai_error(self.create(hyperparameters={"n_epochs": 2}), "hyperparameters",
                       "method.dpo.hyperparameters")
        self.oai_error(self.create(method={"type": "dpo", "dpo": {"beta": 1}}), "method.dpo.beta",
                       "unknown field")
        two = pair("q", "a", "b")
        two["preferred_output"].append({"role": "assistant", "content": "c"})
        bad = self.upload((json.dumps(pair("q", "a", "b")) + "\n" + json.dumps(two) +
                           "\n").encode())["id"]
        self.oai_error(self.create(training_file=bad), "training_file",
                       "line 2: field 'preferred_output': expected exactly one assistant message")


if __name__ == "__main__":
    sys.exit(test_jobs.main())  # --dapod, then this module's tests
