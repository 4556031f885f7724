"""An independent PyTorch reference of the Hugging Face Llama / Qwen2 / Qwen3 causal LM.

Written from transformers' semantics (modeling_llama.py / modeling_qwen2.py / modeling_qwen3.py,
eager attention, modeling_rope_utils.py), not from our C code: embedding, per layer RMSNorm ->
q/k/v projections (biases for Qwen2, or with attention_bias) -> Qwen3's per-head q_norm/k_norm ->
RoPE (rotate_half; default, linear, llama3 or yarn frequencies, yarn's attention factor on cos
and sin) -> grouped-query causal attention -> o_proj -> residual, RMSNorm -> SwiGLU MLP ->
residual, final RMSNorm, lm_head (tied to embed_tokens when tie_word_embeddings).
Parameter names are transformers' (model.layers.N.self_attn.q_proj.weight, ...), so
state_dict() keys are exactly the tensor names of a checkpoint.

Checkpoint folders (config.json + model.safetensors) are read (and test folders written) by hand: u64 little-endian header
length, JSON header, raw little-endian bytes; F32, F16 and BF16 become float32. A missing,
unexpected or misshapen tensor is an error.

Helpers used by tests/engine/test_torch_parity.py and bench/bench_torch.py:
  load_checkpoint(dir)               -> LlamaForCausalLM
  response_logprobs(model, seqs, t)  -> per-response-token log-probs and entropies
  train_step(model, seqs, w, ...)    -> loss = sum_t w_t * logp_t, backward, clip, AdamW step
  make_adamw(model, ...)             -> torch.optim.AdamW, weight decay on matrices only
  generate(model, prompt, n, ...)    -> batched sampling with a KV cache (eager torch.cat)

Only the standard library, numpy and torch are used.
"""

import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ---------------------------------------------------------------------------------------------
# config.json


class Config:
    """The keys of config.json that change the maths, with transformers' defaults."""

    def __init__(self, d):
        mt = d.get("model_type")
        archs = d.get("architectures") or [None]
        if mt == "llama" or archs[0] == "LlamaForCausalLM":
            self.arch = "llama"
        elif mt == "qwen2" or archs[0] == "Qwen2ForCausalLM":
            self.arch = "qwen2"
        elif mt == "qwen3" or archs[0] == "Qwen3ForCausalLM":
            self.arch = "qwen3"
        else:
            raise ValueError("config.json: unsupported model_type %r" % (mt,))
        self.vocab_size = int(d["vocab_size"])
        self.hidden_size = int(d["hidden_size"])
        self.intermediate_size = int(d["intermediate_size"])
        self.num_hidden_layers = int(d["num_hidden_layers"])
        self.num_attention_heads = int(d["num_attention_heads"])
        kv = d.get("num_key_value_heads")
        self.num_key_value_heads = int(kv) if kv is not None else self.num_attention_heads
        hd = d.get("head_dim")
        self.head_dim = int(hd) if hd is not None else self.hidden_size // self.num_attention_heads
        self.rms_norm_eps = float(d.get("rms_norm_eps", 1e-6))
        self.rope_theta = float(d.get("rope_theta", 10000.0))
        self.tie_word_embeddings = bool(d.get("tie_word_embeddings", False))
        self.max_position_embeddings = int(d.get("max_position_embeddings", 2048))
        # Qwen2 always has q/k/v biases (never o_proj's); Llama and Qwen3 have all four with
        # attention_bias. Qwen3 norms q and k per head.
        self.attention_bias = bool(d.get("attention_bias", False))
        self.qkv_bias = self.arch == "qwen2" or self.attention_bias
        self.o_bias = self.arch != "qwen2" and self.attention_bias
        self.qk_norm = self.arch == "qwen3"
        self.mlp_bias = bool(d.get("mlp_bias", False))
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError("config.json: hidden_act %r not supported" % d.get("hidden_act"))
        self.rope_scaling = d.get("rope_scaling")
        if d.get("rope_parameters") is not None:  # transformers 5: theta and scaling together
            self.rope_scaling = d["rope_parameters"]
            self.rope_theta = float(d["rope_parameters"].get("rope_theta", self.rope_theta))
        assert self.num_attention_heads % self.num_key_value_heads == 0

    @staticmethod
    def from_dict(**kw):
        return Config(kw)


