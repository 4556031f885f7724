#!/usr/bin/python3
"""A multi-turn DAPO step against an independent PyTorch float64 reference (labels torch, rl).

`dapod train` runs one step of an episode job on the tiny preset: 16 episodes of 3 turns
against the stand-in environment (tests/rl/env_server.py), the reward the environment's, 2
epochs over one minibatch (the second epoch's ratios leave 1, so clipping acts), kl_coef 0.05
against the starting weights, gradient clipping at 1. From its rollouts alone (every episode's
prompt, token_ids, loss_mask and advantage) and its step-0 checkpoint, tests/torch_ref/llama.py
recomputes the step in float64: the log-probs of the tokens the mask marks (the model's), the
clipped surrogate with clip-higher and the k3 KL on them, the token-mean over the minibatch's
model tokens, the gradient, its clipping and torch's AdamW, twice. Checked:
- the step-1 weights against the reference's (the norm of the difference relative to the step's
  move: float32 against float64 through two Adam updates, adam_eps 1e-6);
- the step's metrics: loss, pre-clip gradient norm, clipped fractions, approx KL, KL to the
  reference, the learning rate;
- the mask matters: the same reference training the world's tokens too (the environment's
  observations, loss_mask 0) lands far from dapod's weights (a mutation the comparison must
  catch).
Exit 77 when torch or numpy is missing.
"""
import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as exc:
    print("test_episode_torch: %s; skipped" % exc, file=sys.stderr)
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "torch_ref"))
import llama  # noqa: E402

HP = {"total_steps": 1, "checkpoint_every": 1, "group_size": 8, "prompt_batch_size": 2,
      "dynamic_sampling": False, "max_new_tokens": 6, "minibatch_size": 16, "epochs": 2,
      "learning_rate": 3e-3, "kl_coef": 0.05, "grad_clip": 1.0, "temperature": 1.0,
      "overlong_buffer": 0, "adam_eps": 1e-6}
EPISODE = {"max_turns": 3, "max_new_tokens_per_turn": 2, "max_answer_tokens": 8,
           "reward": "environment"}
# ||w_dapod - w_ref|| / ||w_ref - w_0||, float32 against float64 through two Adam updates. Adam
# moves an element by lr * g / (|g| + eps): where |g| is near eps, float32's rounding of g moves
# it by a visible part of lr. With eps 1e-8 the difference measured 6.5e-4 (the metrics agreeing
# to 3e-5); the job sets adam_eps 1e-6, with which it measures 1.0e-5.
TOL_NORM = 1e-4
TOL_METRIC = 1e-4    # relative (and absolute near 0)


def run_dapod(dapod, work, port):
    data = os.path.join(work, "data.jsonl")
    with open(data, "w") as f:
        for i in range(2):
            f.write(json.dumps({"prompt": "guess %d:" % i, "answer": str(3 + 4 * i)}) + "\n")
    ep = dict(EPISODE, environment={"type": "http", "url": "http://127.0.0.1:%d/guess" % port})
    body = {"model": "tiny", "training_file": data, "seed": 11, "judge": {"type": "exact"},
            "hyperparameters": HP, "episode": ep}
    cfg = os.path.join(work, "job.json")
    with open(cfg, "w") as f:
        json.dump(body, f)
    out = os.path.join(work, "out")
    p = subprocess.run([dapod, "train", "--config", cfg, "--out", out, "--threads", "1"],
                       capture_output=True, text=True, timeout=300)
    if p.returncode:
        sys.exit("dapod train failed:\n" + p.stderr[-3000:])
    metrics = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    with open(os.path.join(out, "rollouts", "step-1.jsonl")) as f:
        rows = [json.loads(x) for x in f if x.strip()]
    return out, rows, [m for m in metrics if "policy/loss" in m][0]


def masked_logprobs(model, seqs):
    """log-probs of every token a mask marks: seqs is [(tokens, prompt_len, mask after the
    prompt)]; returns one tensor per sequence."""
    out = []
    for toks, plen, mask in seqs:
        logp, _ = llama.response_logprobs(model, [(toks, plen)])
        keep = torch.tensor([bool(m) for m in mask])
        out.append(logp[keep])
    return out


