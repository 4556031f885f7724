#!/usr/bin/python3
"""PyTorch parity (ctest label torch): our engine against tests/torch_ref/llama.py, an
independent PyTorch implementation of transformers' Llama/Qwen2.

Runs parity_dump (argv[1]) into a scratch folder, then for each model config it wrote:
  - loads the saved checkpoint (config.json + model.safetensors) with the reference loader;
  - log-probs and entropies of the response tokens:   max abs error < 1e-4
  - log-probs gen_run reports for the tokens it sampled (KV cache, a shared prompt, temperature
    0.8), recomputed by a full forward:               max abs error < 1e-4
  - gradients of sum_t w_t * logp_t, every tensor:     max abs error < 1e-3 * max |grad| of it
  - parameters after 3 AdamW steps (weight decay, clipping, warm-up), every tensor: < 1e-5 abs
    (and the pre-clip gradient norm of each step, relative 1e-4);
  - BF16 checkpoints: the log-probs C computed after ckpt_load of the BF16 file against the
    reference reading the same BF16 file (< 1e-4), and against F32 (which must differ: the
    rounding is real).
The reference runs in float64 (so the measured error is ours), and the log-probs are checked
again with the reference in float32. Prints the max errors for every config.
Exit 0 on success, 1 on any mismatch, 77 when /usr/bin/python3 cannot import torch.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as exc:  # pragma: no cover
    print("skipped: cannot import torch/numpy (%s)" % exc)
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_ref"))
import llama  # noqa: E402

TOL_LOGP = 1e-4
TOL_ENT = 1e-4
TOL_GRAD_REL = 1e-3
TOL_ADAMW = 1e-5

failures = []


def check(ok, msg):
    if not ok:
        failures.append(msg)
        print("FAIL: " + msg)


def max_abs(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def seqs_of(case):
    return [(s["tokens"], s["prompt_len"]) for s in case["seqs"]]


def run_case(case):
    name = case["name"]
    seqs = seqs_of(case)
    inv_temp = case["inv_temp"]
    vu = case["vocab_used"] if case["vocab_used"] < case["vocab_size"] else None
    report = {}

    # forward: float64 and float32 references
    ref64, dtypes = llama.load_checkpoint(case["dir"], torch.float64)
    check(all(d == "F32" for d in dtypes.values()), "%s: F32 checkpoint has dtypes %s" % (name, set(dtypes.values())))
    ref32, _ = llama.load_checkpoint(case["dir"], torch.float32)
    with torch.no_grad():
        lp64, ent64 = llama.response_logprobs(ref64, seqs, inv_temp, vu)
        lp32, ent32 = llama.response_logprobs(ref32, seqs, inv_temp, vu)
        if vu is not None:  # the padding rows matter: over every row the log-probs differ
            full, _ = llama.response_logprobs(ref64, seqs, inv_temp)
            report["padded_vs_full"] = max_abs(lp64, full)
            check(report["padded_vs_full"] > 1.0,
                  "%s: padding rows do not change the full softmax (%.3g): the test cannot fail"
                  % (name, report["padded_vs_full"]))
    report["logp"] = max_abs(case["logp"], lp64)
    report["entropy"] = max_abs(case["entropy"], ent64)
    report["logp_vs_f32ref"] = max_abs(case["logp"], lp32)
    report["entropy_vs_f32ref"] = max_abs(case["entropy"], ent32)
    check(report["logp"] < TOL_LOGP, "%s: logp max abs error %.3g" % (name, report["logp"]))
    check(report["entropy"] < TOL_ENT, "%s: entropy max abs error %.3g" % (name, report["entropy"]))
    check(report["logp_vs_f32ref"] < TOL_LOGP, "%s: logp vs float32 reference %.3g" % (name, report["logp_vs_f32ref"]))
    check(report["entropy_vs_f32ref"] < TOL_ENT,
          "%s: entropy vs float32 reference %.3g" % (name, report["entropy_vs_f32ref"]))

    # gradients of sum_t w_t logp_t, every tensor the C side dumped (all of them)
    llama.train_step(ref64, seqs, case["weights"], inv_temp, vocab_used=vu)
    params = dict(ref64.named_parameters())
    check(set(case["grads"]) == set(ref64.tensor_names()), "%s: gradient tensor names differ" % name)
    worst = 0.0
    for tname, g in case["grads"].items():
        ref = params[tname].grad
        ref = torch.zeros_like(params[tname]) if ref is None else ref
        ref = ref.reshape(-1).numpy()
        scale = float(np.max(np.abs(ref)))
        err = max_abs(g, ref)
        rel = err / scale if scale > 0 else err
        worst = max(worst, rel)
        check(rel < TOL_GRAD_REL, "%s: grad %s: max abs error %.3g, %.3g of max |grad| %.3g" % (name, tname, err, rel, scale))
    report["grad_rel"] = worst

    # tokens sampled by gen_run (KV cache, shared prefill): their log-probs under
    # softmax(logits / temperature), recomputed by a full forward of prompt + response
    gen = case["generate"]
    gseqs = [(g["prompt"] + g["tokens"], len(g["prompt"])) for g in gen["seqs"]]
    check(all(t < case["vocab_used"] for g in gen["seqs"] for t in g["tokens"]),
          "%s: gen_run sampled a padding id" % name)
    with torch.no_grad():
        glp, _ = llama.response_logprobs(ref64, gseqs, 1.0 / gen["temperature"], vu)
    report["gen_logp"] = max_abs([x for g in gen["seqs"] for x in g["logp"]], glp)
    check(report["gen_logp"] < TOL_LOGP, "%s: gen_run logp max abs error %.3g" % (name, report["gen_logp"]))
    # and the reference's own KV-cache sampler (used by bench/bench_torch.py) against its forward
    gtor = torch.Generator().manual_seed(3)
    toks, lps = llama.generate(ref64, gen["seqs"][2]["prompt"], 2, 6, gen["temperature"], generator=gtor)
    with torch.no_grad():
        rlp, _ = llama.response_logprobs(
            ref64, [(gen["seqs"][2]["prompt"] + t.tolist(), len(gen["seqs"][2]["prompt"])) for t in toks],
            1.0 / gen["temperature"])
    report["ref_kv_cache"] = max_abs(lps.reshape(-1), rlp)
    check(report["ref_kv_cache"] < 1e-9, "%s: reference KV-cache sampler vs its forward %.3g" % (name, report["ref_kv_cache"]))

    # 3 AdamW steps from the checkpoint's parameters, same batch and weights each step
    a = case["adamw"]
    ref, _ = llama.load_checkpoint(case["dir"], torch.float64)
    opt = llama.make_adamw(ref, a["lr"], (a["beta1"], a["beta2"]), a["eps"], a["weight_decay"])
    worst_norm = 0.0
    for t, st in enumerate(a["steps"]):
        lr_t = a["lr"] * min(1.0, (t + 1) / a["warmup_steps"]) if a["warmup_steps"] > 0 else a["lr"]
        check(abs(lr_t - st["lr"]) <= 1e-7 * a["lr"], "%s: step %d lr %.9g vs %.9g" % (name, t, st["lr"], lr_t))
        _, _, norm = llama.train_step(ref, seqs, case["weights"], inv_temp, opt=opt, lr=st["lr"],
                                      grad_clip=a["grad_clip"], vocab_used=vu)
        check(norm > a["grad_clip"], "%s: step %d: grad norm %.3g does not trigger clipping" % (name, t, norm))
        rel = abs(norm - st["grad_norm"]) / norm
        worst_norm = max(worst_norm, rel)
        check(rel < 1e-4, "%s: step %d grad norm %.9g vs reference %.9g" % (name, t, st["grad_norm"], norm))
    params = dict(ref.named_parameters())
    worst = 0.0
    for tname, p in a["params"].items():
        err = max_abs(p, params[tname].detach().reshape(-1).numpy())
        worst = max(worst, err)
        check(err < TOL_ADAMW, "%s: AdamW param %s max abs error %.3g" % (name, tname, err))
    report["adamw"] = worst
    report["grad_norm_rel"] = worst_norm

    # BF16: C read the BF16 file back with ckpt_load; the reference reads the same file
    if "bf16" in case:
        b = case["bf16"]
        refb, dtypes = llama.load_checkpoint(b["dir"], torch.float64)
        check(all(d == "BF16" for d in dtypes.values()), "%s: BF16 checkpoint has dtypes %s" % (name, set(dtypes.values())))
        with torch.no_grad():
            lpb, entb = llama.response_logprobs(refb, seqs, inv_temp, vu)
        report["bf16_logp"] = max_abs(b["logp"], lpb)
        report["bf16_entropy"] = max_abs(b["entropy"], entb)
        report["bf16_vs_f32"] = max_abs(b["logp"], case["logp"])
        check(report["bf16_logp"] < TOL_LOGP, "%s: BF16 logp max abs error %.3g" % (name, report["bf16_logp"]))
        check(report["bf16_entropy"] < TOL_ENT, "%s: BF16 entropy max abs error %.3g" % (name, report["bf16_entropy"]))
        check(report["bf16_vs_f32"] > 1e-4, "%s: BF16 log-probs equal the F32 ones (%.3g): no rounding?" % (name, report["bf16_vs_f32"]))

    print("%-26s " % name + "  ".join("%s %.2e" % kv for kv in report.items()))


def main():
    if len(sys.argv) != 2:
        print("usage: test_torch_parity.py PATH/TO/parity_dump")
        return 2
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="dapo-parity-")
    try:
        subprocess.run([sys.argv[1], tmp], check=True)
        with open(os.path.join(tmp, "parity.json")) as f:
            cases = json.load(f)["cases"]
        check(len(cases) >= 9, "parity_dump wrote %d configs, expected 9" % len(cases))
        check(sum("bf16" in c for c in cases) >= 1, "no BF16 case")
        print("max errors (logp/entropy abs vs float64 and float32 references; grad: fraction of the "
              "tensor's max |grad|; adamw: abs on parameters after 3 steps)")
        for case in cases:
            run_case(case)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print("%d mismatches" % len(failures))
        return 1
    print("torch parity: all %d configs agree" % len(cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
