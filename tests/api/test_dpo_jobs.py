#!/usr/bin/python3
"""DPO jobs through the daemon (issue 27; label api):
- a file of TRL {"prompt", "chosen", "rejected"} lines (invalid as a DAPO file) and one of
  OpenAI's {"input", "preferred_output", "non_preferred_output"} lines (with a chat template)
  train `"method": "dpo"` jobs: the job object shows method "dpo", judge null, every DPO knob
  resolved (beta 0.1, loss_type sigmoid, label_smoothing 0 by default) and total_steps =
  ceil(pairs / batch_size) * epochs; they succeed, their metrics carry train/loss and
  rewards/{chosen, rejected, accuracy, margin}, their evaluations valid/loss and
  valid/rewards/accuracy (every eval_every steps and at each epoch's end, where the same pass is
  also full_valid/...);
- refusals name the field: beta 3, loss_type "ipo", label_smoothing 0.5, a DAPO knob, a judge;
  bad lines by line and field (two preferred outputs, a missing rejected response);
- an upload says which methods its lines fit: `methods` (["dapo"] for prompt/answer lines,
  ["supervised"] for prompt/completion lines, ["dpo"] for pairs) and `method_errors` naming the
  first bad line and field of each other method, on the upload's reply, on GET /v1/files/{id}
  and on POST /v1/files/validate.

Run: /usr/bin/python3 tests/api/test_dpo_jobs.py --dapod build/server/dapod
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_jobs  # noqa: E402

PAIRS = "".join(json.dumps({"prompt": "%d%d" % (a, b), "chosen": str((b + 1) % 10),
                            "rejected": str((b + 9) % 10)}) + "\n"
                for a in range(4) for b in range(5)).encode()
TEMPLATE = {"user": "U{content}|", "assistant": "A{content}|", "generation_prompt": "A",
            "stop": "|"}


def oai_line(q, good, bad):
    return json.dumps({"input": {"messages": [{"role": "user", "content": q}]},
                       "preferred_output": [{"role": "assistant", "content": good}],
                       "non_preferred_output": [{"role": "assistant", "content": bad}]}) + "\n"


DPO_HP = {"batch_size": 8, "epochs": 2, "learning_rate": 0.001, "eval_every": 2}


class DpoJobs(test_jobs.DaemonCase):
    def dpo(self, hp=None, file_id=None, data=PAIRS, **body):
        b = {"method": "dpo", "model": "tiny",
             "training_file": file_id or self.upload(data)["id"],
             "hyperparameters": dict(DPO_HP if hp is None else hp)}
        b.update(body)
        return self.d.post_json("/v1/jobs", b)

    def finished(self, r, steps):
        self.assertEqual(r.status, 201, r)
        j = self.wait_status(r.json()["id"], ("succeeded", "failed"))
        self.assertEqual(j["status"], "succeeded", j)
        self.assertEqual(j["step"], steps)
        m = j["latest_metrics"]
        for k in ("train/loss", "rewards/chosen", "rewards/rejected", "rewards/accuracy",
                  "rewards/margin", "train/tokens", "learning_rate", "grad_norm"):
            self.assertIn(k, m)
        return j

    def test_dpo_job(self):
        fid = self.upload(PAIRS)["id"]
        r = self.dpo(file_id=fid, validation_file=fid)
        self.assertEqual(r.status, 201, r)
        j = r.json()
        self.assertEqual(j["method"], "dpo")
        self.assertIsNone(j["judge"])
        self.assertEqual(j["total_steps"], 6)  # ceil(20 / 8) * 2
        self.assertEqual(j["hyperparameters"], {
            "epochs": 2, "batch_size": 8, "learning_rate": 0.001, "lr_schedule": "linear",
            "lr_warmup_steps": 0, "max_sequence_tokens": 2048, "truncate": False,
            "weight_decay": 0.0, "grad_clip": 1.0, "adam_beta1": 0.9, "adam_beta2": 0.999,
            "adam_eps": 1e-8, "checkpoint_every": 0, "keep_checkpoints": 0, "eval_every": 2,
            "micro_batch_tokens": 1024, "beta": 0.1, "loss_type": "sigmoid",
            "label_smoothing": 0.0})
        j = self.finished(r, 6)
        ev = self.assertJson(self.d.get("/v1/jobs/%s/metrics" % j["id"]), 200)
        text = json.dumps(ev)
        self.assertIn("valid/loss", text)
        self.assertIn("valid/rewards/accuracy", text)
        # eval_every 2 and each epoch's end (3 steps an epoch): the end's evaluation is also the
        # full validation, the same pass under full_valid/ names
        valid = {m["step"]: m for m in ev if "valid/loss" in m}
        self.assertEqual(sorted(valid), [0, 2, 3, 4, 6])
        self.assertEqual(sorted(s for s in valid if "full_valid/loss" in valid[s]), [3, 6])
        for s in (3, 6):
            for k in ("loss", "rewards/accuracy", "rewards/margin", "rewards/chosen"):
                self.assertEqual(valid[s]["full_valid/" + k], valid[s]["valid/" + k])

    def test_openai_lines(self):
        data = (oai_line("hi", "yo", "go away") + oai_line("ab", "q", "rs")).encode()
        r = self.dpo(data=data, chat_template=TEMPLATE,
                     hp={"batch_size": 2, "beta": 0.5, "label_smoothing": 0.1})
        self.assertEqual(r.json()["hyperparameters"]["beta"], 0.5)
        self.finished(r, 1)

    def test_truncate_after_a_refusal(self):
        # 'ab' + 'c' + EOS: 4 tokens; at max_sequence_tokens 3 refused by line and field, and
        # with truncate the same file is taken (the daemon's kept check of the file knows both)
        fid = self.upload(PAIRS)["id"]
        p = self.assertProblem(self.dpo(hp={"max_sequence_tokens": 3}, file_id=fid), 422,
                               "validation_failed")
        msg = [e["message"] for e in p["errors"] if e["field"] == "training_file"][0]
        self.assertIn("line 1: field 'chosen': 4 tokens with the prompt exceed "
                      "max_sequence_tokens (3", msg)
        r = self.dpo(hp={"max_sequence_tokens": 3, "truncate": True}, file_id=fid)
        self.assertEqual(r.status, 201, r)
        self.d.post_json("/v1/jobs/%s/cancel" % r.json()["id"], {})

    def test_refusals(self):
        fid = self.upload(PAIRS)["id"]
        for hp, field, part in (
                ({"beta": 3}, "hyperparameters.beta", "3 not in (0, 2]"),
                ({"beta": 0}, "hyperparameters.beta", "0 not in (0, 2]"),
                ({"loss_type": "kto"}, "hyperparameters.loss_type",
                 "expected one of: sigmoid, hinge, ipo, robust"),
                ({"loss_type": "ipo", "label_smoothing": 0.1}, "hyperparameters.label_smoothing",
                 "the ipo loss has no label smoothing"),
                ({"label_smoothing": 0.5}, "hyperparameters.label_smoothing",
                 "0.5 not in [0, 0.5)"),
                ({"group_size": 4}, "hyperparameters.group_size",
                 "not a hyperparameter of method dpo")):
            p = self.assertProblem(self.dpo(hp=hp, file_id=fid), 422, "validation_failed")
            self.assertFields(p, field)
            msg = [e["message"] for e in p["errors"] if e["field"] == field][0]
            self.assertIn(part, msg)
        p = self.assertProblem(self.dpo(file_id=fid, judge={"type": "math"}), 422,
                               "validation_failed")
        self.assertFields(p, "judge")
        two = json.loads(oai_line("q", "a", "b"))
        two["preferred_output"].append({"role": "assistant", "content": "c"})
        for lines, want in (
                ([oai_line("q", "a", "b"), json.dumps(two) + "\n"],
                 "line 2: field 'preferred_output': expected exactly one assistant message"),
                ([PAIRS.decode().splitlines()[0] + "\n", "\n",
                  json.dumps({"prompt": "12", "chosen": "3"}) + "\n"],
                 "line 3: field 'rejected': required")):
            r = self.dpo(data="".join(lines).encode(), chat_template=TEMPLATE)
            p = self.assertProblem(r, 422, "validation_failed")
            self.assertFields(p, "training_file")
            msg = [e["message"] for e in p["errors"] if e["field"] == "training_file"][0]
            self.assertIn(want, msg)


class UploadMethods(test_jobs.DaemonCase):
    def test_methods(self):
        sft = "".join(json.dumps({"prompt": "%d+1=" % a, "completion": str(a + 1)}) + "\n"
                      for a in range(3)).encode()
        two = json.loads(oai_line("q", "a", "b"))
        two["preferred_output"].append({"role": "assistant", "content": "c"})
        with open(os.path.join(test_jobs.DATA, "addition.jsonl"), "rb") as f:
            dapo = f.read()
        for data, methods, errs in (
                (dapo, ["dapo"], {"supervised": "line 1: field 'answer': unknown",
                                  "dpo": "line 1: field 'answer': unknown"}),
                (sft, ["supervised"], {"dapo": "see errors",
                                       "dpo": "line 1: field 'completion': unknown"}),
                (PAIRS, ["dpo"], {"dapo": "see errors",
                                  "supervised": "line 1: field 'chosen': unknown"}),
                ((oai_line("q", "a", "b") + json.dumps(two) + "\n").encode(), [],
                 {"dpo": "line 2: field 'preferred_output': expected exactly one assistant "
                         "message"})):
            up = self.upload(data)
            got = self.assertJson(self.d.get("/v1/files/" + up["id"]), 200)
            dry = self.assertJson(self.d.request(
                "POST", "/v1/files/validate?purpose=fine-tune&filename=data.jsonl", body=data,
                headers={"Content-Type": "application/x-ndjson"}), 200)
            for o in (up, got, dry):
                self.assertEqual(o["methods"], methods, o)
                for m, part in errs.items():
                    self.assertIn(part, o["method_errors"][m])
                self.assertEqual(sorted(o["method_errors"]),
                                 sorted({"dapo", "supervised", "dpo"} - set(methods)))


if __name__ == "__main__":
    sys.exit(test_jobs.main())  # --dapod, then this module's tests
