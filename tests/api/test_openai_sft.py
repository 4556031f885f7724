#!/usr/bin/python3
"""Supervised jobs through OpenAI's surface, POST /v1/fine_tuning/jobs with
`method.type: "supervised"` (issue 27 part 4; label api; docs/OPENAI.md "Supervised jobs"):
- the job object: method.supervised.hyperparameters and the top-level hyperparameters resolved
  (batch_size, learning_rate_multiplier, n_epochs; "auto" as 8, 1, 3), the native job's knobs
  (batch_size, epochs, learning_rate = 1e-5 x multiplier), total_steps, trained_tokens equal to
  the sum of the native train/tokens, fine_tuned_model the last checkpoint;
- the deprecated top-level hyperparameters give the same job;
- refusals in OpenAI's error shape naming the field as sent: n_epochs 0, batch_size 257,
  learning_rate_multiplier 0, ppo, a weight on a user message, weight 2, no trainable assistant
  message (the line and field in the message);
- a fine-tuned model ("ft:tiny:dapod:...") is the `model` of the next job, OpenAI's way to train
  on from a result: the job shows the name as given, the native job trains from the first job's
  last checkpoint (its step-0 validation loss is the first job's last, bit for bit) in the chat
  template the first job taught, and its own fine_tuned_model is again "ft:tiny:...";
- chat completions on a supervised model end each choice at the template's end of turn (the
  trained newline): content without it, finish_reason "stop";
- metrics events carry train_loss, train_mean_token_accuracy (valid_loss,
  valid_mean_token_accuracy for evaluations; full_valid_loss, full_valid_mean_token_accuracy at
  each epoch's end, the same pass) equal to the native metrics; checkpoints' metrics
  too; result_files[0] is a fine-tune-results file whose CSV rows equal the native metrics.

Run: /usr/bin/python3 tests/api/test_openai_sft.py --dapod build/server/dapod
"""

import csv
import io
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_jobs  # noqa: E402


def chat(a, b, **assistant):
    return {"messages": [{"role": "user", "content": "%d+%d=" % (a, b)},
                         dict({"role": "assistant", "content": str(a + b)}, **assistant)]}


SUMS = "".join(json.dumps(chat(a, b)) + "\n" for a in range(5) for b in range(5)).encode()
VALID = "".join(json.dumps(chat(a, a)) + "\n" for a in range(5)).encode()


