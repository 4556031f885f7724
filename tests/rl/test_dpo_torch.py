#!/usr/bin/python3
"""Two DPO steps against an independent PyTorch float64 reference (labels torch, rl).

`dapod train` runs a DPO job (issue 27) of two steps on the tiny preset, a full fine-tune, then
a LoRA job (r 4 on q_proj, v_proj, down_proj) on the same weights as a folder: 6 pairs in one
batch each step (epochs 2), TRL text lines and OpenAI conversation lines rendered by a custom
template (one with an earlier assistant answer as context), in micro-batches of at most 16
tokens, fewer than any two pairs hold (the prompt once, both responses): each pair alone, its rejected
sequence continuing the chosen one's prompt, so that the reference's pass and step 1 hold the
same micro-batches and the same bits (step 1's rewards exactly 0 and its accuracy 0, torch's
ties; pairs packed otherwise, a GEMM of other rows may round differently), beta 0.5, label_smoothing 0.1, weight decay
0.1 and gradient clipping at 1. The reference rebuilds every pair's tokens from the lines by the
documented rules alone (docs/TRAINING.md "DPO": the prompt as context, each response and its
end token trained), with the checkpoint's own character vocabulary, and recomputes both steps
in float64 from the step-0 checkpoint with tests/torch_ref/llama.py: the sequence log-probs
under the policy and the reference (the starting weights; for LoRA the base without its
adapter), the loss -(1-ls) log sigmoid(beta h) - ls log sigmoid(-beta h), its gradient, the
norm, its clipping and torch's AdamW. Step 2 is where the policy and the reference differ.
Each job runs twice: with adam_eps 1e-6 (AdamW as trained, its first update about
lr * sign(g)), and with adam_eps 1 and learning_rate 0.5, where the first update is about lr * g,
so that each tensor's move is its gradient. Checked:
- the step-1 and step-2 weights (every weight, or the adapter's A and B): the norm of the
  difference relative to the steps' move, and each tensor's own;
- each step's metrics: train/loss, rewards/chosen, rewards/rejected, rewards/accuracy,
  rewards/margin, logps/chosen, logps/rejected, train/tokens, grad_norm;
- mutations the comparison must catch: the policy used as its own reference and each
  response's end token left out land far from dapod's step-2 weights; the prompt's tokens
  counted in the sequence log-probs move no weight (they cancel in h, both sequences sharing
  the prompt) and are caught by logps/chosen and logps/rejected.
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
    print("test_dpo_torch: %s; skipped" % exc, file=sys.stderr)
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "torch_ref"))
import llama  # noqa: E402

HP = {"batch_size": 6, "epochs": 2, "learning_rate": 3e-3, "lr_schedule": "constant",
      "weight_decay": 0.1, "grad_clip": 1.0, "adam_eps": 1e-6, "micro_batch_tokens": 16,
      "beta": 0.5, "label_smoothing": 0.1, "checkpoint_every": 1}
# The same steps with adam_eps 1 and learning_rate 0.5: AdamW's first update is then
# lr * g / (|g| + 1), close to lr * g for these gradients (|g| << 1), so that comparing each
# tensor's move compares each tensor's gradient, element by element (with adam_eps 1e-6 it is
# about lr * sign(g))
GRAD_HP = {"learning_rate": 0.5, "adam_eps": 1.0}
TEMPLATE = {"user": "U{content}|", "assistant": "A{content}|", "generation_prompt": "A",
            "stop": "|"}


# TRL's DPOTrainer.dpo_loss of z = beta * h
LOSSES = {
    "sigmoid": lambda z, beta, ls: -(1 - ls) * F.logsigmoid(z) - ls * F.logsigmoid(-z),
    "hinge": lambda z, beta, ls: torch.relu(1 - z),
    "ipo": lambda z, beta, ls: (z / beta - 1 / (2 * beta)) ** 2,
    "robust": lambda z, beta, ls: ((-(1 - ls) * F.logsigmoid(z) + ls * F.logsigmoid(-z))
                                   / (1 - 2 * ls)),
}


def msg(role, content):
    return {"role": role, "content": content}


LINES = [
    {"prompt": "12+3=", "chosen": "15", "rejected": "16"},
    {"prompt": "7*6=", "chosen": "42", "rejected": "7"},
    {"prompt": "", "chosen": "hello", "rejected": "bye"},
    {"input": {"messages": [msg("user", "hi")]},
     "preferred_output": [msg("assistant", "yo")],
     "non_preferred_output": [msg("assistant", "go away")]},
    {"input": {"messages": [msg("user", "ab"), msg("assistant", "xyz"), msg("user", "cd")]},
     "preferred_output": [msg("assistant", "q")],
     "non_preferred_output": [msg("assistant", "rs")]},
    {"messages": [msg("user", "copy me")], "chosen": "copy me",
     "rejected": [msg("assistant", "no")]},
]
TOL_NORM = 1e-4      # ||w_dapod - w_ref|| / ||w_ref - w_0||, float32 against float64
TOL_TENSOR = 1e-3    # the same, per tensor
TOL_METRIC = 1e-4    # relative (and absolute near 0)
METRICS = ["train/loss", "rewards/chosen", "rewards/rejected", "rewards/accuracy",
           "rewards/margin", "logps/chosen", "logps/rejected", "train/tokens", "grad_norm"]


def run_dapod(dapod, work, name, model="tiny", adapter=None):
    data = os.path.join(work, "pairs.jsonl")
    with open(data, "w") as f:
        for line in LINES:
            f.write(json.dumps(line) + "\n")
    body = {"method": "dpo", "model": model, "training_file": data, "seed": 3,
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
    return out, [m for m in metrics if "train/loss" in m]


def pairs(vocab, eos):
    """(prompt tokens, [chosen tokens, rejected tokens]) of every line by the documented rules,
    the tiny preset's characters one id each."""
    ids = lambda s: [vocab[c] for c in s]  # noqa: E731
    out = []
    for line in LINES:
        conv = line.get("input", {}).get("messages") or line.get("messages")
        if conv is None:  # a text prompt: its characters (BOS alone when empty), EOS ends
            prompt = ids(line["prompt"]) or [vocab["<s>"]]
            resp = [ids(line[k]) + [eos] for k in ("chosen", "rejected")]
        else:  # the template's turns, the generation prompt; the end of turn ends
            prompt = []
            for m in conv:
                prompt += ids(("U%s|A" if m["role"] == "user" else "%s|") % m["content"])
            resp = []
            for k in ("preferred_output", "non_preferred_output", "chosen", "rejected"):
                if k in line:
                    r = line[k] if isinstance(line[k], str) else line[k][0]["content"]
                    resp.append(ids(r + "|"))
        out.append((prompt, resp))
    return out


