#!/usr/bin/python3
"""The PyTorch side of bench/run.sh (see bench/README.md), the pairing with our engine, and the
final report.

  bench_torch.py --probe                      thread settings tried on the small model; JSON line
  bench_torch.py --model NAME [--engine PATH] [--probe-file F] [--train-steps N] [--gen-reps N]
                 [--gen-new N] [--busy]       PyTorch's figures for one model; with --engine, our
                                              engine (bench_engine --serve, a child process) is
                                              measured alternately with PyTorch; JSON lines. --busy:
                                              the generation measurements beside a CPU hog on the
                                              last CPU (hog.py), both sides alike
  bench_torch.py --model NAME --engine PATH --methods PATH [--probe-file F] [--train-steps N]
                                              the DAPO update, a supervised step and a DPO step at
                                              the training shape: ours (bench_engine --serve,
                                              bench_methods) alternately with PyTorch's; JSON line
  bench_torch.py --report FILE...             the comparison table from those JSON lines (needs
                                              no torch)
  bench_torch.py --scale FOLDER --rollouts FILE [--lora R,ALPHA] [--micro-seqs N]
                                              one DAPO step's work at a real model folder's shape
                                              (bench/scale.py): generation of the rollouts'
                                              prompts x group, old log-probs and the update on the
                                              same sequences dapod trained; one JSON line

The model is tests/torch_ref/llama.py's (transformers' eager Llama), the work the same as
bench_engine's: a training step (response log-probs + entropies of 16 x 256 packed tokens with
prompts of 64 as TRL's GRPO trainer computes them (trl_logprobs), loss sum_t w_t logp_t,
backward, clip_grad_norm_, torch.optim.AdamW) and
generation with a KV cache (llama.generate: shared prefill, then one eager [B, 1] forward per
token with the cache grown by torch.cat; temperature 1, no stop tokens). Threads: intra-op via
torch.set_num_threads, OpenBLAS's pool via openblas_set_num_threads on the libopenblas.so.0 that
torch itself loaded. Reports, never fails on time.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from hog import start_hog, stop_hog

HERE = os.path.dirname(os.path.abspath(__file__))
N_SEQ, SEQ_LEN, PROMPT_LEN, GEN_PROMPT, GEN_BATCH = 16, 256, 64, 32, 16


def selective_logp(torch, logits, targets):
    """log softmax(logits)[target] per row as TRL computes it (trl.trainer.utils.
    selective_log_softmax, float32): the target's logit minus the row's logsumexp, without the
    [R, V] log-softmax tensor."""
    return logits.gather(1, targets[:, None]).squeeze(1) - torch.logsumexp(logits, dim=-1)


def trl_logprobs(torch, llama, model, seqs, inv_temp=1.0, entropy=True):
    """The response log-probs (with autograd) and entropies (without) of packed (prompt, response)
    sequences as TRL's GRPO trainer computes them for its update (_get_per_token_logps_and_
    entropies): logits scaled by the temperature (nothing at 1), the selective log-softmax, and
    the entropy, a metric, under torch.no_grad (entropy_from_logits). The peer of dapod's
    train_forward, whose entropies come from the softmax pass it makes anyway."""
    ids, rows, cols, targets = llama._pad(seqs)
    h, _ = model.model(ids)
    logits = model.lm_head(h[rows, cols])
    if inv_temp != 1.0:
        logits = logits * inv_temp
    logp = selective_logp(torch, logits, targets)
    ent = None
    if entropy:
        with torch.no_grad():
            lsm = torch.nn.functional.log_softmax(logits, dim=-1)
            ent = -(lsm.exp() * lsm).sum(-1)
    return logp, ent

MODELS = {
    "tiny": dict(vocab_size=32, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                 num_attention_heads=4),
    "small": dict(vocab_size=512, hidden_size=288, intermediate_size=768, num_hidden_layers=6,
                  num_attention_heads=6),
    "medium": dict(vocab_size=4096, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                   num_attention_heads=8),
    # Qwen2.5-0.5B's shape, bench_engine's qwen-0.5b (q/k/v biases, tied, GQA 14/2), for
    # --gen-only: PyTorch's LM head computes all 151,936 rows, as transformers does for the real
    # model (ours the 151,665 its tokenizer uses)
    "qwen-0.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=896,
                      intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                      num_key_value_heads=2, tie_word_embeddings=True, rms_norm_eps=1e-6),
}


def rss_kib():
    """Peak resident set of this process, KiB (VmHWM; ru_maxrss as a fallback)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


# ---------------------------------------------------------------------------------------------
# measuring (imports torch lazily so that --report works anywhere)


