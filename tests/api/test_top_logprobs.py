#!/usr/bin/python3
"""top_logprobs on both completion routes, checked against PyTorch (labels api, torch).

Two model folders: the tiny preset as `dapod save-preset` writes it (a character tokenizer) and a
random Llama whose tokenizer is byte-level BPE over the 256 bytes alone, so that most of what it
samples is a piece of a UTF-8 character, and whose embedding has padding rows past the
tokenizer's ids. tests/torch_ref/llama.py loads each folder in float64 and recomputes every
position's log_softmax(logits / temperature) over the tokenizer's ids; its top k (ties by id) is
the reference.

- /v1/chat/completions, greedy and at temperature 0.7 with top_p 0.5, top_logprobs 20: each
  content entry's top_logprobs are the reference's 20 likeliest, most likely first, each log-prob
  within 1e-4 (the distribution after temperature and before top_p truncation: the truncated one
  would sum to 1 over the nucleus); the sampled token's logprob equals its own entry exactly;
  greedy: the sampled token is the first entry. `bytes` is each token's raw byte (a piece of a
  character included), `token` its text (U+FFFD for such a piece).
- /v1/completions with OpenAI's integer logprobs (0..5): top_logprobs per token as {token:
  logprob}, the same values as the chat route's for the same prompt; the boolean keeps its
  shape (no top_logprobs).
- Streamed (chat and completions): the chunks' entries, concatenated, equal the whole reply's
  for the same seed, top_logprobs included (n = 2, sampled at temperature 1).
- Refusals: top_logprobs over 20, negative, not an integer, or without logprobs: true (400,
  param top_logprobs); logprobs not a boolean (param logprobs); the legacy integer over 5,
  negative or fractional (422 naming logprobs).

Exit 77 when torch or numpy is missing.

Run: /usr/bin/python3 tests/api/test_top_logprobs.py --dapod build/server/dapod
"""

import json
import os
import shutil
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "torch_ref"))
try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    import llama  # noqa: E402
except ImportError as exc:
    print("test_top_logprobs: %s; skipped" % exc, file=sys.stderr)
    sys.exit(77)
import harness  # noqa: E402,F401
import test_jobs  # noqa: E402

TOL = 1e-4
K = 20
PROMPT = "What is 1+1?"

BYTES_CFG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 272,
             "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
             "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
             "rope_scaling": None, "tie_word_embeddings": False, "bos_token_id": 256,
             "eos_token_id": 256, "hidden_act": "silu", "torch_dtype": "float32"}