# ---------------------------------------------------------------------------------------------
# safetensors, by hand

_DTYPES = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2)}


def read_safetensors(path):
    """Returns ({name: float32 torch.Tensor}, {name: dtype string}, metadata dict or None)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError("%s: shorter than the 8-byte header length" % path)
    (n,) = struct.unpack("<Q", raw[:8])
    if n < 2 or 8 + n > len(raw):
        raise ValueError("%s: header length %d out of range" % (path, n))
    header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    data = memoryview(raw)[8 + n :]
    meta = header.pop("__metadata__", None)
    tensors, dtypes = {}, {}
    for name, info in header.items():
        dt = info["dtype"]
        if dt not in _DTYPES:
            raise ValueError("%s: tensor %r has dtype %s (need F32, F16 or BF16)" % (path, name, dt))
        npdt, size = _DTYPES[dt]
        shape = [int(s) for s in info["shape"]]
        b, e = info["data_offsets"]
        numel = int(np.prod(shape)) if shape else 1
        if not (0 <= b <= e <= len(data)) or e - b != numel * size:
            raise ValueError("%s: tensor %r: bad data_offsets %r" % (path, name, [b, e]))
        arr = np.frombuffer(data[b:e], dtype=npdt)
        if dt == "BF16":  # bfloat16 is the top half of a float32
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        else:
            arr = arr.astype(np.float32)
        tensors[name] = torch.from_numpy(arr.copy()).reshape(shape)
        dtypes[name] = dt
    return tensors, dtypes, meta


def write_safetensors(path, tensors, bf16=False):
    """Writes {name: numpy array} as a safetensors file: F32, or BF16 rounded to nearest even as
    torch's .to(torch.bfloat16) (test folders in the Hugging Face layout)."""
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        if bf16:
            u = np.ascontiguousarray(a, dtype="<f4").view("<u4").astype(np.uint64)
            u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
            b, dt = u.tobytes(), "BF16"
        else:
            b, dt = np.ascontiguousarray(a, dtype="<f4").tobytes(), "F32"
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------------------------------------
# the model


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32) if dtype != torch.float64 else x
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + self.eps)
        return self.weight * h.to(dtype)


def rope_frequencies(cfg):
    """(inv_freq [head_dim / 2] float32, attention scaling) as transformers' ROPE_INIT_FUNCTIONS
    compute them for cfg.rope_scaling (None or rope_type default, linear, llama3, yarn)."""
    dim, base = cfg.head_dim, cfg.rope_theta
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    rs = cfg.rope_scaling
    kind = None if rs is None else rs.get("rope_type", rs.get("type"))
    if kind in (None, "default"):
        return inv_freq, 1.0
    factor = rs["factor"]
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind == "llama3":
        lo, hi = rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wl, high_wl = old / lo, old / hi
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wl, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
        return torch.where(medium, smoothed, scaled), 1.0
    if kind == "yarn":
        old = rs.get("original_max_position_embeddings") or cfg.max_position_embeddings

        def mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        att = rs.get("attention_factor")
        if att is None:
            if rs.get("mscale") and rs.get("mscale_all_dim"):
                att = mscale(factor, rs["mscale"]) / mscale(factor, rs["mscale_all_dim"])
            else:
                att = mscale(factor)
        fast, slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

        def corr_dim(rot):
            return (dim * math.log(old / (rot * 2 * math.pi))) / (2 * math.log(base))

        low, high = corr_dim(fast), corr_dim(slow)
        if rs.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
        extra, inter = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        keep = 1 - ramp
        return inter * (1 - keep) + extra * keep, float(att)
    raise ValueError("config.json: rope_scaling type %r not supported" % kind)