class Torch:
    def __init__(self):
        import ctypes
        import torch

        sys.path.insert(0, os.path.join(HERE, "..", "tests", "torch_ref"))
        import llama

        self.torch, self.llama = torch, llama
        self.rss_after_import = rss_kib()
        self.blas = None
        for path in [l.split()[-1] for l in open("/proc/self/maps") if "openblas" in l]:
            if path.endswith(".so") or ".so." in path:
                self.blas = ctypes.CDLL(path)
                break
        if self.blas is not None:
            self.blas.openblas_get_corename.restype = ctypes.c_char_p

    def corename(self):
        return self.blas.openblas_get_corename().decode() if self.blas else "unknown"

    def set_threads(self, torch_threads, blas_threads):
        self.torch.set_num_threads(torch_threads)
        if self.blas is not None:
            self.blas.openblas_set_num_threads(blas_threads)

    def threads(self):
        b = self.blas.openblas_get_num_threads() if self.blas else -1
        return self.torch.get_num_threads(), b

    def model(self, name):
        torch, llama = self.torch, self.llama
        d = dict(dict(model_type="llama", max_position_embeddings=512, rms_norm_eps=1e-5,
                      tie_word_embeddings=False), **MODELS[name])
        torch.manual_seed(1)
        m = llama.LlamaForCausalLM(llama.Config(d))
        with torch.no_grad():
            for n, p in m.named_parameters():
                if n.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02)
        return m

    def batch(self, vocab, n_seq=N_SEQ):
        g = self.torch.Generator().manual_seed(5)
        seqs = []
        for _ in range(n_seq):
            toks = self.torch.randint(0, vocab, (SEQ_LEN,), generator=g).tolist()
            seqs.append((toks, PROMPT_LEN))
        R = n_seq * (SEQ_LEN - PROMPT_LEN)
        w = (self.torch.randn(R, generator=g) / R).tolist()
        return seqs, w

    def trainer(self, model, n_seq=N_SEQ):
        """A function running one training step, returning (step, forward, backward, optimizer)
        seconds: response log-probs and entropies (trl_logprobs), loss sum_t w_t logp_t, backward,
        clip_grad_norm_, AdamW."""
        torch, llama = self.torch, self.llama
        seqs, w = self.batch(model.config.vocab_size, n_seq)
        opt = llama.make_adamw(model, 1e-6)
        wt = torch.tensor(w)

        def step():
            t0 = time.perf_counter()
            model.zero_grad(set_to_none=True)
            logp, ent = trl_logprobs(torch, llama, model, seqs, 1.0)
            loss = (wt * logp).sum()
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            t3 = time.perf_counter()
            return (t3 - t0, t1 - t0, t2 - t1, t3 - t2)

        return step

    def gen_once(self, model, n, new, seed):
        """Seconds of one generation: n continuations of the shared prompt, new tokens each."""
        torch = self.torch
        g = torch.Generator().manual_seed(7)
        prompt = torch.randint(0, model.config.vocab_size, (GEN_PROMPT,), generator=g).tolist()
        g.manual_seed(seed)
        t0 = time.perf_counter()
        self.llama.generate(model, prompt, n, new, 1.0, generator=g)
        return time.perf_counter() - t0


SETTINGS = [(1, 2), (2, 1), (2, 2), (1, 1)]  # (torch intra-op threads, OpenBLAS threads)


def probe(args):
    """Tries each thread setting on the small model: a training step of 8 x 256 tokens and short
    generations (batch 16 and 1, 24 new tokens). Two rounds over the settings, interleaved, keep
    each setting's best figure (the machine is shared: a slow round is someone else's load)."""
    T = Torch()
    m = T.model("small")
    T.set_threads(1, 2)
    step = T.trainer(m, n_seq=8)
    step()  # allocator, thread pools
    res = {s: dict(train=0.0, gen16=0.0, gen1=0.0) for s in SETTINGS}
    for _ in range(2):
        for tt, bt in SETTINGS:
            T.set_threads(tt, bt)
            r = res[(tt, bt)]
            r["train"] = max(r["train"], 8 * SEQ_LEN / step()[0])
            r["gen16"] = max(r["gen16"], GEN_BATCH * 24 / T.gen_once(m, GEN_BATCH, 24, 1))
            r["gen1"] = max(r["gen1"], 24 / T.gen_once(m, 1, 24, 1))
    rows = []
    for (tt, bt), r in res.items():
        rows.append(dict(torch_threads=tt, blas_threads=bt, **r))
        print("probe torch %d / OpenBLAS %d: train %.0f tok/s, generate b16 %.0f, b1 %.0f tok/s"
              % (tt, bt, r["train"], r["gen16"], r["gen1"]), file=sys.stderr)
    best = {k: max(rows, key=lambda r: r[k]) for k in ("train", "gen16", "gen1")}
    out = dict(side="torch", kind="probe", rows=rows,
               best={k: [v["torch_threads"], v["blas_threads"]] for k, v in best.items()},
               corename=T.corename())
    print(json.dumps(out))