def seq_logps(model, V, prompt, resp, with_prompt=False, no_end=False):
    """Sum of log p over the response's tokens (with_prompt: the prompt's after its first too;
    no_end: without the end token)."""
    toks = prompt + resp
    h, _ = model.model(torch.tensor([toks], dtype=torch.long))
    logsm = F.log_softmax(model.lm_head(h[0, :-1])[:, :V], dim=-1)
    lp = logsm.gather(1, torch.tensor(toks[1:], dtype=torch.long)[:, None]).squeeze(1)
    lp = lp[:-1] if no_end else lp
    return lp.sum() if with_prompt else lp[len(prompt) - 1:].sum()


def reference(ck0, exs, lr, adapter0=None, with_prompt=False, self_ref=False, no_end=False):
    """Both steps from the step-0 weights at ck0 (with adapter0, the step-0 adapter folder of a
    LoRA job on the base ck0: only the adapter trains). The mutations: with_prompt counts the
    prompt's tokens in the sequence log-probs; self_ref takes the policy as its own reference;
    no_end leaves each response's end token out.
    Returns ([weights by checkpoint name after each step], [metrics of each step])."""
    model, _ = llama.load_checkpoint(ck0, torch.float64)
    lora = llama.attach_lora(model, adapter0) if adapter0 else None
    ref, _ = llama.load_checkpoint(ck0, torch.float64)  # the starting weights, the base for LoRA
    V = llama.tokenizer_id_count(os.path.join(ck0, "tokenizer.json"))
    beta, ls, kind = HP["beta"], HP["label_smoothing"], HP.get("loss_type", "sigmoid")
    with torch.no_grad():
        ref_lp = [[float(seq_logps(ref, V, p, r, with_prompt, no_end)) for r in rs]
                  for p, rs in exs]
    opt = llama.make_adamw(model, lr, eps=HP["adam_eps"], weight_decay=HP["weight_decay"])
    weights, metrics = [], []
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        if self_ref:
            with torch.no_grad():
                ref_lp = [[float(seq_logps(model, V, p, r, with_prompt, no_end)) for r in rs]
                          for p, rs in exs]
        terms, st = [], {k: 0.0 for k in METRICS}
        for (p, rs), rf in zip(exs, ref_lp):
            lp = [seq_logps(model, V, p, r, with_prompt, no_end) for r in rs]
            if kind == "ipo":  # TRL's IPO: log-probs averaged over the response's tokens
                n = [len(r) - (1 if no_end else 0) for r in rs]
                lp, rf = [lp[0] / n[0], lp[1] / n[1]], [rf[0] / n[0], rf[1] / n[1]]
            rc, rr = beta * (lp[0] - rf[0]), beta * (lp[1] - rf[1])
            z = rc - rr
            terms.append(LOSSES[kind](z, beta, ls))
            st["rewards/chosen"] += float(rc)
            st["rewards/rejected"] += float(rr)
            st["rewards/accuracy"] += float(rc > rr)
            st["rewards/margin"] += float(z)
            st["logps/chosen"] += float(lp[0])
            st["logps/rejected"] += float(lp[1])
            st["train/tokens"] += 2 * len(p) + len(rs[0]) + len(rs[1])
        loss = sum(terms) / len(exs)
        loss.backward()
        params = [q for q in model.parameters() if q.grad is not None]
        st["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, HP["grad_clip"]))
        opt.step()
        st["train/loss"] = float(loss)
        for k in ("rewards/chosen", "rewards/rejected", "rewards/accuracy", "rewards/margin",
                  "logps/chosen", "logps/rejected"):
            st[k] /= len(exs)
        named = lora if lora is not None else dict(model.named_parameters())
        weights.append({k: v.detach().numpy().copy() for k, v in named.items()})
        metrics.append(st)
    return weights, metrics


def check(dapod, work, name, failures, model="tiny", adapter=None, mutations=True):
    """Runs the job `name` and compares both steps with the reference; returns its folder."""
    out, ms = run_dapod(dapod, work, name, model, adapter)
    cks = [os.path.join(out, "checkpoints", "step-%d" % s) for s in (0, 1, 2)]
    base = cks[0] if adapter is None else model
    with open(os.path.join(base, "tokenizer.json")) as f:
        vocab = json.load(f)["model"]["vocab"]
    with open(os.path.join(base, "config.json")) as f:
        eos = json.load(f)["eos_token_id"]
    wfile = "model.safetensors" if adapter is None else "adapter_model.safetensors"
    w = [{k: v.numpy() for k, v in llama.read_safetensors(os.path.join(c, wfile))[0].items()}
         for c in cks]
    a0 = cks[0] if adapter is not None else None
    lr = ms[0]["learning_rate"]
    exs = pairs(vocab, eos)
    refw, want = reference(base, exs, lr, a0)
    names = [k for k in w[2] if k in refw[1]]
    if len(names) != len(refw[1]):
        failures.append("%s: %d tensors of the reference, %d compared" % (name, len(refw[1]),
                                                                          len(names)))

    def dist(wa, step):
        got = w[step]
        num = sum(float(np.sum((np.asarray(got[k], np.float64) - wa[k]) ** 2)) for k in names)
        den = sum(float(np.sum((wa[k] - np.asarray(w[0][k], np.float64)) ** 2)) for k in names)
        return (num / den) ** 0.5

    def tensor_worst(wa, step):
        worst, which = 0.0, ""
        for k in names:
            move = float(np.linalg.norm(wa[k] - np.asarray(w[0][k], np.float64)))
            err = float(np.linalg.norm(np.asarray(w[step][k], np.float64) - wa[k]))
            if move > 0 and err / move > worst:
                worst, which = err / move, k
        return worst, which

    rels = []
    for step in (1, 2):
        rel = dist(refw[step - 1], step)
        rels.append(rel)
        if rel > TOL_NORM:
            failures.append("%s step %d weights: ||dapod - torch|| / ||torch - w0|| = %.3e > %g"
                            % (name, step, rel, TOL_NORM))
        tw, tk = tensor_worst(refw[step - 1], step)
        if tw > TOL_TENSOR:
            failures.append("%s step %d tensor %s: %.3e of its move > %g" % (name, step, tk, tw,
                                                                              TOL_TENSOR))
        for k in METRICS:
            got, v = ms[step - 1][k], want[step - 1][k]
            if abs(got - v) > TOL_METRIC * max(1.0, abs(v)):
                failures.append("%s step %d %s: dapod %.10g, torch %.10g" % (name, step, k, got, v))
    if want[1]["rewards/margin"] == 0 or want[0]["rewards/margin"] != 0:
        failures.append("%s: step 1 should have the policy equal its reference and step 2 not"
                        % name)
    # a mutation is told apart by its step-2 weights or by a metric of either step: counting the
    # prompt's tokens moves no weight (they cancel in h: both sequences share the prompt) but
    # changes logps/chosen and logps/rejected
    muts = {}
    for mut, kw in (("prompt tokens counted", {"with_prompt": True}),
                    ("policy as its own reference", {"self_ref": True}),
                    ("end token left out", {"no_end": True})) if mutations else ():
        mw, mm = reference(base, exs, lr, a0, **kw)
        muts[mut] = dist(mw[1], 2)
        off = [k for s_ in (0, 1) for k in METRICS
               if abs(ms[s_][k] - mm[s_][k]) > 100 * TOL_METRIC * max(1.0, abs(mm[s_][k]))]
        if muts[mut] < 100 * max(rels[1], TOL_NORM / 100) and not off:
            failures.append("%s: %s is not told apart: %.3e against %.3e, no metric off"
                            % (name, mut, muts[mut], rels[1]))
        muts[mut] = "%.2e%s" % (muts[mut], " (%s off)" % ", ".join(sorted(set(off))) if off else "")
    tw, tk = tensor_worst(refw[1], 2)
    print("%s: two DPO steps against PyTorch float64: %d pairs, %d tokens a step; weights %.2e "
          "(step 1), %.2e (step 2) of the move, worst tensor %.2e (%s); step 2: loss %.8g / %.8g, "
          "rewards/margin %.6g / %.6g, rewards/accuracy %.3g / %.3g, grad norm %.8g / %.8g; "
          "mutations: %s"
          % (name, len(LINES), want[0]["train/tokens"], rels[0], rels[1], tw, tk,
             ms[1]["train/loss"], want[1]["train/loss"], ms[1]["rewards/margin"],
             want[1]["rewards/margin"], ms[1]["rewards/accuracy"], want[1]["rewards/accuracy"],
             ms[1]["grad_norm"], want[1]["grad_norm"],
             ", ".join("%s %s" % kv for kv in muts.items())))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dapod", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="dapod-dpo-torch-")
    failures = []
    adam = dict(HP)
    for kind, over in (("adam", {}), ("grad", GRAD_HP)):
        HP.clear()
        HP.update(adam, **over)
        full = check(a.dapod, work, "full-" + kind, failures)
        # LoRA on the same weights as a folder (the full job's step-0 checkpoint): the adapter
        # alone trains, the reference is the base (PEFT's start, B = 0: the first step moves B)
        check(a.dapod, work, "lora-" + kind, failures,
              model=os.path.join(full, "checkpoints", "step-0"),
              adapter={"type": "lora", "r": 4, "alpha": 8,
                       "target_modules": ["q_proj", "v_proj", "down_proj"]})
    # the other loss types (full fine-tune, each tensor's gradient): hinge, ipo, robust
    for kind in ("hinge", "ipo", "robust"):
        HP.clear()
        HP.update(adam, loss_type=kind, **GRAD_HP)
        if kind != "robust":
            HP["label_smoothing"] = 0.0  # theirs has none
        check(a.dapod, work, "full-" + kind, failures, mutations=False)
    for f in failures:
        print("FAIL: " + f, file=sys.stderr)
    if failures:
        print("kept for a look: " + work, file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
