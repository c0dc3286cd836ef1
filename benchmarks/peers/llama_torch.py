#!/usr/bin/python3
"""A self-contained PyTorch Llama, the reference zshard's Llama models are checked and timed against.

Why it exists: zshard claims to train Llama-family models (models/llama.{h,cpp}, llama-tiny and the
named configs below) exactly as Hugging Face's LlamaForCausalLM does. Hugging Face transformers is not
a dependency, so the model is written here in plain torch following LlamaForCausalLM's semantics, with
its parameter names and nn.Linear (out, in) layouts, so its state dict is a file zshard loads with
--init-from and a file zshard-export writes loads back here:

  pre-norm blocks, RMSNorm (eps 1e-5, no bias), rotary embedding in the rotate_half layout (element i of
  a head pairs with element i + head_dim/2), grouped-query attention (query head h reads kv head
  h // (heads / kv_heads)), SwiGLU MLP down(silu(gate(x)) * up(x)), no biases anywhere, LM head
  lm_head.weight or, with tie_embeddings=1, model.embed_tokens.weight.

The configs' keys are zshard's --config keys. llama-3.2-1b rescales its rotary frequencies as Hugging
Face's rope_scaling of rope_type "llama3" does (the SCALING_KEYS; --rope-scaling in parity mode).

Modes:
  parity     initialises a small Llama (N(0, 0.02) matrices and embedding, RMSNorm gains 1), writes it
             as safetensors and a random token stream as an llm.c .bin, trains zshard-train
             (--model llama-tiny with the shape as overrides) and this model from them for a few AdamW
             steps in float32 (torch on one CPU thread), and compares the per-step losses (exit 0 when
             every step agrees within --rtol, else 1). --np N runs zshard-train on N ranks under
             mpirun, --strategy picks its strategy; --kv-heads and --tie-embeddings pick the variant.
             Both sides are also measured against this model trained one precision up (float64, the
             exact losses; float32 under --precision bf16).
             --lora-rank, --freeze and --runs as in gpt2_torch.py.
  loss       loads a safetensors weights file (a zshard-export of a zshard checkpoint, say) into the
             model without LoRA and prints as JSON its mean token loss on --batches batches of a token
             or text file from batch --step (by default the first, the one zshard-train's step 1 trains
             on; --batches N from 0 are what its --eval-batches N evaluates on). The shapes come from
             the file; heads and rope_theta, which it cannot tell, from --model or --heads/--rope-theta.
  bench      times one training step (forward + backward + AdamW) on one CPU thread and prints JSON:
             wall-clock and process CPU time per step (the latter is less disturbed by other load).
  selfcheck  checks the model against direct formulations (rotary embedding as complex rotations,
             grouped-query attention head by head, RMSNorm in float64, causality), the parameter
             names and shapes, the loss at init, tied and untied training, and the file round trips.

Run it with the system interpreter (/usr/bin/python3), which is the one with torch installed.
"""

import argparse
import cmath
import json
import math
import os
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_common import (add_bench_flags, add_loss_flags, add_parity_flags, batch_at, bench_report,  # noqa: E402
                         loss_report, mean_loss, one_thread, parity_case, parity_tokens, parity_verdict,
                         read_llmc_tokens, read_safetensors, softmax_dtype, torch_losses, write_llmc_tokens,
                         write_safetensors)

KEYS = ("layers", "dim", "heads", "kv_heads", "ffn_dim", "vocab", "ctx", "rope_theta", "tie_embeddings")
# Hugging Face's rope_scaling (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings),
# in a config only where it rescales.
SCALING_KEYS = ("rope_scaling_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_ctx")

# Named configs, as zshard registers them; the keys are zshard's --config keys.
CONFIGS = {
    "llama-tiny": dict(layers=2, dim=64, heads=4, kv_heads=2, ffn_dim=192, vocab=256, ctx=128,
                       rope_theta=10000, tie_embeddings=0),
    "tinyllama-1.1b": dict(layers=22, dim=2048, heads=32, kv_heads=4, ffn_dim=5632, vocab=32000, ctx=2048,
                           rope_theta=10000, tie_embeddings=0),
    "llama-3.2-1b": dict(layers=16, dim=2048, heads=32, kv_heads=8, ffn_dim=8192, vocab=128256, ctx=131072,
                         rope_theta=500000, tie_embeddings=1, rope_scaling_factor=32.0, rope_low_freq_factor=1.0,
                         rope_high_freq_factor=4.0, rope_original_ctx=8192),
}