class OpenAISupervised(test_jobs.DaemonCase):
    def create(self, hp=None, method=None, **body):
        b = {"model": "tiny", "training_file": self.train_id,
             "method": method or {"type": "supervised",
                                  "supervised": {"hyperparameters": hp or {}}}}
        b.update(body)
        return self.d.post_json("/v1/fine_tuning/jobs", b)

    @classmethod
    def prepare(cls):
        cls.train_id = cls.upload(SUMS)["id"]
        cls.valid_id = cls.upload(VALID)["id"]

    def oai_error(self, r, param, part):
        self.assertEqual(r.status, 400, r)
        e = r.json()["error"]
        self.assertEqual(e["type"], "invalid_request_error", e)
        self.assertEqual(e["param"], param, e)
        self.assertIn(part, e["message"], e)
        return e

    def test_1_job_events_checkpoints_results(self):
        hp = {"batch_size": 8, "n_epochs": 2, "learning_rate_multiplier": 300}
        r = self.create(hp, validation_file=self.valid_id, seed=3, suffix="sums")
        self.assertEqual(r.status, 200, r)
        j = r.json()
        self.assertEqual(j["object"], "fine_tuning.job")
        want = {"batch_size": 8, "learning_rate_multiplier": 300.0, "n_epochs": 2}
        self.assertEqual(j["method"], {"type": "supervised",
                                       "supervised": {"hyperparameters": want}})
        self.assertEqual(j["hyperparameters"], want)
        self.assertEqual(j["total_steps"], 8)  # ceil(25 / 8) * 2
        self.assertIsNone(j["trained_tokens"])
        self.assertEqual(j["result_files"], [])
        native = self.job(j["id"])
        self.assertEqual(native["method"], "supervised")
        nhp = native["hyperparameters"]
        self.assertEqual((nhp["batch_size"], nhp["epochs"], nhp["eval_every"],
                          nhp["checkpoint_every"]), (8, 2, 2, 2))
        self.assertAlmostEqual(nhp["learning_rate"], 3e-3, delta=1e-12)
        self.wait_status(j["id"], ("succeeded", "failed"))
        j = self.assertJson(self.d.get("/v1/fine_tuning/jobs/" + j["id"]), 200)
        self.assertEqual(j["status"], "succeeded", j)
        self.assertEqual(j["fine_tuned_model"], "ft:tiny:dapod:sums:%s" % j["id"])
        rows = self.assertJson(self.d.get("/v1/jobs/%s/metrics" % j["id"]), 200)
        train = {m["step"]: m for m in rows if "train/loss" in m}
        valid = {m["step"]: m for m in rows if "valid/loss" in m}
        self.assertEqual(sorted(train), list(range(1, 9)))
        self.assertEqual(sorted(valid), [0, 2, 4, 6, 8])
        self.assertEqual(j["trained_tokens"], sum(m["train/tokens"] for m in train.values()))
        self.assertGreater(j["trained_tokens"], 0)

        # metrics events: OpenAI's names, the native values
        evs = self.assertJson(
            self.d.get("/v1/fine_tuning/jobs/%s/events?limit=100" % j["id"]), 200)["data"]
        seen_t, seen_v = set(), set()
        for e in evs:
            if e["type"] != "metrics":
                continue
            d = e["data"]
            self.assertEqual(d["total_steps"], 8)
            if "train_loss" in d:
                m = train[d["step"]]
                self.assertEqual(d["train_loss"], m["train/loss"])
                self.assertEqual(d["train_mean_token_accuracy"], m["train/mean_token_accuracy"])
                seen_t.add(d["step"])
            else:
                m = valid[d["step"]]
                self.assertEqual(d["valid_loss"], m["valid/loss"])
                self.assertEqual(d["valid_mean_token_accuracy"], m["valid/mean_token_accuracy"])
                # an epoch's end (steps 4 and 8: 25 examples, batch 8): the full validation
                if d["step"] in (4, 8):
                    self.assertEqual(d["full_valid_loss"], m["full_valid/loss"])
                    self.assertEqual(d["full_valid_loss"], d["valid_loss"])
                    self.assertEqual(d["full_valid_mean_token_accuracy"],
                                     d["valid_mean_token_accuracy"])
                else:
                    self.assertNotIn("full_valid_loss", d)
                    self.assertNotIn("full_valid/loss", m)
                seen_v.add(d["step"])
        self.assertEqual(sorted(seen_t), list(range(1, 9)))
        self.assertEqual(sorted(seen_v), [0, 2, 4, 6, 8])

        # checkpoints: every 2 steps (and the native step 0), their metrics in OpenAI's names
        cks = self.assertJson(
            self.d.get("/v1/fine_tuning/jobs/%s/checkpoints" % j["id"]), 200)["data"]
        self.assertEqual([c["step_number"] for c in cks], [8, 6, 4, 2, 0])
        self.assertNotIn("train_loss", cks[-1]["metrics"])
        for c in cks[:-1]:
            m = train[c["step_number"]]
            self.assertEqual(c["metrics"]["train_loss"], m["train/loss"], c)
            self.assertEqual(c["metrics"]["train_mean_token_accuracy"],
                             m["train/mean_token_accuracy"], c)

        # the result file: the CSV of the native metrics
        self.assertEqual(len(j["result_files"]), 1, j)
        fid = j["result_files"][0]
        f = self.assertJson(self.d.get("/v1/files/" + fid), 200)
        self.assertEqual(f["purpose"], "fine-tune-results", f)
        body = self.d.get("/v1/files/%s/content" % fid)
        self.assertEqual(body.status, 200)
        text = body.body.decode()
        self.assertEqual(text.splitlines()[0],
                         "step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy")
        got = list(csv.DictReader(io.StringIO(text)))
        self.assertEqual([int(x["step"]) for x in got], list(range(1, 9)))
        for x in got:
            s = int(x["step"])
            self.assertEqual(float(x["train_loss"]), train[s]["train/loss"])
            self.assertEqual(float(x["train_accuracy"]), train[s]["train/mean_token_accuracy"])
            if s in valid:
                self.assertEqual(float(x["valid_loss"]), valid[s]["valid/loss"])
                self.assertEqual(float(x["valid_mean_token_accuracy"]),
                                 valid[s]["valid/mean_token_accuracy"])
            else:
                self.assertEqual((x["valid_loss"], x["valid_mean_token_accuracy"]), ("", ""))
        # a second rendering gives the same file, not another
        again = self.assertJson(self.d.get("/v1/fine_tuning/jobs/" + j["id"]), 200)
        self.assertEqual(again["result_files"], [fid])

    def test_2_auto_and_deprecated_hyperparameters(self):
        r = self.create({"batch_size": "auto", "n_epochs": "auto",
                         "learning_rate_multiplier": "auto"})
        self.assertEqual(r.status, 200, r)
        j = r.json()
        self.assertEqual(j["hyperparameters"],
                         {"batch_size": 8, "learning_rate_multiplier": 1.0, "n_epochs": 3})
        self.assertEqual(j["total_steps"], 12)  # ceil(25 / 8) * 3
        self.d.post_json("/v1/fine_tuning/jobs/%s/cancel" % j["id"], {})
        r = self.create(method={"type": "supervised"},
                        hyperparameters={"n_epochs": 1, "batch_size": 5})
        self.assertEqual(r.status, 200, r)
        j = r.json()
        self.assertEqual(j["method"]["supervised"]["hyperparameters"],
                         {"batch_size": 5, "learning_rate_multiplier": 1.0, "n_epochs": 1})
        self.assertEqual(j["total_steps"], 5)
        self.d.post_json("/v1/fine_tuning/jobs/%s/cancel" % j["id"], {})
        # prompt/completion lines (no DAPO items: the upload is invalid as a DAPO file) count by
        # line for the evaluation cadence: 10 lines / 2 x 2 epochs = 10 steps, eval_every 10 / 4
        pc = "".join(json.dumps({"prompt": "%d+1=" % k, "completion": str(k + 1)}) + "\n"
                     for k in range(10)).encode()
        pid = self.upload(pc)["id"]
        r = self.create({"batch_size": 2, "n_epochs": 2}, training_file=pid, validation_file=pid)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["total_steps"], 10)
        nhp = self.job(r.json()["id"])["hyperparameters"]
        self.assertEqual((nhp["eval_every"], nhp["checkpoint_every"]), (2, 2))
        self.d.post_json("/v1/fine_tuning/jobs/%s/cancel" % r.json()["id"], {})
        self.oai_error(self.create(method={"type": "supervised"}, hyperparameters={"n_epochs": 0}),
                       "hyperparameters.n_epochs", "expected")
        self.oai_error(self.create({"n_epochs": 1}, hyperparameters={"n_epochs": 2}),
                       "hyperparameters", "once")

    def test_3_refusals(self):
        P = "method.supervised.hyperparameters."
        self.oai_error(self.create({"n_epochs": 0}), P + "n_epochs", "[1, 50]")
        self.oai_error(self.create({"n_epochs": 51}), P + "n_epochs", "[1, 50]")
        self.oai_error(self.create({"batch_size": 257}), P + "batch_size", "[1, 256]")
        self.oai_error(self.create({"learning_rate_multiplier": 0}),
                       P + "learning_rate_multiplier", "(0, 1000]")
        self.oai_error(self.create({"learning_rate_multiplier": "high"}),
                       P + "learning_rate_multiplier", "expected")
        self.oai_error(self.create(method={"type": "ppo", "ppo": {}}), "method.type",
                       "not supported")
        self.oai_error(self.create(method={"type": "rl"}), "method.type", "not supported")
        self.oai_error(self.create(method={"type": "supervised", "supervised": {"beta": 1}}),
                       "method.supervised.beta", "unknown field")
        for line, part in (
                ({"messages": [{"role": "user", "content": "1+1=", "weight": 1},
                               {"role": "assistant", "content": "2"}]},
                 "line 2: field 'messages[0].weight'"),
                (chat(1, 1, weight=2), "line 2: field 'messages[1].weight': expected 0 or 1"),
                (chat(1, 1, weight=0), "line 2: field 'messages'")):
            bad = self.upload((json.dumps(chat(0, 0)) + "\n" + json.dumps(line) + "\n").encode())
            self.oai_error(self.create(training_file=bad["id"]), "training_file", part)

    def test_4_train_on_from_a_fine_tuned_model(self):
        hp = {"batch_size": 25, "n_epochs": 30, "learning_rate_multiplier": 300}
        first = self.create(hp, validation_file=self.valid_id, seed=2).json()
        self.wait_status(first["id"], ("succeeded", "failed"))
        first = self.assertJson(self.d.get("/v1/fine_tuning/jobs/" + first["id"]), 200)
        self.assertEqual(first["status"], "succeeded", first)
        ft = first["fine_tuned_model"]
        # the reply is the assistant's turn: cut at the trained newline
        stops = 0
        for a in range(5):
            c = self.assertJson(self.d.post_json("/v1/chat/completions", {
                "model": ft, "temperature": 0, "max_completion_tokens": 4,
                "messages": [{"role": "user", "content": "%d+%d=" % (a, 4 - a)}]}), 200)
            ch = c["choices"][0]
            self.assertNotIn("\n", ch["message"]["content"], ch)
            stops += ch["finish_reason"] == "stop"
        self.assertGreaterEqual(stops, 4)

        r = self.create({"batch_size": 25, "n_epochs": 1, "learning_rate_multiplier": 1},
                        model=ft, validation_file=self.valid_id, seed=2)
        self.assertEqual(r.status, 200, r)
        second = r.json()
        self.assertEqual(second["model"], ft)
        native, base = self.job(second["id"]), self.job(first["id"])
        self.assertEqual(native["model"], "%s:step-%d" % (first["id"], base["total_steps"]))
        self.assertEqual(native["chat_template"], base["chat_template"])
        self.wait_status(second["id"], ("succeeded", "failed"))
        second = self.assertJson(self.d.get("/v1/fine_tuning/jobs/" + second["id"]), 200)
        self.assertEqual(second["status"], "succeeded", second)
        self.assertEqual(second["fine_tuned_model"], "ft:tiny:dapod::%s" % second["id"])
        self.assertEqual(second["model"], ft)

        def valid_loss(job_id, step):
            rows = self.assertJson(self.d.get("/v1/jobs/%s/metrics" % job_id), 200)
            return [m["valid/loss"] for m in rows if m["step"] == step and "valid/loss" in m][0]
        self.assertEqual(valid_loss(second["id"], 0), valid_loss(first["id"], base["total_steps"]))
        self.assertLess(valid_loss(second["id"], 0), valid_loss(first["id"], 0) / 2)
        # an ft: name of no job of the caller's is refused naming model
        r = self.create(hp, model="ft:tiny:dapod::job-00000000-0000-0000-0000-000000000000")
        self.assertIn(r.status, (400, 404), r)
        self.assertEqual(r.json()["error"]["param"], "model", r)


if __name__ == "__main__":
    sys.exit(test_jobs.main())  # --dapod, then this module's tests
