#!/usr/bin/python3
"""Models, memory plans and chat prompts through the daemon (label api):
- GET /v1/models/{id} reports parameters and the memory plan of a job with the default
  hyperparameters (weights, gradients, Adam moments, activations, KV cache; they add up) and
  whether it fits the limit; max_prompt_tokens changes it; a bad value is a 400;
- job creation refuses a job whose plan exceeds memory_limit_bytes (422 naming the limit), and a
  `messages` dataset without a usable chat template, before anything is queued;
- with a limit that holds one job but not two, the second waits queued at the head while the
  first runs, then runs when memory is free;
- a `messages` dataset trains end to end with a custom chat template: rollouts show the rendered
  prompt and the messages.

Run: /usr/bin/python3 tests/api/test_models.py --dapod build/server/dapod
"""

import json
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import test_jobs  # noqa: E402
from test_jobs import SMALL_HP, DaemonCase, long_hp  # noqa: E402

PARTS = ("weights_bytes", "gradients_bytes", "optimizer_bytes", "reference_model_bytes",
         "activations_bytes", "generation_bytes", "buffers_bytes")


def messages_data(n=12):
    lines = []
    for i in range(n):
        a, b = i % 5, (i // 5) % 5
        lines.append(json.dumps({"messages": [{"role": "system", "content": "add"},
                                              {"role": "user", "content": "%d+%d" % (a, b)}],
                                 "answer": str(a + b)}))
    return ("\n".join(lines) + "\n").encode()


class ModelMemory(DaemonCase):
    def test_plan_of_a_preset(self):
        m = self.assertJson(self.d.get("/v1/models/tiny"), 200)
        mem = m["memory"]
        self.assertEqual(mem["parameters"], 98816)
        self.assertEqual(mem["weights_bytes"], 4 * 98816)
        self.assertEqual(mem["gradients_bytes"], 4 * 98816)
        self.assertEqual(mem["optimizer_bytes"], 8 * 98816)
        self.assertEqual(mem["reference_model_bytes"], 0)  # kl_coef defaults to 0
        self.assertEqual(mem["total_bytes"], sum(mem[p] for p in PARTS))
        self.assertEqual(mem["assumes"]["max_prompt_tokens"], 256)
        self.assertEqual(mem["for"]["max_sequence_tokens"], 256 + 64)
        self.assertTrue(mem["fits"])
        # longer than micro_batch_tokens (4096): the micro-batch grows to one whole sequence
        longer = self.assertJson(self.d.get("/v1/models/tiny?max_prompt_tokens=8000"), 200)
        self.assertGreater(longer["memory"]["activations_bytes"], mem["activations_bytes"])
        self.assertGreater(longer["memory"]["generation_bytes"], mem["generation_bytes"])
        self.assertProblem(self.d.get("/v1/models/tiny?max_prompt_tokens=zero"), 400,
                           "invalid_request", "max_prompt_tokens")

    def test_job_records_its_plan(self):
        j = self.create_ok(SMALL_HP)
        mem = j["memory"]
        self.assertEqual(mem["parameters"], 98816)
        # the longest prompt of addition.jsonl (one token per character) + max_new_tokens 4
        rows = [json.loads(x) for x in test_jobs.read("addition.jsonl").decode().splitlines()]
        longest = max(len(x["prompt"]) for x in rows)
        self.assertEqual(mem["for"]["max_sequence_tokens"], longest + 4)
        self.wait_status(j["id"], "succeeded")


class MemoryLimit(DaemonCase):
    ARGS = ("--workers", "1", "--blas-threads", "1", "--memory-limit-bytes", "1M")

    def test_refused_over_the_limit(self):
        r = self.create(SMALL_HP)
        p = self.assertProblem(r, 422, "validation_failed")
        self.assertFields(p, "hyperparameters")
        msg = [e["message"] for e in p["errors"] if e["field"] == "hyperparameters"][0]
        self.assertIn("memory_limit_bytes", msg)
        self.assertIn("but the memory limit is 1.0 MiB", msg)
        m = self.assertJson(self.d.get("/v1/models/tiny"), 200)
        self.assertFalse(m["memory"]["fits"])
        self.assertEqual(m["memory"]["limit_bytes"], 1 << 20)
        self.assertEqual(self.assertJson(self.d.get("/v1/jobs"), 200)["data"], [])


class Admission(DaemonCase):
    """Two workers, memory for one job: the second waits at the head of the queue."""
    ARGS = ("--workers", "2", "--blas-threads", "1")

    @classmethod
    def prepare(cls):
        # learn the plan of the jobs below on an unlimited daemon, then restart with 1.5 plans
        j = cls.d.post_json("/v1/jobs", {"model": "tiny", "training_file": cls.file_id,
                                         "hyperparameters": long_hp(400)}).json()
        cls.plan = j["memory"]["total_bytes"]
        cls.d.post_json("/v1/jobs/%s/cancel" % j["id"], {})
        cls.d.stop()
        cls.d.cleanup()
        cls.d = harness.Daemon(test_jobs.DAPOD, cls.ARGS + (
            "--memory-limit-bytes", str(cls.plan * 3 // 2)))
        cls.d.start()
        cls.file_id = cls.upload(test_jobs.read("addition.jsonl"))["id"]

    def test_second_job_waits_for_memory(self):
        first = self.create_ok(long_hp(400))
        self.assertEqual(first["memory"]["total_bytes"], self.plan)
        self.wait_until(first["id"], lambda j: j["status"] == "running" and j["step"] >= 2,
                        "two steps of the first job")
        second = self.create_ok(long_hp(2))
        # the first job keeps training; the second stays queued with a free worker
        self.wait_until(first["id"], lambda j: j["step"] >= 4, "two more steps of the first job")
        j2 = self.job(second["id"])
        self.assertEqual(j2["status"], "queued", j2)
        self.assertEqual(j2["queue_position"], 1, j2)
        self.assertEqual(self.d.post_json("/v1/jobs/%s/cancel" % first["id"], {}).status, 200)
        self.wait_status(first["id"], "cancelled")
        self.wait_status(second["id"], "succeeded")


class ChatPrompts(DaemonCase):
    @classmethod
    def prepare(cls):
        cls.msg_id = cls.upload(messages_data())["id"]

    def test_messages_need_a_template(self):
        p = self.assertProblem(self.create(SMALL_HP, training_file=self.msg_id), 422,
                               "validation_failed")
        self.assertFields(p, "chat_template")
        self.assertIn("no tokenizer_config.json", json.dumps(p))
        p = self.assertProblem(self.create(SMALL_HP, training_file=self.msg_id,
                                           chat_template={"user": "{question}"}), 422,
                               "validation_failed")
        self.assertFields(p, "chat_template.user")

    def test_messages_train_end_to_end(self):
        tpl = {"system": "[{content}] ", "user": "{content}=", "generation_prompt": ""}
        j = self.create_ok(SMALL_HP, training_file=self.msg_id, chat_template=tpl)
        self.assertEqual(j["chat_template"], tpl)
        j = self.wait_status(j["id"], ("succeeded", "failed"))
        self.assertEqual(j["status"], "succeeded", j)
        lines = self.d.get("/v1/jobs/%s/rollouts?step=1" % j["id"])
        self.assertEqual(lines.status, 200, lines)
        rows = [json.loads(x) for x in lines.body.decode().splitlines() if x.strip()]
        self.assertTrue(rows)
        for r in rows:
            self.assertRegex(r["prompt"], r"^\[add\] [0-4]\+[0-4]=$")
            self.assertEqual(r["messages"][1]["role"], "user")
            self.assertEqual(r["prompt"], "[add] %s=" % r["messages"][1]["content"])
            self.assertEqual(len(r["prompt_token_ids"]), len(r["prompt"]))  # one per character
        ck = self.assertJson(self.d.get("/v1/jobs/%s/checkpoints" % j["id"]), 200)
        self.assertTrue(ck["data"])


if __name__ == "__main__":
    sys.exit(test_jobs.main())
