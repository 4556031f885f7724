#!/usr/bin/python3
"""PyTorch parity (ctest label torch): our engine against tests/torch_ref/llama.py, an
independent PyTorch implementation of transformers' Llama/Qwen2/Qwen3.

Runs parity_dump (argv[1]) into a scratch folder, then for each model config it wrote:
  - loads the saved checkpoint (config.json + model.safetensors) with the reference loader;
  - log-probs and entropies of the response tokens:   max abs error < 1e-4
  - log-probs gen_run reports for the tokens it sampled (KV cache, a shared prompt, temperature
    0.8), recomputed by a full forward:               max abs error < 1e-4
  - gradients of sum_t w_t * logp_t, every tensor:     max abs error < 1e-3 * max |grad| of it
  - parameters after 3 AdamW steps (weight decay, clipping, warm-up), every tensor: < 1e-5 abs
    (and the pre-clip gradient norm of each step, relative 1e-4);
  - real config.json files (Llama 3.1/3.2, Qwen3-0.6B, TinyLlama, yarn and linear variants,
    transformers 5's rope_parameters): RoPE inverse frequencies and attention factor against
    the reference's rope_frequencies (relative 1e-6), parameter counts, and every refused
    config (dynamic/longrope RoPE, mlp_bias, sliding windows, ...) naming its key;
  - a padded vocabulary (70 ids, 80 rows whose padding logits dwarf the real ones): log-probs
    over the tokenizer's ids only, and no padding id ever sampled;
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "torch_ref"))
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


# Real config.json files (as published on the Hub) and variants: accepted ones must give the
# reference's RoPE frequencies and parameter count; refused ones must name the key.
LLAMA32_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256}
LLAMA31_8B = dict(LLAMA32_1B, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  head_dim=128, tie_word_embeddings=False,
                  rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192, "rope_type": "llama3"})
QWEN3_06B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}
TINYLLAMA = {
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 5632, "max_position_embeddings": 2048, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 22, "num_key_value_heads": 4,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 32000}
ACCEPTED = {
    "llama3.2-1b": LLAMA32_1B,
    "llama3.1-8b": LLAMA31_8B,
    "qwen3-0.6b": QWEN3_06B,
    "qwen3-0.6b-yarn": dict(QWEN3_06B, max_position_embeddings=131072, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    "qwen2.5-yarn-legacy-type": dict(QWEN3_06B, model_type="qwen2",
                                     architectures=["Qwen2ForCausalLM"], rope_scaling={
                                         "type": "yarn", "factor": 4.0,
                                         "original_max_position_embeddings": 32768}),
    "yarn-mscale-betas": dict(TINYLLAMA, rope_scaling={
        "rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707}),
    "yarn-attention-factor-no-truncate": dict(TINYLLAMA, rope_scaling={
        "rope_type": "yarn", "factor": 2.0, "attention_factor": 1.25, "truncate": False}),
    "linear": dict(TINYLLAMA, rope_scaling={"type": "linear", "factor": 4.0}),
    "default-explicit": dict(TINYLLAMA, rope_scaling={"rope_type": "default"}),
    "tinyllama": TINYLLAMA,
    "transformers5-rope-parameters": dict(
        {k: v for k, v in LLAMA32_1B.items() if k not in ("rope_scaling", "rope_theta")},
        rope_parameters=dict(LLAMA32_1B["rope_scaling"], rope_theta=500000.0)),
}
REFUSED = {  # name -> (config, the key the message must name)
    "dynamic-ntk": (dict(TINYLLAMA, rope_scaling={"type": "dynamic", "factor": 2.0}),
                    "rope_scaling.rope_type"),
    "longrope": (dict(TINYLLAMA, rope_scaling={"rope_type": "longrope", "factor": 2.0}),
                 "rope_scaling.rope_type"),
    "llama3-unknown-key": (dict(LLAMA32_1B, rope_scaling=dict(LLAMA32_1B["rope_scaling"],
                                                              short_factor=[1.0])),
                           "rope_scaling.short_factor"),
    "llama3-missing-key": (dict(LLAMA32_1B, rope_scaling={"rope_type": "llama3", "factor": 8.0}),
                           "rope_scaling.low_freq_factor"),
    "mlp-bias": (dict(TINYLLAMA, mlp_bias=True), "mlp_bias"),
    "sliding-window": (dict(QWEN3_06B, use_sliding_window=True, sliding_window=4096),
                       "use_sliding_window"),
    "layer-types": (dict(QWEN3_06B, layer_types=["full_attention"] * 27 + ["sliding_attention"]),
                    "layer_types[27]"),
    "partial-rotary": (dict(TINYLLAMA, partial_rotary_factor=0.5), "partial_rotary_factor"),
    "attention-dropout": (dict(QWEN3_06B, attention_dropout=0.1), "attention_dropout"),
    "quantized": (dict(QWEN3_06B, quantization_config={"quant_method": "awq"}),
                  "quantization_config"),
    "gelu": (dict(TINYLLAMA, hidden_act="gelu"), "hidden_act"),
    "qwen3-moe": (dict(QWEN3_06B, model_type="qwen3_moe",
                       architectures=["Qwen3MoeForCausalLM"]), "model_type"),
}


def param_count(d):
    """Parameters of a config, counted from transformers' module shapes (tied head once)."""
    C, FF, L, V = d["hidden_size"], d["intermediate_size"], d["num_hidden_layers"], d["vocab_size"]
    nh = d["num_attention_heads"]
    nkv = d.get("num_key_value_heads") or nh
    hs = d.get("head_dim") or C // nh
    q, kv = nh * hs, nkv * hs
    qwen2, qwen3 = d["model_type"] == "qwen2", d["model_type"] == "qwen3"
    bias = d.get("attention_bias", False)
    layer = 2 * C + C * q + 2 * C * kv + q * C + 3 * C * FF
    layer += (q + 2 * kv) if (qwen2 or bias) else 0
    layer += C if (bias and not qwen2) else 0
    layer += 2 * hs if qwen3 else 0
    return V * C + L * layer + C + (0 if d.get("tie_word_embeddings") else V * C)