RMS_EPS = 1e-5


def check_config(cfg):
    """Rejects a config the model cannot be built from, naming the key."""
    for key in KEYS:
        if key not in cfg or cfg[key] < (0 if key == "tie_embeddings" else 1):
            raise SystemExit(f"config: {key} must be >= 1 (tie_embeddings 0 or 1), got {cfg.get(key)}")
    if cfg["dim"] % cfg["heads"]:
        raise SystemExit(f"config: dim {cfg['dim']} is not a multiple of heads {cfg['heads']}")
    if (cfg["dim"] // cfg["heads"]) % 2:
        raise SystemExit(f"config: head_dim {cfg['dim'] // cfg['heads']} is odd; rotary pairs need it even")
    if cfg["heads"] % cfg["kv_heads"]:
        raise SystemExit(f"config: heads {cfg['heads']} is not a multiple of kv_heads {cfg['kv_heads']}")
    if cfg["tie_embeddings"] not in (0, 1):
        raise SystemExit(f"config: tie_embeddings must be 0 or 1, got {cfg['tie_embeddings']}")
    if "rope_scaling_factor" in cfg:
        factor, low, high, original = (cfg[key] for key in SCALING_KEYS)
        if not (factor >= 1 and 0 < low < high and original >= 1):
            raise SystemExit(f"config: rope scaling needs factor >= 1, 0 < low < high and a context >= 1, got "
                             f"{factor}, {low}, {high}, {original}")


def rope_scaling(cfg):
    """cfg's rope scaling as llama3_inv_freq's arguments, or None."""
    return tuple(cfg[key] for key in SCALING_KEYS) if "rope_scaling_factor" in cfg else None


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * weight over the last dimension, in the input dtype."""

    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * self.weight


def llama3_inv_freq(inv_freq, factor, low_freq_factor, high_freq_factor, original_ctx):
    """Hugging Face's _compute_llama3_parameters: long wavelengths stretched by the factor, short ones
    kept, those between interpolated."""
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original_ctx / low_freq_factor, inv_freq / factor, inv_freq)
    smooth = (original_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < original_ctx / high_freq_factor) & ~(wavelen > original_ctx / low_freq_factor)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin(T, hd, theta, dtype, scaling=None):
    """cos and sin of the rotary angles t * theta^(-2i/hd), shape (T, hd) as cat(freqs, freqs), the
    frequencies rescaled by llama3_inv_freq(*scaling) when scaling is given.
    The angles and their cos/sin are computed in float64 and rounded once: the correctly rounded values,
    which zshard's rope kernel computes too (Hugging Face's float32 angles differ at rounding level)."""
    inv_freq = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    if scaling:
        inv_freq = llama3_inv_freq(inv_freq, *scaling)
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x, cos, sin):
    """Rotates x (..., T, hd) position by position; positions start at 0 in each sequence."""
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.q_proj = nn.Linear(dim, heads * self.hd, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(heads * self.hd, dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.heads, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # Each kv head serves heads/kv_heads consecutive query heads: query head h reads kv head h // group.
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        probs = F.softmax(scores, dim=-1, dtype=softmax_dtype(scores)).to(q.dtype)
        y = probs @ v
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.heads * self.hd))


class MLP(nn.Module):
    def __init__(self, dim, ffn_dim):
        super().__init__()
        self.gate_proj = nn.Linear(dim, ffn_dim, bias=False)
        self.up_proj = nn.Linear(dim, ffn_dim, bias=False)
        self.down_proj = nn.Linear(ffn_dim, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg["dim"])
        self.self_attn = Attention(cfg["dim"], cfg["heads"], cfg["kv_heads"])
        self.post_attention_layernorm = RMSNorm(cfg["dim"])
        self.mlp = MLP(cfg["dim"], cfg["ffn_dim"])

    def forward(self, x, cos, sin):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab"], cfg["dim"])
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg["layers"]))
        self.norm = RMSNorm(cfg["dim"])


class LlamaForCausalLM(nn.Module):
    """The Llama of the module docstring; state-dict names are Hugging Face LlamaForCausalLM's
    (model.embed_tokens.weight, model.layers.0.self_attn.q_proj.weight, ..., lm_head.weight)."""

    def __init__(self, cfg):
        super().__init__()
        check_config(cfg)
        self.cfg = dict(cfg)
        self.model = LlamaModel(cfg)
        # Tied: no lm_head parameter at all, as in Hugging Face's state dict and zshard's files.
        self.lm_head = None if cfg["tie_embeddings"] else nn.Linear(cfg["dim"], cfg["vocab"], bias=False)

    def init_weights(self, seed):
        """Every matrix and the embedding N(0, 0.02), RMSNorm gains 1, drawn in named_parameters order."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for _, p in self.named_parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 0.02, generator=gen)
                else:
                    p.fill_(1.0)

    def logits(self, idx):
        T = idx.shape[1]
        if T > self.cfg["ctx"]:
            raise ValueError(f"sequence length {T} exceeds the context {self.cfg['ctx']}")
        x = self.model.embed_tokens(idx)
        cos, sin = rope_cos_sin(T, self.cfg["dim"] // self.cfg["heads"], self.cfg["rope_theta"], x.dtype,
                                rope_scaling(self.cfg))
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        head = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return self.model.norm(x) @ head.t()

    def forward(self, idx, targets):
        logits = self.logits(idx)
        return F.cross_entropy(logits.to(softmax_dtype(logits)).view(-1, logits.shape[-1]), targets.reshape(-1))


