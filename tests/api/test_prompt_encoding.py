#!/usr/bin/python3
"""One prompt encoding for every way of sampling (label api), on a model folder whose
tokenizer.json has a Llama-3-style post-processor (tests/data/llama3_style_tokenizer.json: a
TemplateProcessing that puts <|begin_of_text|> before the text):
- POST /v1/completions encodes the prompt as the reference's tokenizer(prompt) does: the BOS
  first, then the text's tokens;
- `dapod generate MODEL --prompt P --seed S` prints exactly the samples the daemon returns for
  the same prompt, seed and options (the same tokens, text, finish and summed log-prob), so the
  command line samples from the same prompt ids (it once encoded without the BOS);
- a prompt plus --max-tokens past the model's context is refused by `dapod generate` with the
  sizes named.

Run: /usr/bin/python3 tests/api/test_prompt_encoding.py --dapod build/server/dapod
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_jobs  # noqa: E402

TOKENIZER = os.path.join(HERE, "..", "data", "llama3_style_tokenizer.json")
BOS, EOS = 97, 98  # <|begin_of_text|>, <|end_of_text|> in that file
MODEL = "llama3-style"


def make_folder(dapod, path):
    """The tiny preset's weights (99 embedding rows) with the Llama-3-style tokenizer (99 ids)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    r = subprocess.run([dapod, "save-preset", "tiny", path, "--seed", "7"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    shutil.copy(TOKENIZER, os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    cfg["bos_token_id"], cfg["eos_token_id"] = BOS, EOS
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)


class PromptEncoding(test_jobs.DaemonCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="dapod-enc-")
        cls.folder = os.path.join(cls.tmp, "models", MODEL)
        make_folder(test_jobs.DAPOD, cls.folder)
        cls.ARGS = test_jobs.DaemonCase.ARGS + ("--models-dir", os.path.join(cls.tmp, "models"))
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        try:
            super().tearDownClass()
        finally:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def generate(self, *args):
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")  # as the daemon's --blas-threads 1
        return subprocess.run([test_jobs.DAPOD, "generate", self.folder] + list(args),
                              capture_output=True, text=True, timeout=120, env=env)

    def test_generate_samples_what_completions_samples(self):
        for prompt, seed, n in (("the cat sat", 5, 3), ("Hello, world! 12345", 11, 1)):
            c = self.assertJson(self.d.post_json("/v1/completions", {
                "model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 1.0,
                "n": n, "seed": seed, "logprobs": True}), 200)
            ids = c["choices"][0]["logprobs"]["prompt_token_ids"]
            # tokenizer(prompt): the BOS, then one id per character but "th" (a merge)
            self.assertEqual(ids[0], BOS, ids)
            self.assertEqual(ids.count(BOS), 1, ids)
            self.assertEqual(len(ids), 1 + len(prompt) - prompt.count("th"), ids)
            self.assertEqual(c["usage"]["prompt_tokens"], len(ids))
            want = ""
            for i, ch in enumerate(c["choices"]):
                lp = ch["logprobs"]["token_logprobs"]
                total = 0.0
                for x in lp:  # summed in the order dapod generate sums them
                    total += x
                want += "--- sample %d: %d tokens, finish %s, logprob %.3f\n%s%s\n" % (
                    i, len(lp), ch["finish_reason"], total, prompt, ch["text"])
            r = self.generate("--prompt", prompt, "--max-tokens", "12", "--temperature", "1.0",
                              "--n", str(n), "--seed", str(seed))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout, want, "dapod generate vs POST /v1/completions for %r, "
                             "seed %d" % (prompt, seed))

    def test_generate_refuses_a_prompt_past_the_context(self):
        # "the cat sat" is 1 + 10 tokens; the tiny preset's context is 512
        r = self.generate("--prompt", "the cat sat", "--max-tokens", "502")
        self.assertEqual(r.returncode, 1, r)
        self.assertIn("the prompt has 11 tokens; with 502 tokens to generate that exceeds the "
                      "model's context of 512", r.stderr)
        r = self.generate("--prompt", "the cat sat", "--max-tokens", "501")
        self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    sys.exit(test_jobs.main())