def reference(w0_path, rows, lr, train_world=False):
    """The step in float64 from the rollouts: returns (weights, per-update stats)."""
    model, _ = llama.load_checkpoint(w0_path, torch.float64)
    ref = copy.deepcopy(model)
    for p in ref.parameters():
        p.requires_grad_(False)
    seqs, adv = [], []
    for r in rows:
        if not r["in_loss"]:
            continue
        mask = [1] * len(r["loss_mask"]) if train_world else r["loss_mask"]
        seqs.append((r["prompt_token_ids"] + r["token_ids"], len(r["prompt_token_ids"]), mask))
        adv.append(r["advantage"])
    with torch.no_grad():
        old = masked_logprobs(model, seqs)
        lref = masked_logprobs(ref, seqs)
    tot = sum(len(x) for x in old)  # token-mean over the minibatch's trained tokens
    opt = llama.make_adamw(model, lr, betas=(0.9, 0.999), eps=HP["adam_eps"], weight_decay=0.0)
    stats = []
    lo, hi = 1 - 0.2, 1 + 0.28
    for epoch in range(HP["epochs"]):
        model.zero_grad(set_to_none=True)
        lp = masked_logprobs(model, seqs)
        loss, clip_low, clip_high, akl, kl_sum, n = 0, 0, 0, 0.0, 0.0, 0
        for x, o, rf, a in zip(lp, old, lref, adv):
            ratio = torch.exp(x - o)
            s1, s2 = ratio * a, torch.clamp(ratio, lo, hi) * a
            pg = -torch.minimum(s1, s2)
            d = rf - x
            k3 = torch.exp(d) - d - 1
            loss = loss + ((pg + HP["kl_coef"] * k3) / tot).sum()
            clip_low += int(((ratio < lo) & (a < 0)).sum())
            clip_high += int(((ratio > hi) & (a > 0)).sum())
            akl += float((o - x).sum())
            kl_sum += float(k3.sum())
            n += len(x)
        loss.backward()
        params = [p for p in model.parameters() if p.grad is not None]
        norm = float(torch.nn.utils.clip_grad_norm_(params, HP["grad_clip"]))
        opt.step()
        stats.append({"loss": float(loss), "grad_norm": norm, "clip_low": clip_low / n,
                      "clip_high": clip_high / n, "approx_kl": akl / n, "kl_ref": kl_sum / n})
    return {k: v.detach().numpy() for k, v in model.named_parameters()}, stats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dapod", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="dapod-episode-torch-")
    env = subprocess.Popen(["/usr/bin/python3", os.path.join(HERE, "env_server.py"),
                            os.path.join(work, "env.log")], stdout=subprocess.PIPE, text=True)
    failures = []
    try:
        port = int(env.stdout.readline())
        out, rows, m = run_dapod(a.dapod, work, port)
    finally:
        env.kill()
        env.wait()
        env.stdout.close()
    try:
        ck0, ck1 = (os.path.join(out, "checkpoints", "step-%d" % s) for s in (0, 1))
        w1 = {k: v.numpy() for k, v in
              llama.read_safetensors(os.path.join(ck1, "model.safetensors"))[0].items()}
        w0 = {k: v.numpy() for k, v in
              llama.read_safetensors(os.path.join(ck0, "model.safetensors"))[0].items()}
        in_loss = [r for r in rows if r["in_loss"]]
        world = sum(len(r["loss_mask"]) - sum(r["loss_mask"]) for r in in_loss)
        model_tokens = sum(sum(r["loss_mask"]) for r in in_loss)
        if not in_loss or not world:
            failures.append("the step trained %d episodes with %d world tokens: nothing to check"
                            % (len(in_loss), world))
        ref, stats = reference(ck0, rows, m["policy/lr"])
        names = [k for k in w1 if k in ref]

        def dist(wa):
            num = sum(float(np.sum((np.asarray(w1[k], np.float64) - wa[k]) ** 2)) for k in names)
            den = sum(float(np.sum((wa[k] - np.asarray(w0[k], np.float64)) ** 2)) for k in names)
            worst = max(float(np.max(np.abs(np.asarray(w1[k], np.float64) - wa[k])))
                        for k in names)
            return (num / den) ** 0.5, worst

        rel, worst = dist(ref)
        if rel > TOL_NORM:
            failures.append("weights: ||dapod - torch|| / ||torch - w0|| = %.3e > %g"
                            % (rel, TOL_NORM))
        # the metrics (averages over the two updates)
        want = {"policy/loss": np.mean([s["loss"] for s in stats]),
                "policy/grad_norm": np.mean([s["grad_norm"] for s in stats]),
                "policy/clip_frac_low": np.mean([s["clip_low"] for s in stats]),
                "policy/clip_frac_high": np.mean([s["clip_high"] for s in stats]),
                "policy/approx_kl": np.mean([s["approx_kl"] for s in stats]),
                "policy/kl_ref": np.mean([s["kl_ref"] for s in stats])}
        for k, v in want.items():
            if abs(m[k] - v) > TOL_METRIC * max(1.0, abs(v)):
                failures.append("%s: dapod %.8g, torch %.8g" % (k, m[k], v))
        clipped = sum(s["clip_low"] + s["clip_high"] for s in stats)
        if clipped == 0:
            failures.append("no token was clipped: the second epoch's ratios stayed in range")
        # mutations the comparison must catch: the world's tokens trained as the model's
        mut, _ = reference(ck0, rows, m["policy/lr"], train_world=True)
        mrel, _ = dist(mut)
        if mrel < 100 * max(rel, TOL_NORM / 100):
            failures.append("training the world's tokens too is not told apart: %.3e against %.3e"
                            % (mrel, rel))
        print("episode step against PyTorch float64: %d episodes in the loss, %d model and %d "
              "world tokens; weights %.2e (relative to the step's move), largest element %.2e (lr %g); "
              "loss %.6g / %.6g, grad norm %.6g / %.6g, clipped low %.4f high %.4f; the world "
              "trained too: %.2e" % (len(in_loss), model_tokens, world, rel, worst,
                                     m["policy/lr"], m["policy/loss"], want["policy/loss"],
                                     m["policy/grad_norm"], want["policy/grad_norm"],
                                     want["policy/clip_frac_low"], want["policy/clip_frac_high"],
                                     mrel))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
