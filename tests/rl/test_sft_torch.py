#!/usr/bin/python3
"""One supervised step against an independent PyTorch float64 reference (labels torch, rl).

`dapod train` runs one step of a supervised job (issue 27) on the tiny preset, a full
fine-tune, then a LoRA job (r 4 on q_proj, v_proj, down_proj) on the same weights as a folder:
6 examples in one batch, prompt/completion lines and chat lines rendered by a custom
template, one assistant message of weight 0, packed into micro-batches of at most 24 tokens,
weight decay 0.1 and gradient clipping at 1. The reference rebuilds every example's tokens and
trained mask from the lines by the documented rules alone (docs/TRAINING.md "Supervised
fine-tuning": the completion and EOS trained; a weight-1 assistant message's content and the
template's end of turn trained; everything else context), with the checkpoint's own character
vocabulary, and recomputes the step in float64 from the step-0 checkpoint with
tests/torch_ref/llama.py: the token mean of -log p over the batch's trained tokens, the
argmax accuracy, the gradient norm, its clipping and torch's AdamW. Checked:
- the step-1 weights (every weight, or the adapter's A and B; the norm of the difference
  relative to the step's move, each tensor's own, the largest element); each job runs twice:
  with adam_eps 1e-6 (AdamW as trained, its first update about lr * sign(g)) and with adam_eps 1
  and learning_rate 0.5, where the first update is about lr * g, so that each tensor's move is
  its gradient element by element;
- the step's metrics: train/loss, train/mean_token_accuracy, train/tokens, grad_norm;
- mutations the comparison must catch: the prompt's tokens trained too, and the weight-0
  message trained too, each land far from dapod's weights.
Exit 77 when torch or numpy is missing.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as exc:
    print("test_sft_torch: %s; skipped" % exc, file=sys.stderr)
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "torch_ref"))
import llama  # noqa: E402

HP = {"batch_size": 6, "epochs": 1, "learning_rate": 3e-3, "lr_schedule": "constant",
      "weight_decay": 0.1, "grad_clip": 1.0, "adam_eps": 1e-6, "micro_batch_tokens": 24,
      "checkpoint_every": 1}
# The same step with adam_eps 1 and learning_rate 0.5 (as test_dpo_torch.py): AdamW's first
# update is then lr * g / (|g| + 1), close to lr * g for these gradients (|g| << 1), so that
# comparing each tensor's move compares each tensor's gradient element by element (with
# adam_eps 1e-6 it is about lr * sign(g), which checks little more than the gradient's signs)
GRAD_HP = {"learning_rate": 0.5, "adam_eps": 1.0}
TEMPLATE = {"user": "U{content}|", "assistant": "A{content}|", "generation_prompt": "A",
            "stop": "|"}
LINES = [
    {"prompt": "12+3=", "completion": "15"},
    {"prompt": "7*6=", "completion": "42"},
    {"prompt": "", "completion": "hello"},
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
    {"messages": [{"role": "user", "content": "ab"},
                  {"role": "assistant", "content": "xyz", "weight": 0},
                  {"role": "user", "content": "cd"}, {"role": "assistant", "content": "q"}]},
    {"messages": [{"role": "user", "content": "copy me"},
                  {"role": "assistant", "content": "copy me"}]},
]
TOL_NORM = 1e-4      # ||w_dapod - w_ref|| / ||w_ref - w_0||, float32 against float64
TOL_TENSOR = 1e-3    # the same, per tensor
TOL_METRIC = 1e-4    # relative (and absolute near 0)


def run_dapod(dapod, work, name, model="tiny", adapter=None):
    data = os.path.join(work, "data.jsonl")
    with open(data, "w") as f:
        for line in LINES:
            f.write(json.dumps(line) + "\n")
    body = {"method": "supervised", "model": model, "training_file": data, "seed": 3,
            "chat_template": TEMPLATE, "hyperparameters": HP}
    if adapter:
        body["adapter"] = adapter
    cfg = os.path.join(work, name + ".json")
    with open(cfg, "w") as f:
        json.dump(body, f)
    out = os.path.join(work, name)
    p = subprocess.run([dapod, "train", "--config", cfg, "--out", out, "--threads", "1"],
                       capture_output=True, text=True, timeout=300)
    if p.returncode:
        sys.exit("dapod train failed:\n" + p.stderr[-3000:])
    metrics = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    return out, [m for m in metrics if "train/loss" in m][0]


def examples(vocab, eos, train_prompt=False, train_weight0=False):
    """(tokens, trained mask) of every line by the documented rules, the tiny preset's
    characters one id each; the mutations train what must not be."""
    ids = lambda s: [vocab[c] for c in s]  # noqa: E731
    out = []
    for line in LINES:
        toks, mask = [], []

        def put(text, trained):
            t = ids(text)
            toks.extend(t)
            mask.extend([trained] * len(t))
        if "prompt" in line:
            put(line["prompt"] or "", 1 if train_prompt else 0)
            if not toks:  # an empty prompt encodes as BOS alone
                toks.append(vocab["<s>"])
                mask.append(0)
            put(line["completion"], 1)
            toks.append(eos)
            mask.append(1)
        else:
            for m in line["messages"]:
                if m["role"] == "user":
                    put("U%s|A" % m["content"], 1 if train_prompt else 0)
                else:
                    w = m.get("weight", 1) == 1 or train_weight0
                    put(m["content"] + "|", 1 if w else 0)
            # the last user message's text was written as context before the next assistant
        out.append((toks, mask))
    return out


def reference(ck0, exs, lr, adapter0=None):
    """The step from the step-0 weights at ck0 (with adapter0, the step-0 adapter folder of a
    LoRA job on the base ck0: only the adapter trains). Returns (weights by checkpoint name,
    metrics)."""
    model, _ = llama.load_checkpoint(ck0, torch.float64)
    lora = llama.attach_lora(model, adapter0) if adapter0 else None
    V = llama.tokenizer_id_count(os.path.join(ck0, "tokenizer.json"))
    opt = llama.make_adamw(model, lr, eps=HP["adam_eps"], weight_decay=HP["weight_decay"])
    model.zero_grad(set_to_none=True)
    total, nll, hits, terms = sum(sum(m) for _, m in exs), 0.0, 0, []
    for toks, mask in exs:
        ids = torch.tensor([toks], dtype=torch.long)
        h, _ = model.model(ids)
        logits = model.lm_head(h[0, :-1])[:, :V]  # row t-1 predicts token t
        logsm = F.log_softmax(logits, dim=-1)
        tgt = torch.tensor(toks[1:], dtype=torch.long)
        keep = torch.tensor([bool(m) for m in mask[1:]])
        lp = logsm.gather(1, tgt[:, None]).squeeze(1)[keep]
        terms.append(-lp.sum() / total)
        nll += float(-lp.sum())
        hits += int((logits.argmax(-1) == tgt)[keep].sum())
    loss = sum(terms)
    loss.backward()
    params = [p for p in model.parameters() if p.grad is not None]
    norm = float(torch.nn.utils.clip_grad_norm_(params, HP["grad_clip"]))
    opt.step()
    named = lora if lora is not None else dict(model.named_parameters())
    w = {k: v.detach().numpy() for k, v in named.items()}
    return w, {"train/loss": nll / total, "train/mean_token_accuracy": hits / total,
               "train/tokens": total, "grad_norm": norm}


def check(dapod, work, name, failures, model="tiny", adapter=None):
    """Runs the job `name` and compares its step with the reference; returns its output folder."""
    out, m = run_dapod(dapod, work, name, model, adapter)
    ck0, ck1 = (os.path.join(out, "checkpoints", "step-%d" % s) for s in (0, 1))
    base = ck0 if adapter is None else model
    with open(os.path.join(base, "tokenizer.json")) as f:
        vocab = json.load(f)["model"]["vocab"]
    with open(os.path.join(base, "config.json")) as f:
        eos = json.load(f)["eos_token_id"]
    wfile = "model.safetensors" if adapter is None else "adapter_model.safetensors"
    w0 = {k: v.numpy() for k, v in llama.read_safetensors(os.path.join(ck0, wfile))[0].items()}
    w1 = {k: v.numpy() for k, v in llama.read_safetensors(os.path.join(ck1, wfile))[0].items()}
    a0 = ck0 if adapter is not None else None
    ref, want = reference(base, examples(vocab, eos), m["learning_rate"], a0)
    names = [k for k in w1 if k in ref]
    if len(names) != len(ref):
        failures.append("%s: %d tensors of the reference, %d compared" % (name, len(ref),
                                                                          len(names)))

    def dist(wa):
        num = sum(float(np.sum((np.asarray(w1[k], np.float64) - wa[k]) ** 2)) for k in names)
        den = sum(float(np.sum((wa[k] - np.asarray(w0[k], np.float64)) ** 2)) for k in names)
        worst = max(float(np.max(np.abs(np.asarray(w1[k], np.float64) - wa[k]))) for k in names)
        return (num / den) ** 0.5, worst

    def tensor_worst(wa):
        worst, which = 0.0, ""
        for k in names:
            move = float(np.linalg.norm(wa[k] - np.asarray(w0[k], np.float64)))
            err = float(np.linalg.norm(np.asarray(w1[k], np.float64) - wa[k]))
            if move > 0 and err / move > worst:
                worst, which = err / move, k
        return worst, which

    rel, worst = dist(ref)
    if rel > TOL_NORM:
        failures.append("%s weights: ||dapod - torch|| / ||torch - w0|| = %.3e > %g"
                        % (name, rel, TOL_NORM))
    tw, tk = tensor_worst(ref)
    if tw > TOL_TENSOR:
        failures.append("%s tensor %s: %.3e of its move > %g" % (name, tk, tw, TOL_TENSOR))
    for k, v in want.items():
        if abs(m[k] - v) > TOL_METRIC * max(1.0, abs(v)):
            failures.append("%s %s: dapod %.10g, torch %.10g" % (name, k, m[k], v))
    if want["train/mean_token_accuracy"] <= 0:
        failures.append("no trained token is the argmax: the accuracy check compares nothing")
    muts = {}
    for mut, kw in (("prompt tokens trained", {"train_prompt": True}),
                    ("weight-0 message trained", {"train_weight0": True})):
        mw, _ = reference(base, examples(vocab, eos, **kw), m["learning_rate"], a0)
        muts[mut], _ = dist(mw)
        if muts[mut] < 100 * max(rel, TOL_NORM / 100):
            failures.append("%s: %s is not told apart: %.3e against %.3e"
                            % (name, mut, muts[mut], rel))
    print("%s: supervised step against PyTorch float64: %d examples, %d trained tokens; weights "
          "%.2e (relative to the step's move), largest element %.2e, worst tensor %.2e (%s) "
          "(lr %g, adam_eps %g); loss %.8g / %.8g, token accuracy %.6g / %.6g, grad norm %.8g / "
          "%.8g; mutations: %s"
          % (name, len(LINES), want["train/tokens"], rel, worst, tw, tk, m["learning_rate"],
             HP["adam_eps"],
             m["train/loss"], want["train/loss"], m["train/mean_token_accuracy"],
             want["train/mean_token_accuracy"], m["grad_norm"], want["grad_norm"],
             ", ".join("%s %.2e" % kv for kv in muts.items())))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dapod", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="dapod-sft-torch-")
    failures = []
    adam = dict(HP)
    for kind, over in (("adam", {}), ("grad", GRAD_HP)):
        HP.clear()
        HP.update(adam, **over)
        full = check(a.dapod, work, "full-" + kind, failures)
        # LoRA on the same weights as a folder (the full job's step-0 checkpoint): the adapter
        # alone trains (PEFT's start, B = 0: the first step moves B)
        check(a.dapod, work, "lora-" + kind, failures,
              model=os.path.join(full, "checkpoints", "step-0"),
              adapter={"type": "lora", "r": 4, "alpha": 8,
                       "target_modules": ["q_proj", "v_proj", "down_proj"]})
    for f in failures:
        print("FAIL: " + f, file=sys.stderr)
    if failures:
        print("kept for a look: " + work, file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