def new_model(cfg, seed):
    model = LlamaForCausalLM(cfg)
    model.init_weights(seed)
    return model


def config_from_args(args):
    """The --model config with the overrides given (a flag per key, None = the config's)."""
    cfg = dict(CONFIGS[args.model])
    for key in KEYS:
        if getattr(args, key, None) is not None:
            cfg[key] = getattr(args, key)
    check_config(cfg)
    return cfg


def config_from_weights(tensors, cfg):
    """cfg with the keys a weights file determines (layers, dim, ffn_dim, vocab, kv_heads, tie_embeddings)
    read from its shapes; heads, ctx and rope_theta stay cfg's, which a file cannot tell."""
    def shape(name):
        if name not in tensors:
            raise SystemExit(f"weights file: no tensor {name}")
        return tuple(tensors[name].shape)

    cfg = dict(cfg)
    cfg["vocab"], cfg["dim"] = shape("model.embed_tokens.weight")
    cfg["layers"] = 0
    while f"model.layers.{cfg['layers']}.input_layernorm.weight" in tensors:
        cfg["layers"] += 1
    cfg["ffn_dim"] = shape("model.layers.0.mlp.gate_proj.weight")[0]
    if cfg["dim"] % cfg["heads"]:
        raise SystemExit(f"weights file: dim {cfg['dim']} is not a multiple of --heads {cfg['heads']}")
    cfg["kv_heads"] = shape("model.layers.0.self_attn.k_proj.weight")[0] // (cfg["dim"] // cfg["heads"])
    cfg["tie_embeddings"] = 0 if "lm_head.weight" in tensors else 1
    check_config(cfg)
    return cfg


def model_from_weights(weights, base_cfg):
    """The config read from the weights file (config_from_weights) and its model, the file's weights loaded."""
    tensors = read_safetensors(weights)
    cfg = config_from_weights(tensors, base_cfg)
    model = LlamaForCausalLM(cfg)
    model.load_state_dict(tensors, strict=True)
    return cfg, model


def check_seq(seq, cfg):
    if seq > cfg["ctx"]:
        raise SystemExit(f"--seq {seq} exceeds the context {cfg['ctx']} (--ctx overrides it)")


def zshard_model_flags(cfg):
    """zshard-train flags selecting cfg: llama-tiny with every key overridden."""
    flags = ["--model", "llama-tiny"]
    for key in ("layers", "dim", "heads", "vocab", "ctx"):
        flags += ["--" + key, cfg[key]]
    rest = ("kv_heads", "ffn_dim", "rope_theta", "tie_embeddings") + (SCALING_KEYS if rope_scaling(cfg) else ())
    return flags + ["--config", ",".join(f"{key}={cfg[key]}" for key in rest)]


def cmd_parity(args):
    one_thread()
    cases = []
    for vocab in args.vocabs:
        cfg = dict(layers=args.layers, dim=args.dim, heads=args.heads, kv_heads=args.kv_heads,
                   ffn_dim=args.ffn_dim, vocab=vocab, ctx=args.ctx, rope_theta=args.rope_theta,
                   tie_embeddings=args.tie_embeddings)
        if args.rope_scaling:
            cfg.update(zip(SCALING_KEYS, args.rope_scaling))
        model = new_model(cfg, args.seed)
        title = " ".join(f"{key} {cfg[key]}" for key in KEYS + (SCALING_KEYS if args.rope_scaling else ()))
        cases.append(parity_case(model, zshard_model_flags(cfg), title, vocab, args))
    return parity_verdict(cases, args.rtol, args.precision)


