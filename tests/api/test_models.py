#!/usr/bin/python3
"""Models, memory plans and chat prompts through the daemon (label api):
- GET /v1/models/{id} reports parameters and the memory plan of a job with the default
  hyperparameters (weights, gradients, Adam moments, activations, KV cache; they add up) and
  whether it fits the limit; max_prompt_tokens changes it; a bad value is a 400;
- with adapter=lora (r, alpha, target_modules, use_rslora) it is a LoRA job's plan: gradients and
  moments of the adapter only, the total below the full plan's, and the very plan a LoRA job with
  the default hyperparameters records, also on a BF16 folder with a padded vocabulary (the frozen
  base at 2 bytes a matrix parameter, logits over the tokenizer's ids); bad adapter parameters,
  an unknown adapter type and adapter parameters without adapter=lora are 400s naming them;
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
import shutil
import struct
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import test_completions  # noqa: E402
import test_jobs  # noqa: E402
from test_jobs import SMALL_HP, UNENDING, DaemonCase, long_hp  # noqa: E402

PARTS = ("weights_bytes", "gradients_bytes", "optimizer_bytes", "reference_model_bytes",
         "activations_bytes", "generation_bytes", "buffers_bytes")


ADAPTER = {"type": "lora", "r": 4, "alpha": 16, "target_modules": ["q_proj", "v_proj", "down_proj"]}
ADAPTER_QUERY = "adapter=lora&r=4&alpha=16&target_modules=q_proj,v_proj,down_proj"
PADDED_ROWS = 128  # embedding rows of the BF16 folder, past the tiny tokenizer's 99 ids


def layer_dims(cfg):
    """[out, in] of every linear layer an adapter may target (core/engine/lora.c target_dims)."""
    C, FF = cfg["hidden_size"], cfg["intermediate_size"]
    CQ = cfg["num_attention_heads"] * cfg["head_dim"]
    CKV = cfg["num_key_value_heads"] * cfg["head_dim"]
    return {"q_proj": (CQ, C), "k_proj": (CKV, C), "v_proj": (CKV, C), "o_proj": (C, CQ),
            "gate_proj": (FF, C), "up_proj": (FF, C), "down_proj": (C, FF)}


def lora_parameters(cfg, r, targets):
    """PEFT's count: r (in + out) per targeted layer and decoder layer."""
    dims = layer_dims(cfg)
    return cfg["num_hidden_layers"] * sum(r * sum(dims[t]) for t in targets)


def matrix_parameters(cfg):
    """The model's matrices (what a frozen BF16 base holds in 2 bytes each)."""
    C, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    per_layer = sum(o * i for o, i in layer_dims(cfg).values())
    return cfg["vocab_size"] * C * (1 if cfg["tie_word_embeddings"] else 2) + L * per_layer


def bf16_padded_folder(path, rows):
    """The tiny preset saved as a model folder, then made what a BF16 model with a padded
    vocabulary is: every tensor in BF16 (the upper halves of the float32 values, so exactly BF16),
    `rows` embedding rows (zero past the tokenizer's ids) and config.json saying bfloat16."""
    subprocess.run([test_jobs.DAPOD, "save-preset", "tiny", path], check=True,
                   stdout=subprocess.DEVNULL)
    st = os.path.join(path, "model.safetensors")
    with open(st, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    head, data = json.loads(blob[8:8 + n]), blob[8 + n:]
    head.pop("__metadata__", None)
    out, parts, off = {}, [], 0
    for name, t in sorted(head.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        assert t["dtype"] == "F32", t
        raw = data[t["data_offsets"][0]:t["data_offsets"][1]]
        half = b"".join(raw[i + 2:i + 4] for i in range(0, len(raw), 4))  # little-endian
        shape = list(t["shape"])
        if name == "model.embed_tokens.weight":
            half += bytes(2 * (rows - shape[0]) * shape[1])
            shape[0] = rows
        out[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + len(half)]}
        parts.append(half)
        off += len(half)
    hj = json.dumps(out).encode()
    hj += b" " * (-len(hj) % 8)
    with open(st, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + b"".join(parts))
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(vocab_size=rows, torch_dtype="bfloat16")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)