class RotaryEmbedding(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        inv_freq, self.attention_scaling = rope_frequencies(cfg)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, position_ids):
        # position_ids [B, T] -> cos, sin [B, T, HS] (float32 angles, as transformers)
        inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        pos = position_ids[:, None, :].float()
        freqs = (inv @ pos).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        a = self.attention_scaling
        return (emb.cos() * a).to(x.dtype), (emb.sin() * a).to(x.dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, T, HS]
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def repeat_kv(x, n_rep):
    # [B, NKV, T, HS] -> [B, NKV * n_rep, T, HS]
    if n_rep == 1:
        return x
    b, nkv, t, hs = x.shape
    return x[:, :, None, :, :].expand(b, nkv, n_rep, t, hs).reshape(b, nkv * n_rep, t, hs)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.nh, self.nkv, self.hs = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        C = cfg.hidden_size
        self.q_proj = nn.Linear(C, self.nh * self.hs, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(C, self.nkv * self.hs, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(C, self.nkv * self.hs, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.nh * self.hs, C, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.hs, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.hs, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm

    def forward(self, x, cos, sin, past=None):
        """x [B, T, C]; past (k, v) [B, NKV, P, HS] or None. Returns (out, (k, v) with P + T rows)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hs).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hs).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hs).transpose(1, 2)
        if self.qk_norm:  # per head, over head_dim, before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if past is not None:
            k = torch.cat((past[0], k), dim=2)
            v = torch.cat((past[1], v), dim=2)
        present = (k, v)
        P = k.shape[2] - T
        kk, vv = repeat_kv(k, self.nh // self.nkv), repeat_kv(v, self.nh // self.nkv)
        scores = torch.matmul(q, kk.transpose(2, 3)) / math.sqrt(self.hs)
        if T > 1:  # query i (position P + i) sees keys 0 .. P + i
            mask = torch.ones(T, P + T, dtype=torch.bool).triu(P + 1)
            scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
        # softmax in float32 as transformers (float64 stays float64: the exact reference)
        up = torch.float64 if q.dtype == torch.float64 else torch.float32
        probs = F.softmax(scores, dim=-1, dtype=up).to(q.dtype)
        out = torch.matmul(probs, vv).transpose(1, 2).reshape(B, T, self.nh * self.hs)
        return self.o_proj(out), present


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, FF, b = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = nn.Linear(C, FF, bias=b)
        self.up_proj = nn.Linear(C, FF, bias=b)
        self.down_proj = nn.Linear(FF, C, bias=b)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, past=None):
        a, present = self.self_attn(self.input_layernorm(x), cos, sin, past)
        x = x + a
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, present


class Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(cfg)

    def forward(self, input_ids, position_ids=None, past=None):
        B, T = input_ids.shape
        P = 0 if past is None else past[0][0].shape[2]
        if position_ids is None:
            position_ids = torch.arange(P, P + T, dtype=torch.long)[None, :].expand(B, T)
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(x, position_ids)
        presents = []
        for i, layer in enumerate(self.layers):
            x, pr = layer(x, cos, sin, None if past is None else past[i])
            presents.append(pr)
        return self.norm(x), presents


class LlamaForCausalLM(nn.Module):
    """Also Qwen2ForCausalLM and Qwen3ForCausalLM: they differ only in config (q/k/v biases,
    q/k norms)."""

    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        self.model = Model(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, past=None):
        """input_ids [B, T] -> (logits [B, T, V], new past). Positions continue after past."""
        h, presents = self.model(input_ids, past=past)
        return self.lm_head(h), presents

    def tensor_names(self):
        """The tensor names a checkpoint of this model holds (a tied lm_head has none)."""
        names = list(self.state_dict().keys())
        if self.config.tie_word_embeddings:
            names.remove("lm_head.weight")
        return names


def load_checkpoint(path, dtype=torch.float32):
    """Loads config.json + model.safetensors from the folder path. Every tensor of the model
    must be in the file with its exact shape, and nothing else may be (RoPE inv_freq buffers
    excepted, as transformers ignores them; a tied lm_head.weight only if equal to the
    embedding). Returns (model in eval mode, {name: file dtype})."""
    with open(os.path.join(path, "config.json")) as f:
        cfg = Config(json.load(f))
    tensors, dtypes, _ = read_safetensors(os.path.join(path, "model.safetensors"))
    model = LlamaForCausalLM(cfg)
    expected = model.tensor_names()
    missing = [n for n in expected if n not in tensors]
    if missing:
        raise ValueError("%s: missing tensors %s" % (path, missing))
    extra = [n for n in tensors if n not in expected and not n.endswith(".rotary_emb.inv_freq")]
    if cfg.tie_word_embeddings and "lm_head.weight" in extra:
        if not torch.equal(tensors["lm_head.weight"], tensors["model.embed_tokens.weight"]):
            raise ValueError("%s: tied lm_head.weight differs from embed_tokens" % path)
        extra.remove("lm_head.weight")
    if extra:
        raise ValueError("%s: unexpected tensors %s" % (path, extra))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for n in expected:
            if tuple(tensors[n].shape) != tuple(params[n].shape):
                raise ValueError(
                    "%s: tensor %s has shape %s, config implies %s"
                    % (path, n, list(tensors[n].shape), list(params[n].shape))
                )
            params[n].copy_(tensors[n])
    model.to(dtype)
    model.eval()
    return model, {n: dtypes[n] for n in expected}


# ---------------------------------------------------------------------------------------------
# LoRA, as PEFT defines it: y = base(x) + lora_B(lora_A(x)) * scaling, scaling = alpha / r
# (alpha / sqrt(r) with use_rslora); the base is frozen.


class LoraLinear(nn.Module):
    def __init__(self, base, r, scaling):
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        self.scaling = scaling

    def forward(self, x):
        return self.base_layer(x) + self.lora_B(self.lora_A(x)) * self.scaling


def attach_lora(model, adapter_dir):
    """Wraps the layers adapter_config.json targets with LoraLinear, loads A and B from
    adapter_model.safetensors by PEFT's names (base_model.model.<module>.lora_A.weight), freezes
    everything else. Returns {PEFT tensor name: parameter}."""
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        ac = json.load(f)
    assert ac["peft_type"] == "LORA" and not ac.get("use_dora")
    r, alpha = int(ac["r"]), float(ac["lora_alpha"])
    scaling = alpha / math.sqrt(r) if ac.get("use_rslora") else alpha / r
    targets = ac["target_modules"]
    targets = set(targets) if isinstance(targets, list) else None  # "all-linear"
    tensors, _, _ = read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    for p in model.parameters():
        p.requires_grad_(False)
    named, dtype = {}, next(model.parameters()).dtype
    for name, mod in list(model.named_modules()):
        leaf = name.rsplit(".", 1)[-1]
        if not isinstance(mod, nn.Linear) or name == "lm_head":
            continue
        if targets is not None and leaf not in targets:
            continue
        parent = model.get_submodule(name.rsplit(".", 1)[0])
        lin = LoraLinear(mod, r, scaling).to(dtype)
        for ab in ("A", "B"):
            key = "base_model.model.%s.lora_%s.weight" % (name, ab)
            w = getattr(lin, "lora_" + ab).weight
            with torch.no_grad():
                w.copy_(tensors.pop(key))
            named[key] = w
        setattr(parent, leaf, lin)
    if tensors:
        raise ValueError("%s: unexpected adapter tensors %s" % (adapter_dir, sorted(tensors)))
    return named


def tokenizer_id_count(path):
    """1 + the largest id of a tokenizer.json (its model vocabulary and added tokens): the ids a
    model's logits cover in dapod when its embedding has more (padding) rows."""
    with open(path, encoding="utf-8") as f:
        t = json.load(f)
    ids = list(t["model"]["vocab"].values()) if isinstance(t["model"].get("vocab"), dict) else \
        list(range(len(t["model"].get("vocab") or [])))
    ids += [a["id"] for a in t.get("added_tokens") or []]
    return 1 + max(ids)


# ---------------------------------------------------------------------------------------------
# RL helpers


def _pad(seqs):
    """seqs: list of (tokens, prompt_len). Right-padded ids [B, T] (causal attention never lets a
    real token see the padding after it), plus index tensors of the response positions."""
    B, T = len(seqs), max(len(t) for t, _ in seqs)
    ids = torch.zeros(B, T, dtype=torch.long)
    rows, cols, targets = [], [], []
    for b, (toks, plen) in enumerate(seqs):
        assert 1 <= plen <= len(toks)
        ids[b, : len(toks)] = torch.tensor(toks, dtype=torch.long)
        for t in range(plen, len(toks)):
            rows.append(b)
            cols.append(t - 1)  # the row whose output predicts token t
            targets.append(toks[t])
    return ids, torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long), \
        torch.tensor(targets, dtype=torch.long)


def response_logprobs(model, seqs, inv_temp=1.0, vocab_used=None):
    """For packed (prompt, response) sequences, the log-prob of every response token and the
    entropy of softmax(logits * inv_temp) at its position, in order (sequence 0's first).
    seqs: list of (token list, prompt_len). With vocab_used, the softmax covers the first
    vocab_used logits only (dapod's distribution over the tokenizer's ids, docs/MODELS.md).
    Returns (logp [R], entropy [R]) with autograd."""
    ids, rows, cols, targets = _pad(seqs)
    h, _ = model.model(ids)
    logits = model.lm_head(h[rows, cols]) * inv_temp  # [R, V]
    if vocab_used is not None:
        logits = logits[:, :vocab_used]
    logsm = F.log_softmax(logits, dim=-1)
    logp = logsm.gather(1, targets[:, None]).squeeze(1)
    entropy = -(logsm.exp() * logsm).sum(-1)
    return logp, entropy


def make_adamw(model, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    """torch.optim.AdamW with decoupled weight decay on matrices (2-D) only, as HF trainers."""
    params = [p for p in model.parameters() if p.requires_grad]  # a frozen base is left out
    decay = [p for p in params if p.dim() == 2]
    no_decay = [p for p in params if p.dim() != 2]
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)


def train_step(model, seqs, weights, inv_temp=1.0, opt=None, lr=None, grad_clip=None,
               vocab_used=None):
    """loss = sum_t w_t * logp_t; backward into fresh .grad; optional clip_grad_norm_(grad_clip)
    and optimiser step at learning rate lr. Returns (logp, entropy, grad norm before clipping)."""
    model.zero_grad(set_to_none=True)
    logp, entropy = response_logprobs(model, seqs, inv_temp, vocab_used)
    w = torch.as_tensor(weights, dtype=logp.dtype)
    (w * logp).sum().backward()
    params = [p for p in model.parameters() if p.grad is not None]
    if grad_clip is not None and grad_clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    else:
        norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params))
    if opt is not None:
        if lr is not None:
            for g in opt.param_groups:
                g["lr"] = lr
        opt.step()
    return logp.detach(), entropy.detach(), float(norm)