def cmd_loss(args):
    one_thread()
    cfg, model = model_from_weights(args.weights, config_from_args(args))
    print(json.dumps(loss_report(mean_loss(model, cfg["vocab"], cfg["ctx"], args), cfg, args)))
    return 0


def cmd_bench(args):
    cfg = config_from_args(args)
    check_seq(args.seq, cfg)
    model = new_model(cfg, args.seed)
    print(json.dumps(bench_report(model, args.model, cfg, cfg["vocab"], args)))
    return 0


# --- selfcheck: each check returns (ok, what it measured) ---

def rope_complex(x, theta):
    """Reference rotary embedding: pair i of a head is the complex number x[i] + j*x[i + hd/2], turned
    by e^(j * t * theta^(-2i/hd)) at position t; float64 throughout, angles from Python's math."""
    *lead, T, hd = x.shape
    half = hd // 2
    flat = x.double().reshape(-1, T, hd)
    out = torch.empty_like(flat)
    for t in range(T):
        for i in range(half):
            turn = cmath.exp(1j * t * theta ** (-2.0 * i / hd))
            z = torch.complex(flat[:, t, i], flat[:, t, i + half]) * turn
            out[:, t, i], out[:, t, i + half] = z.real, z.imag
    return out.reshape(*lead, T, hd)


def check_rope():
    gen = torch.Generator().manual_seed(1)
    worst = 0.0
    for theta, hd, T in ((10000, 16, 40), (500000, 64, 33), (10000, 2, 5)):
        x = torch.randn(2, 3, T, hd, generator=gen)
        cos, sin = rope_cos_sin(T, hd, theta, torch.float32)
        worst = max(worst, (apply_rope(x, cos, sin).double() - rope_complex(x, theta)).abs().max().item())
    return worst < 1e-5, f"max |rotate_half - complex| {worst:.1e} over theta 1e4/5e5, head_dim 16/64/2"


def attention_direct(attn, x, theta):
    """Reference attention in float64, one query head at a time: head h reads kv head
    h // (heads / kv_heads), rotary embedding by complex rotation, explicit causal softmax."""
    B, T, _ = x.shape
    H, KV, hd = attn.heads, attn.kv_heads, attn.hd
    xd = x.double()
    q = (xd @ attn.q_proj.weight.double().t()).view(B, T, H, hd).transpose(1, 2)
    k = (xd @ attn.k_proj.weight.double().t()).view(B, T, KV, hd).transpose(1, 2)
    v = (xd @ attn.v_proj.weight.double().t()).view(B, T, KV, hd).transpose(1, 2)
    q, k = rope_complex(q, theta), rope_complex(k, theta)
    heads = []
    for h in range(H):
        kv = h // (H // KV)
        scores = q[:, h] @ k[:, kv].transpose(-2, -1) / math.sqrt(hd)
        for i in range(T):
            scores[:, i, i + 1:] = float("-inf")
        heads.append(torch.softmax(scores, dim=-1) @ v[:, kv])
    y = torch.cat(heads, dim=-1)
    return y @ attn.o_proj.weight.double().t()


def check_attention():
    gen = torch.Generator().manual_seed(2)
    worst, cases = 0.0, []
    for heads, kv_heads in ((4, 2), (4, 1), (4, 4), (8, 2)):
        attn = Attention(64, heads, kv_heads)
        with torch.no_grad():
            for p in attn.parameters():
                p.normal_(0.0, 0.2, generator=gen)
        x = torch.randn(2, 12, 64, generator=gen)
        cos, sin = rope_cos_sin(12, attn.hd, 10000, torch.float32)
        with torch.no_grad():
            got = attn(x, cos, sin).double()
        ref = attention_direct(attn, x, 10000)
        worst = max(worst, ((got - ref).abs().max() / ref.abs().max()).item())
        cases.append(f"{heads}/{kv_heads}")
    return worst < 1e-5, f"max rel |batched - head by head| {worst:.1e} at heads/kv_heads {' '.join(cases)}"