def byte_chars():
    """GPT-2's bytes_to_unicode: byte -> the printable character byte-level BPE writes it as."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_bytes_model(folder):
    """A random Llama (seeded) over a byte-level tokenizer: ids 0..255 are the bytes, 256 is
    <|endoftext|>, 257..271 are padding rows."""
    os.makedirs(folder)
    torch.manual_seed(3)
    model = llama.LlamaForCausalLM(llama.Config(BYTES_CFG))
    with torch.no_grad():
        for p in model.parameters():  # sharper distributions than the default initialisation
            if p.dim() == 2:
                p.mul_(4.0)
    llama.write_safetensors(os.path.join(folder, "model.safetensors"),
                            {n: t.detach().numpy().astype(np.float32)
                             for n, t in model.state_dict().items()})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(BYTES_CFG, f)
    chars = byte_chars()
    tok = {"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [{"id": 256, "content": "<|endoftext|>", "single_word": False,
                             "lstrip": False, "rstrip": False, "normalized": False,
                             "special": True}],
           "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                             "use_regex": True},
           "post_processor": None,
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                       "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None,
                     "continuing_subword_prefix": None, "end_of_word_suffix": None,
                     "fuse_unk": False, "byte_fallback": False,
                     "vocab": {chars[b]: b for b in range(256)}, "merges": []}}
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)


def reference(model, prompt_ids, gen_ids, vocab_used, temperature):
    """float64 log_softmax(logits / temperature) (temperature 0: 1) over the tokenizer's ids at
    every generated position: [len(gen_ids), vocab_used]."""
    ids = torch.tensor([prompt_ids + gen_ids[:-1]], dtype=torch.long)
    with torch.no_grad():
        logits, _ = model(ids)
    rows = logits[0, len(prompt_ids) - 1:, :vocab_used].double()
    return F.log_softmax(rows / (temperature if temperature > 0 else 1.0), dim=-1)


def ref_top(row, k):
    """The k likeliest ids of a reference row, ties by id, with their log-probs."""
    order = sorted(range(row.shape[0]), key=lambda j: (-float(row[j]), j))[:k]
    return order, [float(row[j]) for j in order]


class TopLogprobs(test_jobs.DaemonCase):
    ARGS = ("--workers", "1", "--blas-threads", "1")

    @classmethod
    def prepare(cls):
        cls.models = {}
        tiny = os.path.join(cls.d.models_dir, "lp-tiny")
        r = subprocess.run([test_jobs.DAPOD, "save-preset", "tiny", tiny], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        write_bytes_model(os.path.join(cls.d.models_dir, "lp-bytes"))
        for name in ("lp-tiny", "lp-bytes"):
            folder = os.path.join(cls.d.models_dir, name)
            model, _ = llama.load_checkpoint(folder, torch.float64)
            vu = llama.tokenizer_id_count(os.path.join(folder, "tokenizer.json"))
            with open(os.path.join(folder, "tokenizer.json"), encoding="utf-8") as f:
                vocab = json.load(f)["model"]["vocab"]
            cls.models[name] = (model, vu, vocab)
        cls.worst = {}

    @classmethod
    def tearDownClass(cls):
        for k, v in sorted(cls.worst.items()):
            print("%s: max |logprob - torch float64| %.2e" % (k, v), file=sys.stderr)
        super().tearDownClass()

    def chat(self, status=200, **kw):
        body = dict({"model": "lp-tiny", "messages": [{"role": "user", "content": PROMPT}],
                     "max_tokens": 12, "seed": 3, "logprobs": True, "top_logprobs": K}, **kw)
        r = self.d.post_json("/v1/chat/completions", body)
        self.assertEqual(r.status, status, r.body[:500])
        return r.json()

    def complete(self, **kw):
        body = dict({"model": "lp-tiny", "prompt": PROMPT, "max_tokens": 12, "seed": 3,
                     "logprobs": 5}, **kw)
        return self.assertJson(self.d.post_json("/v1/completions", body), 200)

    def token_id(self, name, entry):
        """The id of a chat entry's token: by its byte for the byte model, else by its text."""
        _, _, vocab = self.models[name]
        if name == "lp-bytes":
            if entry["token"] == "<|endoftext|>":
                return 256
            self.assertEqual(len(entry["bytes"]), 1, entry)
            return entry["bytes"][0]
        return vocab[entry["token"]]

    def check_against_torch(self, name, temperature, **kw):
        model, vu, _ = self.models[name]
        # the prompt's ids (the chat prompt of the default template is the user's text) and the
        # tokens, from the legacy route with the same sampling
        leg = self.complete(model=name, temperature=temperature, **kw)["choices"][0]["logprobs"]
        got = self.chat(model=name, temperature=temperature, **kw)
        content = got["choices"][0]["logprobs"]["content"]
        self.assertEqual([e["token"] for e in content], leg["tokens"])
        ref = reference(model, leg["prompt_token_ids"], leg["token_ids"], vu, temperature)
        worst = 0.0
        for t, e in enumerate(content):
            top = e["top_logprobs"]
            self.assertEqual(len(top), K)
            ids, lps = ref_top(ref[t], K)
            mine = [self.token_id(name, a) for a in top]
            for a, entry in enumerate(top):
                # rank by rank the reference's value, and each id's own reference value
                worst = max(worst, abs(entry["logprob"] - lps[a]),
                            abs(entry["logprob"] - float(ref[t][mine[a]])))
                if a:
                    self.assertLessEqual(entry["logprob"], top[a - 1]["logprob"])
                    if entry["logprob"] == top[a - 1]["logprob"]:
                        self.assertGreater(mine[a], mine[a - 1])
            near = [j for j in range(K) if ids[j] != mine[j]]
            for j in near:  # only a near-tie may order differently from float64
                self.assertLess(abs(lps[j] - float(ref[t][mine[j]])), TOL, (t, j, ids, mine))
            # the sampled token: its logprob is its entry's, exactly
            tok = leg["token_ids"][t]
            self.assertEqual(self.token_id(name, e), tok)
            listed = [a for a in top if self.token_id(name, a) == tok]
            if listed:
                self.assertEqual(listed[0]["logprob"], e["logprob"])
            if temperature == 0:
                self.assertEqual(mine[0], tok)
            # the legacy route: the same values, keyed by text, its top 5 (a text two of them
            # decode to, U+FFFD, keeps the likelier's)
            want = {}
            for a in top[:5]:
                want.setdefault(a["token"], a["logprob"])
            self.assertEqual(list(leg["top_logprobs"][t].items()), list(want.items()))
            self.assertEqual(leg["token_logprobs"][t], e["logprob"])
        key = "%s T=%g%s" % (name, temperature, " top_p=%g" % kw["top_p"] if kw else "")
        self.worst[key] = worst
        self.assertLess(worst, TOL, key)
        return content

    def test_1_tiny_greedy(self):
        self.check_against_torch("lp-tiny", 0)

    def test_2_tiny_temperature_before_top_p(self):
        content = self.check_against_torch("lp-tiny", 0.7, top_p=0.5)
        # untruncated: the listed probabilities are those of the whole vocabulary, under 1 in
        # sum, not renormalised over the nucleus
        self.assertLess(sum(2.718281828459045 ** a["logprob"] for a in content[0]["top_logprobs"]),
                        1.0)

    def test_3_bytes_model(self):
        content = self.check_against_torch("lp-bytes", 0.9)
        partial = 0
        for e in content:
            for a in [e] + e["top_logprobs"]:
                if a["token"] == "<|endoftext|>":  # a special token: its text's bytes
                    self.assertEqual(bytes(a["bytes"]), b"<|endoftext|>")
                    continue
                self.assertEqual(len(a["bytes"]), 1, a)
                b = a["bytes"][0]
                if b >= 0x80:  # a piece of a character: its raw byte, its text U+FFFD
                    partial += 1
                    self.assertEqual(a["token"], "\ufffd")
                else:
                    self.assertEqual(a["token"].encode("utf-8"), bytes([b]))
        self.assertGreater(partial, 20)

    def stream(self, path, body):
        """The chunks of body streamed (its `data:` lines but [DONE])."""
        r = self.d.post_json(path, dict(body, stream=True))
        self.assertEqual(r.status, 200, r.body[:300])
        return [json.loads(x[6:]) for x in r.body.decode().split("\n\n")
                if x.startswith("data: {")]

    def test_4_stream_equals_whole(self):
        for name in ("lp-tiny", "lp-bytes"):
            body = {"model": name, "messages": [{"role": "user", "content": PROMPT}],
                    "max_tokens": 10, "n": 2, "seed": 11, "temperature": 1.0,
                    "logprobs": True, "top_logprobs": 4}
            whole = self.chat(**body)
            chunks = self.stream("/v1/chat/completions", body)
            for i, w in enumerate(whole["choices"]):
                got = [e for c in chunks for ch in c["choices"] if ch["index"] == i and
                       ch.get("logprobs") for e in ch["logprobs"]["content"]]
                self.assertEqual(got, w["logprobs"]["content"])
                self.assertTrue(all(len(e["top_logprobs"]) == 4 for e in got))
            leg = {"model": name, "prompt": PROMPT, "max_tokens": 10, "n": 2, "seed": 11,
                   "temperature": 1.0, "logprobs": 3}
            whole = self.complete(**leg)
            chunks = self.stream("/v1/completions", leg)
            for i, w in enumerate(whole["choices"]):
                mine = [ch["logprobs"] for c in chunks for ch in c["choices"] if ch["index"] == i]
                self.assertEqual(sum((m["top_logprobs"] for m in mine), []),
                                 w["logprobs"]["top_logprobs"])
                self.assertEqual(sum((m["token_logprobs"] for m in mine), []),
                                 w["logprobs"]["token_logprobs"])

    def test_5_legacy_shapes(self):
        lp = self.complete(logprobs=True)["choices"][0]["logprobs"]
        self.assertNotIn("top_logprobs", lp)
        self.assertEqual(len(lp["tokens"]), len(lp["token_logprobs"]))
        lp0 = self.complete(logprobs=0)["choices"][0]["logprobs"]
        self.assertNotIn("top_logprobs", lp0)
        self.assertEqual(lp0["token_logprobs"], lp["token_logprobs"])
        for k in (1, 5):
            tops = self.complete(logprobs=k)["choices"][0]["logprobs"]["top_logprobs"]
            self.assertEqual([len(d) for d in tops], [k] * len(lp["tokens"]))
        self.assertIsNone(self.complete(logprobs=False)["choices"][0]["logprobs"])
        # chat: logprobs without top_logprobs lists none; top_logprobs 0 the same
        for kw in ({"top_logprobs": None}, {"top_logprobs": 0}):
            c = self.chat(**kw)["choices"][0]["logprobs"]["content"]
            self.assertTrue(c and all(e["top_logprobs"] == [] for e in c))

    def test_6_refusals(self):
        for kw in ({"top_logprobs": 21}, {"top_logprobs": -1}, {"top_logprobs": 1.5},
                   {"top_logprobs": "3"}, {"logprobs": False}, {"logprobs": None},
                   {"logprobs": False, "top_logprobs": 0}):
            err = self.chat(400, **kw)["error"]
            self.assertEqual((err["param"], err["type"], err["code"]),
                             ("top_logprobs", "invalid_request_error", "invalid_value"), kw)
        err = self.chat(400, logprobs="yes", top_logprobs=None)["error"]
        self.assertEqual(err["param"], "logprobs")
        for bad in (6, -1, 2.5, "3"):
            r = self.d.post_json("/v1/completions", {"model": "lp-tiny", "prompt": "hi",
                                                     "logprobs": bad})
            self.assertProblem(r, 422, "validation_failed")
            self.assertEqual([e["field"] for e in r.json()["errors"]], ["logprobs"])


if __name__ == "__main__":
    sys.exit(test_jobs.main())