def as_float32_folder(path):
    """A BF16 folder's tensors written back as float32 (each value exactly its BF16 one) and its
    config saying float32: the same weights, held as a float32 model holds them."""
    st = os.path.join(path, "model.safetensors")
    with open(st, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    head, data = json.loads(blob[8:8 + n]), blob[8 + n:]
    out, parts, off = {}, [], 0
    for name, t in sorted(head.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        raw = data[t["data_offsets"][0]:t["data_offsets"][1]]
        full = b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, len(raw), 2))
        out[name] = {"dtype": "F32", "shape": t["shape"], "data_offsets": [off, off + len(full)]}
        parts.append(full)
        off += len(full)
    hj = json.dumps(out).encode()
    hj += b" " * (-len(hj) % 8)
    with open(st, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + b"".join(parts))
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(torch_dtype="float32")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)


def longest_prompt():
    """Tokens of addition.jsonl's longest prompt (one per character on the tiny tokenizer)."""
    rows = [json.loads(x) for x in test_jobs.read("addition.jsonl").decode().splitlines()]
    return max(len(x["prompt"]) for x in rows)


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
        # longer than micro_batch_tokens (1024): the micro-batch grows to one whole sequence
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
        self.assertEqual(mem["for"]["max_sequence_tokens"], longest_prompt() + 4)
        self.wait_status(j["id"], "succeeded")

    def job_plan(self, model, **body):
        """The plan a job on model with the default hyperparameters records (then cancelled)."""
        j = self.create_ok({}, model=model, **body)
        self.assertJson(self.d.post_json("/v1/jobs/%s/cancel" % j["id"], {}), 200)
        self.wait_status(j["id"], "cancelled")
        return j["memory"]

    def assertSamePlan(self, route, job):
        """GET /v1/models/{id}'s memory (route) is the job's, part by part."""
        extra = ("limit_bytes", "fits", "assumes")
        self.assertEqual({k: v for k, v in route.items() if k not in extra}, job)

    def run_plan(self, model, **body):
        """`dapod train --config JOB --plan` of the job body (addition.jsonl, default
        hyperparameters): the finished process, nothing trained."""
        job = dict(body, model=model,
                   training_file=os.path.join(test_jobs.DATA, "addition.jsonl"))
        path = os.path.join(self.d.models_dir, "..", "plan-job.json")
        with open(path, "w") as f:
            json.dump(job, f)
        return subprocess.run([test_jobs.DAPOD, "train", "--config", path, "--plan"],
                              capture_output=True, text=True, timeout=120)

    def cli_plan(self, model, **body):
        """The plan `dapod train --plan` prints for the job body."""
        p = self.run_plan(model, **body)
        self.assertEqual(p.returncode, 0, p.stderr)
        return json.loads(p.stdout)

    def test_lora_plan_of_a_preset(self):
        full = self.assertJson(self.d.get("/v1/models/tiny"), 200)
        cfg, full = full["config"], full["memory"]
        self.assertIsNone(full["assumes"]["adapter"])
        m = self.assertJson(self.d.get("/v1/models/tiny?" + ADAPTER_QUERY), 200)["memory"]
        self.assertEqual(m["assumes"], {"hyperparameters": "defaults", "max_prompt_tokens": 256,
                                        "adapter": {"type": "lora", "r": 4, "alpha": 16.0,
                                                    "target_modules": ADAPTER["target_modules"],
                                                    "dropout": 0.0, "use_rslora": False}})
        # gradients and AdamW moments of the adapter only; the float32 base and the adapter
        trained = lora_parameters(cfg, 4, ADAPTER["target_modules"])
        self.assertEqual((m["parameters"], m["trainable_parameters"]), (98816, trained))
        self.assertEqual(m["gradients_bytes"], 4 * trained)
        self.assertEqual(m["optimizer_bytes"], 8 * trained)
        self.assertEqual(m["weights_bytes"], 4 * (98816 + trained))
        self.assertEqual(m["total_bytes"], sum(m[p] for p in PARTS))
        self.assertLess(m["total_bytes"], full["total_bytes"])
        # PEFT's defaults (r 8 on q_proj and v_proj), all-linear, rsLoRA
        d = self.assertJson(self.d.get("/v1/models/tiny?adapter=lora"), 200)["memory"]
        self.assertEqual(d["trainable_parameters"], lora_parameters(cfg, 8, ["q_proj", "v_proj"]))
        self.assertEqual(d["assumes"]["adapter"]["alpha"], 8.0)
        a = self.assertJson(self.d.get("/v1/models/tiny?adapter=lora&target_modules=all-linear"
                                       "&use_rslora=true"), 200)["memory"]
        self.assertEqual(a["trainable_parameters"], lora_parameters(cfg, 8, layer_dims(cfg)))
        self.assertTrue(a["assumes"]["adapter"]["use_rslora"])
        # what a LoRA job records: the same adapter parts, and for its longest prompt all of it
        job = self.job_plan("tiny", adapter=ADAPTER)
        self.assertEqual((job["gradients_bytes"], job["optimizer_bytes"]),
                         (m["gradients_bytes"], m["optimizer_bytes"]))
        same = self.assertJson(self.d.get("/v1/models/tiny?max_prompt_tokens=%d&%s"
                                          % (longest_prompt(), ADAPTER_QUERY)), 200)["memory"]
        self.assertSamePlan(same, job)

    def test_plans_of_a_bf16_folder_are_the_jobs(self):
        """A BF16 folder whose embedding has rows past the tokenizer's ids: a LoRA job holds the
        frozen matrices in BF16 and computes logits over the tokenizer's ids only; the route
        plans both as the job does (a full job stays float32)."""
        bf16_padded_folder(os.path.join(self.d.models_dir, "tiny-bf16"), PADDED_ROWS)
        q = "/v1/models/tiny-bf16?max_prompt_tokens=%d" % longest_prompt()
        model = self.assertJson(self.d.get(q + "&" + ADAPTER_QUERY), 200)
        cfg, m = model["config"], model["memory"]
        self.assertEqual(cfg["vocab_size"], PADDED_ROWS)
        n = m["parameters"]
        trained = lora_parameters(cfg, 4, ADAPTER["target_modules"])
        self.assertEqual(m["trainable_parameters"], trained)
        self.assertEqual(m["weights_bytes"], 4 * (n + trained) - 2 * matrix_parameters(cfg))
        folder = os.path.join(self.d.models_dir, "tiny-bf16")
        job = self.job_plan("tiny-bf16", adapter=ADAPTER)
        self.assertSamePlan(m, job)
        self.assertEqual(self.cli_plan(folder, adapter=ADAPTER), job)  # dapod train --plan
        full = self.assertJson(self.d.get(q), 200)["memory"]
        self.assertEqual(full["weights_bytes"], 4 * n)
        self.assertLess(m["total_bytes"], full["total_bytes"])
        job = self.job_plan("tiny-bf16")
        self.assertSamePlan(full, job)
        self.assertEqual(self.cli_plan(folder), job)
        # a job's problems instead of a plan, listed on stderr: an invalid job file (exit 2), an
        # r larger than the model's layers (exit 1)
        for r, status in ((100000, 2), (512, 1)):
            p = self.run_plan(folder, adapter=dict(ADAPTER, r=r))
            self.assertEqual((p.returncode, p.stdout), (status, ""), p.stderr)
            self.assertIn("adapter.r", p.stderr)

    def test_completions_hold_a_bf16_folder_in_bf16(self):
        """The completion service opens a BF16 folder as a frozen base is opened: its matrices
        stay BF16 (the memory ledger's cached bytes are the BF16 plan's, less than float32's), and
        it answers as the same weights held in float32 do (the same greedy tokens, log-probs
        within 1e-5)."""
        bf16 = os.path.join(self.d.models_dir, "serve-bf16")
        bf16_padded_folder(bf16, PADDED_ROWS)
        f32 = os.path.join(self.d.models_dir, "serve-f32")
        shutil.copytree(bf16, f32)
        as_float32_folder(f32)
        answers = {}
        for name in ("serve-f32", "serve-bf16"):
            before = test_completions.metrics(self.d)["dapod_memory_cached_bytes"]
            r = self.assertJson(self.d.post_json("/v1/completions", {
                "model": name, "prompt": "12+34=", "max_tokens": 12, "temperature": 0,
                "logprobs": 1}), 200)
            answers[name] = (r["choices"][0]["text"], r["choices"][0]["logprobs"]["token_logprobs"])
            held = test_completions.metrics(self.d)["dapod_memory_cached_bytes"] - before
            model = self.assertJson(self.d.get("/v1/models/" + name), 200)
            n, cfg = model["memory"]["parameters"], model["config"]
            if name == "serve-f32":
                self.assertEqual(held, 4 * n)
            else:  # the matrices in 2 bytes, and one tile of a matrix converted at a time
                self.assertGreaterEqual(held, 4 * n - 2 * matrix_parameters(cfg))
                self.assertLess(held, 4 * n - matrix_parameters(cfg))
        (t32, l32), (t16, l16) = answers["serve-f32"], answers["serve-bf16"]
        self.assertEqual(t16, t32)
        for a, b in zip(l16, l32):
            self.assertAlmostEqual(a, b, delta=1e-5)

    def test_bad_adapter_parameters(self):
        cfg = self.assertJson(self.d.get("/v1/models/tiny"), 200)["config"]
        smallest = min(min(layer_dims(cfg)[t]) for t in ("q_proj", "v_proj"))  # PEFT's targets
        for query, param in (("adapter=lora&r=0", "r"), ("adapter=lora&r=x", "r"),
                             ("adapter=lora&r=%d" % (smallest + 1), "r"),
                             ("adapter=lora&alpha=0", "alpha"),
                             ("adapter=lora&use_rslora=yes", "use_rslora"),
                             ("adapter=lora&target_modules=q_proj,lm_head", "target_modules")):
            p = self.assertProblem(self.d.get("/v1/models/tiny?" + query), 400,
                                   "invalid_request", param + ": ")
            self.assertFields(p, param)
        p = self.assertProblem(self.d.get("/v1/models/tiny?adapter=lora&r=%d" % (smallest + 1)),
                               400, "invalid_request", "exceeds the smaller dimension")
        p = self.assertProblem(self.d.get("/v1/models/tiny?adapter=lora&target_modules=nope"),
                               400, "invalid_request", "'nope' is not a linear layer")
        self.assertProblem(self.d.get("/v1/models/tiny?adapter=ia3"), 400, "invalid_request",
                           "adapter: ")
        # an adapter's parameter without the adapter
        p = self.assertProblem(self.d.get("/v1/models/tiny?r=4"), 400, "invalid_request", "r: ")
        self.assertIn("adapter=lora", p["detail"])
        self.assertProblem(self.d.get("/v1/models/tiny?target_modules=all-linear"), 400,
                           "invalid_request", "target_modules: ")


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
                                         "hyperparameters": long_hp(UNENDING)}).json()
        cls.plan = j["memory"]["total_bytes"]
        cls.d.post_json("/v1/jobs/%s/cancel" % j["id"], {})
        cls.d.stop()
        cls.d.cleanup()
        cls.d = harness.Daemon(test_jobs.DAPOD, cls.ARGS + (
            "--memory-limit-bytes", str(cls.plan * 3 // 2)))
        cls.d.start()
        cls.file_id = cls.upload(test_jobs.read("addition.jsonl"))["id"]

    def test_second_job_waits_for_memory(self):
        first = self.create_ok(long_hp(UNENDING))
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