def check_rmsnorm():
    gen = torch.Generator().manual_seed(3)
    norm = RMSNorm(48)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.3, generator=gen)
    x = torch.randn(5, 7, 48, generator=gen) * 3
    xd = x.double()
    ref = xd / torch.sqrt((xd * xd).mean(-1, keepdim=True) + 1e-5) * norm.weight.double()
    with torch.no_grad():
        err = ((norm(x).double() - ref).abs().max() / ref.abs().max()).item()
    return err < 1e-6, f"max rel |float32 - float64 formula| {err:.1e}"


def check_causal():
    gen = torch.Generator().manual_seed(4)
    model = new_model(CONFIGS["llama-tiny"], 5)
    idx = torch.randint(0, 256, (2, 24), generator=gen)
    changed = idx.clone()
    changed[:, 16:] = torch.randint(0, 256, (2, 8), generator=gen)
    with torch.no_grad():
        a, b = model.logits(idx), model.logits(changed)
    before = (a[:, :16] - b[:, :16]).abs().max().item()
    after = (a[:, 16:] - b[:, 16:]).abs().max().item()
    return before == 0.0 and after > 0.0, (f"changing tokens 16.. moves logits 0..15 by {before:.1e}, "
                                           f"16.. by {after:.1e}")


def expected_shapes(cfg):
    dim, hd, ffn, vocab = cfg["dim"], cfg["dim"] // cfg["heads"], cfg["ffn_dim"], cfg["vocab"]
    shapes = {"model.embed_tokens.weight": (vocab, dim)}
    for i in range(cfg["layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (dim,),
                       p + "self_attn.q_proj.weight": (cfg["heads"] * hd, dim),
                       p + "self_attn.k_proj.weight": (cfg["kv_heads"] * hd, dim),
                       p + "self_attn.v_proj.weight": (cfg["kv_heads"] * hd, dim),
                       p + "self_attn.o_proj.weight": (dim, cfg["heads"] * hd),
                       p + "post_attention_layernorm.weight": (dim,),
                       p + "mlp.gate_proj.weight": (ffn, dim),
                       p + "mlp.up_proj.weight": (ffn, dim),
                       p + "mlp.down_proj.weight": (dim, ffn)})
    shapes["model.norm.weight"] = (dim,)
    if not cfg["tie_embeddings"]:
        shapes["lm_head.weight"] = (vocab, dim)
    return shapes


def check_names():
    counts = []
    for tie in (0, 1):
        cfg = dict(CONFIGS["llama-tiny"], tie_embeddings=tie)
        got = {name: tuple(t.shape) for name, t in LlamaForCausalLM(cfg).state_dict().items()}
        if got != expected_shapes(cfg):
            return False, f"tie_embeddings {tie}: state dict {got}"
        counts.append(f"tie {tie}: {len(got)} tensors")
    return True, "Hugging Face names and shapes, no biases; " + ", ".join(counts)


def check_init_loss_and_training():
    lines, ok = [], True
    for tie in (0, 1):
        cfg = dict(CONFIGS["llama-tiny"], tie_embeddings=tie)
        model = new_model(cfg, 1234)
        args = argparse.Namespace(seed=1234, tokens=4096, distinct=32, steps=5, batch=4, seq=32, lr=1e-3,
                                  wd=0.1, beta1=0.9, beta2=0.95, eps=1e-8, grad_clip=0.0, precision="fp32")
        tokens = parity_tokens(cfg["vocab"], args)
        inputs, targets = batch_at(tokens, 0, args.batch, args.seq)
        loss = model(inputs, targets)
        loss.backward()
        grads_ok = all(p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
                       for p in model.parameters())
        model.zero_grad(set_to_none=True)
        losses = torch_losses(model, tokens, args)
        ln_v = math.log(cfg["vocab"])
        ok &= abs(losses[0] - ln_v) < 0.01 * ln_v and grads_ok and losses[-1] < losses[0] - 0.05
        lines.append(f"tie {tie}: loss at init {losses[0]:.4f} (ln vocab {ln_v:.4f}), every gradient finite and "
                     f"nonzero {grads_ok}, after {args.steps} AdamW steps {losses[-1]:.4f}")
    return ok, "; ".join(lines)