@torch.no_grad()
def generate(model, prompt, n, max_new_tokens, temperature=1.0, generator=None,
             shared_prefill=True):
    """Samples n continuations of one prompt (token list) with a KV cache, max_new_tokens each
    (no stop tokens), the eager way: prefill, then one forward of [n, 1] tokens per step with the
    cache grown by torch.cat. With shared_prefill the prompt is run once and its cache expanded
    to the n rows. Returns (tokens [n, max_new_tokens], logp of each sampled token)."""
    ids = torch.tensor([prompt], dtype=torch.long)
    if not shared_prefill:
        ids = ids.expand(n, -1)
    logits, past = model(ids)
    if shared_prefill:
        past = [(k.expand(n, -1, -1, -1).contiguous(), v.expand(n, -1, -1, -1).contiguous())
                for k, v in past]
        logits = logits.expand(n, -1, -1)
    last = logits[:, -1, :]
    out = torch.empty(n, max_new_tokens, dtype=torch.long)
    lps = torch.empty(n, max_new_tokens, dtype=last.dtype)
    for t in range(max_new_tokens):
        logsm = F.log_softmax(last / temperature, dim=-1)
        tok = torch.multinomial(logsm.exp(), 1, generator=generator)  # [n, 1]
        out[:, t] = tok[:, 0]
        lps[:, t] = logsm.gather(1, tok)[:, 0]
        if t + 1 == max_new_tokens:
            break
        logits, past = model(tok, past=past)
        last = logits[:, -1, :]
    return out, lps