class Engine:
    """bench_engine --serve as a child process: one command, one JSON answer."""

    def __init__(self, path, model, gen_new, gen_batch=GEN_BATCH, train=True):
        cmd = [path, "--model", model, "--serve", "--gen-new", str(gen_new)]
        if gen_batch != GEN_BATCH:
            cmd += ["--gen-batch", str(gen_batch)]
        if not train:
            cmd += ["--phase", "gen"]  # no training state (a 0.5B one would not be needed)
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = self.read()

    def read(self):
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("bench_engine exited (status %s)" % self.p.wait())
        r = json.loads(line)
        if "error" in r:
            raise RuntimeError("bench_engine: " + r["error"])
        return r

    def ask(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return self.read()

    def close(self):
        info = self.ask("info")
        self.p.stdin.write("quit\n")
        self.p.stdin.close()
        self.p.wait()
        return info


def med(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def measure(args):
    """PyTorch's figures for one model; with --engine, our engine's too, measured alternately
    (ours, torch, torch, ours, ...) so that a change of load hits both sides alike. The ratio of
    each pair of measurements is kept: their median is the reported speed-up."""
    T = Torch()
    best = {"train": [1, 2], "gen16": [1, 2], "gen1": [1, 2]}  # BENCHMARKS.md's best, by default
    if args.probe_file:
        with open(args.probe_file) as f:
            best = json.loads(f.read())["best"]
    B = args.gen_batch
    eng = (Engine(args.engine, args.model, args.gen_new, B, not args.gen_only) if args.engine
           else None)
    m = T.model(args.model)
    n_params = sum(p.numel() for p in m.parameters())
    settle = 0.2  # s between sides: spinning BLAS / OpenMP workers of the other side go idle

    def paired(n, ours_fn, torch_fn):
        """n measurements of each side after one warm-up each, order alternating per pair."""
        ours, peer = [], []
        if eng:
            ours_fn()
        torch_fn()
        for i in range(n):
            first_ours = i % 2 == 0
            for side in ((0, 1) if first_ours else (1, 0)):
                if side == 0 and eng:
                    time.sleep(settle)
                    ours.append(ours_fn())
                elif side == 1:
                    time.sleep(settle if eng else 0)
                    peer.append(torch_fn())
        return ours, peer

    out_t = dict(side="torch", kind="model", model=args.model, params=n_params,
                 corename=T.corename(), torch_version=T.torch.__version__,
                 rss_kib_after_import=T.rss_after_import)
    pair = dict(side="pair", kind="pair", model=args.model)
    # training (not with --gen-only)
    if not args.gen_only:
        T.set_threads(*best["train"])
        step = T.trainer(m)
        ours, peer = paired(args.train_steps,
                            lambda: eng.ask("train"),
                            lambda: dict(zip(("step_s", "forward_s", "backward_s", "adamw_s"),
                                             step())))
        tr = {k: med([p[k] for p in peer]) for k in peer[0]}
        tr.update(tok_s=N_SEQ * SEQ_LEN / tr["step_s"], steps=len(peer),
                  settings="torch %d / OpenBLAS %d" % T.threads())
        out_t["train"] = tr
        out_t["peak_rss_kib_train"] = rss_kib()
        print("%s: torch train %.0f tok/s, step %.3f s = forward %.3f + backward %.3f + adamw %.3f "
              "(%s)" % (args.model, tr["tok_s"], tr["step_s"], tr["forward_s"], tr["backward_s"],
                        tr["adamw_s"], tr["settings"]), file=sys.stderr)
        if eng:
            o = {k: med([p[k] for p in ours]) for k in ours[0]}
            o.update(tok_s=N_SEQ * SEQ_LEN / o["step_s"], steps=len(ours))
            eng.info["train"] = o
            pair["train"] = med([p["step_s"] / q["step_s"] for p, q in zip(peer, ours)])
            print("%s: ours  train %.0f tok/s, step %.3f s = forward %.3f + backward %.3f + "
                  "adamw %.3f" % (args.model, o["tok_s"], o["step_s"], o["forward_s"],
                                  o["backward_s"], o["adamw_s"]), file=sys.stderr)
    # generation
    out_t["gen"] = {}
    if eng:
        eng.info["gen"] = {}
    seeds = iter(range(1000, 100000))
    hog = start_hog() if args.busy else None
    pair["busy"] = out_t["busy"] = bool(args.busy)
    if eng:
        eng.info["busy"] = bool(args.busy)
        # the decoding split a job would use, chosen by measuring on the machine as it is now
        # (beside the hog when busy), as the runner does before a job's first step
        tuned = eng.ask("tune")
        eng.info["gen_split"] = tuned["split"]
        print("%s: ours decoding split (gen_state_tune, %.1f s): %s"
              % (args.model, tuned["seconds"], tuned["split"]), file=sys.stderr)
    for key, n in (("b%d" % B, B), ("b1", 1)):
        T.set_threads(*best["gen16" if n > 1 else "gen1"])
        ours, peer = paired(args.gen_reps,
                            # gen16: bench_engine's larger batch (its --gen-batch)
                            lambda: eng.ask("gen%d %d" % (16 if n > 1 else 1,
                                                          next(seeds)))["seconds"],
                            lambda: T.gen_once(m, n, args.gen_new, next(seeds)))
        t = med(peer)
        out_t["gen"][key] = dict(batch=n, seconds=t, tok_s=n * args.gen_new / t,
                                 settings="torch %d / OpenBLAS %d" % T.threads())
        msg = "%s: generate batch %2d: torch %.0f tok/s (%s)" % (
            args.model, n, n * args.gen_new / t, out_t["gen"][key]["settings"])
        if eng:
            to = med(ours)
            eng.info["gen"][key] = dict(batch=n, seconds=to, tok_s=n * args.gen_new / to)
            pair[key] = med([p / q for p, q in zip(peer, ours)])
            msg += ", ours %.0f tok/s" % (n * args.gen_new / to)
        print(msg + (" (busy: a CPU hog on the last CPU)" if hog else ""), file=sys.stderr)
    stop_hog(hog)
    out_t["peak_rss_kib"] = rss_kib()
    if eng:
        info = eng.close()
        eng.info["peak_rss_kib"] = info["peak_rss_kib"]
        print(json.dumps(eng.info))
        print(json.dumps(pair))
    print(json.dumps(out_t))


# ---------------------------------------------------------------------------------------------
# supervised and DPO steps (bench_methods), beside the DAPO update, alternately with PyTorch

DPO_BETA = 0.1


def method_steps(T, model):
    """PyTorch's supervised and DPO steps at the training benchmark's shape, as functions returning
    (step, forward, backward, optimizer) seconds like Torch.trainer's. sft: token-mean
    cross-entropy over the 192 response tokens of each of 16 sequences (F.cross_entropy on the
    LM head's response rows) and its token accuracy (argmax), backward, clip_grad_norm_, AdamW.
    dpo: 8 pairs (sequences 2k and 2k+1 share their 64-token prompt), sequence log-probs of the
    responses (selective_logp, as TRL's DPO trainer), -logsigmoid(beta * ((c - c_ref) -
    (r - r_ref))) averaged over pairs against reference log-probs computed once (not timed),
    backward, clip_grad_norm_, AdamW."""
    torch, llama = T.torch, T.llama
    F = torch.nn.functional
    seqs, _ = T.batch(model.config.vocab_size)
    seqs = [(seqs[i - i % 2][0][:PROMPT_LEN] + toks[PROMPT_LEN:], p)
            for i, (toks, p) in enumerate(seqs)]
    ids, rows, cols, targets = llama._pad(seqs)
    opt = llama.make_adamw(model, 1e-6)
    n_resp = SEQ_LEN - PROMPT_LEN

    def logits():
        h, _ = model.model(ids)
        return model.lm_head(h[rows, cols])

    def seq_logp(lg):
        return selective_logp(torch, lg, targets).view(N_SEQ, n_resp).sum(1)

    with torch.no_grad():
        ref = seq_logp(logits())

    def timed(loss_fn):
        def step():
            t0 = time.perf_counter()
            model.zero_grad(set_to_none=True)
            loss = loss_fn(logits())
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            t3 = time.perf_counter()
            return dict(step_s=t3 - t0, forward_s=t1 - t0, backward_s=t2 - t1, adamw_s=t3 - t2)
        return step

    def sft_loss(lg):
        loss = F.cross_entropy(lg, targets)
        with torch.no_grad():
            (lg.argmax(-1) == targets).float().mean()  # token accuracy, as dapod reports it
        return loss

    def dpo_loss(lg):
        s = seq_logp(lg) - ref
        return -F.logsigmoid(DPO_BETA * (s[0::2] - s[1::2])).mean()

    return {"sft": timed(sft_loss), "dpo": timed(dpo_loss)}


def methods(args):
    """The DAPO update (bench_engine --serve's train), a supervised step and a DPO step
    (bench_methods), each ours and PyTorch's alternately at the same shape and threads; one JSON
    line with the medians and the median ratio of the pairs of each work."""
    T = Torch()
    best = {"train": [1, 2]}
    if args.probe_file:
        with open(args.probe_file) as f:
            best = json.loads(f.read())["best"]
    shape = MODELS[args.model]
    eng = Engine(args.engine, args.model, args.gen_new)
    mp = subprocess.Popen([args.methods, "--shape", "%d,%d,%d,%d,%d" % (
        shape["vocab_size"], shape["hidden_size"], shape["intermediate_size"],
        shape["num_hidden_layers"], shape["num_attention_heads"])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    meth = Engine.__new__(Engine)
    meth.p = mp
    meth.info = meth.read()
    m = T.model(args.model)
    T.set_threads(*best["train"])
    fns = method_steps(T, m)
    dapo = T.trainer(m)
    fns["dapo"] = lambda: dict(zip(("step_s", "forward_s", "backward_s", "adamw_s"), dapo()))
    out = dict(side="methods", kind="methods", model=args.model, flops=eng.info["train_flops"],
               tokens_per_step=N_SEQ * SEQ_LEN, settings="torch %d / OpenBLAS %d" % T.threads(),
               load_before=open("/proc/loadavg").read().split()[:3], ours={}, torch={}, ratio={})
    for work in ("dapo", "sft", "dpo"):
        side = eng if work == "dapo" else meth
        cmd = "train" if work == "dapo" else work
        side.ask(cmd), fns[work]()  # a warm-up step each, not kept
        ours, peer = [], []
        for i in range(args.train_steps):
            for s in ((0, 1) if i % 2 == 0 else (1, 0)):
                time.sleep(0.2)
                if s == 0:
                    ours.append(side.ask(cmd))
                else:
                    peer.append(fns[work]())
        o = {k: med([p[k] for p in ours]) for k in ours[0]}
        t = {k: med([p[k] for p in peer]) for k in peer[0]}
        o["tok_s"], t["tok_s"] = N_SEQ * SEQ_LEN / o["step_s"], N_SEQ * SEQ_LEN / t["step_s"]
        out["ours"][work], out["torch"][work] = o, t
        out["ratio"][work] = med([p["step_s"] / q["step_s"] for p, q in zip(peer, ours)])
        out["pairs"] = len(ours)
        print("%s %s: ours %.0f tok/s, torch %.0f tok/s, ours/torch %.2fx (median of %d pairs)"
              % (args.model, work, o["tok_s"], t["tok_s"], out["ratio"][work], len(ours)),
              file=sys.stderr)
    out["load_after"] = open("/proc/loadavg").read().split()[:3]
    eng.close()
    meth.close()
    print(json.dumps(out))


# ---------------------------------------------------------------------------------------------
# realistic scale (bench/scale.py): one DAPO step's work on a model folder


def load_folder(T, folder):
    """The folder's model in float32, tensor by tensor from a memory map (no second copy of the
    file in memory: the peak RSS is the model's)."""
    import numpy as np
    torch, llama = T.torch, T.llama
    with open(os.path.join(folder, "config.json")) as f:
        cfg = llama.Config(json.load(f))
    torch.manual_seed(1)
    with torch.no_grad():
        m = llama.LlamaForCausalLM(cfg)
    path = os.path.join(folder, "model.safetensors")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    params = dict(m.named_parameters())
    with torch.no_grad():
        for name in m.tensor_names():
            info = header[name]
            b, e = info["data_offsets"]
            a = raw[b:e]
            if info["dtype"] == "BF16":
                a = (a.view("<u2").astype(np.uint32) << 16).view(np.float32)
            else:
                a = a.view("<f4")
            params[name].copy_(torch.from_numpy(np.ascontiguousarray(a)).reshape(info["shape"]))
    del raw
    m.eval()
    return m


def write_adapter(folder, model, r, alpha, linear):
    """A PEFT adapter folder for attach_lora: every linear layer but the head, A drawn as PEFT
    (kaiming-uniform, bound 1/sqrt(in)), B small (not 0: the adapter's work is the same either
    way, a non-zero B only keeps the update from being trivially zero)."""
    import math
    import numpy as np
    rng = np.random.default_rng(3)
    tensors = {}
    for name, mod in model.named_modules():
        if isinstance(mod, linear) and name != "lm_head":
            fan_in, fan_out = mod.in_features, mod.out_features
            tensors["base_model.model.%s.lora_A.weight" % name] = rng.uniform(
                -1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in), (r, fan_in)).astype("<f4")
            tensors["base_model.model.%s.lora_B.weight" % name] = (
                rng.standard_normal((fan_out, r)) * 1e-3).astype("<f4")
    header, off = {}, 0
    for k, v in tensors.items():
        header[k] = dict(dtype="F32", shape=list(v.shape), data_offsets=[off, off + v.nbytes])
        off += v.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "adapter_model.safetensors"), "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h)
        for v in tensors.values():
            f.write(v.tobytes())
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(dict(peft_type="LORA", r=r, lora_alpha=alpha, target_modules="all-linear",
                       use_rslora=False, lora_dropout=0.0, bias="none"), f)


def scale(args):
    """One DAPO step's work as dapod's runner does it, on the rollouts dapod sampled: generation
    (the step's prompts, group_size continuations each, as many new tokens as dapod's longest
    response: one batch, each prompt's prefill run once and its cache expanded to its group, then
    one eager [B, 1] forward a token), the old-log-prob pass (no grad) over every trained response
    but the first minibatch's, and the update: per minibatch, forward and backward of
    sum_t w_t logp_t in micro-batches of --micro-seqs sequences (gradients accumulated),
    clip_grad_norm_ and AdamW. Responses with advantage 0 are left out as dapod leaves them out.
    Times in seconds; tokens counted as dapod counts them (prompt + response)."""
    import tempfile
    T = Torch()
    torch, llama = T.torch, T.llama
    T.set_threads(args.torch_threads, args.blas_threads)
    rows = [json.loads(l) for l in open(args.rollouts) if l.strip()]
    t0 = time.perf_counter()
    m = load_folder(T, args.scale)
    load_s = time.perf_counter() - t0
    trainable = sum(p.numel() for p in m.parameters())
    n_params = trainable
    if args.lora:
        r, alpha = (int(x) for x in args.lora.split(","))
        with tempfile.TemporaryDirectory() as d:
            write_adapter(d, m, r, alpha, torch.nn.Linear)
            named = llama.attach_lora(m, d)
        trainable = sum(p.numel() for p in named.values())
    out = dict(side="torch", kind="scale", lora=bool(args.lora), params=n_params,
               trainable_parameters=trainable, corename=T.corename(),
               torch_version=torch.__version__, load_s=load_s,
               rss_kib_after_import=T.rss_after_import,
               settings="torch %d / OpenBLAS %d" % T.threads())
    # generation: the step's prompts, in group order
    prompts, group = [], 0
    for row in rows:
        if row["index"] == 0:
            prompts.append(row["prompt_token_ids"])
    group = sum(1 for row in rows if row["group"] == rows[0]["group"])
    new = max(row["length"] for row in rows)
    if len(set(len(p) for p in prompts)) != 1:  # one batch needs equal prompt lengths
        prompts = [prompts[0]] * len(prompts)
        out["note"] = "prompts of different lengths: the first one used for every group"
    g = torch.Generator().manual_seed(7)
    t0 = time.perf_counter()
    with torch.no_grad():
        past = None
        lasts = []
        for p in prompts:  # one prefill a prompt, its cache expanded to its group
            logits, pp = m(torch.tensor([p], dtype=torch.long))
            pp = [(k.expand(group, -1, -1, -1), v.expand(group, -1, -1, -1)) for k, v in pp]
            past = pp if past is None else [(torch.cat((a[0], b[0])), torch.cat((a[1], b[1])))
                                            for a, b in zip(past, pp)]
            lasts.append(logits[:, -1, :].expand(group, -1))
        last = torch.cat(lasts)
        B = last.shape[0]
        for t in range(new):
            logsm = torch.nn.functional.log_softmax(last, dim=-1)
            tok = torch.multinomial(logsm.exp(), 1, generator=g)
            if t + 1 == new:
                break
            logits, past = m(tok, past=past)
            last = logits[:, -1, :]
    gen_s = time.perf_counter() - t0
    out.update(gen_s=gen_s, gen_tokens=B * new, gen_batch=B, gen_new=new,
               prompt_tokens=len(prompts[0]))
    print("torch generate: %d x %d tokens in %.1f s: %.1f tok/s" % (B, new, gen_s, B * new / gen_s),
          file=sys.stderr, flush=True)
    del past, logits, last
    # the update's sequences: dapod's, those with a non-zero advantage, in minibatches
    seqs = [(r["prompt_token_ids"] + r["response_token_ids"], len(r["prompt_token_ids"]),
             r["advantage"]) for r in rows if r.get("in_loss", True)]
    mb = args.minibatch or max(1, len(seqs) // 4)
    minibatches = [seqs[i:i + mb] for i in range(0, len(seqs), mb)]
    run = [[s for s in b if s[2] != 0] for b in minibatches]
    opt = llama.make_adamw(m, 1e-6)

    def micro(b):
        return [b[i:i + args.micro_seqs] for i in range(0, len(b), args.micro_seqs)]

    t0 = time.perf_counter()
    old_tokens = 0
    with torch.no_grad():
        for b in run[1:]:  # the first minibatch's forward is pi_old's (dapod skips its pass)
            for mbat in micro(b):  # log-probs only (no entropy), as dapod's pass
                ids, rr, cc, tg = llama._pad([(s[0], s[1]) for s in mbat])
                h, _ = m.model(ids)
                selective_logp(torch, m.lm_head(h[rr, cc]), tg)
                del h
                old_tokens += sum(len(s[0]) for s in mbat)
    old_s = time.perf_counter() - t0
    print("torch old log-probs: %d tokens in %.1f s" % (old_tokens, old_s), file=sys.stderr,
          flush=True)
    m.train()
    t0 = time.perf_counter()
    upd_tokens = 0
    for b in run:
        m.zero_grad(set_to_none=True)
        n_tok = sum(len(s[0]) - s[1] for s in b) or 1
        for mbat in micro(b):
            logp, _ = trl_logprobs(torch, llama, m, [(s[0], s[1]) for s in mbat], 1.0)
            w = torch.cat([torch.full((len(s[0]) - s[1],), s[2] / n_tok) for s in mbat])
            (w * logp).sum().backward()
            upd_tokens += sum(len(s[0]) for s in mbat)
        torch.nn.utils.clip_grad_norm_([p for p in m.parameters() if p.requires_grad], 1.0)
        opt.step()
    upd_s = time.perf_counter() - t0
    print("torch update: %d tokens in %.1f s" % (upd_tokens, upd_s), file=sys.stderr, flush=True)
    out.update(old_s=old_s, old_tokens=old_tokens, update_s=upd_s, update_tokens=upd_tokens,
               micro_seqs=args.micro_seqs, minibatch=mb,
               step_s=gen_s + old_s + upd_s, peak_rss_kib=rss_kib())
    print(json.dumps(out))


# ---------------------------------------------------------------------------------------------
# report


def report(files):
    recs = []
    for fn in files:
        with open(fn) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    recs.append(json.loads(line))
                    recs[-1]["_file"] = os.path.basename(fn)
    sgs = [r for r in recs if r.get("kind") == "sgemm"]
    pr = next((r for r in recs if r.get("kind") == "probe"), None)
    ours = {r["model"]: r for r in recs if r.get("kind") == "model" and r["side"] == "ours"}
    peer = {r["model"]: r for r in recs if r.get("kind") == "model" and r["side"] == "torch"}
    pairs = {r["model"]: r for r in recs if r.get("kind") == "pair"}
    peak = max(r["peak_n"] for r in sgs) if sgs else None
    print()
    for sg in sgs:
        print("SGEMM peak (%s): %.1f GFLOP/s at 1 thread, %.1f at %d threads; M=16 decode shape "
              "%.1f; OpenBLAS core %s" % (sg["_file"], sg["peak_1"], sg["peak_n"],
                                          sg["threads"], sg["sgemm_m16"], sg["corename"]))
    if pr:
        print("PyTorch thread probe (small model, tok/s, best of 2): " + "; ".join(
            "torch %d/BLAS %d: train %.0f, gen16 %.0f, gen1 %.0f"
            % (r["torch_threads"], r["blas_threads"], r["train"], r["gen16"], r["gen1"])
            for r in pr["rows"]))
    any_ours = next(iter(ours.values()), None)
    if any_ours:
        print("ours: %d threads: %s (OpenBLAS core %s)" %
              (any_ours["threads"], any_ours.get("engine_threads", "OpenBLAS threads"),
               any_ours["corename"]))
    print("GFLOP/s: model FLOPs (bench_engine.c's header), train = 3 x (2 N P_blk + 2 R V C + "
          "4 L NH HS sum T(T+1)/2); %% peak: of the best measured SGEMM at the configured threads "
          "(%s GFLOP/s)" % ("%.1f" % peak if peak else "?"))
    if pairs:
        print("ours/torch: median of the ratios of alternating pairs of measurements "
              "(robust to load changes); tok/s: medians")
    print()
    hdr = ("model", "work", "ours tok/s", "torch tok/s", "ours/torch", "ours GFLOP/s", "% peak",
           "torch GFLOP/s", "% peak", "peak RSS ours MiB", "peak RSS torch MiB", "torch setting")
    rows = []
    for name in MODELS:
        if name not in ours:
            continue
        o, p, pa = ours[name], peer.get(name), pairs.get(name, {})
        gens = sorted(o.get("gen", {}), key=lambda k: -int(k[1:]))
        for work, key in [("train", "train")] + [("gen " + k, k) for k in gens]:
            if work == "train" and "train" not in o:
                continue
            if work == "train":
                ot, pt = o.get("train"), p["train"] if p else None
                flops = o["train_flops"]
                sec = lambda x: x["step_s"]  # noqa: E731
                orss, prss = o["peak_rss_kib"], p["peak_rss_kib"] if p else None
            else:
                ot, pt = o.get("gen", {}).get(key), p["gen"][key] if p else None
                flops = o["gen_flops_" + key]
                sec = lambda x: x["seconds"]  # noqa: E731
                orss, prss = None, None  # one process-wide peak per model, on the train row
            if ot is None:
                continue
            of = flops / sec(ot) * 1e-9
            pf = flops / sec(pt) * 1e-9 if pt else None
            ratio = pa.get(key) or (ot["tok_s"] / pt["tok_s"] if pt else None)
            pct = lambda g: "%.0f%%" % (100 * g / peak) if (peak and g is not None) else "-"  # noqa: E731
            rows.append((
                name, work, "%.0f" % ot["tok_s"], "%.0f" % pt["tok_s"] if pt else "-",
                "%.2fx" % ratio if ratio else "-",
                "%.1f" % of, pct(of), "%.1f" % pf if pf is not None else "-", pct(pf),
                "%.0f" % (orss / 1024) if orss else "", "%.0f" % (prss / 1024) if prss else "",
                pt["settings"] if pt else "-"))
    widths = [max(len(str(r[i])) for r in rows + [hdr]) for i in range(len(hdr))]
    line = lambda r: "  ".join(str(v).rjust(w) if 2 <= i < 11 else str(v).ljust(w)  # noqa: E731
                               for i, (v, w) in enumerate(zip(r, widths))).rstrip()
    print(line(hdr))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))
    if peer:
        p0 = next(iter(peer.values()))
        print("\nPyTorch %s; its RSS includes ~%.0f MiB of the torch import itself."
              % (p0.get("torch_version", "?"), p0["rss_kib_after_import"] / 1024))
    print("Training: 16 sequences x 256 tokens (prompt 64) a step, forward + backward + AdamW. "
          "Generation: a 32-token prompt shared by the batch, %s new tokens, temperature 1, "
          "no stop tokens; tok/s counts new tokens."
          % ("/".join(sorted({str(o.get("gen_new", "?")) for o in ours.values()})) or "?"))
    report_methods([r for r in recs if r.get("kind") == "methods"], peak)


def report_methods(recs, peak):
    """The table of bench_torch.py --methods records: per model the DAPO update, the supervised
    step and the DPO step, ours against PyTorch (tokens through the model a step: 4096)."""
    if not recs:
        return
    print("\nSupervised and DPO steps beside the DAPO update (16 x 256 tokens a step; ours/torch: "
          "median ratio of alternating pairs; %% peak of %s GFLOP/s)"
          % ("%.1f" % peak if peak else "?"))
    hdr = ("model", "work", "ours tok/s", "torch tok/s", "ours/torch", "ours GFLOP/s", "% peak",
           "torch GFLOP/s", "pairs", "load before/after")
    rows = []
    for r in sorted(recs, key=lambda r: list(MODELS).index(r["model"])):
        for work, name in (("dapo", "DAPO update"), ("sft", "SFT step"), ("dpo", "DPO step")):
            o, t = r["ours"][work], r["torch"][work]
            of, tf = r["flops"] / o["step_s"] * 1e-9, r["flops"] / t["step_s"] * 1e-9
            rows.append((r["model"], name, "%.0f" % o["tok_s"], "%.0f" % t["tok_s"],
                         "%.2fx" % r["ratio"][work], "%.1f" % of,
                         "%.0f%%" % (100 * of / peak) if peak else "-", "%.1f" % tf,
                         str(r["pairs"]), "%s / %s" % (r["load_before"][0], r["load_after"][0])))
    widths = [max(len(str(x[i])) for x in rows + [hdr]) for i in range(len(hdr))]
    for x in [hdr, tuple("-" * w for w in widths)] + rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(x, widths)).rstrip())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS))
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--probe-file")
    ap.add_argument("--engine", help="bench_engine to measure alternately with PyTorch")
    ap.add_argument("--report", nargs="+")
    ap.add_argument("--methods", metavar="BENCH_METHODS",
                    help="with --model and --engine: the DAPO update, SFT and DPO steps, ours "
                         "(bench_engine, bench_methods) alternately with PyTorch's")
    ap.add_argument("--train-steps", type=int, default=3)
    ap.add_argument("--gen-reps", type=int, default=3)
    ap.add_argument("--gen-new", type=int, default=128)
    ap.add_argument("--busy", action="store_true", help="generation beside a CPU hog (hog.py)")
    ap.add_argument("--gen-batch", type=int, default=GEN_BATCH,
                    help="the larger generation batch (bench_engine --gen-batch, at most 64)")
    ap.add_argument("--gen-only", action="store_true",
                    help="generation alone, no training step (for qwen-0.5b)")
    ap.add_argument("--scale", metavar="FOLDER", help="a model folder (bench/scale.py)")
    ap.add_argument("--rollouts", help="--scale: dapod's rollouts file of the step")
    ap.add_argument("--lora", metavar="R,ALPHA", help="--scale: LoRA on every linear layer")
    ap.add_argument("--micro-seqs", type=int, default=4, help="--scale: sequences a micro-batch")
    ap.add_argument("--minibatch", type=int, default=0, help="--scale: default a quarter")
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--blas-threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    if args.scale:
        scale(args)
    elif args.report:
        report(args.report)
    elif args.probe:
        probe(args)
    elif args.methods and args.model and args.engine:
        methods(args)
    elif args.model:
        measure(args)
    else:
        ap.error("--model, --probe or --report")


if __name__ == "__main__":
    main()