def check_files():
    lines, ok = [], True
    with tempfile.TemporaryDirectory(prefix="llama_selfcheck_") as workdir:
        data = os.path.join(workdir, "tokens.bin")
        tokens = torch.randint(0, 256, (1000,), generator=torch.Generator().manual_seed(6)).tolist()
        write_llmc_tokens(data, tokens)
        ok &= read_llmc_tokens(data) == tokens
        lines.append(f"llm.c tokens round trip {read_llmc_tokens(data) == tokens}")
        for tie in (0, 1):
            cfg = dict(CONFIGS["llama-tiny"], tie_embeddings=tie)
            model = new_model(cfg, 7)
            weights = os.path.join(workdir, f"tie{tie}.safetensors")
            write_safetensors(weights, model.state_dict())
            back = read_safetensors(weights)
            same = back.keys() == model.state_dict().keys() and all(
                torch.equal(back[n], t) for n, t in model.state_dict().items())
            # The loss mode reads the shapes from the file; only heads/rope_theta/ctx come from the config.
            base = dict(CONFIGS["llama-tiny"], layers=1, dim=32, kv_heads=1, ffn_dim=8, vocab=2)
            read_cfg, read_model = model_from_weights(weights, base)
            where = argparse.Namespace(data=data, batch=4, seq=32, step=2, batches=2)
            loss = mean_loss(read_model, read_cfg["vocab"], read_cfg["ctx"], where)
            with torch.no_grad():
                direct = sum(model(*batch_at(tokens, step, 4, 32)).item() for step in (2, 3)) / 2
            ok &= same and read_cfg == cfg and loss == direct
            lines.append(f"tie {tie}: safetensors round trip {same}, config read back {read_cfg == cfg}, "
                         f"loss mode {loss:.6f} vs model {direct:.6f}")
    return ok, "; ".join(lines)


def cmd_selfcheck(args):
    one_thread()
    checks = [("rotary embedding", check_rope), ("grouped-query attention", check_attention),
              ("RMSNorm", check_rmsnorm), ("causal mask", check_causal), ("parameter names", check_names),
              ("init loss and training", check_init_loss_and_training), ("file round trips", check_files)]
    failed = 0
    for name, check in checks:
        ok, detail = check()
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
    print("PASS" if not failed else f"FAIL ({failed} of {len(checks)} checks)")
    return 1 if failed else 0


def add_config_flags(parser, keys):
    for key in keys:
        parser.add_argument("--" + key.replace("_", "-"), dest=key, type=int, default=None,
                            help="override (default: the config's)")


def scaling_values(text):
    """--rope-scaling's four numbers."""
    values = text.split(",")
    if len(values) != 4:
        raise argparse.ArgumentTypeError(f"expected FACTOR,LOW,HIGH,ORIGINAL_CTX, got '{text}'")
    factor, low, high, original = (float(v) for v in values)
    return factor, low, high, int(original)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)

    par = sub.add_parser("parity", help="compare per-step losses with zshard-train")
    add_parity_flags(par, vocabs=[256, 32000])
    par.add_argument("--kv-heads", type=int, default=2, help="key/value heads (fewer than --heads: GQA)")
    par.add_argument("--ffn-dim", type=int, default=192)
    par.add_argument("--rope-theta", type=int, default=10000)
    par.add_argument("--rope-scaling", type=scaling_values, metavar="FACTOR,LOW,HIGH,ORIGINAL_CTX",
                     help="Llama 3's rope scaling (rope_type llama3); default none")
    par.add_argument("--tie-embeddings", type=int, choices=(0, 1), default=0,
                     help="1: the LM head is model.embed_tokens.weight")
    par.set_defaults(func=cmd_parity, lora_targets="q_proj,v_proj")  # zshard's and PEFT's default targets

    los = sub.add_parser("loss", help="mean loss of a weights file on batches of a token file, as JSON")
    add_loss_flags(los)
    los.add_argument("--model", default="llama-tiny", choices=sorted(CONFIGS),
                     help="config giving heads, rope_theta and ctx (the shapes come from the file)")
    add_config_flags(los, ("heads", "rope_theta", "ctx"))
    los.set_defaults(func=cmd_loss)

    ben = sub.add_parser("bench", help="time one training step on one CPU thread")
    ben.add_argument("--model", default="llama-tiny", choices=sorted(CONFIGS))
    add_config_flags(ben, KEYS)
    add_bench_flags(ben)
    ben.set_defaults(func=cmd_bench)

    chk = sub.add_parser("selfcheck", help="check the model against direct formulations")
    chk.set_defaults(func=cmd_selfcheck)

    args = p.parse_args()
    sys.exit(args.func(args))


if __name__ == "__main__":
    main()