def check_configs(dumped):
    by = {c["name"]: c for c in dumped}
    check(set(by) == set(ACCEPTED) | set(REFUSED), "configs dumped: %s" % sorted(by))
    worst = 0.0
    for name, d in ACCEPTED.items():
        got = by.get(name, {})
        if "error" in got or name not in by:
            check(False, "config %s refused: %s" % (name, got.get("error")))
            continue
        inv, att = llama.rope_frequencies(llama.Config(d))
        err = float(np.max(np.abs(np.asarray(got["inv_freq"]) - inv.double().numpy()) /
                           inv.double().numpy()))
        worst = max(worst, err)
        check(err < 1e-6, "config %s: inv_freq relative error %.3g" % (name, err))
        check(abs(got["attention_factor"] - att) < 1e-6,
              "config %s: attention factor %.9g vs %.9g" % (name, got["attention_factor"], att))
        check(got["n_params"] == param_count(d),
              "config %s: %d parameters, expected %d" % (name, got["n_params"], param_count(d)))
        # the config.json a checkpoint carries gives transformers the same RoPE
        inv2, att2 = llama.rope_frequencies(llama.Config(got["written"]))
        check(torch.equal(inv2, inv) and abs(att2 - att) < 1e-9,
              "config %s: the written config.json changes the RoPE" % name)
    for name, (d, key) in REFUSED.items():
        msg = by.get(name, {}).get("error", "")
        check(("config." + key) in msg, "config %s: error %r does not name config.%s" % (name, msg, key))
    print("%d real/variant configs: RoPE inv_freq max rel error %.2e; Qwen3-0.6B %d parameters; "
          "%d refusals name their key" % (len(ACCEPTED), worst, by["qwen3-0.6b"].get("n_params", -1),
                                          len(REFUSED)))


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
    adapter = None
    if "adapter" in case:  # a frozen base with a PEFT adapter
        adapter = llama.attach_lora(ref64, case["adapter"])
        llama.attach_lora(ref32, case["adapter"])
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
    params = adapter if adapter is not None else dict(ref64.named_parameters())
    want = set(adapter) if adapter is not None else set(ref64.tensor_names())
    check(set(case["grads"]) == want, "%s: gradient tensor names differ" % name)
    if adapter is not None:  # the frozen base got no gradient
        check(all(p.grad is None for n, p in ref64.named_parameters() if "lora_" not in n),
              "%s: the reference's base got gradients" % name)
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
    ad = llama.attach_lora(ref, case["adapter"]) if "adapter" in case else None
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
    params = ad if ad is not None else dict(ref.named_parameters())
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
        with open(os.path.join(tmp, "configs.json"), "w") as f:
            json.dump([{"name": n, "config": d} for n, d in ACCEPTED.items()] +
                      [{"name": n, "config": d} for n, (d, _) in REFUSED.items()], f)
        subprocess.run([sys.argv[1], tmp], check=True)
        with open(os.path.join(tmp, "parity.json")) as f:
            dumped = json.load(f)
        cases = dumped["cases"]
        check_configs(dumped["configs"])
        check(len(cases) >= 11, "parity_dump wrote %d configs, expected 11" % len(cases))
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
